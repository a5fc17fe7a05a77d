#!/usr/bin/env python3
"""How many engine starts per arm (and rounds, and GPU-minutes) a race needs to settle a verdict, at a noise.

    .venv/bin/python bench/race_plan.py --tau 0.025 --sigma 0.08 --ratio 0.9,1.0 --starts 1,2,3,4,5,6
    .venv/bin/python bench/race_plan.py --from models/profiles/race-h200-vllm0.33-qwen2.5-0.5b.sqlite --mode FULL

It simulates races of one challenger against the default under the statistics' model
``y = ln(true ratio) + a_i − d_j + e`` (start effects ``a_i``, ``d_j`` with sd ``--tau``, round noise ``e`` with
sd ``--sigma``, all in log space) and decides them with the race's own code: the blocks come from the race's
restart-wave rule (:func:`graphmode.profiling.race.wave_due`: waves alternate, the default alone, then the
challenger; the first block has ``max(min_rounds, block_rounds)`` rounds, later ones ``block_rounds``), the rule
is the race's (``min_starts`` = the starts asked for) and every round is a look of
:func:`graphmode.profiling.sequential.decide`, walked as :func:`~graphmode.profiling.sequential.sequential_decision`
walks them, the first verdict standing. A race stops at its verdict, at ``--max-rounds`` or at ``--budget-min``
(0: none), and skips a wave the budget left cannot pay for, as the race does. The A/A arm's start variance
(``between_from_aa``) enters only a two-block interval, which a fresh race with ``--starts N`` never forms (one
start of a side keeps it on the per-round interval; two of each already give three blocks), so the simulated
races have no A/A arm; ``--from`` uses the dataset's A/A arm to estimate ``--tau``.

GPU-minutes: the first start wave, every restart wave (``--wave-s`` each: one side's warm start) and the
rounds (``--round-s`` each: one cell of the mode and one of the default).

``--from DATASET.sqlite`` estimates what it is not given: ``tau`` from the A/A (CONTROL) arm's blocks
(``between_from_aa``'s ``mean(b²)/2`` less its ``σ²/2n`` share), ``sigma`` from the within-block spread of the
``--mode`` and CONTROL arms' log ratios, ``round-s`` from the rounds' walls per engine (times two engines), and
``wave-s`` from the engines' recorded start-up times (restarts where the race made any).
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

import numpy as np

BENCH = Path(__file__).resolve().parent
try:
    import graphmode  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(BENCH.parent / "src"))

from graphmode.core.dataset import ProfileStore  # noqa: E402
from graphmode.profiling.race import wave_due  # noqa: E402
from graphmode.profiling.race_rounds import CONTROL_ARM, KNOWN_RACE_METRICS, table_from_rows  # noqa: E402
from graphmode.profiling.sequential import (  # noqa: E402
    Block,
    Decision,
    SequentialRule,
    between_from_aa,
    decide,
    starts_of,
)

VERDICTS = ("better", "equivalent", "worse", "undecided")


class PlanError(ValueError):
    """Bad input: printed as one line, exit status 2."""


@dataclass(frozen=True)
class Noise:
    tau: float  # sd of one engine start's effect on ln latency
    sigma: float  # sd of one round's ln ratio within a block
    round_s: float  # GPU seconds per round (a cell of the mode and one of the default)
    wave_s: float  # GPU seconds per start wave (one side's warm start)


@dataclass(frozen=True)
class RaceOutcome:
    decision: Decision
    rounds: int
    waves: int  # restart waves made
    gpu_s: float


@dataclass(frozen=True)
class Cell:
    ratio: float
    starts: int  # starts per arm: restarted in waves, or resident at once (``replicas``)
    share: dict[str, float]  # verdict -> share of races
    median_rounds: float | None  # over the decided races
    gpu_min: float  # mean over all races
    wrong: float  # share of races whose verdict claims what the true ratio is not
    replicas: bool = False  # the starts are resident replicas (``--replicas``), not restarts

    @property
    def design(self) -> str:
        return f"{self.starts} resident" if self.replicas else str(self.starts)

    @property
    def decided(self) -> float:
        return 1.0 - self.share["undecided"]


def simulate_race(theta: float, a: Sequence[float], d: Sequence[float], e: Sequence[float], starts: int,
                  rule: SequentialRule, noise: Noise, block_rounds: int, max_rounds: int,
                  budget_s: float) -> RaceOutcome:
    """One race of a challenger (start effects *a*) against the default (*d*), rounds' noise *e*."""
    ys: list[float] = []
    blocks: list[Block] = []
    mode_starts = default_starts = 1
    block_n = waves = 0
    closed = False
    spent = noise.wave_s  # the first start wave
    last = Decision("undecided", 0, None, None, None, "no round", 0, 0)
    while len(ys) < max_rounds and not (budget_s > 0 and spent >= budget_s):
        ys.append(theta + a[mode_starts - 1] - d[default_starts - 1] + e[len(ys)])
        blocks.append((f"A{mode_starts}", f"D{default_starts}"))
        block_n += 1
        spent += noise.round_s
        # the race replays sequential_decision after every round and stops the arm at its first verdict: the
        # same as deciding on the rounds so far at each look (``more``: as sequential_decision computes it)
        last = decide(ys, rule, blocks, None, starts_of(blocks) >= 2)
        if last.decided:
            break
        if closed or (budget_s > 0 and spent >= budget_s):
            continue
        due = wave_due(starts, block_rounds, rule.min_rounds, default_starts, [(mode_starts, block_n)])
        if due is None:
            continue
        if budget_s > 0 and budget_s - spent < noise.wave_s + block_rounds * noise.round_s:
            closed = True  # the race skips a wave it cannot pay for, and every later one
            continue
        if due == "default":
            default_starts += 1
        else:
            mode_starts += 1
        block_n = 0
        waves += 1
        spent += noise.wave_s
    return RaceOutcome(last, len(ys), waves, spent)


def simulate_replicas(theta: float, a: Sequence[float], d: Sequence[float], e: Sequence[float], replicas: int,
                      rule: SequentialRule, noise: Noise, max_rounds: int, budget_s: float) -> RaceOutcome:
    """One race with *replicas* engines per side resident from the start (``--replicas``): round k pairs
    replica k mod R of the mode with replica k mod R of the default, so the blocks are disjoint diagonal pairs.
    The one start wave brings up all 2R engines overlapped; it is charged ``noise.wave_s`` (what one overlapped
    wave of warm starts costs: the replicas of an arm start on a copied warm compile cache)."""
    ys: list[float] = []
    blocks: list[Block] = []
    spent = noise.wave_s
    last = Decision("undecided", 0, None, None, None, "no round", 0, 0)
    while len(ys) < max_rounds and not (budget_s > 0 and spent >= budget_s):
        r = len(ys) % replicas
        ys.append(theta + a[r] - d[r] + e[len(ys)])
        blocks.append((f"A{r + 1}", f"D{r + 1}"))
        spent += noise.round_s
        last = decide(ys, rule, blocks, None, starts_of(blocks) >= 2)
        if last.decided:
            break
    return RaceOutcome(last, len(ys), 0, spent)


def holds(verdict: str, ratio: float, delta: float) -> bool:
    """Whether *verdict* is true of the true *ratio*: "better" claims ratio < 1 − δ, "worse" ratio > 1 + δ,
    "equivalent" ratio inside [1/(1+δ), 1+δ]."""
    if verdict == "better":
        return ratio < 1 - delta
    if verdict == "worse":
        return ratio > 1 + delta
    return 1 / (1 + delta) <= ratio <= 1 + delta


def summarise(results: Sequence[RaceOutcome], ratio: float, n: int, delta: float, replicas: bool = False) -> Cell:
    """One table cell from the simulated races of one design."""
    counts = {v: 0 for v in VERDICTS}
    for res in results:
        counts[res.decision.verdict] += 1
    decided = [res.rounds for res in results if res.decision.decided]
    wrong = sum(counts[v] for v in ("better", "equivalent", "worse") if not holds(v, ratio, delta))
    return Cell(ratio, n, {v: c / len(results) for v, c in counts.items()},
                float(statistics.median(decided)) if decided else None,
                float(np.mean([res.gpu_s for res in results])) / 60, wrong / len(results), replicas=replicas)


def plan(ratios: Sequence[float], starts_list: Sequence[int], noise: Noise, rule: SequentialRule,
         block_rounds: int, races: int, seed: int, max_rounds: int, budget_min: float,
         replicas_list: Sequence[int] = ()) -> list[Cell]:
    """Every (ratio, starts) cell from *races* simulated races, then every (ratio, replicas) cell; the same
    draws for every cell (common random numbers), so differences between cells are the design's, not the
    draw's."""
    top = max([*starts_list, *replicas_list])
    rng = np.random.default_rng(seed)
    a = rng.normal(0.0, noise.tau, (races, top))
    d = rng.normal(0.0, noise.tau, (races, top))
    e = rng.normal(0.0, noise.sigma, (races, max_rounds))
    out = []
    for ratio in ratios:
        theta = math.log(ratio)
        for n in starts_list:
            r = SequentialRule(delta=rule.delta, confidence=rule.confidence, min_rounds=rule.min_rounds,
                               min_starts=max(rule.min_starts, n), start_margin=rule.start_margin)
            results = [simulate_race(theta, a[i].tolist(), d[i].tolist(), e[i].tolist(), n, r, noise,
                                     block_rounds, max_rounds, budget_min * 60) for i in range(races)]
            out.append(summarise(results, ratio, n, rule.delta))
        for n in replicas_list:
            # resident replicas: min_starts 2, as a race with --replicas sets it (two starts a side per verdict)
            r = SequentialRule(delta=rule.delta, confidence=rule.confidence, min_rounds=rule.min_rounds,
                               min_starts=max(rule.min_starts, min(n, 2)), start_margin=rule.start_margin)
            results = [simulate_replicas(theta, a[i].tolist(), d[i].tolist(), e[i].tolist(), n, r, noise,
                                         max_rounds, budget_min * 60) for i in range(races)]
            out.append(summarise(results, ratio, n, rule.delta, replicas=True))
    return out


def answer(cells: Sequence[Cell], target: float) -> list[str]:
    """Per ratio: the fewest starts with at least *target* of races decided, and what they mostly decide."""
    lines = []
    for ratio, replicas in dict.fromkeys((c.ratio, c.replicas) for c in cells):
        mine = sorted((c for c in cells if c.ratio == ratio and c.replicas == replicas), key=lambda c: c.starts)
        kind = "resident replicas" if replicas else "starts"
        hit = next((c for c in mine if c.decided >= target), None)
        if hit is None:
            best = max(mine, key=lambda c: c.decided)
            lines.append(f"ratio {ratio:g}: out of reach with <= {mine[-1].starts} {kind} "
                         f"(best {best.decided:.0%} decided at {best.starts} {kind})")
            continue
        top = max(("better", "equivalent", "worse"), key=lambda v: hit.share[v])
        caveat = "; one start: the selector acts on its \"better\" only with the campaign's agreement" \
            if hit.starts == 1 else ""
        lines.append(f"ratio {ratio:g}: {hit.starts} {kind} per arm decide {hit.decided:.0%} of races "
                     f"(mostly {top}, {hit.share[top]:.0%}; wrong {hit.wrong:.0%}), "
                     f"median {hit.median_rounds:g} rounds, "
                     f"{hit.gpu_min:.1f} GPU-min{caveat}")
    return lines


def render(cells: Sequence[Cell], markdown: bool) -> list[str]:
    head = ["ratio", "starts", "P(better)", "P(equiv)", "P(worse)", "P(undecided)", "P(wrong)", "median rounds",
            "GPU-min"]
    rows = [[f"{c.ratio:g}", c.design, *(f"{c.share[v]:.0%}" for v in VERDICTS), f"{c.wrong:.0%}",
             "-" if c.median_rounds is None else f"{c.median_rounds:g}", f"{c.gpu_min:.1f}"] for c in cells]
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|",
                *("| " + " | ".join(r) + " |" for r in rows)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]


def _pooled_within(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    ss = sum(float(np.sum((np.asarray(g) - np.mean(g)) ** 2)) for g in groups)
    df = sum(len(g) - 1 for g in groups)
    return (ss / df if df > 0 else math.nan), df


def _groups(ys: Sequence[float], blocks: Sequence[Block]) -> list[list[float]]:
    out: dict[Block, list[float]] = defaultdict(list)
    for y, b in zip(ys, blocks, strict=True):
        out[b].append(y)
    return list(out.values())


def pick_race(rows: Sequence[Mapping[str, Any]], race: str) -> tuple[list[Mapping[str, Any]], str]:
    """The rows of one race: *race* is a key, or ``latest`` for the one whose last cell started last.

    A dataset can hold several races (a seeded dataset, a changed cell design): their round numbers overlap,
    so they must not be read as one."""
    started: dict[str, float] = {}
    for r in rows:
        if r.get("race_id"):
            key = str(r["race_id"])
            started[key] = max(started.get(key, 0.0), float(r.get("started_at") or 0.0))
    if not started:
        raise PlanError("the dataset has no race rows")
    if race == "latest":
        key = max(started, key=lambda k: started[k])
    elif race in started:
        key = race
    else:
        raise PlanError(f"no race {race!r} in the dataset (races: {', '.join(sorted(started))})")
    which = f"race {key}" + (f", the newest of {len(started)}" if race == "latest" and len(started) > 1 else "")
    return [r for r in rows if r.get("race_id") == key], which


def estimate(rows: Sequence[Mapping[str, Any]], mode: str, metric: str) -> tuple[dict[str, float], list[str]]:
    """tau, sigma, round_s and wave_s from a race dataset's rows, and lines saying where each came from."""
    table = table_from_rows(rows, [metric])
    arms = table.arms()
    if mode not in arms:
        raise PlanError(f"no race rows of arm {mode!r} in the dataset (arms: {', '.join(arms) or 'none'})")
    notes: list[str] = []
    groups = _groups(*table.blocked(mode, metric))
    aa = table.blocked(CONTROL_ARM, metric) if CONTROL_ARM in arms else ([], [])
    groups += _groups(*aa)
    s2, df = _pooled_within(groups)
    est: dict[str, float] = {}
    if df >= 1 and math.isfinite(s2):
        est["sigma"] = math.sqrt(s2)
        notes.append(f"sigma {est['sigma']:.3f}: within-block sd of ln({metric} ratio), {mode}"
                     f"{' + CONTROL' if aa[0] else ''} arms, {df} df")
    between = between_from_aa(*aa) if aa[0] else None
    if between is not None and "sigma" in est:
        aa_groups = _groups(*aa)
        noise_share = float(np.mean([s2 / len(g) for g in aa_groups])) / 2  # E[b²]/2 = τ² + σ²/2n
        est["tau"] = math.sqrt(max(0.0, between.tau2 - noise_share))
        ratio = math.exp(float(np.mean([np.mean(g) for g in aa_groups])))
        notes.append(f"tau {est['tau']:.3f}: the A/A arm's {between.blocks} block(s) (ratio {ratio:.3f}), "
                     f"between_from_aa {math.sqrt(between.tau2):.3f} less its round-noise share")
    walls: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("race_round") is not None and r.get("race_arm"):
            walls[int(r["race_round"])].append(r)
    per_engine = [(max(float(c["finished_at"]) for c in cs) - float(cs[0]["race_round_t0"])) / len(cs)
                  for cs in walls.values()
                  if cs[0].get("race_round_t0") is not None and all(c.get("finished_at") for c in cs)]
    if per_engine:
        est["round_s"] = 2 * statistics.median(per_engine)
        notes.append(f"round-s {est['round_s']:.1f}: 2 engines x the median round wall per engine "
                     f"({len(per_engine)} rounds)")
    starts: dict[str, tuple[str, float]] = {}
    for r in rows:
        sid, su = r.get("race_start_id"), r.get("startup_s")
        if sid and su is not None and r.get("race_arm") in (mode, "FULL_AND_PIECEWISE", CONTROL_ARM):
            starts[str(sid)] = (str(sid), float(su))
    restarts = [su for sid, su in starts.values() if not sid.endswith(":1") and sid.count(":") >= 2]
    pool = restarts or [su for _, su in starts.values()]
    if pool:
        est["wave_s"] = statistics.median(pool)
        kind = "restarts" if restarts else "first starts (overlapped: an upper bound on one side's restart)"
        notes.append(f"wave-s {est['wave_s']:.0f}: median start-up of {len(pool)} {kind}")
    return est, notes


def _floats(text: str, name: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"--{name} takes a comma list of numbers, got {text!r}") from None


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"--{name} takes a comma list of whole numbers, got {text!r}") from None


def run(argv: list[str] | None = None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tau", type=float, help="sd of one engine start's effect, log (default 0.025)")
    p.add_argument("--sigma", type=float, help="sd of a round's log ratio within a block (default 0.08)")
    p.add_argument("--ratio", default="0.9,1.0", help="true ratios mode / default, comma list")
    p.add_argument("--delta", type=float, default=0.03)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--min-rounds", type=int, default=3)
    p.add_argument("--starts", default="1,2,3,4,6", help="starts per arm to compare, comma list")
    p.add_argument("--replicas", default="", help="also: engines per arm resident at once (--replicas), comma list")
    p.add_argument("--rounds-per-block", type=int, default=2, help="the race's block_rounds")
    p.add_argument("--max-rounds", type=int, default=30, help="rounds before a race gives up")
    p.add_argument("--budget-min", type=float, default=0.0, help="GPU-minute budget per race (0: none)")
    p.add_argument("--races", type=int, default=400, help="simulated races per cell")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--round-s", type=float, help="GPU seconds per round (default 9: two 4.5-s cells)")
    p.add_argument("--wave-s", type=float, help="GPU seconds per start wave (default 75: one warm start)")
    p.add_argument("--target", type=float, default=0.8, help="share of races decided the answer asks for")
    p.add_argument("--from", dest="dataset", type=Path, help="a race dataset to estimate the noise from")
    p.add_argument("--mode", default="FULL", help="with --from: the arm whose noise to use")
    p.add_argument("--metric", default="itl_p50", help=f"with --from: one of {', '.join(KNOWN_RACE_METRICS)}")
    p.add_argument("--race", default="latest",
                   help="with --from: the race key to read, or 'latest' (default): the newest race in the dataset")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)

    ratios = _floats(args.ratio, "ratio")
    starts = _ints(args.starts, "starts")
    replicas = _ints(args.replicas, "replicas")
    if any(n < 2 or n > 32 for n in replicas):
        raise PlanError(f"--replicas needs whole numbers from 2 to 32, got {args.replicas!r}")
    if not ratios or any(not (0 < r < 10) for r in ratios):
        raise PlanError(f"--ratio needs ratios in (0, 10), got {args.ratio!r}")
    if not starts or any(n < 1 or n > 20 for n in starts):
        raise PlanError(f"--starts needs whole numbers from 1 to 20, got {args.starts!r}")
    if not 1 <= args.races <= 100_000:
        raise PlanError(f"--races must be from 1 to 100000, got {args.races}")
    if args.rounds_per_block < 1:
        raise PlanError(f"--rounds-per-block must be at least 1, got {args.rounds_per_block}")
    if args.max_rounds < args.min_rounds:
        raise PlanError(f"--max-rounds ({args.max_rounds}) is below --min-rounds ({args.min_rounds})")
    if args.budget_min < 0 or not 0 < args.target <= 1:
        raise PlanError("--budget-min must be >= 0 and --target in (0, 1]")
    try:
        rule = SequentialRule(delta=args.delta, confidence=args.confidence, min_rounds=args.min_rounds)
    except ValueError as exc:
        raise PlanError(str(exc)) from None

    given = {k: getattr(args, k) for k in ("tau", "sigma", "round_s", "wave_s") if getattr(args, k) is not None}
    lines: list[str] = []
    if args.dataset is not None:
        if args.metric not in KNOWN_RACE_METRICS:
            raise PlanError(f"--metric must be one of {', '.join(KNOWN_RACE_METRICS)}, got {args.metric!r}")
        if not args.dataset.is_file():
            raise PlanError(f"no such dataset: {args.dataset}")
        try:
            with ProfileStore(args.dataset, readonly=True) as store:
                rows = store.rows()
        except Exception as exc:  # a file that is not a dataset: one line, not a traceback
            raise PlanError(f"cannot read {args.dataset} as a dataset: {exc}") from None
        rows, which = pick_race(rows, args.race)
        est, notes = estimate(rows, args.mode, args.metric)
        lines += [f"from {args.dataset} ({args.mode}, {args.metric}, {which}):", *(f"  {n}" for n in notes)]
        for k in ("tau", "sigma"):
            if k not in given and k not in est:
                why = "A/A (CONTROL) arm" if k == "tau" else "block with two rounds"
                raise PlanError(f"the dataset has no {why} to estimate {k} from: pass --{k}")
        given = {**est, **given}
    defaults = {"tau": 0.025, "sigma": 0.08, "round_s": 9.0, "wave_s": 75.0}
    noise = Noise(**{k: float(given.get(k, v)) for k, v in defaults.items()})
    if noise.tau < 0 or noise.sigma <= 0 or noise.round_s < 0 or noise.wave_s < 0:
        raise PlanError(f"need tau >= 0, sigma > 0 and non-negative costs, got {noise}")

    cells = plan(ratios, sorted(set(starts)), noise, rule, args.rounds_per_block, args.races, args.seed,
                 args.max_rounds, args.budget_min, sorted(set(replicas)))
    budget = f", budget {args.budget_min:g} GPU-min" if args.budget_min else ""
    lines += [f"tau {noise.tau:.3f}, sigma {noise.sigma:.3f} (log); delta {rule.delta:g}, confidence "
              f"{rule.confidence:g}; {args.races} races per cell, seed {args.seed}; blocks of "
              f"{args.rounds_per_block} rounds (first {max(rule.min_rounds, args.rounds_per_block)}), at most "
              f"{args.max_rounds} rounds{budget}; round {noise.round_s:.1f} s, wave {noise.wave_s:.0f} s", ""]
    lines += render(cells, args.markdown)
    lines += ["", f"fewest starts (or resident replicas) per arm with >= {args.target:.0%} of races decided:",
              *(f"  {x}" for x in answer(cells, args.target))]
    return lines


def main(argv: list[str] | None = None) -> int:
    try:
        lines = run(argv)
    except PlanError as exc:
        print(f"race_plan: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
