"""What the prefix cache hands back: ``PrefixMatch``, ``InsertResult``, ``CacheEntry`` (SPEC section 8).

Immutable values; the arrays they hold are copies (never views of the tree). ``handle`` is the cache's
opaque lock handle (``cpkv.cache.radix.Handle``), to pass to ``PrefixCache.lock`` / ``unlock``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

_I64 = np.int64

PAGE, LANE, HKEY = 0, 1, 2
"""Columns of a run's per-page values (``vals``, int64 ``[num_pages, 3]``): device page id (-1 while
host-only), owner lane (the recorded lane while host-only), host copy id (-1 when none). ``entries``
lists them per page as ``CacheEntry``."""


@dataclass(frozen=True, eq=False)
class PrefixMatch:
    """Result of ``match_prefix`` / ``load_back`` (SPEC C-RELOAD). Immutable.

    Attributes:
        device_pages: ``[device_len // P]`` int64 device page ids of the matched prefix, in position order.
        host_lanes: ``[host_len // P]`` int64 recorded owner lanes of the pages that follow the device part
            and live only in the host tier (empty after ``load_back``).
        page_size: P, in tokens.
        handle: opaque lock handle of the device prefix (``lock`` / ``unlock``; C-LOCK).
    """

    device_pages: np.ndarray
    host_lanes: np.ndarray
    page_size: int
    handle: object = field(repr=False)
    _host_end: object = field(default=None, repr=False)  # handle of the end of the host part, or None
    _epoch: int = field(default=-1, repr=False)

    @property
    def device_len(self) -> int:
        """Tokens of the prefix already on device (a multiple of P)."""
        return int(self.device_pages.shape[0]) * self.page_size

    @property
    def host_len(self) -> int:
        """Tokens after ``device_len`` that only the host tier holds (a multiple of P)."""
        return int(self.host_lanes.shape[0]) * self.page_size

    @property
    def prefix_len(self) -> int:
        """All matched tokens, ``device_len + host_len`` (page aligned, never past the shared prefix)."""
        return self.device_len + self.host_len

    @property
    def device_slots(self) -> np.ndarray:
        """``[device_len]`` int64 slots ``p*P + 0 .. P-1`` of every device page (``req_to_token`` row)."""
        return page_slots(self.device_pages, self.page_size)

    def write_device_slots(self, row: np.ndarray) -> None:
        """Write ``device_slots`` into ``row[:device_len]`` (``row``: an int64 ``req_to_token`` row, at least
        ``device_len`` long), without a temporary."""
        page_slots(self.device_pages, self.page_size, out=row[: self.device_len])

    @property
    def last_loc(self) -> int:
        """Slot of position ``device_len - 1`` (``last_loc`` for ``alloc_extend``), -1 when nothing matched."""
        n = self.device_pages.shape[0]
        return int(self.device_pages[-1]) * self.page_size + self.page_size - 1 if n else -1


@dataclass(frozen=True, eq=False)
class InsertResult:
    """Result of ``insert`` (SPEC C-RELOAD). The tree owns ``pages``; see ``PrefixCache``'s ownership notes.

    Attributes:
        pages: ``[num_tokens // P]`` int64 tree page ids of the inserted full pages, in position order.
        duplicate_pages: int64 caller pages that duplicated cached pages and were freed to the allocator.
        new_pages: pages the tree took over from the caller (new runs and host-only pages refilled).
        page_size: P, in tokens.
        handle: opaque lock handle of the inserted prefix (the root's when no page was full; C-LOCK).
    """

    pages: np.ndarray
    duplicate_pages: np.ndarray
    new_pages: int
    page_size: int
    handle: object = field(repr=False)

    @property
    def slots(self) -> np.ndarray:
        """``[len(pages) * P]`` int64 slots to write into the request's ``req_to_token`` row."""
        return page_slots(self.pages, self.page_size)


class CacheEntry(NamedTuple):
    """One cached page, as ``PrefixCache.entries`` lists it (read-only view for tests and reports)."""

    depth: int  # page index in its prefix (0 = the first page of a prompt)
    page: int  # device page id, -1 when host-only
    lane: int  # owner lane (the recorded lane when host-only)
    on_host: bool  # whether the host tier holds a copy
    lock_ref: int  # locks held through this page (its own prefix or a longer one)
    host_key: int | None  # id of the host copy (``HostTier`` key), None when not on host


_RAMPS: dict[int, np.ndarray] = {}  # page_size -> int64 [P] 0 .. P-1, read-only


def page_slots(pages: np.ndarray, page_size: int, out: np.ndarray | None = None) -> np.ndarray:
    """``[len(pages) * P]`` slots: e.g. pages ``[3, 5]``, P=4 -> ``[12,13,14,15, 20,21,22,23]``; written into
    ``out`` (int64 ``[len(pages) * P]``, contiguous) when given, else a new array."""
    ramp = _RAMPS.get(page_size)
    if ramp is None:
        ramp = _RAMPS[page_size] = np.arange(page_size, dtype=_I64)
        ramp.setflags(write=False)
    k = pages.shape[0]
    if out is not None:
        np.add((pages * page_size)[:, None], ramp, out=out.reshape(k, page_size))
        return out
    rows = np.empty((k, page_size), dtype=_I64)
    np.add((pages * page_size)[:, None], ramp, out=rows)
    return rows.reshape(-1)
