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

    Every round also names the engine *starts* it compared: ``(mode's start, default's start)``, its
    *block*. Pairing in time removes the host's drift but not the start: on the H200 an A/A arm (two
    starts of the default) read 0.90× (0.82–0.99) over 12 rounds. Model:
    ``y = θ + a_i − d_j + e`` with ``a_i``, ``d_j`` the starts' effects (variance ``τ²`` each) and ``e``
    the round's noise (variance ``σ²``). Rounds of one block share ``a_i − d_j``, so with one start each
    the per-round interval below is an interval for ``θ + a_1 − d_1``, not for ``θ``.

Interval with one start of the mode or of the default (or data without start ids)
    The two-sided ``confidence`` (default 95%) Student t interval of the mean of ``y`` over its ``n``
    rounds: ``mean ± t_{(1+c)/2, n-1} · sd / sqrt(n)`` (scipy.stats.t), mapped back to a ratio with ``exp``.

Interval with at least two starts of the mode and two of the default (:func:`block_interval`)
    The unit of replication is the block. ``b_k`` is the mean of ``y`` over block ``k``'s rounds, ``K`` the
    number of blocks, ``θ̂ = mean_k b_k``.

    * ``K ≥ 3`` without an A/A arm: the t interval across block means,
      ``θ̂ ± t_{(1+c)/2, K-1} · sqrt(D) · s_b / sqrt(K)``, ``s_b`` the sd of the ``b_k``. Blocks that share
      a start are correlated (the race's staggered restarts give the chain (A1,D1), (A1,D2), (A2,D2)), which
      ``s_b`` does not see: ``D`` is the design effect
      ``Var(θ̂) / E[s_b²/K]`` under the model with ``σ² = 0`` (the start effect dominating, the conservative
      end): with ``S_kl`` = number of starts blocks ``k`` and ``l`` share (2 on the diagonal),
      ``D = (ΣS / K²) / ((2K − ΣS/K) / (K(K−1)))``. Disjoint blocks give ``D = 1``; the chain of three
      gives ``D = 2.5``.
    * ``K ≥ 2`` with an A/A arm (its start variance ``τ̂²``, :func:`between_from_aa`, ``m`` A/A blocks; taken
      whenever the race has one, at three blocks too: t over three block means has 2 df, and at a spent
      look's confidence its quantile alone is ~10, while the A/A model's df come mostly from the rounds):
      ``Var(θ̂) = (ΣS/K²) · τ̂² + (Σ_k 1/n_k / K²) · σ̂²``, ``σ̂²`` the pooled within-block variance
      (``Σ(n_k − 1)`` df), and ``θ̂ ± t_{(1+c)/2, ν} · sqrt(Var)`` with Welch–Satterthwaite ``ν``. Two blocks
      without an A/A arm (or with one round per block) give no interval: "better" and "equivalent" are
      refused ("needs more starts").

Rules, with margin ``δ`` (default 3%), after at least ``min_rounds`` (default 3) rounds:
    * **worse** when the interval's lower bound is above ``ln(1 + δ)``: the mode is more than δ slower;
    * **better** when its upper bound is below ``ln(1 - δ)``: more than δ faster;
    * **equivalent** when the whole interval lies inside ``[-ln(1 + δ), ln(1 + δ)]``, i.e. the ratio
      inside ``[1/(1+δ), 1+δ]`` (symmetric in log space). This is the two one-sided tests (TOST)
      procedure run with the two-sided interval, so each one-sided test is at level ``(1-c)/2``
      (2.5% at 95%): stricter than the textbook TOST at 5%.
    * otherwise **undecided**.

    "Better" and "equivalent" also need ``min_starts`` starts of the mode and of the default (the race's
    ``--starts``), and at least two of each whenever the rounds as a whole have two. From fewer (or from two
    blocks without an A/A arm), only "worse" is taken, on the per-round interval and with the start's
    possible share added to the margin: the lower bound must clear ``ln(1 + δ) + start_margin`` (default
    0.10 ≈ ln(1/0.903), the H200 A/A arm's start effect on ITL; the race takes 0.20 for TTFT,
    :data:`graphmode.profiling.race_rounds.TTFT_START_MARGIN`). The margin holds for every "worse" without an
    interval over starts, one start per arm asked for included: with one start each, an A/A arm read
    "worse" on TTFT (1.228× [1.05–1.43], 6 rounds; H200, vLLM 0.33, 2026-12-02). That stops clearly slower
    modes (NONE, PIECEWISE) before they cost a restart, while a mode that only drew a slow start stays in
    the race: simulated A/A races with a start effect of 7% per start were called "worse" from their first
    start in a third of races without the allowance.

A verdict is taken at the first round whose interval crosses a boundary and then stands
(:func:`sequential_decision`); where the rounds measured after it (for another metric) read otherwise, the
decision says so (``since``). With ``spend`` each look runs at a higher confidence than the rule's
(:func:`look_confidence`: ``1 - confidence`` is spent over the looks, ``α·6/(π²j²)`` at look ``j``), and a
verdict has the rule's error rate over the whole race, not per look. The two intervals count their looks
apart. The per-round interval looks every round (look ``j = n − min_rounds + 1``). The interval over start
blocks looks once per set of *complete* blocks (a block is complete when its engines no longer run:
``open_blocks`` names the running ones, and replaying a dataset a block is complete from its last round on),
look ``j = K − K₀ + 1`` with ``K`` complete blocks and ``K₀`` the fewest that give an interval (2 with an A/A
arm, else 3). Why: counted per round, the 30th look of a three-block interval (2 df) ran at t ≈ 166, and
three H100 starts that read FULL's TTFT 0.710×, 0.755× and 0.784× gave [0.006, 94.7] (Qwen2.5-0.5B,
2026-12-06): no number of rounds could settle it. "Better" and "equivalent" come from one family per race
(block looks once two starts of each side exist, per-round looks only before), so each keeps ``α``; "worse"
may come from either, at most ``2α``, and the per-round family must also clear the start margin.
The selector's verdicts spend (:data:`graphmode.selector.verdicts.SPENDING_RULE`). Without it a
rule that looks every round reaches "better" on extreme rounds: effect sizes quoted at the stopping round
were 0.66× where all 19 rounds read 0.725×. The A/A control arm (``--control``) still measures the
false-positive rate that results.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["better", "worse", "equivalent", "undecided"]
DECIDED: frozenset[str] = frozenset({"better", "worse", "equivalent"})
Block = tuple[str, str]  # (the mode's engine start, the default's engine start)
ONE_BLOCK: Block = ("", "")


@dataclass(frozen=True)
class SequentialRule:
    delta: float = 0.03
    confidence: float = 0.95
    min_rounds: int = 3
    min_starts: int = 1  # starts of the mode and of the default before "better" or "equivalent"
    start_margin: float = 0.10  # added to ln(1+δ) for "worse" from too few starts
    # spend 1 - confidence over the looks (look_confidence), so that a verdict reached at any look has the
    # rule's error rate over the race; the selector's verdicts take it (selector.verdicts.SPENDING_RULE)
    spend: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if not 0.5 <= self.confidence < 1:  # per-workload verdicts raise it (race_rounds.workload_rule)
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.min_rounds < 2:
            raise ValueError(f"min_rounds must be at least 2 (a t interval needs two), got {self.min_rounds}")
        if self.min_starts < 1:
            raise ValueError(f"min_starts must be at least 1, got {self.min_starts}")
        if not 0 <= self.start_margin < 1:
            raise ValueError(f"start_margin must be in [0, 1), got {self.start_margin}")


@dataclass(frozen=True)
class BetweenStarts:
    """How much one engine start moves ln latency: ``tau2`` per start, from ``blocks`` A/A blocks."""

    tau2: float
    blocks: int


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    n: int
    ratio: float | None  # exp(mean ln ratio): the geometric mean of mode / default
    lo: float | None  # the interval, as ratios
    hi: float | None
    why: str
    starts: int = 1  # distinct engine starts behind the rounds: the fewer of the mode's and the default's
    blocks: int = 1  # distinct (mode start, default start) pairs behind the rounds
    level: float | None = None  # the confidence the interval was taken at (a spent look's, when the rule spends)
    df: float | None = None  # the degrees of freedom of its t quantile
    # what the interval over the rounds reads when the starts alone hold the verdict back ("better" from two
    # start blocks and no A/A arm): evidence at least as strong as a one-start "better", which a caller may
    # act on when independent comparisons agree
    reads: Verdict | None = None
    over_starts: bool = False  # the interval is over start blocks (block_interval), not over rounds
    # a settled verdict whose later rounds (measured for another metric's sake) read otherwise: what all of
    # them read; the verdict stands (the race acted on it), this says how well it held
    since: str | None = None

    @property
    def decided(self) -> bool:
        return self.verdict in DECIDED

    def describe(self) -> str:
        if self.ratio is None:
            return f"{self.verdict} ({self.why})"
        ci = f" [{self.lo:.3f}, {self.hi:.3f}]" if self.lo is not None and self.hi is not None else ""
        starts = f", {self.starts} starts ({self.blocks} blocks)" if self.starts > 1 else ""
        since = f"; since then {self.since}" if self.since else ""
        return f"{self.verdict}: {self.ratio:.3f}×{ci}, {self.n} rounds{starts}{since}"


def _t_ppf(q: float, df: float) -> float:
    """Student's t quantile. scipy is imported here, not with the module: the model card imports this module
    (through the verdicts), and `graphmode launch` reads cards on a path that must stay under a second."""
    from scipy import stats

    return float(stats.t.ppf(q, df))


def interval(log_ratios: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(mean, lower, upper) of the t interval of the mean, in log space. Needs two values at least."""
    import numpy as np

    y = np.asarray(log_ratios, dtype=float)
    n = len(y)
    if n < 2:
        raise ValueError("a t interval needs at least two values")
    mean = float(y.mean())
    sd = float(y.std(ddof=1))
    half = float(_t_ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def starts_of(blocks: Sequence[Block]) -> int:
    """Distinct starts behind *blocks*: the fewer of the mode's and the default's."""
    if not blocks:
        return 0
    return min(len({a for a, _ in blocks}), len({d for _, d in blocks}))


def _by_block(log_ratios: Sequence[float], blocks: Sequence[Block]) -> dict[Block, list[float]]:
    out: dict[Block, list[float]] = defaultdict(list)  # insertion order: blocks as they first appear
    for y, b in zip(log_ratios, blocks, strict=True):
        out[b].append(y)
    return out


def _shared(keys: Sequence[Block]) -> float:
    """ΣS: over every ordered pair of blocks (a block with itself included), the starts they share."""
    return float(sum((a == b) + (c == d) for a, c in keys for b, d in keys))


def _pooled_within(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """Pooled within-block variance and its degrees of freedom."""
    import numpy as np

    ss = sum(float(np.sum((np.asarray(g) - np.mean(g)) ** 2)) for g in groups)
    df = sum(len(g) - 1 for g in groups)
    return (ss / df if df > 0 else math.nan), df


def design_effect(keys: Sequence[Block]) -> float:
    """Var(mean of block means) / E[s_b²/K] when start effects dominate (see the module docstring)."""
    k = len(keys)
    total = _shared(keys)
    return (total / k**2) / ((2 * k - total / k) / (k * (k - 1)))


def block_interval(log_ratios: Sequence[float], blocks: Sequence[Block], confidence: float,
                   between: BetweenStarts | None = None) -> tuple[float, float, float, str, float] | None:
    """(mean, lower, upper, how, degrees of freedom) in log space with blocks as the unit, or None when no
    interval is possible."""
    import numpy as np

    groups = _by_block(log_ratios, blocks)
    keys = list(groups)
    k = len(keys)
    means = [float(np.mean(g)) for g in groups.values()]
    mean = float(np.mean(means))
    q = (1 + confidence) / 2
    aa = between is not None and between.blocks >= 1
    if k >= 3 and not aa:
        d = design_effect(keys)
        half = float(_t_ppf(q, k - 1)) * math.sqrt(d) * float(np.std(means, ddof=1)) / math.sqrt(k)
        return mean, mean - half, mean + half, f"t over {k} start blocks (design effect {d:.2f})", float(k - 1)
    if k < 2 or between is None or not aa:
        return None
    s2w, dfw = _pooled_within(list(groups.values()))
    if dfw < 1:
        return None
    a = _shared(keys) / k**2 * between.tau2
    b = sum(1 / len(g) for g in groups.values()) / k**2 * s2w
    var = a + b
    if var <= 0:
        return None
    df = var**2 / ((a**2 / between.blocks if a > 0 else 0.0) + (b**2 / dfw if b > 0 else 0.0))
    half = float(_t_ppf(q, df)) * math.sqrt(var)
    return mean, mean - half, mean + half, f"{k} start blocks + A/A start variance ({df:.1f} df)", df


def between_from_aa(log_ratios: Sequence[float], blocks: Sequence[Block]) -> BetweenStarts | None:
    """The start variance τ² from the A/A arm's rounds: its true ratio is 1, so each block mean ``b`` has
    ``E[b²] = 2τ² + σ²/n``; ``τ̂² = mean(b²) / 2`` keeps the ``σ²/n`` part (errs wide)."""
    import numpy as np

    ys = [(y, b) for y, b in zip(log_ratios, blocks, strict=True) if math.isfinite(y)]
    if not ys:
        return None
    groups = _by_block([y for y, _ in ys], [b for _, b in ys])
    return BetweenStarts(tau2=float(np.mean([np.mean(g) ** 2 for g in groups.values()])) / 2, blocks=len(groups))


def decide(log_ratios: Sequence[float], rule: SequentialRule = SequentialRule(),
           blocks: Sequence[Block] | None = None, between: BetweenStarts | None = None,
           more_starts: bool = False, complete: Collection[Block] | None = None) -> Decision:
    """The verdict on the rounds so far (see the module docstring for the rules).

    *blocks* names each round's (mode start, default start) (None: one start each); *between* is the A/A
    arm's start variance; *more_starts* says the race's rounds as a whole have two starts of each side,
    so that one-start looks must not settle "better" or "equivalent"; *complete* the blocks whose rounds are
    all in (None: every block), the only ones an interval over start blocks is taken on. The rounds so far
    are look ``n - min_rounds + 1`` of the per-round interval, the complete blocks look ``K - K₀ + 1`` of the
    interval over blocks, each at that look's confidence (:func:`look_confidence`) when the rule spends.
    """
    bs = list(blocks) if blocks is not None else [ONE_BLOCK] * len(log_ratios)
    pairs = [(float(y), b) for y, b in zip(log_ratios, bs, strict=True) if math.isfinite(y)]
    ys, bs = [y for y, _ in pairs], [b for _, b in pairs]
    n = len(ys)
    starts, k = starts_of(bs), len(set(bs))
    if n == 0:
        return Decision("undecided", 0, None, None, None, "no paired round yet", 0, 0)
    if n < max(rule.min_rounds, 2):
        return Decision("undecided", n, math.exp(sum(ys) / n), None, None,
                        f"{n} of the {rule.min_rounds} rounds needed before a verdict", starts, k)
    need = max(rule.min_starts, 2 if more_starts else 1)
    iv = _over_blocks(ys, bs, rule, between, complete) if starts >= 2 else None
    if iv is not None:
        mean, lo, hi, how, df, level = iv
        allow, note = True, ""
        pct = f"{rule.confidence:.0%} ({how})"
    else:
        level = _at_look(rule, max(1, n - max(rule.min_rounds, 2) + 1)).confidence
        mean, lo, hi = interval(ys, level)
        df = float(n - 1)
        pct = f"{rule.confidence:.0%}"
        allow = starts >= need and starts < 2
        note = (f"needs more starts: {k} start blocks and no A/A arm to measure the start effect" if starts >= 2
                else f"needs {need} engine starts of the mode and of the default before better or equivalent "
                     f"({starts} so far)")
    up, down = math.log1p(rule.delta), math.log1p(-rule.delta)
    ratio, rlo, rhi = math.exp(mean), math.exp(lo), math.exp(hi)

    def at(verdict: Verdict, why: str, reads: Verdict | None = None) -> Decision:
        return Decision(verdict, n, ratio, rlo, rhi, why, starts, k, reads=reads, over_starts=iv is not None,
                        level=level, df=df)

    # without an interval over starts the start may be all of it, so "worse" must clear the start margin
    # even where one start per arm was asked for: an A/A arm (FULL, which vLLM ran as the default on
    # FlashInfer; H200, 2026-12-02) read TTFT 1.228x [1.05-1.43] from one start each
    worse_at = up if iv is not None else up + rule.start_margin
    if lo > worse_at:
        extra = "" if allow else f" and the start margin ({math.exp(worse_at):.3f}, {k} start blocks)"
        return at("worse", f"{pct} interval above 1+δ ({1 + rule.delta:.3f}){extra}")
    settled = None
    if hi < down:
        settled = at("better", f"{pct} interval below 1-δ ({1 - rule.delta:.3f})")
    elif -up <= lo and hi <= up:
        settled = at("equivalent", f"{pct} interval inside [1/(1+δ), 1+δ] (TOST)")
    if settled is not None:
        return settled if allow else at("undecided", f"{note}; one start reads {settled.verdict}",
                                        reads=settled.verdict)
    why = _open_reason(lo, hi, up, down)
    if lo > up:  # past 1+δ, short of the start margin
        why = (f"interval above 1+δ but not past the start margin ({math.exp(worse_at):.3f}): without an "
               "interval over starts, one engine start may be all of it")
    return at("undecided", why if allow else f"{why}; {note}")


def _over_blocks(ys: Sequence[float], bs: Sequence[Block], rule: SequentialRule, between: BetweenStarts | None,
                 complete: Collection[Block] | None) -> tuple[float, float, float, str, float, float] | None:
    """The interval over the complete start blocks at their look's confidence: (mean, lower, upper, how,
    degrees of freedom, confidence), or None while they give none."""
    kept = [(y, b) for y, b in zip(ys, bs, strict=True) if complete is None or b in complete]
    if not kept or starts_of([b for _, b in kept]) < 2:
        return None
    first = 2 if between is not None and between.blocks >= 1 else 3
    level = _at_look(rule, max(1, len({b for _, b in kept}) - first + 1)).confidence
    iv = block_interval([y for y, _ in kept], [b for _, b in kept], level, between)
    return None if iv is None else (*iv, level)


def look_confidence(confidence: float, look: int) -> float:
    """The confidence of look *look* (1, 2, ...) when ``1 - confidence`` is spent over every look a race may
    take: look ``j`` spends ``α · 6 / (π² j²)``, and these sum to ``α`` over any number of looks, so by the
    union bound a race that looks after every round and stops at its first crossing says "better" (or
    "worse", "equivalent") of a mode that is not with probability at most ``α``, as the verdict states.
    The first look runs at 96.96% for a 95% rule, the fifth at 99.88%."""
    alpha = (1 - confidence) * 6 / (math.pi**2 * look**2)
    return 1 - alpha


def _at_look(rule: SequentialRule, look: int) -> SequentialRule:
    return dataclasses.replace(rule, confidence=look_confidence(rule.confidence, look)) if rule.spend else rule


def sequential_decision(log_ratios: Sequence[float], rule: SequentialRule = SequentialRule(),
                        blocks: Sequence[Block] | None = None, between: BetweenStarts | None = None,
                        open_blocks: Collection[Block] = frozenset()) -> Decision:
    """The verdict at the first round whose interval crossed a boundary, else the open one over all rounds.

    A race looks after every round and acts on the first crossing (it stops the engine once every metric
    has one), so a verdict, once reached, stands: rounds measured later for another metric's sake do not
    reopen it. Replaying the rounds in order gives the same answer from the dataset: a look that saw one
    start of each side settles "better" or "equivalent" only when the rounds as a whole have no second
    start either (the race was run with ``--starts 1``, or stopped before it restarted anything).
    *open_blocks*: blocks whose engines still run (a live race's), left out of the interval over blocks.
    """
    bs = list(blocks) if blocks is not None else [ONE_BLOCK] * len(log_ratios)
    pairs = [(float(y), b) for y, b in zip(log_ratios, bs, strict=True) if math.isfinite(y)]
    ys, bs = [y for y, _ in pairs], [b for _, b in pairs]
    more = starts_of(bs) >= 2
    last = {b: i for i, b in enumerate(bs)}

    def complete(n: int) -> set[Block]:  # blocks whose every round is among the first n and that stopped
        return {b for b, i in last.items() if i < n and b not in open_blocks}

    for n in range(max(rule.min_rounds, 2), len(ys) + 1):
        d = decide(ys[:n], rule, bs[:n], between, more, complete(n))
        if d.decided:
            return _held(d, decide(ys, rule, bs, between, more, complete(len(ys)))) if n < len(ys) else d
    return decide(ys, rule, bs, between, more, complete(len(ys)))


def _held(settled: Decision, now: Decision) -> Decision:
    """*settled* with what every round reads where that differs. Why: the 8B's 2 req/s capture list settled
    "equivalent" at round 4 over three start blocks (1.007x [0.987-1.028], when blocks were looked at before
    they were complete); a burst in round 10 read 1.58x,
    and all 16 rounds read 1.038x [0.893-1.207] (H200, 2026-12-04). A look that stopped early is a verdict
    on the rounds it saw; the later ones say whether the traffic it saw was typical."""
    if now.verdict == settled.verdict or now.ratio is None:
        return settled
    ci = f" [{now.lo:.3f}, {now.hi:.3f}]" if now.lo is not None and now.hi is not None else ""
    over = f" over {now.blocks} start blocks" if now.over_starts else ""
    return dataclasses.replace(settled, since=f"all {now.n} rounds read {now.verdict}: {now.ratio:.3f}×{ci}{over}")


def needed_to_decide(d: Decision, rule: SequentialRule = SequentialRule(), limit: int = 10_000) -> str | None:
    """How many rounds (or start blocks) in all would settle an open verdict at its present noise, if the
    estimate held: the interval's half-width gives the sd per unit (``h · sqrt(m) / t``), and the count is
    the smallest ``N`` with ``t_{N-1} · sd / sqrt(N)`` inside the distance from the estimate to the
    boundary it is nearest to crossing ("equivalent" inside ``±ln(1+δ)``, "worse" past ``ln(1+δ)``,
    "better" past ``ln(1-δ)``). Planning arithmetic, not a power calculation: the estimate itself moves.
    None for decided verdicts and verdicts without an interval. Why: open capture-list races on the H200
    needed this worked out by hand (the 1B: ~70 rounds at 2 req/s; the 8B: 1-2)."""
    if d.decided or d.ratio is None or d.lo is None or d.hi is None or d.ratio <= 0 or d.lo <= 0:
        return None
    over_blocks = d.over_starts
    m = d.blocks if over_blocks else d.n
    if m < 2:
        return None
    # the interval's own confidence: a spent look's is far above the rule's, and reading its width at the
    # rule's made three consistent H100 start blocks look like an sd of 1.9 per block; and its own degrees of
    # freedom (the A/A model's come mostly from the rounds, not from the blocks), which grow with the units
    q = (1 + (d.level if d.level is not None else rule.confidence)) / 2
    df = d.df if d.df is not None else float(m - 1)
    theta, half = math.log(d.ratio), (math.log(d.hi) - math.log(d.lo)) / 2
    sd = half * math.sqrt(m) / _t_ppf(q, df)
    up, down = math.log1p(rule.delta), math.log1p(-rule.delta)
    if abs(theta) < up:
        target, gap = "equivalent", up - abs(theta)
    elif theta > up:
        target, gap = "worse", theta - up
    elif theta < down:
        target, gap = "better", down - theta
    else:
        return None  # between 1/(1+δ) and 1-δ: neither boundary is in reach from here
    unit = "start blocks" if over_blocks else "rounds"
    n = max(m, 2)
    while n <= limit and _t_ppf(q, max(n - 1, df * n / m)) * sd / math.sqrt(n) > gap:
        n = max(n + 1, int(n * 1.1))
    noise = f"at this noise (sd {sd:.3f} of ln ratio per {unit[:-1]})"
    if n > limit:
        return f"{noise} not even {limit:,} {unit} would read {target}"
    return f"{noise} about {n} {unit} in all would read {target} if the estimate {d.ratio:.3f}x held"


def _open_reason(lo: float, hi: float, up: float, down: float) -> str:
    if lo < down and hi > up:
        return "interval spans both margins: too noisy so far"
    if hi > up:
        return "interval straddles 1+δ: may be worse"
    if lo < down:
        return "interval straddles 1-δ: may be better"
    return "interval reaches past 1/(1+δ)"  # inside (1-δ, 1+δ) but not inside the log-symmetric band
