#!/usr/bin/env python3
"""The verdict table of raced datasets (``graphmode profile --race``): per model shape, each mode against
vLLM's default on every raced metric, with the ratio, its interval and the rounds, then what the race cost.

    .venv/bin/python bench/race_table.py models/profiles/race-h200-*.sqlite --markdown --workloads

Verdicts are recomputed from the rows exactly as the selector does (graphmode.selector.verdicts), with
``--delta``/``--confidence`` (default 3%, 95%). ``CONTROL`` is the A/A arm (a second engine of the default):
it should read *equivalent*; its pooled ratio per metric, printed under each shape, is how far two starts of
one mode landed apart there (an arm vLLM silently ran as the default's mode, ``FULL → FULL_AND_PIECEWISE`` on
FlashInfer, is one too). ``s=N`` is the number of engine starts behind a verdict (the fewer of the
mode's and the default's; ``--starts``): "better" from one start each is not acted on by the selector.
Runs without scikit-learn (a GPU host's environment is enough).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
try:
    import graphmode  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(BENCH.parent / "src"))

from profile_cost import DatasetCost, _shape_name, dataset_costs  # noqa: E402

from graphmode.core.dataset import ProfileStore  # noqa: E402
from graphmode.core.deployment import api_servers  # noqa: E402
from graphmode.profiling.race_rounds import KNOWN_RACE_METRICS, RACE_METRICS  # noqa: E402
from graphmode.profiling.sequential import SequentialRule  # noqa: E402
from graphmode.report.arms import arm_costs, memory_line  # noqa: E402
from graphmode.report.arms import spec_line as arms_spec_line  # noqa: E402
from graphmode.selector.featurize import shape_key, shape_of_row  # noqa: E402
from graphmode.selector.verdicts import RaceVerdict, across_aa_arms, across_races, race_verdicts  # noqa: E402


def cell(v: RaceVerdict | None) -> str:
    return "-" if v is None else v.cell()


DEFAULT = "FULL_AND_PIECEWISE"


def aa_line(pooled: dict[tuple[str, str], RaceVerdict], metrics: list[str]) -> str:
    """The A/A arm's pooled ratio per metric: how far two starts of the default landed apart. Without a
    CONTROL arm, an arm vLLM downgraded to the default's mode is one (FULL on FlashInfer)."""
    arm = "CONTROL" if any(m == "CONTROL" for m, _ in pooled) else next(
        (m for (m, _), v in sorted(pooled.items()) if v.runs_as == DEFAULT), None)
    parts = []
    for k in metrics:
        v = pooled.get((arm, k)) if arm else None
        if v is not None and v.ratio is not None:
            ci = f" [{v.lo:.2f}–{v.hi:.2f}]" if v.lo is not None and v.hi is not None else ""
            parts.append(f"{k} {v.ratio:.3f}×{ci} over {v.rounds} rounds, {v.starts} start(s) each")
    if not parts:
        return "A/A arm (CONTROL): not raced (a race with --control has one)"
    what = ("CONTROL, a second engine of the default" if arm == "CONTROL"
            else f"{arm}, which vLLM ran as the default's {DEFAULT}")
    return f"A/A arm ({what}) / default: " + "; ".join(parts)


def start_line(rows: list[dict[str, object]]) -> str | None:
    """Per arm, the engine's own GPU memory and start-up (graphmode.report.arms); None when no row has the
    memory (rows from before 2026-12-02, or a host whose NVML lists no engine process)."""
    return memory_line(arm_costs(rows))


def spec_line(rows: list[dict[str, object]]) -> str | None:
    """Per arm, speculative decoding's acceptance over its ok cells; None when no cell had a draft. With dummy
    weights it says whether the proposer engaged at all: an ngram proposer that finds no match proposes
    nothing, and its configuration then races plain decoding."""
    return arms_spec_line(arm_costs(rows))


def jit_line(rows: list[dict[str, object]]) -> str | None:
    """The ok cells whose engine JIT-compiled a kernel during them (``engine_jit_kernels``: their rounds pair
    with nothing) and the kernels; None when no row was read for it (datasets from before 2026-12-03 that
    ``bench/mark_jit.py`` did not mark)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("race_round") is not None]
    read = [r for r in ok if r.get("engine_jit_kernels") is not None]
    if not read:
        return None
    marked = [r for r in read if r.get("engine_jit_kernels")]
    kernels = sorted({k for r in marked for k in str(r["engine_jit_kernels"]).split(",") if k})
    rounds = sorted({(str(r.get("race_id")), int(str(r["race_round"]))) for r in marked})
    return (f"JIT compiles during cells (vLLM's jit_monitor): in {len(marked)} of the {len(read)} cells whose "
            f"engine log was read, "
            f"{len(rounds)} rounds left out for the arms concerned"
            + (f" ({', '.join(kernels)})" if kernels else "")
            + (f"; {len(ok) - len(read)} cells not read" if len(read) < len(ok) else ""))


# a capped cell "held" its cap when the engine ran at least this share of it on average (the rest of a
# held cap is in transit: in the API servers, or between a request's end and the next one's start)
CAP_HELD = 0.8
# a smaller cap is a latency probe (one request at a time), whose running mean is the gap between requests
CAP_MIN = 32


def _cap(r: dict[str, object]) -> int | None:
    """The sequences a capped cell could keep running: its workload's concurrency cap, at most the engine's
    --max-num-seqs; None for an open loop."""
    try:
        spec = json.loads(str(r.get("workload_spec") or "{}"))
    except ValueError:
        return None
    cap = spec.get("max_concurrency") if isinstance(spec, dict) else None
    if not isinstance(cap, int) or cap < CAP_MIN:
        return None
    seqs = r.get("dep_max_num_seqs")
    return min(cap, seqs) if isinstance(seqs, int) and seqs > 0 else cap


def load_line(rows: list[dict[str, object]]) -> str | None:
    """Whether the capped cells (a closed loop: ``max_concurrency``) kept their cap running in the engine,
    and whether a round's arms agree on it. A round whose arms disagree compares a saturated engine with one
    that kept up, so its ratios read the queue each arm happened to be in, not the mode: near the engine's
    capacity, when throughput no longer grows with the batch (host-bound), the batch has no stable level
    (the H200's as4 race, 2026-12-03: FULL ran 98 sequences where its neighbours ran 521-723 of 768, and
    its ITL ratio swung from 0.88x to 0.17x between rounds). Saturate such a load (a rate far above the
    capacity) or lower it. Caps under ``CAP_MIN`` are left out. None when no capped cell has batch samples
    (``obs_batch_mean``)."""
    rounds: dict[tuple[str, int], list[bool]] = {}
    for r in rows:
        b, cap = r.get("obs_batch_mean"), _cap(r)
        if r.get("status") != "ok" or r.get("race_round") is None or cap is None or not isinstance(b, (int, float)):
            continue
        rounds.setdefault((str(r.get("race_id")), int(str(r["race_round"]))), []).append(b >= CAP_HELD * cap)
    if not rounds:
        return None
    cells = [held for v in rounds.values() for held in v]
    mixed = sum(1 for v in rounds.values() if any(v) and not all(v))
    text = (f"capped cells: the engine ran >= {CAP_HELD:.0%} of the cap in {sum(cells)} of {len(cells)}; "
            f"{mixed} of {len(rounds)} rounds mix held and not held")
    if mixed:
        text += " (those compare a saturated engine with one that kept up: saturate the load or lower it)"
    return text


# a vLLM process at this many cores is one Python thread's worth: it sets the step's pace (cli.common's
# LOADGEN_SATURATED_CORES, the threshold of the cell lines)
CPU_BOUND_CORES = 0.8


def cpu_line(rows: list[dict[str, object]]) -> str | None:
    """How many ok cells had a vLLM process at a full core (``engine_busiest_cores``), which ones, and how busy
    the GPU was meanwhile. There the step time is that process's CPU time per step and a graph shortens only
    its launch part (the H200's saturated 1B race, 2026-12-03: VLLM::EngineCore at 0.92-0.98 cores in 20 of
    20 cells, the GPU 21-51% busy, every verdict open). None when no cell was at a full core."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("race_round") is not None
          and isinstance(r.get("engine_busiest_cores"), (int, float))]
    bound = [r for r in ok if float(str(r["engine_busiest_cores"])) >= CPU_BOUND_CORES]
    if not bound:
        return None
    titles: dict[str, int] = defaultdict(int)
    for r in bound:
        titles[str(r.get("engine_busiest_process") or "a vLLM process")] += 1
    cores = [float(str(r["engine_busiest_cores"])) for r in bound]
    gpu = [float(str(r["gpu_util_pct_mean"])) for r in bound if isinstance(r.get("gpu_util_pct_mean"), (int, float))]
    who = ", ".join(f"{t} in {n}" for t, n in sorted(titles.items(), key=lambda kv: (-kv[1], kv[0])))
    busy = f", the GPU {min(gpu):.0f}-{max(gpu):.0f}% busy" if gpu else ""
    return (f"CPU-bound cells: a vLLM process ran at {min(cores):.2f}-{max(cores):.2f} cores in {len(bound)} of "
            f"{len(ok)} ({who}){busy}: there a process's CPU time sets the step, and a mode only shortens its "
            "launches")


def across_table(by_shape: dict[Pool, list[RaceVerdict]], metrics: list[str], rule: SequentialRule,
                 markdown: bool) -> list[str]:
    """Per vLLM release, each mode against the default over every race (one per shape and configuration, each
    its own engine starts): the t interval of the races' log ratios, each over all its rounds
    (graphmode.selector.verdicts.across_races), what tells a mode's effect from a start's when every race
    has one start per arm."""
    out: list[str] = []
    for release in sorted({pool[1] for pool in by_shape}):
        vs = [v for pool, group in by_shape.items() if pool[1] == release for v in group]
        modes = sorted({v.mode for v in vs if v.mode != "CONTROL" and not v.runs_as})
        rows = []
        for m in modes:
            cells = []
            for k in metrics:
                a = across_races(vs, m, k, delta=rule.delta, confidence=rule.confidence)
                cells.append("-" if a is None
                             else f"{a.verdict} {a.ratio:.3f}× [{a.lo:.2f}–{a.hi:.2f}] races={a.races}")
            rows.append([m, *cells])
        aa = [across_aa_arms(vs, k, delta=rule.delta, confidence=rule.confidence) for k in metrics]
        if any(a is not None for a in aa):  # the control: the truth is 1 there
            rows.append(["A/A arms", *("-" if a is None else
                                       f"{a.verdict} {a.ratio:.3f}× [{a.lo:.2f}–{a.hi:.2f}] races={a.races}"
                                       for a in aa)])
        if rows and any(c != "-" for r in rows for c in r[1:]):
            title = f"Across races (vLLM {release}): t interval over the races' ratios, one race one sample"
            out += ["", f"{'### ' if markdown else ''}{title}", ""]
            out += table(["mode", *metrics], rows, markdown)
    return out


# (shape key, vLLM release, max_model_len, API servers): the rounds one table pools
Pool = tuple[str, str, int | None, int | None]


def _release(r: dict[str, object]) -> str:
    return str(r.get("fp_vllm_version") or "?").split("+")[0]


def _pool(r: dict[str, object]) -> Pool:
    shape = shape_of_row(r)
    length = shape.get("max_model_len")
    return shape_key(shape), _release(r), length if isinstance(length, int) else None, api_servers(shape)


def mode_label(mode: str, pooled: dict[tuple[str, str], RaceVerdict]) -> str:
    """``FULL → FULL_AND_PIECEWISE`` for an arm vLLM ran as another mode (a silent downgrade)."""
    ran = next((v.runs_as for (m, _), v in pooled.items() if m == mode and v.runs_as), None)
    return f"{mode} → {ran}" if ran else mode


def table(head: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|",
                *("| " + " | ".join(r) + " |" for r in rows)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in [head, *rows]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("datasets", nargs="+", type=Path)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--workloads", action="store_true", help="also the verdicts per raced workload")
    p.add_argument("--delta", type=float, default=0.03)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--metrics", default=",".join(RACE_METRICS), help=f"of {', '.join(KNOWN_RACE_METRICS)}")
    args = p.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m]
    rule = SequentialRule(delta=args.delta, confidence=args.confidence)
    rows = []
    path_pools: dict[Path, set[Pool]] = defaultdict(set)
    for path in args.datasets:
        with ProfileStore(path, readonly=True) as store:
            for r in store.rows():
                rows.append(r)
                if r.get("race_round") is not None:
                    path_pools[path].add(_pool(r))
    # Races of one shape under different vLLM releases are not pooled: a release can move a verdict; nor are
    # races at another --max-model-len (graphmode.selector.verdicts.race_verdicts)
    by_release: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in rows:
        by_release[_release(r)].append(r)
    releases = len(by_release) > 1
    names: dict[Pool, str] = {}
    base: dict[Pool, str] = {}
    by_shape: dict[Pool, list[RaceVerdict]] = defaultdict(list)
    shape_rows: dict[Pool, list[dict[str, object]]] = defaultdict(list)
    for release, group in by_release.items():
        for r in group:
            base[_pool(r)] = _shape_name(r)
            names[_pool(r)] = base[_pool(r)] + (f", vLLM {release}" if releases else "")
            shape_rows[_pool(r)].append(r)
        for v in race_verdicts(group, rule, metrics):
            by_shape[(v.shape, release, v.max_model_len, v.api_servers)].append(v)
    lengths: dict[tuple[str, str], set[int | None]] = defaultdict(set)
    for shape, release, length, _ in by_shape:
        lengths[(shape, release)].add(length)
    for pool in names:
        if len(lengths[pool[:2]]) > 1 and pool[2] is not None:
            names[pool] += f", max_model_len={pool[2]}"
        if pool[3]:
            names[pool] += f", {pool[3]} API servers"
    # a dataset's race cost, on the pool its rows raced (one dataset per configuration in the campaigns)
    costs: dict[Pool, list[DatasetCost]] = defaultdict(list)
    for path in args.datasets:
        for c in dataset_costs(path):
            for pool in path_pools[path]:
                if c.kind == "race" and base.get(pool) == c.shape and not releases:
                    costs[pool].append(c)
    out: list[str] = []
    for shape, vs in sorted(by_shape.items(),
                            key=lambda kv: (base.get(kv[0], kv[0][0]), kv[0][1], kv[0][2] or 0, kv[0][3] or 1)):
        name = names.get(shape, shape[0])
        cs = costs.get(shape, [])
        cost = (f": {sum(c.gpu_s for c in cs) / 60:.1f} GPU-min, {sum(c.rounds for c in cs)} rounds, "
                f"{sum(c.cells for c in cs)} cells, {sum(c.starts for c in cs)} engine starts" if cs else "")
        out += ["", f"{'### ' if args.markdown else ''}{name}{cost}", ""]
        pooled = {(v.mode, v.metric): v for v in vs if v.workload is None}
        modes = sorted({m for m, _ in pooled}, key=lambda m: (m == "CONTROL", m))
        out += [aa_line(pooled, metrics), ""]
        out += table(["mode", *metrics],
                     [[mode_label(m, pooled), *(cell(pooled.get((m, k))) for k in metrics)] for m in modes],
                     args.markdown)
        for line in (start_line(shape_rows[shape]), spec_line(shape_rows[shape]), jit_line(shape_rows[shape]),
                     load_line(shape_rows[shape]), cpu_line(shape_rows[shape])):
            if line:
                out += ["", line]
        if args.workloads:
            per = {(v.mode, v.metric, v.workload): v for v in vs if v.workload is not None}
            loads = sorted({w for _, _, w in per if w})
            for k in metrics:
                out += ["", f"{k} per workload:", ""]
                out += table(["mode", *loads], [[m, *(cell(per.get((m, k, w))) for w in loads)] for m in modes],
                             args.markdown)
    out += across_table(by_shape, metrics, rule, args.markdown)
    print("\n".join(out).lstrip("\n") or "no race rows in these datasets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
