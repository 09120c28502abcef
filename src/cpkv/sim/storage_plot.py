"""``storage.png`` of ``cpkv simulate --kv-storage``: the KV storage designs side by side (SPEC C-STORAGE).

One row per replay (design, and policy under owner-lane), the same rows in both panels: on the left the
cache hit rate (prompt KV served from the prefix cache, with the hit tokens), on the right TTFT p50 and
p99 in seconds. Each row's label names the design's KV capacity, the reason hit rates differ.
"""

from __future__ import annotations

from .lanes_plot import load_matplotlib, png_bytes

COLORS = {
    "owner-lane": "tab:blue",
    "replicated": "tab:red",
    "interleaved": "tab:orange",
    "interleaved-vblock": "tab:purple",
}
"""One colour per design, in both panels."""


def storage_png(results: list, config: dict, status: str = "complete") -> bytes:
    """``storage_figure`` rendered as PNG bytes (110 dpi)."""
    return png_bytes(lambda: storage_figure(results, config, status))


def _label(r) -> str:
    m = r.metrics
    tokens = m.get("kv_capacity_tokens") or 0
    rejected = m.get("requests_rejected") or 0
    note = f"\n{rejected:,} of {m.get('requests_total', 0):,} rejected" if rejected else ""
    return f"{r.policy}\n{tokens / 1e6:,.2f}M tokens of KV{note}"


def storage_figure(results: list, config: dict, status: str = "complete"):
    """The matplotlib ``Figure``: hit rate and TTFT per replay. ``results``: ``PolicyResult`` list with the
    storage metrics; ``config``: the report's config dict (title)."""
    plt = load_matplotlib()
    n = max(len(results), 1)
    fig, (hit_ax, ttft_ax) = plt.subplots(
        1, 2, figsize=(12, 1.6 + 0.75 * n), sharey=True, layout="constrained"
    )
    rows = list(range(len(results)))[::-1]  # the first replay on top
    colors = [COLORS.get(r.metrics.get("kv_storage"), "tab:gray") for r in results]
    rates = [100 * (r.metrics.get("cache_hit_rate") or 0.0) for r in results]
    hit_ax.barh(rows, rates, color=colors, height=0.6)
    for y, rate, r in zip(rows, rates, results, strict=True):
        hits = r.metrics.get("cache_hit_tokens") or 0
        hit_ax.text(rate, y, f" {rate:.1f} % ({hits / 1e6:,.2f}M tokens)", va="center", fontsize=8)
    hit_ax.set_xlim(0, max(max(rates, default=0) * 1.45, 1))
    hit_ax.set_yticks(rows, [_label(r) for r in results], fontsize=8)
    hit_ax.set_xlabel("cache hit rate: prompt KV served from the prefix cache (%)")
    hit_ax.grid(axis="x", lw=0.3, alpha=0.5)

    p50 = [(r.metrics.get("ttft_ms_p50") or 0.0) / 1000 for r in results]
    p99 = [(r.metrics.get("ttft_ms_p99") or 0.0) / 1000 for r in results]
    h = 0.36
    ttft_ax.barh([y + h / 2 for y in rows], p50, height=h, color=colors, alpha=0.55, label="TTFT p50")
    ttft_ax.barh([y - h / 2 for y in rows], p99, height=h, color=colors, label="TTFT p99")
    for y, a, b in zip(rows, p50, p99, strict=True):
        ttft_ax.text(a, y + h / 2, f" p50 {a:,.1f} s", va="center", fontsize=7)
        ttft_ax.text(b, y - h / 2, f" p99 {b:,.1f} s", va="center", fontsize=7)
    ttft_ax.set_xlim(0, max(max(p99, default=0) * 1.3, 1e-3))
    ttft_ax.set_xlabel("time to first token (s; light: p50, dark: p99)")
    ttft_ax.grid(axis="x", lw=0.3, alpha=0.5)
    fig.suptitle(_title(config, status), fontsize=10, x=0.01, ha="left")
    return fig


def _title(config: dict, status: str) -> str:
    Q = config.get("pages_per_lane", 0)
    q = ",".join(map(str, Q)) if isinstance(Q, (list, tuple)) else f"{int(Q):,}"
    prov = config.get("cost_provenance") or {}
    cost = prov.get("cost_model", "")
    cost += f" ({prov['gpu']}, {prov['model']}, {prov['backend']})" if cost == "measured" else ""
    head = f"KV storage designs on {config.get('workload_description') or config.get('workload', '')}"
    line = (
        f"C={config.get('cp_size')} ranks, P={config.get('page_size')} tokens per page, Q={q} pages of HBM per "
        f"rank in every design; times: {cost} cost model"
    )
    return f"{head}\n{line}" + (f"  [{status}]" if status != "complete" else "")
