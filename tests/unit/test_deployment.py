"""The deployment configuration: read from vLLM's args, env, config.json and start-up log; recorded in the
profile key and the rows; grouped and featurized by the selector; reported by recommend, /v1/recommend and
launch when unlike the trained configurations."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.core.dataset import ProfileStore, flatten
from graphmode.core.deployment import (
    DeploymentConfig,
    DeploymentError,
    config_suffix,
    deployment_of_row,
    describe,
    unlike,
)
from graphmode.core.fingerprint import estimate_active_params, estimate_params, shape_of_config
from graphmode.core.records import CellRecord, Fingerprint, StartupInfo
from graphmode.profiling.logparse import parse_startup_log
from graphmode.profiling.runner import profile_key
from graphmode.selector.aggregate import build_training_set
from graphmode.selector.featurize import fit_spec, shape_key, shape_of_row

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
SHAPES = MODELS / "shapes"
H200_LOGS = ROOT / "tests" / "fixtures" / "vllm-0.24-h200"
BUNDLED = next(iter(sorted(MODELS.glob("nvidia-h200-vllm0.24.0-*"))), None)


def _cfg(name: str) -> dict[str, object]:
    return dict(json.loads((SHAPES / f"{name}.json").read_text(encoding="utf-8")))


# ------------------------------------------------------------------ reading each element
def test_backend_from_the_real_log_then_args_then_env() -> None:
    startup = parse_startup_log((H200_LOGS / "llama8b-FULL.log").read_text(encoding="utf-8"))
    dep = DeploymentConfig.from_vllm_args(["--attention-backend", "FLASHINFER"], {}, None, startup)
    assert dep.attention_backend == "FLASH_ATTN" and dep.attention_backend_source == "log"  # what vLLM resolved
    assert dep.attention_backend_requested
    dep = DeploymentConfig.from_vllm_args(["--attention-backend=flashinfer"])
    assert (dep.attention_backend, dep.attention_backend_source) == ("FLASHINFER", "args")
    dep = DeploymentConfig.from_vllm_args([], {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"})
    assert (dep.attention_backend, dep.attention_backend_source) == ("TRITON_ATTN", "env")
    dep = DeploymentConfig.from_vllm_args([])
    assert dep.attention_backend is None and "attention_backend" in dep.unknown and not dep.attention_backend_requested


def test_backend_from_vllm_033_attention_config() -> None:
    for args in (["--attention-config", '{"backend": "TRITON_ATTN"}'], ['-ac={"backend": "triton_attn"}'],
                 ["-ac.backend", "TRITON_ATTN"]):
        dep = DeploymentConfig.from_vllm_args(args)
        assert (dep.attention_backend, dep.attention_backend_source) == ("TRITON_ATTN", "args"), args
        assert dep.attention_backend_requested
    dep = DeploymentConfig.from_vllm_args(["-ac", '{"backend": "auto"}'])
    assert dep.attention_backend is None and not dep.attention_backend_requested
    with pytest.raises(DeploymentError, match="--attention-config"):
        DeploymentConfig.from_vllm_args(["-ac", "{bad"])
    assert "attention_backend" in DeploymentConfig.from_vllm_args(["-ac", "{bad"], strict=False).unknown


def test_speculative_method_and_k() -> None:
    dep = DeploymentConfig.from_vllm_args(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}'])
    assert (dep.speculative_method, dep.speculative_k) == ("ngram", 5)
    dep = DeploymentConfig.from_vllm_args(['--speculative_config={"model": "/d", "num_speculative_tokens": 3}'])
    assert (dep.speculative_method, dep.speculative_k) == ("draft_model", 3)
    assert DeploymentConfig.from_vllm_args([]).speculative_method is None
    for bad in ("{not json", "[1]", '{"method": "ngram", "num_speculative_tokens": 0}'):
        with pytest.raises(DeploymentError):
            DeploymentConfig.from_vllm_args(["--speculative-config", bad])
        lenient = DeploymentConfig.from_vllm_args(["--speculative-config", bad], strict=False)
        assert "speculative" in lenient.unknown


def test_quantization_from_the_flag_or_the_checkpoint() -> None:
    assert DeploymentConfig.from_vllm_args(["--quantization", "FP8"]).quantization == "fp8"
    assert DeploymentConfig.from_vllm_args(["-q", "awq"]).quantization == "awq"
    fp8_ckpt = {**_cfg("llama-3.1-8b"), "quantization_config": {"quant_method": "fp8"}}
    assert DeploymentConfig.from_vllm_args([], model_config=fp8_ckpt).quantization == "fp8"
    plain = DeploymentConfig.from_vllm_args([], model_config=_cfg("llama-3.1-8b"))
    assert plain.quantization is None and "quantization" not in plain.unknown
    assert "quantization" in DeploymentConfig.from_vllm_args([]).unknown  # the checkpoint may be quantized
    assert shape_of_config(fp8_ckpt)["checkpoint_quantization"] == "fp8"


def test_batch_limits_and_tensor_parallel_size() -> None:
    dep = DeploymentConfig.from_vllm_args(["--max-num-seqs", "1024", "--max-model-len", "16k", "-tp", "2"])
    assert (dep.max_num_seqs, dep.max_model_len, dep.tensor_parallel_size) == (1024, 16000, 2)
    assert DeploymentConfig.from_vllm_args(["--tensor-parallel-size=4"]).tensor_parallel_size == 4
    assert DeploymentConfig.from_vllm_args(["--max-model-len", "32K"]).max_model_len == 32768
    dep = DeploymentConfig.from_vllm_args([])
    assert (dep.max_num_seqs, dep.max_model_len, dep.tensor_parallel_size) == (None, None, 1)
    with pytest.raises(DeploymentError, match="tensor-parallel-size"):
        DeploymentConfig.from_vllm_args(["--tensor-parallel-size", "two"])
    assert "tensor_parallel_size" in DeploymentConfig.from_vllm_args(["-tp", "0"], strict=False).unknown


def test_non_default_args_of_the_real_log() -> None:
    startup = parse_startup_log((H200_LOGS / "qwen0.5b-PIECEWISE.log").read_text(encoding="utf-8"))
    assert startup.non_default_args is not None
    dep = DeploymentConfig.from_non_default_args(startup.non_default_args, startup=startup, strict=False)
    assert dep.max_model_len == 4096 and dep.tensor_parallel_size == 1 and dep.speculative_method is None
    assert dep.attention_backend == "FLASH_ATTN" and dep.max_num_seqs is None


# ------------------------------------------------------------------ MoE parameters
def test_moe_total_and_active_parameters() -> None:
    moe = _cfg("qwen3-30b-a3b")
    assert estimate_params(moe) == pytest.approx(30.5, abs=0.2)  # "30B", every expert counted
    assert estimate_active_params(moe) == pytest.approx(3.3, abs=0.15)  # "A3B"
    shape = shape_of_config(moe)
    assert (shape["num_experts"], shape["num_experts_per_tok"]) == (128, 8)
    dense = _cfg("llama-3.1-8b")
    assert estimate_active_params(dense) == estimate_params(dense) and shape_of_config(dense)["num_experts"] is None
    mixtral = {"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}
    assert estimate_params(mixtral) == pytest.approx(46.7, abs=0.2)
    assert estimate_active_params(mixtral) == pytest.approx(12.9, abs=0.2)
    dep = DeploymentConfig.from_vllm_args([], model_config=moe)
    assert dep.num_active_params_b == shape["num_active_params_b"] and dep.num_experts == 128
    no_topk = {k: v for k, v in moe.items() if k != "num_experts_per_tok"}
    assert estimate_active_params(no_topk) is None


# ------------------------------------------------------------------ profile key and rows
def test_profile_key_changes_with_tp_and_backend_and_keeps_old_keys() -> None:
    shape = {"model_config_hash": "abc"}
    base = ["--model", "/m", "--max-model-len", "4096"]
    key = profile_key("H200", shape, ["vllm"], base)
    assert key == profile_key("H200", shape, ["vllm"], base, {})  # no backend in env: the key of old datasets
    assert key == profile_key("H200", shape, ["vllm"], [*base, "--port", "8001"])
    others = {profile_key("H200", shape, ["vllm"], [*base, "-tp", "2"]),
              profile_key("H200", shape, ["vllm"], [*base, "--attention-backend", "FLASHINFER"]),
              profile_key("H200", shape, ["vllm"], base, {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}),
              profile_key("H200", shape, ["vllm"], base, {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}),
              profile_key("H200", shape, ["vllm"], [*base, "--quantization", "fp8"]),
              profile_key("H200", shape, ["vllm"], [*base, "--speculative-config", '{"method":"ngram"}'])}
    assert key not in others and len(others) == 6


def _record(args: list[str], backend: str | None = "FLASH_ATTN", **fp: object) -> CellRecord:
    return CellRecord(run_id="r", profile_key="k", mode="FULL", workload="w", workload_spec={}, repeat=0,
                      status="ok", started_at=0.0, finished_at=1.0,
                      startup=StartupInfo(attention_backend=backend),
                      fingerprint=Fingerprint(vllm_args=args, model_config_hash="abc", num_params_b=1.0,
                                              num_active_params_b=1.0, **fp))  # type: ignore[arg-type]


def test_rows_record_the_configuration(tmp_path: Path) -> None:
    spec = '{"method":"ngram","num_speculative_tokens":3}'
    rec = _record(["--model", "/m", "-tp", "2", "--speculative-config", spec])
    assert rec.deployment is not None and rec.deployment.tensor_parallel_size == 2
    with ProfileStore(tmp_path / "d.sqlite") as store:
        store.append(rec, "h")
        row = store.rows()[0]
    assert row["dep_tensor_parallel_size"] == 2 and row["dep_speculative_k"] == 3
    assert row["dep_attention_backend"] == "FLASH_ATTN" and row["dep_attention_backend_source"] == "log"
    dep = deployment_of_row(row)
    assert dep == rec.deployment
    assert shape_key(shape_of_row(row)) == "abc+tp=2+spec=ngram:3"


def _old_dataset(path: Path, rows: list[tuple[str, str | None, str | None]]) -> None:
    """A dataset as graphmode wrote it before the dep_* columns: (fp_vllm_args, attention_backend, nda)."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE cells (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, profile_key TEXT "
               "NOT NULL, mode TEXT NOT NULL, workload TEXT NOT NULL, workload_hash TEXT NOT NULL, repeat INTEGER "
               "NOT NULL, status TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL NOT NULL, "
               "workload_spec TEXT NOT NULL, fp_vllm_args TEXT, attention_backend TEXT, non_default_args TEXT, "
               "fp_model_config_hash TEXT, fp_num_params_b REAL)")
    for args, backend, nda in rows:
        db.execute("INSERT INTO cells (run_id, profile_key, mode, workload, workload_hash, repeat, status, "
                   "started_at, finished_at, workload_spec, fp_vllm_args, attention_backend, non_default_args, "
                   "fp_model_config_hash, fp_num_params_b) VALUES ('r','k','FULL','w','h',0,'ok',0,1,'{}',?,?,?,"
                   "'abc',1.2)", (args, backend, nda))
    db.commit()
    db.close()


def test_old_datasets_load_and_prove_only_what_their_args_and_logs_say(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    campaign = json.dumps(["--model", "/tmp/gm/m", "--load-format", "dummy", "--max-model-len", "4096"])
    _old_dataset(path, [(campaign, "FLASH_ATTN", None), ("[]", None, json.dumps({"max_model_len": 2048})),
                        ("[]", None, None)])
    with ProfileStore(path) as store:  # opening migrates: the dep_* columns are added, old rows read NULL
        rows = store.rows()
    assert len(rows) == 3 and all(r["dep_unknown"] is None for r in rows)
    proven = deployment_of_row(rows[0])
    assert (proven.tensor_parallel_size, proven.attention_backend, proven.max_model_len) == (1, "FLASH_ATTN", 4096)
    assert proven.speculative_method is None and proven.max_num_seqs is None
    assert sorted(proven.unknown) == ["num_active_params_b", "quantization"]  # the checkpoint was not recorded
    assert describe(proven.shape_fields()).startswith("TP=1 FLASH_ATTN quantization unknown without speculative")
    logged = deployment_of_row(rows[1])
    assert logged.max_model_len == 2048 and "attention_backend" in logged.unknown
    nothing = deployment_of_row(rows[2])
    assert {"tensor_parallel_size", "speculative", "max_num_seqs"} <= set(nothing.unknown)
    assert shape_key(shape_of_row(rows[0])) == shape_key(shape_of_row(rows[2])) == "abc"  # keys as before


# ------------------------------------------------------------------ selector
def test_configurations_are_shapes_and_features() -> None:
    logged = StartupInfo(attention_backend="FLASH_ATTN")
    one = {"model_config_hash": "abc", **DeploymentConfig.from_vllm_args([], model_config={},
                                                                         startup=logged).shape_fields()}
    tp2 = {"model_config_hash": "abc", **DeploymentConfig.from_vllm_args(["-tp", "2"], model_config={},
                                                                         startup=logged).shape_fields()}
    fi = {"model_config_hash": "abc", **DeploymentConfig.from_vllm_args(
        ["--attention-backend", "FLASHINFER"], model_config={}).shape_fields()}
    assert config_suffix(one) == "" and shape_key(tp2) == "abc+tp=2" and shape_key(fi) == "abc+attn=FLASHINFER"
    obs = [{"arrival_rate": r, "mean_input_tokens": 100.0} for r in (1.0, 2.0, 4.0)]
    spec, _ = fit_spec(obs, [one, tp2, fi])
    assert "tensor_parallel_size" in spec.names and "attention_backend=FLASHINFER" in spec.names
    assert spec.sources[spec.names.index("attention_backend=FLASHINFER")] == "cat"
    assert spec.dropped["speculative_k"] == "constant across the training data"
    x, _ = spec.vectorize(obs[0], tp2)
    assert x[spec.names.index("tensor_parallel_size")] == pytest.approx(0.6931, abs=1e-3)


def test_training_set_keeps_configurations_apart() -> None:
    rows = []
    for tp in ("1", "2"):
        for mode, itl in (("NONE", 0.02), ("FULL", 0.01)):
            rec = _record(["--model", "/m", "-tp", tp])
            row = flatten(rec.model_copy(update={"mode": mode}), "h")
            row.update(status="ok", itl_p50=itl, obs_arrival_rate=2.0, obs_mean_input_tokens=100.0)
            rows.append(row)
    ts = build_training_set(rows)
    assert ts.shape_keys == ["abc", "abc+tp=2"] and len(ts.units) == 2
    assert {ts.shapes[k]["tensor_parallel_size"] for k in ts.shape_keys} == {1, 2}


def test_unlike_names_each_differing_element() -> None:
    trained = [{"model_config_hash": "a", **DeploymentConfig.from_vllm_args(
        [], model_config={}, startup=StartupInfo(attention_backend="FLASH_ATTN")).shape_fields()}]
    same = DeploymentConfig.from_vllm_args(["--attention-backend", "FLASH_ATTN"], model_config={}).shape_fields()
    assert unlike(same, trained) == []
    other = DeploymentConfig.from_vllm_args(["-tp", "2", "--quantization", "fp8"], model_config={}).shape_fields()
    assert unlike(other, trained) == ["TP=2 (trained: TP=1)", "fp8-quantized (trained: unquantized)"]


def test_a_configuration_profiled_on_other_models_only_is_carried_over() -> None:
    from graphmode.selector.deployments import deployment_warning

    def shape(model: str, params: float, args: list[str]) -> dict[str, object]:
        fields = DeploymentConfig.from_vllm_args(args, model_config={}, startup=StartupInfo(
            attention_backend="FLASH_ATTN")).shape_fields()
        return {"model_config_hash": model, "model_architecture": "LlamaForCausalLM", "num_params_b": params,
                **fields}

    k5 = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}']
    k3 = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    trained = [shape("1b", 1.24, []), shape("1b", 1.24, k5), shape("8b", 8.03, []), shape("8b", 8.03, k3)]
    warning = deployment_warning(shape("8b", 8.03, k5), trained)
    assert warning is not None and warning.startswith("this configuration (spec=ngram:5) was profiled on "
                                                      "LlamaForCausalLM 1.24B only, not on this model")
    assert deployment_warning(shape("8b", 8.03, k3), trained) is None  # raced on this model
    assert deployment_warning(shape("1b", 1.24, k5), trained) is None
    assert deployment_warning(shape("8b", 8.03, []), trained) is None  # the defaults: no suffix
    # a model never trained at all is the shape warning's business, not this one's
    assert deployment_warning(shape("70b", 70.6, k5), trained) is None


def test_json_flags_that_lost_their_quotes_say_how_to_quote() -> None:
    with pytest.raises(DeploymentError, match="quote the JSON in single quotes"):
        DeploymentConfig.from_vllm_args(["--speculative-config", "{method:ngram}"], model_config={})


# ------------------------------------------------------------------ recommend, /v1/recommend, launch
needs_bundled = pytest.mark.skipif(BUNDLED is None, reason="no bundled model under models/")
WORKLOAD = ["--rate", "4", "--input-tokens", "256", "--output-tokens", "128"]


@needs_bundled
def test_cli_recommend_warns_on_an_unprofiled_configuration() -> None:
    runner = CliRunner()
    base = ["recommend", "--models-dir", str(MODELS), "--gpu", "NVIDIA H200", "--vllm-version", "0.24.0",
            "--model-path", str(SHAPES / "llama-3.1-8b.json"), *WORKLOAD, "--json"]
    r = runner.invoke(app, [*base, "--vllm-args", "--model /m -tp 2 --max-model-len 4096"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    warning = next(w for w in out["warnings"] if "this deployment:" in w)
    # the bundled card predates recorded configurations: its fingerprints' args and its datasets' logs prove
    # TP=1 and FLASH_ATTN; the checkpoint's quantization was not recorded
    assert warning.startswith("trained on TP=1 FLASH_ATTN quantization unknown without speculative decoding")
    assert "this deployment: TP=2" in warning and "extrapolated (TP=2 (trained: TP=1))" in warning
    assert out["confidence"]["level"] == "low"
    r = runner.invoke(app, [*base, "--vllm-args", "--model /m --max-model-len 4096"])
    assert r.exit_code == 0 and not any("this deployment:" in w for w in json.loads(r.stdout)["warnings"])
    r = runner.invoke(app, [*base, "--vllm-args", "--speculative-config {bad"])
    assert r.exit_code != 0 and "--speculative-config is not JSON" in " ".join(r.output.split())


@needs_bundled
def test_api_recommend_warns_on_an_unprofiled_configuration() -> None:
    from starlette.testclient import TestClient

    from graphmode.core.settings import Settings
    from graphmode.service.app import create_app

    body = {"workload": {"rate": 4, "input_tokens": 256, "output_tokens": 128},
            "served_model_config": _cfg("llama-3.1-8b"),
            "vllm_args": ["--model", "/m", "--attention-backend", "FLASHINFER", "--speculative-config",
                          '{"method": "ngram", "num_speculative_tokens": 3}'],
            "model_id": "nvidia-h200-vllm0.24.0-ab3c7947c90d"}  # trained on the default configuration only
    with TestClient(create_app(Settings(), models_dir=MODELS, target=None)) as tc:
        r = tc.post("/v1/recommend", json=body)
        assert r.status_code == 200, r.text
        warning = next(w for w in r.json()["warnings"] if "this deployment:" in w)
        assert "this deployment: TP=1 FLASHINFER unquantized speculative ngram k=3" in warning
        assert "FLASHINFER (trained: FLASH_ATTN)" in warning and "speculative ngram k=3 (trained:" in warning
        plain = tc.post("/v1/recommend", json={**body, "vllm_args": ["--model", "/m"]}).json()
        assert not any("this deployment:" in w for w in plain["warnings"])
        bad = tc.post("/v1/recommend", json={**body, "vllm_args": ["-tp", "x"]})
        assert bad.status_code == 422 and "tensor-parallel-size" in bad.text


@needs_bundled
def test_launch_passes_the_configuration_through_and_says_it_is_unprofiled(tmp_path: Path) -> None:
    import shlex

    runner = CliRunner()
    r = runner.invoke(app, ["launch", "--dry-run", "--models-dir", str(MODELS), "--state-dir", str(tmp_path),
                            "--vllm-version", "0.24.0",  # the model trained on the default configuration only
                            "--vllm-cmd", "vllm serve", *WORKLOAD, "--", "/m", "--tensor-parallel-size", "2",
                            "--max-num-seqs", "1024"])
    assert r.exit_code == 0, r.output
    argv = shlex.split(r.stdout.strip().splitlines()[-1])
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and "--max-num-seqs" in argv
    err = " ".join(r.stderr.split())
    assert "this deployment: TP=2" in err and "max_num_seqs=1024 (trained: max_num_seqs default)" in err
    r = runner.invoke(app, ["launch", "--dry-run", "--models-dir", str(MODELS), "--state-dir", str(tmp_path),
                            "--vllm-cmd", "vllm serve", "--", "/m", "-tp", "2"])  # static choice: card only
    assert r.exit_code == 0 and "this deployment: TP=2" in " ".join(r.stderr.split())


def test_every_real_h200_log_names_the_backend_vllm_resolved() -> None:
    logs = sorted(H200_LOGS.glob("*.log"))
    assert len(logs) == 15
    for log in logs:
        dep = DeploymentConfig.from_vllm_args([], startup=parse_startup_log(log.read_text(encoding="utf-8")))
        assert (dep.attention_backend, dep.attention_backend_source) == ("FLASH_ATTN", "log"), log.name
    older = StartupInfo(attention_backend="AttentionBackendEnum.FLASHINFER")
    assert DeploymentConfig.from_vllm_args([], startup=older).attention_backend == "FLASHINFER"


def test_active_parameters_tell_a_sparse_model_from_a_dense_one() -> None:
    moe, dense = shape_of_config(_cfg("qwen3-30b-a3b")), shape_of_config(_cfg("llama-3.1-8b"))
    small = shape_of_config(_cfg("llama-3.2-1b"))
    shapes = [{**s, **DeploymentConfig.from_vllm_args([], model_config=c).shape_fields()}
              for s, c in ((moe, _cfg("qwen3-30b-a3b")), (dense, _cfg("llama-3.1-8b")),
                           (small, _cfg("llama-3.2-1b")))]
    assert [s["num_active_params_b"] for s in shapes] == [moe["num_active_params_b"], dense["num_params_b"],
                                                           small["num_params_b"]]
    spec, _ = fit_spec([{"arrival_rate": r} for r in (1.0, 2.0, 3.0)], shapes)
    assert "num_active_params_b" in spec.names and "num_params_b" in spec.names


def test_models_listing_tells_configurations_apart() -> None:
    from graphmode.cli.recommend_cmd import _shape_label

    base = {"model_architecture": "LlamaForCausalLM", "num_params_b": 8.03}
    tp2 = {**base, **DeploymentConfig.from_vllm_args(["-tp", "2", "--quantization", "fp8"]).shape_fields()}
    assert _shape_label(base) == "LlamaForCausalLM 8.0B"
    assert _shape_label(tp2) == "LlamaForCausalLM 8.0B [tp=2+q=fp8]"


def test_hostile_args_are_refused_cleanly() -> None:
    for args in (["--speculative-config", "[" * 4000 + "]" * 4000], ["--max-num-seqs", "9" * 4000],
                 ["-tp", "1.5"], ["--max-model-len", "-4"]):
        with pytest.raises(DeploymentError):
            DeploymentConfig.from_vllm_args(args)
        DeploymentConfig.from_vllm_args(args, strict=False)


def test_api_servers_are_read_and_labelled_but_keep_the_shape_key() -> None:
    four = DeploymentConfig.from_vllm_args(["--max-num-seqs", "1024", "--api-server-count", "4"], model_config={})
    one = DeploymentConfig.from_vllm_args(["--max-num-seqs", "1024", "-asc", "1"], model_config={})
    assert (four.api_server_count, one.api_server_count) == (4, 1)
    # a deployment that adds API servers keeps its model's data: only race pools split by them
    assert shape_key({"model_config_hash": "abc", **four.shape_fields()}) == "abc+seqs=1024"
    assert shape_key({"model_config_hash": "abc", **one.shape_fields()}) == "abc+seqs=1024"
    assert describe(four.shape_fields()).endswith("max_num_seqs=1024 max_model_len of the model api_server_count=4")
    assert "api_server_count" not in describe(one.shape_fields())
    with pytest.raises(DeploymentError, match="--api-server-count"):
        DeploymentConfig.from_vllm_args(["--api-server-count", "four"], model_config={})


def test_races_with_one_and_with_four_api_servers_pool_apart() -> None:
    # Rows recorded before the column read it from the args they ran with. Pooled with the one-server race,
    # the three 1B races at 1024 streams read FULL_DECODE_ONLY "better" 0.915x on ITL (2026-12-03) though each
    # race alone was open: one API server at a full core and four measure different engines.
    from graphmode.selector.verdicts import race_decision, race_verdicts

    rows: dict[str, list[dict[str, object]]] = {}
    for name in ("1b-high-concurrency", "1b-high-concurrency-as4", "1b-saturated-as4"):
        with ProfileStore(MODELS / "profiles" / f"cfg-h200-vllm0.33-{name}.sqlite", readonly=True) as store:
            rows[name] = store.rows()
    servers = {name: {deployment_of_row(r).api_server_count for r in rs if r.get("race_arm")}
               for name, rs in rows.items()}
    assert servers == {"1b-high-concurrency": {None}, "1b-high-concurrency-as4": {4}, "1b-saturated-as4": {4}}
    verdicts = race_verdicts([r for rs in rows.values() for r in rs])
    fdo = [v for v in verdicts if v.workload is None and v.mode == "FULL_DECODE_ONLY" and v.metric == "itl_p50"]
    assert sorted((v.shape, v.api_servers or 1, v.verdict, v.rounds) for v in fdo) == [
        ("612a0e64ca2c+seqs=1024", 1, "undecided", 4), ("612a0e64ca2c+seqs=1024", 4, "undecided", 9)]
    assert "with 4 API servers" in next(v for v in fdo if v.api_servers).describe()
    order = ["FULL_DECODE_ONLY", "FULL", "FULL_AND_PIECEWISE", "PIECEWISE"]
    for count, picked in ((4, "the races with 4 API servers answer (the deployment's --api-server-count)"),
                          (None, "the races with one API server answer (the deployment's --api-server-count)"),
                          (2, "the races with 4 API servers answer (the nearest to the deployment's)")):
        ans = race_decision(verdicts, "612a0e64ca2c+seqs=1024", "itl_p50", {}, order, {}, weighted=False,
                            api_server_count=count)
        assert ans is not None and ans.mode == "FULL_AND_PIECEWISE", (count, ans)
        assert any(picked in n for n in ans.notes), (count, ans.notes)
