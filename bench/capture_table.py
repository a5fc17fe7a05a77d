#!/usr/bin/env python3
"""Issue 14's H200 table: vLLM's default capture sizes against recommended lists, per shape × load.

Reads datasets written by ``bench/gpu/capture_chain.sh`` (or any race with ``--sizes-arm``): for every race
with capture-size arms, one line per (workload, sizes arm) with

* sizes: how many sizes the default list had (as vLLM resolved it) and the arm's list;
* warm start-up s of each list: the race's starts (side by side, every one warm: the race compiles first),
  since the chain's lone start of the default is a host's first, cold one (H200, 2026-12-02: 258 s against
  77-81 s warm for the 0.5B shape) and the lone starts of the lists only partly hit the compile cache;
* capture s, graph GiB and KV cache tokens of each. Taken from *lone* engine starts when the
  dataset has them (non-race rows of the default mode whose requested sizes match: the chain's profile
  steps, each engine alone on the GPU with ``--gpu-memory-utilization``), since a race starts its engines
  side by side and vLLM's graph memory is a device-wide free-memory difference (it reads the neighbours'
  allocations, even negative) and the KV cache is fixed by ``--kv-cache-memory-bytes``. Without a lone start
  the race rows' numbers are shown, marked ``~``;
* per raced metric the arm / default ratio on that workload's paired rounds, its interval and verdict (the
  race's sequential rule, per-workload confidence Bonferroni-corrected as the race does), and rounds n;
* the most requests the default saw running in a cell (``obs_batch_max``): the too-short case needs > 512;
  and the default cells' mean GPU utilisation and their busiest vLLM process with its CPU cores
  (``engine_busiest_process`` / ``engine_busiest_cores``; rows from before that column: the API server's,
  ``obs_frontend_cpu_cores``): at ~1 core with the GPU far from busy the cell is host-bound (H200,
  2026-12-02: ~900 running, GPU 12%; 2026-12-03, the 1B at 32 req/s: VLLM::EngineCore at 1.02 cores while
  the API server used 0.59, which the API server column alone had called not host-bound).

    .venv/bin/python bench/capture_table.py DATASET [...] [--markdown] [--delta 0.03] [--confidence 0.95]
        [--starts 2] [--metrics itl_p50,ttft_p50,tpot_p50] [--latest]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import ConfigError
from graphmode.core.modes import DEFAULT_MODE
from graphmode.profiling.race_rounds import DEFAULT_ARM, KNOWN_RACE_METRICS, arm_verdicts, table_from_rows
from graphmode.profiling.sequential import Decision, SequentialRule
from graphmode.report.capture import shape_label
from graphmode.vllm_args import compilation_config_of

START_COLUMNS = ("startup_s", "capture_s", "graph_gib", "kv_cache_tokens")
# the chain's races decide itl_p50 and ttft_p50 (loads) or tpot_p50 and itl_p50 (long)
DEFAULT_METRICS = ("itl_p50", "ttft_p50", "tpot_p50")


@dataclass
class Starts:
    """Start-up numbers of one list: means over distinct engine starts, and whether they were lone."""

    n: int = 0
    lone: bool = False
    values: dict[str, float | None] = field(default_factory=dict)
    sizes: list[int] | None = None  # as vLLM resolved them


@dataclass
class Line:
    dataset: str
    shape: str
    race: str
    workload: str
    arm: str
    arm_sizes: list[int]
    default: Starts
    chosen: Starts
    decisions: dict[str, Decision]
    batch_max: float | None
    gpu_util: float | None = None  # the default's cells: mean GPU utilisation %, and
    busiest: str | None = None  # its busiest vLLM process and that process's CPU cores (1.0: host-bound)
    default_warm: float | None = None  # mean start-up s of the race's (warm) starts: default list, arm's list
    chosen_warm: float | None = None


def _json(raw: Any) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return None


def requested_sizes(row: Mapping[str, Any]) -> list[int] | None:
    """The capture sizes a row's engine was asked for: a sizes arm's, else its args' (None: vLLM's default)."""
    arm = _json(row.get("race_capture_sizes"))
    if isinstance(arm, list):
        return sorted(int(x) for x in arm)
    args = _json(row.get("fp_vllm_args"))
    if not isinstance(args, list):
        return None
    try:
        raw = compilation_config_of([str(a) for a in args]).get("cudagraph_capture_sizes")
    except ConfigError:
        return None
    return sorted(int(x) for x in raw) if isinstance(raw, list) else None


def starts_of(rows: Iterable[Mapping[str, Any]], lone: bool) -> Starts:
    """Means of the start-up columns over distinct starts (run, start id / repeat, start-up seconds)."""
    seen: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for r in rows:
        seen.setdefault((r.get("run_id"), r.get("race_start_id"), r.get("startup_s")), r)
    out = Starts(n=len(seen), lone=lone)
    for c in START_COLUMNS:
        vals = [float(r[c]) for r in seen.values() if isinstance(r.get(c), int | float) and math.isfinite(r[c])]
        out.values[c] = statistics.fmean(vals) if vals else None
    resolved = [_json(r.get("capture_sizes")) for r in seen.values()]
    out.sizes = next((s for s in resolved if isinstance(s, list)), None)
    return out


def _starts_for(sizes: list[int] | None, lone_rows: Sequence[Mapping[str, Any]],
                race_rows: Sequence[Mapping[str, Any]]) -> Starts:
    lone = [r for r in lone_rows if requested_sizes(r) == sizes]
    if lone:
        return starts_of(lone, lone=True)
    return starts_of([r for r in race_rows if requested_sizes(r) == sizes], lone=False)


def table_lines(path: Path, rule: SequentialRule, metrics: Sequence[str] = DEFAULT_METRICS,
                latest: bool = False) -> list[Line]:
    with ProfileStore(path, readonly=True) as store:
        rows = store.rows(status="ok")
    lone_rows = [r for r in rows if not r.get("race_id") and r.get("mode") == DEFAULT_MODE.value]
    races: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("race_id"):
            races[str(r["race_id"])].append(r)
    if latest and races:
        newest = max(races, key=lambda k: max(float(r.get("started_at") or 0) for r in races[k]))
        races = {newest: races[newest]}
    out: list[Line] = []
    for race_id, rrows in sorted(races.items()):
        arms = {str(r["race_arm"]): requested_sizes(r) for r in rrows if r.get("race_capture_sizes")}
        if not arms:
            continue
        table = table_from_rows(rrows, metrics)
        workloads = sorted({str(r["workload"]) for r in rrows})
        default = _starts_for(None, lone_rows, [r for r in rrows if r.get("race_arm") == DEFAULT_ARM])
        default_warm = starts_of([r for r in rrows if r.get("race_arm") == DEFAULT_ARM], lone=False)
        shape = shape_label(rrows[0])
        for arm, sizes in sorted(arms.items()):
            assert sizes is not None
            v = arm_verdicts(table, arm, metrics, rule, workloads)
            chosen = _starts_for(sizes, lone_rows, [r for r in rrows if r.get("race_arm") == arm])
            warm = (default_warm.values.get("startup_s"),
                    starts_of([r for r in rrows if r.get("race_arm") == arm], lone=False).values.get("startup_s"))
            for w in workloads:
                cells = [r for r in rrows if r.get("race_arm") == DEFAULT_ARM and r["workload"] == w]
                peak = max((float(x) for r in cells if isinstance(x := r.get("obs_batch_max"), int | float)),
                           default=None)
                out.append(Line(str(path), shape, race_id, w, arm, sizes, default, chosen,
                                {m: v.by_workload[(m, w)] for m in metrics}, peak,
                                _mean(r.get("gpu_util_pct_mean") for r in cells), busiest_process(cells), *warm))
            if len(workloads) > 1:
                out.append(Line(str(path), shape, race_id, "(pooled)", arm, sizes, default, chosen,
                                dict(v.pooled), None, None, None, *warm))
    return out


def busiest_process(cells: Sequence[Mapping[str, Any]]) -> str | None:
    """The vLLM process that used the most CPU in the most of *cells*, with its mean cores over them
    ("VLLM::EngineCore 1.02"); cells from before ``engine_busiest_*`` give the API server's cores."""
    named = [r for r in cells if isinstance(r.get("engine_busiest_cores"), int | float)]
    if named:
        counts: dict[str, int] = defaultdict(int)
        for r in named:
            counts[str(r.get("engine_busiest_process") or "vLLM")] += 1
        top = min(counts, key=lambda k: (-counts[k], k))
        cores = _mean(r["engine_busiest_cores"] for r in named
                      if str(r.get("engine_busiest_process") or "vLLM") == top)
        # the process tree's root keeps the interpreter's name: started as `python3 -m vllm...`, the API server
        label = "API server" if top in ("python", "python3") else top
        return f"{label} {cores:.2f}"
    api = _mean(r.get("obs_frontend_cpu_cores") for r in cells)
    return None if api is None else f"API server {api:.2f}"


def _mean(values: Iterable[Any]) -> float | None:
    got = [float(v) for v in values if isinstance(v, int | float)]
    return sum(got) / len(got) if got else None


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def _pair(d: Starts, c: Starts, col: str, fmt: str) -> str:
    mark = "" if d.lone and c.lone else "~"
    return f"{mark}{_num(c.values.get(col), fmt)} / {_num(d.values.get(col), fmt)}"


def _decision(d: Decision) -> str:
    if d.ratio is None:
        # a metric the workload never yields (TTFT in steady-decode cells: no request starts inside one)
        # is not a question the race left open
        return "not measured (n=0)" if d.n == 0 else f"{d.verdict} (n={d.n})"
    ci = f" [{d.lo:.3f}–{d.hi:.3f}]" if d.lo is not None and d.hi is not None else ""
    since = f" (since then {d.since})" if d.since else ""
    return f"{d.verdict} {d.ratio:.3f}×{ci} n={d.n}{since}"


def render(lines: Sequence[Line], markdown: bool) -> str:
    metrics = list(dict.fromkeys(m for ln in lines for m in ln.decisions))
    head = ["shape", "workload", "arm", "sizes arm / default", "warm start-up s", "capture s", "graph GiB",
            "KV cache tokens", *[f"{m} arm/default" for m in metrics], "running max", "GPU util %",
            "busiest process, cores"]
    body = []
    for ln in lines:
        n_default = len(ln.default.sizes) if ln.default.sizes else None
        top_default = ln.default.sizes[-1] if ln.default.sizes else None
        body.append([
            ln.shape, ln.workload, ln.arm,
            f"{len(ln.arm_sizes)} (≤{ln.arm_sizes[-1]}) / {_num(n_default, '{:d}')} (≤{_num(top_default, '{:d}')})",
            f"{_num(ln.chosen_warm, '{:.1f}')} / {_num(ln.default_warm, '{:.1f}')}",
            _pair(ln.default, ln.chosen, "capture_s", "{:.2f}"),
            _pair(ln.default, ln.chosen, "graph_gib", "{:.2f}"),
            _pair(ln.default, ln.chosen, "kv_cache_tokens", "{:,.0f}"),
            *[_decision(ln.decisions[m]) if m in ln.decisions else "-" for m in metrics],
            _num(ln.batch_max, "{:.0f}"), _num(ln.gpu_util, "{:.0f}"), ln.busiest or "-",
        ])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        out += ["| " + " | ".join(row) + " |" for row in body]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
        out = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
               for row in [head, *body]]
    out.append("")
    out.append("start-up columns: the arm's list / vLLM's default, means over engine starts. Warm start-up: the "
               "race's starts (side by side, all warm). Capture, graph GiB, KV tokens: lone starts (each "
               "engine alone on the GPU) where the dataset has them, '~' marks numbers from the race's side-by-side "
               "starts (graph GiB and KV tokens there are not comparable). Running max, GPU util % and the busiest "
               "vLLM process are the default's cells on that workload: a process (API server or engine core) "
               "near 1.0 core with the GPU far from busy is a host-bound cell, where no capture list can help.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("datasets", nargs="+", type=Path)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--delta", type=float, default=0.03)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--min-rounds", type=int, default=3)
    ap.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="comma-separated latency metrics")
    ap.add_argument("--starts", type=int, default=2, help="engine starts 'better'/'equivalent' need (the race's)")
    ap.add_argument("--latest", action="store_true",
                    help="only each dataset's newest race (a dataset seeded into a later lease keeps the old ones)")
    a = ap.parse_args(argv)
    try:
        rule = SequentialRule(delta=a.delta, confidence=a.confidence, min_rounds=a.min_rounds, min_starts=a.starts)
    except ValueError as exc:
        print(f"capture_table: {exc}", file=sys.stderr)
        return 2
    metrics = [m.strip() for m in a.metrics.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in KNOWN_RACE_METRICS]
    if unknown or not metrics:
        print(f"capture_table: --metrics: {', '.join(unknown) or 'none'}; known: {', '.join(KNOWN_RACE_METRICS)}",
              file=sys.stderr)
        return 2
    lines: list[Line] = []
    for path in a.datasets:
        if not path.is_file():
            print(f"no dataset at {path}", file=sys.stderr)
            return 2
        lines += table_lines(path, rule, metrics, latest=a.latest)
    if not lines:
        print("no race with capture-size arms in these datasets", file=sys.stderr)
        return 1
    print(render(lines, a.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
