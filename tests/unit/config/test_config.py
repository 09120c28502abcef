"""CPConfig validation and CPKV_OWNER_POLICY (C-PHASE, C-FAIL-FAST)."""

import pytest

from cpkv import ConfigError, CPConfig, PlanError

pytestmark = pytest.mark.unit


@pytest.mark.clause("C-PHASE")
def test_policy_from_env_read_once(monkeypatch):
    monkeypatch.setenv("CPKV_OWNER_POLICY", "legacy")
    cfg = CPConfig(4, 64)
    monkeypatch.setenv("CPKV_OWNER_POLICY", "rotation")
    assert cfg.owner_policy == "legacy"
    assert CPConfig(4, 64).owner_policy == "rotation"
    monkeypatch.delenv("CPKV_OWNER_POLICY")
    assert CPConfig(4, 64).owner_policy == "balanced"  # the default (C-PHASE, C-BALANCED)
    assert CPConfig(4, 64, "balanced").owner_policy == "balanced"


@pytest.mark.clause("C-FAIL-FAST")
def test_bad_values(monkeypatch):
    monkeypatch.setenv("CPKV_OWNER_POLICY", "fastest")
    with pytest.raises(ConfigError, match="CPKV_OWNER_POLICY='fastest'"):
        CPConfig(4, 64)
    with pytest.raises(ConfigError, match="owner_policy='x'"):
        CPConfig(4, 64, "x")
    with pytest.raises(PlanError, match="cp_size must be >= 1, got 0"):
        CPConfig(0, 64, "rotation")
    with pytest.raises(PlanError, match="page_size must be >= 1, got -2"):
        CPConfig(4, -2, "rotation")
    with pytest.raises(ConfigError, match="cp_size must be an integer, got True"):
        CPConfig(True, 64, "rotation")


def test_frozen():
    cfg = CPConfig(2, 16, "rotation")
    with pytest.raises(AttributeError):
        cfg.cp_size = 4
