"""``graphmode profile``: measure every CUDA Graph mode across a workload grid."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeAlias

import typer
from rich.console import Console

from graphmode.cli import options as o
from graphmode.cli.common import (
    EXIT_PARTIAL,
    VllmArgsCommand,
    client_reads_text,
    engine_process_text,
    handle_errors,
    jit_text,
    loadgen_text,
    parse_modes,
    running_text,
    spec_decode_text,
    vllm_invocation,
)
from graphmode.selector.frontend import FRONTEND_SATURATED_CORES

if TYPE_CHECKING:  # the profiler's modules load when `graphmode profile` runs, not for --help
    from rich.progress import Progress, TaskID

    from graphmode.core.modes import CudaGraphMode
    from graphmode.core.records import CellRecord, StartupInfo
    from graphmode.profiling.grid import Workload
    from graphmode.profiling.runner import ProfileConfig, ProfileSummary

console = Console(stderr=True)


class RichReporter:
    """Progress over modes × workloads × repeats with an ETA; one line per finished cell."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.task: TaskID = progress.add_task("starting", total=total)

    def mode_starting(self, mode: CudaGraphMode, pending: int) -> None:
        self.progress.update(self.task, description=f"{mode.value}: starting vLLM ({pending} cells)")

    def mode_started(self, mode: CudaGraphMode, startup: StartupInfo) -> None:
        bits = [f"startup {startup.startup_s:.0f} s" if startup.startup_s else "started"]
        if startup.capture_s is not None:
            bits.append(f"capture {startup.capture_s:g} s / {startup.graph_gib} GiB")
        if startup.effective_mode and startup.effective_mode != mode.value:
            bits.append(f"[yellow]vLLM runs {startup.effective_mode}[/]")
        self.progress.console.print(f"[bold]{mode.value}[/]: " + ", ".join(bits))

    def cell_starting(self, mode: CudaGraphMode, workload: Workload, repeat: int) -> None:
        self.progress.update(self.task, description=f"{mode.value} · {workload.name} #{repeat}")

    def cell_finished(self, record: CellRecord) -> None:
        lat = record.latency
        if record.status == "ok":
            itl = f"{lat.itl_p50 * 1e3:.2f} ms" if lat.itl_p50 is not None else "-"
            ttft = f"{lat.ttft_p50 * 1e3:.1f} ms" if lat.ttft_p50 is not None else "-"
            adaptive = lat.stopped_by in ("ci", "max")
            counts = f"{lat.n_ok}/{lat.n_sent} finished in the window" if adaptive else f"{lat.n_ok}/{lat.n_sent} ok"
            msg = f"  ok  {record.mode} {record.workload}#{record.repeat}: ITL p50 {itl}, TTFT p50 {ttft}, {counts}"
            if adaptive and lat.duration_s is not None:
                ci = f"±{lat.itl_p50_ci * 100:.1f}%" if lat.itl_p50_ci is not None else "±?"
                msg += f", {lat.warmup_used_s or 0:.1f}+{lat.duration_s:.1f} s ({lat.stopped_by}, ITL {ci})"
            msg += spec_decode_text(record.features) + jit_text(record) + loadgen_text(record)
            msg += client_reads_text(record) + running_text(record) + engine_process_text(record)
            if (cores := record.features.frontend_cpu_cores) is not None and cores >= FRONTEND_SATURATED_CORES:
                msg += f", [yellow]API server at {cores:.2f} CPU cores: host-bound[/]"
        else:
            first = (record.reason or "").splitlines()[0] if record.reason else ""
            msg = f"  [red]FAILED[/] {record.mode} {record.workload}#{record.repeat}: {first}"
        self.progress.console.print(msg, highlight=False)
        self.progress.advance(self.task)


# Options of profile (the grid) and of profile --race.
Grid: TypeAlias = Annotated[Path | None, typer.Option(
    "--grid", help="Workload grid (YAML/TOML). Default: the bundled grid.")]
Dataset: TypeAlias = Annotated[Path | None, typer.Option("--dataset", help="SQLite dataset to append rows to.")]
Resume: TypeAlias = Annotated[bool, typer.Option("--resume", help="Skip cells that already have an ok row.")]
Port: TypeAlias = Annotated[int | None, typer.Option("--port", min=1, max=65535, help="Port for the vLLM server.")]
LogDir: TypeAlias = Annotated[Path | None, typer.Option("--log-dir", help="Where vLLM server logs go.")]
StartupTimeout: TypeAlias = Annotated[float | None, typer.Option(
    "--startup-timeout", min=1, help="Seconds to wait for /health.")]
DryRun: TypeAlias = Annotated[bool, o.dry_run("Validate and print the plan; start nothing.")]
Race: TypeAlias = Annotated[bool, typer.Option(
    "--race", help="Race resident engines in paired rounds (see --budget-min).")]
Control: TypeAlias = Annotated[bool, typer.Option("--control", help="Race: add a second default engine (A/A arm).")]
BudgetMin: TypeAlias = Annotated[float | None, typer.Option(
    "--budget-min", min=0.1, help="Race: GPU-minutes, starts included.")]
Delta: TypeAlias = Annotated[float | None, typer.Option(
    "--delta", min=0.001, max=0.5, help="Race: margin, relative (0.03).")]
Confidence: TypeAlias = Annotated[float | None, typer.Option(
    "--confidence", min=0.5, max=0.999, help="Race: interval level.")]
MinRounds: TypeAlias = Annotated[int | None, typer.Option(
    "--min-rounds", min=2, help="Race: rounds before any verdict.")]
MaxRounds: TypeAlias = Annotated[int | None, typer.Option(
    "--max-rounds", min=1, help="Race: stop after this many rounds.")]
KvBytes: TypeAlias = Annotated[str | None, typer.Option(
    "--kv-cache-memory-bytes", help="Race: vLLM KV cache per engine.")]
Stagger: TypeAlias = Annotated[float | None, typer.Option(
    "--stagger", min=0, help="Race: seconds between engine starts.")]
CellS: TypeAlias = Annotated[float | None, typer.Option(
    "--cell-s", min=0.5, help="Race: measured seconds per cell.")]
CellWarmupS: TypeAlias = Annotated[float | None, typer.Option(
    "--cell-warmup-s", min=0, help="Race: warm-up per cell, the same on every arm.")]
RaceMetrics: TypeAlias = Annotated[str | None, typer.Option(
    "--race-metrics", help="Race: metrics decided (itl_p50,ttft_p50).")]
Starts: TypeAlias = Annotated[int | None, typer.Option(
    "--starts", min=1, max=10, help="Race: engine starts per arm (2).")]
Replicas: TypeAlias = Annotated[int | None, typer.Option(
    "--replicas", min=1, max=16,
    help="Race: engines of every arm resident at once, R starts in one wave (1: restart waves).")]
WarmCompile: TypeAlias = Annotated[bool | None, typer.Option(
    "--warm-compile/--no-warm-compile",
    help="Race: start an arm with a cold compile cache once, unmeasured, before its first round (on).")]
LoadgenProcesses: TypeAlias = Annotated[int | None, typer.Option(
    "--loadgen-processes", min=1, max=32,
    help="Processes that send a fixed-window cell's load (1; more at hundreds of streams).")]
EngineWarmupS: TypeAlias = Annotated[float | None, typer.Option(
    "--engine-warmup-s", min=0, max=60,
    help="Race: seconds of unmeasured load per workload after every engine start (1.5; 0: none).")]
SizesArms: TypeAlias = Annotated[list[str] | None, typer.Option(
    "--sizes-arm",
    help="Race: NAME=1,2,4,8 (or NAME=@rec.json): the default mode with these capture sizes, raced "
         "against vLLM's default list (repeatable).")]


def _run_grid(config: ProfileConfig, grid_name: str, dry_run: bool) -> ProfileSummary | None:
    """Print the plan, then (unless --dry-run) run the pending cells with a progress bar."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from graphmode.core.dataset import ProfileStore
    from graphmode.profiling.runner import Profiler

    with ProfileStore(config.dataset) as store:
        profiler = Profiler(config, store)
        pending = profiler.pending()
        n_pending = sum(len(v) for v in pending.values())
        console.print(
            f"grid [bold]{grid_name}[/]: {len(config.workloads)} workloads × {len(config.modes)} modes; "
            f"{n_pending} cells to run, dataset {config.dataset} ({store.count()} rows), "
            f"profile key {profiler.key}", highlight=False)
        if dry_run:
            for mode, cells in pending.items():
                names = ", ".join(f"{w.name}#{r}" for w, r in cells) or "(all done)"
                console.print(f"  {mode.value}: {names}", highlight=False)
            console.print("vLLM command: " + shlex.join([*config.command, *config.vllm_args]), highlight=False)
            return None
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=False) as progress:
            profiler.reporter = RichReporter(progress, n_pending)
            return profiler.run()


def _print_summary(summary: ProfileSummary) -> None:
    """The totals and the first failures; exit status 3 when any cell failed."""
    console.print(
        f"done in {summary.wall_s:.0f} s: {summary.ok} ok, {summary.failed} failed, "
        f"{summary.skipped} already done; {summary.engine_starts} engine starts", highlight=False)
    for line in summary.failures[:20]:
        console.print(f"  [red]failed[/] {line.splitlines()[0]}", highlight=False)
    if summary.failed:
        raise typer.Exit(EXIT_PARTIAL)


def profile(
    ctx: typer.Context,
    grid: Grid = None,
    vllm_cmd: o.VllmCmd = None,
    dataset: Dataset = None,
    modes: o.Modes = None,
    workloads: o.Workloads = None,
    repeats: o.Repeats = None,
    resume: Resume = False,
    port: Port = None,
    log_dir: LogDir = None,
    startup_timeout: StartupTimeout = None,
    dry_run: DryRun = False,
    race: Race = False,
    control: Control = False,
    budget_min: BudgetMin = None,
    delta: Delta = None,
    confidence: Confidence = None,
    min_rounds: MinRounds = None,
    max_rounds: MaxRounds = None,
    kv_bytes: KvBytes = None,
    stagger: Stagger = None,
    cell_s: CellS = None,
    cell_warmup_s: CellWarmupS = None,
    metrics: RaceMetrics = None,
    starts: Starts = None,
    replicas: Replicas = None,
    warm_compile: WarmCompile = None,
    loadgen_processes: LoadgenProcesses = None,
    engine_warmup_s: EngineWarmupS = None,
    sizes_arm: SizesArms = None,
) -> None:
    """Start vLLM once per mode and run the workload grid against it; append one row per cell.

    With --race, every mode's engine stays up side by side and the modes take turns per round until
    each is decided against vLLM's default (better / equivalent / worse) or the budget is spent.
    """
    from graphmode.core.settings import load_settings
    from graphmode.profiling.grid import load_grid

    with handle_errors():
        from graphmode.profiling.runner import ProfileConfig

        s = load_settings()
        if race:
            from graphmode.cli.race_view import RaceOptions, run_race

            run_race(ctx, RaceOptions(
                grid=grid, vllm_cmd=vllm_cmd, dataset=dataset, modes=modes, workloads=workloads, port=port,
                log_dir=log_dir, startup_timeout=startup_timeout, dry_run=dry_run, control=control,
                budget_min=budget_min, delta=delta, confidence=confidence, min_rounds=min_rounds,
                max_rounds=max_rounds, kv_cache_memory_bytes=kv_bytes, stagger_s=stagger, cell_s=cell_s,
                cell_warmup_s=cell_warmup_s, metrics=metrics, starts=starts, replicas=replicas,
                warm_compile=warm_compile, engine_warmup_s=engine_warmup_s,
                loadgen_processes=loadgen_processes,
                sizes_arms=list(sizes_arm or [])), s)
            return
        g = load_grid(grid or s.profile.grid)
        selected = g.select([n for n in (workloads or "").split(",") if n])
        command, vllm_args = vllm_invocation(ctx.args, vllm_cmd, s.vllm.argv(), need_model=True)
        config = ProfileConfig.from_settings(
            s, command=command, vllm_args=vllm_args, modes=parse_modes(modes), workloads=selected,
            dataset=dataset, log_dir=log_dir, port=port, resume=resume, repeats=repeats,
            startup_timeout_s=startup_timeout, loadgen_processes=loadgen_processes)
        summary = _run_grid(config, g.name, dry_run)
        if summary is not None:
            _print_summary(summary)


def register(app: typer.Typer) -> None:
    """Add ``graphmode profile`` to the app."""
    app.command(
        cls=VllmArgsCommand,
        epilog="Everything after -- goes to vLLM unchanged (model, --max-model-len, ...).",
    )(profile)
