"""Every answer stands on evidence from its own region, or says that it does not: the same answers through the
CLI (``recommend``), the API (``POST /v1/recommend``) and ``launch --dry-run``, on the bundled vLLM 0.33 model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from graphmode.cli.main import app

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
SHAPES = MODELS / "shapes"
D = "FULL_AND_PIECEWISE"
BASE = ["--vllm-version", "0.33.0", "--objective", "ttft_p50"]
# (shape, workload flags, the answer, whether the note that the request is outside the races must be there)
CASES = [
    ("llama-3.2-1b", ["--rate", "1", "--concurrency", "1", "--input-tokens", "64", "--output-tokens", "128"], "FULL",
     False),
    ("llama-3.1-8b", ["--rate", "1", "--concurrency", "1", "--input-tokens", "64", "--output-tokens", "128"], "FULL",
     False),
    ("llama-3.1-8b", ["--rate", "4", "--input-tokens", "4000", "--output-tokens", "128"], D, True),
    ("llama-3.1-8b", ["--rate", "256", "--input-tokens", "128", "--output-tokens", "128"], D, True),
    # inside the races, but on prefill-heavy traffic, where the 8B's own rounds read FULL 1.15x: the pooled
    # "better" does not answer there
    ("llama-3.1-8b", ["--rate", "32", "--input-tokens", "1536", "--output-tokens", "64"], D, False),
]
INERT = ("initializer_range", "use_cache", "attention_dropout", "mlp_bias")


def _model_dir(tmp_path: Path, shape: str, *, inert: bool = False) -> Path:
    d = tmp_path / f"{shape}{'-inert' if inert else ''}"
    d.mkdir()
    if inert:
        cfg = {k: v for k, v in json.loads((SHAPES / f"{shape}.json").read_text()).items() if k not in INERT}
        cfg["transformers_version"] = "4.45.0"
        (d / "config.json").write_text(json.dumps(cfg))
    else:
        shutil.copy(SHAPES / f"{shape}.json", d / "config.json")
    return d


def _cli(model: Path, flags: list[str]) -> dict[str, Any]:
    r = CliRunner().invoke(app, ["recommend", "--models-dir", str(MODELS), "--gpu", "NVIDIA H200", *BASE,
                                 "--model-path", str(model), *flags, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def _outside(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in answer["findings"] if f["kind"] == "outside_region"]


@pytest.mark.parametrize(("shape", "flags", "mode", "outside"), CASES)
def test_cli(tmp_path: Path, shape: str, flags: list[str], mode: str, outside: bool) -> None:
    ans = _cli(_model_dir(tmp_path, shape), flags)
    assert ans["mode"] == mode
    notes = _outside(ans)
    assert bool(notes) == outside
    if outside:
        (note,) = notes
        assert "graphmode profile --race" in note["command"] and "workloads:" in note["command"]
        assert note["outside"] and all(o["factor"] > 1.5 for o in note["outside"])
        assert ans["race"]["basis"] == "outside" and not ans["gain_significant"]
        assert ans["confidence"]["level"] == "low"
    elif mode == "FULL":
        assert ans["race"]["basis"] == "better" and ans["gain_significant"]
    else:
        assert not ans["gain_significant"] and ans["gain_vs_default_pct"] == 0
        assert any("does not answer here" in f["text"] for f in ans["findings"] if f["kind"] == "race")


def test_the_named_dimension_and_how_far(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "llama-3.1-8b")
    long = _cli(model, CASES[2][1])
    (o,) = _outside(long)[0]["outside"]
    assert o["feature"] == "mean_input_tokens" and o["value"] == pytest.approx(4000) and o["factor"] > 2.5
    busy = _cli(model, CASES[3][1])
    assert "arrival_rate" in {o["feature"] for o in _outside(busy)[0]["outside"]}


@pytest.mark.parametrize("shape", ["llama-3.2-1b", "llama-3.1-8b"])
def test_inert_fields_give_the_same_answer_as_the_shape_file(tmp_path: Path, shape: str) -> None:
    flags = ["--rate", "40", "--concurrency", "200", "--input-tokens", "128", "--output-tokens", "128"]
    plain = _cli(_model_dir(tmp_path, shape), flags)
    inert = _cli(_model_dir(tmp_path, shape, inert=True), flags)
    assert inert["mode"] == plain["mode"] and inert["fingerprint_match"] == plain["fingerprint_match"] == "exact"
    assert inert["mode"] != "NONE" and inert["warnings"] == plain["warnings"]


def _workload(flags: list[str]) -> dict[str, Any]:
    names = {"--rate": "rate", "--concurrency": "concurrency", "--input-tokens": "input_tokens",
             "--output-tokens": "output_tokens"}
    return {names[k]: (int(v) if k == "--concurrency" else float(v)) for k, v in zip(flags[::2], flags[1::2],
                                                                                      strict=True)}


def test_api() -> None:
    from starlette.testclient import TestClient

    from graphmode.core.records import Fingerprint
    from graphmode.core.settings import Settings
    from graphmode.service.app import create_app

    with TestClient(create_app(Settings(), models_dir=MODELS, target=Fingerprint(gpu_name="NVIDIA H200"))) as tc:
        for shape, flags, mode, outside in CASES:
            body = {"workload": _workload(flags), "objective": {"metric": "ttft_p50"}, "vllm_version": "0.33.0",
                    "served_model_config": json.loads((SHAPES / f"{shape}.json").read_text())}
            r = tc.post("/v1/recommend", json=body)
            assert r.status_code == 200, r.text
            ans = r.json()
            assert ans["mode"] == mode, (shape, flags)
            assert bool(_outside(ans)) == outside


@pytest.mark.parametrize(("shape", "flags", "mode", "outside"), CASES)
def test_launch_dry_run(tmp_path: Path, shape: str, flags: list[str], mode: str, outside: bool) -> None:
    model = _model_dir(tmp_path, shape)
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--json", "--ignore-state", "--models-dir", str(MODELS),
                                 *BASE, *flags, "--", "--model", str(model)])
    assert r.exit_code == 0, r.output
    choice = json.loads(r.stdout.strip().splitlines()[-1])
    assert choice["mode"] == mode
    assert any("outside every raced region" in n for n in choice["notes"]) == outside


def _recommend(*args: str) -> Any:
    return CliRunner().invoke(app, ["recommend", "--models-dir", str(MODELS), *args])


def test_recommend_takes_the_vllm_args_after_a_double_dash_and_their_model(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "llama-3.1-8b")
    flags = ["--gpu", "NVIDIA H200", *BASE, *CASES[2][1], "--json"]
    tail = _recommend(*flags, "--", "--model", str(model), "--port", "8001")
    assert tail.exit_code == 0, tail.output
    one = _recommend(*flags, "--vllm-args", f"--model {model} --port 8001")
    assert one.exit_code == 0, one.output
    by_path = _recommend(*flags, "--model-path", str(model))
    for r in (tail, one):
        ans = json.loads(r.stdout)
        # the 8B of --model answers (the races' region ends at 1.5K-token prompts), not the registry's first shape
        assert ans["fingerprint_match"] == "exact" and _outside(ans)
        assert ans["mode"] == json.loads(by_path.stdout)["mode"] == D
    missing = _recommend(*flags, "--", "--model", "org/not-cached-anywhere")
    assert missing.exit_code != 0 and "--model org/not-cached-anywhere" in missing.output
    assert "Traceback" not in missing.output


def test_memory_objective_answers_or_says_which_model_can() -> None:
    r = _recommend("--gpu", "NVIDIA H200", "--vllm-version", "0.33.0", "--rate", "8", "--input-tokens", "256",
                   "--output-tokens", "128", "--objective", "memory")
    assert r.exit_code != 0 and "Traceback" not in r.output
    text = " ".join(r.output.split())
    assert "cannot answer for graph_gib" in text and "measured it in 0 cells" in text
    assert "graph_gib" not in text.split("Objectives it can answer:")[1].split(".")[0]
    ok = _recommend("--gpu", "NVIDIA H200", "--vllm-version", "0.24.0", "--rate", "8", "--input-tokens", "256",
                    "--output-tokens", "128", "--objective", "memory", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["objective"]["metric"] == "graph_gib"


def test_a_constraint_no_mode_meets_is_not_met(tmp_path: Path) -> None:
    r = _recommend("--gpu", "NVIDIA H200", "--vllm-version", "0.24.0", "--model-path",
                   str(_model_dir(tmp_path, "llama-3.1-8b")), "--rate", "8", "--input-tokens", "256",
                   "--output-tokens", "128", "--max-graph-gib", "0.1", "--json")
    assert r.exit_code == 0, r.output
    ans = json.loads(r.stdout)
    chosen = next(p for p in ans["predictions"] if p["mode"] == ans["mode"])
    assert (chosen["status"] == "ok") == ans["constraints_met"]
    if chosen["status"] == "violates":
        assert ans["confidence"]["level"] == "low"
        assert any(f["kind"] == "constraints" and "violates" in f["text"] for f in ans["findings"])


@pytest.mark.parametrize("flags", [CASES[1][1], ["--rate", "8", "--input-tokens", "256", "--output-tokens", "128"]])
def test_the_runner_up_is_never_the_choice(tmp_path: Path, flags: list[str]) -> None:
    ans = _cli(_model_dir(tmp_path, "llama-3.1-8b"), flags)
    assert ans["confidence"]["runner_up"] != ans["mode"]


@pytest.mark.parametrize("gpu", ["NVIDIA A100-SXM4-80GB"])
def test_another_gpu_lowers_confidence_and_says_how_to_profile_it(tmp_path: Path, gpu: str) -> None:
    r = CliRunner().invoke(app, ["recommend", "--models-dir", str(MODELS), "--gpu", gpu, *BASE, "--model-path",
                                 str(_model_dir(tmp_path, "llama-3.1-8b")), *CASES[1][1], "--json"])
    assert r.exit_code == 0, r.output
    ans = json.loads(r.stdout)
    assert ans["confidence"]["level"] == "low"
    (note,) = [f for f in ans["findings"] if f["kind"] == "other_gpu"]
    assert "NVIDIA H200" in note["text"] and "graphmode profile --race" in (note["command"] or "")


def test_an_h100_answers_from_the_h100_model_and_a_shape_it_never_raced_gets_the_default(tmp_path: Path) -> None:
    def ask(shape: str) -> dict[str, Any]:
        r = CliRunner().invoke(app, ["recommend", "--models-dir", str(MODELS), "--gpu", "NVIDIA H100 80GB HBM3",
                                     *BASE, "--model-path", str(_model_dir(tmp_path, shape)),
                                     *CASES[0][1], "--json"])
        assert r.exit_code == 0, r.output
        return dict(json.loads(r.stdout))

    small = ask("llama-3.2-1b")
    assert small["model_id"].startswith("nvidia-h100-80gb-hbm3-vllm0.33.0-")
    assert not [f for f in small["findings"] if f["kind"] == "other_gpu"]
    moe = ask("olmoe-1b-7b")  # raced on the H200 only: this GPU's model has no verdict for it
    assert moe["model_id"] == small["model_id"] and moe["mode"] == "FULL_AND_PIECEWISE"
    assert any("graphmode profile --race" in (f.get("command") or "") for f in moe["findings"])


def test_without_a_release_the_newest_answers_and_says_so(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["recommend", "--models-dir", str(MODELS), "--gpu", "NVIDIA H200", "--objective",
                                 "ttft_p50", "--model-path", str(_model_dir(tmp_path, "llama-3.1-8b")), *CASES[1][1],
                                 "--json"])
    assert r.exit_code == 0, r.output
    ans = json.loads(r.stdout)
    assert "vllm0.33.0" in ans["model_id"]
    assert [f for f in ans["findings"] if f["kind"] == "release_assumed" and "0.33.0" in f["text"]]


def test_a_shape_never_raced_gets_the_default_and_the_command(tmp_path: Path) -> None:
    d = tmp_path / "unraced"
    d.mkdir()
    cfg = dict(json.loads((SHAPES / "llama-3.1-8b.json").read_text()), num_key_value_heads=4)  # computes otherwise
    (d / "config.json").write_text(json.dumps(cfg))
    ans = _cli(d, CASES[1][1])
    assert ans["mode"] == D and ans["race"]["basis"] == "outside"
    (note,) = _outside(ans)
    assert "never raced on ttft_p50" in note["text"] and "graphmode profile --race" in note["command"]
    assert any("num_key_value_heads 4 vs 8" in w for w in ans["warnings"])


@pytest.mark.parametrize(("rate", "prompt"), [(256.0, 128.0), (8.0, 256.0), (4.0, 64.0), (32.0, 1536.0)])
def test_launchs_decision_table_never_contradicts_the_verdicts(rate: float, prompt: float) -> None:
    """The table training wrote is a cache of the answer: where the verdicts answer otherwise (outside every
    raced region, a pooled verdict the nearest workload contradicts) the full model decides, so launch gives
    the decision path's answer, the outside note included."""
    from graphmode.control.choose import ObjectiveSpec, choose_mode
    from graphmode.core.records import Fingerprint
    from graphmode.selector.decide import Request, decide
    from graphmode.selector.describe import WorkloadDescription
    from graphmode.selector.recommend import Recommender

    target = Fingerprint(gpu_name="NVIDIA H200", vllm_version="0.33.0")
    desc = WorkloadDescription(rate=rate, input_tokens=prompt, output_tokens=128)
    c = choose_mode(workload=desc, objective=ObjectiveSpec("ttft_p50"), models_dir=MODELS, target=target)
    full = decide(Recommender.load(MODELS, target=target), Request(inputs=desc, objective="ttft_p50"))
    assert c.mode.value == full.mode
    assert any("outside every raced region" in n for n in c.notes) == bool(_outside(full.model_dump()))


def test_a_remote_answers_cautions_reach_launch() -> None:
    from graphmode.control.choose import remote_cautions

    data = {"findings": [{"kind": "outside_region", "text": "outside every raced region: ..."},
                         {"kind": "noise", "text": "noise on this model shape"}, {"kind": "other_gpu"}, "junk"]}
    assert remote_cautions(data) == ["outside every raced region: ..."]
    assert remote_cautions({"warnings": []}) == [] and remote_cautions({"findings": "x"}) == []


def test_the_race_command_carries_a_grid_the_profiler_loads(tmp_path: Path) -> None:
    from graphmode.profiling.grid import load_grid

    ans = _cli(_model_dir(tmp_path, "llama-3.1-8b"), CASES[3][1])
    cmd = _outside(ans)[0]["command"]
    grid_text = cmd.split("echo '", 1)[1].split("' > region.yaml", 1)[0]
    (tmp_path / "region.yaml").write_text(grid_text)
    (w,) = load_grid(tmp_path / "region.yaml").workloads
    assert w.rate == pytest.approx(256) and "graphmode profile --race" in cmd and "--grid region.yaml" in cmd


def test_the_api_says_which_objectives_a_model_can_answer() -> None:
    from starlette.testclient import TestClient

    from graphmode.core.records import Fingerprint
    from graphmode.core.settings import Settings
    from graphmode.service.app import create_app

    body = {"workload": {"rate": 8, "input_tokens": 256, "output_tokens": 128}, "objective": {"metric": "memory"},
            "vllm_version": "0.33.0"}
    with TestClient(create_app(Settings(), models_dir=MODELS, target=Fingerprint(gpu_name="NVIDIA H200"))) as tc:
        r = tc.post("/v1/recommend", json=body)
        assert r.status_code == 422, r.text
        assert "cannot answer for graph_gib" in r.text and "measured it in 0 cells" in r.text
        ok = tc.post("/v1/recommend", json={**body, "vllm_version": "0.24.0"})
        assert ok.status_code == 200 and ok.json()["objective"]["metric"] == "graph_gib"


@pytest.mark.parametrize("flag", ["--features", "--step-sizes"])
def test_a_missing_at_file_is_a_clear_error(tmp_path: Path, flag: str) -> None:
    args = [flag, f"@{tmp_path / 'nonexistent.json'}"]
    if flag == "--step-sizes":
        args += ["--rate", "8", "--input-tokens", "256", "--output-tokens", "128"]
    r = _recommend(*args)
    assert r.exit_code != 0 and "Traceback" not in r.output and "FileNotFoundError" not in r.output
    assert "cannot read" in " ".join(r.output.split()) and flag in r.output


@pytest.mark.parametrize(("version", "kept"), [("0.33.0", "0.33.0"), ("\x1b[31m0.33\x1b]0;pwn\x07\x00", None),
                                              ("0.33.0\nwarning: fake", None)])
def test_a_servers_version_is_quoted_only_when_it_is_a_version(version: str, kept: str | None) -> None:
    from graphmode.selector.registry import server_fingerprint
    from tests.support.net import Request, serve_http

    def respond(req: Request) -> tuple[int, Any]:
        return (200, {"version": version}) if req.path == "/version" else (404, "")

    with serve_http(respond) as url:
        assert server_fingerprint(url).get("vllm_version") == kept


def test_the_api_matches_an_inert_variant_of_a_profiled_config() -> None:
    from starlette.testclient import TestClient

    from graphmode.core.records import Fingerprint
    from graphmode.core.settings import Settings
    from graphmode.service.app import create_app

    cfg = json.loads((SHAPES / "llama-3.2-1b.json").read_text())
    inert = {k: v for k, v in cfg.items() if k not in INERT} | {"transformers_version": "4.45.0"}
    body = {"workload": {"rate": 40, "input_tokens": 128, "output_tokens": 128, "concurrency": 200},
            "objective": {"metric": "ttft_p50"}, "vllm_version": "0.33.0"}
    with TestClient(create_app(Settings(), models_dir=MODELS, target=Fingerprint(gpu_name="NVIDIA H200"))) as tc:
        a = tc.post("/v1/recommend", json={**body, "served_model_config": cfg}).json()
        b = tc.post("/v1/recommend", json={**body, "served_model_config": inert}).json()
    assert a["mode"] == b["mode"] != "NONE" and a["race"] == b["race"] and a["warnings"] == b["warnings"]
