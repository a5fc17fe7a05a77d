"""A profile run: per repeat, one vLLM start per mode, every pending workload of that repeat and mode against it.

Each finished cell is appended to the dataset at once. A server that fails to start or dies mid-cell
turns that mode's remaining cells into ``failed`` rows (with the reason and the log tail) and the run
moves on to the next mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import EngineDiedError, EngineError, EngineStartError, ScrapeError
from graphmode.core.fingerprint import build_fingerprint, model_shape, torch_version_of, vllm_version_of
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import CellRecord, CellStatus, Fingerprint, RunConditions, StartupInfo
from graphmode.core.settings import Settings
from graphmode.profiling.arrivals import PlannedRequest, plan_requests
from graphmode.profiling.engine import VllmServer
from graphmode.profiling.features import compute_features, compute_step_sizes, server_latency
from graphmode.profiling.gpu import MemorySampler, gpu_facts, pci_bus_id, process_gpu_gib
from graphmode.profiling.grid import Workload
from graphmode.profiling.hostload import counters, cpu_model, python_probe_ms, tree_pids, usage
from graphmode.profiling.jitlog import jit_kernels
from graphmode.profiling.loadgen import run_load
from graphmode.profiling.loadshards import DISPATCH_LEAD_S, LoadShards
from graphmode.profiling.metrics import MetricsSnapshot, parse_metrics
from graphmode.profiling.placement import placement
from graphmode.profiling.stats import (
    RequestResult,
    WindowMonitor,
    aggregate,
    aggregate_window,
    deadline_diagnosis,
    fixed_cell_requests,
)
from graphmode.vllm_args import compilation_config_of, get_flag, model_arg, without_flags

DEFAULT_VOCAB = 1000  # safe for any real tokenizer when config.json is not readable


class Reporter(Protocol):
    def mode_starting(self, mode: CudaGraphMode, pending: int) -> None: ...
    def mode_started(self, mode: CudaGraphMode, startup: StartupInfo) -> None: ...
    def cell_starting(self, mode: CudaGraphMode, workload: Workload, repeat: int) -> None: ...
    def cell_finished(self, record: CellRecord) -> None: ...


class NullReporter:
    def mode_starting(self, mode: CudaGraphMode, pending: int) -> None: ...
    def mode_started(self, mode: CudaGraphMode, startup: StartupInfo) -> None: ...
    def cell_starting(self, mode: CudaGraphMode, workload: Workload, repeat: int) -> None: ...
    def cell_finished(self, record: CellRecord) -> None: ...


@dataclass
class ProfileConfig:
    command: list[str]
    vllm_args: list[str]
    modes: Sequence[CudaGraphMode]
    workloads: Sequence[Workload]
    dataset: Path
    log_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    resume: bool = False
    repeats: int | None = None  # overrides every workload's own
    scrape_interval_s: float = 0.5
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0
    drain_grace_s: float = 30.0
    idle_timeout_s: float = 15.0  # before a cell: wait this long at most for the last one's aborts
    env: dict[str, str] = field(default_factory=dict)
    loadgen_processes: int = 1  # > 1: fixed-window cells send their load from that many processes (loadshards)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        command: list[str],
        vllm_args: list[str],
        modes: Sequence[CudaGraphMode],
        workloads: Sequence[Workload],
        dataset: Path | None = None,
        log_dir: Path | None = None,
        port: int | None = None,
        resume: bool = False,
        repeats: int | None = None,
        startup_timeout_s: float | None = None,
        loadgen_processes: int | None = None,
    ) -> ProfileConfig:
        """The run the CLI and the service plan: what is not given comes from the settings."""
        v = settings.vllm
        return cls(
            command=command, vllm_args=vllm_args, modes=modes, workloads=workloads,
            dataset=dataset or settings.profile.dataset, log_dir=log_dir or settings.profile.log_dir,
            host=v.host, port=port or v.port, resume=resume, repeats=repeats,
            scrape_interval_s=settings.profile.scrape_interval_s,
            startup_timeout_s=startup_timeout_s or v.startup_timeout_s, stop_timeout_s=v.stop_timeout_s,
            connect_timeout_s=v.connect_timeout_s, read_timeout_s=v.read_timeout_s,
            loadgen_processes=loadgen_processes or settings.profile.loadgen_processes,
        )

    @property
    def planned_cells(self) -> int:
        """Cells the run covers, done ones included: every mode × workload × repeat."""
        return sum(_repeats(w, self.repeats) for w in self.workloads) * len(self.modes)


@dataclass
class ProfileSummary:
    run_id: str
    profile_key: str
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    engine_starts: int = 0
    wall_s: float = 0.0
    startup_s: dict[str, float | None] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def profile_key(gpu_name: str | None, shape: dict[str, object], command: list[str], args: list[str],
                env: Mapping[str, str] | None = None) -> str:
    """What must stay the same for an earlier row to count as done: GPU, model, vLLM args (less mode) and the
    environment that changes the deployment's configuration.

    The args already hold every configuration element a flag sets (TP, --attention-backend, speculative
    decoding, quantization, max_num_seqs, max_model_len; see graphmode.core.deployment) and the model's
    config hash holds a quantized or MoE checkpoint, so two configurations never share a key. A backend chosen
    through VLLM_ATTENTION_BACKEND is added only when set, which keeps every earlier key as it was.
    """
    cc = compilation_config_of(args)
    cc.pop("cudagraph_mode", None)
    rest = without_flags(args, "--host", "--port", "--compilation-config", "-cc", "--compilation_config")
    model = shape.get("model_config_hash") or ""
    parts: list[object] = [gpu_name, model, rest, cc]
    backend = (env or {}).get("VLLM_ATTENTION_BACKEND")
    if backend:
        parts.append({"VLLM_ATTENTION_BACKEND": backend})
    payload = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _repeats(w: Workload, override: int | None) -> int:
    return override if override is not None else w.repeats


class Profiler:
    def __init__(self, config: ProfileConfig, store: ProfileStore, reporter: Reporter | None = None) -> None:
        self.config = config
        self.store = store
        self.reporter: Reporter = reporter or NullReporter()
        self.run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self._shards: LoadShards | None = None
        self.gpu = gpu_facts()
        self.gpu_bus_id = pci_bus_id()
        self.cpu_model = cpu_model()
        self.vllm_version = vllm_version_of(config.command) if config.resume else None
        self.shape = model_shape(model_arg(config.command, config.vllm_args))
        self.key = profile_key(self.gpu.get("gpu_name"), self.shape, config.command, config.vllm_args, config.env)

    def pending(self) -> dict[CudaGraphMode, list[tuple[Workload, int]]]:
        done = self.store.done_cells(self.key, self.vllm_version) if self.config.resume else set()
        plan: dict[CudaGraphMode, list[tuple[Workload, int]]] = {}
        for mode in self.config.modes:
            plan[mode] = [
                (w, r)
                for w in self.config.workloads
                for r in range(_repeats(w, self.config.repeats))
                if (mode.value, w.name, w.spec_hash(), r) not in done
            ]
        return plan

    def run(self) -> ProfileSummary:
        t0 = time.monotonic()
        summary = ProfileSummary(run_id=self.run_id, profile_key=self.key)
        plan = self.pending()
        summary.skipped = self.config.planned_cells - sum(len(v) for v in plan.values())
        torch_version = torch_version_of(self.config.command) if any(plan.values()) else None
        # The engine start is the unit of replication (between-start noise dominates within-start noise,
        # docs/results), so each repeat gets its own start of every mode, and the modes take turns per round.
        try:
            for repeat in sorted({r for cells in plan.values() for _, r in cells}):
                for mode, cells in plan.items():
                    round_cells = [(w, r) for w, r in cells if r == repeat]
                    if round_cells:
                        self._run_mode(mode, round_cells, torch_version, summary)
        finally:
            self.close()
        summary.wall_s = round(time.monotonic() - t0, 1)
        return summary

    def _server(self, mode: CudaGraphMode, repeat: int) -> VllmServer:
        c = self.config
        log = c.log_dir / f"{self.run_id}-{mode.value}-r{repeat}.log"
        return VllmServer(c.command, c.vllm_args, mode=mode, host=c.host, port=c.port, log_path=log,
                          startup_timeout_s=c.startup_timeout_s, stop_timeout_s=c.stop_timeout_s,
                          env=c.env or None)

    def _run_mode(self, mode: CudaGraphMode, cells: list[tuple[Workload, int]], torch_version: str | None,
                  summary: ProfileSummary) -> None:
        self.reporter.mode_starting(mode, len(cells))
        server = self._server(mode, cells[0][1])
        fingerprint = build_fingerprint(self.gpu, self.shape, self.config.vllm_args, None, torch_version)
        summary.engine_starts += 1
        try:
            startup = server.start()
        except EngineStartError as exc:
            summary.startup_s[mode.value] = None
            self._fail_rest(mode, cells, StartupInfo(), fingerprint, exc, summary)
            return
        startup.gpu_uuid = self.gpu.get("gpu_uuid")
        startup.start_wave_engines = 1
        startup.engine_gpu_gib = process_gpu_gib(tree_pids(server.pid))
        try:
            summary.startup_s[mode.value] = startup.startup_s
            self.reporter.mode_started(mode, startup)
            fingerprint.vllm_version = startup.vllm_version
            served = _served_model(server) or server.served_model_name() or ""
            vocab = int(self.shape.get("vocab_size") or DEFAULT_VOCAB)
            for i, (workload, repeat) in enumerate(cells):
                self.reporter.cell_starting(mode, workload, repeat)
                try:
                    record = self._run_cell(server, served, vocab, mode, workload, repeat, startup, fingerprint)
                except EngineDiedError as exc:
                    self._fail_rest(mode, cells[i:], startup, fingerprint, exc, summary)
                    return
                self.store.append(record, workload.spec_hash())
                summary.ok += record.status == "ok"
                summary.failed += record.status == "failed"
                if record.status == "failed":
                    summary.failures.append(f"{mode.value}/{workload.name}#{repeat}: {record.reason}")
                self.reporter.cell_finished(record)
        finally:
            server.stop()

    def _fail_rest(self, mode: CudaGraphMode, cells: list[tuple[Workload, int]], startup: StartupInfo,
                   fingerprint: Fingerprint, exc: EngineError, summary: ProfileSummary) -> None:
        now = time.time()
        reason = exc.reason()
        summary.failures.append(f"{mode.value}: {exc}")
        for workload, repeat in cells:
            record = CellRecord(
                run_id=self.run_id, profile_key=self.key, mode=mode.value, workload=workload.name,
                workload_spec=workload.spec(), repeat=repeat, status="failed", reason=reason,
                started_at=now, finished_at=now, startup=startup, fingerprint=fingerprint,
            )
            self.store.append(record, workload.spec_hash())
            summary.failed += 1
            self.reporter.cell_finished(record)

    def measure_cell(self, server: VllmServer, served: str, vocab: int, mode: CudaGraphMode, workload: Workload,
                     repeat: int, startup: StartupInfo, fingerprint: Fingerprint) -> CellRecord:
        """One cell against a running server (the race drives resident engines through this)."""
        return self._run_cell(server, served, vocab, mode, workload, repeat, startup, fingerprint)

    def warm(self, server: VllmServer, served: str, vocab: int, workloads: Sequence[Workload],
             seconds: float) -> None:
        """Unmeasured load, each workload for *seconds*: the kernels vLLM compiles on first use (sampling,
        an MoE's batch sizes) compile here, not in a measured cell. Errors are left to the cells."""
        for i, w in enumerate(workloads):
            plan = w.model_copy(update={"duration_s": seconds, "warmup_s": 0.0, "adaptive": None})
            plans = plan_requests(plan, vocab, repeat=1_000_000 + i)  # no round uses these seeds
            with contextlib.suppress(httpx.HTTPError, OSError):
                asyncio.run(run_load(server.base_url, served, plans, max_concurrency=w.max_concurrency,
                                     deadline_s=seconds, connect_timeout_s=self.config.connect_timeout_s,
                                     read_timeout_s=self.config.read_timeout_s))
            server.check_alive()
            _wait_idle(server, self.config.idle_timeout_s)

    def _run_cell(self, server: VllmServer, served: str, vocab: int, mode: CudaGraphMode, workload: Workload,
                  repeat: int, startup: StartupInfo, fingerprint: Fingerprint) -> CellRecord:
        started = time.time()
        _wait_idle(server, self.config.idle_timeout_s)
        probe_ms = python_probe_ms()
        log_mark = server.log_size()
        before = counters(server.pid)
        sampler = MemorySampler().start()
        # the event loop (load, scrapes) runs on this thread: its CPU time is the load generator's
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        try:
            drive = asyncio.run(self._drive(server, served, vocab, workload, repeat))
        finally:
            mem_max, mem_mean = sampler.stop()
        loadgen_cores = (time.thread_time() - cpu0) / max(time.perf_counter() - wall0, 1e-6)
        conditions = RunConditions(**sampler.conditions(), **placement(server.pid, self.gpu_bus_id),
                                   **usage(before, counters(server.pid)), host_probe_ms=probe_ms,
                                   host_cpu_model=self.cpu_model)
        conditions.loadgen_cpu_cores = round(max(loadgen_cores, drive.shard_cores or 0.0), 3)
        if log_mark is not None:
            conditions.engine_jit_kernels = ",".join(jit_kernels(server.log_since(log_mark)))
        if workload.adaptive is None:
            timed = fixed_cell_requests(drive.results, drive.t0, workload.warmup_s, drive.t_end - drive.t0,
                                        closed_loop=workload.max_concurrency is not None)
            measured = [r for _, r in timed]
            ends = [at + r.e2e for at, r in timed if r.ok and r.e2e is not None]
            span = (max(ends) - workload.warmup_s) if ends else workload.duration_s
            latency = aggregate(measured, span, slo_ttft_s=workload.slo_ttft_s, slo_itl_s=workload.slo_itl_s)
            latency.sent_rate = len(measured) / workload.duration_s
            latency.stopped_by = "fixed"
        else:
            latency = aggregate_window(drive.results, drive.t_measure, drive.t_end,
                                       slo_ttft_s=workload.slo_ttft_s, slo_itl_s=workload.slo_itl_s)
            latency.stopped_by = drive.stopped_by
        latency.warmup_used_s = round(drive.t_measure - drive.t0, 3)
        window = [s for s in drive.snapshots if drive.t_measure <= s.t <= drive.t_end + self.config.scrape_interval_s]
        features = compute_features(window)
        latency.server_itl_mean, latency.server_ttft_mean = server_latency(window)
        status: CellStatus = "ok"
        reason = None
        if workload.adaptive is None and latency.n_ok == 0:
            why = deadline_diagnosis(measured) or latency.first_error
            status, reason = "failed", f"no request succeeded: {why}"
        elif workload.adaptive is not None and not latency.output_tok_s:
            status, reason = "failed", f"no token arrived in the window: {latency.first_error}"
        return CellRecord(
            run_id=self.run_id, profile_key=self.key, mode=mode.value, workload=workload.name,
            workload_spec=workload.spec(), repeat=repeat, status=status,
            reason=reason, started_at=started, finished_at=time.time(), features=features,
            latency=latency, startup=startup, fingerprint=fingerprint,
            gpu_mem_used_gib_max=mem_max, gpu_mem_used_gib_mean=mem_mean, conditions=conditions,
            step_sizes=compute_step_sizes(window, api_servers=self._api_servers()),
        )

    def _api_servers(self) -> int | None:
        """vLLM's --api-server-count in this profile's args: each server's histogram holds its share of a step."""
        raw = get_flag(self.config.vllm_args, "--api-server-count", "-asc", "--api_server_count")
        try:
            return int(raw) if raw is not None and int(raw) >= 1 else None
        except ValueError:
            return None

    def shards(self) -> LoadShards | None:
        """The load-generator processes (started at first use), or None for the one-process path."""
        if self.config.loadgen_processes > 1 and self._shards is None:
            self._shards = LoadShards(self.config.loadgen_processes)
        return self._shards

    def close(self) -> None:
        """Stop the load-generator processes, if any were started."""
        if self._shards is not None:
            self._shards.close()
            self._shards = None

    async def _drive(self, server: VllmServer, served: str, vocab: int, workload: Workload,
                     repeat: int) -> _Drive:
        c = self.config
        total_s = workload.warmup_s + workload.duration_s
        plans = plan_requests(workload.model_copy(update={"duration_s": total_s}), vocab, repeat)
        snapshots: list[MetricsSnapshot] = []
        adaptive = workload.adaptive
        # a window that ends on a confidence interval needs its results live: it keeps the one-process path
        fixed_end = adaptive is None or (adaptive.min_warmup_s >= workload.warmup_s
                                         and adaptive.min_s >= workload.duration_s)
        shards = self.shards() if fixed_end else None
        t0 = time.perf_counter() + (DISPATCH_LEAD_S if shards is not None else 0.0)
        drive = _Drive(t0=t0, t_measure=t0 + workload.warmup_s, t_end=t0 + total_s, snapshots=snapshots)
        stop = asyncio.Event()  # ends the load (adaptive cells)
        finished = asyncio.Event()  # ends the helpers

        async def scrape_loop() -> None:
            async with httpx.AsyncClient(timeout=httpx.Timeout(c.connect_timeout_s, read=10.0)) as client:
                # Runs until just past the window's end so the last sample brackets it.
                while not finished.is_set():
                    with contextlib.suppress(httpx.HTTPError, ScrapeError):
                        resp = await client.get(server.base_url + "/metrics")
                        snapshots.append(parse_metrics(resp.text, time.perf_counter()))
                    if time.perf_counter() > drive.t_end + c.scrape_interval_s:
                        return
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(finished.wait(), c.scrape_interval_s)

        async def watchdog() -> None:
            while not finished.is_set():
                server.check_alive()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), 1.0)

        scraper = asyncio.create_task(scrape_loop())
        guard = asyncio.create_task(watchdog())
        deadline_s = total_s + (1.0 if adaptive else max(c.drain_grace_s, workload.duration_s))
        # a fixed cell counts a closed loop's requests by when they left (stats.fixed_cell_requests): its
        # backlog at the window's end stays unsent, and the cell ends once what left has drained
        send_until = t0 + total_s if adaptive is None and workload.max_concurrency is not None else None
        if shards is not None:
            # the window's end is known: every shard stops itself there (what is in flight is cut)
            stop_at = t0 + total_s if adaptive is not None else None
            load = asyncio.create_task(self._sharded(shards, server, served, plans, workload, drive, deadline_s,
                                                     stop_at, send_until))
        else:
            load = asyncio.create_task(run_load(
                server.base_url, served, plans, max_concurrency=workload.max_concurrency,
                deadline_s=deadline_s, t0=t0,
                connect_timeout_s=c.connect_timeout_s, read_timeout_s=c.read_timeout_s,
                stop=stop if adaptive else None, results=drive.results, send_until=send_until,
            ))
        waiters = {load, guard}
        if adaptive is not None and shards is None:
            waiters.add(asyncio.create_task(self._control(workload, drive, stop)))
        try:
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if guard in done:
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
                guard.result()  # raises EngineDiedError
            await load
            for task in waiters - {load, guard}:
                await task
            server.check_alive()
        finally:
            finished.set()
            for task in waiters - {load, guard}:
                task.cancel()
            await asyncio.gather(scraper, guard, *(waiters - {load, guard}), return_exceptions=True)
        return drive

    async def _sharded(self, shards: LoadShards, server: VllmServer, served: str, plans: list[PlannedRequest],
                       workload: Workload, drive: _Drive, deadline_s: float,
                       stop_at: float | None, send_until: float | None = None) -> list[RequestResult]:
        c = self.config
        results = await shards.run(server.base_url, served, plans, max_concurrency=workload.max_concurrency,
                                   deadline_s=deadline_s, t0=drive.t0, stop_at=stop_at,
                                   connect_timeout_s=c.connect_timeout_s, read_timeout_s=c.read_timeout_s,
                                   send_until=send_until)
        drive.results.extend(results)
        drive.shard_cores = shards.busiest_cores
        if stop_at is not None:  # a fixed window, as _control would have set it
            drive.t_measure, drive.t_end, drive.stopped_by = drive.t0 + workload.warmup_s, stop_at, "max"
        return results

    @staticmethod
    async def _control(workload: Workload, drive: _Drive, stop: asyncio.Event,
                       clock: Callable[[], float] = time.perf_counter,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """Decide when warm-up ends and when the window has measured enough; then set *stop*.

        ``clock`` and ``sleep`` are the wall clock's unless a test drives the decision in virtual time."""
        adaptive = workload.adaptive
        assert adaptive is not None
        t0, results = drive.t0, drive.results
        # Warm-up: one request lifetime (the first to finish), within [min_warmup_s, warmup_s]; a fixed one
        # (race cells: min = max) ends on the dot, so every arm of a round measures the same window
        fixed = adaptive.min_warmup_s >= workload.warmup_s
        if fixed:
            await sleep(max(0.0, t0 + workload.warmup_s - clock()))
        while True:
            now = clock()
            firsts = [r.done_at for r in results if r.done_at is not None]
            if now >= t0 + workload.warmup_s or (firsts and now >= t0 + adaptive.min_warmup_s):
                break
            await sleep(0.05)
        # A fixed window starts at the planned instant, not when the event loop woke: on a loaded host the
        # wake-up lags by tens of ms, which would shift one arm's window against the other's
        drive.t_measure = t0 + workload.warmup_s if fixed else clock()
        monitor = WindowMonitor(drive.t_measure)
        hard_end = drive.t_measure + workload.duration_s
        drive.t_end = hard_end
        await sleep(adaptive.min_s)
        while True:
            now = clock()
            monitor.update(results, now)
            widths = {m: monitor.ci(m) for m in adaptive.ci}
            if all(w is not None and w <= adaptive.ci[m] for m, w in widths.items()):
                drive.stopped_by = "ci"
                break
            if now >= hard_end:
                drive.stopped_by = "max"
                break
            await sleep(min(adaptive.check_every_s, max(hard_end - now, 0.01)))
        drive.t_end = clock()
        stop.set()


@dataclass
class _Drive:
    """One cell's load as it ran: results fill in while it runs; window bounds are perf_counter times."""

    t0: float
    t_measure: float
    t_end: float
    snapshots: list[MetricsSnapshot]
    results: list[RequestResult] = field(default_factory=list)
    stopped_by: str = "max"
    shard_cores: float | None = None  # sharded load: its busiest process's CPU seconds per second


def _wait_idle(server: VllmServer, timeout_s: float) -> None:
    """Wait until vLLM reports no running or waiting request (aborts of the last cell have landed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            snap = parse_metrics(httpx.get(server.base_url + "/metrics", timeout=5.0).text, 0.0)
        except (httpx.HTTPError, ScrapeError):
            return
        if not (snap.num_requests_running or 0) and not (snap.num_requests_waiting or 0):
            return
        time.sleep(0.1)


def _served_model(server: VllmServer) -> str | None:
    try:
        r = httpx.get(server.base_url + "/v1/models", timeout=10.0)
        data = r.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
