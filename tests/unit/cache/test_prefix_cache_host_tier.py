"""The host tier container: per-lane capacity, LRU order, typed errors (SPEC C-RELOAD)."""

import pytest

from cpkv import ConfigError
from cpkv.cache import HostTier
from cpkv.errors import PrefixCacheError

pytestmark = pytest.mark.unit


@pytest.mark.clause("C-RELOAD")
def test_lanes_are_separate_bounded_lru_maps():
    host = HostTier(2, [2, 1])
    host.put(b"a", 0, "A")
    host.put(b"b", 0, "B")
    host.put(b"a", 1, "A1")  # same content key on another lane is another copy
    assert host.count_per_lane().tolist() == [2, 1] and len(host) == 3
    assert host.is_full(0) and host.is_full(1)
    assert list(host.lru_keys(0)) == [b"a", b"b"]
    host.touch(b"a", 0)
    assert list(host.lru_keys(0)) == [b"b", b"a"]
    assert host.get(b"a", 1) == "A1" and host.get(b"a", 0) == "A"
    assert host.pop(b"b", 0) == "B"
    assert (b"b", 0) not in host and (b"a", 1) in host
    assert sorted(host.items()) == [(b"a", 0), (b"a", 1)]


def test_misuse_raises_typed_errors():
    host = HostTier(2, 1)
    host.put(b"k", 0, None)
    with pytest.raises(PrefixCacheError, match="already held"):
        host.put(b"k", 0, None)
    with pytest.raises(PrefixCacheError, match="host lane 0 is full"):
        host.put(b"j", 0, None)
    with pytest.raises(PrefixCacheError, match="no host copy 6b on lane 1"):
        host.get(b"k", 1)
    with pytest.raises(PrefixCacheError, match=r"lane=2 out of range \[0, 2\)"):
        host.touch(b"k", 2)
    with pytest.raises(ConfigError, match="host_pages_per_lane has 3 entries, cp_size=2 needs 2"):
        HostTier(2, [1, 1, 1])
    assert HostTier(3, 0).is_full(2)  # capacity 0: the tier is disabled on that lane
