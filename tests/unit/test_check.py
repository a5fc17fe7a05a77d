"""``graphmode check``: one test per finding type, the CLI's exit status and JSON, and ``POST /v1/check``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from graphmode.check.rules import CheckInputs, check_deployment, extended_sizes
from graphmode.cli.main import app
from graphmode.selector.capture_costs import CaptureCosts

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
CONFIG_8B = json.loads((MODELS / "shapes" / "llama-3.1-8b.json").read_text())
# a cost model fit on three lists of different count and top, so it knows GiB up to 1024
COSTS = CaptureCosts.fit([([1, 2, 4, 8], "FULL_AND_PIECEWISE", 2.0, 0.30, 0.5),
                          (list(range(8, 520, 8)), "FULL_AND_PIECEWISE", 9.0, 0.45, 0.9),
                          (list(range(16, 1040, 16)), "FULL_AND_PIECEWISE", 11.0, 0.60, 1.2)])


def _codes(args: list[str], **kw: object) -> dict[str, str]:
    inputs = CheckInputs(vllm_args=args, served_config=kw.pop("served", CONFIG_8B), costs=COSTS, **kw)  # type: ignore[arg-type]
    return {f.code: f.severity for f in check_deployment(inputs).findings}


def test_default_list_and_the_1024_decode_steps_it_leaves_eager() -> None:
    rep = check_deployment(CheckInputs(["--max-num-seqs", "1024"], CONFIG_8B, costs=COSTS))
    assert rep.resolved.capture_sizes[-1] == 512 and len(rep.resolved.capture_sizes) == 51
    f = next(f for f in rep.findings if f.code == "decode-eager")
    assert f.severity == "warning" and "513-1024" in f.message
    assert f.fix is not None and json.loads(f.fix[1])["max_cudagraph_capture_size"] == 1024
    assert "0.73x" in (f.evidence.measured or "") and rep.ok  # a warning does not fail the check
    # vLLM's default max_num_seqs on a small GPU is 256: its default list (to 512) covers it
    assert "decode-eager" not in _codes([], gpu_memory_gib=24)
    assert _codes([])["decode-eager"] == "info"  # 1024 by vLLM's default on a large GPU: said, not warned


def test_spec_decode_beyond_the_list_is_an_error_with_a_list_in_multiples_of_1_plus_k() -> None:
    spec = ["--max-num-seqs", "256", "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}',
            "--compilation-config", '{"max_cudagraph_capture_size":512}']
    rep = check_deployment(CheckInputs(spec, CONFIG_8B, costs=COSTS))
    f = next(f for f in rep.findings if f.code == "spec-decode-eager")
    assert f.severity == "error" and not rep.ok and "1024 tokens" in f.message
    assert any("54933" in r for r in f.evidence.reports)
    sizes = json.loads(f.fix[1])["cudagraph_capture_sizes"] if f.fix else []
    assert sizes[-1] == 1024 and all(s % 4 == 0 for s in sizes)
    assert rep.resolved.decode_graph_sizes == sorted(set(rep.resolved.decode_graph_sizes))
    # without a given maximum vLLM's default list grows with 1 + k: 256 x 4 x 2 > 512, so still short
    assert _codes(spec[:4])["spec-decode-eager"] == "error"
    assert "spec-decode-eager" not in _codes(["--max-num-seqs", "64", *spec[2:4]])  # 256 tokens <= 512
    assert _codes(spec[2:4])["spec-decode-eager"] == "warning"  # vLLM's default max_num_seqs: not gated


def test_flashinfer_full_is_a_downgrade_with_the_mode_it_runs_as_fix() -> None:
    rep = check_deployment(CheckInputs(["--attention-backend", "FLASHINFER", "--compilation-config",
                                        '{"cudagraph_mode":"FULL"}'], CONFIG_8B, costs=COSTS))
    assert rep.resolved.mode == "FULL_AND_PIECEWISE" and rep.resolved.requested_mode == "FULL"
    f = next(f for f in rep.findings if f.code == "mode-downgrade")
    assert f.severity == "warning" and f.fix and json.loads(f.fix[1])["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert "resolve_cudagraph_mode_and_sizes" in f.evidence.vllm_source and f.evidence.measured


def test_sizes_above_the_token_budget_are_dropped_and_that_is_an_error() -> None:
    args = ["--max-num-batched-tokens", "512", "--compilation-config",
            '{"cudagraph_capture_sizes":[1,2,4,256,1024]}']
    rep = check_deployment(CheckInputs(args, CONFIG_8B, costs=COSTS))
    assert rep.resolved.capture_sizes == [1, 2, 4, 256]
    f = next(f for f in rep.findings if f.code == "sizes-truncated")
    assert f.severity == "error" and f.fix == ["--max-num-batched-tokens", "1024"]
    assert any("37865" in r for r in f.evidence.reports)


def test_enforce_eager_unknown_backend_and_no_config() -> None:
    eager = check_deployment(CheckInputs(["--enforce-eager"], CONFIG_8B, costs=COSTS))
    assert eager.resolved.mode == "NONE" and eager.resolved.capture_sizes == []
    assert next(f for f in eager.findings if f.code == "enforce-eager").drop == ["--enforce-eager"]
    assert _codes(["--attention-backend", "SOME_NEW_ATTN"])["unknown-backend"] == "info"
    assert _codes([], served=None)["no-model-config"] == "warning"


def test_mixed_steps_and_graph_cost_with_its_error_and_kv_share() -> None:
    codes = _codes(["--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}'])
    assert codes["mixed-steps-eager"] == "info"
    loo = COSTS.with_loo_error([([1, 2, 4, 8], "FULL_AND_PIECEWISE", 2.0, 0.30, 0.5),
                                (list(range(8, 520, 8)), "FULL_AND_PIECEWISE", 9.0, 0.45, 0.9),
                                (list(range(16, 1040, 16)), "FULL_AND_PIECEWISE", 11.0, 0.60, 1.2)])
    assert loo.loo_rel_error_s is not None and loo.loo_rel_error_gib is not None
    rep = check_deployment(CheckInputs([], CONFIG_8B, gpu_memory_gib=24, costs=loo))
    cost = rep.resolved.cost
    assert cost.capture_s and cost.kv_tokens and cost.kv_share and cost.rel_error_s == loo.loo_rel_error_s
    # 24 GiB x 0.9 less 8B bf16 weights (~15 GiB) leaves ~6.6 GiB: the graphs' reserve is well over 5% of it
    f = next(f for f in rep.findings if f.code == "graph-cost")
    assert f.severity == "warning" and "leaving each measured start out" in f.message
    assert _codes([], gpu_memory_gib=141)["graph-cost"] == "info"
    no_costs = check_deployment(CheckInputs([], CONFIG_8B))
    assert {f.code for f in no_costs.findings} >= {"cost-unknown"}


def test_extended_sizes_keep_vllms_grid_and_end_at_the_top() -> None:
    assert extended_sizes(1024, 1, 8192)[-3:] == [992, 1008, 1024]
    assert extended_sizes(1000, 1, 8192)[-1] == 1000
    assert extended_sizes(4096, 1, 2048)[-1] == 2048


def test_cli_exit_status_json_and_bad_args(tmp_path: Path) -> None:
    model = tmp_path / "m8b"
    model.mkdir()
    shutil.copy(MODELS / "shapes" / "llama-3.1-8b.json", model / "config.json")
    base = ["check", "--models-dir", str(MODELS), "--vllm-version", "0.33.0", "--json", "--"]
    ok = CliRunner().invoke(app, [*base, "--model", str(model), "--max-num-seqs", "1024"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert data["ok"] and data["resolved"]["cost"]["capture_s"] is not None
    bad = CliRunner().invoke(app, [*base, "--model", str(model), "--speculative-config",
                                   '{"method":"ngram","num_speculative_tokens":5}', "--max-num-seqs", "512"])
    assert bad.exit_code == 1 and json.loads(bad.stdout)["ok"] is False
    broken = CliRunner().invoke(app, [*base, "--compilation-config", "{nope"])
    assert broken.exit_code != 0 and "Traceback" not in broken.output


def test_service_check_endpoint(tmp_path: Path) -> None:
    from graphmode.service.app import create_app

    client = TestClient(create_app(models_dir=MODELS))
    r = client.post("/v1/check", json={"vllm_args": ["--max-num-seqs", "1024"], "vllm_version": "0.33.0",
                                       "served_model_config": CONFIG_8B})
    assert r.status_code == 200, r.text
    assert r.json()["ok"] and any(f["code"] == "decode-eager" for f in r.json()["findings"])
    huge = client.post("/v1/check", json={"vllm_args": ["--max-num-seqs", "999999999",
                                                        "--max-num-batched-tokens", "999999999"]})
    assert huge.status_code == 200 and max(huge.json()["resolved"]["capture_sizes"]) <= 65536  # bounded work
    bad = client.post("/v1/check", json={"vllm_args": ["--compilation-config", "{nope"]})
    assert bad.status_code == 422


def test_launch_runs_check_before_it_starts(tmp_path: Path) -> None:
    model = tmp_path / "m8b"
    model.mkdir()
    shutil.copy(MODELS / "shapes" / "llama-3.1-8b.json", model / "config.json")
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--json", "--models-dir", str(MODELS), "--state-dir",
                                 str(tmp_path), "--ignore-state", "--vllm-version", "0.33.0", "--",
                                 "--model", str(model), "--max-num-seqs", "1024"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout.strip().splitlines()[-1])
    assert data["check"]["resolved"]["max_num_seqs"] == 1024
    assert any(f["code"] == "decode-eager" for f in data["check"]["findings"])
    assert "graphmode: check: warning decode-eager" in r.output
