"""``graphmode profile --race``: build the race from options and settings, and show it as it runs.

On a terminal a live table (rich) shows the round, each arm's verdicts so far and the GPU-minutes spent;
otherwise (a log file, the GPU host's background races) one plain line per event.
"""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from graphmode.cli.common import (
    EXIT_PARTIAL,
    client_reads_text,
    engine_process_text,
    jit_text,
    loadgen_text,
    parse_modes,
    running_text,
    spec_decode_text,
    vllm_invocation,
)
from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import ConfigError
from graphmode.core.records import CellRecord
from graphmode.core.settings import Settings
from graphmode.profiling.grid import Workload, load_grid
from graphmode.profiling.race import Arm, RaceConfig, Racer, RaceSummary, check_replicas
from graphmode.profiling.race_rounds import KNOWN_RACE_METRICS, ArmVerdicts
from graphmode.profiling.race_sizes import parse_sizes_arm
from graphmode.profiling.runner import ProfileConfig
from graphmode.profiling.sequential import SequentialRule

console = Console(stderr=True, soft_wrap=True)


@dataclass
class RaceOptions:
    grid: Path | None = None
    vllm_cmd: str | None = None
    dataset: Path | None = None
    modes: str | None = None
    workloads: str | None = None
    port: int | None = None
    log_dir: Path | None = None
    startup_timeout: float | None = None
    dry_run: bool = False
    control: bool = False
    budget_min: float | None = None
    delta: float | None = None
    confidence: float | None = None
    min_rounds: int | None = None
    max_rounds: int | None = None
    kv_cache_memory_bytes: str | None = None
    stagger_s: float | None = None
    cell_s: float | None = None
    cell_warmup_s: float | None = None
    metrics: str | None = None
    starts: int | None = None
    replicas: int | None = None
    warm_compile: bool | None = None
    engine_warmup_s: float | None = None
    loadgen_processes: int | None = None
    sizes_arms: list[str] = field(default_factory=list)  # --sizes-arm NAME=SIZES


T = TypeVar("T")


def _pick(value: T | None, default: T) -> T:
    return default if value is None else value


def race_config(args: list[str], o: RaceOptions, s: Settings) -> RaceConfig:
    r = s.race
    g = load_grid(o.grid or r.grid)
    selected = g.select([n for n in (o.workloads or "").split(",") if n])
    metrics = tuple(m for m in (o.metrics.split(",") if o.metrics else r.metrics) if m.strip())
    unknown = [m for m in metrics if m not in KNOWN_RACE_METRICS]
    if unknown or not metrics:
        raise ConfigError(f"--race-metrics: {', '.join(unknown) or 'none given'}; "
                          f"known: {', '.join(KNOWN_RACE_METRICS)}")
    command, vllm_args = vllm_invocation(args, o.vllm_cmd, s.vllm.argv(), need_model=True)
    profile = ProfileConfig(
        command=command, vllm_args=vllm_args, modes=parse_modes(o.modes), workloads=selected,
        dataset=o.dataset or s.profile.dataset, log_dir=o.log_dir or s.profile.log_dir, host=s.vllm.host,
        port=o.port or s.vllm.port, resume=True, scrape_interval_s=s.profile.scrape_interval_s,
        startup_timeout_s=o.startup_timeout or s.vllm.startup_timeout_s, stop_timeout_s=s.vllm.stop_timeout_s,
        connect_timeout_s=s.vllm.connect_timeout_s, read_timeout_s=s.vllm.read_timeout_s,
        loadgen_processes=o.loadgen_processes or s.profile.loadgen_processes,
    )
    replicas = _pick(o.replicas, r.replicas)
    # replicas give every arm R starts at once: the default --starts (2, restart waves) gives way to them
    starts = _pick(o.starts, r.starts if replicas == 1 else replicas)
    try:
        check_replicas(replicas, starts, o.control)
        # α spent over the looks (a look every round): a verdict the race stops on has its stated error rate,
        # the same rule the selector's verdicts use
        rule = SequentialRule(delta=_pick(o.delta, r.delta), confidence=_pick(o.confidence, r.confidence),
                              min_rounds=_pick(o.min_rounds, r.min_rounds), start_margin=r.start_margin,
                              spend=True)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(str(exc)) from None
    return RaceConfig(
        profile=profile, rule=rule, metrics=metrics, budget_min=_pick(o.budget_min, r.budget_min),
        max_rounds=_pick(o.max_rounds, r.max_rounds), control=o.control,
        kv_cache_memory_bytes=_pick(o.kv_cache_memory_bytes, r.kv_cache_memory_bytes),
        gpu_memory_utilization=r.gpu_memory_utilization, stagger_s=_pick(o.stagger_s, r.stagger_s),
        cell_s=_pick(o.cell_s, r.cell_s), warmup_s=_pick(o.cell_warmup_s, r.warmup_s),
        idle_probe_s=r.idle_probe_s, starts=starts, block_rounds=r.block_rounds, replicas=replicas,
        warm_compile=_pick(o.warm_compile, r.warm_compile),
        engine_warmup_s=_pick(o.engine_warmup_s, r.engine_warmup_s),
        sizes_arms=tuple(parse_sizes_arm(t) for t in o.sizes_arms),
    )


def _fmt_ms(v: float | None) -> str:
    return f"{v * 1e3:.2f} ms" if v is not None else "-"


class PlainRaceReporter:
    """One line per event, for logs."""

    def __init__(self, out: Console) -> None:
        self.out = out

    def _p(self, msg: str) -> None:
        self.out.print(msg, highlight=False, markup=False)

    def compile_starting(self, arms: Sequence[Arm]) -> None:
        self._p("compile start (cold compile cache; measures nothing): "
                + ", ".join(f"{a.label} (port {a.port})" for a in arms))

    def compiled(self, arm: Arm) -> None:
        self._p(f"{arm.label}: compiled, up in {arm.startup.startup_s or 0:.0f} s; stopped for its measured start")

    def engines_starting(self, arms: Sequence[Arm]) -> None:
        self._p("starting " + ", ".join(f"{a.label} (port {a.port})" for a in arms))

    def engine_started(self, arm: Arm) -> None:
        st = arm.startup
        bits = [f"{arm.label}: up in {st.startup_s or 0:.0f} s"]
        if st.effective_mode and st.effective_mode != arm.mode.value:
            bits.append(f"runs as {st.effective_mode} (vLLM downgraded it)")
        if st.graph_gib is not None:
            beside = (st.start_wave_engines or 1) - 1
            bits.append(f"graphs {st.graph_gib} GiB" if beside <= 0 else
                        f"vLLM's graph GiB {st.graph_gib} (device-wide, {beside} engine{'s' if beside != 1 else ''} "
                        "starting beside it)")
        if st.engine_gpu_gib is not None:
            bits.append(f"its own GPU memory {st.engine_gpu_gib:.2f} GiB")
        elif st.start_wave_engines is not None:
            bits.append("its own GPU memory unknown (no NVML, or NVML lists none of its processes)")
        self._p(", ".join(bits))

    def engine_failed(self, arm: Arm) -> None:
        self._p(f"{arm.label}: FAILED: {(arm.failure or '').splitlines()[0] if arm.failure else ''}")

    def round_starting(self, round_: int, workload: Workload, order: Sequence[Arm]) -> None:
        self._p(f"round {round_}: {workload.name}: " + " → ".join(a.label for a in order))

    def cell_finished(self, record: CellRecord) -> None:
        lat = record.latency
        arm = record.race.arm or record.mode
        if record.status == "ok":
            self._p(f"  {arm}: ITL p50 {_fmt_ms(lat.itl_p50)}, TTFT p50 {_fmt_ms(lat.ttft_p50)}, "
                    f"{lat.n_ok}/{lat.n_sent} done" + spec_decode_text(record.features) + jit_text(record, race=True)
                    + loadgen_text(record) + client_reads_text(record) + running_text(record)
                    + engine_process_text(record))
        else:
            self._p(f"  {arm}: FAILED {(record.reason or '').splitlines()[0] if record.reason else ''}")

    def round_finished(self, round_: int, verdicts: dict[str, ArmVerdicts], spent_min: float) -> None:
        bits = [f"{a} {m}={d.verdict}" + (f"({d.ratio:.3f})" if d.ratio else "")
                for a, v in verdicts.items() for m, d in v.pooled.items()]
        self._p(f"round {round_} done, {spent_min:.1f} GPU-min: " + ", ".join(bits))

    def engine_stopped(self, arm: Arm) -> None:
        self._p(f"{arm.label}: engine stopped ({arm.stop_reason})")

    def wave_skipped(self, wave: Sequence[Arm], left_s: float, need_s: float) -> None:
        self._p(f"no restart of {', '.join(a.name for a in wave)}: {left_s:.0f} s of budget left, a wave and its "
                f"rounds take ~{need_s:.0f} s; rounds go on with the starts up")


class LiveRaceReporter(PlainRaceReporter):
    """The plain lines scroll above a live table of verdicts so far."""

    def __init__(self, out: Console, metrics: Sequence[str], replicas: int = 1) -> None:
        super().__init__(out)
        self.metrics = list(metrics)
        self.replicas = replicas
        self.live: Live | None = None
        self.state = "starting engines"
        self.verdicts: dict[str, ArmVerdicts] = {}
        self.spent = 0.0

    def table(self) -> Table:
        each = f" · {self.replicas} replicas per arm" if self.replicas > 1 else ""
        t = Table(title=f"race: {self.state} · {self.spent:.1f} GPU-min{each}", title_justify="left")
        t.add_column("arm")
        for m in self.metrics:
            t.add_column(m)
        for arm, v in self.verdicts.items():
            t.add_row(arm, *[_cell(v.pooled[m].verdict, v.pooled[m].ratio, v.pooled[m].lo, v.pooled[m].hi)
                             if m in v.pooled else "-" for m in self.metrics])
        return t

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self.table())

    def compile_starting(self, arms: Sequence[Arm]) -> None:
        super().compile_starting(arms)
        self.state = f"compile start of {len(arms)} engine{'s' if len(arms) != 1 else ''} (cold caches)"
        self._refresh()

    def engines_starting(self, arms: Sequence[Arm]) -> None:
        super().engines_starting(arms)
        self.state = f"starting {len(arms)} engine{'s' if len(arms) != 1 else ''}"
        self._refresh()

    def round_starting(self, round_: int, workload: Workload, order: Sequence[Arm]) -> None:
        super().round_starting(round_, workload, order)
        self.state = f"round {round_} ({workload.name})"
        self._refresh()

    def round_finished(self, round_: int, verdicts: dict[str, ArmVerdicts], spent_min: float) -> None:
        self.verdicts, self.spent = verdicts, spent_min
        self._refresh()


def _cell(verdict: str, ratio: float | None, lo: float | None, hi: float | None) -> str:
    color = {"better": "green", "worse": "red", "equivalent": "cyan"}.get(verdict, "yellow")
    num = f" {ratio:.3f}×" if ratio is not None else ""
    ci = f" [{lo:.2f}–{hi:.2f}]" if lo is not None and hi is not None else ""
    return f"[{color}]{verdict}[/]{num}{ci}"


def print_summary(summary: RaceSummary, out: Console) -> None:
    out.print(f"race {summary.race_id}: {summary.stop_reason}; {summary.rounds_run} rounds this session "
              f"({summary.rounds_before} before), {summary.cells_ok} cells ok, {summary.cells_failed} failed, "
              f"{summary.engine_starts} engine starts ({summary.restarts} restarts, {summary.restart_wall_s:.0f} s), "
              f"{summary.compile_starts} compile starts ({summary.compile_wall_s:.0f} s), "
              f"engine warm-ups {summary.warmup_wall_s:.0f} s, "
              + ("restart waves stopped by the budget, " if summary.waves_skipped else "")
              + f"{summary.gpu_min:.1f} GPU-min "
              f"({summary.gpu_min_total:.1f} in all)", highlight=False, markup=False)
    for line in summary.lines():
        out.print("  " + line, highlight=False, markup=False)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the race's finally: every engine is stopped


def run_race(ctx: typer.Context, o: RaceOptions, s: Settings) -> None:
    config = race_config(list(ctx.args), o, s)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_term)
    with ProfileStore(config.profile.dataset) as store:
        racer = Racer(config, store)
        racer.check_fit()  # a dry run says it too, before GPU time is spent on engines that cannot all start
        arms = ", ".join(f"{a.name}:{a.port}" for a in racer.arms)
        if config.replicas > 1:
            ports = ", ".join(f"{a.name}:{','.join(str(e.port) for e in racer.replicas[a.name])}" for a in racer.arms)
            kv = f" × KV {config.kv_cache_memory_bytes}" if config.kv_cache_memory_bytes else ""
            starts = (f"{config.replicas} replicas per arm, {len(racer.engines)} engines resident "
                      f"({len(racer.arms)} arms × {config.replicas}{kv}), one start wave, no restarts")
            arms = ports
        else:
            starts = f"{config.starts} starts per arm"
        console.print(f"race {racer.key}: {arms}; {len(racer.cells)} workloads "
                      f"({', '.join(w.name for w in racer.order)}); {racer.rounds_before} rounds already "
                      f"measured; {starts}"
                      f"{', a compile start for cold caches' if config.warm_compile else ''}"
                      + (f", {config.engine_warmup_s:g} s of every workload unmeasured after each start"
                         if config.engine_warmup_s > 0 else "")
                      + f"; budget {config.budget_min:g} GPU-min, "
                      f"δ {config.rule.delta:g}, "
                      f"{config.rule.confidence:.0%} intervals", highlight=False, markup=False)
        if o.dry_run:
            console.print("vLLM command: " + shlex.join([*config.profile.command, *config.profile.vllm_args]),
                          highlight=False, markup=False)
            return
        if console.is_terminal:
            reporter = LiveRaceReporter(console, config.metrics, config.replicas)
            with Live(reporter.table(), console=console, refresh_per_second=2) as live:
                reporter.live = live
                racer.reporter = reporter
                summary = racer.run()
        else:
            racer.reporter = PlainRaceReporter(console)
            summary = racer.run()
    print_summary(summary, console)
    if summary.failures:
        raise typer.Exit(EXIT_PARTIAL)
