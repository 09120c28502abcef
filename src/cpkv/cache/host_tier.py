"""Host (CPU memory) tier of the prefix cache: per-lane bounded LRU store of evicted KV pages (C-RELOAD).

Host copies are sharded by owner: the copy of a page lives in its owner rank's host memory, so the store
is one LRU map per lane. A copy is keyed by ``(key, lane)``: ``key`` is any hashable id of the copy
(``PrefixCache`` numbers its copies 0, 1, 2, ... in the order it writes them, the same on every rank) and
``lane`` is the page's **recorded owner lane**, the lane load-back must use again. The payload is opaque
(the distributed executor's KV rows; ``None`` in the simulator).

This is a plain container: it never drops a copy on its own. The prefix cache decides what to drop when
a lane is full (``lru_keys``), because dropping a copy may remove tree nodes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence

import numpy as np

from ..config import check_cp_size, check_lane, per_lane_ints
from ..errors import PrefixCacheError


class HostTier:
    """Per-lane bounded LRU store of host copies (SPEC C-RELOAD), keyed by ``(key, lane)``.

    Args:
        cp_size: lanes (C >= 1).
        pages_per_lane: host capacity in pages, one int >= 0 for every lane or a sequence of C ints
            (0 disables the tier on that lane).

    Raises:
        ConfigError: a negative or non-integer capacity, or a sequence whose length is not ``cp_size``.
    """

    def __init__(self, cp_size: int, pages_per_lane: int | Sequence[int]) -> None:
        C = check_cp_size(cp_size)
        caps = per_lane_ints("host_pages_per_lane", pages_per_lane, C, 0)
        self.cp_size = C
        self.capacity = np.asarray(caps, dtype=np.int64)  # [C] host pages per lane
        self._lanes: list[OrderedDict[Hashable, object]] = [OrderedDict() for _ in range(C)]  # oldest first

    # ----------------------------------------------------------------------------------------- queries
    def count_per_lane(self) -> np.ndarray:
        """Host copies held per lane, int64 ``[C]``."""
        return np.asarray([len(d) for d in self._lanes], dtype=np.int64)

    def __len__(self) -> int:
        """Host copies over all lanes, in pages."""
        return sum(len(d) for d in self._lanes)

    def __contains__(self, key_lane: tuple[Hashable, int]) -> bool:
        key, lane = key_lane
        return key in self._lanes[self._lane(lane)]

    def is_full(self, lane: int) -> bool:
        """Whether ``lane`` holds as many copies as its capacity (always true for capacity 0)."""
        lane = self._lane(lane)
        return len(self._lanes[lane]) >= int(self.capacity[lane])

    def lru_keys(self, lane: int) -> Iterator[Hashable]:
        """Keys of ``lane``, least recently used first. Do not mutate the tier while iterating."""
        return iter(self._lanes[self._lane(lane)])

    def items(self) -> Iterator[tuple[Hashable, int]]:
        """Every ``(key, lane)`` held, lane by lane, least recently used first."""
        for lane, d in enumerate(self._lanes):
            for key in d:
                yield key, lane

    # ---------------------------------------------------------------------------------------- updates
    def put(self, key: Hashable, lane: int, payload: object) -> None:
        """Store a copy as the most recently used of ``lane``.

        Raises:
            PrefixCacheError: ``lane`` out of range, ``lane`` full, or ``(key, lane)`` already held.
        """
        d = self._lanes[self._lane(lane)]
        if key in d:
            raise PrefixCacheError(f"host copy {_name(key)} of lane {lane} is already held")
        if len(d) >= int(self.capacity[lane]):
            raise PrefixCacheError(
                f"host lane {lane} is full ({int(self.capacity[lane])} pages); drop a copy first"
            )
        d[key] = payload

    def get(self, key: Hashable, lane: int) -> object:
        """Payload of ``(key, lane)``. Raises PrefixCacheError when absent."""
        return self._lanes[self._lane(lane)][self._held(key, lane)]

    def touch(self, key: Hashable, lane: int) -> None:
        """Mark ``(key, lane)`` most recently used. Raises PrefixCacheError when absent."""
        self._lanes[self._lane(lane)].move_to_end(self._held(key, lane))

    def pop(self, key: Hashable, lane: int) -> object:
        """Remove ``(key, lane)`` and return its payload. Raises PrefixCacheError when absent."""
        return self._lanes[self._lane(lane)].pop(self._held(key, lane))

    # ---------------------------------------------------------------------------------------- private
    def _lane(self, lane: int) -> int:
        return check_lane("lane", lane, self.cp_size, PrefixCacheError)

    def _held(self, key: Hashable, lane: int) -> Hashable:
        if key not in self._lanes[lane]:
            raise PrefixCacheError(f"no host copy {_name(key)} on lane {lane}")
        return key


def _name(key: Hashable) -> str:
    """A key as error messages show it: bytes in hex, anything else as ``repr``."""
    return key.hex() if isinstance(key, bytes) else repr(key)
