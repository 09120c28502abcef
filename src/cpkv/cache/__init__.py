"""The prefix cache (SPEC section 8: C-RELOAD, C-LOCK): a radix tree of page runs (``radix``), the cache
with owners (``prefix_cache``), its counts and stamps (``book``), lane-aware eviction (``eviction``, in
``lru`` order), load-back on the recorded lanes (``loadback``), the host tier (``host_tier``) and the
write-back of evicted pages (``writeback``)."""

from .host_tier import HostTier
from .prefix_cache import PrefixCache
from .results import CacheEntry, InsertResult, PrefixMatch

__all__ = ["CacheEntry", "HostTier", "InsertResult", "PrefixCache", "PrefixMatch"]
