"""The API server's CPU (``frontend_cpu_cores``): parsed, windowed, stored, and turned into a note, never a mode."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.control.controller import Controller
from graphmode.control.policy import Policy, PolicyConfig
from graphmode.core.dataset import ProfileStore
from graphmode.core.records import CellRecord, ObservedFeatures
from graphmode.profiling.features import FeatureWindow, compute_features
from graphmode.profiling.metrics import MetricsSnapshot, parse_metrics
from graphmode.selector.aggregate import build_training_set
from graphmode.selector.featurize import OBS_FEATURES
from graphmode.selector.frontend import FRONTEND_SATURATED_CORES, frontend_note
from graphmode.selector.recommend import Recommender
from tests.unit.test_control_watch import FakeExecutor, advisor

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CPU_METRICS = FIXTURES / "vllm-0.32-cpu"
MODELS = ROOT / "models"
needs_bundled = pytest.mark.skipif(not any(MODELS.glob("nvidia-h200-vllm*")), reason="no bundled model")
TRAFFIC = {"arrival_rate": 8.0, "batch_mean": 6.0, "mean_input_tokens": 512.0, "mean_output_tokens": 128.0}


def _snap(t: float, cpu: float | None, gen: float = 0.0) -> MetricsSnapshot:
    return MetricsSnapshot(t=t, generation_tokens_total=gen, process_cpu_seconds_total=cpu)


# ------------------------------------------------------------------ parsing
def test_the_fixture_carries_the_api_servers_cpu_and_it_grows_under_load() -> None:
    idle = parse_metrics((CPU_METRICS / "metrics-idle.txt").read_text(), t=0.0)
    loaded = parse_metrics((CPU_METRICS / "metrics-after-load.txt").read_text(), t=1.0)
    assert idle.process_cpu_seconds_total == pytest.approx(7.19)
    assert loaded.process_cpu_seconds_total == pytest.approx(7.23)
    assert loaded.process_cpu_seconds_total > idle.process_cpu_seconds_total


def test_a_page_without_the_process_collector_reads_none() -> None:
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 3\n"
    snap = parse_metrics(text, t=0.0)
    assert snap.process_cpu_seconds_total is None and snap.num_requests_running == 3


# ------------------------------------------------------------------ the window
def test_cores_are_cpu_seconds_over_wall_seconds() -> None:
    feats = compute_features([_snap(0.0, 10.0), _snap(5.0, 12.5), _snap(10.0, 19.7)])
    assert feats.frontend_cpu_cores == pytest.approx(0.97)


def test_a_restart_starts_the_window_after_it() -> None:
    # the API server restarted between t=10 and t=12: its counter starts again near 0
    snaps = [_snap(0.0, 50.0, 100.0), _snap(10.0, 55.0, 200.0), _snap(12.0, 1.0, 5.0), _snap(22.0, 6.0, 50.0)]
    assert compute_features(snaps).frontend_cpu_cores == pytest.approx(0.5)
    # the CPU counter alone going down is a restart too (a fresh process)
    only_cpu = [_snap(0.0, 50.0, 100.0), _snap(10.0, 60.0, 100.0), _snap(20.0, 2.0, 100.0), _snap(30.0, 4.0, 100.0)]
    assert compute_features(only_cpu).frontend_cpu_cores == pytest.approx(0.2)
    window = FeatureWindow(60.0)
    for s in only_cpu:
        window.add(s)
    assert len(window) == 2 and window.features().frontend_cpu_cores == pytest.approx(0.2)


@pytest.mark.parametrize(
    "snaps",
    [
        [_snap(0.0, None), _snap(10.0, 5.0)],  # the first scrape lacked it
        [_snap(0.0, 1.0), _snap(10.0, None)],  # the last one did
        [_snap(0.0, None), _snap(10.0, None)],  # multiprocess Prometheus: never there
        [_snap(3.0, 1.0)],  # one snapshot: no window
        [_snap(3.0, 1.0), _snap(3.0, 2.0)],  # no duration
    ],
)
def test_missing_counter_or_window_is_none(snaps: list[MetricsSnapshot]) -> None:
    assert compute_features(snaps).frontend_cpu_cores is None


def test_the_selector_does_not_read_it() -> None:
    assert "frontend_cpu_cores" not in {name for name, _ in OBS_FEATURES}


# ------------------------------------------------------------------ the dataset
def test_an_old_dataset_opens_with_the_new_field_null(tmp_path: Path) -> None:
    old = FIXTURES / "profile-cpu.sqlite"
    copy = tmp_path / "old.sqlite"
    shutil.copyfile(old, copy)
    with ProfileStore(old, readonly=True) as ro:
        before = ro.rows()
    units = build_training_set(before).units  # read-only: no such column, and the trainer copes
    assert units and all(u.features["frontend_cpu_cores"] is None for u in units)
    with ProfileStore(copy) as store:  # writable: the column is added
        rows = store.rows()
        assert len(rows) == len(before) > 0
        assert all("obs_frontend_cpu_cores" in r and r["obs_frontend_cpu_cores"] is None for r in rows)
        record = CellRecord.model_validate(
            {**_any_record(rows[0]), "features": ObservedFeatures(arrival_rate=1.0, frontend_cpu_cores=0.4)})
        store.append(record, "h")
        assert store.rows()[-1]["obs_frontend_cpu_cores"] == pytest.approx(0.4)
    with ProfileStore(copy, readonly=True) as ro:
        assert len(ro.rows()) == len(before) + 1


def _any_record(row: dict[str, object]) -> dict[str, object]:
    return {"run_id": "frontend-test", "profile_key": "k", "mode": row["mode"], "workload": row["workload"],
            "workload_spec": {}, "repeat": 99, "status": "ok", "started_at": 0.0, "finished_at": 1.0}


# ------------------------------------------------------------------ the note
def test_note_at_and_above_the_line_only() -> None:
    note = frontend_note(0.95)
    assert note is not None and "0.95 CPU cores" in note and "--api-server-count" in note
    assert frontend_note(0.5) is None and frontend_note(None) is None
    assert frontend_note(FRONTEND_SATURATED_CORES) is not None


@needs_bundled
def test_recommend_notes_it_and_keeps_the_mode() -> None:
    rec = Recommender.load(MODELS)
    plain = rec.recommend(ObservedFeatures(**TRAFFIC, frontend_cpu_cores=0.5))
    busy = rec.recommend(ObservedFeatures(**TRAFFIC, frontend_cpu_cores=0.95))
    assert not any("API server" in n for n in plain.notes)
    assert any("API server used 0.95 CPU cores" in n for n in busy.notes)
    assert busy.mode == plain.mode and busy.predictions == plain.predictions
    assert busy.features["frontend_cpu_cores"] == 0.95


@needs_bundled
def test_cli_and_api_carry_the_note() -> None:
    from starlette.testclient import TestClient

    from graphmode.core.settings import Settings
    from graphmode.service.app import create_app

    base = ["recommend", "--models-dir", str(MODELS), "--json", "--features"]
    runner = CliRunner()
    for cores, expected in ((0.95, True), (0.5, False)):
        r = runner.invoke(app, [*base, json.dumps({**TRAFFIC, "frontend_cpu_cores": cores})])
        assert r.exit_code == 0, r.output
        assert any("frontend is saturated" in n for n in json.loads(r.stdout)["notes"]) is expected
    r = runner.invoke(app, [*base, json.dumps({"frontend_cpu_cores": 0.95})])
    assert r.exit_code == 2 and "at least one traffic feature" in r.output  # the CPU alone is no traffic
    with TestClient(create_app(Settings(), models_dir=MODELS, target=None)) as tc:
        busy = tc.post("/v1/recommend", json={"features": {**TRAFFIC, "frontend_cpu_cores": 0.95}})
        plain = tc.post("/v1/recommend", json={"features": {**TRAFFIC, "frontend_cpu_cores": 0.5}})
        assert busy.status_code == plain.status_code == 200, busy.text
        assert any("frontend is saturated" in n for n in busy.json()["notes"])
        assert not any("frontend is saturated" in n for n in plain.json()["notes"])
        assert busy.json()["mode"] == plain.json()["mode"]
        bad = tc.post("/v1/recommend", json={"features": {**TRAFFIC, "frontend_cpu_cores": -1}})
        assert bad.status_code == 422


def test_watch_logs_the_note_with_its_decision(tmp_path: Path) -> None:
    policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, confirmations=1, max_attempts=2, retry_in_s=3600))
    ctl = Controller("d", FakeExecutor(), advisor, policy, state_dir=tmp_path, dry_run=True)
    ctl.injected = ObservedFeatures(arrival_rate=5.0, frontend_cpu_cores=0.97)
    d = asyncio.run(ctl.step())
    entry = ctl.state.decisions[-1]
    assert d.action == "switch" and "API server used 0.97 CPU cores" in entry["notes"][0]
    ctl.injected = ObservedFeatures(arrival_rate=5.0, frontend_cpu_cores=0.3)
    asyncio.run(ctl.step())
    assert "notes" not in ctl.state.decisions[-1]


def test_profile_marks_a_host_bound_cell() -> None:
    from rich.console import Console
    from rich.progress import Progress

    from graphmode.cli.profile_cmd import RichReporter

    console = Console(record=True, width=300)
    reporter = RichReporter(Progress(console=console), total=2)
    for cores in (0.98, 0.4):
        reporter.cell_finished(CellRecord.model_validate({
            **_any_record({"mode": "FULL", "workload": f"w{cores}"}),
            "features": ObservedFeatures(frontend_cpu_cores=cores)}))
    lines = console.export_text().splitlines()
    assert "API server at 0.98 CPU cores: host-bound" in lines[0] and "API server" not in lines[1]


def test_the_process_note_tells_the_engine_core_from_an_api_server() -> None:
    from graphmode.selector.frontend import process_note

    core = process_note("VLLM::EngineCore", 0.95)
    assert core is not None and "engine core (VLLM::EngineCore) used 0.95 CPU cores" in core
    assert "API server used" not in core
    assert process_note("VLLM::APIServer_2", 0.97) == frontend_note(0.97)
    assert process_note("VLLM::EngineCore", 0.5) is None and process_note(None, None) is None


def test_watch_notes_the_engine_core_of_the_vllm_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process tree and titles are read from the OS (a process titled as vLLM titles its engine core);
    the clock and the CPU seconds are injected, so the rule is tested, not how much CPU a loaded machine
    gives a busy loop (a real one did not reach 0.9 of a core on a busy 2-core box)."""
    import dataclasses
    import subprocess
    import sys
    import types

    from graphmode.control import controller as controller_mod
    from graphmode.control.controller import ManagedExecutor
    from graphmode.control.proxy import Proxy
    from graphmode.profiling import hostload

    readings = iter([(100.0, 5.0), (102.0, 6.9)])  # (clock s, CPU s of each process): 0.95 of a core

    def injected(pid: int | None) -> hostload.Counters:
        at, cpu_s = next(readings)
        real = hostload.counters(pid, clock=at)
        return dataclasses.replace(real, processes=tuple((p, title, cpu_s) for p, title, _ in real.processes))

    monkeypatch.setattr(controller_mod, "counters", injected)
    idle = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 60"])
    try:
        ex = ManagedExecutor([sys.executable], [], proxy=Proxy(), log_dir=tmp_path)
        ex.server = types.SimpleNamespace(pid=idle.pid)  # type: ignore[assignment]
        policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, confirmations=1, max_attempts=2, retry_in_s=3600))
        ctl = Controller("d", ex, advisor, policy, state_dir=tmp_path, dry_run=True)
        ctl.injected = ObservedFeatures(arrival_rate=5.0)
        asyncio.run(ctl.step())  # the first step only takes the snapshot
        assert "notes" not in ctl.state.decisions[-1]
        asyncio.run(ctl.step())
        notes = ctl.state.decisions[-1].get("notes", [])
        assert any("engine core (VLLM::EngineCore)" in n and "0.95" in n for n in notes), notes
    finally:
        idle.kill()
        idle.wait()
