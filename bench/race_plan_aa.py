#!/usr/bin/env python3
"""Tried and dropped (docs/design.md, "What we tried that did not work"): the A/A arm's start variance in
every race interval, not only in the two-block one.

With three or more start blocks the race's interval (graphmode.profiling.sequential.block_interval) is the t
interval across block means widened by the chain's design effect, computed as if the start effect were all of
the noise. The alternative simulated here uses the model-based variance of the two-block case for any number
of blocks, ``Var(θ̂) = (ΣS/K²)·τ̂² + (Σ 1/n_k / K²)·σ̂²_w`` with τ̂² from a simulated A/A arm (a second
default engine restarted with the challenger) and Welch–Satterthwaite degrees of freedom, and races it
against the current rule on the same draws: races of one challenger with the race's restart-wave rule
(graphmode.profiling.race.wave_due), a look after every round, the first verdict standing.

usage: .venv/bin/python bench/race_plan_aa.py TAU SIGMA      (e.g. 0.025 0.08; ~10 minutes on 2 cores)
Prints P(verdict) in % per true ratio (1.0, 0.9, 0.95), starts (2, 3, 4) and rule ("D": the current design-
effect interval, "model": the alternative), 300 races each, seed 0.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy import stats

try:
    import graphmode  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from graphmode.profiling import sequential as sq
from graphmode.profiling.race import wave_due
from graphmode.profiling.sequential import (
    BetweenStarts,
    Block,
    Decision,
    SequentialRule,
    between_from_aa,
    decide,
    starts_of,
)

CURRENT = sq.block_interval


def model_interval(log_ratios: Sequence[float], blocks: Sequence[Block], confidence: float,
                   between: BetweenStarts | None = None) -> tuple[float, float, float, str] | None:
    """The alternative: the model-based variance with the A/A arm's τ̂² for any K ≥ 3 (else the current)."""
    groups = sq._by_block(log_ratios, blocks)
    keys = list(groups)
    k = len(keys)
    if k >= 3 and between is not None and between.blocks >= 1:
        s2w, dfw = sq._pooled_within(list(groups.values()))
        if dfw >= 1:
            mean = float(np.mean([np.mean(g) for g in groups.values()]))
            a = sq._shared(keys) / k**2 * between.tau2
            b = sum(1 / len(g) for g in groups.values()) / k**2 * s2w
            var = a + b
            df = var**2 / ((a**2 / between.blocks if a > 0 else 0.0) + (b**2 / dfw if b > 0 else 0.0))
            half = float(stats.t.ppf((1 + confidence) / 2, df)) * math.sqrt(var)
            return mean, mean - half, mean + half, "model-based, A/A start variance"
    return CURRENT(log_ratios, blocks, confidence, between)


def race(theta: float, a: np.ndarray, c: np.ndarray, d: np.ndarray, e: np.ndarray, ec: np.ndarray,
         starts: int, rule: SequentialRule, block_rounds: int, max_rounds: int) -> tuple[Decision, int]:
    """One race: challenger starts *a*, A/A arm starts *c* (restarted with the challenger), default *d*."""
    ys: list[float] = []
    bs: list[Block] = []
    yc: list[float] = []
    bc: list[Block] = []
    ms = ds = 1
    bn = 0
    last = Decision("undecided", 0, None, None, None, "no round", 0, 0)
    for r in range(max_rounds):
        ys.append(theta + a[ms - 1] - d[ds - 1] + e[r])
        bs.append((f"A{ms}", f"D{ds}"))
        yc.append(c[ms - 1] - d[ds - 1] + ec[r])
        bc.append((f"C{ms}", f"D{ds}"))
        bn += 1
        last = decide(ys, rule, bs, between_from_aa(yc, bc), starts_of(bs) >= 2)
        if last.decided:
            return last, r + 1
        due = wave_due(starts, block_rounds, rule.min_rounds, ds, [(ms, bn)])
        if due is None:
            continue
        if due == "default":
            ds += 1
        else:
            ms += 1
        bn = 0
    return last, max_rounds


def run(ratio: float, starts: int, tau: float, sigma: float, alternative: bool, races: int = 300,
        seed: int = 0, max_rounds: int = 30, block_rounds: int = 2) -> tuple[dict[str, int], float]:
    sq.block_interval = model_interval if alternative else CURRENT  # decide() looks it up at call time
    try:
        rng = np.random.default_rng(seed)
        rule = SequentialRule(min_starts=starts)
        counts = {"better": 0, "worse": 0, "equivalent": 0, "undecided": 0}
        rounds = []
        for _ in range(races):
            a, c, d = rng.normal(0, tau, (3, starts + 1))
            e, ec = rng.normal(0, sigma, (2, max_rounds))
            v, n = race(math.log(ratio), a, c, d, e, ec, starts, rule, block_rounds, max_rounds)
            counts[v.verdict] += 1
            rounds.append(n)
    finally:
        sq.block_interval = CURRENT
    return {k: round(v / races * 100) for k, v in counts.items()}, float(np.median(rounds))


def main(argv: Sequence[str]) -> int:
    try:
        tau, sigma = float(argv[0]), float(argv[1])
        if not (tau >= 0 and sigma > 0):
            raise ValueError
    except (IndexError, ValueError):
        print("usage: race_plan_aa.py TAU SIGMA (TAU >= 0, SIGMA > 0; log-space sds)", file=sys.stderr)
        return 2
    for ratio in (1.0, 0.9, 0.95):
        for starts in (2, 3, 4):
            for alternative in (False, True):
                res, med = run(ratio, starts, tau, sigma, alternative)
                rule = "model" if alternative else "D"
                print(f"tau {tau} sigma {sigma} ratio {ratio} starts {starts} {rule:5}: {res} "
                      f"median rounds {med}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
