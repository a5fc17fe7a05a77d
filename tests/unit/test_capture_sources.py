"""A model names datasets it reads only for capture costs: the capture chain's lone starts of several lists
identify the size terms that race starts (side by side, one list) cannot."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from graphmode.core.errors import DatasetError
from graphmode.selector.capture import choose_capture_sizes
from graphmode.selector.capture_costs import costs_from_dataset
from graphmode.selector.card import ModelCard
from graphmode.selector.train import check_capture_dataset, train

PROFILES = Path(__file__).resolve().parents[2] / "models" / "profiles"
RACE_8B = PROFILES / "race-h200-vllm0.33-llama-3.1-8b.sqlite"
CAP_8B = PROFILES / "cap-h200-llama-3.1-8b.sqlite"


def test_a_capture_dataset_is_named_in_the_card_and_feeds_the_cost_model(tmp_path: Path) -> None:
    race, cap = tmp_path / RACE_8B.name, tmp_path / CAP_8B.name
    shutil.copy(RACE_8B, race)
    shutil.copy(CAP_8B, cap)
    before = costs_from_dataset(race)
    assert not before.identified  # race starts only: not even a lone start to fit on
    res = train(race, tmp_path / "m", regressor="knn", capture_datasets=[cap])
    card = ModelCard.load(res.out_dir)
    assert [s.path for s in card.dataset.capture_sources] == [f"../{cap.name}"]
    assert card.dataset.rows_used == ModelCard.load(train(race, tmp_path / "plain", regressor="knn").out_dir
                                                    ).dataset.rows_used  # not trained on
    paths = [s.resolve(res.out_dir) for s in card.dataset.cost_sources()]
    costs = costs_from_dataset(*paths)
    assert costs.identified and costs.n_starts >= 3  # lone starts of three lists or more (five since lease 10)
    # What recommend then says for the 8B list chosen at 2 req/s: graph GiB from both terms, not an upper bound.
    empty = choose_capture_sizes(None)
    assert empty.sizes == empty.default_sizes  # no window: the default list
    low = costs.predict([1, 2, 3, 4, 8, 256, 384, 512], "FULL_AND_PIECEWISE")
    default = costs.predict(empty.default_sizes, "FULL_AND_PIECEWISE")
    assert 0 < low[1] < default[1] and low[0] < default[0]
    # The report over every dataset the card names does not ask to retrain on rows never meant for training.
    from graphmode.report.build import build_report

    rep = build_report(paths, tmp_path / "r.html", model_dir=res.out_dir, grid_points=2)
    assert not any("retrain to include" in n for n in rep.notes)
    extra = tmp_path / "more.sqlite"
    shutil.copy(race, extra)  # rows the model could train on and did not: the note stays
    rep = build_report([*paths, extra], tmp_path / "r2.html", model_dir=res.out_dir, grid_points=2)
    assert any("retrain to include" in n for n in rep.notes)


def test_a_capture_dataset_must_match_the_model_and_hold_lone_starts(tmp_path: Path) -> None:
    assert re.search(r"[3-9] engine starts; least squares", check_capture_dataset(CAP_8B, gpu_name="NVIDIA H200",
                                                                              vllm_version="0.33.0"))
    with pytest.raises(DatasetError, match=r"vllm_version 0\.33\.0, the model's is 0\.24\.0"):
        check_capture_dataset(CAP_8B, gpu_name="NVIDIA H200", vllm_version="0.24.0")
    with pytest.raises(DatasetError, match="no engine start outside a race"):
        check_capture_dataset(RACE_8B, gpu_name=None, vllm_version=None)
    with pytest.raises(DatasetError, match="given both"):
        train(RACE_8B, tmp_path / "m", capture_datasets=[RACE_8B])
