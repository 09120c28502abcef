"""The sweep's two figures (matplotlib, Agg): ``pareto.png`` (GPUs against TTFT p99: every design's
points joined by groups, the Pareto front, the target) and ``hit_rate.png`` (prefix-cache hit rate
against the KV cache per GPU, one line per design, one panel per ``groups``). Series are told apart by
``series_style``: colour by design, shade by the other varied keys, marker by ``cp_size``."""

from __future__ import annotations

import io
from collections.abc import Sequence

from ..sim.lanes_plot import load_matplotlib
from .results import design_of, meets, pareto_front
from .series_style import label, legend_handles, series_styles

MAX_PANELS = 4
"""``hit_rate.png`` draws at most this many ``groups`` values (the smallest)."""


def _label(design: tuple) -> str:
    return label(design) or "every point"


def _png(fig) -> bytes:
    import gc

    plt = load_matplotlib()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    del fig
    gc.collect()  # as lanes_png: free the renderer now, not inside a later Ctrl-C
    return buf.getvalue()


def pareto_png(rows: Sequence[dict], varied: Sequence[str], target, title: str) -> bytes:
    """GPUs (``cp_size x groups``, log 2, a labelled tick at every GPU count) against TTFT p99 (s, log): one
    series per design, its points joined in order of GPUs, styled by ``series_style`` (colour family by
    policy and KV storage design, shade by the other varied keys, marker by ``cp_size``; a cross: it left
    requests unserved; ringed: priced past the measured tables, ``cost_provenance.extrapolated``), the Pareto
    front as a black step line with each front point's design written beside it, the target's TTFT bound as
    a dashed red line; the legend outside, one entry per colour, shade and marker."""
    plt = load_matplotlib()
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(11, 6.5), layout="constrained")
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok" and r.get("ttft_ms_p99") is not None:
            by.setdefault(design_of(r, varied), []).append(r)
    styles = series_styles(list(by))
    for design, members in sorted(by.items(), key=lambda kv: _label(kv[0])):
        st = styles[design]
        members.sort(key=lambda r: r["gpus"])
        xs, ys = [r["gpus"] for r in members], [r["ttft_ms_p99"] / 1000 for r in members]
        z = 3 + (9 - st.size)  # the smaller marks of later families on top: equal points show as rings
        ax.plot(xs, ys, "-", color=st.colour, lw=st.line_width, zorder=z)
        for r, x, y in zip(members, xs, ys, strict=True):
            served = meets(r, None)
            ax.plot(
                x,
                y,
                st.marker if served else "x",
                color=st.colour,
                ms=st.size,
                mec="white" if served else None,
                mew=0.6 if served else 2,
                zorder=z,
            )
            if (r.get("_provenance") or {}).get("extrapolated"):  # priced past the measured tables
                ax.plot(x, y, "o", mfc="none", mec="black", ms=st.size + 5, mew=0.8, zorder=z)
    handles, legend_title = legend_handles(styles)
    handles += [
        Line2D(
            [],
            [],
            ls="",
            marker="x",
            color="grey",
            mew=2,
            label="x: left requests unserved (rejected or livelock)",
        )
    ]
    if any((r.get("_provenance") or {}).get("extrapolated") for rs in by.values() for r in rs):
        handles += [
            Line2D(
                [],
                [],
                ls="",
                marker="o",
                mfc="none",
                mec="black",
                ms=11,
                label="ringed: priced past the measured tables",
            )
        ]
    front = pareto_front(rows)
    if front:
        fx, fy = [r["gpus"] for r in front], [r["ttft_ms_p99"] / 1000 for r in front]
        (line,) = ax.step(
            fx, fy, where="post", color="black", lw=2, label="Pareto front (serves every request)", zorder=20
        )
        handles.append(line)
        for r, x, y in zip(front, fx, fy, strict=True):
            ax.annotate(
                _label(design_of(r, varied)), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7
            )
    bound = [
        v for m, op, v in (target.conditions if target else ()) if m == "ttft_ms_p99" and op in ("<", "<=")
    ]
    if bound:
        handles.append(
            ax.axhline(
                min(bound) / 1000,
                color="tab:red",
                ls="--",
                lw=1.2,
                label=f"target: ttft_ms_p99 <= {min(bound):g}",
            )
        )
    gpus = sorted({r["gpus"] for rs in by.values() for r in rs})
    if gpus:
        from matplotlib.ticker import FuncFormatter, NullLocator

        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _pos: f"{y:g}" if f"{y:.1g}"[0] in "25" else ""))
    else:
        ax.text(0.5, 0.5, "no point finished a request", ha="center", transform=ax.transAxes)
    ax.set_xlabel("GPUs (cp_size x groups)")
    ax.set_ylabel("TTFT p99 (s, simulated)")
    ax.set_title(title.replace(" | ", "\n"), fontsize=10, loc="left")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(
        handles=handles,
        title=legend_title or None,
        title_fontsize=7,
        fontsize=7,
        loc="center left",
        bbox_to_anchor=(1.01, 0.5),
        frameon=False,
    )
    return _png(fig)


def hit_rate_png(rows: Sequence[dict], varied: Sequence[str], title: str) -> bytes:
    """``cache_hit_rate`` against KV tokens per GPU (``mean pages_per_lane x page_size``, log 2, a labelled
    tick at every size): one line per design (the varied keys but ``pages_per_lane``, ``page_size`` and
    ``groups``; ``results.design_of``, so a KV storage design other than owner-lane is one line, not one per
    policy), styled as in ``pareto_png``; one panel per ``groups`` value (at most ``MAX_PANELS``); the legend
    outside."""
    plt = load_matplotlib()
    from matplotlib.ticker import NullLocator

    keys = [k for k in varied if k not in ("pages_per_lane", "page_size", "groups")]
    ran = [r for r in rows if r["status"] == "ok" and r.get("cache_hit_rate") is not None]
    groups = sorted({r["groups"] for r in ran})[:MAX_PANELS] or [1]
    fig, axes = plt.subplots(
        1, len(groups), figsize=(4.2 * len(groups) + 3, 4.6), layout="constrained", sharey=True, squeeze=False
    )
    styles = series_styles(list({design_of(r, keys): None for r in ran}))
    for ax, g in zip(axes[0], groups, strict=True):
        by: dict[tuple, list[dict]] = {}
        for r in ran:
            if r["groups"] == g:
                by.setdefault(design_of(r, keys), []).append(r)
        for design, members in sorted(by.items(), key=lambda kv: _label(kv[0])):
            st = styles[design]
            members.sort(key=lambda r: r["_kv_tokens_per_gpu"])
            ax.plot(
                [r["_kv_tokens_per_gpu"] for r in members],
                [r["cache_hit_rate"] for r in members],
                "-",
                marker=st.marker,
                ms=st.size,
                mec="white",
                mew=0.6,
                lw=st.line_width,
                color=st.colour,
                zorder=3 + (9 - st.size),
            )
        if by:
            sizes = sorted({r["_kv_tokens_per_gpu"] for rs in by.values() for r in rs})
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes)
            ax.xaxis.set_major_formatter(_tokens_formatter())
            ax.xaxis.set_minor_locator(NullLocator())
            ax.margins(x=0.12)
        else:
            ax.text(0.5, 0.5, "no point ran", ha="center", transform=ax.transAxes)
        ax.set_title(f"groups = {g}", fontsize=9)
        ax.set_xlabel("KV cache per GPU (tokens)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("prefix-cache hit rate (hit / prompt tokens)")
    fig.suptitle(title.replace(" | ", "\n"), fontsize=10, x=0.01, ha="left")
    handles, legend_title = legend_handles(styles)
    if handles:
        fig.legend(
            handles=handles,
            title=legend_title or None,
            title_fontsize=7,
            fontsize=7,
            loc="outside right center",
            frameon=False,
        )
    return _png(fig)


def _tokens_formatter():
    """Tick labels in tokens: ``512``, ``64k``, ``1M``."""
    from matplotlib.ticker import FuncFormatter

    def text(x: float, _pos) -> str:
        for div, unit in ((2**20, "M"), (2**10, "k")):
            if x >= div:
                return f"{x / div:g}{unit}"
        return f"{x:g}"

    return FuncFormatter(text)
