"""Deterministic simulator of owner-lane KV allocation under CP prefill (SPEC section 11).

Submodules: ``workload`` (request traces: Mooncake JSONL loader, seeded synthetic and tiny-chunks
workloads, token ids derived from block ids).
"""
