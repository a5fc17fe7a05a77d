"""The race loop: paired rounds on resident engines until every arm is decided or the budget is spent.

Each round runs one workload (:mod:`graphmode.profiling.race_design`) on every live engine, one after the
other, in an order shuffled each round (seeded by the race key and the round, so a resume repeats it):
drift within a round and the carry-over from the engine that ran just before hit every arm alike on
average. Each cell is a dataset row plus race columns (:class:`graphmode.core.records.RaceInfo`). After each
round the sequential rule (:mod:`graphmode.profiling.sequential`) decides per (arm, metric) on
``ln(arm / default)``; an arm decided on every metric is stopped, and so is one worse on a metric whose
intervals on the others rule out "better". The race stops when every arm is decided, the design has no open
workload, or the GPU-minutes of every session of the race reach the budget.

While an engine waits for its turn its process tree's CPU use is recorded (``race_idle_cpu_cores``), the
other engines' during each cell (``race_neighbours_cpu_cores``), and the GPU's utilisation with every engine
idle at each round's start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import time

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import EngineDiedError
from graphmode.core.modes import DEFAULT_MODE, CudaGraphMode
from graphmode.core.records import CellRecord, Fingerprint, RaceInfo
from graphmode.profiling.grid import Workload
from graphmode.profiling.hostload import counters, engine_cores
from graphmode.profiling.race.engines import EngineStarts
from graphmode.profiling.race.schedule import (
    Arm,
    ArmState,
    NullRaceReporter,
    RaceConfig,
    RaceReporter,
    RaceSummary,
    check_replicas,
    race_key,
    race_vllm_args,
    replica_slot,
)
from graphmode.profiling.race_design import next_workload, race_cell, spread_order
from graphmode.profiling.race_rounds import (
    CONTROL_ARM,
    ArmVerdicts,
    RoundTable,
    arm_verdicts,
    table_from_rows,
)
from graphmode.profiling.race_sizes import check_sizes_arms
from graphmode.profiling.runner import DEFAULT_VOCAB, Profiler, _wait_idle
from graphmode.profiling.sequential import needed_to_decide


class Racer(EngineStarts):
    """One race on one GPU: its arms, the rounds measured so far (this session's and earlier ones'), the loop."""

    def __init__(self, config: RaceConfig, store: ProfileStore, reporter: RaceReporter | None = None) -> None:
        self.config = config
        self.store = store
        self.reporter: RaceReporter = reporter or NullRaceReporter()
        p = config.profile = dataclasses.replace(config.profile, vllm_args=race_vllm_args(
            config.profile.vllm_args, config.kv_cache_memory_bytes, config.gpu_memory_utilization))
        self.profiler = Profiler(p, store)
        self.run_id = self.profiler.run_id
        self.cells = [race_cell(w, config.cell_s, config.warmup_s) for w in p.workloads]
        self.order = spread_order(self.cells)
        self.by_name = {w.name: w for w in self.cells}
        self.key = race_key(self.profiler.key, config, self.cells)
        if config.starts < 1 or config.block_rounds < 1 or config.replicas < 1:
            raise ValueError("starts, block_rounds and replicas must be at least 1")
        check_replicas(config.replicas, config.starts, config.control)
        check_sizes_arms(config.sizes_arms, p.vllm_args, [DEFAULT_MODE.value, *(m.value for m in p.modes)])
        # "better"/"equivalent" wait for the starts the race will make (sequential.py); with replicas every
        # arm has R starts from its first round on, and two of each side are what the rule needs
        wanted = config.starts if config.replicas == 1 else 2
        self.rule = dataclasses.replace(config.rule, min_starts=max(config.rule.min_starts, wanted))
        self.replicas: dict[str, list[Arm]] = {}  # arm name -> its engines, replica 0 first
        self.arms = self._arms()
        self.table = RoundTable()
        self.prior_gpu_s = 0.0
        self.next_round = 0
        self.round_walls: list[float] = []  # this session's, for what a restart wave would leave
        self.last_wave_s: float | None = None  # wall of this session's latest measured start wave
        self.waves_closed = False  # a wave was skipped for budget: the budget only shrinks, so no more waves
        self.rounds_before = 0
        self.starts_wall_s: float | None = None
        self._load()

    # ------------------------------------------------------------------ set-up
    def _arms(self) -> list[Arm]:
        """Replica 0 of every arm, on ``port + i``; :attr:`replicas` holds each arm's engines, replica r of
        arm i on ``port + r * arms + i`` (no two engines share a port)."""
        p = self.config.profile
        modes = [m for m in dict.fromkeys([DEFAULT_MODE, *p.modes])]
        kinds: list[tuple[str, CudaGraphMode, tuple[int, ...] | None]] = [(m.value, m, None) for m in modes]
        if self.config.control:
            kinds.append((CONTROL_ARM, DEFAULT_MODE, None))
        kinds += [(s.name, DEFAULT_MODE, s.sizes) for s in self.config.sizes_arms]
        n, big_r = len(kinds), self.config.replicas
        self.replicas = {
            name: [Arm(name, mode, p.port + r * n + i, run_id=self.run_id, sizes=sizes, replica=r, replicas=big_r)
                   for r in range(big_r)]
            for i, (name, mode, sizes) in enumerate(kinds)}
        return [engines[0] for engines in self.replicas.values()]

    @property
    def engines(self) -> list[Arm]:
        """Every engine of the race: each arm's replicas."""
        return [e for arm in self.arms for e in self.replicas[arm.name]]

    def arm_state(self, arm: Arm) -> ArmState:
        """*arm*'s state over its replicas: live while one is, failed once every one has failed."""
        states = {e.state for e in self.replicas[arm.name]}
        precedence: tuple[ArmState, ...] = ("live", "decided", "pending", "stopped")
        return next((state for state in precedence if state in states), "failed")

    def arm_failure(self, arm: Arm) -> str | None:
        """vLLM's root cause when every replica of *arm* failed (the first replica's), else None."""
        engines = self.replicas[arm.name]
        if any(e.state != "failed" for e in engines):
            return None
        return next((e.failure for e in engines if e.failure), "failed")

    def pick(self, arm: Arm, round_: int) -> Arm | None:
        """The replica of *arm* for a workload's round number *round_*: replica ``round_ mod R``, else the next
        live one."""
        engines = self.replicas[arm.name]
        for k in range(len(engines)):
            e = engines[(round_ + k) % len(engines)]
            if e.state == "live":
                return e
        return None

    @property
    def challengers(self) -> list[Arm]:
        return [a for a in self.arms if not a.is_default]

    def _load(self) -> None:
        """Rounds already measured by earlier sessions of this race, and the GPU time they took."""
        rows = self.store.race_rows(self.key)
        self.table = table_from_rows(rows, self.config.metrics)
        sessions: dict[str, tuple[float, float]] = {}
        for name, value in self.store.meta(self._session_prefix).items():
            with contextlib.suppress(ValueError, TypeError):
                a, b = (float(x) for x in json.loads(value))
                sessions[name.removeprefix(self._session_prefix)] = (a, b)
        for r in rows:
            t0 = float(r.get("race_session_t0") or r["started_at"])
            t1 = float(r.get("finished_at") or t0)
            a, b = sessions.get(str(r["run_id"]), (t0, t1))
            sessions[str(r["run_id"])] = (min(a, t0), max(b, t1))
        self.prior_gpu_s = sum(b - a for a, b in sessions.values())
        rounds = [int(r["race_round"]) for r in rows if r.get("race_round") is not None]
        self.next_round = max(rounds) + 1 if rounds else 0
        self.rounds_before = len(self.table.rounds)
        for arm in self.arms:
            arm.starts_before = len(self.table.start_ids(arm.name))

    @property
    def _session_prefix(self) -> str:
        return f"race-session:{self.key}:"

    def _mark_session(self, t0: float) -> None:
        """This session's span so far, so a resume counts its GPU time even when it wrote no row."""
        self.store.put_meta(self._session_prefix + self.run_id, json.dumps([t0, time.time()]))

    def verdicts(self) -> dict[str, ArmVerdicts]:
        names = [w.name for w in self.cells]
        # a running engine's block may still grow: an interval over start blocks looks once per complete set
        running = {e.start_id for e in self.engines if e.state == "live"}
        return {a.name: arm_verdicts(self.table, a.name, self.config.metrics, self.rule, names, running)
                for a in self.challengers}

    # ------------------------------------------------------------------ the race
    def run(self) -> RaceSummary:
        c = self.config
        t0 = time.time()
        summary = RaceSummary(race_id=self.key, run_id=self.run_id, profile_key=self.profiler.key,
                              rounds_before=self.rounds_before)
        verdicts = self.verdicts()
        for arm in self.challengers:
            if verdicts[arm.name].settled(c.metrics, c.rule.delta):
                for e in self.replicas[arm.name]:
                    e.state, e.stop_reason = "decided", "decided in an earlier session"
        todo = [a for a in self.challengers if a.state == "pending"]
        if todo:
            self.check_fit([a for a in self.arms if a.is_default or a in todo])
        try:
            if not todo:
                summary.stop_reason = "every arm decided"
            elif not self._open_workloads(todo):
                summary.stop_reason = "no open workload left: the remaining verdicts depend on the workload"
            elif self.prior_gpu_s / 60 >= c.budget_min:
                # a resumed race with the budget it already spent must say so, not look like one that goes on
                summary.stop_reason = (
                    f"budget of {c.budget_min:g} GPU-minutes spent in earlier sessions "
                    f"({self.prior_gpu_s / 60:.1f} in all): --budget-min is the race's total over its sessions; "
                    f"give more than {self.prior_gpu_s / 60:.1f} to go on"
                )
            else:
                summary.stop_reason = self._first_starts(t0, summary)
        finally:
            for arm in self.engines:
                if arm.server is not None:
                    arm.server.stop()
                    if arm.state == "live":
                        arm.state = "stopped"
            self.profiler.close()
        if summary.engine_starts or summary.compile_starts:
            self._mark_session(t0)
        summary.gpu_min = round((time.time() - t0) / 60, 2)
        summary.gpu_min_total = round(self.prior_gpu_s / 60 + summary.gpu_min, 2)
        summary.verdicts = self.verdicts()
        summary.arm_states = {a.name: self.arm_state(a) for a in self.arms}
        summary.failures.update({a.name: f for a in self.arms if (f := self.arm_failure(a))})
        if c.replicas > 1:
            summary.replica_failures = {e.label: e.failure for e in self.engines if e.state == "failed" and e.failure}
        summary.open_reasons = self._open_reasons(summary.verdicts, summary.stop_reason)
        summary.runs_as = {e.name: ran for e in self.engines
                           if (ran := e.startup.effective_mode) and ran != e.mode.value}
        return summary

    def _first_starts(self, t0: float, summary: RaceSummary) -> str:
        """The session's first wave (after a compile wave for cold caches), then the rounds."""
        c = self.config
        arms = [a for a in self.arms if a.is_default or a.state == "pending"]
        default = next(a for a in self.arms if a.is_default)
        if c.warm_compile:
            # replica 0 compiles; the other replicas get a copy of its cache (never one cache written by two)
            cold = [a for a in arms if not self._cache_warm(a)]
            if cold:
                self._start(cold, t0, summary, kind="compile")
            for arm in arms:
                if arm.state == "failed":  # its replicas would only compile cold: the arm fails with it
                    for e in self.replicas[arm.name][1:]:
                        e.state, e.failure = "failed", arm.failure
                else:
                    self._copy_cache(arm)
            arms = [a for a in arms if a.state != "failed"]
            if default.state == "failed":
                for arm in arms:
                    self._stop_arm(arm, "not started: the default's compile start failed")
                first = (default.failure or "").splitlines()
                return "the default's engine failed" + (f": {first[0]}" if first else "")
            if self.prior_gpu_s / 60 + (time.time() - t0) / 60 >= c.budget_min:
                for arm in arms:
                    self._stop_arm(arm, "not started: budget spent by the compile starts")
                return f"budget of {c.budget_min:g} GPU-minutes spent (compile starts)"
        self._start([e for a in arms for e in self.replicas[a.name] if e.state != "failed"], t0, summary)
        return self._rounds(t0, summary)

    def _rounds(self, t0: float, summary: RaceSummary) -> str:
        c = self.config
        default = next(a for a in self.arms if a.is_default)
        vocab = int(self.profiler.shape.get("vocab_size") or DEFAULT_VOCAB)
        while True:
            if self.arm_state(default) != "live":
                for arm in self.challengers:
                    if self.arm_state(arm) == "live":
                        self._stop_arm(arm, "stopped: the default's engine is down")
                first = (self.arm_failure(default) or "").splitlines()
                return "the default's engine failed" + (f": {first[0]}" if first else "")
            live = [a for a in self.challengers if self.arm_state(a) == "live"]
            if not live:
                return "every arm decided" if all(self.arm_state(a) == "decided" for a in self.challengers) \
                    else "no challenger left running"
            spent = self.prior_gpu_s / 60 + (time.time() - t0) / 60
            if spent >= c.budget_min:
                return f"budget of {c.budget_min:g} GPU-minutes spent"
            if summary.rounds_run >= c.max_rounds:
                return f"{c.max_rounds} rounds run (max_rounds)"
            workload = next_workload(self.order, self.table.rounds_per_workload(), self._open_workloads(live))
            if workload is None:
                for arm in live:
                    self._stop_arm(arm, "no workload left that could decide it")
                return "no open workload left: the remaining verdicts depend on the workload"
            round_ = self.next_round
            self.next_round += 1
            arms = [default, *live]
            random.Random(f"{self.key}:{round_}").shuffle(arms)
            # one engine per arm, replica r of every arm meeting replica r of the default
            slot = replica_slot([w.name for w in self.order], self.table.rounds_per_workload(), workload.name,
                                len(self.replicas[default.name]))
            order = [e for a in arms if (e := self.pick(a, slot)) is not None]
            resident = sum(1 for e in self.engines if e.state == "live")
            self.reporter.round_starting(round_, workload, order)
            idle_gpu = self._idle_gpu_util()
            round_t0 = time.time()
            for pos, arm in enumerate(arms):
                while self.arm_state(default) == "live":  # else nothing left to pair with this round
                    engine = self.pick(arm, slot)
                    if engine is None or self._cell(engine, pos, resident, workload, round_, round_t0, idle_gpu,
                                                    vocab, t0, summary):
                        break
                    # that replica died: the arm's next live replica takes the cell
            summary.rounds_run += 1
            self.round_walls.append(time.time() - round_t0)
            self._mark_session(t0)
            verdicts = self.verdicts()
            for arm in self.challengers:
                v = verdicts[arm.name]
                if self.arm_state(arm) == "live" and v.settled(c.metrics, c.rule.delta):
                    self._stop_arm(arm, "decided on every metric" if v.decided(c.metrics) else
                                   "worse on one metric and not better on the others", state="decided")
            spent = self.prior_gpu_s / 60 + (time.time() - t0) / 60
            self.reporter.round_finished(round_, verdicts, spent)
            if spent < c.budget_min:
                self._restart_wave(default, t0, summary, spent)

    def _open_workloads(self, live: list[Arm]) -> set[str]:
        verdicts = self.verdicts()
        open_names: set[str] = set()
        for arm in live:
            v = verdicts[arm.name]
            for metric in self.config.metrics:
                if v.pooled[metric].decided:
                    continue
                open_names |= {w for (m, w), d in v.by_workload.items() if m == metric and not d.decided}
        return open_names

    def _cell(self, arm: Arm, pos: int, resident: int, workload: Workload, round_: int, round_t0: float,
              idle_gpu: float | None, vocab: int, t0: float, summary: RaceSummary) -> bool:
        """Measure *arm*'s engine's cell; False when the engine was found dead (and is failed now)."""
        server = arm.server
        if arm.state != "live" or server is None:
            return True
        try:
            server.check_alive()  # it may have died while it waited
        except EngineDiedError as exc:
            self._fail(arm, workload, round_, exc.reason(), t0, summary)
            return False
        idle = engine_cores(arm.idle_since, counters(server.pid)) if arm.idle_since else None
        # every other resident engine (all replicas): what ran beside this cell
        others = [a for a in self.engines if a is not arm and a.state == "live" and a.server is not None]
        before = [counters(a.server.pid) for a in others if a.server is not None]
        assert arm.fingerprint is not None
        try:
            record = self.profiler.measure_cell(server, arm.served, vocab, arm.mode, workload, round_,
                                                arm.startup, arm.fingerprint)
        except EngineDiedError as exc:
            self._fail(arm, workload, round_, exc.reason(), t0, summary)
            return False
        after = [counters(a.server.pid) for a in others if a.server is not None]
        # the next engine's cell starts once this one has dropped the requests its cell cut
        _wait_idle(server, self.config.profile.idle_timeout_s)
        loads = [engine_cores(b, a) for b, a in zip(before, after, strict=True)]
        known = [x for x in loads if x is not None]
        record.race = self._info(arm, round_, pos, resident, round_t0, t0)
        record.race.idle_cpu_cores = idle
        record.race.neighbours_cpu_cores = round(sum(known), 2) if known else None
        record.race.idle_gpu_util_pct = idle_gpu
        self.store.append(record, workload.spec_hash())
        arm.idle_since = counters(server.pid)
        if record.status == "ok":
            summary.cells_ok += 1
            lat = record.latency
            self.table.add(arm.name, round_, workload.name, {m: getattr(lat, m, None) for m in self.config.metrics},
                           start=arm.start_id, excluded=bool(record.conditions.engine_jit_kernels))
        else:
            summary.cells_failed += 1
        self.reporter.cell_finished(record)
        return True

    def _info(self, arm: Arm, round_: int, pos: int | None, live: int | None, round_t0: float | None,
              t0: float) -> RaceInfo:
        return RaceInfo(id=self.key, round=round_, arm=arm.name, requested_mode=arm.mode.value, position=pos,
                        live_engines=live, port=arm.port, start_id=arm.start_id, session_t0=t0,
                        round_t0=round_t0, starts_wall_s=self.starts_wall_s,
                        capture_sizes=list(arm.sizes) if arm.sizes is not None else None)

    def _fail(self, arm: Arm, workload: Workload, round_: int, reason: str, t0: float,
              summary: RaceSummary) -> None:
        """The engine is gone: one failed row with vLLM's root cause; the race goes on without it (an arm
        with replicas goes on with its other ones)."""
        arm.state, arm.failure = "failed", reason
        if arm.server is not None:
            arm.server.stop()
        now = time.time()
        record = CellRecord(
            run_id=self.run_id, profile_key=self.profiler.key, mode=arm.mode.value, workload=workload.name,
            workload_spec=workload.spec(), repeat=round_, status="failed", reason=reason, started_at=now,
            finished_at=now, startup=arm.startup, fingerprint=arm.fingerprint or Fingerprint(),
            race=self._info(arm, round_, None, None, None, t0),
        )
        self.store.append(record, workload.spec_hash())
        summary.cells_failed += 1
        self.reporter.engine_failed(arm)

    def _open_reasons(self, verdicts: dict[str, ArmVerdicts], stop_reason: str) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for arm in self.challengers:
            v = verdicts[arm.name]
            for metric, d in v.pooled.items():
                if d.decided:
                    continue
                why = v.workload_dependent(metric) or d.why
                failure = self.arm_failure(arm)
                if failure:
                    why += f"; the engine failed: {failure.splitlines()[0]}"
                elif not v.decided(v.pooled) and v.settled(v.pooled, self.config.rule.delta):
                    lost = ", ".join(m for m, x in v.pooled.items() if x.verdict == "worse")
                    why += f"; arm stopped: worse on {lost} and not better here"
                elif stop_reason:
                    why += f"; race stopped: {stop_reason}"
                    plan = needed_to_decide(d, self.config.rule)
                    if plan:
                        why += f"; {plan}"
                out.setdefault(arm.name, {})[metric] = why
        return out
