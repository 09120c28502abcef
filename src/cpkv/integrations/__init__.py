"""Adapters that plug cpkv into serving engines. Each engine's module imports that engine, and only it;
importing this package imports no engine. ``cpkv.integrations.sglang``: SGLang 0.5.23's allocator;
``sglang_platform``: SGLang's platform plugin (``SGLANG_PLATFORM=cpkv``); ``sglang_cp``: SGLang's CP split
metadata from a plan (imports no sglang). See docs/sglang.md.
"""
