"""How the sweep's figures tell a design's series apart (``plots``): a colour family per design proper (the
values of ``FAMILY_KEYS``: policy, KV storage design, CP strategy), a shade of it per value of the other
varied keys (a pool, a chunk size), a marker per ``cp_size``. Sixteen series (two C x two pools x four
designs) then read as four colours, two shades and two markers, with one legend entry for each, not sixteen.

Series that coincide (three policies with the same figures) stay visible: each family draws its markers and
lines a step smaller than the one before, on top (``Style.size``, ``Style.line_width``), so equal points
show as concentric rings and equal lines as nested stripes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FAMILY_KEYS = ("kv_storage", "policy", "cp_strategy")
"""Varied keys whose values pick a series' colour family; ``cp_size`` picks its marker (``MARKER_KEY``), the
other varied keys its shade within the family."""

MARKER_KEY = "cp_size"

MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h")
"""One per ``cp_size`` value, smallest first (cycled past eight); never ``x``, which marks an unserved point."""

FAMILY_COLOURS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
)
"""Base colour of each family, in the order of the families' labels (cycled past ten)."""

LIGHTEST, DARKEST = 0.5, 0.3
"""A family's shades run from its colour mixed this much with white to it mixed this much with black (two
shades: the light one and the colour itself, so no family darkens into another's brown)."""


@dataclass(frozen=True)
class Style:
    """One series' look: ``colour`` (RGB floats in [0, 1]), ``marker``, ``size`` (marker points; the line
    width is ``line_width``), the legend labels of its ``family``, ``shade`` and ``marker_label`` ("" where the
    figure varies no such key), its family's base colour ``family_colour`` and its shade's place
    ``shade_index`` among ``shade_count`` (0: lightest)."""

    colour: tuple[float, float, float]
    marker: str
    size: float
    family: str
    shade: str
    marker_label: str
    family_colour: tuple[float, float, float]
    shade_index: int
    shade_count: int

    @property
    def line_width(self) -> float:
        """Points: 3.0 for the first family down to 0.75 for the fourth, so equal lines show as nested stripes."""
        return (self.size - 3.0) / 2.0


def label(pairs: Sequence[tuple]) -> str:
    """``key=value`` of each pair, space-separated, pairs with value None left out (``policy`` of a design
    other than owner-lane); "" for none."""
    return " ".join(f"{k}={v}" for k, v in pairs if v is not None)


def _order(value) -> tuple:
    """Sort key for mixed grid values: numbers by value, before text."""
    return (
        (0, value, "")
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else (1, 0, str(value))
    )


def _mix(rgb, other: float, t: float) -> tuple[float, float, float]:
    return tuple(c + (other - c) * t for c in rgb)


def shades(rgb, n: int) -> list[tuple[float, float, float]]:
    """``n`` shades of ``rgb`` from light to dark: ``[rgb]`` for one; for two ``rgb`` mixed ``LIGHTEST`` with
    white, then ``rgb``; for more, evenly from that light one to ``rgb`` mixed ``DARKEST`` with black."""
    rgb = tuple(float(c) for c in rgb)
    if n == 1:
        return [rgb]
    dark = 0.0 if n == 2 else DARKEST
    out = []
    for j in range(n):
        t = -LIGHTEST + (LIGHTEST + dark) * j / (n - 1)  # < 0: towards white, > 0: towards black
        out.append(_mix(rgb, 1.0, -t) if t < 0 else _mix(rgb, 0.0, t))
    return out


def series_styles(designs: Sequence[tuple]) -> dict[tuple, Style]:
    """The ``Style`` of each design (a tuple of ``(key, value)`` pairs, ``results.design_of``): family from
    its ``FAMILY_KEYS`` pairs, marker from ``cp_size``, shade from the rest; every design gets one."""
    from matplotlib.colors import to_rgb

    def parts(design):
        fam = tuple((k, v) for k, v in design if k in FAMILY_KEYS)
        rest = tuple((k, v) for k, v in design if k not in FAMILY_KEYS and k != MARKER_KEY)
        c = next((v for k, v in design if k == MARKER_KEY), None)
        return fam, rest, c

    split = {d: parts(d) for d in designs}
    families = sorted({f for f, _, _ in split.values()}, key=label)
    rests = sorted({r for _, r, _ in split.values()}, key=lambda r: [_order(v) for _, v in r])
    sizes = sorted({c for _, _, c in split.values() if c is not None}, key=_order)
    base = {f: to_rgb(FAMILY_COLOURS[i % len(FAMILY_COLOURS)]) for i, f in enumerate(families)}
    palette = {f: shades(rgb, len(rests)) for f, rgb in base.items()}
    out = {}
    for d, (fam, rest, c) in split.items():
        i, j = families.index(fam), rests.index(rest)
        marker = MARKERS[sizes.index(c) % len(MARKERS)] if c is not None else MARKERS[0]
        out[d] = Style(
            colour=palette[fam][j],
            marker=marker,
            size=9.0 - 1.5 * (i % 4),
            family=label(fam),
            shade=label(rest),
            marker_label=f"{MARKER_KEY}={c}" if c is not None else "",
            family_colour=base[fam],
            shade_index=j,
            shade_count=len(rests),
        )
    return out


def legend_handles(styles: dict[tuple, Style]) -> tuple[list, str]:
    """Legend entries for ``styles`` and the legend's title: one line per family (its base colour), one line
    per shade when there are several (light to dark; grey when there are several families, else the family's
    own shades), one black marker per ``cp_size``; the title says what colour, shade and marker stand for
    (e.g. ``colour: kv_storage, policy | shade: pages_per_lane | marker: cp_size``). What a figure does not
    vary gets no entry: ``([], "")`` for a single series."""
    from matplotlib.lines import Line2D

    values = list(styles.values())
    fams = {s.family: s.family_colour for s in values}
    rests = {s.shade_index: s.shade for s in values}
    marks = {s.marker_label: s.marker for s in values if s.marker_label}
    handles, title = [], []
    if len(fams) > 1:
        handles += [Line2D([], [], color=c, lw=2.5, label=f or "-") for f, c in sorted(fams.items())]
        title.append(f"colour: {', '.join(k for k in FAMILY_KEYS if any(f'{k}=' in f for f in fams))}")
    if len(rests) > 1:  # grey shades for several families; the one family's own shades for one
        greys = shades(
            (0.45, 0.45, 0.45) if len(fams) > 1 else values[0].family_colour, values[0].shade_count
        )
        handles += [Line2D([], [], color=greys[j], lw=2.5, label=rests[j]) for j in sorted(rests)]
        title.append(
            f"shade: {', '.join(dict.fromkeys(p.split('=')[0] for r in rests.values() for p in r.split()))}"
        )
    if len(marks) > 1:
        handles += [
            Line2D([], [], ls="", marker=m, color="black", label=k)
            for k, m in sorted(marks.items(), key=lambda kv: MARKERS.index(kv[1]))
        ]
        title.append(f"marker: {MARKER_KEY}")
    return handles, " | ".join(title)
