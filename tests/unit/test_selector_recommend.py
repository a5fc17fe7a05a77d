"""Recommending: the in-process API, workload descriptions, live scraping, the registry and the CLI.

The model is trained on SYNTHETIC rows (tests.support.synthetic); the tests check behaviour, not
what vLLM does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.core.errors import ModelError, ObjectiveError, StaleModelError
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import Fingerprint, ObservedFeatures
from graphmode.core.settings import DEFAULT_GRID
from graphmode.profiling.grid import load_grid
from graphmode.profiling.metrics import parse_metrics
from graphmode.selector.describe import WorkloadDescription, describe_features
from graphmode.selector.objective import make_objective
from graphmode.selector.recommend import Recommendation, Recommender
from graphmode.selector.registry import list_models, match_card, model_card, select_model
from graphmode.selector.train import train
from tests.support.synthetic import SYNTHETIC_GPU, SYNTHETIC_VLLM, write_synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
NAMES = [
    "chat-r2-b1",
    "chat-r8-b0.25",
    "chat-r32-b0.25",
    "decode-heavy-r8-b1",
    "decode-heavy-r32-b1",
    "prefill-heavy-r2-b1",
    "prefill-heavy-r32-b0.25",
    "balanced-r8-b1",
]
MODES = [m.value for m in CudaGraphMode]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reg")
    ds = write_synthetic_dataset(
        root / "ds.sqlite", workloads=load_grid(DEFAULT_GRID).select(NAMES), repeats=2
    )
    train(ds, models_dir=root / "models")
    return root / "models"


@pytest.fixture(scope="module")
def rec(registry: Path) -> Recommender:
    return Recommender.load(registry)


def test_recommend_from_description(rec: Recommender) -> None:
    t0 = time.perf_counter()
    ans = rec.recommend(WorkloadDescription(rate=8, burstiness=0.5, input_tokens=512, output_tokens=128))
    wall_ms = (time.perf_counter() - t0) * 1e3
    assert isinstance(ans, Recommendation)
    assert ans.mode in MODES and ans.features_source == "description"
    assert json.loads(ans.compilation_config) == {"cudagraph_mode": ans.mode}
    assert ans.vllm_args == ["--compilation-config", ans.compilation_config]
    assert sorted(p.mode for p in ans.predictions) == sorted(MODES)
    assert ans.predictions[0].mode == ans.mode
    for p in ans.predictions:
        assert (
            p.metrics["itl_p50"]
            and p.metrics["ttft_p99"]
            and p.metrics["e2e_p50"]
            and p.metrics["output_tok_s"]
        )
        assert p.metrics["startup_s"] and p.metrics["graph_gib"] is not None
    assert ans.model_id == rec.model_id and ans.fingerprint_keys
    assert ans.synthetic_model and any("SYNTHETIC" in w for w in ans.warnings)
    assert ans.confidence.level == "low"  # synthetic model, always
    if ans.mode == ans.default_mode:
        assert ans.gain_vs_default_pct == 0.0 and not ans.gain_significant
    # the answer times itself (its speed is bench/recommend_latency.py's business, not a test's)
    assert ans.elapsed_ms is not None and 0 < ans.elapsed_ms <= wall_ms


def test_new_objectives_need_no_retraining(rec: Recommender) -> None:
    feats = ObservedFeatures(
        arrival_rate=30,
        mean_input_tokens=64,
        mean_output_tokens=512,
        batch_mean=60,
        batch_cv=0.2,
        concurrency_mean=60,
        prefill_decode_ratio=0.125,
    )
    for objective in ("itl_p50", "ttft_p99", "throughput", "e2e_p99"):
        ans = rec.recommend(feats, objective)
        assert ans.objective.metric in ("itl_p50", "ttft_p99", "output_tok_s", "e2e_p99")
        assert ans.predicted_value is not None
    tight = rec.recommend(feats, make_objective("itl_p50", ["ttft_p99<=1us"]))
    assert not tight.constraints_met and all(p.status == "violates" for p in tight.predictions)
    no_graphs = rec.recommend(feats, make_objective("itl_p50", max_graph_gib=0.01))
    assert no_graphs.mode == "NONE" and no_graphs.constraints_met
    with pytest.raises(ObjectiveError):
        rec.recommend(feats, "goodput_p42")


def test_out_of_distribution_input_is_flagged(rec: Recommender) -> None:
    ans = rec.recommend({"arrival_rate": 5000.0, "mean_input_tokens": 20000.0})
    assert not ans.confidence.in_distribution and ans.confidence.level == "low"
    assert "arrival_rate" in ans.confidence.out_of_range
    assert set(ans.confidence.imputed) >= {"batch_mean", "concurrency_mean"}
    assert any("outside what was profiled" in w for w in ans.warnings)


def test_describe_follows_littles_law() -> None:
    desc = WorkloadDescription(rate=10, burstiness=0.25, input_tokens=100, output_tokens=50)
    f = describe_features(desc, lambda _feats: 2.0)
    assert f.batch_mean == pytest.approx(20.0, rel=1e-3)
    assert f.batch_var == pytest.approx(80.0, rel=1e-3)  # L / burstiness
    assert f.prefill_decode_ratio == 2.0 and f.arrival_rate == 10
    capped = describe_features(desc.model_copy(update={"concurrency": 4}), lambda _feats: 2.0)
    assert capped.batch_mean == pytest.approx(4.0) and capped.arrival_rate == pytest.approx(2.0, rel=1e-3)
    assert describe_features(desc).batch_mean == pytest.approx(10 * 0.02 * 50)  # no model: a stated guess


def test_description_lands_near_the_observed_features(rec: Recommender) -> None:
    checks = {d.feature: d for d in rec.card.describe}
    assert {"arrival_rate", "batch_mean", "concurrency_mean", "mean_input_tokens"} <= set(checks)
    assert checks["mean_input_tokens"].median_abs_log_err_raw is not None
    assert checks["mean_input_tokens"].median_abs_log_err_raw < 0.05
    bm = checks["batch_mean"]
    assert bm.median_abs_log_err_calibrated is not None and bm.median_abs_log_err_raw is not None
    assert bm.median_abs_log_err_calibrated <= bm.median_abs_log_err_raw + 1e-9


def test_live_server_features(monkeypatch: pytest.MonkeyPatch, rec: Recommender) -> None:
    import graphmode.selector.live as live

    texts = [
        (REPO / "tests/fixtures/vllm-0.32-cpu" / n).read_text()
        for n in ("metrics-idle.txt", "metrics-after-load.txt")
    ]
    clock = iter(float(t) for t in range(100))
    calls: list[str] = []

    def fake_scrape(url: str, timeout: float = 5.0, *, clock: Any = None) -> Any:
        calls.append(url)
        return parse_metrics(texts[min(len(calls) - 1, 1)], float(len(calls)))

    monkeypatch.setattr(live, "scrape_sync", fake_scrape)
    feats = live.observe_server(
        "localhost:8000", window_s=3, interval_s=1, sleep=lambda _s: None, clock=lambda: next(clock)
    )
    assert calls[0] == "http://localhost:8000/metrics" and len(calls) >= 2
    assert feats.n_samples is not None and feats.n_samples >= 2
    ans = rec.recommend(feats, source="server")
    assert ans.features_source == "server"


# ---------------------------------------------------------------- registry
def test_registry_matching_and_staleness(registry: Path) -> None:
    entries = list_models(registry)
    assert len(entries) == 1 and entries[0].card is not None
    card = entries[0].card
    assert model_card(card.model_id, registry).model_id == card.model_id
    exact = Fingerprint(gpu_name=SYNTHETIC_GPU, vllm_version=SYNTHETIC_VLLM, model_config_hash="synth-1b-cfg")
    assert match_card(card, exact).kind == "exact" and not match_card(card, exact).stale
    assert match_card(card, Fingerprint(gpu_name=SYNTHETIC_GPU)).kind == "compatible"
    assert match_card(card, None).kind == "unspecified"
    other = exact.model_copy(update={"gpu_name": "NVIDIA H100", "vllm_version": "0.9.0"})
    m = match_card(card, other)
    assert m.kind == "nearest" and m.stale and any("H100" in d for d in m.differences)
    assert any("nearest" in w for w in m.warnings)
    driver = exact.model_copy(update={"driver_version": "999.1"})
    assert match_card(card, driver).stale  # a driver change makes it stale but still the same model
    with pytest.raises(StaleModelError):
        Recommender.load(registry, target=other, strict=True)
    rec = Recommender.load(registry, target=other)
    assert rec.recommend({"arrival_rate": 2.0}).fingerprint_match == "nearest"
    with pytest.raises(ModelError, match="no model"):
        select_model(registry, "does-not-exist")
    with pytest.raises(ModelError, match="invalid model id"):
        select_model(registry, "../etc")


def test_broken_and_missing_registries(tmp_path: Path, registry: Path) -> None:
    with pytest.raises(ModelError, match="no trained model"):
        Recommender.load(tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "card.json").write_text("not json")
    (tmp_path / "notes").mkdir()  # a folder without a card is not a model
    entries = list_models(tmp_path)
    assert [e.model_id for e in entries] == ["broken"] and entries[0].error
    with pytest.raises(ModelError, match="broken"):
        Recommender.load(tmp_path)


# ---------------------------------------------------------------- CLI
def test_cli_train_recommend_models(tmp_path: Path) -> None:
    runner = CliRunner()
    ds = write_synthetic_dataset(
        tmp_path / "ds.sqlite", workloads=load_grid(DEFAULT_GRID).select(NAMES[:4]), repeats=1
    )
    r = runner.invoke(app, ["train", "--dataset", str(ds), "--models-dir", str(tmp_path / "models")])
    assert r.exit_code == 0, r.output
    assert "leave-one-workload-out" in r.output and "SYNTHETIC" in r.output
    base = ["recommend", "--models-dir", str(tmp_path / "models")]
    r = runner.invoke(
        app,
        [
            *base,
            "--rate",
            "8",
            "--burstiness",
            "0.5",
            "--input-tokens",
            "512",
            "--output-tokens",
            "128",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["mode"] in MODES and len(out["predictions"]) == 5
    r = runner.invoke(
        app,
        [
            *base,
            "--features",
            json.dumps({"arrival_rate": 8, "batch_mean": 3}),
            "--objective",
            "ttft_p99",
            "--constraint",
            "ttft_p99<=200ms",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "--compilation-config" in r.output and "confidence" in r.output
    r = runner.invoke(app, [*base, "--features", '{"nope": 1}'])
    assert r.exit_code == 2 and "nope" in r.output
    r = runner.invoke(app, [*base, "--rate", "8"])
    assert r.exit_code == 2
    r = runner.invoke(app, [*base, "--features", "{}"])  # no traffic feature: the service's rule too
    assert r.exit_code == 2 and "at least one traffic feature" in r.output
    r = runner.invoke(app, [*base, "--features", '{"arrival_rate": 8}', "--constraint", "ttft<=fast"])
    assert r.exit_code == 1
    r = runner.invoke(app, ["models", "--models-dir", str(tmp_path / "models")])
    assert r.exit_code == 0 and "synthetic" in r.output


def test_model_path_is_read_or_refused_never_ignored(tmp_path: Path) -> None:
    # --model-path names the model a deployment serves: a path that gives no config is an error (exit 2),
    # not a silent fall-back to "no target shape given"
    root = Path(__file__).resolve().parents[2] / "models"
    base = ["recommend", "--models-dir", str(root), "--rate", "8", "--input-tokens", "512", "--output-tokens",
            "128", "--json", "--model-path"]
    runner = CliRunner()
    r = runner.invoke(app, [*base, str(root / "shapes" / "qwen2.5-0.5b.json")])  # the config file itself
    assert r.exit_code == 0, r.output
    assert not any("no target shape" in w for w in json.loads(r.stdout)["warnings"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "list.json").write_text("[1, 2]")
    for path, needle in ((tmp_path / "missing", "no such file"), (tmp_path / "empty", "no config.json"),
                         (tmp_path / "list.json", "not a JSON object")):
        r = runner.invoke(app, [*base, str(path)])
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), r.output  # the console wraps lines


def test_one_recommender_answers_for_each_served_model() -> None:
    # A service loads one multi-shape model and answers for whichever model a request's deployment serves.
    root = Path(__file__).resolve().parents[2] / "models"
    rec = Recommender.load(root, "nvidia-h200-vllm0.24.0-ab3c7947c90d")  # the release that measured graph memory
    desc = {"rate": 8, "input_tokens": 512, "output_tokens": 128}
    plain = rec.recommend(desc, "ttft_p50")
    assert any("no target shape was given" in w for w in plain.warnings)
    qwen_cfg = json.loads((root / "shapes" / "qwen2.5-0.5b.json").read_text())
    from graphmode.core.fingerprint import shape_of_config

    qwen = rec.for_shape(shape_of_config(qwen_cfg))
    assert rec.for_shape(shape_of_config(qwen_cfg)) is qwen  # cached per shape
    ans = qwen.recommend(desc, "ttft_p50")
    assert not any("target shape" in w or "unlike" in w for w in ans.warnings)
    graph = {p.mode: p.metrics.get("graph_gib") for p in ans.predictions}
    plain_graph = {p.mode: p.metrics.get("graph_gib") for p in plain.predictions}
    assert graph["FULL"] != plain_graph["FULL"]  # the Qwen shape's own constants, not the 1B's
    assert rec.recommend(desc, "ttft_p50").warnings == plain.warnings  # the original is untouched
    mixtral = rec.for_shape({"model_architecture": "MixtralForCausalLM", "num_params_b": 46.7, "num_layers": 32,
                             "hidden_size": 4096})
    assert any("unlike any this model was trained on" in w for w in mixtral.recommend(desc).warnings)


def test_models_listing_tells_two_shapes_of_one_architecture_apart() -> None:
    # The bundled model holds Llama 1B and 8B: the listing must not say "LlamaForCausalLM" twice.
    root = Path(__file__).resolve().parents[2] / "models"
    r = CliRunner().invoke(app, ["models", "--models-dir", str(root)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "LlamaForCausalLM 1.2B" in r.output and "LlamaForCausalLM 8.0B" in r.output
    assert "Qwen2ForCausalLM 0.5B" in r.output
