"""The race's sequential decision: is a mode worse, equivalent or better than vLLM's default on a metric?

Data
    One observation per *round*: ``y = ln(mode / default)`` of a metric (ITL p50, TTFT p50, ...), both cells
    measured in the same round on resident engines of one GPU, one after the other, on the same seeded
    request plan. A round runs one workload, so ``y`` is paired in time and in load; rounds cycle through
    a design of workloads (:mod:`graphmode.profiling.race_design`), and the mean of ``y`` over rounds
    estimates the mode's effect averaged over that design. Rounds on different workloads are treated as
    exchangeable: a mode that helps one workload and hurts another shows as spread, which widens the
    interval and keeps the pooled verdict open; the per-workload verdicts (the same rule on one
    workload's rounds) then say where it helps.

Interval
    The two-sided ``confidence`` (default 95%) Student t interval of the mean of ``y``:
    ``mean ± t_{(1+c)/2, n-1} · sd / sqrt(n)`` (scipy.stats.t), mapped back to a ratio with ``exp``.

Rules, with margin ``δ`` (default 3%), after at least ``min_rounds`` (default 3) rounds:
    * **worse** when the interval's lower bound is above ``ln(1 + δ)``: the mode is more than δ slower;
    * **better** when its upper bound is below ``ln(1 - δ)``: more than δ faster;
    * **equivalent** when the whole interval lies inside ``[-ln(1 + δ), ln(1 + δ)]``, i.e. the ratio
      inside ``[1/(1+δ), 1+δ]`` (symmetric in log space). This is the two one-sided tests (TOST)
      procedure run with the two-sided interval, so each one-sided test is at level ``(1-c)/2``
      (2.5% at 95%): stricter than the textbook TOST at 5%.
    * otherwise **undecided**.

A verdict is taken at the first round whose interval crosses a boundary and then stands
(:func:`sequential_decision`). Every round is a look at the data, so the nominal error rates hold per
look, not for the race: the minimum of rounds and the budget bound the looks, and the A/A control
arm (a second engine of the default raced like a challenger, ``--control``) measures the
false-positive rate that results.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

Verdict = Literal["better", "worse", "equivalent", "undecided"]
DECIDED: frozenset[str] = frozenset({"better", "worse", "equivalent"})


@dataclass(frozen=True)
class SequentialRule:
    delta: float = 0.03
    confidence: float = 0.95
    min_rounds: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if not 0.5 <= self.confidence < 1:  # per-workload verdicts raise it (race_rounds.workload_rule)
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.min_rounds < 2:
            raise ValueError(f"min_rounds must be at least 2 (a t interval needs two), got {self.min_rounds}")


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    n: int
    ratio: float | None  # exp(mean ln ratio): the geometric mean of mode / default
    lo: float | None  # the interval, as ratios
    hi: float | None
    why: str

    @property
    def decided(self) -> bool:
        return self.verdict in DECIDED

    def describe(self) -> str:
        if self.ratio is None:
            return f"{self.verdict} ({self.why})"
        ci = f" [{self.lo:.3f}, {self.hi:.3f}]" if self.lo is not None and self.hi is not None else ""
        return f"{self.verdict}: {self.ratio:.3f}×{ci}, {self.n} rounds"


def interval(log_ratios: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(mean, lower, upper) of the t interval of the mean, in log space. Needs two values at least."""
    y = np.asarray(log_ratios, dtype=float)
    n = len(y)
    if n < 2:
        raise ValueError("a t interval needs at least two values")
    mean = float(y.mean())
    sd = float(y.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def decide(log_ratios: Sequence[float], rule: SequentialRule = SequentialRule()) -> Decision:
    """The verdict on the rounds so far (see the module docstring for the rules)."""
    ys = [float(v) for v in log_ratios if math.isfinite(v)]
    n = len(ys)
    if n == 0:
        return Decision("undecided", 0, None, None, None, "no paired round yet")
    if n < max(rule.min_rounds, 2):
        return Decision("undecided", n, math.exp(sum(ys) / n), None, None,
                        f"{n} of the {rule.min_rounds} rounds needed before a verdict")
    mean, lo, hi = interval(ys, rule.confidence)
    up, down = math.log1p(rule.delta), math.log1p(-rule.delta)
    ratio, rlo, rhi = math.exp(mean), math.exp(lo), math.exp(hi)
    pct = f"{rule.confidence:.0%}"
    if lo > up:
        return Decision("worse", n, ratio, rlo, rhi, f"{pct} interval above 1+δ ({1 + rule.delta:.3f})")
    if hi < down:
        return Decision("better", n, ratio, rlo, rhi, f"{pct} interval below 1-δ ({1 - rule.delta:.3f})")
    if -up <= lo and hi <= up:
        return Decision("equivalent", n, ratio, rlo, rhi, f"{pct} interval inside [1/(1+δ), 1+δ] (TOST)")
    return Decision("undecided", n, ratio, rlo, rhi, _open_reason(lo, hi, up, down))


def sequential_decision(log_ratios: Sequence[float], rule: SequentialRule = SequentialRule()) -> Decision:
    """The verdict at the first round whose interval crossed a boundary, else the open one over all rounds.

    A race looks after every round and acts on the first crossing (it stops the engine once every metric
    has one), so a verdict, once reached, stands: rounds measured later for another metric's sake do not
    reopen it. Replaying the rounds in order gives the same answer from the dataset.
    """
    ys = [float(v) for v in log_ratios if math.isfinite(v)]
    for n in range(max(rule.min_rounds, 2), len(ys) + 1):
        d = decide(ys[:n], rule)
        if d.decided:
            return d
    return decide(ys, rule)


def _open_reason(lo: float, hi: float, up: float, down: float) -> str:
    if lo < down and hi > up:
        return "interval spans both margins: too noisy so far"
    if hi > up:
        return "interval straddles 1+δ: may be worse"
    if lo < down:
        return "interval straddles 1-δ: may be better"
    return "interval reaches past 1/(1+δ)"  # inside (1-δ, 1+δ) but not inside the log-symmetric band
