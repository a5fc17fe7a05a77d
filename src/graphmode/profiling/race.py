"""A race: the candidate modes' vLLM engines resident side by side on one GPU, measured in paired rounds.

Why
    Between two starts of one mode, latency moved by 10–28% on the small shapes (docs/results), more
    than the modes differ, so a grid that starts each mode once per repeat needs many repeats. Engines that
    stay up side by side and take turns on the same workload see the same host state within seconds: the
    ratio mode / default inside a round cancels most of it.

How
    1. Start the default and every undecided challenger at once (``stagger_s`` apart), each on its own port
       (``port``, ``port + 1``, ...). With ``kv_cache_memory_bytes`` every engine gets that KV share and
       ``--gpu-memory-utilization`` is replaced by a small value, because vLLM's start-up check of free
       memory against that fraction counts the neighbours' memory (issue 17's probe: "-2.96 GiB").
    2. Rounds: one workload (:mod:`graphmode.profiling.race_design`) on every live engine, one after the
       other, in an order shuffled each round (seeded by the race key and the round, so a resume repeats
       it): drift within a round and the carry-over from whichever engine ran just before hit every arm
       alike on average. A fixed rotation balances positions but keeps each arm's predecessor, which
       biased an A/A arm on a fake server. After its cell an engine is left to drop the requests the
       cell cut before the next engine's cell starts. Each cell is a normal dataset row plus race
       columns (:class:`graphmode.core.records.RaceInfo`).
    3. After each round, the sequential rule (:mod:`graphmode.profiling.sequential`) per (arm, metric) on
       ``ln(arm / default)``. An arm decided on every metric is stopped (frees the GPU); so is one worse on
       a metric whose intervals on the others rule out "better" (``ArmVerdicts.settled``); the default stays.
    4. Stop when every arm is decided, the design has no open workload, or the GPU-minutes (wall time of
       every session of this race, engine starts included) reach the budget.

Several starts per arm (``starts``, default 2)
    Pairing inside a round removes the host's drift but not the engine start: the first H200 races' A/A arm
    read 0.90× (0.82–0.99) on one shape. So every arm is restarted until its rounds come from ``starts``
    engine starts, and :mod:`graphmode.profiling.sequential` takes (arm start, default start) blocks as the
    unit of replication. Restarts come in *waves at a round boundary*, the default alone, then every live
    challenger (the A/A arm included) together, alternating: with two starts each that gives the chain of
    blocks (A1, D1), (A1, D2), (A2, D2), three blocks from two starts, where restarting both at once would
    give two. A wave starts once every live arm has ``block_rounds`` rounds in its current block (the
    first block ``max(min_rounds, block_rounds)``, so that clearly slower modes are called "worse" from one
    start and stopped before they cost a restart).

    Why waves at a boundary rather than rounds going on while one engine restarts: the default is in
    every pair, so while it restarts no round pairs anything; and restarting the challengers one at a time
    under live rounds would put one start's compile and graph capture (host CPU, GPU) beside every cell
    measured meanwhile, and cost one start per challenger, where starts overlapped on one GPU take about
    one start's time (six engines: 114–240 s cold, one engine 60–90 s warm). So a wave costs about one
    warm start of dead time, and ``starts`` = N costs ``2(N − 1)`` waves. An arm keeps its compile cache
    (``VLLM_CACHE_ROOT``) across its restarts: every start after the first is warm, and with the compile
    start below the first measured start is warm too.

    A wave the budget left cannot pay for (the latest start wave's wall plus ``block_rounds`` rounds at the
    mean of the last three) is skipped, and no later wave of the session starts: on the H200 a challengers'
    wave at 8.9 of 10 GPU-minutes took 80 s and left no round to pair the new starts.

Compile start (``warm_compile``, default on)
    Before the first measured round of a session, every arm about to start whose compile cache is cold (its
    ``VLLM_CACHE_ROOT``, the per-arm ``log_dir/vllm-cache/ARM`` or the one the environment sets, is missing
    or holds no file) is started once, stopped as soon as it is healthy, and started again; all such arms
    overlap in one wave before any round. Why: without it every arm's first start compiles cold and is
    measured, so cold/warm is a hidden factor that differs between starts. On the H200 (vLLM 0.24,
    Qwen2.5-0.5B shape, ``bench/gpu/start_effect.py``, ``docs/results/start-effect-h200-2026-12-01/``) six
    engines of the default started side by side on empty caches, then restarted on their warm caches in
    two staggered waves: paired by slot (n = 6) with round (clock) effects in the model, the warm restart
    was faster than the cold start, ITL p50 at concurrency 1 0.88× [0.83–0.93] and TTFT p50 0.83×
    [0.78–0.87]; with cold/warm in the model the start-to-start CV left was 2.8% [0–8.9] on ITL. The cold
    wave of six took 210 s, a warm wave of three 53–60 s.

    The compile start measures nothing and is no start of the race: it writes no row, does not count
    towards ``starts`` and leaves the start ids (``RUN_ID:ARM:K``) numbered as without it; its log is
    ``RUN_ID-ARM-compile.log``. It is GPU time, so the budget counts it (``RaceSummary.compile_starts``,
    ``compile_wall_s``). An arm whose compile start fails is failed like any start failure, with vLLM's
    root cause (its row's start id ends in ``:0``). Arms with a warm cache skip it (a resume, a second race
    with the same log dir). With one cache shared by every arm (``VLLM_CACHE_ROOT`` set by the user) a
    cache holding any file counts as warm for every mode.

Engine warm-up (``engine_warmup_s``; 1.5 s from the CLI's settings)
    After every measured start (first wave and restarts), each engine runs every workload of the design
    for ``engine_warmup_s`` seconds, unmeasured, before its first cell. vLLM compiles some Triton kernels on
    first use and only warns (``jit_monitor``): on the H200 (vLLM 0.33, 2026-12-03) every engine compiled
    its sampling kernel in its first cell and the 30B MoE its ``fused_moe_kernel`` in the first
    prefill-heavy cell, where FULL's ITL read 1.90× the default's against 0.96–1.05× in the other rounds.
    A cell whose engine still logs such a compile (``engine_jit_kernels``) keeps its row, and its round
    pairs with nothing (``race_rounds.jit_tainted``). The warm-up is GPU time: the budget counts it
    (``RaceSummary.warmup_wall_s``).

Resident replicas (``replicas``, default 1)
    Restart waves give an arm one start per ~80 s wave, and each start carries its own offset (sd ~2.5% on
    the H200), so certifying small differences needs many starts. With ``replicas`` R > 1 every arm (the
    default, challengers, CONTROL, sizes arms) keeps R engines resident side by side instead, all started in
    one overlapped wave: replica r of arm i on ``port + r * arms + i`` (replica 0 keeps the ports of R = 1),
    start id ``RUN_ID:ARM:r+1``, its own compile cache (``log_dir/vllm-cache-rR/ARM`` for r > 0). The compile
    start compiles replica 0 only and copies its cache into the others (``shutil.copytree``) before the
    measured wave: no two engines write one cache, none compiles cold. A round measures replica
    :func:`replica_slot` mod R of every live arm (else its next live one), one cell per arm in the usual
    shuffled order, so the blocks are the diagonal pairs (A_r, D_r): disjoint, design effect 1, the
    sequential rule unchanged, with ``min_starts`` 2. The slot cycles per workload too: with two workloads in
    turn and R = 4, round k mod R gave each workload only two of the four replicas (lease 8's 1B race: every
    per-workload verdict had two start blocks, too few for an interval over starts). No restart waves
    (``starts`` must be 1 or R). A replica whose engine dies is failed (a row with vLLM's root cause) and the
    arm goes on with the others; the arm fails when all have. A decided arm stops all its replicas.
    ``replicas`` enters the race key only when R > 1.

Capture-size arms (``sizes_arms``, issue 14)
    A challenger may be the default mode with a given ``cudagraph_capture_sizes`` list instead of another
    mode (:mod:`graphmode.profiling.race_sizes`): it is raced, restarted, compiled, resumed and decided like
    any arm, under its own name, with its list in its rows (``race_capture_sizes``) and in the race key.

Resume
    The race key is the profile key plus the race settings that shape a verdict. A new session with the
    same key reads the race's rows, reuses every measured round, starts only arms still undecided and
    numbers its rounds after the last one. Each arm's starts that measured a round in earlier sessions
    count towards ``starts`` (a session necessarily starts its engines anew: a resume adds a start to
    every arm it races, and restarts only what still lacks starts). ``starts`` is not part of the race key,
    so a race run with one start can be resumed with two. An arm whose engine died in an earlier session is tried again
    (a failure is not a verdict); within a session a failed arm stays down.

Idle load
    While an engine waits for its turn its process tree's CPU seconds per second are recorded
    (``race_idle_cpu_cores``), the other engines' during each cell (``race_neighbours_cpu_cores``), and
    the GPU's utilisation over ``idle_probe_s`` with every engine idle at each round's start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import ConfigError, EngineDiedError, EngineStartError
from graphmode.core.fingerprint import build_fingerprint, torch_version_of
from graphmode.core.modes import DEFAULT_MODE, CudaGraphMode
from graphmode.core.records import CellRecord, Fingerprint, RaceInfo, StartupInfo
from graphmode.profiling.engine import VllmServer
from graphmode.profiling.gpu import MemorySampler, process_gpu_gib
from graphmode.profiling.grid import Workload
from graphmode.profiling.hostload import Counters, counters, engine_cores, tree_pids
from graphmode.profiling.race_design import next_workload, race_cell, spread_order
from graphmode.profiling.race_fit import check_fit
from graphmode.profiling.race_rounds import (
    CONTROL_ARM,
    DEFAULT_ARM,
    RACE_METRICS,
    ArmVerdicts,
    RoundTable,
    arm_verdicts,
    table_from_rows,
)
from graphmode.profiling.race_sizes import SizesArm, check_sizes_arms, sizes_arm_args
from graphmode.profiling.runner import DEFAULT_VOCAB, ProfileConfig, Profiler, _served_model, _wait_idle
from graphmode.profiling.sequential import SequentialRule, needed_to_decide
from graphmode.vllm_args import without_flags

ArmState = Literal["pending", "live", "decided", "failed", "stopped"]


@dataclass
class RaceConfig:
    profile: ProfileConfig  # command, vLLM args, modes, the workload design, dataset, logs, host, first port
    rule: SequentialRule = field(default_factory=SequentialRule)
    metrics: tuple[str, ...] = RACE_METRICS
    budget_min: float = 10.0
    max_rounds: int = 200
    control: bool = False
    kv_cache_memory_bytes: str | None = None
    gpu_memory_utilization: float = 0.05
    stagger_s: float = 0.0
    cell_s: float = 3.0
    warmup_s: float = 2.0
    idle_probe_s: float = 0.5
    separate_caches: bool = True  # each arm its own VLLM_CACHE_ROOT unless the environment sets one
    starts: int = 2  # engine starts behind every arm's rounds (the default's too)
    block_rounds: int = 2  # rounds in a block before the next restart wave
    warm_compile: bool = True  # a cold arm's first start only compiles (see "Compile start" above)
    # per workload, unmeasured, after every start ("Engine warm-up" above); the CLI takes 1.5 from the
    # settings, code that builds a RaceConfig (the tests) opts in
    engine_warmup_s: float = 0.0
    sizes_arms: tuple[SizesArm, ...] = ()  # the default mode with these capture sizes (race_sizes.py)
    replicas: int = 1  # engines of every arm resident side by side (see "Resident replicas" above)


@dataclass
class Arm:
    name: str
    mode: CudaGraphMode
    port: int
    state: ArmState = "pending"
    server: VllmServer | None = None
    startup: StartupInfo = field(default_factory=StartupInfo)
    fingerprint: Fingerprint | None = None
    served: str = ""
    failure: str | None = None
    idle_since: Counters | None = None
    stop_reason: str | None = None
    starts_before: int = 0  # starts that measured a round in earlier sessions of this race
    session_starts: int = 0
    run_id: str = ""
    sizes: tuple[int, ...] | None = None  # a capture-size arm's list; None: vLLM's default list
    replica: int = 0  # which of the arm's resident engines this is (``replicas``)
    replicas: int = 1

    @property
    def starts(self) -> int:
        return self.starts_before + self.session_starts

    @property
    def start_id(self) -> str:
        # replica r's one start of the session is its start r + 1 (replicas never restart)
        return f"{self.run_id}:{self.name}:{self.session_starts + self.replica}"

    @property
    def label(self) -> str:
        """The arm's name, with the replica when the arm has several engines."""
        return self.name if self.replicas == 1 else f"{self.name}/r{self.replica}"

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_ARM


class RaceReporter(Protocol):
    def compile_starting(self, arms: Sequence[Arm]) -> None: ...
    def compiled(self, arm: Arm) -> None: ...
    def engines_starting(self, arms: Sequence[Arm]) -> None: ...
    def engine_started(self, arm: Arm) -> None: ...
    def engine_failed(self, arm: Arm) -> None: ...
    def round_starting(self, round_: int, workload: Workload, order: Sequence[Arm]) -> None: ...
    def cell_finished(self, record: CellRecord) -> None: ...
    def round_finished(self, round_: int, verdicts: dict[str, ArmVerdicts], spent_min: float) -> None: ...
    def engine_stopped(self, arm: Arm) -> None: ...
    def wave_skipped(self, wave: Sequence[Arm], left_s: float, need_s: float) -> None: ...


class NullRaceReporter:
    def compile_starting(self, arms: Sequence[Arm]) -> None: ...
    def compiled(self, arm: Arm) -> None: ...
    def engines_starting(self, arms: Sequence[Arm]) -> None: ...
    def engine_started(self, arm: Arm) -> None: ...
    def engine_failed(self, arm: Arm) -> None: ...
    def round_starting(self, round_: int, workload: Workload, order: Sequence[Arm]) -> None: ...
    def cell_finished(self, record: CellRecord) -> None: ...
    def round_finished(self, round_: int, verdicts: dict[str, ArmVerdicts], spent_min: float) -> None: ...
    def engine_stopped(self, arm: Arm) -> None: ...
    def wave_skipped(self, wave: Sequence[Arm], left_s: float, need_s: float) -> None: ...


@dataclass
class RaceSummary:
    race_id: str
    run_id: str
    profile_key: str
    rounds_before: int = 0
    rounds_run: int = 0
    cells_ok: int = 0
    cells_failed: int = 0
    engine_starts: int = 0
    restarts: int = 0  # of engine_starts: restart waves' (several starts per arm)
    restart_wall_s: float = 0.0
    starts_wall_s: float | None = None
    compile_starts: int = 0  # not in engine_starts: a cold arm's start that only compiled (warm_compile)
    compile_wall_s: float = 0.0
    warmup_wall_s: float = 0.0  # engine warm-ups (engine_warmup_s), all starts of this session
    waves_skipped: int = 0  # 1 once a restart wave was due that the budget left could not pay for
    gpu_min: float = 0.0  # this session
    gpu_min_total: float = 0.0  # every session of this race
    stop_reason: str = ""
    verdicts: dict[str, ArmVerdicts] = field(default_factory=dict)
    arm_states: dict[str, str] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # arms whose every engine failed
    replica_failures: dict[str, str] = field(default_factory=dict)  # ARM/rN -> why (replicas > 1)
    open_reasons: dict[str, dict[str, str]] = field(default_factory=dict)  # arm -> metric -> why undecided
    # arm -> the mode vLLM ran instead of the one asked for (FULL on FlashInfer runs FULL_AND_PIECEWISE):
    # such an arm's verdicts compare that mode, an A/A comparison where it is the default's
    runs_as: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """A plain verdict table, one line per (arm, metric)."""
        out = []
        for arm, v in sorted(self.verdicts.items()):
            for metric, d in v.pooled.items():
                why = self.open_reasons.get(arm, {}).get(metric)
                ran = self.runs_as.get(arm)
                note = f" — runs as {ran} (vLLM downgraded it)" if ran else ""
                out.append(f"{arm:<20} {metric:<9} {d.describe()}" + (f" — {why}" if why else "") + note)
        for arm, reason in sorted(self.failures.items()):
            out.append(f"{arm:<20} FAILED    {reason.splitlines()[0] if reason else ''}")
        for label, reason in sorted(self.replica_failures.items()):
            if label.rsplit("/", 1)[0] not in self.failures:
                out.append(f"{label:<20} REPLICA FAILED {reason.splitlines()[0] if reason else ''}")
        return out


def wave_due(starts: int, block_rounds: int, min_rounds: int, default_starts: int,
             live: Sequence[tuple[int, int]]) -> Literal["default"] | tuple[int, ...] | None:
    """The restart wave due after a round: ``"default"``, the indices of the *live* challengers to restart,
    or None. *live* holds each live challenger's (starts so far, rounds in its current block). Kept apart
    from the race loop so that ``bench/race_plan.py`` simulates the blocks a race really makes."""
    if starts <= 1 or not live:
        return None
    for arm_starts, rounds in live:
        first = arm_starts == 1 and default_starts == 1
        if rounds < (max(min_rounds, block_rounds) if first else block_rounds):
            return None
    if default_starts < starts and default_starts <= min(s for s, _ in live):
        return "default"
    wave = tuple(i for i, (s, _) in enumerate(live) if s < min(starts, default_starts))
    return wave or None


def check_replicas(replicas: int, starts: int, control: bool = False) -> None:
    """Replicas give every arm its starts at once: restart waves on top of them are not supported. Two
    replicas make two start blocks, whose interval needs the A/A arm's start variance (sequential.py)."""
    if replicas > 1 and starts not in (1, replicas):
        raise ConfigError(f"--starts {starts} with --replicas {replicas}: resident replicas give every arm "
                          f"{replicas} starts in one start wave and never restart; use --starts 1 or "
                          f"--starts {replicas} (or leave --starts out)")
    if replicas == 2 and not control:
        raise ConfigError("--replicas 2 makes two start blocks, which give an interval only with the A/A arm's "
                          "start variance: add --control, or use --replicas 3 or more")


def race_key(profile_key: str, config: RaceConfig, design: Sequence[Workload]) -> str:
    """What must match for a session to continue a race: the profile key and what shapes its verdicts."""
    payload = json.dumps({
        "profile": profile_key, "delta": config.rule.delta, "confidence": config.rule.confidence,
        "min_rounds": config.rule.min_rounds, "metrics": list(config.metrics),
        "modes": sorted(m.value for m in config.profile.modes), "control": config.control,
        "design": sorted(w.spec_hash() for w in design),
        # only when there are any: the keys of races without capture-size arms stay as they were
        **({"sizes_arms": sorted([a.name, list(a.sizes)] for a in config.sizes_arms)} if config.sizes_arms else {}),
        **({"replicas": config.replicas} if config.replicas > 1 else {}),
    }, sort_keys=True)
    return "race-" + hashlib.sha256(payload.encode()).hexdigest()[:12]


def race_vllm_args(args: list[str], kv_cache_memory_bytes: str | None, gpu_memory_utilization: float) -> list[str]:
    """The vLLM args every engine of a race gets: its KV share and a start-up check that ignores neighbours."""
    if kv_cache_memory_bytes is None:
        return list(args)
    out = without_flags(args, "--kv-cache-memory-bytes", "--gpu-memory-utilization")
    return [*out, "--kv-cache-memory-bytes", str(kv_cache_memory_bytes),
            "--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]


def replica_slot(order: Sequence[str], rounds: Mapping[str, int], workload: str, replicas: int) -> int:
    """Which replica a round of *workload* measures (mod R): its place ``v = c · W + i`` in a round-robin
    over the W workloads of *order* (``c`` its rounds so far, ``i`` its index), plus one per ``lcm(W, R)``
    when W and R share a factor (coprime, ``v mod R`` already cycles every workload through every replica).
    In turn, consecutive rounds meet consecutive replicas (three rounds, three start blocks), and every
    workload meets every replica within R of its rounds: ``v mod R`` alone gave a workload only the replicas
    of its residue class when W and R share a factor (lease 8, two workloads and R = 4: two of four).
    """
    w = max(len(order), 1)
    r = max(replicas, 1)
    i = order.index(workload) if workload in order else 0
    v = rounds.get(workload, 0) * w + i
    g = math.gcd(w, r)
    return v if g == 1 else v + v // (w * r // g)


class Racer:
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

    def vllm_args(self, arm: Arm) -> list[str]:
        """The args *arm*'s engine gets (before its mode): a capture-size arm's list merged in."""
        args = self.config.profile.vllm_args
        if arm.sizes is None:
            return list(args)
        return sizes_arm_args(args, SizesArm(arm.name, arm.sizes))

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
        return {a.name: arm_verdicts(self.table, a.name, self.config.metrics, self.rule, names)
                for a in self.challengers}

    # ------------------------------------------------------------------ the race
    def check_fit(self, arms: Sequence[Arm] | None = None) -> None:
        """ConfigError when *arms*' engines (every replica) cannot all be resident on this GPU (race_fit)."""
        engines = sum(len(self.replicas[a.name]) for a in (arms if arms is not None else self.arms))
        gib = self.profiler.gpu.get("gpu_memory_gib")
        check_fit(engines, self.config.profile.vllm_args, float(gib) if isinstance(gib, int | float) else None,
                  self.config.kv_cache_memory_bytes,
                  None if self.config.kv_cache_memory_bytes else self.config.gpu_memory_utilization)

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
                # lease 10: a call with the budget it had had before looked like a race that would go on
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
                # race would go on one replica short without a word (CI, 2026-12-03: a parser SystemError)
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
        """Every workload on every fresh engine, unmeasured (see "Engine warm-up" above)."""
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
