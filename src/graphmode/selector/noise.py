"""How much latency moves on its own, per model shape and metric, from the race rows behind a model.

A user comparing two modes by hand (or a before/after of a switch) sees two effects that no mode causes,
and issue 17's H200 experiments measured both (docs/results/h200-start-effect-vllm0.24.md):

* **a restart alone**: two warm starts of one mode sit a fixed 1–4% apart when paired in time. The race's
  A/A arm (``--control``: a second engine of the default raced like a challenger) measures it per shape;
  its pooled verdict is the figure (ratio and interval).
* **the clock alone**: inside one engine start, the same workload measured minutes apart moved by a CV of
  8–10% from minute to minute, and every engine on the host moved with it. Here it is the default arm's
  round-to-round spread of ln(metric) per (race, engine start, workload), pooled over those groups (the
  within-group variance with Σ(n − 1) degrees of freedom), as a CV; it includes the cells' own noise,
  which is what two measurements minutes apart on one engine differ by.

The card keeps one :class:`RaceNoise` per (shape, metric) that has race rows; a recommendation names it, so
a gain can be read against what a restart or the hour would have done anyway.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graphmode.profiling.race_rounds import CONTROL_ARM, DEFAULT_ARM, RACE_METRICS, jit_tainted
from graphmode.profiling.race_sizes import is_sizes_row
from graphmode.selector.featurize import shape_key, shape_of_row
from graphmode.selector.verdicts import RaceVerdict


class RaceNoise(BaseModel):
    """What a restart alone and the clock alone moved one metric by, on one model shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: str
    metric: str
    restart: RaceVerdict | None = Field(
        None, description="the A/A arm's pooled verdict: a second start of the default against the first")
    wander_cv_pct: float | None = Field(
        None, description="CV % of the default's metric on one workload from round to round inside one start")
    wander_rounds: int = Field(0, ge=0, description="default-arm rounds behind wander_cv_pct")
    wander_df: int = Field(0, ge=0, description="degrees of freedom of the pooled variance (rounds − groups)")
    wander_minutes: float | None = Field(
        None, ge=0, description="the longest span of rounds of one group (race, start, workload), minutes")

    def describe(self) -> str:
        parts = []
        r = self.restart
        if r is not None and r.ratio is not None:
            ci = f" [{r.lo:.2f}–{r.hi:.2f}]" if r.lo is not None and r.hi is not None else ""
            parts.append(f"a restart alone moved {self.metric} {r.ratio:.2f}×{ci} (A/A arm, {r.rounds} paired "
                         f"rounds)")
        if self.wander_cv_pct is not None:
            span = f" over up to {self.wander_minutes:.0f} min" if self.wander_minutes else ""
            parts.append(f"the same workload on one engine start moved by a CV of {self.wander_cv_pct:.0f}% "
                         f"from round to round ({self.wander_rounds} rounds{span})")
        return "; ".join(parts)


def _log_value(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        return None
    return math.log(float(v))


def race_noise(rows: Iterable[Mapping[str, Any]], verdicts: Sequence[RaceVerdict],
               metrics: Sequence[str] = RACE_METRICS) -> list[RaceNoise]:
    """One :class:`RaceNoise` per (shape, metric) of the race rows in *rows*; *verdicts* gives the A/A arms."""
    # (shape, metric) → (race, start, workload) → [(round time, ln value)]
    groups: dict[tuple[str, str], dict[tuple[str, str, str], list[tuple[float, float]]]] = \
        defaultdict(lambda: defaultdict(list))
    shapes: set[str] = set()
    for r in rows:
        if r.get("status") != "ok" or r.get("race_round") is None or not r.get("race_arm") or is_sizes_row(r) \
                or jit_tainted(r):
            continue
        shape = shape_key(shape_of_row(r))
        shapes.add(shape)
        if r["race_arm"] != DEFAULT_ARM:
            continue
        t = r.get("race_round_t0")
        when = float(t) if isinstance(t, int | float) and math.isfinite(t) else float(r["race_round"])
        key = (str(r.get("race_id")), str(r.get("race_start_id") or ""), str(r.get("workload")))
        for m in metrics:
            y = _log_value(r.get(m))
            if y is not None:
                groups[(shape, m)][key].append((when, y))
    aa: dict[tuple[str, str], RaceVerdict] = {}
    for v in verdicts:  # a shape raced at several max_model_len may have an A/A arm in each: the longest counts
        if v.mode == CONTROL_ARM and v.workload is None and v.ratio is not None:
            held = aa.get((v.shape, v.metric))
            if held is None or v.rounds > held.rounds:
                aa[(v.shape, v.metric)] = v
    out: list[RaceNoise] = []
    for shape in sorted(shapes):
        for m in metrics:
            cv, n, df, minutes = _wander(groups.get((shape, m), {}))
            restart = aa.get((shape, m))
            if cv is None and restart is None:
                continue
            out.append(RaceNoise(shape=shape, metric=m, restart=restart, wander_cv_pct=cv, wander_rounds=n,
                                 wander_df=df, wander_minutes=minutes))
    return out


def _wander(by_group: Mapping[tuple[str, str, str], list[tuple[float, float]]]
            ) -> tuple[float | None, int, int, float | None]:
    """(CV %, rounds, df, longest span in minutes) of the pooled within-group spread; CV None below 2 df."""
    ss, df, n, span = 0.0, 0, 0, 0.0
    timed = True
    for pts in by_group.values():
        n += len(pts)
        if len(pts) < 2:
            continue
        ys = [y for _, y in pts]
        mean = sum(ys) / len(ys)
        ss += sum((y - mean) ** 2 for y in ys)
        df += len(ys) - 1
        ts = [t for t, _ in pts]
        span = max(span, max(ts) - min(ts))
        timed = timed and min(ts) > 1e6  # epoch seconds, not the round index a row without a time falls back to
    if df < 2:
        return None, n, df, None
    cv = 100.0 * math.sqrt(math.expm1(ss / df))
    return round(cv, 2), n, df, (round(span / 60.0, 1) if timed else None)


def noise_for(noise: Sequence[RaceNoise], shape: str, metric: str) -> RaceNoise | None:
    return next((x for x in noise if x.shape == shape and x.metric == metric), None)


__all__ = ["RaceNoise", "noise_for", "race_noise"]
