"""The compile start (``warm_compile``) against ``tests/support/fake_vllm.py`` servers.

The fake writes a file under ``$VLLM_CACHE_ROOT`` when it starts, as vLLM's compile does, and
``FAKE_VLLM_COLD_STARTUP_S`` makes a start on an empty cache slower: a measured start after the compile
start is warm, one without it is cold.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from rich.console import Console

from graphmode.cli.race_view import PlainRaceReporter, print_summary
from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import CellRecord
from graphmode.core.settings import RaceSettings
from graphmode.profiling.grid import Workload
from graphmode.profiling.race import Arm, Racer, RaceSummary
from graphmode.profiling.race_rounds import DEFAULT_ARM, ArmVerdicts
from tests.unit.test_race_fake import race_config
from tests.unit.test_runner_fake import TINY_LLAMA

pytestmark = pytest.mark.timeout(180)
COLD_S = 1.5  # extra start-up of the fake on an empty cache
COLD = {"FAKE_VLLM_COLD_STARTUP_S": str(COLD_S)}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProfileStore]:
    with ProfileStore(tmp_path / "race.sqlite") as s:
        yield s


class Events(PlainRaceReporter):
    """The plain reporter's lines, and the order of the race's events."""

    def __init__(self) -> None:
        self.buf = io.StringIO()
        super().__init__(Console(file=self.buf, width=200))
        self.events: list[tuple[str, tuple[str, ...]]] = []

    def compile_starting(self, arms: Sequence[Arm]) -> None:
        super().compile_starting(arms)
        self.events.append(("compile", tuple(a.name for a in arms)))

    def compiled(self, arm: Arm) -> None:
        super().compiled(arm)
        self.events.append(("compiled", (arm.name,)))

    def engine_failed(self, arm: Arm) -> None:
        super().engine_failed(arm)
        self.events.append(("failed", (arm.name,)))

    def engines_starting(self, arms: Sequence[Arm]) -> None:
        super().engines_starting(arms)
        self.events.append(("start", tuple(a.name for a in arms)))

    def round_starting(self, round_: int, workload: Workload, order: Sequence[Arm]) -> None:
        super().round_starting(round_, workload, order)
        self.events.append(("round", (str(round_),)))

    def cell_finished(self, record: CellRecord) -> None: ...

    def round_finished(self, round_: int, verdicts: dict[str, ArmVerdicts], spent_min: float) -> None: ...


def test_cold_caches_get_one_compile_wave_then_warm_measured_starts(tmp_path: Path, store: ProfileStore) -> None:
    config = race_config(tmp_path, [CudaGraphMode.NONE, CudaGraphMode.FULL], env=COLD, max_rounds=5,
                         starts=2, block_rounds=1)
    events = Events()
    racer = Racer(config, store, events)
    assert all(not racer.cache_root(a).exists() for a in racer.arms)
    summary = racer.run()
    assert not summary.failures, summary.failures
    names = (DEFAULT_ARM, "NONE", "FULL")
    # one compile wave of every arm, before any measured start or round
    assert events.events[0] == ("compile", names), events.events
    compiled = events.events[1:4]
    why = (events.events, events.buf.getvalue())
    assert sorted(e[1][0] for e in compiled) == sorted(names) and {e[0] for e in compiled} == {"compiled"}, why
    assert events.events[4] == ("start", names) and events.events[5][0] == "round"
    assert sum(1 for e in events.events if e[0] == "compile") == 1
    assert summary.compile_starts == 3 and summary.compile_wall_s >= COLD_S
    # the compile start is no start of the race: engine_starts and start ids as without it
    assert summary.engine_starts == 3 + summary.restarts and summary.restarts >= 1
    rows = store.race_rows(racer.key)
    ids = {r["race_start_id"] for r in rows}
    assert {i.rsplit(":", 1)[1] for i in ids} <= {"1", "2"} and f"{racer.run_id}:{DEFAULT_ARM}:1" in ids
    assert f"{racer.run_id}:{DEFAULT_ARM}:2" in ids, "the default's restart should be its start 2"
    # every measured start found its cache warm
    assert all(float(r["startup_s"]) < COLD_S for r in rows if r["startup_s"] is not None)
    logs = sorted(p.name for p in (tmp_path / "logs").glob("*.log"))
    assert {f"{racer.run_id}-{n}-compile.log" for n in names} <= set(logs)
    assert f"{racer.run_id}-{DEFAULT_ARM}.log" in logs and f"{racer.run_id}-{DEFAULT_ARM}-2.log" in logs
    assert all(racer.cache_root(a).is_dir() for a in racer.arms)
    # reported: the plain lines and the summary line
    assert "compile start (cold compile cache; measures nothing): FULL_AND_PIECEWISE" in events.buf.getvalue()
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=400))
    assert "3 compile starts (" in out.getvalue(), out.getvalue()
    # the budget counts the compile wave: the session's GPU time covers it
    assert summary.gpu_min * 60 + 0.6 >= summary.compile_wall_s  # gpu_min is rounded to 0.01


def test_warm_caches_skip_the_compile_start(tmp_path: Path, store: ProfileStore) -> None:
    # the default's cache already holds a file (an earlier race with this log dir): only NONE compiles
    warm = tmp_path / "logs" / "vllm-cache" / DEFAULT_ARM / "torch_compile_cache"
    warm.mkdir(parents=True)
    (warm / "old.json").write_text("{}")
    (tmp_path / "logs" / "vllm-cache" / "NONE").mkdir()  # an empty directory is cold
    events = Events()
    first = Racer(race_config(tmp_path, [CudaGraphMode.NONE], env=COLD, max_rounds=2), store, events).run()
    assert events.events[0] == ("compile", ("NONE",)) and first.compile_starts == 1
    # a resume finds every cache warm: no compile wave
    again = Events()
    second = Racer(race_config(tmp_path, [CudaGraphMode.NONE], env=COLD, max_rounds=4), store, again).run()
    assert second.compile_starts == 0 and second.compile_wall_s == 0
    assert second.engine_starts >= 1 and not any(e[0] == "compile" for e in again.events)
    assert "0 compile starts" in _summary_line(second)


def test_no_warm_compile_measures_the_cold_start(tmp_path: Path, store: ProfileStore) -> None:
    events = Events()
    racer = Racer(race_config(tmp_path, [CudaGraphMode.NONE], env=COLD, max_rounds=2, warm_compile=False),
                  store, events)
    summary = racer.run()
    assert summary.compile_starts == 0 and summary.engine_starts == 2
    assert events.events[0] == ("start", (DEFAULT_ARM, "NONE"))
    assert not list((tmp_path / "logs").glob("*-compile.log"))
    rows = store.race_rows(racer.key)
    timed = [float(r["startup_s"]) for r in rows if r["startup_s"] is not None]
    assert timed and all(t >= COLD_S for t in timed), "the measured start was not the cold one"


def test_compile_start_failure_fails_the_arm_with_vllms_reason(tmp_path: Path, store: ProfileStore) -> None:
    config = race_config(tmp_path, [CudaGraphMode.NONE, CudaGraphMode.FULL], max_rounds=3,
                         env={"FAKE_VLLM_FAIL_AT_START": "FULL"})
    racer = Racer(config, store)
    summary = racer.run()
    assert summary.compile_starts == 3 and summary.engine_starts == 2, "FULL started again after failing"
    assert summary.arm_states["FULL"] == "failed" and "refuses cudagraph_mode FULL" in summary.failures["FULL"]
    failed = [r for r in store.race_rows(racer.key) if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["race_arm"] == "FULL"
    assert failed[0]["race_start_id"] == f"{racer.run_id}:FULL:0", "a compile start is no start of the arm"
    assert summary.rounds_run == 3 and {r["race_arm"] for r in store.rows(status="ok")} == {DEFAULT_ARM, "NONE"}


def test_default_compile_failure_starts_nothing(tmp_path: Path, store: ProfileStore) -> None:
    config = race_config(tmp_path, [CudaGraphMode.NONE], env={"FAKE_VLLM_FAIL_AT_START": DEFAULT_ARM})
    summary = Racer(config, store).run()
    assert summary.engine_starts == 0 and summary.compile_starts == 2 and summary.rounds_run == 0
    assert summary.stop_reason.startswith("the default's engine failed")
    assert "refuses cudagraph_mode FULL_AND_PIECEWISE" in summary.failures[DEFAULT_ARM]
    assert summary.arm_states == {DEFAULT_ARM: "failed", "NONE": "stopped"}


def test_budget_counts_the_compile_wave(tmp_path: Path, store: ProfileStore) -> None:
    # 1.2 GPU-seconds of budget: the compile wave (~1.5 s cold) spends it, no measured start follows
    config = race_config(tmp_path, [CudaGraphMode.FULL], env=COLD, budget_min=0.02)
    summary = Racer(config, store).run()
    assert summary.compile_starts == 2 and summary.engine_starts == 0 and summary.rounds_run == 0
    assert "budget" in summary.stop_reason and "compile" in summary.stop_reason, summary.stop_reason
    assert summary.gpu_min * 60 + 0.6 >= summary.compile_wall_s >= COLD_S  # gpu_min is rounded to 0.01
    assert "budget" in summary.open_reasons["FULL"]["itl_p50"]
    # the session's GPU time is kept though it wrote no row: a resume finds the budget spent
    again = Racer(race_config(tmp_path, [CudaGraphMode.FULL], env=COLD, budget_min=0.02), store).run()
    assert again.engine_starts == 0 and again.compile_starts == 0 and "earlier sessions" in again.stop_reason


def test_cache_root_is_the_environments_when_set(tmp_path: Path, store: ProfileStore) -> None:
    shared = tmp_path / "shared-cache"
    racer = Racer(race_config(tmp_path, [CudaGraphMode.NONE], env={"VLLM_CACHE_ROOT": str(shared)}), store)
    assert {racer.cache_root(a) for a in racer.arms} == {shared}
    own = Racer(race_config(tmp_path, [CudaGraphMode.NONE]), store)
    assert own.cache_root(own.arms[1]) == tmp_path / "logs" / "vllm-cache" / "NONE"


def test_setting_and_cli_option(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from graphmode.cli.main import app

    assert RaceSettings().warm_compile is True
    base = ["profile", "--race", "--dataset", str(tmp_path / "d.sqlite"), "--vllm-cmd", f"{sys.executable} x",
            "--dry-run"]
    on = CliRunner().invoke(app, [*base, "--", "--model", str(TINY_LLAMA)])
    assert on.exit_code == 0 and "a compile start for cold caches" in on.output, on.output
    off = CliRunner().invoke(app, [*base, "--no-warm-compile", "--", "--model", str(TINY_LLAMA)])
    assert off.exit_code == 0 and "compile start" not in off.output, off.output
    # the engine warm-up (1.5 s per workload from the settings) is in the race's header, and can be turned off
    assert "1.5 s of every workload unmeasured after each start" in on.output, on.output
    bare = CliRunner().invoke(app, [*base, "--engine-warmup-s", "0", "--", "--model", str(TINY_LLAMA)])
    assert bare.exit_code == 0 and "unmeasured after each start" not in bare.output, bare.output


def _summary_line(summary: RaceSummary) -> str:
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=400))
    return out.getvalue()
