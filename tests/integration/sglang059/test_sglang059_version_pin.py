"""cpkv's SGLang plugin under a real SGLang other than its pin (0.5.9, in ``.venv-sglang059``).

SGLang 0.5.9 has neither plugin group (``sglang.srt.plugins``, ``sglang.srt.platforms``), so it never loads
cpkv's entry points; a start that calls the general plugin anyway under ``SGLANG_PLATFORM=cpkv`` stops with
one line naming the installed version and the pin.
"""

import importlib.metadata

import pytest

try:
    INSTALLED = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:  # make test's venv: tests/integration/sglang would import as
    INSTALLED = None  # a namespace package called sglang, so the version is read from the installed metadata

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(INSTALLED != "0.5.9", reason="needs sglang 0.5.9 (.venv-sglang059)"),
]

hooks = pytest.importorskip("cpkv.integrations.sglang_hooks")
checks = pytest.importorskip("cpkv.integrations.sglang_checks")

LINE = (
    "cpkv: SGLang 0.5.9 is installed but cpkv's SGLang plugin is pinned to 0.5.23 (its hooks name that "
    "release's functions): install sglang==0.5.23 or unset SGLANG_PLATFORM"
)


def test_the_general_plugin_refuses_sglang_059_with_one_line(monkeypatch):
    assert checks.installed_sglang_version() == "0.5.9"
    monkeypatch.setenv("SGLANG_PLATFORM", "cpkv")
    monkeypatch.setenv("CPKV_CP_SIZE", "4")
    with pytest.raises(hooks.SGLangStartError) as exc:
        hooks.register()
    assert str(exc.value) == LINE and exc.value.code == LINE
    assert not isinstance(exc.value, Exception)  # SGLang's plugin loader catches Exception, not SystemExit


def test_unselected_the_plugin_does_nothing_under_sglang_059(monkeypatch):
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    assert hooks.register() is None
