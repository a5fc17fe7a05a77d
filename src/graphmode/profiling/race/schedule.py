"""What a race is and when it does what: its settings, arms, summary, and the rules for restarts, replicas
and resuming.

Several starts per arm (``starts``, default 2)
    Pairing inside a round removes the host's drift but not the engine start: an A/A arm (a second start
    of the default) can read 0.90× on its own. So every arm is restarted until its rounds come from
    ``starts`` engine starts, and :mod:`graphmode.profiling.sequential` takes (arm start, default start)
    blocks as the unit of replication. Restarts come in waves at a round boundary (:func:`wave_due`), the
    default alone, then every live challenger together, alternating: with two starts each that gives the
    blocks (A1, D1), (A1, D2), (A2, D2), three blocks from two starts where restarting both at once gives
    two. A wave starts once every live arm has ``block_rounds`` rounds in its current block (the first block
    ``max(min_rounds, block_rounds)``, so that clearly slower modes are called "worse" from one start).
    The default is in every pair, so no round can pair anything while it restarts; overlapped starts on one
    GPU take about one start's time, so a wave costs about one warm start of dead time. A wave the budget
    left cannot pay for is skipped, and no later wave of the session starts.

Resident replicas (``replicas``, default 1)
    With R > 1 every arm keeps R engines resident side by side instead of restarting: replica r of arm i on
    ``port + r * arms + i``, start id ``RUN_ID:ARM:r+1``. A round measures replica :func:`replica_slot` of
    every live arm, so the blocks are the diagonal pairs (A_r, D_r). No restart waves (``starts`` must be 1
    or R, :func:`check_replicas`).

Resume
    The race key (:func:`race_key`) is the profile key plus the settings that shape a verdict. A session
    with the same key reuses every measured round, starts only undecided arms and counts each arm's earlier
    starts towards ``starts``. A failed arm is tried again in a new session (a failure is not a verdict).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from graphmode.core.errors import ConfigError
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import CellRecord, Fingerprint, StartupInfo
from graphmode.profiling.engine import VllmServer
from graphmode.profiling.grid import Workload
from graphmode.profiling.hostload import Counters
from graphmode.profiling.race_rounds import (
    DEFAULT_ARM,
    RACE_METRICS,
    ArmVerdicts,
)
from graphmode.profiling.race_sizes import SizesArm
from graphmode.profiling.runner import ProfileConfig
from graphmode.profiling.sequential import SequentialRule
from graphmode.vllm_args import without_flags

ArmState = Literal["pending", "live", "decided", "failed", "stopped"]

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

def race_vllm_args(args: list[str], kv_cache_memory_bytes: str | None, gpu_memory_utilization: float) -> list[str]:
    """The vLLM args every engine of a race gets: its KV share and a start-up check that ignores neighbours."""
    if kv_cache_memory_bytes is None:
        return list(args)
    out = without_flags(args, "--kv-cache-memory-bytes", "--gpu-memory-utilization")
    return [*out, "--kv-cache-memory-bytes", str(kv_cache_memory_bytes),
            "--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]


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
    warm_compile: bool = True  # a cold arm's first start only compiles (engines.py, "Compile start")
    # per workload, unmeasured, after every start (engines.py, "Engine warm-up"); the CLI takes 1.5 from the
    # settings, code that builds a RaceConfig (the tests) opts in
    engine_warmup_s: float = 0.0
    sizes_arms: tuple[SizesArm, ...] = ()  # the default mode with these capture sizes (race_sizes.py)
    replicas: int = 1  # engines of every arm resident side by side (module docstring, "Resident replicas")

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

def replica_slot(order: Sequence[str], rounds: Mapping[str, int], workload: str, replicas: int) -> int:
    """Which replica a round of *workload* measures (mod R): its place ``v = c · W + i`` in a round-robin
    over the W workloads of *order* (``c`` its rounds so far, ``i`` its index), plus one per ``lcm(W, R)``
    when W and R share a factor (coprime, ``v mod R`` already cycles every workload through every replica).
    In turn, consecutive rounds meet consecutive replicas (three rounds, three start blocks), and every
    workload meets every replica within R of its rounds: ``v mod R`` alone gave a workload only the replicas
    of its residue class when W and R share a factor (two workloads and R = 4: two of four).
    """
    w = max(len(order), 1)
    r = max(replicas, 1)
    i = order.index(workload) if workload in order else 0
    v = rounds.get(workload, 0) * w + i
    g = math.gcd(w, r)
    return v if g == 1 else v + v // (w * r // g)
