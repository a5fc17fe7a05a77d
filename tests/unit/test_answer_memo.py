"""The recommender's memos (graphmode.selector.memo) change what an answer costs, never what it says: an answer
from the memos equals one computed afresh over many random requests, callers cannot alter a kept answer, the
memos stay bounded, and a reload starts empty ones. The model is the bundled H200 one."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from graphmode.core.records import ObservedFeatures
from graphmode.core.settings import Settings
from graphmode.selector.decide import Request, decide
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.memo import Memo
from graphmode.selector.recommend import Recommender
from graphmode.service.app import create_app

REPO = Path(__file__).resolve().parents[2]
MODEL = "nvidia-h200-vllm0.33.0-3375a87d3889"
SHAPES = REPO / "models" / "shapes"
needs_bundled = pytest.mark.skipif(not (REPO / "models" / MODEL).is_dir(), reason="bundled model missing")
OBJECTIVES: list[str | None] = [None, "ttft_p50", "itl_p50", "ttft_p99", "throughput"]
ARGS: list[list[str] | None] = [None, None, None, ["--max-num-seqs", "64"], ["--max-model-len", "8192"]]


def _inputs(rng: random.Random) -> ObservedFeatures | WorkloadDescription:
    """A request's traffic from a small grid, so that some requests repeat earlier ones (memo hits)."""
    rate = rng.choice([0.5, 2.0, 8.0, 32.0, 200.0])
    prompt, out = rng.choice([64, 512, 2048, 30000]), rng.choice([16, 128, 512])
    if rng.random() < 0.5:
        return WorkloadDescription(rate=rate, burstiness=rng.choice([0.25, 1.0]), input_tokens=prompt,
                                   output_tokens=out, concurrency=rng.choice([None, 4]))
    batch = rng.choice([1.0, 3.0, 20.0])
    return ObservedFeatures(arrival_rate=rate, mean_input_tokens=prompt, mean_output_tokens=out, batch_mean=batch,
                            batch_cv=rng.choice([None, 0.5]), concurrency_mean=batch + rng.choice([0.0, 2.0]),
                            prefill_decode_ratio=prompt / out)


def _request(rng: random.Random) -> Request:
    shape = rng.choice([None, "llama-3.1-8b", "llama-3.2-1b", "qwen3-30b-a3b"])
    served = json.loads((SHAPES / f"{shape}.json").read_text()) if shape else None
    return Request(inputs=_inputs(rng), objective=rng.choice(OBJECTIVES), served_config=served,
                   vllm_args=rng.choice(ARGS), predict_capture=False)


def _forget(rec: Recommender) -> None:
    for memo in rec.memos().values():
        memo.clear()


def _said(answer: Any) -> dict[str, Any]:
    out: dict[str, Any] = answer.model_dump(mode="json", exclude={"elapsed_ms"})
    return out


@needs_bundled
def test_an_answer_from_the_memos_is_the_answer_computed_afresh() -> None:
    rec = Recommender.from_dir(REPO / "models" / MODEL)
    fresh = Recommender.from_dir(REPO / "models" / MODEL)
    rng = random.Random(44)
    for _ in range(120):
        req = _request(rng)
        kept = decide(rec, req)  # memoised from earlier requests where they match, kept for later ones
        again = decide(rec, req)  # from the memos
        _forget(fresh)
        afresh = decide(fresh, req)
        assert _said(kept) == _said(again) == _said(afresh)
    hits = {name: memo.hits for name, memo in rec.memos().items()}
    assert all(hits.values()), hits  # every memo answered some requests


@needs_bundled
def test_a_caller_changing_its_answer_changes_no_later_answer() -> None:
    rec = Recommender.from_dir(REPO / "models" / MODEL)
    desc = WorkloadDescription(rate=8.0, input_tokens=512, output_tokens=128)
    first = rec.recommend(desc, "ttft_p50")
    said = _said(first)
    first.warnings.append("a caller's note")  # the service appends to its answer's lists
    first.notes.append("a caller's note")
    assert first.race is not None
    first.race.notes.append("a caller's note")
    first.race.worse.append("NONE")
    first.features["arrival_rate"] = -1.0
    assert _said(rec.recommend(desc, "ttft_p50")) == said


def test_a_memo_keeps_the_most_recently_used_entries_and_no_more() -> None:
    memo: Memo[int] = Memo(size=3)
    calls: list[str] = []

    def value(key: str) -> int:
        calls.append(key)
        return len(calls)

    for key in "abc":
        memo.get(key, lambda k=key: value(k))
    assert memo.get("a", lambda: value("a")) == 1  # kept: a hit, now the most recent
    memo.get("d", lambda: value("d"))  # evicts b, the least recently used
    assert len(memo) == 3
    assert memo.get("b", lambda: value("b")) == 5 and calls == ["a", "b", "c", "d", "b"]
    assert (memo.hits, memo.misses) == (1, 5)
    with pytest.raises(ValueError, match="at least one"):
        Memo(size=0)


@needs_bundled
def test_the_recommenders_memos_stay_within_their_bound() -> None:
    rec = Recommender.from_dir(REPO / "models" / MODEL)
    for memo in rec.memos().values():
        memo.size = 4
    rng = random.Random(7)
    for _ in range(30):
        decide(rec, Request(inputs=_inputs(rng), objective=rng.choice(OBJECTIVES), predict_capture=False))
    assert all(0 < len(memo) <= 4 for memo in rec.memos().values())


@needs_bundled
def test_a_reload_answers_from_new_empty_memos(tmp_path: Path) -> None:
    (tmp_path / MODEL).symlink_to(REPO / "models" / MODEL)
    settings = Settings()
    settings.service.token = SecretStr("t0ken")
    body = {"workload": {"rate": 3.0, "input_tokens": 700, "output_tokens": 90}, "objective": {"metric": "ttft_p50"}}
    with TestClient(create_app(settings, models_dir=tmp_path)) as client:
        state = client.app.state.service  # type: ignore[attr-defined]
        first = client.post("/v1/recommend", json=body)
        old = state.models.default
        old_memos = old.memos()
        hits = old_memos["describe"].hits
        assert client.post("/v1/recommend", json=body).json()["mode"] == first.json()["mode"]
        assert old_memos["describe"].hits == hits + 1  # the repeat came from the memo
        reloaded = client.post("/v1/reload", headers={"Authorization": "Bearer t0ken"})
        assert reloaded.status_code == 200, reloaded.text
        new = state.models.default
        assert new is not old and all(new.memos()[k] is not old_memos[k] for k in old_memos)
        misses = new.memos()["describe"].misses
        after = client.post("/v1/recommend", json=body).json()
        assert new.memos()["describe"].misses == misses + 1  # computed afresh by the new model
        before = first.json()
        assert {k: v for k, v in after.items() if k != "elapsed_ms"} == {
            k: v for k, v in before.items() if k != "elapsed_ms"}


@needs_bundled
def test_a_shapes_vectorizer_gives_each_column_as_the_spec_defines_it() -> None:
    """FeatureSpec.vectorizer computes a shape's columns once; every column and every filled name, in column
    order, is still what raw_value and transform give, for shapes with and without known configurations."""
    import math

    from graphmode.selector.featurize import transform

    rec = Recommender.from_dir(REPO / "models" / MODEL)
    spec = rec.spec
    shapes: list[dict[str, Any] | None] = [None, *rec.card.shapes[:3],
                                           {**rec.card.shapes[0], "deployment_unknown": ["speculative"]}]
    rng = random.Random(3)
    for shape in shapes:
        vec = spec.vectorizer(shape)
        for _ in range(20):
            feats = {n: rng.choice([None, rng.uniform(0.1, 5000.0)]) for n in ObservedFeatures.model_fields}
            x, filled = vec(feats)
            want, want_filled = [], []
            for i, name in enumerate(spec.names):
                v = transform(spec.raw_value(i, feats, shape), spec.transforms[i])
                if math.isnan(v):
                    want_filled.append(name)
                want.append(spec.fill[i] if math.isnan(v) else v)
            assert x.tolist() == want and filled == want_filled
            assert spec.vectorize(feats, shape)[1] == want_filled
