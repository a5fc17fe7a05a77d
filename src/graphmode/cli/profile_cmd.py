"""``graphmode profile``: measure every CUDA Graph mode across a workload grid."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from graphmode.cli.common import (
    EXIT_PARTIAL,
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
from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import CellRecord, StartupInfo
from graphmode.core.settings import load_settings
from graphmode.profiling.grid import Workload, load_grid
from graphmode.selector.frontend import FRONTEND_SATURATED_CORES

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


def register(app: typer.Typer) -> None:
    @app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        epilog="Everything after -- goes to vLLM unchanged (model, --max-model-len, ...).",
    )
    def profile(
        ctx: typer.Context,
        grid: Path = typer.Option(None, "--grid", help="Workload grid (YAML/TOML). Default: the bundled grid."),
        vllm_cmd: str = typer.Option(None, "--vllm-cmd", help="Command prefix that starts vLLM."),
        dataset: Path = typer.Option(None, "--dataset", help="SQLite dataset to append rows to."),
        modes: str = typer.Option(None, "--modes", help="Comma-separated modes (default: all five)."),
        workloads: str = typer.Option(None, "--workloads", help="Comma-separated workload names."),
        repeats: int = typer.Option(None, "--repeats", min=1, max=20, help="Override every workload's repeats."),
        resume: bool = typer.Option(False, "--resume", help="Skip cells that already have an ok row."),
        port: int = typer.Option(None, "--port", min=1, max=65535, help="Port for the vLLM server."),
        log_dir: Path = typer.Option(None, "--log-dir", help="Where vLLM server logs go."),
        startup_timeout: float = typer.Option(None, "--startup-timeout", min=1, help="Seconds to wait for /health."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print the plan; start nothing."),
        race: bool = typer.Option(False, "--race", help="Race resident engines in paired rounds (see --budget-min)."),
        control: bool = typer.Option(False, "--control", help="Race: add a second default engine (A/A arm)."),
        budget_min: float = typer.Option(None, "--budget-min", min=0.1, help="Race: GPU-minutes, starts included."),
        delta: float = typer.Option(None, "--delta", min=0.001, max=0.5, help="Race: margin, relative (0.03)."),
        confidence: float = typer.Option(None, "--confidence", min=0.5, max=0.999, help="Race: interval level."),
        min_rounds: int = typer.Option(None, "--min-rounds", min=2, help="Race: rounds before any verdict."),
        max_rounds: int = typer.Option(None, "--max-rounds", min=1, help="Race: stop after this many rounds."),
        kv_bytes: str = typer.Option(None, "--kv-cache-memory-bytes", help="Race: vLLM KV cache per engine."),
        stagger: float = typer.Option(None, "--stagger", min=0, help="Race: seconds between engine starts."),
        cell_s: float = typer.Option(None, "--cell-s", min=0.5, help="Race: measured seconds per cell."),
        cell_warmup_s: float = typer.Option(None, "--cell-warmup-s", min=0,
                                            help="Race: warm-up per cell, the same on every arm."),
        metrics: str = typer.Option(None, "--race-metrics", help="Race: metrics decided (itl_p50,ttft_p50)."),
        starts: int = typer.Option(None, "--starts", min=1, max=10, help="Race: engine starts per arm (2)."),
        replicas: int = typer.Option(
            None, "--replicas", min=1, max=16,
            help="Race: engines of every arm resident at once, R starts in one wave (1: restart waves)."),
        warm_compile: bool = typer.Option(
            None, "--warm-compile/--no-warm-compile",
            help="Race: start an arm with a cold compile cache once, unmeasured, before its first round (on)."),
        loadgen_processes: int = typer.Option(
            None, "--loadgen-processes", min=1, max=32,
            help="Processes that send a fixed-window cell's load (1; more at hundreds of streams)."),
        engine_warmup_s: float = typer.Option(
            None, "--engine-warmup-s", min=0, max=60,
            help="Race: seconds of unmeasured load per workload after every engine start (1.5; 0: none)."),
        sizes_arm: list[str] = typer.Option(
            None, "--sizes-arm",
            help="Race: NAME=1,2,4,8 (or NAME=@rec.json): the default mode with these capture sizes, raced "
                 "against vLLM's default list (repeatable)."),
    ) -> None:
        """Start vLLM once per mode and run the workload grid against it; append one row per cell. With --race,
        every mode's engine stays up side by side and the modes take turns per round until each is decided
        against vLLM's default (better / equivalent / worse) or the budget is spent."""
        with handle_errors():
            # the profile extra (aiohttp, psutil, scipy): loaded when `graphmode profile` runs, not for the CLI
            from graphmode.cli.race_view import RaceOptions, run_race
            from graphmode.profiling.runner import ProfileConfig, Profiler

            s = load_settings()
            if race:
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
            grid_path = grid or s.profile.grid
            g = load_grid(grid_path)
            selected = g.select([n for n in (workloads or "").split(",") if n])
            mode_list = parse_modes(modes)
            command, vllm_args = vllm_invocation(ctx.args, vllm_cmd, s.vllm.argv(), need_model=True)
            config = ProfileConfig.from_settings(
                s, command=command, vllm_args=vllm_args, modes=mode_list, workloads=selected, dataset=dataset,
                log_dir=log_dir, port=port, resume=resume, repeats=repeats, startup_timeout_s=startup_timeout,
                loadgen_processes=loadgen_processes)
            with ProfileStore(config.dataset) as store:
                profiler = Profiler(config, store)
                pending = profiler.pending()
                n_pending = sum(len(v) for v in pending.values())
                console.print(
                    f"grid [bold]{g.name}[/]: {len(selected)} workloads × {len(mode_list)} modes; "
                    f"{n_pending} cells to run, dataset {config.dataset} ({store.count()} rows), "
                    f"profile key {profiler.key}", highlight=False)
                if dry_run:
                    _print_plan(pending, [*command, *vllm_args])
                    return
                with _progress() as progress:
                    profiler.reporter = RichReporter(progress, n_pending)
                    summary = profiler.run()
            console.print(
                f"done in {summary.wall_s:.0f} s: {summary.ok} ok, {summary.failed} failed, "
                f"{summary.skipped} already done; {summary.engine_starts} engine starts", highlight=False)
            for line in summary.failures[:20]:
                console.print(f"  [red]failed[/] {line.splitlines()[0]}", highlight=False)
            if summary.failed:
                raise typer.Exit(EXIT_PARTIAL)


def _print_plan(pending: Mapping[CudaGraphMode, Sequence[tuple[Workload, int]]], vllm: list[str]) -> None:
    """--dry-run: the cells each mode still has to run, and the vLLM command."""
    for mode, cells in pending.items():
        names = ", ".join(f"{w.name}#{r}" for w, r in cells) or "(all done)"
        console.print(f"  {mode.value}: {names}", highlight=False)
    console.print("vLLM command: " + shlex.join(vllm), highlight=False)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)
