"""``graphmode launch``: the mode choice (remote → local → default), the merge, the CLI in dry-run.

The local model is trained on SYNTHETIC rows; the tests check behaviour, not what vLLM does.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from graphmode.cli.launch_cmd import run_child
from graphmode.cli.main import app
from graphmode.control.choose import (
    ObjectiveSpec,
    best_static_mode,
    choose_mode,
    merge_mode,
)
from graphmode.control.state import DeploymentState, save_state
from graphmode.core.errors import ConfigError, ObjectiveError
from graphmode.core.modes import CudaGraphMode
from graphmode.core.settings import DEFAULT_GRID
from graphmode.profiling.grid import load_grid
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.objective import make_objective
from graphmode.selector.recommend import Recommender
from graphmode.selector.train import train
from graphmode.vllm_args import compilation_config_of
from tests.support.synthetic import write_synthetic_dataset

NAMES = ["chat-r2-b1", "chat-r32-b0.25", "decode-heavy-r8-b1", "prefill-heavy-r2-b1", "balanced-r8-b1",
         "decode-heavy-r32-b1"]
WL = WorkloadDescription(rate=8, input_tokens=512, output_tokens=128)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("launch-models")
    ds = write_synthetic_dataset(root / "ds.sqlite", workloads=load_grid(DEFAULT_GRID).select(NAMES),
                                 repeats=2)
    train(ds, models_dir=root / "models")
    return root / "models"


def _service(mode: str, seen: list[dict[str, object]]) -> httpx.MockTransport:
    def handler(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/v1/recommend"
        seen.append(json.loads(req.content))
        return httpx.Response(200, json={"mode": mode, "compilation_config": {"cudagraph_mode": mode},
                                         "model_id": "remote-1"})

    return httpx.MockTransport(handler)


def test_remote_first_with_contract_body(models: Path) -> None:
    seen: list[dict[str, object]] = []
    c = choose_mode(workload=WL, objective=ObjectiveSpec("ttft_p99", ("ttft_p99<=200ms",)),
                    selector_url="http://svc:8080", models_dir=models, transport=_service("PIECEWISE", seen))
    assert c.mode is CudaGraphMode.PIECEWISE and c.source == "remote" and c.basis == "workload"
    assert seen[0]["workload"] == {"rate": 8.0, "burstiness": 1.0, "input_tokens": 512.0,
                                   "output_tokens": 128.0}
    assert seen[0]["objective"] == {"metric": "ttft_p99", "constraints": ["ttft_p99<=200ms"]}
    feats = {"arrival_rate": 3.0, "mean_input_tokens": 100.0, "batch_mean": None}
    c = choose_mode(features=feats, selector_url="http://svc", models_dir=models,
                    transport=_service("FULL", seen))
    assert c.basis == "features" and seen[1]["features"] == {"arrival_rate": 3.0, "mean_input_tokens": 100.0}


@pytest.mark.parametrize("failure", ["refused", "timeout", "500", "garbage"])
def test_service_down_falls_back_to_local_and_says_so(models: Path, failure: str) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if failure == "refused":
            raise httpx.ConnectError("connection refused", request=req)
        if failure == "timeout":
            raise httpx.ReadTimeout("slow", request=req)
        if failure == "500":
            return httpx.Response(500, text="boom")
        return httpx.Response(200, json={"nope": 1})

    c = choose_mode(workload=WL, selector_url="http://svc", models_dir=models,
                    transport=httpx.MockTransport(handler))
    assert c.source == "local" and c.basis == "workload"
    assert any("falling back to the local model" in n for n in c.notes)
    assert c.mode.value in {m.value for m in CudaGraphMode}


def test_no_model_falls_back_to_vllm_default(tmp_path: Path) -> None:
    c = choose_mode(workload=WL, selector_url="http://127.0.0.1:9", models_dir=tmp_path / "empty")
    assert c.mode is CudaGraphMode.FULL_AND_PIECEWISE and c.source == "default"
    assert any("unreachable" in n for n in c.notes) and any("local model unavailable" in n for n in c.notes)


def test_bad_objective_is_an_error(models: Path) -> None:
    with pytest.raises(ObjectiveError):
        choose_mode(workload=WL, objective=ObjectiveSpec("nonsense"), models_dir=models)


def test_static_mode_from_card_and_by_majority(models: Path) -> None:
    c = choose_mode(models_dir=models)
    rec = Recommender.load(models)
    card_static = {s.objective: s.static_mode for s in rec.card.cv.summaries}
    assert c.basis == "static" and c.source == "local"
    assert c.mode.value == card_static["min itl_p50"] and "model card" in c.reason
    # an objective the card did not evaluate: majority over the profiled workloads
    mode, how = best_static_mode(rec, make_objective("itl_p99"))
    assert mode in {m.value for m in CudaGraphMode} and "profiled workloads" in how


def test_merge_keeps_other_keys_and_user_mode_wins() -> None:
    args = ["--model", "m", "--compilation-config", '{"level": 3, "cudagraph_capture_sizes": [1, 2]}']
    p = merge_mode(args, CudaGraphMode.FULL, force=False)
    assert p.applied and compilation_config_of(p.args) == {"level": 3, "cudagraph_capture_sizes": [1, 2],
                                                           "cudagraph_mode": "FULL"}
    user = ["--model", "m", "-cc", '{"cudagraph_mode": "NONE", "level": 3}']
    p = merge_mode(user, CudaGraphMode.FULL, force=False)
    assert not p.applied and p.args == user and p.mode is CudaGraphMode.NONE
    p = merge_mode(user, CudaGraphMode.FULL, force=True)
    assert compilation_config_of(p.args) == {"cudagraph_mode": "FULL", "level": 3}
    assert "overriding" in p.message
    with pytest.raises(ConfigError):
        merge_mode(["--compilation-config", "{bad"], CudaGraphMode.FULL, force=False)


runner = CliRunner()


def test_cli_dry_run_prints_the_command(models: Path, tmp_path: Path) -> None:
    r = runner.invoke(app, ["launch", "--dry-run", "--models-dir", str(models), "--state-dir", str(tmp_path),
                            "--vllm-cmd", "/opt/v/bin/python -m vllm.entrypoints.openai.api_server",
                            "--", "--model", "/m", "--compilation-config", '{"level":3}'])
    assert r.exit_code == 0, r.output
    argv = shlex.split(r.stdout.strip().splitlines()[-1])
    assert argv[:3] == ["/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    cc = compilation_config_of(argv)
    assert cc["level"] == 3 and cc["cudagraph_mode"] in {m.value for m in CudaGraphMode}
    assert "source local, basis static" in r.stderr


def test_cli_uses_persisted_features_then_workload(models: Path, tmp_path: Path) -> None:
    st = DeploymentState(deployment_id="d1", last_features={"arrival_rate": 30.0, "mean_input_tokens": 200.0,
                                                            "mean_output_tokens": 400.0})
    save_state(tmp_path, st)
    base = ["launch", "--dry-run", "--json", "--models-dir", str(models), "--state-dir", str(tmp_path),
            "--deployment-id", "d1"]
    r = runner.invoke(app, [*base, "--", "serve-args"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["basis"] == "features" and out["source"] == "local" and out["applied"]
    wl = ["--rate", "2", "--input-tokens", "100", "--output-tokens", "50"]
    r = runner.invoke(app, [*base, *wl, "--", "x"])
    assert json.loads(r.stdout.strip().splitlines()[-1])["basis"] == "workload"
    r = runner.invoke(app, [*base, "--rate", "2", "--", "x"])
    assert r.exit_code == 2 and "workload description" in r.stderr
    r = runner.invoke(app, [*base, "--", "--compilation-config", '{"cudagraph_mode":"FULL"}'])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["source"] == "user" and not out["applied"] and out["mode"] == "FULL"


def test_run_child_returns_status() -> None:
    assert run_child([sys.executable, "-c", "raise SystemExit(3)"]) == 3


HEAVY = ("sklearn", "skops", "fastapi", "httpx", "uvicorn", "graphmode.profiling.runner")


def test_help_and_a_described_launch_keep_heavy_stacks_off_the_import_path(models: Path) -> None:
    """`graphmode --help` and `launch --dry-run` with a description answer from JSON (decision table)."""
    import subprocess

    code = ("import sys\nfrom graphmode.cli.main import app\n"
            "try:\n    app(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    launch = ["launch", "--dry-run", "--models-dir", str(models), "--rate", "8", "--input-tokens", "512",
              "--output-tokens", "128", "--", "--model", "m"]
    for argv in (["--help"], launch):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
        assert "HEAVY []" in r.stdout, (argv, r.stdout[-300:], r.stderr[-300:])
    assert "decision table" in r.stderr
