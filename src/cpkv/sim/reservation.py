"""Whether the admitted requests can all finish: the pages each still needs, the reservation admission keeps,
and whether a request could run even alone in the pool (the scheduler's liveness rules, docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..allocator.protocol import PageAllocator
from ..config import BALANCED, ROTATION

_I64 = np.int64


def stuck_alone(
    scratch: PageAllocator, held_pages: np.ndarray, prefix_len: int, last_page: int, extend_len: int = 1
) -> int:
    """The lane that blocks a request's next ``extend_len`` tokens (a one-token chunk, or an MTP step's K
    slots) even with every other page of the pool free, or -1 when it could run alone.

    ``scratch``: a fresh allocator of the design (``KVStorage.scratch_allocator``: the same lanes, nothing
    taken). It takes only the request's own pages (``held_pages``: int64 ``[k]``, its prefix and computed
    pages, on their lanes ``page % lanes``; ``last_page`` among them holds position ``prefix_len - 1``),
    then plans the chunk; the lane whose ``plan.new_pages_per_lane`` most exceeds its free pages blocks.
    Example C=2, P=1, pages per lane 2 (lane 0's only usable page is page 2), rotation, a request holding
    pages [2, 1] (tokens 0, 1) at prefix 2: its next token goes to lane 2 % 2 = 0, whose only usable page
    it holds -> 0.
    """
    lanes, P = scratch.capacity_per_lane.shape[0], scratch.page_size
    pages = scratch.alloc_pages(np.asarray(held_pages, dtype=_I64) % lanes)
    last = -1
    if prefix_len:
        where = int(np.flatnonzero(np.asarray(held_pages) == last_page)[0])
        last = int(pages[where]) * P + (prefix_len - 1) % P
    plan = scratch.plan_extend([prefix_len], [extend_len], [last])
    short = plan.new_pages_per_lane[:lanes] - scratch.free_pages_per_lane()
    return int(np.argmax(short)) if (short > 0).any() else -1


def reservation_policy(per_lane_reservation: bool) -> str:
    """The owner policy whose admission rules these are: ``rotation`` with per-lane reservations
    (``reservation_short(..., per_lane=True)``), else ``balanced`` (the total only). A storage design that no
    owner policy places is named so in its rejection messages (``sim.rejection.lane_reason``).
    Example: False -> ``"balanced"``."""
    return ROTATION if per_lane_reservation else BALANCED


def pages_to_finish(total_tokens: int, done_tokens: int, page_size: int) -> int:
    """New pages a request still needs: ``ceil(total / P) - ceil(done / P)`` (the partly filled last page
    exists). Example P=4, total 10, done 6: 3 - 2 = 1."""
    return -(-total_tokens // page_size) - -(-done_tokens // page_size)


def even_share(pages: Sequence[int] | np.ndarray, cp_size: int) -> np.ndarray:
    """Pages each lane takes, at most, when C-ZIGZAG spreads ``m`` pages over ``cp_size`` lanes: ``ceil(m / C)``
    per request (int64, shape of ``pages``). Example C=4: [1, 4, 5, 9] -> [1, 1, 2, 3]."""
    return -(-np.asarray(pages, dtype=_I64) // cp_size)


def reservation_short(
    pages_left: Sequence[int], room: np.ndarray, placed: np.ndarray | None = None, *, per_lane: bool
) -> str | None:
    """Whether every admitted request can still finish: None, or what is short (``"total"``, ``"lane"``).

    ``pages_left``: the new pages each admitted request still needs after this step (``pages_to_finish``);
    ``room``: free + evictable pages per lane, int64 ``[C]``; ``placed``: the new pages the step's batch
    takes per lane under its plan (int64 ``[C]``; none when omitted); ``per_lane``: False checks the total
    only (a request alone: its pages are all the pool holds besides the cache's; or before the step's plan
    is known, or placement that follows free pages: ``KVStorage.per_lane_reservation``). Always: the total
    fits. With ``per_lane`` (``rotation`` and ``legacy``: phases fixed by position and batch index, not by
    free pages; ``interleaved``) also every lane: it holds what the step places there plus the even
    shares (``even_share``) of every request's later pages, the spread C-ZIGZAG gives a chunk of ``>= 2C``
    pages and rotation keeps for smaller ones. Counting the step's own pages where its plan puts them (not
    ``ceil(m / C)`` on every lane) lets a burst of one-page requests form the batch C-ROTATION-SPREADS
    describes: at batch indices 0..C-1 they take one page on each lane. ``balanced`` needs no per-lane
    term: it sends a one-page chunk to a lane with a free page, so while the total fits the oldest request
    can always advance. ``legacy`` with chunks of fewer than 2C pages piles them on lane 0 instead of
    spreading them; the livelock that follows is the policy's own, and the report shows it. Example C=2, room [3, 3], per_lane: pages left
    [4] -> shares [2] per lane, None; placed [2, 0] with pages left [2] -> lane 0 needs 2 + 1 = 3, None.
    """
    step = int(placed.sum()) if placed is not None else 0
    if sum(pages_left) + step > int(room.sum()):
        return "total"
    if not per_lane:
        return None
    need = int(even_share(pages_left, room.shape[0]).sum()) + (placed if placed is not None else 0)
    return None if (need <= room).all() else "lane"
