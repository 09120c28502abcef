"""The owner-lane paged allocator (SPEC section 7): ``OwnerLaneAllocator``, its result ``ExtendAllocation``,
its page pool ``LanePool`` and the contract the simulator's scheduler drives it through, ``PageAllocator``.

- ``pool.py``: ``LanePool``, per-lane free stacks and the handed-out bitmap; knows no plan (C-ALLOC);
- ``owner_lane.py``: ``OwnerLaneAllocator``, the call protocol: check, plan (``plan_extend``, the state it
  was made under recorded), commit that plan (``allocate``; ``alloc_extend`` is both), pick, build
  ``out_cache_loc``, take the pages;
- ``one_page.py``: the path without the planner for batches whose requests take at most one new page;
- ``aligned.py``: the path without the planner for a few requests whose prefixes end on page boundaries;
- ``checks.py``: the checks of the calls' inputs (page ids, lanes, ``last_locs``, draft lengths; C-FAIL-FAST);
- ``stamp.py``: what each plan was made under, and which plans committed (plan, then commit);
- ``protocol.py``: ``PageAllocator``, the calls the scheduler makes of any storage design's allocator;
- ``result.py``: ``ExtendAllocation``.

The policy rules are ``cpkv.policy``'s, the slot reference ``cpkv.slots``'s.
"""

from .owner_lane import OwnerLaneAllocator
from .pool import LanePool
from .protocol import PageAllocator
from .result import ExtendAllocation

__all__ = ["ExtendAllocation", "LanePool", "OwnerLaneAllocator", "PageAllocator"]
