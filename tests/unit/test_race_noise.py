"""What a restart alone and the clock alone moved latency by (selector.noise): from race rows to the card to
the recommendation's note."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from graphmode.core.settings import DEFAULT_GRID
from graphmode.profiling.grid import load_grid
from graphmode.profiling.race_rounds import CONTROL_ARM
from graphmode.selector.card import ModelCard
from graphmode.selector.featurize import shape_key, shape_of_row
from graphmode.selector.noise import RaceNoise, noise_for, race_noise
from graphmode.selector.recommend import Recommender
from graphmode.selector.train import train
from graphmode.selector.verdicts import RaceVerdict, race_verdicts
from tests.support.synthetic import write_synthetic_dataset
from tests.unit.test_race_verdicts import D, race_rows


def _default_rows(values: dict[tuple[str, str], list[float]], t0: float = 1.8e9, step_s: float = 30.0,
                  arm: str = D) -> list[dict[str, object]]:
    """Default-arm rows: (start id, workload) → ITL per round, rounds ``step_s`` apart."""
    rows: list[dict[str, object]] = []
    rnd = 0
    for (start, workload), xs in values.items():
        for x in xs:
            rows.append({"status": "ok", "race_id": "r1", "race_round": rnd, "race_arm": arm, "workload": workload,
                         "race_start_id": start, "race_round_t0": t0 + rnd * step_s, "itl_p50": x,
                         "ttft_p50": 0.01, "fp_model_config_hash": "abc"})
            rnd += 1
    return rows


def test_wander_is_the_pooled_spread_inside_each_start_and_workload() -> None:
    # two groups with different levels: only the spread inside each counts, not the gap between them
    a = [0.002 * math.exp(e) for e in (-0.1, 0.0, 0.1)]
    b = [0.004 * math.exp(e) for e in (-0.1, 0.1)]
    rows = _default_rows({("s1", "low"): a, ("s2", "low"): b})
    (n,) = [x for x in race_noise(rows, []) if x.metric == "itl_p50"]
    ss = 0.02 + 0.02  # Σ(y − ȳ)² of each group
    assert n.wander_df == 3 and n.wander_rounds == 5
    assert n.wander_cv_pct == pytest.approx(100 * math.sqrt(math.expm1(ss / 3)), abs=0.01)
    assert n.wander_minutes == pytest.approx(1.0)  # the first group's rounds 0..2, 30 s apart
    assert n.restart is None and "CV of 12%" in n.describe()
    # ttft is constant: a CV of 0, still a figure
    (t,) = [x for x in race_noise(rows, []) if x.metric == "ttft_p50"]
    assert t.wander_cv_pct == 0.0


def test_too_few_rounds_give_no_wander_and_a_control_verdict_gives_the_restart() -> None:
    rows = _default_rows({("s1", "low"): [0.002, 0.0021], ("s1", "high"): [0.003]})
    assert race_noise(rows, []) == []  # one degree of freedom and no A/A arm: nothing to say
    aa = RaceVerdict(shape=shape_key(shape_of_row(rows[0])), mode=CONTROL_ARM,
                     metric="itl_p50", verdict="undecided", rounds=12, ratio=0.9, lo=0.82, hi=0.99, delta=0.03,
                     confidence=0.95)
    (n,) = race_noise(rows, [aa])
    assert n.restart == aa and n.wander_cv_pct is None
    assert n.describe() == "a restart alone moved itl_p50 0.90× [0.82–0.99] (A/A arm, 12 paired rounds)"


def test_sizes_rows_failed_rows_and_challengers_do_not_count() -> None:
    rows = _default_rows({("s1", "low"): [0.002, 0.002, 0.002]})
    noisy = [0.001, 0.004, 0.002]
    rows += [dict(r, itl_p50=x, race_capture_sizes="[1, 2, 4]") for r, x in zip(rows, noisy, strict=True)]
    rows += [dict(r, itl_p50=x, status="failed") for r, x in zip(rows[:3], noisy, strict=True)]
    rows += _default_rows({("s1", "low"): noisy}, arm="FULL")
    (n,) = [x for x in race_noise(rows, []) if x.metric == "itl_p50"]
    assert n.wander_cv_pct == 0.0 and n.wander_rounds == 3


def test_rows_without_round_times_give_no_minutes() -> None:
    rows = [dict(r, race_round_t0=None) for r in _default_rows({("s1", "low"): [0.002, 0.0022, 0.0021]})]
    (n,) = [x for x in race_noise(rows, []) if x.metric == "itl_p50"]
    assert n.wander_minutes is None and n.wander_cv_pct is not None and "over up to" not in n.describe()


def test_verdict_rows_and_noise_agree_on_the_shape() -> None:
    rows = race_rows({CONTROL_ARM: {"low": [1.1, 0.9, 1.05, 0.95], "high": [1.0, 1.02, 0.98, 1.01]}})
    vs = race_verdicts(rows)
    noise = race_noise(rows, vs)
    n = noise_for(noise, vs[0].shape, "itl_p50")
    assert n is not None and n.restart is not None and n.restart.mode == CONTROL_ARM
    assert noise_for(noise, "other", "itl_p50") is None


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Recommender:
    root = tmp_path_factory.mktemp("reg")
    names = ["chat-r2-b1", "chat-r32-b0.25", "decode-heavy-r8-b1", "balanced-r8-b1"]
    ds = write_synthetic_dataset(root / "ds.sqlite", workloads=load_grid(DEFAULT_GRID).select(names), repeats=2)
    train(ds, models_dir=root / "models")
    return Recommender.load(root / "models")


def test_the_recommendation_names_the_noise_and_the_card_round_trips(rec: Recommender, tmp_path: Path) -> None:
    assert rec.card.race_noise == [] and rec.recommend({"arrival_rate": 8.0}, "itl_p50").noise is None
    shape = shape_key(rec._shape or {})
    noise = RaceNoise(shape=shape, metric="itl_p50", wander_cv_pct=9.0, wander_rounds=40, wander_df=30,
                      wander_minutes=20.0)
    card = rec.card.model_copy(update={"race_noise": [noise]})
    answer = Recommender(rec.folder, card, rec.model, rec.match, rec.target).recommend({"arrival_rate": 8.0},
                                                                                        "itl_p50")
    assert answer.noise == noise
    assert any(n.startswith("noise on this model shape: the same workload") and "CV of 9%" in n
               for n in answer.notes)
    assert "over up to 20 min" in noise.describe()
    card.save(tmp_path)
    assert ModelCard.load(tmp_path).race_noise == [noise]
