"""``groups = "search"``: the fewest CP groups that meet the target, for each combination of the other grid
keys, by bisection with the neighbours checked (docs/sweep.md, "Searching for the fewest groups").

A design (one value of every other key) is searched over ``lo..hi`` groups (``Grid.search``). Round 1
replays every design at ``hi``: a design that misses the target there is "not met within the bounds".
Each later round replays, for every design still open, the middle of its bracket ``(fails, meets]``
(``fails`` starts at ``lo - 1``, known to fail by convention), so a design needs about ``log2(hi - lo + 1)``
rounds; all designs of a round replay together on the executor. When a bracket closes on ``g``, its
neighbours are checked: ``g - 1`` (if ``>= lo``) must fail and ``g + 1`` (if ``<= hi``) meet; each is
replayed if it was not, and a neighbour that breaks the pattern is reported (``monotone`` False: more
groups did not always help, so the answer is the fewest found, not proven fewest). Every replayed point is
a row of the results, as a listed grid's.
"""

from __future__ import annotations

from typing import Any

from .results import meets


def search_groups(grid, replay: Any) -> tuple:  # replay: a run.Replayer (run imports this module)
    """Run the search of ``grid`` (``grid.search`` set) through ``replay`` (``run.Replayer``: replays a plan
    and keeps the records). Returns ``(plan, found)``: the plan of every replayed point (``replay.merged``)
    and one dict per design: ``{"design": {key: value}, "fewest_groups": g or None, "met": bool, "bounds":
    [lo, hi], "tried": [groups replayed, ascending], "monotone": bool}``."""
    from .points import prepare_points

    lo, hi = grid.search
    designs = grid.points()  # every combination of the other keys, without groups
    bracket = {i: [lo - 1, None] for i in range(len(designs))}  # (fails, meets)
    result: dict[int, dict[int, bool]] = {i: {} for i in bracket}  # design -> groups -> met

    def run(wanted: dict[int, list[int]]) -> None:
        points, index = [], []
        for i, groups in wanted.items():
            for g in groups:
                if g not in result[i]:
                    points.append({**designs[i], "groups": (g, g)})
                    index.append((i, g))
        if not points:
            return
        plan = prepare_points(grid, points)
        replay(plan)
        for (i, g), row in zip(index, plan.rows, strict=True):
            record = replay.records.get(row["key"]) if row["key"] else None
            metrics = record.get("metrics") if record and record["status"] == "ok" else None
            full = {**row, "status": record["status"] if record else row["status"], **(metrics or {})}
            result[i][g] = metrics is not None and meets(full, grid.target)

    run({i: [hi] for i in bracket})
    for i in bracket:
        bracket[i][1] = hi if result[i][hi] else None
    while True:
        open_ = {i: [(b[0] + b[1]) // 2] for i, b in bracket.items() if b[1] is not None and b[1] - b[0] > 1}
        if not open_:
            break
        run(open_)
        for i, (mid,) in open_.items():
            bracket[i][1 if result[i][mid] else 0] = mid
    run(
        {
            i: [g for g in (b[1] - 1, b[1] + 1) if lo <= g <= hi]
            for i, b in bracket.items()
            if b[1] is not None
        }
    )
    found = []
    for i, (_, best) in bracket.items():
        tried = result[i]
        monotone = best is None or (not tried.get(best - 1, False) and tried.get(best + 1, True))
        design = {k: w for k, (_, w) in designs[i].items()}
        found.append(
            {
                "design": design,
                "fewest_groups": best,
                "met": best is not None,
                "bounds": [lo, hi],
                "tried": sorted(tried),
                "monotone": monotone,
            }
        )
    return replay.merged(grid), found


def search_lines(found: list[dict]) -> list[str]:
    """The console's lines for a search: one per design that missed the target within its bounds, or whose
    neighbours broke the bisection's assumption; nothing for the others (the designs table has them)."""
    out = []
    for f in found:
        name = ", ".join(f"{k}={v}" for k, v in f["design"].items())
        lo, hi = f["bounds"]
        if not f["met"]:
            out.append(f"search: {name}: the target is not met within groups {lo}..{hi} (tried {f['tried']})")
        elif not f["monotone"]:
            out.append(
                f"search: {name}: {f['fewest_groups']} groups meet the target but a neighbour breaks the "
                f"pattern (tried {f['tried']}): the fewest found, not proven fewest"
            )
    return out
