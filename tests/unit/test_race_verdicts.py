"""The selector decides from race verdicts: better → that mode, equivalent → the default (with savings),
worse → never; regions where the pooled verdict is open; the tie rule only without race rounds."""

from __future__ import annotations

import math

import pytest

from graphmode.core.modes import DEFAULT_MODE
from graphmode.core.settings import DEFAULT_GRID
from graphmode.profiling.grid import load_grid
from graphmode.profiling.race_rounds import CONTROL_ARM
from graphmode.profiling.sequential import SequentialRule
from graphmode.selector.featurize import shape_key
from graphmode.selector.objective import make_objective
from graphmode.selector.recommend import Recommender
from graphmode.selector.train import train
from graphmode.selector.verdicts import RaceVerdict, race_decision, race_verdicts
from tests.support.synthetic import write_synthetic_dataset

D = DEFAULT_MODE.value


def race_rows(ratios: dict[str, dict[str, list[float]]], shape: str = "abc") -> list[dict[str, object]]:
    """Rows of one race: arm -> workload -> per-round ITL ratio to the default (the default at 2 ms)."""
    rows: list[dict[str, object]] = []
    rnd = 0
    workloads = sorted({w for per in ratios.values() for w in per})
    n = max(len(xs) for per in ratios.values() for xs in per.values())
    for i in range(n):
        for w in workloads:
            rate = 2.0 if w == "low" else 30.0
            rows.append({"status": "ok", "race_id": "r1", "race_round": rnd, "race_arm": D, "workload": w,
                         "itl_p50": 0.002, "ttft_p50": 0.01, "fp_model_config_hash": shape,
                         "obs_arrival_rate": rate, "obs_mean_input_tokens": 100.0, "obs_mean_output_tokens": 100.0})
            for arm, per in ratios.items():
                if w in per and i < len(per[w]):
                    rows.append({"status": "ok", "race_id": "r1", "race_round": rnd, "race_arm": arm, "workload": w,
                                 "itl_p50": 0.002 * per[w][i], "ttft_p50": 0.01, "fp_model_config_hash": shape})
            rnd += 1
    return rows


def test_pooled_and_region_verdicts_from_rows() -> None:
    rows = race_rows({"NONE": {"low": [1.5, 1.6, 1.55], "high": [1.4, 1.45, 1.5]},
                      "FULL": {"low": [0.8, 0.81, 0.79], "high": [1.2, 1.21, 1.19]}})
    vs = race_verdicts(rows, SequentialRule())
    pooled = {(v.mode, v.metric): v for v in vs if v.workload is None}
    # decided at the first crossing (round 3 of 6) and it stands
    assert pooled[("NONE", "itl_p50")].verdict == "worse" and pooled[("NONE", "itl_p50")].rounds == 3
    assert pooled[("FULL", "itl_p50")].verdict == "undecided"
    region = {(v.mode, v.workload): v for v in vs if v.workload is not None and v.metric == "itl_p50"}
    assert region[("FULL", "low")].verdict == "better" and region[("FULL", "high")].verdict == "worse"
    assert region[("FULL", "low")].features["arrival_rate"] == pytest.approx(2.0)
    assert pooled[("NONE", "ttft_p50")].verdict == "equivalent"  # identical TTFT every round
    assert "NONE's itl_p50 is 1.4" in pooled[("NONE", "itl_p50")].describe()
    # the effect size is over every round of the race, with its interval; the verdict says when it was reached
    none = pooled[("NONE", "itl_p50")]
    assert none.rounds == 3 and none.rounds_all == 6 and none.lo_all is not None and none.hi_all is not None
    assert none.lo_all < none.ratio_all < none.hi_all  # type: ignore[operator]
    text = none.describe()
    assert f"{none.ratio_all:.3f}× the default's over all 6 paired rounds" in text
    assert f"interval {none.lo_all:.3f}–{none.hi_all:.3f}: worse at round 3" in text and f"{none.ratio:.3f}" not in text


def _v(mode: str, verdict: str, ratio: float, workload: str | None = None, starts: int = 2,
       **feats: float) -> RaceVerdict:
    return RaceVerdict(shape="s", mode=mode, metric="itl_p50", workload=workload, verdict=verdict,  # type: ignore[arg-type]
                       rounds=5, ratio=ratio, lo=ratio * 0.98, hi=ratio * 1.02, delta=0.03, confidence=0.95,
                       features=dict(feats), starts=starts)


CONSTS = {D: {"graph_gib": 0.6, "startup_s": 80.0}, "FULL": {"graph_gib": 0.4, "startup_s": 70.0},
          "FULL_DECODE_ONLY": {"graph_gib": 0.2, "startup_s": 60.0}, "NONE": {"graph_gib": 0.0, "startup_s": 40.0}}
ORDER = ["NONE", "FULL_DECODE_ONLY", "FULL", D, "PIECEWISE"]


def test_decision_rules() -> None:
    better = race_decision([_v("FULL", "better", 0.9), _v("NONE", "worse", 1.5)], "s", "itl_p50", {}, ORDER, CONSTS,
                           weighted=False)
    assert better is not None and better.mode == "FULL" and better.basis == "better"
    assert better.verdict is not None and better.verdict.ratio == 0.9 and better.worse == ["NONE"]

    eq = race_decision([_v("FULL", "equivalent", 1.0), _v("FULL_DECODE_ONLY", "equivalent", 1.01),
                        _v("NONE", "worse", 1.5)], "s", "itl_p50", {}, ORDER, CONSTS, weighted=False)
    assert eq is not None and eq.mode == D and eq.basis == "default"
    saves = {e.mode: (e.saves_graph_gib, e.saves_startup_s) for e in eq.equivalent}
    assert saves == {"FULL": (pytest.approx(0.2), 10.0), "FULL_DECODE_ONLY": (pytest.approx(0.4), 20.0)}

    # a memory-weighted objective may take an equivalent mode, never the worse NONE ranked first
    weighted = race_decision([_v("FULL_DECODE_ONLY", "equivalent", 1.0), _v("NONE", "worse", 1.5)], "s",
                             "itl_p50", {}, ORDER, CONSTS, weighted=True)
    assert weighted is not None and weighted.mode == "FULL_DECODE_ONLY" and weighted.basis == "equivalent"
    # a better mode that breaks a constraint is not taken
    blocked = race_decision([_v("FULL", "better", 0.9)], "s", "itl_p50", {}, ORDER, CONSTS, weighted=False,
                            allowed=[D, "NONE"])
    assert blocked is not None and blocked.mode == D
    # a shape (or configuration) never raced on a metric the model races: outside every raced region, the default
    other = race_decision([_v("FULL", "better", 0.9)], "other-shape", "itl_p50", {"arrival_rate": 4.0}, ORDER,
                          CONSTS, weighted=False)
    assert other is not None and other.mode == D and other.basis == "outside"
    assert "never raced on itl_p50" in other.notes[0] and "graphmode profile --race" in (other.command or "")
    # a metric no race measured: no decision, the tie rule stands
    assert race_decision([_v("FULL", "better", 0.9)], "other-shape", "e2e_p99", {}, ORDER, CONSTS,
                         weighted=False) is None


def test_a_better_from_one_start_each_needs_a_corroborating_comparison() -> None:
    one = [_v("FULL", "better", 0.8, starts=1), _v(CONTROL_ARM, "undecided", 0.9, starts=1)]
    alone = race_decision(one, "s", "itl_p50", {}, ORDER, CONSTS, weighted=False)
    assert alone is not None and alone.mode == D and alone.basis == "default"
    assert any("one engine start each" in n and "0.90× apart" in n for n in alone.notes)
    backed = race_decision(one, "s", "itl_p50", {}, ORDER, CONSTS, weighted=False, corroborated=["FULL"])
    assert backed is not None and backed.mode == "FULL" and backed.basis == "better"
    assert any("paired campaign rounds" in n for n in backed.notes)
    # rows of one race with one start per arm give starts=1; a second start of every arm gives 2
    rows = race_rows({"FULL": {"low": [0.8, 0.81, 0.79]}})
    assert {v.starts for v in race_verdicts(rows)} == {1}
    for r in rows:
        r["race_start_id"] = "a" if int(str(r["race_round"])) < 2 else "b"
    assert {v.starts for v in race_verdicts(rows)} == {2}


def test_region_verdict_applies_where_the_pooled_one_is_open() -> None:
    vs = [_v("FULL", "undecided", 1.0), _v("FULL", "better", 0.8, "low", arrival_rate=2.0),
          _v("FULL", "worse", 1.2, "high", arrival_rate=30.0)]
    low = race_decision(vs, "s", "itl_p50", {"arrival_rate": 1.5}, ORDER, CONSTS, weighted=False)
    assert low is not None and low.mode == "FULL" and low.region == "low"
    high = race_decision(vs, "s", "itl_p50", {"arrival_rate": 25.0}, ORDER, CONSTS, weighted=False)
    assert high is not None and high.mode == D and high.worse == ["FULL"] and high.region == "high"


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Recommender:
    root = tmp_path_factory.mktemp("reg")
    names = ["chat-r2-b1", "chat-r32-b0.25", "decode-heavy-r8-b1", "prefill-heavy-r32-b0.25", "balanced-r8-b1"]
    ds = write_synthetic_dataset(root / "ds.sqlite", workloads=load_grid(DEFAULT_GRID).select(names), repeats=2)
    train(ds, models_dir=root / "models")
    return Recommender.load(root / "models")


def _with(rec: Recommender, verdicts: list[RaceVerdict]) -> Recommender:
    card = rec.card.model_copy(update={"race": verdicts})
    return Recommender(rec.folder, card, rec.model, rec.match, rec.target)


FEATS = {"arrival_rate": 8.0, "mean_input_tokens": 256.0, "mean_output_tokens": 256.0}


def test_recommender_takes_a_better_mode_with_its_evidence(rec: Recommender) -> None:
    assert rec.card.race == []  # synthetic rows have no race rounds: the tie rule decides, as before
    assert rec.recommend(FEATS, "itl_p50").race is None
    shape = shape_key(rec._shape or {})
    v = _v("FULL_DECODE_ONLY", "better", 0.9).model_copy(update={"shape": shape})
    answer = _with(rec, [v]).recommend(FEATS, "itl_p50")
    assert answer.mode == "FULL_DECODE_ONLY" and answer.gain_significant
    assert answer.race is not None and answer.race.verdict is not None
    assert answer.race.verdict.rounds == 5 and answer.race.verdict.lo is not None
    # another metric has no race verdict: the regressors and the tie rule stand
    assert _with(rec, [v]).recommend(FEATS, "ttft_p50").race is None


def test_recommender_equivalent_keeps_default_and_lists_savings(rec: Recommender) -> None:
    shape = shape_key(rec._shape or {})
    vs = [_v(m, k, r).model_copy(update={"shape": shape})
          for m, k, r in (("FULL", "equivalent", 1.0), ("NONE", "worse", 1.6), ("PIECEWISE", "worse", 1.3))]
    answer = _with(rec, vs).recommend(FEATS, "itl_p50")
    assert answer.mode == D and answer.race is not None and not answer.gain_significant
    assert [e.mode for e in answer.race.equivalent] == ["FULL"] and answer.race.worse == ["NONE", "PIECEWISE"]
    eq = answer.race.equivalent[0]
    assert eq.saves_graph_gib is not None and math.isfinite(eq.saves_graph_gib)
    heavy = _with(rec, vs).recommend(FEATS, make_objective("itl_p50", memory_weight=100.0))
    assert heavy.mode in (D, "FULL") and heavy.mode not in ("NONE", "PIECEWISE")


def test_a_mode_never_measured_on_the_shape_is_never_chosen(rec: Recommender) -> None:
    """A configuration race leaves NONE out; the regressors still predict NONE there from other shapes' cells
    (on the H200, NONE "won" TPOT by 47% at 768 streams, a load NONE never ran at). It is dropped, with a note."""
    shape = shape_key(rec._shape or {})
    assert {p.mode for p in rec.recommend(FEATS, "itl_p50").predictions} == set(rec.modes)
    card = rec.card.model_copy(update={"shape_modes": {shape: ["FULL", "FULL_DECODE_ONLY", D]}})
    answer = Recommender(rec.folder, card, rec.model, rec.match, rec.target).recommend(FEATS, "itl_p50")
    assert {p.mode for p in answer.predictions} == {"FULL", "FULL_DECODE_ONLY", D}
    assert answer.mode in ("FULL", "FULL_DECODE_ONLY", D)
    assert any("never chosen" in n and "NONE, PIECEWISE" in n for n in answer.notes)
    # the default stays, even when the data lacks it; another shape's list does not apply
    card = rec.card.model_copy(update={"shape_modes": {shape: ["FULL"]}})
    answer = Recommender(rec.folder, card, rec.model, rec.match, rec.target).recommend(FEATS, "itl_p50")
    assert {p.mode for p in answer.predictions} == {"FULL", D}
    card = rec.card.model_copy(update={"shape_modes": {"another": ["FULL"]}})
    answer = Recommender(rec.folder, card, rec.model, rec.match, rec.target).recommend(FEATS, "itl_p50")
    assert {p.mode for p in answer.predictions} == set(rec.modes)


def test_a_trained_card_lists_the_modes_measured_per_shape(rec: Recommender) -> None:
    assert rec.card.shape_modes == {shape_key(rec._shape or {}): list(rec.modes)}


def test_tpot_verdicts_are_kept_for_races_that_decide_on_it() -> None:
    from graphmode.selector.aggregate import VERDICT_METRICS

    assert "tpot_p50" in VERDICT_METRICS
