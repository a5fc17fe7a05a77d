#!/usr/bin/env python3
"""Did the arms of a race's rounds measure the same window? Warm-up and requests sent, paired with the default.

A round runs one seeded request plan on every arm; the pair (arm, default) is only a fair comparison when both
measured the same stretch of that plan. Per dataset and challenger arm, over the rounds both have an ok cell:

* pairs: rounds paired with the default arm;
* sd Δwarm-up s: the spread of (arm's warm-up − default's warm-up), from ``warmup_used_s``. Fixed warm-ups
  (race cells since 2026-12-02) give ~0; a warm-up that ended with the first finished request did not;
* |Δsent|: mean absolute difference of requests sent in the cell (``n_sent``) and the share of pairs where
  it differs: the same window of the same open-loop plan sends the same requests (±1 at the edges);
* r(Δwarm-up, ln ITL) and r(Δwarm-up, ln TTFT): Pearson correlation of the warm-up difference with the
  paired log ratio, both centred within (workload, arm's start, default's start) groups, so neither a
  workload's own effect nor a start effect counts. Part can be reverse (a slower engine finishes its first
  request later), part is the window itself (a later window sits further into the batch's build-up); with
  fixed warm-ups it is undefined;
* sd ln ITL: the within-group sd of the paired log ITL ratio (the round noise a race's interval sees), and
  the same with the warm-up difference regressed out: about what fixed windows leave, where the
  correlation is the window's;
* r(ln batch, ln ITL) and its slope: the paired log ratio of the mean running batch (``obs_batch_mean``)
  against the paired log ITL ratio, centred as above. On one open-loop plan the arms' batches differ only
  because their engines ran at different speeds: a slower engine holds more requests, and where the step
  is host-bound (a vLLM process at a full core) more requests make the step slower still. A slope near 1
  says the cells sit on that loop and any per-engine difference comes out amplified (the H200's 1B at
  32 req/s, 2026-12-03: r 0.94, slope 0.83); closed-loop cells (a fixed number in flight) hold the batch.

    .venv/bin/python bench/race_windows.py DATASET [...] [--race latest|KEY|all] [--markdown]

Measured 2026-12-02 on the H200 races of vLLM 0.33 (before the fix): docs/method-racing.md, step 2.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphmode.core.dataset import ProfileStore
from graphmode.profiling.race_rounds import DEFAULT_ARM


@dataclass
class ArmWindows:
    dataset: str
    race: str
    arm: str
    pairs: int
    sd_dwarm: float | None
    mean_dsent: float | None
    share_dsent: float | None
    r_itl: float | None
    r_ttft: float | None
    sd_itl: float | None = None  # within-group sd of ln(ITL ratio), and with Δwarm-up regressed out
    sd_itl_fixed: float | None = None
    r_batch: float | None = None  # paired ln(batch ratio) against ln(ITL ratio): correlation and slope
    slope_batch: float | None = None


def _centred(points: Sequence[tuple[Any, float, float]]) -> tuple[list[float], list[float], int]:
    """(group, x, y) points centred within their groups; singletons drop out. Also the number of groups kept."""
    groups: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for g, x, y in points:
        groups[g].append((x, y))
    xs: list[float] = []
    ys: list[float] = []
    kept = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        kept += 1
        mx, my = statistics.fmean(m[0] for m in members), statistics.fmean(m[1] for m in members)
        xs += [m[0] - mx for m in members]
        ys += [m[1] - my for m in members]
    return xs, ys, kept


def _corr(points: Sequence[tuple[Any, float, float]]) -> float | None:
    x, y, _ = _centred(points)
    if len(x) < 3 or statistics.pstdev(x) == 0 or statistics.pstdev(y) == 0:
        return None
    return statistics.correlation(x, y)


def _sds(points: Sequence[tuple[Any, float, float]]) -> tuple[float | None, float | None]:
    """Within-group sd of y, and of y less its least-squares line in x (one more degree of freedom spent)."""
    x, y, kept = _centred(points)
    dof = len(y) - kept
    if dof < 2:
        return None, None
    sd = math.sqrt(sum(v * v for v in y) / dof)
    sxx = sum(v * v for v in x)
    if sxx == 0:
        return sd, sd
    b = sum(a * c for a, c in zip(x, y, strict=True)) / sxx
    return sd, math.sqrt(sum((c - b * a) ** 2 for a, c in zip(x, y, strict=True)) / (dof - 1))


def _slope(points: Sequence[tuple[Any, float, float]]) -> float | None:
    x, y, _ = _centred(points)
    sxx = sum(v * v for v in x)
    if len(x) < 3 or sxx == 0:
        return None
    return sum(a * c for a, c in zip(x, y, strict=True)) / sxx


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def arm_windows(rows: Sequence[Mapping[str, Any]], dataset: str, race: str) -> list[ArmWindows]:
    """One line per challenger arm of *race*: how far its windows sat from the default's (module docstring)."""
    cells: dict[tuple[int, str], dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for r in rows:
        if r.get("race_id") == race and r.get("status") == "ok" and r.get("race_round") is not None:
            cells[(int(r["race_round"]), str(r["workload"]))][str(r["race_arm"])] = r
    by_arm: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = defaultdict(list)
    for arms in cells.values():
        d = arms.get(DEFAULT_ARM)
        if d is None:
            continue
        for arm, r in arms.items():
            if arm != DEFAULT_ARM:
                by_arm[arm].append((r, d))
    out = []
    for arm, pairs in sorted(by_arm.items()):
        dwarm: list[float] = []
        dsent: list[int] = []
        pts: dict[str, list[tuple[Any, float, float]]] = {"itl_p50": [], "ttft_p50": []}
        batch: list[tuple[Any, float, float]] = []
        for r, d in pairs:
            wa, wd = _num(r.get("warmup_used_s")), _num(d.get("warmup_used_s"))
            group = (r.get("workload"), r.get("race_start_id"), d.get("race_start_id"))
            if wa is not None and wd is not None:
                dwarm.append(wa - wd)
                for metric, points in pts.items():
                    a, b = _num(r.get(metric)), _num(d.get(metric))
                    if a and b and a > 0 and b > 0:
                        points.append((group, wa - wd, math.log(a / b)))
            ba, bd, ia, idf = (_num(r.get("obs_batch_mean")), _num(d.get("obs_batch_mean")),
                               _num(r.get("itl_p50")), _num(d.get("itl_p50")))
            if ba and bd and ia and idf and min(ba, bd, ia, idf) > 0:
                batch.append(((r.get("workload"), r.get("race_start_id"), d.get("race_start_id")),
                              math.log(ba / bd), math.log(ia / idf)))
            sa, sd = r.get("n_sent"), d.get("n_sent")
            if isinstance(sa, int) and isinstance(sd, int):
                dsent.append(abs(sa - sd))
        out.append(ArmWindows(
            dataset, race, arm, len(pairs),
            statistics.pstdev(dwarm) if len(dwarm) >= 2 else None,
            statistics.fmean(dsent) if dsent else None,
            sum(1 for x in dsent if x > 1) / len(dsent) if dsent else None,
            _corr(pts["itl_p50"]), _corr(pts["ttft_p50"]), *_sds(pts["itl_p50"]), _corr(batch), _slope(batch)))
    return out


def races_of(rows: Sequence[Mapping[str, Any]], which: str) -> list[str]:
    last: dict[str, float] = {}
    for r in rows:
        if r.get("race_id"):
            k = str(r["race_id"])
            last[k] = max(last.get(k, 0.0), float(r.get("started_at") or 0.0))
    if which == "all":
        return sorted(last, key=lambda k: last[k])
    if which == "latest":
        return [max(last, key=lambda k: last[k])] if last else []
    return [which] if which in last else []


def render(lines: Sequence[ArmWindows], markdown: bool) -> str:
    head = ["dataset", "race", "arm", "pairs", "sd Δwarm-up s", "|Δsent|", "Δsent > 1", "r(Δwarm-up, ln ITL)",
            "r(Δwarm-up, ln TTFT)", "sd ln ITL", "without Δwarm-up", "r(ln batch, ln ITL)", "slope"]

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    body = [[Path(ln.dataset).name, ln.race, ln.arm, str(ln.pairs), f(ln.sd_dwarm, "{:.2f}"),
             f(ln.mean_dsent, "{:.1f}"), f(ln.share_dsent, "{:.0%}"), f(ln.r_itl, "{:.2f}"), f(ln.r_ttft, "{:.2f}"),
             f(ln.sd_itl, "{:.3f}"), f(ln.sd_itl_fixed, "{:.3f}"), f(ln.r_batch, "{:.2f}"),
             f(ln.slope_batch, "{:.2f}")]
            for ln in lines]
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + " --- |" * len(head),
                          *("| " + " | ".join(row) + " |" for row in body)])
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() for row in [head, *body])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("datasets", nargs="+", type=Path)
    ap.add_argument("--race", default="all", help="latest, all (default) or a race key")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    lines: list[ArmWindows] = []
    for path in a.datasets:
        if not path.is_file():
            print(f"no dataset at {path}", file=sys.stderr)
            return 2
        try:
            with ProfileStore(path, readonly=True) as store:
                rows = store.rows()
        except Exception as exc:  # not a dataset: one line, not a traceback
            print(f"cannot read {path} as a dataset: {exc}", file=sys.stderr)
            return 2
        for race in races_of(rows, a.race):
            lines += arm_windows(rows, str(path), race)
    if not lines:
        print("no race rounds with a default arm in these datasets", file=sys.stderr)
        return 1
    print(render(lines, a.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
