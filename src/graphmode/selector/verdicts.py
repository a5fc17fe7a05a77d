"""Race verdicts for the selector: each mode against vLLM's default, from rows that carry race rounds.

Rows of :mod:`graphmode.profiling.race` are grouped by model shape; every (race, round) of a shape is one
paired round, and the sequential rule of :mod:`graphmode.profiling.sequential` (δ and confidence from
the settings' race group) gives, per (shape, mode, metric):

* a *pooled* verdict over every round (the race design averaged), and
* a verdict per workload (*region*), with the features the default's engine observed on that workload,
  so a request can be matched to the nearest raced workload.

:func:`race_decision` turns them into a recommendation for one objective (the Recommender's hook):

* a mode **better** by more than δ is recommended (the best ratio among the better ones that meet the
  objective's constraints), with its rounds, ratio and interval;
* otherwise the default, listing the **equivalent** modes with what each saves against it (graph GiB,
  start-up s); an objective that charges memory or start-up may take one of those (the ranking's order
  among the default and its equivalents decides);
* a **worse** mode is never recommended for that metric; an undecided one neither (no evidence).

An open pooled verdict gives way to the nearest raced workload's decided one; no race rows, no decision.

Every round carries its block (the mode's engine start, the default's: ``race_start_id`` within its race),
so with two starts or more of each the statistics take blocks, not rounds, as the unit of replication
(:mod:`graphmode.profiling.sequential`), and ``RaceVerdict.starts`` is the number of distinct starts behind
the verdict's rounds, the fewer of the mode's and the default's.

One engine start per arm is not enough for "better". Pairing inside a round cancels the host's drift but
not the engine start: the A/A arm of the first H200 races (two starts of the default, 2026-12-01) put one
start at 0.90× the other on the Qwen2.5-0.5B shape's ITL (95% interval 0.82–0.99, 12 rounds). So a
"better" verdict whose rounds saw a single start of the mode or of the default is acted on only when an
independent comparison agrees: a paired campaign verdict (:mod:`graphmode.selector.paired`, other starts on
other hosts) on the same side, or the other races of the model (:func:`across_races`). Otherwise the answer
keeps the default and says why. "Worse" needs no such guard: it only keeps a mode out.

Across races (:mod:`graphmode.selector.across`): each race starts its own engines, so the all-rounds ratios
of one mode over the *other* races of a model are independent draws of "mode against default, start effect
included"; a one-start "better", or a pooled verdict whose every round together reads better, is acted on
when their t interval is better by δ too (at least :data:`MIN_OTHER_RACES` of them).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from graphmode.core.deployment import api_servers
from graphmode.core.modes import DEFAULT_MODE
from graphmode.profiling.race_rounds import (
    CONTROL_ARM,
    DEFAULT_ARM,
    RACE_METRICS,
    RoundTable,
    arm_verdicts,
    jit_tainted,
)
from graphmode.profiling.race_sizes import is_sizes_row
from graphmode.profiling.sequential import Decision, SequentialRule
from graphmode.selector.across import (
    MIN_OTHER_RACES,
    AcrossRaces,
    VerdictKind,
    across_aa_arms,
    across_races,
)
from graphmode.selector.featurize import shape_key, shape_of_row
from graphmode.selector.region import (
    REGION_FEATURES,
    OutsideRegion,
    outside_region,
    pick_pool,
    pick_servers,
    pooled_disagrees,
    race_command,
    region_distances,
    region_span,
)

__all__ = ["MIN_OTHER_RACES", "REGION_FEATURES", "AcrossRaces", "OutsideRegion", "RaceAnswer", "RaceVerdict",
           "VerdictKind", "across_aa_arms", "across_races", "race_command", "race_decision", "race_verdicts"]



class RaceVerdict(BaseModel):
    """One arm against the default on one metric, for one model shape: pooled, or on one workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: str
    mode: str  # a mode, or CONTROL (the A/A arm)
    metric: str
    workload: str | None = Field(None, description="None: over every round; else that workload's rounds")
    verdict: VerdictKind
    rounds: int
    ratio: float | None = Field(None, description="geometric mean of mode / default over the rounds")
    lo: float | None = None
    hi: float | None = None
    delta: float
    confidence: float
    why: str = ""
    features: dict[str, float] = Field(default_factory=dict, description="region: the default's observed features")
    span: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="the measured region: per region feature, the lowest and highest the "
        "default's engine observed over the verdict's rounds (pooled: every workload's); with max_model_len, "
        "api_servers and the shape key's configuration (max_num_seqs, backend, ...) it says where it holds")
    starts: int = Field(1, ge=1, description="engine starts behind the verdict's rounds (the fewer of mode and "
                                               "default)")
    runs_as: str | None = Field(None, description="the mode vLLM ran for this arm when it is not the one asked "
                                                  "for (a silent downgrade): the verdict is about that mode")
    ratio_all: float | None = Field(None, description="geometric mean of mode / default over every round, also "
                                                      "those after the verdict's first crossing")
    rounds_all: int | None = Field(None, description="the rounds behind ratio_all")
    lo_all: float | None = Field(None, description="the confidence interval of ratio_all over every round (t over "
                                                   "the rounds; one engine start each: mode plus starts)")
    hi_all: float | None = None
    reads: VerdictKind | None = Field(None, description="an undecided verdict held back only by its engine "
                                                        "starts (two start blocks, no A/A arm): what its "
                                                        "interval over the rounds reads")
    max_model_len: int | None = Field(None, description="--max-model-len of the race's engines (None: the "
                                                         "model's own): races at other lengths pool apart")
    api_servers: int | None = Field(None, description="--api-server-count of the race's engines when more "
                                                       "than one: races with one and with several pool apart")

    def cell(self) -> str:
        """A table cell: ``better 0.768× [0.62–0.95] n=8 s=1`` (rounds n, engine starts s)."""
        ran = f" (ran as {self.runs_as})" if self.runs_as else ""
        if self.ratio is None:
            return f"{self.verdict} (n={self.rounds}){ran}"
        ci = f" [{self.lo:.2f}–{self.hi:.2f}]" if self.lo is not None and self.hi is not None else ""
        # the verdict stays open for want of a measured start effect, not of rounds: say what the rounds read
        held = f" (reads {self.reads}; start effect unmeasured)" if self.reads else ""
        return f"{self.verdict} {self.ratio:.3f}×{ci} n={self.rounds} s={self.starts}{held}{ran}"

    @property
    def pool(self) -> tuple[str, int | None, int | None]:
        """The rounds a pooled verdict averages: one shape and configuration at one max_model_len and one
        number of API servers."""
        return self.shape, self.max_model_len, self.api_servers

    def describe(self) -> str:
        where = f" on {self.workload}" if self.workload else ""
        if self.workload is None and self.max_model_len is not None:
            where = f" at max_model_len={self.max_model_len}"
        if self.workload is None and self.api_servers:
            where += f" with {self.api_servers} API servers"
        if self.ratio is None:
            return f"{self.mode} {self.verdict} on {self.metric}{where} ({self.why})"
        # the effect size is over every round of the race: a sequential rule stops on rounds that ran extreme
        n_all = self.rounds_all or self.rounds
        if self.ratio_all is not None and self.lo_all is not None and self.hi_all is not None:
            size = (f"{self.ratio_all:.3f}× the default's{where} over all {n_all} paired rounds, "
                    f"{self.confidence:.0%} interval {self.lo_all:.3f}–{self.hi_all:.3f}")
        elif self.ratio_all is not None:  # a card trained before the interval over all rounds was stored
            size = f"{self.ratio_all:.3f}× the default's{where} over all {n_all} paired rounds (no interval stored)"
        else:
            ci = f", {self.confidence:.0%} interval {self.lo:.3f}–{self.hi:.3f}" if self.lo is not None else ""
            size = f"{self.ratio:.3f}× the default's{where} over {self.rounds} paired rounds{ci}"
        when = f" at round {self.rounds}" if self.verdict != "undecided" and n_all != self.rounds else ""
        one = ", one engine start each" if self.starts < 2 else ""
        return f"{self.mode}'s {self.metric} is {size}: {self.verdict}{when} (δ {self.delta:g}{one})"


# The rule the selector's verdicts take: the race's δ and confidence, with the confidence spent over the looks
# (graphmode.profiling.sequential.look_confidence), so a "better" has its stated error rate however many rounds
# the race looked at.
SPENDING_RULE = SequentialRule(spend=True)


def race_verdicts(rows: Iterable[Mapping[str, Any]], rule: SequentialRule = SequentialRule(),
                  metrics: Sequence[str] = RACE_METRICS) -> list[RaceVerdict]:
    """Pooled and per-workload verdicts per (shape, max_model_len, API servers, arm, metric) of every raced
    shape in *rows*.

    Races of one shape at another ``--max-model-len`` pool apart: a long-context race runs prompts the
    others cannot (8-16K tokens on the 1B at 17408), where a mode's effect differs (FULL's TTFT win on short
    prompts vanished there, H200 2026-12-03), and averaging the two regions would decide neither. So do races
    with one API server and with several: at 1024 streams on the 1B one API server at a full core set the pace,
    with four the engine core did, and pooled as three starts of one configuration the three such races read
    FULL_DECODE_ONLY "better" 0.915x [0.886-0.945] on ITL though each alone was open (H200, 2026-12-03)."""
    by_shape: dict[tuple[str, int | None, int | None], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        # a capture-size arm (profiling/race_sizes.py) measured a list, not a mode: no mode verdict of it
        if r.get("status") == "ok" and r.get("race_round") is not None and r.get("race_arm") \
                and not is_sizes_row(r):
            shape_row = shape_of_row(r)
            length = shape_row.get("max_model_len")
            by_shape[(shape_key(shape_row), length if isinstance(length, int) else None,
                      api_servers(shape_row))].append(r)
    out: list[RaceVerdict] = []
    for (shape, length, servers), shape_rows in sorted(by_shape.items(),
                                                       key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2] or 1)):
        # one numbering for the rounds of every race of this shape: (race, round) is the pairing unit
        index = {k: i for i, k in enumerate(sorted({(str(r.get("race_id")), int(r["race_round"]))
                                                     for r in shape_rows}))}
        table = RoundTable()
        feats: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        ran: dict[str, set[str]] = defaultdict(set)
        for r in shape_rows:
            arm = str(r["race_arm"])
            ran[arm].add(str(r.get("effective_mode") or r.get("race_requested_mode") or r.get("mode") or arm))
            # a start is (race, start id): rows without a start id count as one start per race
            table.add(arm, index[(str(r.get("race_id")), int(r["race_round"]))], str(r["workload"]),
                      {m: r.get(m) for m in metrics}, start=f"{r.get('race_id')}/{r.get('race_start_id') or ''}",
                      excluded=jit_tainted(r))
            if arm == DEFAULT_ARM:
                for f in REGION_FEATURES:
                    v = r.get("obs_" + f)
                    if isinstance(v, int | float) and math.isfinite(v) and v > 0:
                        feats[str(r["workload"])][f].append(float(v))
        centre = _centre({f: float(sum(xs) / len(xs)) for f, xs in by_f.items() if xs} for by_f in feats.values())
        spans = {w: {f: (min(xs), max(xs)) for f, xs in by_f.items() if xs} for w, by_f in feats.items()}
        pool_span = {f: (min(sp[f][0] for sp in spans.values() if f in sp),
                         max(sp[f][1] for sp in spans.values() if f in sp))
                     for f in {f for sp in spans.values() for f in sp}}
        for arm in table.arms():
            if arm == DEFAULT_ARM:
                continue
            v = arm_verdicts(table, arm, metrics, rule)
            # every start of the arm ran one other mode than its name (CONTROL is named for no mode)
            runs_as = next(iter(ran[arm])) if arm != CONTROL_ARM and len(ran[arm]) == 1 \
                and next(iter(ran[arm])) != arm else None
            for metric, d in v.pooled.items():
                out.append(_verdict(shape, arm, metric, None, d, rule, centre, runs_as,
                                    _all_rounds(table.blocked(arm, metric)[0], rule.confidence), length, servers,
                                    pool_span))
            for (metric, workload), d in sorted(v.by_workload.items()):
                if d.n:
                    region = {f: float(sum(xs) / len(xs)) for f, xs in feats[workload].items() if xs}
                    out.append(_verdict(shape, arm, metric, workload, d, rule, region, runs_as,
                                        _all_rounds(table.blocked(arm, metric, workload)[0], rule.confidence), length,
                                        servers, spans.get(workload, {})))
    return out


def _centre(regions: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Where a pool of workloads sits: per feature, the geometric mean over its workloads (distances are in
    log space, :func:`graphmode.selector.region.log_distance`)."""
    logs: dict[str, list[float]] = defaultdict(list)
    for region in regions:
        for f, x in region.items():
            if x > 0:
                logs[f].append(math.log(x))
    return {f: math.exp(sum(ys) / len(ys)) for f, ys in logs.items() if ys}


def _all_rounds(log_ratios: Sequence[float], confidence: float = 0.95) -> AllRounds:
    """The geometric mean ratio over every round, their number and the t interval over them: a verdict's own
    ratio stops at its first crossing, which a sequential rule reaches sooner on rounds that ran extreme."""
    from graphmode.profiling.sequential import interval

    ys = [y for y in log_ratios if math.isfinite(y)]
    if len(ys) < 2:
        return (math.exp(ys[0]) if ys else None), len(ys), None, None
    mean, lo, hi = interval(ys, confidence)
    return math.exp(mean), len(ys), math.exp(lo), math.exp(hi)


AllRounds = tuple[float | None, int, float | None, float | None]


def _verdict(shape: str, arm: str, metric: str, workload: str | None, d: Decision, rule: SequentialRule,
             features: dict[str, float], runs_as: str | None = None,
             all_rounds: AllRounds = (None, 0, None, None), max_model_len: int | None = None,
             servers: int | None = None, span: dict[str, tuple[float, float]] | None = None) -> RaceVerdict:
    # starts behind the verdict: the rounds up to its first crossing (the fewer of the mode's and the default's)
    return RaceVerdict(shape=shape, mode=arm, metric=metric, workload=workload, verdict=d.verdict, rounds=d.n,
                       ratio=d.ratio, lo=d.lo, hi=d.hi, delta=rule.delta, confidence=rule.confidence, why=d.why,
                       features=features, starts=max(1, d.starts), runs_as=runs_as, ratio_all=all_rounds[0],
                       rounds_all=all_rounds[1] or None, lo_all=all_rounds[2], hi_all=all_rounds[3],
                       reads=d.reads, max_model_len=max_model_len, span=span or {},
                       api_servers=servers)


class EquivalentMode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: str
    ratio: float | None
    interval: tuple[float, float] | None
    rounds: int
    saves_graph_gib: float | None = Field(None, description="default's graph memory minus this mode's")
    saves_startup_s: float | None = Field(None, description="default's start-up minus this mode's")


class RaceAnswer(BaseModel):
    """What the race verdicts decided for one objective (Recommendation.race)."""

    model_config = ConfigDict(extra="forbid")

    mode: str = Field(description="the mode the verdicts choose")
    basis: Literal["better", "equivalent", "default", "outside"] = Field(
        description="better: a mode beat the default by more than δ; equivalent: an equivalent mode taken for "
                    "the objective's memory/start-up weights; default: nothing beat the default; outside: the "
                    "request lies outside every raced region of this shape, so vLLM's default")
    outside: list[OutsideRegion] = Field(default_factory=list, description="the dimensions of the request outside "
                                                                           "the nearest raced region (basis outside)")
    command: str | None = Field(None, description="basis outside: the graphmode profile --race command (grid "
                                                  "included) that would measure the request's region")
    metric: str
    region: str | None = Field(None, description="the raced workload whose verdicts applied, if not the pooled ones")
    verdict: RaceVerdict | None = Field(None, description="the chosen mode's verdict (rounds, ratio, interval)")
    equivalent: list[EquivalentMode] = Field(default_factory=list)
    worse: list[str] = Field(default_factory=list, description="never recommended for this metric")
    undecided: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def race_decision(
    verdicts: Sequence[RaceVerdict],
    shape: str,
    metric: str,
    features: Mapping[str, Any],
    order: Sequence[str],
    constants: Mapping[str, Mapping[str, float | None]],
    *,
    weighted: bool,
    allowed: Iterable[str] | None = None,
    default_mode: str = DEFAULT_MODE.value,
    corroborated: Iterable[str] = (),
    max_model_len: int | None = None,
    api_server_count: int | None = None,
    memo: dict[tuple[Any, ...], Any] | None = None,
) -> RaceAnswer | None:
    """The race's answer for (*shape*, *metric*) and a request's *features*; None without race verdicts.

    *order* is the regressors' ranking (best first) under the objective, *constants* the predicted
    ``graph_gib``/``startup_s`` per mode, *weighted* whether the objective charges memory or start-up, and
    *allowed* the modes that meet the objective's constraints (None: all), and *corroborated* the modes
    that an independent paired comparison (other engine starts) puts on the better side of the default
    for this shape and metric: a "better" verdict from one start per arm needs that, or the other races in
    *verdicts* better by δ too (:func:`across_races`), to be acted on. So does an undecided verdict that only
    its starts hold back (``reads == "better"``: two start blocks and no A/A arm to measure between them).
    Where the shape was raced at several ``--max-model-len`` (pools), the pool whose workloads sit nearest
    the request's *features* answers, else the one at the deployment's *max_model_len*, else the largest.
    Races with another number of API servers (*api_server_count*) are left out first, unless the
    deployment's count was never raced (then the nearest count answers). *memo* keeps the across-races
    intervals, each shape's verdicts and its pools' spans between calls on the same *verdicts* (a recommender
    answers many requests from one card).
    """
    cache = memo if memo is not None else {}
    if ("mine", shape, metric) not in cache:  # what depends only on the card is looked up once per memo
        cache[("mine", shape, metric)] = [v for v in verdicts if v.shape == shape and v.metric == metric
                                          and v.mode != CONTROL_ARM]
    mine = cache[("mine", shape, metric)]
    notes: list[str] = []

    def across(mode: str, delta: float, confidence: float) -> AcrossRaces | None:
        key = (mode, metric, shape, delta, confidence)
        if key not in cache:
            cache[key] = across_races(verdicts, mode, metric, exclude_shape=shape, delta=delta, confidence=confidence)
        found: AcrossRaces | None = cache[key]
        return found

    if not mine and any(v.metric == metric and v.workload is None for v in verdicts):
        # the model races this metric, but never this shape and configuration: no raced region holds the request
        cmd = race_command(features)
        notes.append(f"outside every raced region: this model shape and configuration ({shape or 'unknown'}) was "
                     f"never raced on {metric}, so vLLM's default ({default_mode}) stands; to measure it: {cmd}")
        return RaceAnswer(mode=default_mode, basis="outside", metric=metric, command=cmd, notes=notes)
    servers = pick_servers(mine, api_server_count, notes)
    mine = [v for v in mine if v.api_servers == servers]
    if ("spans", shape, metric, servers) not in cache:
        cache[("spans", shape, metric, servers)] = {
            n: region_span(v for v in mine if v.max_model_len == n) for n in {v.max_model_len for v in mine}}
    holding, outside = _holding_pools(cache[("spans", shape, metric, servers)], features, metric, default_mode,
                                      notes)
    if outside is not None:
        return outside
    length = pick_pool(mine, features, max_model_len, notes)
    if holding and length not in holding:  # the nearest centre's region does not reach the request; another does
        length = min(holding, key=lambda n: n or 0)
        notes.append(f"race: the races at max_model_len={length} answer: their raced region holds the request")
    mine = [v for v in mine if v.max_model_len == length]
    # an arm vLLM ran as another mode measured that mode: it is neither evidence for nor a candidate of its name
    downgraded = sorted({(v.mode, v.runs_as) for v in mine if v.runs_as})
    if downgraded:
        notes.append("race: " + "; ".join(f"{m} ran as {r} on this deployment (vLLM downgraded it), so its rounds "
                                          f"say nothing about {m}" for m, r in downgraded))
        mine = [v for v in mine if not v.runs_as]
    pooled = {v.mode: v for v in mine if v.workload is None}
    if not pooled:
        return None
    ok = set(allowed) if allowed is not None else None
    chosen: dict[str, RaceVerdict] = dict(pooled)
    regions = [v for v in mine if v.workload is not None and v.features]
    dists = region_distances(regions, features)
    region = _open_pooled(pooled, regions, dists, chosen, notes)
    region = pooled_disagrees(pooled, regions, dists, chosen, notes) or region
    if not any(v.workload == region for v in chosen.values()):
        region = None
    def aa() -> RaceVerdict | None:  # the shape's A/A arm, looked up only for a note that needs it
        return next((a for a in verdicts if a.metric == metric and a.workload is None and a.ratio is not None
                     and (a.mode == CONTROL_ARM or a.runs_as == default_mode) and a.pool == (shape, length, servers)),
                    None)

    better, support, held = _acted_on(chosen, ok, set(corroborated), across, aa, notes)
    worse = sorted(m for m, v in chosen.items() if v.verdict == "worse")
    acted = held | {v.mode for v in better}
    undecided = sorted(m for m, v in chosen.items() if v.verdict == "undecided" and m not in acted)
    notes += _likely_to_settle([chosen[m] for m in undecided], ok, across)
    equivalent = _equivalents(chosen, constants, default_mode)
    return _conclude(chosen, better, support, held, equivalent, worse, undecided, region, metric, order, ok,
                     weighted, default_mode, notes)


def _conclude(chosen: Mapping[str, RaceVerdict], better: Sequence[RaceVerdict], support: Mapping[str, AcrossRaces],
              held: set[str], equivalent: list[EquivalentMode], worse: list[str], undecided: list[str],
              region: str | None, metric: str, order: Sequence[str], ok: set[str] | None, weighted: bool,
              default_mode: str, notes: list[str]) -> RaceAnswer:
    """The race's answer: the best acted-on "better" mode, else the default (or, for an objective that charges
    memory or start-up, an equivalent mode the ranking prefers), with the notes that say why."""
    if worse:
        notes.append(f"race: never recommended for {metric} (worse than the default by more than δ): "
                     + ", ".join(worse))
    if equivalent:
        notes.append(f"race: equivalent to the default on {metric}: " + "; ".join(
            e.mode + _savings(e.saves_graph_gib, e.saves_startup_s) for e in equivalent))
    if better:
        first = support.get(better[0].mode)
        each = (f"{better[0].starts} engine starts each read better together, but no A/A arm measured the start "
                "effect" if better[0].mode in held else "one engine start each")
        agree = (f"; {each}, and the other races agree: {first.describe()}" if first is not None
                 else f"; {each}, and the paired campaign rounds (other starts, other hosts) agree"
                 if better[0].starts < 2 or better[0].mode in held else f"; {better[0].starts} engine starts each")
        notes.append("race: " + better[0].describe() + agree)
        return RaceAnswer(mode=better[0].mode, basis="better", metric=metric, region=region, verdict=better[0],
                          equivalent=equivalent, worse=worse, undecided=undecided, notes=notes)
    mode = default_mode
    basis: Literal["better", "equivalent", "default"] = "default"
    if weighted:
        eligible = {default_mode} | {e.mode for e in equivalent if ok is None or e.mode in ok}
        pick = next((m for m in order if m in eligible), default_mode)
        if pick != default_mode:
            mode, basis = pick, "equivalent"
            notes.append(f"{pick} is equivalent to the default on {metric} and the objective's memory/start-up "
                         f"weights favour it")
    return RaceAnswer(mode=mode, basis=basis, metric=metric, region=region,
                      verdict=chosen.get(mode), equivalent=equivalent, worse=worse, undecided=undecided,
                      notes=notes)


def _acted_on(chosen: Mapping[str, RaceVerdict], ok: set[str] | None, backed: set[str],
              across: Callable[[str, float, float], AcrossRaces | None],
              control: Callable[[], RaceVerdict | None],
              notes: list[str]) -> tuple[list[RaceVerdict], dict[str, AcrossRaces], set[str]]:
    """The "better" verdicts the selector may act on, best first: two starts or more of each side, or one
    start that an independent comparison (*backed*: paired campaign rounds; *across*: the other races) agrees
    with; the other races' intervals that did; and the modes held only by their starts. A one-start "better"
    that nothing corroborates is noted (with the shape's A/A arm, *control*, if any) and not acted on."""
    support: dict[str, AcrossRaces] = {}
    better = []
    held: set[str] = set()  # undecided only for want of a measured start effect, acted on like one start
    for v in sorted(chosen.values(), key=lambda v: (v.ratio or 1.0)):
        starts_only = v.verdict == "undecided" and v.reads == "better"
        # Open under the α-spending looks, but every round together reads better (its t interval below 1): not
        # enough alone, enough beside the other races' verdict, an independent sample of engine starts.
        rounds_only = v.verdict == "undecided" and not starts_only and v.hi_all is not None and v.hi_all < 1.0
        if (v.verdict != "better" and not starts_only and not rounds_only) or (ok is not None and v.mode not in ok):
            continue
        if (v.starts >= 2 and not starts_only and not rounds_only) or v.mode in backed:
            better.append(v)
            continue
        others = across(v.mode, v.delta, v.confidence)
        if others is not None and others.verdict == "better":
            better.append(v)
            support[v.mode] = others
            if starts_only:
                held.add(v.mode)
            continue
        if rounds_only:
            continue  # left to _likely_to_settle's note
        if starts_only:
            notes.append(f"race: {v.describe()}; over its {v.starts} engine starts of each side the interval reads "
                         "better, but no A/A arm measured the start effect and no other paired comparison "
                         "agrees: an A/A arm (--control) would decide it")
            continue
        aa = control()
        spread = f"; this shape's A/A arm put two starts of the default {aa.ratio:.2f}× apart" if aa else ""
        notes.append(f"race: {v.describe()}, but from one engine start each and no other paired comparison "
                     f"agrees{spread}: not acted on until a second start does")
    return better, support, held


def _likely_to_settle(undecided: Sequence[RaceVerdict], ok: set[str] | None,
                      across: Callable[[str, float, float], AcrossRaces | None]) -> list[str]:
    """Notes for the open verdicts that read better while the other races are better by δ: more rounds of
    this race would likely settle them."""
    out = []
    for v in undecided:
        if v.reads is not None:  # held back by its starts, not its rounds: said where it was held
            continue
        others = across(v.mode, v.delta, v.confidence)
        if others is not None and others.verdict == "better" and (v.ratio or 1.0) < 1.0 \
                and (ok is None or v.mode in ok):
            out.append(f"race: {v.describe()}, while {others.describe()}: more rounds of this race "
                       "(a larger --budget-min; the race resumes) would likely settle it")
    return out


def _holding_pools(spans: Mapping[int | None, Mapping[str, tuple[float, float]]], features: Mapping[str, Any],
                   metric: str, default_mode: str, notes: list[str]) -> tuple[list[int | None], RaceAnswer | None]:
    """The pools (max_model_len, with their *spans*) whose raced region holds the request and, when none does,
    the answer: vLLM's default with the dimensions outside the nearest pool's region and the command that
    would race it."""
    away = {n: outside_region(span, features) for n, span in spans.items()}
    holding = [n for n, out in away.items() if not out]
    if not away or holding:
        return holding, None
    nearest = min(away, key=lambda n: sum(math.log(o.factor) for o in away[n]))
    out = away[nearest]
    cmd = race_command(features, out)
    notes.append("outside every raced region of this shape and configuration: " + "; ".join(
        o.describe() for o in out) + f". vLLM's default ({default_mode}) stands; to measure this region: {cmd}")
    return holding, RaceAnswer(mode=default_mode, basis="outside", metric=metric, outside=out, command=cmd,
                               notes=notes)


def _open_pooled(pooled: Mapping[str, RaceVerdict], regions: Sequence[RaceVerdict],
                 dists: Mapping[str | None, float], chosen: dict[str, RaceVerdict], notes: list[str]) -> str | None:
    """Where a pooled verdict is open, the nearest raced workload (*dists*: the request's distance to each)'s
    decided verdict answers for that mode (*chosen* is updated); that workload's name, if any."""
    if not regions or not any(v.verdict == "undecided" for v in pooled.values()):
        return None
    if not dists:
        return None
    region = min(dists, key=lambda w: dists[w])
    for v in regions:
        if v.workload == region and pooled.get(v.mode) is not None and \
                pooled[v.mode].verdict == "undecided" and v.verdict != "undecided":
            chosen[v.mode] = v
            notes.append(f"pooled verdict open for {v.mode}; on the nearest raced workload: {v.describe()}")
    return region


def _equivalents(chosen: Mapping[str, RaceVerdict], constants: Mapping[str, Mapping[str, float | None]],
                 default_mode: str) -> list[EquivalentMode]:
    """The modes equivalent to the default, with what each saves against it."""
    base = constants.get(default_mode, {})
    out = []
    for m, v in sorted(chosen.items()):
        if v.verdict != "equivalent":
            continue
        mc = constants.get(m, {})
        out.append(EquivalentMode(
            mode=m, ratio=v.ratio, interval=(v.lo, v.hi) if v.lo is not None and v.hi is not None else None,
            rounds=v.rounds, saves_graph_gib=_saving(base.get("graph_gib"), mc.get("graph_gib")),
            saves_startup_s=_saving(base.get("startup_s"), mc.get("startup_s"))))
    return out


def _savings(gib: float | None, startup_s: float | None) -> str:
    """" (saves 0.2 GiB of graphs, 3 s of start-up)", only what is known (race rows, started side by side,
    measure neither)."""
    parts = [f"{v:g} {unit}" for v, unit in ((gib, "GiB of graphs"), (startup_s, "s of start-up")) if v is not None]
    return f" (saves {', '.join(parts)})" if parts else ""


def _saving(default: float | None, mine: float | None) -> float | None:
    if default is None or mine is None:
        return None
    return round(default - mine, 3)
