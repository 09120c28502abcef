"""Radix tree of page runs: match, insert, split, per-handle lock counts (SPEC section 8, C-LOCK).

A node holds a **run** of whole pages: ``tokens`` (int64 ``[num_pages * P]``, the token ids of its pages)
and ``vals`` (int64 ``[num_pages, F]``, F opaque per-page integers of the tree's user). Children are keyed
by the bytes of their first page's P token ids, so a match is always a whole number of pages. This module
knows nothing of owners, lanes or host copies.

``split(node, at)`` makes a *new* node for the upper pages ``[0, at)`` and keeps the original object for
the lower ones, so a handle or LRU entry still names the same last page; depths (``node.start ..
node.end``) are absolute and a node's ``end`` never changes. A ``Handle`` names the prefix ``[0, depth)``;
locks are counted per handle (``own_locks`` at its end, ``lock_ref`` along the path), and an ``unlock``
through another handle raises ``PrefixCacheError`` and changes nothing. Worked example: docs/prefix-cache.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import numpy as np

from ..errors import PrefixCacheError

if TYPE_CHECKING:
    from typing_extensions import Self

_I64 = np.int64
_NO_TOKENS = np.zeros(0, dtype=_I64)


class RadixNode:
    """A run of whole pages (see the module doc). Attributes are read by the tree's user, set by the tree.

    Attributes:
        parent: the node whose last page precedes this run (None for the root).
        children: first-page key (bytes of P int64 token ids) -> child, in insertion order.
        tokens: int64 ``[num_pages * P]`` token ids. vals: int64 ``[num_pages, F]`` per-page values.
        start: depth of the first page (pages from the root); ``end = start + num_pages``.
        lock_ref: locks held through this node or a descendant. own_locks: locks whose handle ends here.
        stamp: last-use stamp (``RadixTree.tick``). attached: False once removed from the tree.
        end: ``start + num_pages``, the depth just past the last page (never changes, even when the run is
            split). key: the run's key in its parent's ``children`` (bytes of its first page's token ids;
            ``b""`` for the root).
    """

    __slots__ = (
        "parent",
        "children",
        "tokens",
        "vals",
        "start",
        "lock_ref",
        "own_locks",
        "stamp",
        "attached",
        "nid",
        "end",
        "key",
    )

    def __init__(
        self, parent: Self | None, tokens: np.ndarray, vals: np.ndarray, start: int, nid: int
    ) -> None:
        self.parent = parent
        self.children: dict[bytes, Self] = {}
        self.tokens = tokens  # [num_pages * P] int64
        self.vals = vals  # [num_pages, F] int64
        self.start = start
        self.lock_ref = 0
        self.own_locks = 0
        self.stamp = 0
        self.attached = True
        self.nid = nid  # creation number, unique in the tree (a deterministic tie-breaker)
        self.end: int = start + vals.shape[0]  # depth just past the last page (pages from the root)
        self.key = b""  # the key in the parent's children, set by the tree

    @property
    def num_pages(self) -> int:
        """Pages in the run."""
        pages: int = self.vals.shape[0]
        return pages


N = TypeVar("N", bound=RadixNode)
"""The node type of a ``RadixTree`` (its ``node_factory``'s): ``RadixNode`` or a subclass."""


class Handle(Generic[N]):
    """Opaque lock handle: the page-aligned prefix of ``depth`` pages (see the module doc). Immutable.

    ``gen`` is the generation the tree's user gave the node when the handle was made (the prefix cache
    bumps it whenever the pages leave the device, so an old handle never locks reloaded pages).
    """

    __slots__ = ("tree", "node", "depth", "gen")

    def __init__(self, tree: RadixTree[N], node: N, depth: int, gen: int) -> None:
        self.tree, self.node, self.depth, self.gen = tree, node, depth, gen

    def __repr__(self) -> str:
        return f"Handle(depth={self.depth} pages)"


class RadixTree(Generic[N]):
    """Radix tree of page runs keyed by token ids at page granularity (SPEC section 8, C-LOCK).

    Args:
        page_size: P, tokens per page (>= 1).
        num_fields: F, per-page int64 values stored in ``vals``.
        node_factory: builds nodes (a ``RadixNode`` subclass may add per-node state of the user).
        on_split: called as ``on_split(upper, lower)`` after every split, to copy or remap user state.
    """

    @overload
    def __init__(self: RadixTree[RadixNode], page_size: int, num_fields: int) -> None: ...
    @overload
    def __init__(
        self,
        page_size: int,
        num_fields: int,
        node_factory: Callable[..., N],
        on_split: Callable[[N, N], None] | None = None,
    ) -> None: ...
    def __init__(
        self,
        page_size: int,
        num_fields: int,
        node_factory: Callable[..., Any] = RadixNode,
        on_split: Callable[[N, N], None] | None = None,
    ) -> None:
        self.page_size = page_size
        self.num_fields = num_fields
        self._new: Callable[..., N] = node_factory
        self._on_split = on_split
        self._nid = 0
        self.clock = 0
        self.num_nodes = 0  # live nodes, root excluded
        self.nodes_created = 0
        self.root = self._new(None, np.zeros(0, _I64), np.zeros((0, num_fields), _I64), 0, 0)

    # ---------------------------------------------------------------------------------------- queries
    def walk(self, tokens: np.ndarray, num_pages: int) -> list[tuple[N, int]]:
        """Longest match of the first ``num_pages`` pages of ``tokens`` (int64, contiguous).

        Returns ``[(node, pages matched in node), ...]`` root side first; only the last entry can match
        part of its node. One dict look-up and one vectorised compare per node, no per-page loop.
        """
        P = self.page_size
        node, pos, path = self.root, 0, []
        while pos < num_pages:
            child = node.children.get(tokens[pos * P : (pos + 1) * P].tobytes())
            if child is None:
                break
            n = child.vals.shape[0]
            m = min(n, num_pages - pos)
            if m > 1:  # the first page equals its key; compare the rest at once
                differ = child.tokens[P : m * P] != tokens[(pos + 1) * P : (pos + m) * P]
                if np.count_nonzero(differ):
                    m = 1 + int(differ.argmax()) // P
            path.append((child, m))
            pos += m
            if m < n:
                break
            node = child
        return path

    def path(self, node: N) -> list[N]:
        """Nodes from the root's child down to ``node`` (empty for the root)."""
        out = []
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def preorder(self, node: N, keep: Callable[[N], bool] | None = None) -> list[N]:
        """``node`` and its descendants, parents before children, children in insertion order; with
        ``keep``, a node for which it is False is left out together with its subtree."""
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            if keep is None or keep(n):
                out.append(n)
                stack.extend(reversed(n.children.values()))
        return out

    def nodes(self) -> Iterator[N]:
        """Every live node but the root, parents before children."""
        for n in self.preorder(self.root):
            if n is not self.root:
                yield n

    # ---------------------------------------------------------------------------------------- updates
    def tick(self) -> int:
        """A new stamp, larger than every earlier one."""
        self.clock += 1
        return self.clock

    def add_leaf(self, parent: N, tokens: np.ndarray, vals: np.ndarray) -> N:
        """New child run of ``parent`` (``tokens`` int64 ``[k * P]``, ``vals`` int64 ``[k, F]``, k >= 1)."""
        node = self._node(parent, tokens, vals, parent.end)
        node.key = tokens[: self.page_size].tobytes()
        parent.children[node.key] = node
        return node

    def split(self, node: N, at: int, lower_goes: bool = False) -> N:
        """Cut ``node`` after its first ``at`` pages (0 < at < num_pages); returns the new upper node.

        The original object keeps the lower pages (see the module doc). The upper node takes the parent's
        child slot (same key, same position), the stamp and the lock_ref; locks ending at ``node`` stay.
        ``lower_goes``: the caller detaches the lower part next, so its arrays stay views (no copy).
        The upper part's tokens are a view while it keeps at least half of the array they view, else a
        copy: a run never keeps more than twice its own tokens alive.
        """
        P = self.page_size
        parent = node.parent
        tokens = node.tokens
        base = tokens if tokens.base is None else tokens.base
        head = tokens[: at * P]
        upper = self._node(
            parent, head if 2 * head.size >= base.size else head.copy(), node.vals[:at].copy(), node.start
        )
        upper.stamp, upper.lock_ref, upper.key = node.stamp, node.lock_ref, node.key
        parent.children[upper.key] = upper  # type: ignore[union-attr]
        if lower_goes:
            node.tokens, node.vals = tokens[at * P :], node.vals[at:]
        else:
            node.tokens, node.vals = tokens[at * P :].copy(), node.vals[at:].copy()
        node.start += at
        node.parent = upper
        node.key = node.tokens[:P].tobytes()
        upper.children[node.key] = node
        if self._on_split is not None:
            self._on_split(upper, node)
        return upper

    def detach(self, node: N) -> list[N]:
        """Remove ``node`` and its subtree; returns them, parents first. They keep their ``parent`` link
        (so a handle below a removed run still resolves to a live ancestor) but are no longer attached."""
        del node.parent.children[node.key]  # type: ignore[union-attr]
        gone = self.preorder(node) if node.children else [node]
        for n in gone:
            n.attached = False
            n.tokens = _NO_TOKENS  # the memory goes now, even while an old handle still refers to the run
        self.num_nodes -= len(gone)
        return gone

    # ---------------------------------------------------------------------------------------- handles
    def handle(self, node: N, depth: int, gen: int) -> Handle[N]:
        """A handle of the prefix ``[0, depth)`` pages, held by ``node`` (``node.start < depth <= node.end``,
        or the root with depth 0)."""
        return Handle(self, node, depth, gen)

    def resolve(self, handle: object) -> tuple[N, int]:
        """``(node holding the handle's last page now, depth)``; the root for depth 0.

        Raises:
            PrefixCacheError: not a handle of this tree, or its pages were removed from the tree.
        """
        if not isinstance(handle, Handle):
            raise PrefixCacheError(f"not a prefix-cache handle: {type(handle).__name__}")
        if handle.tree is not self:
            raise PrefixCacheError("handle belongs to another PrefixCache")
        node, depth = handle.node, handle.depth
        while node.start >= depth and node.parent is not None:  # an upper part split off since
            node = node.parent
        if not node.attached:
            raise PrefixCacheError(f"stale handle: the pages of its {depth}-page prefix left the cache")
        return node, depth

    def lock(self, node: N, depth: int) -> tuple[N, list[N]]:
        """Add one lock at ``depth`` (held by ``node``, from ``resolve``): split so that it ends at a node
        end, count it there. Returns ``(that node, nodes whose lock_ref went from 0 to 1)``."""
        if depth < node.end:
            node = self.split(node, depth - node.start)
        node.own_locks += 1
        return node, self.adjust(node, 1)

    def unlock(self, node: N, depth: int) -> list[N]:
        """Remove one lock taken at exactly ``depth``; returns the nodes whose lock_ref went to 0.

        Raises:
            PrefixCacheError: no lock taken through this handle is outstanding (nothing changes).
        """
        if depth != node.end or node.own_locks == 0:
            raise PrefixCacheError(
                f"unlock without lock: no lock taken through this {depth}-page handle "
                "is outstanding (unlock the handle you locked)"
            )
        node.own_locks -= 1
        return self.adjust(node, -1)

    def adjust(self, node: N, delta: int) -> list[N]:
        """Add ``delta`` (+1 or -1) to ``lock_ref`` from ``node`` up to the root (a pin without a handle
        when called directly); returns the nodes that crossed zero (deepest first), root excluded."""
        crossed = []
        while node.parent is not None:
            before = node.lock_ref
            node.lock_ref = before + delta
            if before == 0 or node.lock_ref == 0:
                crossed.append(node)
            node = node.parent
        node.lock_ref += delta
        return crossed

    # ---------------------------------------------------------------------------------------- private
    def _node(self, parent: N | None, tokens: np.ndarray, vals: np.ndarray, start: int) -> N:
        self._nid += 1
        self.num_nodes += 1
        self.nodes_created += 1
        return self._new(parent, tokens, vals, start, self._nid)
