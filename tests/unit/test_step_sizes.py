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
    assert sum(steps.steps) == 37  # = Δ vllm:iteration_tokens_total_count
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
    # one API server (no --api-server-count in the row): the histogram is already per engine step
    assert step_sizes_of(rows[-1]) == steps.model_copy(update={"api_servers": 1})
    assert step_sizes_of({"step_sizes": "{not json"}) is None


@pytest.mark.parametrize("readonly", [True])
def test_readonly_old_dataset_reads_without_the_column(readonly: bool) -> None:
    with ProfileStore(FIXTURES / "profile-cpu.sqlite", readonly=readonly) as store:
        rows = store.rows()
    assert rows and all(step_sizes_of(r) is None for r in rows)


# Four API servers at 768 running, as the H200 showed them (vLLM 0.33, 2026-12-04): each server's logger records
# its own requests' share of every step, ~192 tokens, and /metrics pools the four: ~4 observations a step.
FOUR = StepSizes(le=[64.0, 128.0, 256.0, 512.0], steps=[0.0, 4.0, 352.0, 0.0, 0.0], running={768: 8, 755: 1},
                 api_servers=4)


def test_compute_step_sizes_keeps_the_histogram_and_splits_on_the_step_scale() -> None:
    edges = [64.0, 128.0, 256.0, 512.0, float("inf")]
    a = _snap(0.0, 768, [(e, 0.0) for e in edges], 0.0)
    b = _snap(1.0, 768, [(64.0, 0.0), (128.0, 4.0), (256.0, 356.0), (512.0, 356.0), (float("inf"), 356.0)], 356.0)
    raw = compute_step_sizes([a, b], api_servers=4)
    assert raw is not None and raw.api_servers == 4
    assert raw.le == [64.0, 128.0, 256.0, 512.0] and raw.steps == [0.0, 4.0, 352.0, 0.0, 0.0]  # as observed
    # per step: (512, 1024] holds 88 of 89 steps, at most 768 tokens: decode-only is possible for all of them
    assert raw.decode_steps == pytest.approx(89.0) and raw.mixed_steps == 0.0
    one = compute_step_sizes([a, b])
    assert one is not None and one.api_servers is None


def test_per_engine_step_scales_edges_and_counts_once() -> None:
    per = FOUR.per_engine_step()
    assert per.le == [256.0, 512.0, 1024.0, 2048.0] and per.steps == [0.0, 1.0, 88.0, 0.0, 0.0]
    assert per.api_servers == 1 and per.running == FOUR.running
    assert sum(per.steps) == pytest.approx(sum(FOUR.steps) / 4)
    assert per.per_engine_step(4) == per  # already per step: a deployment's count does not scale it again
    unknown = FOUR.model_copy(update={"api_servers": None})
    assert unknown.per_engine_step(4) == per  # the deployment's --api-server-count fills the gap
    assert unknown.per_engine_step().le == FOUR.le  # unknown and not given: one server
    with pytest.raises(ValueError):
        StepSizes(le=[1.0], steps=[1.0], api_servers=0)


def test_rows_from_several_api_servers_read_per_engine_step() -> None:
    legacy = FOUR.model_copy(update={"api_servers": None}).model_dump_json(exclude={"api_servers"})
    assert "api_servers" not in legacy  # rows written before the field
    steps = step_sizes_of({"step_sizes": legacy, "dep_api_server_count": 4})
    assert steps is not None and steps.le == [256.0, 512.0, 1024.0, 2048.0] and steps.api_servers == 1
    assert step_sizes_of({"step_sizes": legacy, "dep_api_server_count": None}).le == FOUR.le  # type: ignore[union-attr]


def test_chooser_reads_several_api_servers_per_step() -> None:
    from graphmode.selector.capture import choose_capture_sizes

    per = choose_capture_sizes(FOUR, max_num_seqs=1024)
    raw = choose_capture_sizes(FOUR.model_copy(update={"api_servers": 1}), max_num_seqs=1024)
    # the steps are ~768 tokens: the answer reaches past vLLM's default 512, where the quarter-scale reading
    # stopped at the (128, 256] bucket
    assert max(per.sizes) >= 768 > max(raw.sizes)
