"""The bundled models per vLLM release: recommend picks the one of the deployment's release, and says so when
it has to fall back to the nearest profiled release."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphmode.core.records import Fingerprint
from graphmode.selector.registry import list_models, match_card, select_model

MODELS = Path(__file__).resolve().parents[2] / "models"
H200 = "NVIDIA H200"


def _release(model_id: str) -> str:
    return model_id.split("-vllm", 1)[1].split("-", 1)[0]


def test_one_bundled_model_per_profiled_gpu_and_release() -> None:
    cards = [e.card for e in list_models(MODELS) if e.card is not None]
    assert sorted(c.vllm_version or "" for c in cards if c.gpu_name == H200) == ["0.24.0", "0.33.0"]
    assert [c.vllm_version for c in cards if c.gpu_name == "NVIDIA H100 80GB HBM3"] == ["0.33.0"]


@pytest.mark.parametrize("release", ["0.24.0", "0.33.0"])
def test_the_deployments_release_picks_its_model(release: str) -> None:
    entry, match = select_model(MODELS, target=Fingerprint(gpu_name=H200, vllm_version=release))
    assert _release(entry.model_id) == release
    assert match.kind == "compatible" and not match.warnings and not match.stale


@pytest.mark.parametrize(("asked", "nearest"), [("0.25.1", "0.24.0"), ("0.31.0", "0.33.0"), ("0.35.0", "0.33.0"),
                                                ("0.24.1", "0.24.0")])
def test_an_unprofiled_release_gets_the_nearest_and_says_so(asked: str, nearest: str) -> None:
    entry, match = select_model(MODELS, target=Fingerprint(gpu_name=H200, vllm_version=asked))
    assert _release(entry.model_id) == nearest
    assert match.kind == "nearest" and match.stale
    assert any(f"vLLM {asked} vs model's {nearest}" in w for w in match.warnings)


def test_a_patch_release_is_nearer_than_another_minor() -> None:
    cards = {_release(e.model_id): e.card for e in list_models(MODELS) if e.card is not None}
    target = Fingerprint(gpu_name=H200, vllm_version="0.33.2")
    assert match_card(cards["0.33.0"], target).score > match_card(cards["0.24.0"], target).score


def test_without_a_release_the_newest_release_answers_and_says_so() -> None:
    entry, match = select_model(MODELS, target=None)
    assert _release(entry.model_id) == "0.33.0" and match.release_assumed == "0.33.0"
    gpu_only = select_model(MODELS, target=Fingerprint(gpu_name=H200))
    assert _release(gpu_only[0].model_id) == "0.33.0" and gpu_only[1].release_assumed == "0.33.0"
    named = select_model(MODELS, target=Fingerprint(gpu_name=H200, vllm_version="0.24.0"))
    assert _release(named[0].model_id) == "0.24.0" and named[1].release_assumed is None


def test_every_bundled_models_datasets_are_the_ones_it_was_trained_on() -> None:
    """A committed dataset that gained rows (a lease's race appended to a capture dataset) without the model
    being retrained makes every capture answer lose its costs ("changed since the model was trained"): session
    22 appended races to two capture datasets and caught it only by hand."""
    from graphmode.selector.card import ModelCard

    checked = 0
    for entry in list_models(MODELS):
        if entry.card is None:
            continue
        folder = MODELS / entry.model_id
        for src in ModelCard.load(folder).dataset.cost_sources():
            assert src.resolve(folder).is_file()  # DatasetError names the file when its sha256 differs
            checked += 1
    assert checked >= 4
