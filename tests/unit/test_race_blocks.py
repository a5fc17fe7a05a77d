"""Start-aware statistics on synthetic rounds with a planted engine-start effect (no server).

Model of the rounds: ``y = θ + a_i − d_j + e``, ``a_i``/``d_j`` the mode's and the default's start effects,
``e`` the round's noise. A lucky start of the mode reads as an effect equal to the start effect; a verdict
that takes rounds as the unit calls it "better", one that takes (mode start, default start) blocks must not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from graphmode.profiling.race_rounds import CONTROL_ARM, DEFAULT_ARM, RoundTable, aa_between, arm_verdicts
from graphmode.profiling.sequential import (
    BetweenStarts,
    Block,
    SequentialRule,
    block_interval,
    decide,
    design_effect,
    sequential_decision,
)

RULE = SequentialRule()
CHAIN: list[Block] = [("A1", "D1"), ("A1", "D2"), ("A2", "D2")]  # the race's staggered restarts, two starts each


def rounds(effects: dict[Block, float], per_block: int, noise: float, rng: np.random.Generator,
           theta: float = 0.0) -> tuple[list[float], list[Block]]:
    ys: list[float] = []
    bs: list[Block] = []
    for b, start_effect in effects.items():
        ys += list(theta + start_effect + rng.normal(0, noise, per_block))
        bs += [b] * per_block
    return ys, bs


def test_design_effect_of_disjoint_blocks_and_of_the_chain() -> None:
    assert design_effect([("A1", "D1"), ("A2", "D2"), ("A3", "D3")]) == pytest.approx(1.0)
    assert design_effect(CHAIN) == pytest.approx(2.5)
    # five blocks of the three-start chain: still more than 1
    assert design_effect([*CHAIN, ("A2", "D3"), ("A3", "D3")]) > 1.5


def test_one_lucky_start_reads_better_per_round_but_not_with_a_second_start() -> None:
    rng = np.random.default_rng(1)
    start = -0.10  # the mode's first start is 10% lucky: the true ratio is 1
    ys, bs = rounds({("A1", "D1"): start}, 8, 0.02, rng)
    # one start each and a race that will make no other (--starts 1): the per-round interval calls it better
    assert sequential_decision(ys, RULE, bs).verdict == "better"
    # the race that will start twice (min_starts 2) refuses at one start, and says why
    one = sequential_decision(ys, SequentialRule(min_starts=2), bs)
    assert one.verdict == "undecided" and "needs 2 engine starts" in one.why and one.starts == 1
    # with the second starts (the chain): the unlucky second start of the mode (+10%) shows up as spread
    ys2, bs2 = rounds({("A1", "D1"): start, ("A1", "D2"): start, ("A2", "D2"): -start}, 8, 0.02, rng)
    two = sequential_decision(ys2, SequentialRule(min_starts=2), bs2)
    assert two.verdict == "undecided" and two.starts == 2 and two.blocks == 3
    # the selector replays with min_starts 1, but the rounds as a whole have two starts: the early one-start
    # looks may not settle it either
    assert sequential_decision(ys2, RULE, bs2).verdict == "undecided"


def test_a_real_effect_larger_than_the_start_effect_is_better_with_two_starts() -> None:
    rng = np.random.default_rng(2)
    effects = {b: e for b, e in zip(CHAIN, rng.normal(0, 0.01, 3), strict=True)}
    ys, bs = rounds(effects, 4, 0.02, rng, theta=math.log(0.7))
    d = sequential_decision(ys, SequentialRule(min_starts=2), bs)
    assert d.verdict == "better" and d.starts == 2 and d.blocks == 3
    assert d.hi is not None and d.hi < 0.97 and d.n >= 9  # decided only once the third block has a round


def test_three_blocks_use_the_t_interval_across_block_means_times_the_design_effect() -> None:
    ys = [0.01, 0.03, -0.02, 0.00, 0.05, 0.04, 0.02]
    bs = [CHAIN[0]] * 2 + [CHAIN[1]] * 3 + [CHAIN[2]] * 2
    iv = block_interval(ys, bs, 0.95)
    assert iv is not None
    means = [np.mean(ys[:2]), np.mean(ys[2:5]), np.mean(ys[5:])]
    half = stats.t.ppf(0.975, 2) * math.sqrt(2.5) * np.std(means, ddof=1) / math.sqrt(3)
    assert iv[0] == pytest.approx(np.mean(means)) and iv[2] - iv[0] == pytest.approx(half)
    assert "3 start blocks" in iv[3]


def test_two_blocks_need_the_aa_arms_start_variance() -> None:
    ys = [0.20, 0.22, 0.21, 0.19, 0.21, 0.20]  # 22% slower under both pairs of starts
    bs: list[Block] = [("A1", "D1")] * 3 + [("A2", "D2")] * 3  # both restarted at once (a resumed race)
    assert block_interval(ys, bs, 0.95) is None
    no_aa = decide(ys, SequentialRule(min_starts=2), bs, more_starts=True)
    assert no_aa.verdict == "worse"  # the per-round interval may still keep a clearly slower mode out
    near = [0.01, 0.0, -0.01, 0.0, 0.01, -0.01]  # ...but equivalence needs the start effect measured
    d = decide(near, SequentialRule(min_starts=2), bs, more_starts=True)
    assert d.verdict == "undecided" and "needs more starts" in d.why and "no A/A arm" in d.why
    assert d.reads == "equivalent"  # what the rounds read with the start effect left out, for a caller to weigh
    fast = [-0.27, -0.25, -0.3, -0.26, -0.28, -0.24]  # the H200's 1b-ngram5 FULL TTFT: 0.765x over 2 blocks
    f = decide(fast, SequentialRule(), bs, more_starts=True)
    assert f.verdict == "undecided" and f.reads == "better" and "one start reads better" in f.why
    # a verdict the rounds settle on their own carries no such reading
    assert decide(ys, SequentialRule(min_starts=2), bs, more_starts=True).reads is None
    # with an A/A arm that saw starts 1% apart over four blocks: Var = (ΣS/K²)·τ² + (Σ1/n_k/K²)·σ²_w
    between = BetweenStarts(tau2=0.01**2 / 2, blocks=4)
    iv = block_interval(near, bs, 0.95, between)
    assert iv is not None
    s2w = (np.var(near[:3], ddof=1) + np.var(near[3:], ddof=1)) / 2
    a, b = 4 / 4 * between.tau2, (1 / 3 + 1 / 3) / 4 * s2w
    df = (a + b) ** 2 / (a**2 / 4 + b**2 / 4)
    assert iv[2] - iv[0] == pytest.approx(stats.t.ppf(0.975, df) * math.sqrt(a + b))
    assert decide(near, SequentialRule(min_starts=2), bs, between, more_starts=True).verdict == "equivalent"
    # a wide A/A start effect (10%) leaves it open
    wide = BetweenStarts(tau2=0.10**2 / 2, blocks=1)
    assert decide(near, SequentialRule(min_starts=2), bs, wide, more_starts=True).verdict == "undecided"


def test_aa_between_comes_from_the_control_arm_of_the_table() -> None:
    t = RoundTable()
    for r in range(6):
        d_start = "D1" if r < 3 else "D2"
        t.add(DEFAULT_ARM, r, "w", {"itl_p50": 1.0}, start=d_start)
        t.add(CONTROL_ARM, r, "w", {"itl_p50": 0.9 if r < 3 else 1.1}, start="C1" if r < 3 else "C2")
        t.add("FULL", r, "w", {"itl_p50": 1.0}, start="F1" if r < 3 else "F2")
    between = aa_between(t, "itl_p50")
    assert between is not None and between.blocks == 2
    assert between.tau2 == pytest.approx((math.log(0.9) ** 2 + math.log(1.1) ** 2) / 2 / 2)
    # FULL's two blocks read exactly 1, but the A/A arm says two starts differ by ~10%: not equivalent
    v = arm_verdicts(t, "FULL", ["itl_p50"], SequentialRule(min_starts=2))
    assert v.pooled["itl_p50"].verdict == "undecided" and v.pooled["itl_p50"].starts == 2
    # ...and the A/A arm is not judged by its own start variance
    assert "no A/A arm" in arm_verdicts(t, CONTROL_ARM, ["itl_p50"], SequentialRule(min_starts=2)).pooled["itl_p50"].why


def test_false_better_rate_with_a_planted_start_effect() -> None:
    """A/A races (true ratio 1) with a start effect of 7% per start and 3% round noise, 12 rounds: per-round
    verdicts from one start each call 'better' in about a quarter of races; two starts in the chain, with
    blocks as the unit, about as seldom as the nominal rate."""
    rng = np.random.default_rng(3)
    tau, noise, races = 0.07, 0.03, 300
    one_start, two_starts, two_worse = 0, 0, 0
    for _ in range(races):
        a1, a2, d1, d2 = rng.normal(0, tau, 4)
        ys, bs = rounds({("A1", "D1"): a1 - d1}, 12, noise, rng)
        one_start += sequential_decision(ys, RULE, bs).verdict == "better"
        ys2, bs2 = rounds({("A1", "D1"): a1 - d1, ("A1", "D2"): a1 - d2, ("A2", "D2"): a2 - d2}, 4, noise, rng)
        v = sequential_decision(ys2, SequentialRule(min_starts=2), bs2).verdict
        two_starts += v == "better"
        two_worse += v == "worse"  # from the first start, past the start margin
    assert one_start / races > 0.15
    assert two_starts / races < 0.05
    assert two_worse / races < 0.15


def test_worse_from_one_start_needs_the_start_margin() -> None:
    ys = [math.log(1.09), math.log(1.08), math.log(1.085), math.log(1.09)]  # 8.6% slower, one start each
    bs: list[Block] = [("A1", "D1")] * 4
    # --starts 1 too (since 2026-12-02): one start each may be all of 8.6%, as an A/A arm's 1.23× TTFT showed
    one = decide(ys, RULE, bs)
    assert one.verdict == "undecided" and "not past the start margin" in one.why
    held = decide(ys, SequentialRule(min_starts=2), bs)
    assert held.verdict == "undecided" and "needs 2 engine starts" in held.why
    slow = [math.log(1.6), math.log(1.55), math.log(1.62)]  # NONE-like: out after its first start
    d = decide(slow, SequentialRule(min_starts=2), bs[:3])
    assert d.verdict == "worse" and "start margin" in d.why
    assert decide(ys, SequentialRule(min_starts=2, start_margin=0.0), bs).verdict == "worse"
    with pytest.raises(ValueError):
        SequentialRule(start_margin=-0.1)


def test_a_settled_verdict_says_when_its_later_rounds_read_otherwise() -> None:
    # Three start blocks one after another read "equivalent" once the third is complete (round 12); a burst in
    # the fourth (1.58x, as in lease 9's 8B capture race, H200 2026-12-04) that all 16 rounds no longer bear out.
    blocks: list[Block] = [(f"L{i}", f"D{i}") for i in (1, 2, 3, 4) for _ in range(4)]
    ys = [-0.005, 0.015, 0.008, 0.002, 0.014, 0.016, -0.006, 0.009, 0.008, -0.005, 0.005, -0.004, 0.46, 0.04,
          0.009, -0.005]
    bs = blocks[:len(ys)]
    d = sequential_decision(ys, RULE, bs)
    assert d.verdict == "equivalent" and d.n == 12 and d.over_starts
    assert d.since is not None and d.since.startswith("all 16 rounds read undecided")
    assert "over 4 start blocks" in d.since and "since then all 16 rounds" in d.describe()
    # the verdict stands: it is what the race acted on (the mean of the three block means)
    assert d.ratio == pytest.approx(math.exp(sum(ys[:12]) / 12), rel=0.01)
    # Later rounds that agree add nothing; a verdict reached on the last round has no "since".
    quiet = [*ys[:12], 0.005, 0.004, 0.006, 0.001]
    assert sequential_decision(quiet, RULE, blocks[:len(quiet)]).since is None
    last = sequential_decision(ys[:12], RULE, bs[:12])
    assert last.verdict == "equivalent" and last.since is None
