"""The sweep's figures stay readable with 16 series: a colour family per design, a shade per pool,
a marker per cp_size, one legend entry per colour, shade and marker (8, not 16), the legend outside the
axes, a labelled tick at every GPU count; hit_rate.png draws a KV storage design other than owner-lane once,
not once per policy."""

from __future__ import annotations

import itertools

import pytest

from cpkv.sweep import plots
from cpkv.sweep.series_style import MARKERS, legend_handles, series_styles, shades

pytestmark = pytest.mark.unit

VARIED = ["cp_size", "pages_per_lane", "policy", "kv_storage", "groups"]
FAMILIES = [
    ("rotation", "owner-lane"),
    ("legacy", "owner-lane"),
    ("balanced", "owner-lane"),
    ("rotation", "replicated"),
]


def _rows():
    """2 C x 2 pools x 4 designs x 3 group counts: 16 series; every policy has the same figures (they overlap)."""
    rows = []
    for C, Q, (policy, design), g in itertools.product((4, 8), (256, 2048), FAMILIES, (1, 2, 4)):
        rows.append(
            {
                "status": "ok",
                "gpus": C * g,
                "groups": g,
                "ttft_ms_p99": 9000.0 / g / (C / 4),
                "requests_total": 10,
                "requests_finished": 10,
                "livelock_detected": False,
                "policy": policy if design == "owner-lane" else None,
                "cache_hit_rate": Q / 10_000 + g / 100,
                "_kv_tokens_per_gpu": Q * 64,
                "_provenance": None,
                "_settings": {
                    "cp_size": C,
                    "pages_per_lane": Q,
                    "policy": policy,
                    "kv_storage": design,
                    "groups": g,
                },
            }
        )
    return rows


@pytest.fixture
def figures(monkeypatch):
    """The matplotlib figures the plots draw, kept open instead of written."""
    drawn = []
    monkeypatch.setattr(plots, "_png", lambda fig: drawn.append(fig) or b"png")
    yield drawn
    plt = plots.load_matplotlib()
    for fig in drawn:
        plt.close(fig)


def test_sixteen_designs_are_four_colours_two_shades_two_markers():
    designs = [
        (
            ("cp_size", C),
            ("pages_per_lane", Q),
            ("policy", p if d == "owner-lane" else None),
            ("kv_storage", d),
        )
        for C, Q, (p, d) in itertools.product((4, 8), (256, 2048), FAMILIES)
    ]
    styles = series_styles(designs)
    assert len({(s.colour, s.marker) for s in styles.values()}) == 16  # every series its own look
    assert len({s.family_colour for s in styles.values()}) == 4
    assert {s.marker for s in styles.values()} == set(MARKERS[:2])
    for s in styles.values():  # pages_per_lane 256 is the family's light shade, 2048 its own colour
        assert s.colour == shades(s.family_colour, 2)[0 if "=256" in s.shade else 1]
        assert s.marker == MARKERS[0 if s.marker_label == "cp_size=4" else 1]
    sizes = sorted({s.size for s in styles.values()}, reverse=True)
    assert sizes == [9.0, 7.5, 6.0, 4.5]  # each family a step smaller: equal points show as rings
    handles, title = legend_handles(styles)
    assert [h.get_label() for h in handles] == [
        "kv_storage=replicated",
        "policy=balanced kv_storage=owner-lane",
        "policy=legacy kv_storage=owner-lane",
        "policy=rotation kv_storage=owner-lane",
        "pages_per_lane=256",
        "pages_per_lane=2048",
        "cp_size=4",
        "cp_size=8",
    ]
    assert title == "colour: kv_storage, policy | shade: pages_per_lane | marker: cp_size"


def test_one_design_has_no_legend_entries():
    styles = series_styles([(("groups", 1),)])
    assert legend_handles(styles) == ([], "")


def test_pareto_legend_outside_and_a_tick_at_every_gpu_count(figures):
    plots.pareto_png(_rows(), VARIED, None, "t")
    (fig,) = figures
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "8", "16", "32"]
    assert list(ax.get_xticks()) == [4, 8, 16, 32]
    assert ax.xaxis.get_minor_locator().tick_values(4, 32) == []  # no unlabelled minor ticks between
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == 8 + 2  # colours, shades, markers; unserved and the Pareto front
    assert labels[-1] == "Pareto front (serves every request)"
    assert (
        legend.get_title().get_text()
        == "colour: kv_storage, policy | shade: pages_per_lane | marker: cp_size"
    )
    fig.canvas.draw()
    box = legend.get_window_extent().transformed(ax.transAxes.inverted())
    assert box.x0 > 1.0  # outside the axes, to the right
    series = [
        ln for ln in ax.get_lines() if ln.get_linestyle() == "-" and not ln.get_label().startswith("Pareto")
    ]
    assert len(series) == 16  # one line per series


def test_hit_rate_draws_replicated_once_with_its_legend_outside(figures):
    plots.hit_rate_png(_rows(), VARIED, "t")
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.get_title().startswith("groups = ")]
    assert [ax.get_title() for ax in panels] == ["groups = 1", "groups = 2", "groups = 4"]
    for ax in panels:  # C x (3 owner-lane policies + replicated): 8 lines, not C x 4 policies x 2 designs
        assert len(ax.get_lines()) == 8
        assert [t.get_text() for t in ax.get_xticklabels()] == ["16k", "128k"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "kv_storage=replicated",
        "policy=balanced kv_storage=owner-lane",
        "policy=legacy kv_storage=owner-lane",
        "policy=rotation kv_storage=owner-lane",
        "cp_size=4",
        "cp_size=8",
    ]
    fig.canvas.draw()
    right = max(ax.get_window_extent().x1 for ax in panels)
    assert legend.get_window_extent().x0 >= right  # beside the panels, not over one


def test_one_family_shows_its_own_shades():
    designs = [(("chunk_size", 2048),), (("chunk_size", 8192),), (("chunk_size", 4096),)]
    styles = series_styles(designs)
    handles, title = legend_handles(styles)
    assert [h.get_label() for h in handles] == ["chunk_size=2048", "chunk_size=4096", "chunk_size=8192"]
    assert [h.get_color() for h in handles] == [styles[d].colour for d in sorted(designs)]  # light to dark
    assert title == "shade: chunk_size"
