"""Paired comparisons inside a round on one GPU: pairing, verdicts, the card and the recommendation note."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from graphmode.core.fingerprint import shape_of_config
from graphmode.selector.aggregate import build_training_set, metric_value
from graphmode.selector.featurize import shape_key
from graphmode.selector.paired import (
    PairedRound,
    PairedVerdict,
    measured_from_rows,
    paired_rounds,
    paired_verdicts,
)
from graphmode.selector.recommend import Recommender
from graphmode.selector.train import train
from tests.support.synthetic import write_synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "FULL_AND_PIECEWISE"


def _row(mode: str, workload: str, repeat: int, itl: float, ttft: float, **kw: Any) -> dict[str, Any]:
    return {"status": "ok", "mode": mode, "workload": workload, "workload_hash": "h", "repeat": repeat,
            "itl_p50": itl, "ttft_p50": ttft, "fp_model_config_hash": "qwen", **kw}


def _value(r: dict[str, Any], m: str) -> float | None:
    return r.get(m)


def test_rounds_pair_a_mode_with_the_default_only_in_one_repeat_on_one_gpu() -> None:
    rows = []
    for i, w in enumerate(["a", "b", "c"]):
        # repeat 0: both modes on GPU X; FULL 20% faster on TTFT, 10% on ITL
        rows += [_row(DEFAULT, w, 0, 2.0, 20.0 + i, gpu_uuid="GPU-xxxxxxxx-1"),
                 _row("FULL", w, 0, 1.8, 0.8 * (20.0 + i), gpu_uuid="GPU-xxxxxxxx-1")]
        # repeat 1: the default on GPU Y, FULL on GPU Z (a lease ended between them): nothing pairs
        rows += [_row(DEFAULT, w, 1, 3.0, 30.0, gpu_uuid="GPU-yyyyyyyy-2"),
                 _row("FULL", w, 1, 1.0, 10.0, gpu_uuid="GPU-zzzzzzzz-3")]
        # repeat 2: no UUID, one profile run: the run is the block
        rows += [_row(DEFAULT, w, 2, 2.0, 20.0, run_id="run-2"), _row("FULL", w, 2, 2.1, 19.0, run_id="run-2")]
    rows += [_row("FULL", "a", 3, 1.0, 1.0, gpu_uuid="GPU-x", status="failed"),  # failed: ignored
             _row("TURBO", "a", 0, 1.0, 1.0, gpu_uuid="GPU-xxxxxxxx-1"),  # unknown mode: ignored
             _row("NONE", "a", 0, 9.0, 90.0)]  # no block at all: cannot pair
    measured = measured_from_rows(rows, _value)
    assert ("qwen", "a@h", "FULL") in measured and 3 not in measured[("qwen", "a@h", "FULL")]
    rounds = paired_rounds(measured)
    assert [(r.mode, r.repeat, r.block) for r in rounds] == [("FULL", 0, "xxxxxxxx"), ("FULL", 2, "run-2")]
    r0 = rounds[0]
    assert r0.ratios["ttft_p50"] == (3, pytest.approx(0.8)) and r0.ratios["itl_p50"] == (3, pytest.approx(0.9))
    assert rounds[1].ratios["itl_p50"] == (3, pytest.approx(1.05))
    (itl, ttft) = sorted(paired_verdicts(rounds), key=lambda v: v.metric)
    assert (itl.verdict, ttft.verdict) == ("mixed", "lower")  # ITL: 0.90 then 1.05; TTFT: 0.80 then 0.95


def test_a_dropped_value_does_not_pair() -> None:
    # metric_value drops ITL read from coalesced chunks; that workload then pairs on TTFT only
    rows = [_row(DEFAULT, "a", 0, 2.0, 20.0, gpu_uuid="G"), _row("FULL", "a", 0, 1.8, 16.0, gpu_uuid="G")]
    (r,) = paired_rounds(measured_from_rows(rows, lambda row, m: None if m == "itl_p50" else row.get(m)))
    assert "itl_p50" not in r.ratios and r.ratios["ttft_p50"] == (1, pytest.approx(0.8))


def _round(mode: str, rep: int, itl: tuple[int, float], ttft: tuple[int, float] | None = None) -> PairedRound:
    ratios = {"itl_p50": itl} | ({"ttft_p50": ttft} if ttft else {})
    return PairedRound(shape="s", mode=mode, repeat=rep, block=f"gpu{rep}", ratios=ratios)


def test_a_verdict_needs_the_same_side_in_every_round() -> None:
    rounds = [
        _round("FULL", 0, (24, 0.75), (24, 0.90)), _round("FULL", 2, (3, 0.66), (24, 1.10)),
        _round("NONE", 0, (24, 4.3)), _round("NONE", 1, (24, 3.1)),
        _round("FDO", 0, (24, 1.01)), _round("FDO", 1, (24, 0.98)),
        _round("PW", 0, (24, 0.80)), _round("PW", 1, (2, 1.50)),  # 2 workloads: not a round
    ]
    got = {(v.mode, v.metric): v for v in paired_verdicts(rounds)}
    assert got[("FULL", "itl_p50")].verdict == "lower" and got[("FULL", "itl_p50")].decisive
    assert got[("FULL", "itl_p50")].rounds == [(0, 24, 0.75), (2, 3, 0.66)]
    assert got[("FULL", "ttft_p50")].verdict == "mixed" and not got[("FULL", "ttft_p50")].decisive
    assert got[("NONE", "itl_p50")].verdict == "higher"
    assert got[("FDO", "itl_p50")].verdict == "same"  # inside ±3% both times
    assert got[("PW", "itl_p50")].verdict == "one round"
    assert ("NONE", "ttft_p50") not in got  # no round measured it
    # a 4-5% lead in both rounds is "lower" at the ±3% margin and "same" at ±5%
    lead = [_round("F", 0, (5, 0.96)), _round("F", 1, (5, 0.95))]
    assert paired_verdicts(lead)[0].verdict == "lower"
    assert paired_verdicts(lead, margin=0.05)[0].verdict == "same"
    text = got[("FULL", "itl_p50")].describe()
    assert text == "FULL's itl_p50 was 0.75×/0.66× the default's, lower in 2 of 2 rounds (24, 3 workloads)"


def test_training_keeps_the_verdicts_on_the_set_and_the_card(tmp_path: Path) -> None:
    from graphmode.core.dataset import ProfileStore
    from graphmode.core.settings import DEFAULT_GRID
    from graphmode.profiling.grid import load_grid

    names = ["chat-r2-b1", "chat-r32-b0.25", "decode-heavy-r8-b1", "prefill-heavy-r32-b0.25"]
    ds = write_synthetic_dataset(tmp_path / "ds.sqlite", workloads=load_grid(DEFAULT_GRID).select(names),
                                 repeats=2)
    with sqlite3.connect(ds) as db:  # synthetic runs are one per mode; put each round on one GPU
        db.execute("UPDATE cells SET gpu_uuid = 'GPU-synthet-' || repeat")
    with ProfileStore(ds, readonly=True) as s:
        rows = s.rows(status="ok")
    ts = build_training_set(rows)
    expected = paired_verdicts(paired_rounds(measured_from_rows(rows, metric_value)))
    assert ts.paired == expected and expected
    assert {v.mode for v in ts.paired} == {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY"}
    res = train(ds, tmp_path / "model")
    card = json.loads((tmp_path / "model" / "card.json").read_text())
    assert [PairedVerdict.model_validate(v) for v in card["paired"]] == res.card.paired == ts.paired


def test_the_recommendation_names_a_paired_win_that_the_tie_rule_hides() -> None:
    rec = Recommender.load(REPO / "models", "nvidia-h200-vllm0.24.0-ab3c7947c90d")  # its paired campaigns
    qwen = rec.for_shape(shape_of_config(json.loads((REPO / "models" / "shapes" / "qwen2.5-0.5b.json").read_text())))
    key = shape_key(qwen._shape or {})
    desc = {"rate": 8, "input_tokens": 512, "output_tokens": 128}
    wins = [v for v in rec.card.paired if v.shape == key and v.metric == "ttft_p50" and v.verdict == "lower"]
    # the shipped H200 data: FULL's TTFT lower than the default's in both paired Qwen campaign rounds
    assert [v.mode for v in wins] == ["FULL"]
    # Without race verdicts the unpaired tie rule keeps the default and the answer names the paired win.
    no_race = copy.copy(qwen)  # for_shape caches its recommenders: change a copy only
    no_race.card = qwen.card.model_copy(update={"race": []})
    ans = no_race.recommend(desc, "ttft_p50")
    notes = [n for n in ans.notes if n.startswith("paired inside rounds")]
    assert ans.mode == rec.default_mode and len(notes) == len(wins)
    for v, note in zip(wins, notes, strict=True):
        assert v.describe() in note and f"--modes {v.mode},{rec.default_mode}" in note
    # no verdict on this metric for this shape: no note
    assert not [n for n in no_race.recommend(desc, "ttft_p99").notes if n.startswith("paired")]
    # With the race (one start per arm, FULL 0.77x): the paired rounds corroborate it, so FULL is the
    # answer, and the notes that argued for the tie rule are gone.
    ans = qwen.recommend(desc, "ttft_p50")
    assert ans.mode == "FULL" and ans.race is not None and ans.race.basis == "better"
    assert any("paired campaign rounds" in n and "agree" in n for n in ans.notes)
    assert not [n for n in ans.notes if "would settle it" in n or "within noise" in n]


def test_a_chosen_mode_that_lost_inside_rounds_is_named() -> None:
    rec = Recommender.load(REPO / "models")
    key = shape_key(rec._shape or {})
    rec._paired = {(key, "itl_p50"): [
        PairedVerdict(shape=key, mode="FULL", metric="itl_p50", rounds=[(0, 24, 1.2), (1, 24, 1.1)],
                      verdict="higher"),
        PairedVerdict(shape=key, mode="NONE", metric="itl_p50", rounds=[(0, 24, 4.0), (1, 24, 4.1)],
                      verdict="higher"),
    ]}
    settle, (note,) = rec._paired_notes("itl_p50", "FULL")
    assert settle == []
    assert "FULL's itl_p50 was 1.20×/1.10× the default's, higher in 2 of 2 rounds" in note
    assert "the default measured better" in note
    assert rec._paired_notes("itl_p50", rec.default_mode) == ([], [])  # losers against the default: no news
    assert rec._paired_notes("ttft_p50", "FULL") == ([], [])
