#!/usr/bin/env python3
"""Where a measurement campaign stands: GPU time per slice, between-start noise, per-mode medians.

Reads profile datasets (``graphmode profile`` SQLite files, one per model shape) and prints three tables,
the ones docs/results keeps:

1. slices: per shape, profile run and repeat, the engine starts, their start-up seconds (from the
   Popen to /health), the cells' wall seconds and the seconds per cell;
2. noise: per shape and mode, over workloads measured in two or more engine starts, the ratio of each
   later start to the first and the coefficient of variation across starts (ITL p50, TTFT p50);
3. medians: per shape and mode, the median over workloads of the mean over repeats; then each mode
   against the default inside one round on one GPU (paired, free of the host effect), and whether the
   rounds agree (the verdict the report and the model card carry);
4. conditions (rows recorded since session 3 only): per engine start, the GPU, its SM clock, power and
   utilisation, the NUMA nodes vLLM ran on against the GPU's, and (since session 4) the host's CPU:
   a pure-Python probe, steal and busy time, the CPU cores vLLM's processes used and how often they
   were preempted, to explain slow starts.

``--repeats 0,1`` keeps only those repeats, so that modes are compared over the same engine starts while
a round is still partial (later starts have run slower: a mode with one more start would look worse).

    .venv/bin/python bench/campaign_stats.py models/profiles/h200-*.sqlite [--repeats 0,1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import DatasetError
from graphmode.selector.aggregate import cell_frame, cell_stats, finite_number
from graphmode.selector.paired import (
    PAIRED_MARGIN,
    PAIRED_METRICS,
    PAIRED_MIN_WORKLOADS,
    PairedRound,
    paired_rounds,
    paired_verdicts,
)

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
METRICS = ("itl_p50", "tpot_p50", "ttft_p50", "graph_gib", "startup_s")


def repeat_list(text: str) -> set[int]:
    try:
        reps = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected repeats like 0,1, got {text!r}") from None
    if not reps or min(reps) < 0:
        raise argparse.ArgumentTypeError(f"expected repeats like 0,1, got {text!r}")
    return reps


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise SystemExit(f"error: {path}: no such dataset")
    try:
        with ProfileStore(path, readonly=True) as store:  # older datasets' renamed columns read as today's
            return store.rows(status="ok")
    except DatasetError as exc:
        raise SystemExit(f"error: {path}: not a graphmode profile dataset ({exc})") from exc


def shape_name(path: Path) -> str:
    stem = path.stem
    return stem.split("-", 1)[1] if stem.startswith("h200-") else stem


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def table(title: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


def slices(shape: str, rows: list[dict[str, Any]]) -> list[list[object]]:
    # One engine start = one (run, mode, repeat) since the profiler starts vLLM per repeat and mode.
    starts: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    cells: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        key = (r["run_id"], r["repeat"])
        cells[key].append(r)
        starts[key][r["mode"]] = r["startup_s"] or 0.0
    out: list[list[object]] = []
    for key in sorted(cells, key=lambda k: min(c["started_at"] for c in cells[k])):
        cs = cells[key]
        startup = sum(starts[key].values())
        cell_wall = sum(c["finished_at"] - c["started_at"] for c in cs)
        total = startup + cell_wall
        out.append([shape, key[0], key[1], len(cs), len(starts[key]), f"{total:.0f} s ({total / 60:.1f} GPU-min)",
                    f"{startup:.0f} s ({startup / total:.0%})", f"{cell_wall:.0f} s", f"{cell_wall / len(cs):.1f} s"])
    return out


def cells(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One line per (mode, workload, repeat), the last row measured (graphmode.selector.aggregate.cell_frame)."""
    frame = cell_frame(rows, METRICS, lambda r, m: finite_number(r.get(m)) or None)  # 0 is no measurement
    return frame.drop_duplicates(["mode", "workload", "repeat"], keep="last")


def noise(shape: str, rows: list[dict[str, Any]]) -> list[list[object]]:
    frame = cells(rows).sort_values("repeat", kind="stable")
    starts = frame.groupby(["mode", "workload"]).size()
    out: list[list[object]] = []
    for mode in MODES:
        reps = starts[starts.index.get_level_values(0) == mode]
        reps = reps[reps >= 2]
        if reps.empty:
            continue
        line: list[object] = [shape, mode, len(reps), int(reps.max())]
        mine = frame[(frame["mode"] == mode) & frame["workload"].isin(reps.index.get_level_values(1))]
        for metric in ("itl_p50", "ttft_p50"):
            got = mine.dropna(subset=[metric])
            by = got.groupby("workload")[metric]
            ratios = (got[metric] / by.transform("first"))[by.cumcount() > 0]
            st = cell_stats(got, [metric], by=("workload",))[metric]
            cvs = (st["std"] / st["mean"])[st["count"] >= 2].tolist()
            line += [f"{ratios.median():.2f} ({ratios.min():.2f}–{ratios.max():.2f})",
                     f"{statistics.median(cvs):.1%} (p90 {pct(cvs, 0.9):.1%})"]
        out.append(line)
    return out


def medians(shape: str, rows: list[dict[str, Any]]) -> list[list[object]]:
    frame = cells(rows)
    per_cell = cell_stats(frame, METRICS, by=("mode", "workload"))
    out: list[list[object]] = []
    for mode in MODES:
        if mode not in per_cell.index.get_level_values(0):
            continue
        means = per_cell.loc[mode].xs("mean", axis=1, level=1)
        med = means.median()  # over workloads, of the mean over repeats
        mine = frame[frame["mode"] == mode]  # engine starts in the order their workloads were first measured
        mine = mine.iloc[mine.groupby("workload", sort=False).ngroup().to_numpy().argsort(kind="stable")]
        mode_starts = mine.drop_duplicates(["run_id", "repeat"])["startup_s"].dropna()
        out.append([shape, mode, len(means), f"{med['itl_p50'] * 1e3:.2f}", f"{med['tpot_p50'] * 1e3:.2f}",
                    f"{med['ttft_p50'] * 1e3:.1f}", f"{med['graph_gib']:.2f}" if mode != "NONE" else "0",
                    " / ".join(f"{s:.0f}" for s in mode_starts)])
    return out


def paired_rounds_of(shape: str, rows: list[dict[str, Any]], default: str = "FULL_AND_PIECEWISE") -> list[PairedRound]:
    """Each mode against the default inside one round on one GPU (same repeat, same host and lease).

    Starts on different hosts are not exchangeable (docs/results), so a ratio taken inside a round
    is free of the host effect that the spread across starts (``noise``) includes. One round per mode,
    repeat and GPU: the median over the workloads both modes measured of mode / default. Rows from
    before the gpu_uuid column use their profile run (one lease, one GPU) as the block.
    """
    measured: dict[tuple[str, str, str], dict[int, tuple[str, dict[str, float]]]] = defaultdict(dict)
    for r in rows:
        vals = {m: r[m] for m in PAIRED_METRICS if r.get(m)}
        measured[(shape, r["workload"], r["mode"])][r["repeat"]] = (r.get("gpu_uuid") or r["run_id"], vals)
    order = {m: i for i, m in enumerate(MODES)}
    return sorted(paired_rounds(measured, PAIRED_METRICS, default), key=lambda p: (order[p.mode], p.repeat))


def paired(shape: str, rows: list[dict[str, Any]]) -> list[list[object]]:
    out: list[list[object]] = []
    for p in paired_rounds_of(shape, rows):
        n = max(k for k, _ in p.ratios.values())
        out.append([shape, p.mode, p.repeat, p.block, n,
                    *(f"{p.ratios[m][1]:.3f}" if m in p.ratios else "-" for m in PAIRED_METRICS)])
    return out


def verdicts(shape: str, rows: list[dict[str, Any]]) -> list[list[object]]:
    """Whether the paired rounds agree: graphmode.selector.paired's verdict, as the report and the card."""
    return [[shape, v.mode, v.metric, ", ".join(f"r{rep} ({n})" for rep, n, _ in v.rounds),
             " · ".join(f"{x:.2f}" for _, _, x in v.rounds), v.verdict]
            for v in paired_verdicts(paired_rounds_of(shape, rows))]


def conditions(shape: str, rows: list[dict[str, Any]]) -> list[list[object]]:
    starts: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("gpu_sm_clock_mhz_mean") is not None or r.get("engine_numa_nodes") is not None:
            starts[(r["run_id"], r["repeat"], r["mode"])].append(r)

    def mean(cs: list[dict[str, Any]], key: str, nd: int = 0) -> str:
        xs = [c[key] for c in cs if c.get(key) is not None]
        return f"{statistics.fmean(xs):.{nd}f}" if xs else "-"

    out: list[list[object]] = []
    for (run, repeat, mode), cs in sorted(starts.items(), key=lambda kv: min(c["started_at"] for c in kv[1])):
        nodes = sorted({c["engine_numa_nodes"] for c in cs if c.get("engine_numa_nodes")})
        gpu_node = next((c["gpu_numa_node"] for c in cs if c.get("gpu_numa_node") is not None), None)
        itl = statistics.median(c["itl_p50"] for c in cs if c["itl_p50"]) * 1e3
        gpu = next((c["gpu_uuid"][4:12] for c in cs if c.get("gpu_uuid")), "-")
        out.append([shape, run, repeat, mode, gpu, len(cs), f"{itl:.2f}", mean(cs, "gpu_sm_clock_mhz_mean"),
                    mean(cs, "gpu_power_w_mean"), mean(cs, "gpu_util_pct_mean"), mean(cs, "host_load_1m"),
                    " ".join(nodes) or "-", "-" if gpu_node is None else gpu_node, mean(cs, "host_probe_ms", 2),
                    mean(cs, "host_steal_pct", 2), mean(cs, "host_busy_pct"), mean(cs, "engine_cpu_cores", 2),
                    mean(cs, "engine_nivcsw_per_s")])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("datasets", nargs="+", type=Path, help="profile datasets, e.g. models/profiles/h200-*.sqlite")
    p.add_argument("--repeats", type=repeat_list, default=None,
                   help="keep only these repeats, e.g. 0,1 (compare modes over the same rounds)")
    a = p.parse_args(argv)
    data = [(shape_name(path), [r for r in read_rows(path) if a.repeats is None or r["repeat"] in a.repeats])
            for path in a.datasets]
    models = sorted({r["host_cpu_model"] for _, rows in data for r in rows if r.get("host_cpu_model")})
    table("Slices: one row per profile run and repeat", ["shape", "run", "repeat", "cells", "engine starts",
          "wall", "startup", "cells' wall", "per cell"], (r for s, rows in data for r in slices(s, rows)))
    table("Noise between engine starts (later start / first start, CV across starts)",
          ["shape", "mode", "workloads", "starts", "ITL p50 ratio", "ITL p50 CV", "TTFT p50 ratio", "TTFT p50 CV"],
          (r for s, rows in data for r in noise(s, rows)))
    table("Medians over workloads of the mean over repeats (ms; graph GiB; start-up s per start)",
          ["shape", "mode", "workloads", "ITL p50", "TPOT p50", "TTFT p50", "graph GiB", "startup s"],
          (r for s, rows in data for r in medians(s, rows)))
    table("Paired inside a round on one GPU: mode / FULL_AND_PIECEWISE, median over the workloads both measured",
          ["shape", "mode", "repeat", "GPU or run", "workloads", "ITL p50 ratio", "TTFT p50 ratio"],
          (r for s, rows in data for r in paired(s, rows)))
    table(f"Across paired rounds (each with ≥ {PAIRED_MIN_WORKLOADS} workloads): lower / higher = beyond "
          f"±{PAIRED_MARGIN:.0%} of the default on the same side in every round",
          ["shape", "mode", "metric", "rounds (workloads)", "mode / default per round", "verdict"],
          (r for s, rows in data for r in verdicts(s, rows)))
    table("Conditions per engine start (median ITL p50 ms; means of SM MHz, W, GPU util %, load, Python probe "
          "ms, steal %, host busy %, vLLM CPU cores, vLLM involuntary switches/s)",
          ["shape", "run", "repeat", "mode", "GPU", "cells", "ITL p50", "SM MHz", "power W", "util %", "load 1m",
           "engine NUMA nodes", "GPU node", "probe ms", "steal %", "busy %", "vLLM cores", "nivcsw/s"],
          (r for s, rows in data for r in conditions(s, rows)))
    if models:
        print("\nHost CPUs: " + "; ".join(models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
