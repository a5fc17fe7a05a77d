"""The decision table training writes for launch: it answers as the full model does, and knows its limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphmode.control.choose import ObjectiveSpec, choose_mode
from graphmode.selector.aggregate import build_training_set
from graphmode.selector.card import ModelCard
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.objective import make_objective
from graphmode.selector.recommend import Recommender
from graphmode.selector.table import TABLE_FILE, axis_values, load_table, lookup
from graphmode.selector.train import load_rows

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "nvidia-h200-vllm0.24.0-ab3c7947c90d"


@pytest.fixture(scope="module")
def bundled() -> tuple[Recommender, dict, list[WorkloadDescription]]:  # type: ignore[type-arg]
    card = ModelCard.load(BUNDLED)
    table = load_table(BUNDLED, card.artifacts["model.skops"].sha256)
    assert table is not None, "the bundled model's table.json is missing or stale: retrain it"
    rows, total = load_rows([s.resolve(BUNDLED) for s in card.dataset.sources])
    ts = build_training_set(rows, n_rows_total=total)
    descs = [d for u in ts.units if (d := WorkloadDescription.from_spec(u.spec)) is not None]
    return Recommender.from_dir(BUNDLED), table, descs


def test_table_agrees_with_the_full_model_on_every_profiled_workload(bundled) -> None:  # type: ignore[no-untyped-def]
    rec, table, descs = bundled
    assert len(descs) == rec.card.dataset.n_workloads  # 72 campaign + 18 raced (shape, workload) points
    for key in table["objectives"]:
        metric = key.split()[-1]
        for d in descs:
            if d.concurrency is not None:  # a concurrency cap (the raced c1 workload): the full model answers
                assert lookup(table, d, key) is None
                continue
            hit = lookup(table, d, key)
            assert hit is not None and hit.point == {a: getattr(d, a) for a in hit.point}  # profiled = grid
            full = rec.recommend(d, make_objective(metric))
            assert hit.mode == full.mode, (key, d)
            assert hit.value == pytest.approx(full.predicted_value, rel=1e-4)


def test_between_grid_points_the_nearest_answers_and_outside_none(bundled) -> None:  # type: ignore[no-untyped-def]
    _, table, _ = bundled
    key = "min itl_p50"
    hit = lookup(table, WorkloadDescription(rate=9, input_tokens=500, output_tokens=140, burstiness=0.9), key)
    assert hit is not None and hit.point == {"rate": 8, "burstiness": 1, "input_tokens": 512, "output_tokens": 128}
    assert lookup(table, WorkloadDescription(rate=5000, input_tokens=512, output_tokens=128), key) is None
    assert lookup(table, WorkloadDescription(rate=8, input_tokens=512, output_tokens=128, concurrency=4), key) is None
    assert lookup(table, WorkloadDescription(rate=8, input_tokens=512, output_tokens=128), "min goodput") is None


def test_a_stale_or_broken_table_is_ignored(tmp_path: Path) -> None:
    (tmp_path / TABLE_FILE).write_text(json.dumps({"schema": 1, "artifact_sha256": "abc"}))
    assert load_table(tmp_path, "def") is None and load_table(tmp_path, "abc") is not None
    (tmp_path / TABLE_FILE).write_text("{not json")
    assert load_table(tmp_path, "abc") is None


def test_axes_hold_the_profiled_values_and_factor_two_steps() -> None:
    assert axis_values([2, 8, 32]) == [1, 2, 4, 8, 16, 32, 64]
    assert axis_values([0.25, 1]) == [0.125, 0.25, 0.5, 1, 2]
    assert axis_values([]) == []


def test_launch_answers_a_description_from_the_table_without_scikit_learn() -> None:
    """Nor scipy: the card imports the race statistics, whose t quantiles import it only when asked (1.1 s)."""
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path\n"
        "from graphmode.control.choose import ObjectiveSpec, choose_mode\n"
        "from graphmode.selector.describe import WorkloadDescription\n"
        f"c = choose_mode(workload=WorkloadDescription(rate=8, input_tokens=512, output_tokens=128),"
        f" objective=ObjectiveSpec('ttft_p99'), models_dir=Path({str(BUNDLED.parent)!r}))\n"
        "print(c.mode.value, 'decision table' in c.reason, c.source,"
        " sorted(m for m in ('sklearn', 'skops', 'httpx', 'fastapi', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    full = Recommender.load(BUNDLED.parent).recommend(
        WorkloadDescription(rate=8, input_tokens=512, output_tokens=128), "ttft_p99")
    assert out == [full.mode, "True", "local", "[]"]
    # with a concurrency cap the table does not answer: the full model does
    c = choose_mode(workload=WorkloadDescription(rate=8, input_tokens=512, output_tokens=128, concurrency=4),
                    objective=ObjectiveSpec("ttft_p99"), models_dir=BUNDLED.parent)
    assert c.source == "local" and "decision table" not in c.reason
