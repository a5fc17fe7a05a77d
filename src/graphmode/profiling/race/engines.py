"""A race's engines: starting them side by side (with a compile start and a warm-up), restart waves, stopping.

Compile start (``warm_compile``, default on)
    Before the first measured round, every arm whose compile cache (``VLLM_CACHE_ROOT``, per arm under
    ``log_dir/vllm-cache/ARM`` unless the environment sets one) is cold is started once, stopped when
    healthy and started again, all such arms in one overlapped wave. Without it every arm's first start
    compiles cold and is measured, so cold/warm would be a hidden factor that differs between starts (a warm
    restart measured 0.88× a cold start's ITL p50 on an H200). The compile start writes no row and is no
    start of the race, but the budget counts its GPU time (``RaceSummary.compile_starts``).

Engine warm-up (``engine_warmup_s``)
    After every measured start each engine runs every workload of the design for ``engine_warmup_s``
    seconds, unmeasured: vLLM compiles some Triton kernels on first use, and a cell that caught one read
    far from its other rounds. A cell whose engine still logs such a compile keeps its row, and its round
    pairs with nothing (``race_rounds.jit_tainted``).

Replicas
    The compile start compiles replica 0 only and copies its cache into the others before the measured
    wave: no two engines write one cache, none compiles cold.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import EngineDiedError, EngineStartError
from graphmode.core.fingerprint import build_fingerprint, torch_version_of
from graphmode.core.records import StartupInfo
from graphmode.profiling.engine import VllmServer
from graphmode.profiling.gpu import MemorySampler, process_gpu_gib
from graphmode.profiling.grid import Workload
from graphmode.profiling.hostload import counters, tree_pids
from graphmode.profiling.race.schedule import Arm, ArmState, RaceConfig, RaceReporter, RaceSummary, wave_due
from graphmode.profiling.race_fit import check_fit
from graphmode.profiling.race_rounds import (
    RoundTable,
)
from graphmode.profiling.race_sizes import SizesArm, sizes_arm_args
from graphmode.profiling.runner import DEFAULT_VOCAB, Profiler, _served_model
from graphmode.profiling.sequential import SequentialRule


class EngineStarts:
    """The engine half of :class:`graphmode.profiling.race.loop.Racer` (which sets these attributes)."""

    config: RaceConfig
    store: ProfileStore
    reporter: RaceReporter
    profiler: Profiler
    run_id: str
    arms: list[Arm]
    replicas: dict[str, list[Arm]]
    order: list[Workload]
    table: RoundTable
    rule: SequentialRule
    prior_gpu_s: float
    next_round: int
    round_walls: list[float]
    last_wave_s: float | None
    waves_closed: bool
    starts_wall_s: float | None

    if TYPE_CHECKING:
        @property
        def challengers(self) -> list[Arm]: ...

        def _fail(self, arm: Arm, workload: Workload, round_: int, reason: str, t0: float,
                  summary: RaceSummary) -> None: ...

    def vllm_args(self, arm: Arm) -> list[str]:
        """The args *arm*'s engine gets (before its mode): a capture-size arm's list merged in."""
        args = self.config.profile.vllm_args
        if arm.sizes is None:
            return list(args)
        return sizes_arm_args(args, SizesArm(arm.name, arm.sizes))

    def check_fit(self, arms: Sequence[Arm] | None = None) -> None:
        """ConfigError when *arms*' engines (every replica) cannot all be resident on this GPU (race_fit)."""
        engines = sum(len(self.replicas[a.name]) for a in (arms if arms is not None else self.arms))
        gib = self.profiler.gpu.get("gpu_memory_gib")
        check_fit(engines, self.config.profile.vllm_args, float(gib) if isinstance(gib, int | float) else None,
                  self.config.kv_cache_memory_bytes,
                  None if self.config.kv_cache_memory_bytes else self.config.gpu_memory_utilization)

    def _copy_cache(self, arm: Arm) -> None:
        """Replica 0's compile cache into every other replica's cold cache, before the measured wave."""
        src = self.cache_root(arm)
        if not self._cache_warm(arm):
            return  # nothing compiled (no warm_compile, or no cache root): each replica does as it may
        for e in self.replicas[arm.name][1:]:
            dst = self.cache_root(e)
            if dst != src and not self._cache_warm(e):
                try:
                    shutil.copytree(src, dst, dirs_exist_ok=True)
                except OSError as exc:  # (disk full, permissions) that replica would compile cold: not started
                    e.state, e.failure = "failed", f"could not copy the compile cache {src} to {dst}: {exc}"

    def _env(self, arm: Arm) -> dict[str, str]:
        c = self.config
        env = dict(c.profile.env)
        if c.separate_caches and "VLLM_CACHE_ROOT" not in {**os.environ, **env}:
            # Engines that start at once would write one compile cache (the default and CONTROL
            # compute the same key): each arm compiles into its own.
            # Replicas of one arm too: replica r > 0 under its own root, filled from replica 0's.
            base = "vllm-cache" if arm.replica == 0 else f"vllm-cache-r{arm.replica}"
            env["VLLM_CACHE_ROOT"] = str(c.profile.log_dir / base / arm.name)
        return env

    def cache_root(self, arm: Arm) -> Path:
        """The compile cache *arm*'s engine uses: vLLM's ``VLLM_CACHE_ROOT``, by default
        ``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``."""
        env = {**os.environ, **self._env(arm)}
        if env.get("VLLM_CACHE_ROOT"):
            return Path(env["VLLM_CACHE_ROOT"]).expanduser()
        return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "vllm"

    def _cache_warm(self, arm: Arm) -> bool:
        root = self.cache_root(arm)
        try:
            return root.is_dir() and any(f.is_file() for f in root.rglob("*"))
        except OSError:
            return False  # unreadable: compile once rather than measure a cold start

    def _start(self, arms: list[Arm], t0: float, summary: RaceSummary,
               kind: Literal["first", "restart", "compile"] = "first") -> None:
        """Start *arms* overlapped (``stagger_s`` apart); wait until every one is healthy or failed.
        A compile start stops each engine once it is healthy and counts as no start of the arm."""
        c = self.config
        p = c.profile
        compile_only = kind == "compile"
        for arm in arms:
            if not compile_only:
                arm.session_starts += 1
            arm.state, arm.startup = "pending", StartupInfo()
        if compile_only:
            self.reporter.compile_starting(arms)
        else:
            self.reporter.engines_starting(arms)
        wave_t0 = time.time()

        def start(i: int, arm: Arm) -> None:
            time.sleep(i * c.stagger_s)
            k = arm.session_starts + arm.replica  # the start number of its start id
            numbered = f"-{k}" if k > 1 else ""
            suffix = "-compile" if compile_only else numbered
            log = p.log_dir / f"{self.run_id}-{arm.name}{suffix}.log"
            env = self._env(arm)
            args = self.vllm_args(arm)
            arm.server = VllmServer(p.command, args, mode=arm.mode, host=p.host, port=arm.port,
                                    log_path=log, startup_timeout_s=p.startup_timeout_s,
                                    stop_timeout_s=p.stop_timeout_s, env=env or None)
            arm.fingerprint = build_fingerprint(self.profiler.gpu, self.profiler.shape, args)
            try:
                arm.startup = arm.server.start()
            except EngineStartError as exc:
                arm.state, arm.failure = "failed", exc.reason()
                return
            except Exception as exc:
                # anything else raised in this thread would leave the engine neither live nor failed, and the
                # race would go on one replica short without a word (a parser SystemError did this once)
                with contextlib.suppress(Exception):
                    arm.server.stop()
                arm.state = "failed"
                arm.failure = f"graphmode failed while starting it: {type(exc).__name__}: {exc}"
                return
            if compile_only:
                arm.server.stop()  # healthy: its compile cache is written
                arm.state = "pending"
                return
            arm.startup.gpu_uuid = self.profiler.gpu.get("gpu_uuid")
            arm.fingerprint.vllm_version = arm.startup.vllm_version
            arm.served = _served_model(arm.server) or arm.server.served_model_name() or ""
            arm.state = "live"
            arm.idle_since = counters(arm.server.pid)

        threads = [threading.Thread(target=start, args=(i, a), name=f"start-{a.name}", daemon=True)
                   for i, a in enumerate(arms)]
        for t in threads:
            t.start()
        torch_version = torch_version_of(p.command)  # asks vLLM's interpreter (seconds): while the engines start
        for t in threads:
            t.join()
        wall_s = round(time.time() - wave_t0, 1)
        if not compile_only:
            for arm in arms:
                if arm.state == "live" and arm.server is not None:
                    # every engine of the wave is up and idle: each one's own memory, not the device's
                    arm.startup.start_wave_engines = len(arms)
                    arm.startup.engine_gpu_gib = process_gpu_gib(tree_pids(arm.server.pid))
        if compile_only:
            summary.compile_starts += len(arms)
            summary.compile_wall_s += wall_s
        else:
            summary.engine_starts += len(arms)
        if not compile_only:
            self.last_wave_s = wall_s
        if kind == "restart":
            summary.restarts += len(arms)
            summary.restart_wall_s += wall_s
        elif kind == "first":
            self.starts_wall_s = summary.starts_wall_s = wall_s
        for arm in arms:
            if arm.fingerprint is not None:
                arm.fingerprint.torch_version = torch_version
            if arm.state == "failed":
                self._fail(arm, self.order[0], self.next_round, arm.failure or "failed to start", t0, summary)
            elif compile_only:
                arm.server = None
                self.reporter.compiled(arm)
            else:
                self.reporter.engine_started(arm)
        if not compile_only and c.engine_warmup_s > 0:
            self._warm([a for a in arms if a.state != "failed"], t0, summary)

    def _warm(self, arms: list[Arm], t0: float, summary: RaceSummary) -> None:
        """Every workload on every fresh engine, unmeasured (the module docstring, "Engine warm-up")."""
        vocab = int(self.profiler.shape.get("vocab_size") or DEFAULT_VOCAB)
        w0 = time.time()
        for arm in arms:
            if arm.server is None or arm.state != "live":
                continue
            try:
                self.profiler.warm(arm.server, arm.served, vocab, self.order, self.config.engine_warmup_s)
            except EngineDiedError as exc:
                self._fail(arm, self.order[0], self.next_round, exc.reason(), t0, summary)
        summary.warmup_wall_s += time.time() - w0

    def _restart_wave(self, default: Arm, t0: float, summary: RaceSummary, spent_min: float) -> None:
        """Restart the default, or the live challengers lacking starts, once every live arm's current block
        has its rounds (see the module docstring); the default and a challenger never in one wave. A wave
        the budget left cannot pay for, with ``block_rounds`` rounds after it, is skipped: its rounds are
        spent on the starts already up instead."""
        c = self.config
        live = [a for a in self.challengers if a.state == "live"]
        if c.starts <= 1 or c.replicas > 1 or default.state != "live" or not live or self.waves_closed:
            return
        due = wave_due(c.starts, c.block_rounds, self.rule.min_rounds, default.starts,
                       [(a.starts, self.table.current_block_rounds(a.name, a.start_id, default.start_id))
                        for a in live])
        if due is None:
            return
        wave = [default] if due == "default" else [live[i] for i in due]
        left_s = (c.budget_min - spent_min) * 60
        need_s = self._wave_cost_s()
        if left_s < need_s:
            self.waves_closed = True
            summary.waves_skipped += 1
            self.reporter.wave_skipped(wave, left_s, need_s)
            return
        for arm in wave:
            self._stop(arm, f"restarted for start {arm.starts + 1} of {c.starts}", state="pending")
        self._start(wave, t0, summary, kind="restart")

    def _wave_cost_s(self) -> float:
        """GPU seconds a restart wave costs before its block has its rounds: the latest measured wave's wall
        (starts overlapped on one GPU take about one start's time) plus ``block_rounds`` rounds at the mean of
        the last three."""
        recent = self.round_walls[-3:]
        round_s = sum(recent) / len(recent) if recent else 0.0
        return (self.last_wave_s or 0.0) + self.config.block_rounds * round_s

    def _stop(self, arm: Arm, why: str, state: ArmState = "stopped") -> None:
        if arm.server is not None:
            arm.server.stop()
        arm.state, arm.stop_reason = state, why
        self.reporter.engine_stopped(arm)

    def _stop_arm(self, arm: Arm, why: str, state: ArmState = "stopped") -> None:
        """Stop every replica of *arm* that is up (a failed one stays failed)."""
        for e in self.replicas[arm.name]:
            if e.state in ("live", "pending"):
                self._stop(e, why, state)

    def _idle_gpu_util(self) -> float | None:
        """GPU utilisation with every engine idle (no GPU: None, and no time spent)."""
        if self.config.idle_probe_s <= 0 or self.profiler.gpu.get("gpu_name") is None:
            return None
        sampler = MemorySampler(interval_s=0.1).start()
        time.sleep(self.config.idle_probe_s)
        sampler.stop()
        return sampler.conditions().get("gpu_util_pct_mean")
