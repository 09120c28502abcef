"""Whether the admitted requests can all finish: the pages each still needs, the reservation admission keeps,
and whether a request could run even alone in the pool (the scheduler's liveness rules, docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..allocator import OwnerLaneAllocator
from ..config import CPConfig
from ..policy import follows_free_pages
from .config import SimConfig

_I64 = np.int64


def stuck_alone(
    config: SimConfig,
    policy: str,
    held_pages: np.ndarray,
    prefix_len: int,
    last_page: int,
    extend_len: int = 1,
) -> int:
    """The lane that blocks a request's next ``extend_len`` tokens (a one-token chunk, or an MTP step's K
    slots) even with every other page of the pool free, or -1 when it could run alone.

    A scratch allocator with the same lanes holds only the request's own pages (``held_pages``: int64
    ``[k]``, its prefix and computed pages; ``last_page`` among them holds position ``prefix_len - 1``),
    then plans the chunk under ``policy``. Example C=2, P=1, pages per lane 2 (lane 0's only usable page is
    page 2), rotation, a request holding pages [2, 1] (tokens 0, 1) at prefix 2: its next token goes to
    lane 2 % 2 = 0, whose only usable page it holds -> 0.
    """
    C, P = config.cp_size, config.page_size
    scratch = OwnerLaneAllocator(CPConfig(C, P, policy, config.cp_strategy), list(config.lane_capacities))
    pages = scratch.alloc_pages(np.asarray(held_pages, dtype=_I64) % C)
    last = -1
    if prefix_len:
        where = int(np.flatnonzero(np.asarray(held_pages) == last_page)[0])
        last = int(pages[where]) * P + (prefix_len - 1) % P
    plan = scratch.plan_extend([prefix_len], [extend_len], [last])
    short = np.bincount(plan.page_owners, minlength=C) - scratch.free_pages_per_lane()
    return int(np.argmax(short)) if (short > 0).any() else -1


def pages_to_finish(total_tokens: int, done_tokens: int, page_size: int) -> int:
    """New pages a request still needs: ``ceil(total / P) - ceil(done / P)`` (the partly filled last page
    exists). Example P=4, total 10, done 6: 3 - 2 = 1."""
    return -(-total_tokens // page_size) - -(-done_tokens // page_size)


def even_share(pages: Sequence[int] | np.ndarray, cp_size: int) -> np.ndarray:
    """Pages each lane takes, at most, when C-ZIGZAG spreads ``m`` pages over ``cp_size`` lanes: ``ceil(m / C)``
    per request (int64, shape of ``pages``). Example C=4: [1, 4, 5, 9] -> [1, 1, 2, 3]."""
    return -(-np.asarray(pages, dtype=_I64) // cp_size)


def reservation_short(
    policy: str,
    pages_left: Sequence[int],
    room: np.ndarray,
    placed: np.ndarray | None = None,
    *,
    per_lane: bool = True,
) -> str | None:
    """Whether every admitted request can still finish: None, or what is short (``"total"``, ``"lane"``).

    ``pages_left``: the new pages each admitted request still needs after this step (``pages_to_finish``);
    ``room``: free + evictable pages per lane, int64 ``[C]``; ``placed``: the new pages the step's batch
    takes per lane under its plan (int64 ``[C]``; none when omitted); ``per_lane``: False checks the total
    only (a request alone: its pages are all the pool holds besides the cache's; or before the step's plan
    is known). Always: the total fits. Under ``rotation`` and ``legacy`` (phases fixed by position and
    batch index, not by free pages) also every lane: it holds what the step places there plus the even
    shares (``even_share``) of every request's later pages, the spread C-ZIGZAG gives a chunk of ``>= 2C``
    pages and rotation keeps for smaller ones. Counting the step's own pages where its plan puts them (not
    ``ceil(m / C)`` on every lane) lets a burst of one-page requests form the batch C-ROTATION-SPREADS
    describes: at batch indices 0..C-1 they take one page on each lane. ``balanced`` needs no per-lane
    term: it sends a one-page chunk to a lane with a free page, so while the total fits the oldest request
    can always advance. ``legacy`` with chunks of fewer than 2C pages piles them on lane 0 instead of
    spreading them; the livelock that follows is the policy's own, and the report shows it. Example C=2, room [3, 3], rotation: pages left
    [4] -> shares [2] per lane, None; placed [2, 0] with pages left [2] -> lane 0 needs 2 + 1 = 3, None.
    """
    step = int(placed.sum()) if placed is not None else 0
    if sum(pages_left) + step > int(room.sum()):
        return "total"
    if not per_lane or follows_free_pages(policy):
        return None
    need = int(even_share(pages_left, room.shape[0]).sum()) + (placed if placed is not None else 0)
    return None if (need <= room).all() else "lane"
