"""Aggregation, features, training, cross-validation, the model card and safe artifact loading.

Datasets here are written by ``tests.support.synthetic`` (SYNTHETIC rows, marked as such) unless
a test says it uses real captured rows; those skip until the fixture exists.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io as sio

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import DatasetError, ModelError
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import CellRecord, Fingerprint, LatencyStats, ObservedFeatures, StartupInfo
from graphmode.core.settings import DEFAULT_GRID
from graphmode.profiling.grid import load_grid
from graphmode.selector.aggregate import DEFAULT_NOISE_CV, build_training_set
from graphmode.selector.artifacts import TRUSTED_TYPES, load_artifact, save_artifact
from graphmode.selector.card import ARTIFACT_FILE, CARD_FILE, ModelCard
from graphmode.selector.featurize import fit_spec
from graphmode.selector.recommend import Recommender
from graphmode.selector.train import train
from tests.support.synthetic import SHAPE_05B, SHAPE_1B, SHAPE_8B, write_synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
CPU_FIXTURE = REPO / "tests" / "fixtures" / "profile-cpu.sqlite"
SMALL = [
    "chat-r2-b1",
    "chat-r32-b0.25",
    "decode-heavy-r8-b1",
    "decode-heavy-r32-b1",
    "prefill-heavy-r2-b1",
    "prefill-heavy-r32-b0.25",
]


def small_workloads(names: list[str] = SMALL) -> list[Any]:
    return load_grid(DEFAULT_GRID).select(names)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("sel")
    ds = write_synthetic_dataset(root / "ds.sqlite", workloads=small_workloads(), repeats=2)
    res = train(ds, models_dir=root / "models")
    return ds, res


def _rows(path: Path) -> list[dict[str, Any]]:
    with ProfileStore(path, readonly=True) as s:
        return s.rows(status="ok")


# ---------------------------------------------------------------- aggregation and features
def test_repeats_are_aggregated_with_their_spread(trained: tuple[Path, Any]) -> None:
    ds, _ = trained
    ts = build_training_set(_rows(ds))
    assert len(ts.units) == len(SMALL) and ts.modes == [m.value for m in CudaGraphMode]
    j = ts.metrics.index("itl_p50")
    assert (ts.count[:, :, j] == 2).all()
    assert np.isfinite(ts.std[:, :, j]).all()
    assert "median CV over" in ts.noise_source["itl_p50"]
    # NONE captures no graphs: its null graph memory is 0, not unknown
    k, i = ts.constants.index("graph_gib"), ts.modes.index("NONE")
    assert ts.const_mean[0, i, k] == 0.0
    sigma = ts.cell_sigma("itl_p50")
    assert (sigma > 0).all() and (sigma < ts.mean[:, :, j]).all()


def _record(
    mode: str,
    workload: str,
    repeat: int = 0,
    *,
    gpu: str | None = None,
    itl: float | None = 0.01,
    feats: dict[str, float] | None = None,
    startup: StartupInfo | None = None,
) -> CellRecord:
    f = (
        feats
        if feats is not None
        else {
            "arrival_rate": 2.0,
            "mean_input_tokens": 32.0,
            "mean_output_tokens": 16.0,
            "batch_mean": 1.0,
            "batch_cv": 0.5,
            "concurrency_mean": 1.0,
        }
    )
    return CellRecord(
        run_id=f"r-{mode}",
        profile_key="pk",
        mode=mode,
        workload=workload,
        workload_spec={"rate": 2},
        repeat=repeat,
        status="ok",
        started_at=0,
        finished_at=1,
        features=ObservedFeatures(**f),
        latency=LatencyStats(itl_p50=itl, ttft_p50=0.1),
        startup=startup or StartupInfo(),
        fingerprint=Fingerprint(gpu_name=gpu, vllm_version="0.1"),
    )


def test_nulls_everywhere_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "cpu-like.sqlite"
    with ProfileStore(path) as s:
        for w, rate in (("a", 1.0), ("b", 4.0), ("c", 9.0)):
            feats = {"arrival_rate": rate, "mean_input_tokens": 32.0, "mean_output_tokens": 16.0}
            s.append(_record("NONE", w, feats=feats, itl=0.01 * rate), "h")
        s.append(_record("NONE", "d", feats={}, itl=0.5), "h")  # no features at all: left out
    ts = build_training_set(_rows(path))
    assert [u.workload for u in ts.units] == ["a", "b", "c"]
    assert ts.modes == ["NONE"]
    assert "itl_p50" in ts.metrics and "e2e_p50" not in ts.metrics  # all-null metric: absent
    assert ts.constants == ["capture_s", "graph_gib"]  # NONE: 0 by definition; the rest unknown
    assert ts.noise_source["itl_p50"].startswith("assumed") and ts.noise_cv["itl_p50"] == DEFAULT_NOISE_CV
    spec, X = fit_spec([u.features for u in ts.units], [u.shape for u in ts.units])
    assert spec.dropped["batch_mean"] == "null in every training row"
    assert spec.dropped["mean_input_tokens"] == "constant across the training data"
    assert spec.names == ["arrival_rate", "prefill_decode_ratio"] or spec.names == ["arrival_rate"]
    assert X.shape == (3, len(spec.names))


def test_several_gpus_in_one_dataset_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "mixed.sqlite"
    with ProfileStore(path) as s:
        s.append(_record("NONE", "a", gpu="H200"), "h")
        s.append(_record("NONE", "a", gpu="A100"), "h")
    with pytest.raises(DatasetError, match="several GPUs"):
        build_training_set(_rows(path))
    rows = _rows(path)
    key = Fingerprint(gpu_name="H200", vllm_version="0.1").key()
    assert len(build_training_set(rows, fingerprint_key=key).units) == 1


def test_vectorize_imputes_and_reports() -> None:
    feats = [{"arrival_rate": r, "batch_cv": c} for r, c in ((1.0, 0.2), (4.0, 0.4), (16.0, None))]
    spec, _ = fit_spec(feats, [{}, {}, {}])
    assert spec.names == ["arrival_rate", "batch_cv"]
    x, filled = spec.vectorize({"arrival_rate": 8.0})
    assert filled == ["batch_cv"] and x[1] == pytest.approx(0.3)
    assert spec.out_of_range(spec.vectorize({"arrival_rate": 5000.0, "batch_cv": 0.3})[0]) == ["arrival_rate"]


def test_shape_features_only_with_several_shapes() -> None:
    feats = [{"arrival_rate": float(r)} for r in (1, 2, 3, 4)]
    one = [{"num_params_b": 1.2, "num_layers": 16, "hidden_size": 2048, "model_architecture": "Llama"}] * 4
    spec, _ = fit_spec(feats, one)
    assert not spec.uses_shape
    two = (
        one[:2]
        + [{"num_params_b": 8.0, "num_layers": 32, "hidden_size": 4096, "model_architecture": "Qwen2"}] * 2
    )
    spec2, _ = fit_spec(feats, two)
    assert spec2.uses_shape and "num_params_b" in spec2.names and "arch=Qwen2" in spec2.names


# ---------------------------------------------------------------- training, CV, card
def test_train_saves_artifact_card_cv_and_table_and_names_the_dataset(trained: tuple[Path, Any]) -> None:
    ds, res = trained
    out: Path = res.out_dir
    assert {p.name for p in out.iterdir()} == {"model.skops", "card.json", "cv.json", "table.json"}
    card = ModelCard.load(out)
    assert card.model_id == out.name and card.synthetic
    assert card.dataset.rows_used == len(_rows(ds)) == 6 * 5 * 2
    assert len(card.dataset.rows_sha256) == 64 and card.dataset.repeats_min == 2
    assert card.fingerprint_keys == [
        Fingerprint(
            gpu_name="SYNTHETIC-GPU", vllm_version="0.0.0+synthetic", model_config_hash="synth-1b-cfg"
        ).key()
    ]
    assert card.versions.scikit_learn and card.versions.skops and card.versions.numpy
    assert card.default_objective.metric == "itl_p50"
    assert {"ttft_p99", "e2e_p50", "output_tok_s"} <= {o.metric for o in card.evaluated_objectives}
    assert set(card.metrics) >= {
        "ttft_p50",
        "ttft_p99",
        "itl_p50",
        "itl_p99",
        "e2e_p50",
        "output_tok_s",
        "startup_s",
        "capture_s",
        "graph_gib",
        "kv_cache_tokens",
    }
    assert card.artifacts[ARTIFACT_FILE].trusted_types
    assert set(card.artifacts[ARTIFACT_FILE].trusted_types) <= set(TRUSTED_TYPES)
    assert json.loads((out / "cv.json").read_text())["folds"] == len(SMALL)
    [src] = card.dataset.sources
    assert not Path(src.path).is_absolute() and src.resolve(out) == ds.resolve()
    assert src.bytes == ds.stat().st_size and len(src.sha256) == 64


def test_a_changed_or_missing_dataset_is_refused(tmp_path: Path, trained: tuple[Path, Any]) -> None:
    _, res = trained
    [src] = res.card.dataset.sources
    moved = tmp_path / "models" / "m"
    moved.mkdir(parents=True)
    with pytest.raises(DatasetError, match="not readable"):
        src.resolve(moved)
    changed = src.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(DatasetError, match="changed since"):
        changed.resolve(res.out_dir)


def test_leave_one_workload_out_report(trained: tuple[Path, Any]) -> None:
    _, res = trained
    rep = res.report
    assert rep.folds == len(SMALL) and rep.skipped is None
    assert {c.kind for c in rep.regressor_candidates} == {"ridge", "knn", "extra_trees", "mean"}
    assert rep.chosen_regressor in rep.reason
    default = rep.summaries[0]
    assert default.objective == "min itl_p50" and default.n == len(SMALL)
    assert default.static_mode in [m.value for m in CudaGraphMode]
    rows = [w for w in rep.workloads if w.objective == "min itl_p50"]
    assert len(rows) == len(SMALL)
    for w in rows:
        assert w.regret_pct is not None and w.regret_pct >= 0
        assert w.oracle in w.ties
        assert w.correct == (w.chosen in w.ties)
    assert len(rep.summaries) == 4  # default + ttft_p99, e2e_p50, output_tok_s, from the same regressors


def test_forced_kinds_and_tiny_data(tmp_path: Path) -> None:
    ds = write_synthetic_dataset(
        tmp_path / "tiny.sqlite",
        workloads=small_workloads(SMALL[:2]),
        repeats=1,
        modes=[CudaGraphMode.NONE, CudaGraphMode.FULL_AND_PIECEWISE],
    )
    res = train(ds, tmp_path / "m", regressor="knn")
    assert res.report.chosen_regressor == "knn" and res.report.folds == 2
    assert any("only 2 workloads" in n for n in res.card.notes)
    assert res.card.metrics["itl_p50"].noise_source.startswith("assumed")
    one = write_synthetic_dataset(tmp_path / "one.sqlite", workloads=small_workloads(SMALL[:1]), repeats=1)
    res1 = train(one, tmp_path / "m1")
    assert res1.report.folds == 0 and res1.report.skipped
    rec = Recommender.from_dir(tmp_path / "m1")
    assert rec.recommend({"arrival_rate": 2.0}).mode in [m.value for m in CudaGraphMode]


def test_several_shapes_use_shape_features(tmp_path: Path) -> None:
    ds = write_synthetic_dataset(
        tmp_path / "shapes.sqlite",
        workloads=small_workloads(SMALL[:4]),
        repeats=1,
        shapes=(SHAPE_1B, SHAPE_8B, SHAPE_05B),
    )
    res = train(ds, tmp_path / "multi")
    card = res.card
    assert card.features.uses_shape and "num_params_b" in card.features.names
    assert len(card.shapes) == 3 and len(card.fingerprint_keys) == 3
    assert card.cv.shape_cv and "leave-one-shape-out" in card.cv.shape_cv[0].objective
    big = Fingerprint(
        model_architecture="LlamaForCausalLM",
        num_params_b=8.03,
        num_layers=32,
        hidden_size=4096,
        model_config_hash="synth-8b-cfg",
    )
    small = big.model_copy(
        update={
            "num_params_b": 1.24,
            "num_layers": 16,
            "hidden_size": 2048,
            "model_config_hash": "synth-1b-cfg",
        }
    )
    # On an 8B workload, the 8B shape's prediction is closer to what was measured than the 1B shape's.
    ts = res.training_set
    u = next(i for i, unit in enumerate(ts.units) if unit.shape.get("num_params_b") == 8.03)
    feats = ts.units[u].features
    measured = ts.mean[u, ts.modes.index("FULL"), ts.metrics.index("itl_p50")]
    itl_big = Recommender.from_dir(tmp_path / "multi", target=big).predict(feats)["FULL"]["itl_p50"]
    itl_small = Recommender.from_dir(tmp_path / "multi", target=small).predict(feats)["FULL"]["itl_p50"]
    assert itl_big is not None and itl_small is not None
    assert abs(np.log(itl_big / measured)) < abs(np.log(itl_small / measured))
    alien = Fingerprint(model_architecture="MixtralForCausalLM", num_params_b=47.0, model_config_hash="zzz")
    ans = Recommender.from_dir(tmp_path / "multi", target=alien).recommend(feats)
    assert any("unlike any" in w for w in ans.warnings) and ans.confidence.level == "low"


@pytest.mark.skipif(not CPU_FIXTURE.is_file(), reason="real CPU-vLLM profile fixture not captured yet")
def test_training_on_real_captured_cpu_rows(tmp_path: Path) -> None:
    """Real rows from a CPU vLLM (mode NONE only, GPU fields null): train, cross-validate, recommend."""
    res = train(CPU_FIXTURE, tmp_path / "cpu")
    assert res.card.modes == ["NONE"] and not res.card.synthetic
    assert res.card.dataset.rows_used > 0
    rec = Recommender.from_dir(tmp_path / "cpu")
    ans = rec.recommend({"arrival_rate": 3.0, "mean_input_tokens": 32.0, "mean_output_tokens": 32.0})
    assert ans.mode == "NONE" and [p.mode for p in ans.predictions] == ["NONE"]


# ---------------------------------------------------------------- artifacts: tampering, pickle, allow-list
def _copy_model(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_tampered_artifact_is_refused(trained: tuple[Path, Any], tmp_path: Path) -> None:
    folder = _copy_model(trained[1].out_dir, tmp_path / "m")
    data = bytearray((folder / ARTIFACT_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / ARTIFACT_FILE).write_bytes(bytes(data))
    with pytest.raises(ModelError, match="does not match its card"):
        Recommender.from_dir(folder)


def _refuse_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    import joblib

    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("pickle/joblib must never be used to load a model")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(joblib, "load", boom)


def test_pickled_artifact_is_refused_even_with_a_matching_hash(
    trained: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy_model(trained[1].out_dir, tmp_path / "m")
    payload = pickle.dumps({"regressor": None})
    (folder / ARTIFACT_FILE).write_bytes(payload)
    card = json.loads((folder / CARD_FILE).read_text())
    import hashlib

    card["artifacts"][ARTIFACT_FILE]["sha256"] = hashlib.sha256(payload).hexdigest()
    (folder / CARD_FILE).write_text(json.dumps(card))
    _refuse_unpickling(monkeypatch)
    with pytest.raises(ModelError, match="pickle"):
        Recommender.from_dir(folder)


class NotAllowed:
    def __init__(self) -> None:
        self.x = 1


def test_types_outside_the_allow_list_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelError, match="allow-list"):
        save_artifact({"a": NotAllowed()}, tmp_path / "x.skops")
    sio.dump({"a": NotAllowed()}, tmp_path / "y.skops")
    import hashlib

    from graphmode.selector.card import ArtifactInfo

    data = (tmp_path / "y.skops").read_bytes()
    info = ArtifactInfo(
        file="y.skops", sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), trusted_types=[]
    )
    _refuse_unpickling(monkeypatch)
    with pytest.raises(ModelError, match="allow-list"):
        load_artifact(tmp_path / "y.skops", info)


def test_bad_card_is_a_model_error(trained: tuple[Path, Any], tmp_path: Path) -> None:
    folder = _copy_model(trained[1].out_dir, tmp_path / "m")
    (folder / CARD_FILE).write_text("{}")
    with pytest.raises(ModelError, match="not valid"):
        Recommender.from_dir(folder)
    card = json.loads((trained[1].out_dir / CARD_FILE).read_text())
    card["schema_version"] = 99
    (folder / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(ModelError, match="schema"):
        Recommender.from_dir(folder)


def test_one_dataset_per_shape_trains_one_model(tmp_path: Path) -> None:
    """The campaign keeps one file per model shape; train merges their rows into one model and names both."""
    wls = small_workloads(SMALL[:4])
    a = write_synthetic_dataset(tmp_path / "a.sqlite", workloads=wls, repeats=1, shapes=(SHAPE_1B,))
    b = write_synthetic_dataset(tmp_path / "b.sqlite", workloads=wls, repeats=1, shapes=(SHAPE_05B,), seed=1)
    res = train([a, b], tmp_path / "both")
    assert len(res.card.shapes) == 2 and res.card.features.uses_shape
    assert res.training_set.n_rows == len(_rows(a)) + len(_rows(b))
    assert [s.resolve(res.out_dir) for s in res.card.dataset.sources] == [a.resolve(), b.resolve()]
    assert not list((tmp_path / "both").glob("*.sqlite"))
    with pytest.raises(DatasetError, match="twice"):
        train([a, tmp_path / "." / "a.sqlite"], tmp_path / "dup")
    with pytest.raises(DatasetError, match="no dataset"):
        train([], tmp_path / "none")
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(DatasetError):
        train([a, bad], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_the_assumed_shape_is_the_most_measured_under_vllms_defaults() -> None:
    """A question without a target shape takes the card's first shape (and launch's decision table is built
    for it): a default-configuration shape before one with a backend or speculative decoding asked for, then
    the one with the most workloads, whatever their keys sort as (an MoE's key sorted first on 0.33)."""
    from types import SimpleNamespace
    from typing import cast

    from graphmode.selector.aggregate import TrainingSet
    from graphmode.selector.train import primary_first

    shapes = {
        "a-moe": {"model_architecture": "OlmoeForCausalLM", "num_params_b": 6.9},
        "b-llama-triton": {"model_architecture": "LlamaForCausalLM", "num_params_b": 1.2,
                           "attention_backend": "TRITON_ATTN", "attention_backend_requested": True},
        "c-llama": {"model_architecture": "LlamaForCausalLM", "num_params_b": 1.2},
        "d-qwen": {"model_architecture": "Qwen2ForCausalLM", "num_params_b": 0.5},
    }
    for shape in shapes.values():
        shape["deployment_unknown"] = []  # every configuration element recorded
    per_shape = {"a-moe": 2, "b-llama-triton": 9, "c-llama": 5, "d-qwen": 5}
    units = [SimpleNamespace(shape_key=k) for k, n in per_shape.items() for _ in range(n)]
    ts = cast(TrainingSet, SimpleNamespace(shape_keys=sorted(shapes), shapes=shapes, units=units))
    assert primary_first(ts) == ["c-llama", "d-qwen", "a-moe", "b-llama-triton"]


def test_a_trained_card_lists_its_most_measured_shape_first(tmp_path: Path) -> None:
    ds = write_synthetic_dataset(tmp_path / "ds.sqlite", workloads=small_workloads(SMALL[:2]), repeats=1,
                                 shapes=(SHAPE_05B,))
    write_synthetic_dataset(ds, workloads=small_workloads(), repeats=1, shapes=(SHAPE_8B,), seed=1)
    res = train(ds, models_dir=tmp_path / "models")
    card = ModelCard.load(res.out_dir)
    assert [s["num_params_b"] for s in card.shapes] == pytest.approx([SHAPE_8B.num_params_b, SHAPE_05B.num_params_b],
                                                                     rel=0.01)
    rec = Recommender.from_dir(res.out_dir)
    assert rec._shape is not None and rec._shape["num_params_b"] == card.shapes[0]["num_params_b"]


def test_race_rows_alone_make_a_training_set_without_start_up_constants() -> None:
    # one configuration's race dataset (no lone start) once failed the report with pandas' "No objects to
    # concatenate": its start-up constants had no column to aggregate
    path = Path(__file__).resolve().parents[2] / "models" / "profiles" / "cfg-h200-vllm0.33-1b-saturated-as4.sqlite"
    with ProfileStore(path, readonly=True) as store:
        rows = [r for r in store.rows() if r["status"] == "ok"]
    ts = build_training_set(rows)
    assert len(ts.units) == 3 and ts.constants == [] and ts.const_mean.shape == (1, len(ts.modes), 0)
