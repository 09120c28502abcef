"""Adapters that plug cpkv into serving engines. Each engine's module imports that engine, and only it;
importing this package imports no engine. ``cpkv.integrations.sglang``: SGLang 0.5.23 (docs/sglang.md).
"""
