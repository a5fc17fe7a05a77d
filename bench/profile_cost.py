#!/usr/bin/env python3
"""What a profile run costs: wall time, engine starts, start-up and load time per mode, seconds per cell.

graphmode starts vLLM once per mode and runs every pending cell of that mode against it, so start-up
(model load + torch.compile + graph capture, minutes on a real GPU) is paid once per mode, not once per
cell. This runs a profile and prints where the time went, to show exactly that.

Without ``--vllm-cmd`` it profiles ``tests/support/fake_vllm.py`` (stdlib only, runs anywhere, seconds);
with it, a real vLLM::

    .venv/bin/python bench/profile_cost.py
    .venv/bin/python bench/profile_cost.py --modes NONE,FULL --fake-startup-s 2
    .venv/bin/python bench/profile_cost.py --vllm-cmd "vllm serve" --grid bench/grids/h200-slice1.yaml \\
        --dataset runs/slice1.sqlite -- /models/llama-1b --max-model-len 4096

Everything after ``--`` goes to vLLM unchanged (the fake needs nothing; it gets ``--model fake-model``).

``--compare`` reads datasets instead and sets a race (``graphmode profile --race``) against a grid on the
same model shape: GPU-minutes (engine starts included), cells, engine starts, and for a race its rounds::

    .venv/bin/python bench/profile_cost.py --compare models/profiles/race-h200-qwen2.5-0.5b.sqlite \
        models/profiles/h200-qwen2.5-0.5b.sqlite

A grid's GPU time is, per engine start (run, mode, repeat), its start-up plus first cell start to last cell
end; a race's, per session, from the session's start (engines start overlapped) to its last cell, or the
span its dataset's meta table recorded.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
try:
    import graphmode  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(BENCH.parent / "src"))

from graphmode.core.dataset import ProfileStore  # noqa: E402
from graphmode.core.modes import ALL_MODES, CudaGraphMode, parse_mode  # noqa: E402
from graphmode.core.records import CellRecord, StartupInfo  # noqa: E402
from graphmode.profiling.grid import Workload, load_grid  # noqa: E402
from graphmode.profiling.runner import ProfileConfig, Profiler, ProfileSummary  # noqa: E402

FAKE_VLLM = BENCH.parent / "tests" / "support" / "fake_vllm.py"
# Small enough for the fake to finish in well under a minute over all five modes.
SMOKE_GRID = """\
name: cost-smoke
defaults: {duration_s: 2, warmup_s: 0.5}
workloads:
  - {name: smoke-prefill, rate: 8, burstiness: 1.0, input: {mean: 512, spread: 0.2}, output: {mean: 8}}
  - {name: smoke-decode, rate: 4, burstiness: 0.5, input: {mean: 32}, output: {mean: 64, spread: 0.2}}
"""


@dataclass
class ModeCost:
    """Seconds summed over every engine start of one mode (one per repeat since repeats are fresh starts)."""

    starts: int = 0
    ok: int = 0
    failed: int = 0
    startup_s: float = 0.0
    load_s: float = 0.0
    total_s: float = 0.0
    cell_s: list[float] = field(default_factory=list)
    t_starting: float | None = None  # of the start in progress
    t_started: float | None = None
    t_last_cell: float | None = None


class CostReporter:
    """A :class:`graphmode.profiling.runner.Reporter` that keeps timestamps instead of printing."""

    def __init__(self, verbose: bool = True) -> None:
        self.modes: dict[str, ModeCost] = {}
        self.verbose = verbose
        self._current: str | None = None
        self._cell_t0: float | None = None

    def _close_current(self, now: float) -> None:
        if self._current is None:
            return
        c = self.modes[self._current]
        if c.t_starting is not None:
            c.total_s += now - c.t_starting
        if c.t_started is not None and c.t_last_cell is not None:
            c.load_s += c.t_last_cell - c.t_started
        c.t_starting = c.t_started = c.t_last_cell = None
        self._current = None

    def mode_starting(self, mode: CudaGraphMode, pending: int) -> None:
        now = time.monotonic()
        self._close_current(now)
        self._current = mode.value
        cost = self.modes.setdefault(mode.value, ModeCost())
        cost.starts += 1
        cost.t_starting = now
        self._say(f"{mode.value}: starting the engine for {pending} cells")

    def mode_started(self, mode: CudaGraphMode, startup: StartupInfo) -> None:
        cost = self.modes[mode.value]
        cost.t_started = time.monotonic()
        cost.startup_s += startup.startup_s or (cost.t_started - (cost.t_starting or cost.t_started))
        self._say(f"{mode.value}: healthy after {startup.startup_s} s")

    def cell_starting(self, mode: CudaGraphMode, workload: Workload, repeat: int) -> None:
        self._cell_t0 = time.monotonic()

    def cell_finished(self, record: CellRecord) -> None:
        now = time.monotonic()
        cost = self.modes.setdefault(record.mode, ModeCost())
        if record.status == "ok":
            cost.ok += 1
        else:
            cost.failed += 1
        if self._cell_t0 is not None:  # cells failed in bulk after a crash have no start of their own
            cost.cell_s.append(now - self._cell_t0)
            self._cell_t0 = None
        cost.t_last_cell = now
        first = (record.reason or "").splitlines()[0] if record.reason else ""
        self._say(f"  {record.status:6s} {record.mode} {record.workload}#{record.repeat} {first}".rstrip())

    def finish(self) -> None:
        self._close_current(time.monotonic())

    def _say(self, msg: str) -> None:
        if self.verbose:
            print(msg, file=sys.stderr, flush=True)


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def cost_table(summary: ProfileSummary, reporter: CostReporter) -> str:
    head = ["mode", "engine starts", "cells ok/failed", "startup s", "load s", "s/cell", "stop+other s", "total s"]
    rows: list[list[str]] = []
    for mode, c in reporter.modes.items():
        per_cell = (sum(c.cell_s) / len(c.cell_s)) if c.cell_s else None
        other = c.total_s - c.startup_s - c.load_s if c.total_s else None
        rows.append([mode, str(c.starts), f"{c.ok}/{c.failed}", _fmt(c.startup_s or None), _fmt(c.load_s or None),
                     _fmt(per_cell, ".2f"), _fmt(other), _fmt(c.total_s or None)])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:  # the mode left-aligned, numbers right-aligned
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in pairs)

    lines = [line(head), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]

    cells = summary.ok + summary.failed
    starts_per_mode = sorted({c.starts for c in reporter.modes.values()})
    startup_total = sum(c.startup_s for c in reporter.modes.values())
    per_cell_starts = sum(c.startup_s / c.starts * (c.ok + c.failed) for c in reporter.modes.values() if c.starts)
    lines += [
        "",
        f"wall time        {summary.wall_s:.1f} s",
        f"engine starts    {summary.engine_starts} for {len(reporter.modes)} modes "
        f"(per mode: {', '.join(map(str, starts_per_mode)) or '-'})",
        f"cells            {cells} run ({summary.ok} ok, {summary.failed} failed), {summary.skipped} already done",
        f"startup total    {startup_total:.1f} s "
        f"({100 * startup_total / summary.wall_s:.0f} % of wall time)" if summary.wall_s else "startup total    -",
        f"seconds per cell {summary.wall_s / cells:.2f} s overall" if cells else "seconds per cell -",
        f"a start per cell would have added about {max(0.0, per_cell_starts - startup_total):.0f} s of start-up",
    ]
    return "\n".join(lines)


@dataclass
class DatasetCost:
    kind: str  # "race" or "grid"
    shape: str
    gpu_s: float = 0.0
    cells: int = 0
    failed: int = 0
    starts: int = 0
    rounds: int = 0
    modes: set[str] = field(default_factory=set)
    starts_wall_s: float = 0.0  # race: time to bring each session's engines up, overlapped
    startup_sum_s: float = 0.0  # race: the same engines' start-up times added up
    idle_cpu: list[float] = field(default_factory=list)  # race: CPU s/s of engines waiting their turn
    idle_gpu: list[float] = field(default_factory=list)  # race: GPU util % with every engine idle


def _shape_name(row: dict[str, object]) -> str:
    """``LlamaForCausalLM 1.24B``, then what sets the row's deployment apart from vLLM's defaults
    (``attn=FLASHINFER``, ``spec=ngram:3``...): one shape raced under two configurations is two entries."""
    from graphmode.core.deployment import config_suffix
    from graphmode.selector.featurize import shape_of_row

    arch = row.get("fp_model_architecture") or "?"
    params = row.get("fp_num_params_b")
    name = f"{arch} {float(params):.2f}B" if isinstance(params, int | float) else str(arch)
    suffix = config_suffix(shape_of_row(row))
    return f"{name} {suffix}" if suffix else name


def dataset_costs(path: Path) -> list[DatasetCost]:
    """Race and grid costs per model shape in one dataset (see the module docstring)."""
    import json

    with ProfileStore(path, readonly=True) as store:
        rows = store.rows()
        meta = store.meta("race-session:")
    out: dict[tuple[str, str], DatasetCost] = {}
    starts: dict[tuple[str, str], dict[tuple[object, ...], list[float]]] = {}
    sessions: dict[tuple[str, str], dict[str, list[float]]] = {}
    race_ids: dict[str, tuple[str, str]] = {}
    for r in rows:
        kind = "race" if r.get("race_round") is not None else "grid"
        key = (kind, _shape_name(r))
        c = out.setdefault(key, DatasetCost(kind, key[1]))
        c.cells += r["status"] == "ok"
        c.failed += r["status"] != "ok"
        c.modes.add(str(r.get("race_arm") or r["mode"]))
        t0, t1 = float(r["started_at"]), float(r["finished_at"])
        if kind == "grid":
            span = starts.setdefault(key, {}).setdefault((r["run_id"], r["mode"], r["repeat"]),
                                                         [t0, t1, float(r.get("startup_s") or 0.0)])
            span[0], span[1] = min(span[0], t0), max(span[1], t1)
        else:
            race_ids[str(r.get("race_id"))] = key
            session = sessions.setdefault(key, {}).setdefault(f"{r.get('race_id')}:{r['run_id']}", [t0, t1])
            session[0] = min(session[0], float(r.get("race_session_t0") or t0))
            session[1] = max(session[1], t1)
    for name, value in meta.items():  # sessions' spans as the race recorded them, rows or not
        _, race_id, run_id = name.split(":", 2)
        found = race_ids.get(race_id)
        if found is not None:
            a, b = json.loads(value)
            span = sessions.setdefault(found, {}).setdefault(f"{race_id}:{run_id}", [a, b])
            span[0], span[1] = min(span[0], a), max(span[1], b)
    for key, by_start in starts.items():
        out[key].starts = len(by_start)
        out[key].gpu_s = sum(t1 - t0 + startup for t0, t1, startup in by_start.values())
    for key, by_session in sessions.items():
        out[key].gpu_s = sum(t1 - t0 for t0, t1 in by_session.values())
        raced = [r for r in rows if r.get("race_round") is not None and _shape_name(r) == key[1]]
        out[key].starts = len({r.get("race_start_id") for r in raced})
        out[key].rounds = len({(r.get("race_id"), r.get("race_round")) for r in raced})
        walls = {r["run_id"]: float(r["race_starts_wall_s"]) for r in raced if r.get("race_starts_wall_s")}
        startups = {r.get("race_start_id"): float(r["startup_s"]) for r in raced if r.get("startup_s")}
        out[key].starts_wall_s, out[key].startup_sum_s = sum(walls.values()), sum(startups.values())
        out[key].idle_cpu = [float(r["race_idle_cpu_cores"]) for r in raced if r.get("race_idle_cpu_cores") is not None]
        out[key].idle_gpu = [float(r["race_idle_gpu_util_pct"]) for r in raced
                             if r.get("race_idle_gpu_util_pct") is not None]
    return sorted(out.values(), key=lambda c: (c.shape, c.kind))


def compare_table(costs: list[DatasetCost]) -> str:
    head = f"{'shape':<28} {'kind':<5} {'GPU-min':>8} {'cells':>6} {'failed':>6} {'starts':>6} {'rounds':>6}  modes"
    lines = [head, "-" * len(head)]
    for c in costs:
        lines.append(f"{c.shape:<28} {c.kind:<5} {c.gpu_s / 60:8.1f} {c.cells:6d} {c.failed:6d} {c.starts:6d} "
                     f"{c.rounds or '-':>6}  {','.join(sorted(c.modes))}")
    for c in costs:
        if c.kind != "race":
            continue
        if c.startup_sum_s:
            lines.append(f"{c.shape}: overlapped starts took {c.starts_wall_s:.0f} s for {c.startup_sum_s:.0f} s of "
                         f"start-up added up ({c.starts_wall_s / c.startup_sum_s:.0%})")
        if c.idle_cpu:
            q = statistics.quantiles(c.idle_cpu, n=10) if len(c.idle_cpu) > 1 else [c.idle_cpu[0]] * 9
            lines.append(f"{c.shape}: engines waiting their turn used {statistics.median(c.idle_cpu):.2f} CPU cores "
                         f"(median; 90th percentile {q[-1]:.2f}, max {max(c.idle_cpu):.2f})")
        if c.idle_gpu:
            lines.append(f"{c.shape}: GPU utilisation with every engine idle {statistics.median(c.idle_gpu):.0f}% "
                         f"(median; max {max(c.idle_gpu):.0f}%)")
    return "\n".join(lines)


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    vllm_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, vllm_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Everything after -- goes to vLLM unchanged.")
    p.add_argument("--vllm-cmd", help="command prefix that starts vLLM (default: tests/support/fake_vllm.py)")
    p.add_argument("--grid", type=Path, help="workload grid, YAML or TOML (default: a 2-workload smoke grid)")
    p.add_argument("--workloads", help="comma-separated workload names from the grid")
    p.add_argument("--modes", help="comma-separated cudagraph modes (default: all five)")
    p.add_argument("--dataset", type=Path, help="SQLite dataset (default: a fresh temporary file)")
    p.add_argument("--resume", action="store_true", help="skip cells the dataset already has")
    p.add_argument("--repeats", type=int, help="override every workload's repeats")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--log-dir", type=Path, help="server logs (default: next to the dataset)")
    p.add_argument("--startup-timeout", type=float, default=1800.0)
    p.add_argument("--fake-startup-s", type=float, default=1.0,
                   help="seconds the fake pretends load+capture take (default 1; ignored with --vllm-cmd)")
    p.add_argument("--quiet", action="store_true", help="no per-cell lines on stderr")
    p.add_argument("--compare", nargs="+", type=Path, metavar="DATASET",
                   help="profile nothing: compare race and grid cost per model shape in these datasets")
    return p.parse_args(argv), vllm_args


def main(argv: list[str] | None = None) -> int:
    args, vllm_args = _parse(sys.argv[1:] if argv is None else argv)
    if args.compare:
        print(compare_table([c for path in args.compare for c in dataset_costs(path)]))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="graphmode-cost-"))
    env: dict[str, str] = {}
    if args.vllm_cmd:
        command = shlex.split(args.vllm_cmd)
    else:
        command = [sys.executable, str(FAKE_VLLM)]
        vllm_args = vllm_args or ["--model", "fake-model"]
        env["FAKE_VLLM_STARTUP_S"] = str(args.fake_startup_s)
    grid_path = args.grid
    if grid_path is None:
        grid_path = tmp / "cost-smoke.yaml"
        grid_path.write_text(SMOKE_GRID, encoding="utf-8")
    grid = load_grid(grid_path)
    workloads = grid.select([n for n in (args.workloads or "").split(",") if n])
    modes = [parse_mode(m) for m in args.modes.split(",") if m.strip()] if args.modes else list(ALL_MODES)
    dataset = args.dataset or tmp / "profile.sqlite"
    log_dir = args.log_dir or dataset.parent / "logs"

    config = ProfileConfig(
        command=command, vllm_args=vllm_args, modes=modes, workloads=workloads, dataset=dataset, log_dir=log_dir,
        port=args.port, resume=args.resume, repeats=args.repeats, startup_timeout_s=args.startup_timeout,
        scrape_interval_s=0.25 if not args.vllm_cmd else 0.5, env=env,
    )
    print(f"profiling {shlex.join([*command, *vllm_args])}\n"
          f"grid {grid.name}: {len(workloads)} workloads x {len(modes)} modes; dataset {dataset}; logs {log_dir}",
          file=sys.stderr, flush=True)
    reporter = CostReporter(verbose=not args.quiet)
    with ProfileStore(dataset) as store:
        summary = Profiler(config, store, reporter).run()
    reporter.finish()
    print(cost_table(summary, reporter))
    for line in summary.failures[:10]:
        print(f"failed: {line.splitlines()[0]}")
    return 0 if summary.failed == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
