"""Shapes are matched by what changes the computation: inert config.json fields never change which shape answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graphmode.core.fingerprint import compute_hash, config_differences, config_hash, shape_of_config
from graphmode.core.records import Fingerprint
from graphmode.selector.card import ModelCard
from graphmode.selector.registry import match_card

REPO = Path(__file__).resolve().parents[2]
SHAPES = REPO / "models" / "shapes"
MODEL_033 = REPO / "models" / "nvidia-h200-vllm0.33.0-3375a87d3889"
INERT = ("initializer_range", "use_cache", "attention_dropout", "mlp_bias", "bos_token_id", "eos_token_id",
         "pretraining_tp", "max_position_embeddings", "hidden_act", "rms_norm_eps", "attention_bias")


def _cfg(name: str) -> dict[str, Any]:
    return dict(json.loads((SHAPES / f"{name}.json").read_text()))


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b", "qwen3-30b-a3b"])
def test_inert_fields_added_or_removed_keep_the_profiled_shape(name: str) -> None:
    cfg = _cfg(name)
    profiled = shape_of_config(cfg)["model_config_hash"]
    trimmed = {k: v for k, v in cfg.items() if k not in INERT}
    trimmed["transformers_version"] = "4.45.0"
    trimmed["_name_or_path"] = "/somewhere/else"
    assert shape_of_config(trimmed)["model_config_hash"] == profiled
    # a newer transformers writes dtype for torch_dtype: same computation
    renamed = dict(cfg)
    if "torch_dtype" in renamed:
        renamed["dtype"] = renamed.pop("torch_dtype")
    assert config_hash(renamed) == profiled


def test_defaults_written_out_read_like_defaults_left_out() -> None:
    cfg = _cfg("qwen2.5-0.5b")
    explicit = dict(cfg, head_dim=cfg["hidden_size"] // cfg["num_attention_heads"])
    assert compute_hash(explicit) == compute_hash(cfg)


@pytest.mark.parametrize("field, value", [
    ("num_key_value_heads", 4), ("num_attention_heads", 16), ("head_dim", 128), ("intermediate_size", 4096),
    ("vocab_size", 32000), ("torch_dtype", "float16"), ("tie_word_embeddings", False),
    ("rope_scaling", None), ("hidden_size", 1024), ("num_hidden_layers", 8),
    ("quantization_config", {"quant_method": "fp8"}), ("mlp_bias", True), ("attention_bias", True),
])
def test_a_field_that_changes_the_computation_changes_the_shape(field: str, value: Any) -> None:
    cfg = _cfg("llama-3.2-1b")
    assert config_hash(dict(cfg, **{field: value})) != config_hash(cfg)


def test_experts_change_the_shape() -> None:
    cfg = _cfg("qwen3-30b-a3b")
    assert config_hash(dict(cfg, num_experts_per_tok=4)) != config_hash(cfg)
    assert config_hash(dict(cfg, num_experts=64)) != config_hash(cfg)


def test_the_warning_names_the_field_that_differs() -> None:
    card = ModelCard.load(MODEL_033)
    cfg = dict(_cfg("llama-3.2-1b"), num_key_value_heads=4)
    shape = shape_of_config(cfg)
    assert config_differences(shape["model_config_hash"], config_hash(_cfg("llama-3.2-1b"))) == [
        "num_key_value_heads 4 vs 8"]
    target = Fingerprint(gpu_name="NVIDIA H200", vllm_version="0.33.0",
                         **{k: v for k, v in shape.items() if k in Fingerprint.model_fields})
    match = match_card(card, target)
    assert match.kind == "nearest"
    text = " ".join(match.warnings)
    assert "num_key_value_heads 4 vs 8" in text, text


def test_an_inert_variant_matches_the_card_exactly() -> None:
    card = ModelCard.load(MODEL_033)
    cfg = {k: v for k, v in _cfg("llama-3.2-1b").items() if k not in INERT}
    shape = shape_of_config(cfg)
    target = Fingerprint(gpu_name="NVIDIA H200", vllm_version="0.33.0",
                         **{k: v for k, v in shape.items() if k in Fingerprint.model_fields})
    assert match_card(card, target).kind == "exact"
