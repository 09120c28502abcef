"""The owner-lane paged allocator (SPEC section 7): ``OwnerLaneAllocator``, its result ``ExtendAllocation``
and its page pool ``LanePool``.

- ``pool.py``: ``LanePool``, per-lane free stacks and the handed-out bitmap; knows no plan (C-ALLOC);
- ``owner_lane.py``: ``OwnerLaneAllocator``, the call protocol: check, plan (``plan_extend``, stamped with
  the state it was made under), commit that plan (``allocate``; ``alloc_extend`` is both), pick, build
  ``out_cache_loc``, take the pages;
- ``one_page.py``: the path without the planner for batches whose requests take at most one new page;
- ``aligned.py``: the path without the planner for a few requests whose prefixes end on page boundaries;
- ``checks.py``: the checks of the calls' inputs (page ids, lanes, ``last_locs``; C-FAIL-FAST);
- ``result.py``: ``ExtendAllocation``.

The policy rules are ``cpkv.policy``'s, the slot reference ``cpkv.slots``'s.
"""

from .owner_lane import OwnerLaneAllocator
from .pool import LanePool
from .result import ExtendAllocation

__all__ = ["ExtendAllocation", "LanePool", "OwnerLaneAllocator"]
