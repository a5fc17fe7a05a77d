"""Observed step sizes: from real /metrics captures, the decode/mixed bound, and per-cell storage."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore, step_sizes_of
from graphmode.core.records import StepSizes
from graphmode.profiling.features import FeatureWindow, compute_step_sizes
from graphmode.profiling.metrics import Histogram, MetricsSnapshot, parse_metrics
from tests.unit.test_dataset import record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CPU = FIXTURES / "vllm-0.32-cpu"
# vLLM's fixed edges of vllm:iteration_tokens_total (vllm/v1/metrics/loggers.py), as the capture shows them.
EDGES = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0]


def real_window() -> list[MetricsSnapshot]:
    idle = parse_metrics((CPU / "metrics-idle.txt").read_text(), 0.0)
    loaded = parse_metrics((CPU / "metrics-after-load.txt").read_text(), 10.0)
    return [idle, loaded]


def test_real_captures_give_the_step_histogram() -> None:
    steps = compute_step_sizes(real_window())
    assert steps is not None
    assert steps.le == EDGES
    # Cumulative 16, 32, 36, 37, 37, ... (after load) minus all zeros (idle), read off the files by hand.
    assert steps.steps == [16.0, 16.0, 4.0, 1.0] + [0.0] * 9 + [0.0]
    assert steps.n_steps == 37  # = Δ vllm:iteration_tokens_total_count
    # Both scrapes saw 0 running requests: no evidence for the decode/mixed split.
    assert steps.running == {0: 2}
    assert steps.decode_steps is None and steps.mixed_steps is None


def _snap(t: float, running: float, buckets: list[tuple[float, float]], count: float) -> MetricsSnapshot:
    return MetricsSnapshot(t=t, num_requests_running=running,
                           iteration_tokens=Histogram(sum=0.0, count=count, buckets=buckets))


def test_decode_mixed_rule_bounds_by_the_largest_batch() -> None:
    edges = [1.0, 8.0, 16.0, 32.0, float("inf")]
    a = _snap(0.0, 3, [(e, 0.0) for e in edges], 0.0)
    b = _snap(1.0, 6, [(1.0, 10.0), (8.0, 50.0), (16.0, 60.0), (32.0, 65.0), (float("inf"), 70.0)], 70.0)
    steps = compute_step_sizes([a, b])
    assert steps is not None
    assert steps.le == [1.0, 8.0, 16.0, 32.0] and steps.steps == [10.0, 40.0, 10.0, 5.0, 5.0]
    # batch_max 6: buckets starting at or above 6 tokens cannot be decode-only ((8,16], (16,32], above 32).
    assert steps.mixed_steps == 20.0 and steps.decode_steps == 50.0
    assert steps.running == {3: 1, 6: 1}


def test_no_histogram_or_single_snapshot_is_none() -> None:
    assert compute_step_sizes([]) is None
    assert compute_step_sizes(real_window()[:1]) is None
    assert compute_step_sizes([MetricsSnapshot(t=0.0), MetricsSnapshot(t=1.0)]) is None


def test_live_window_uses_the_same_path() -> None:
    window = FeatureWindow(60.0)
    for s in real_window():
        window.add(s)
    assert window.step_sizes() == compute_step_sizes(real_window())


def test_step_sizes_stored_per_cell_and_old_datasets_migrate(tmp_path: Path) -> None:
    old = tmp_path / "old.sqlite"
    shutil.copy(FIXTURES / "profile-cpu.sqlite", old)
    with sqlite3.connect(old) as db:
        assert "step_sizes" not in {r[1] for r in db.execute("PRAGMA table_info(cells)")}
    steps = StepSizes(le=[1.0, 8.0], steps=[3.0, 4.0, 0.0], running={2: 5}, decode_steps=7.0, mixed_steps=0.0)
    with ProfileStore(old) as store:  # opening for writing adds the column; old rows read NULL
        before = store.rows()
        store.append(record(step_sizes=steps), "h")
        rows = store.rows()
    assert all(step_sizes_of(r) is None for r in rows[: len(before)])
    assert step_sizes_of(rows[-1]) == steps
    assert step_sizes_of({"step_sizes": "{not json"}) is None


@pytest.mark.parametrize("readonly", [True])
def test_readonly_old_dataset_reads_without_the_column(readonly: bool) -> None:
    with ProfileStore(FIXTURES / "profile-cpu.sqlite", readonly=readonly) as store:
        rows = store.rows()
    assert rows and all(step_sizes_of(r) is None for r in rows)
