"""The whole graph configuration: downgrade rules and their log lines, launch merge, capture restarts, the
recommendation's capture block through the CLI and the service schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.control.choose import capture_keys, choose_mode, merge_graph_config
from graphmode.control.policy import Advice, Policy, PolicyConfig, PolicyState, capture_gain, evaluate_capture
from graphmode.core.errors import ConfigError
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import StartupInfo
from graphmode.profiling.logparse import parse_startup_log
from graphmode.selector.compat import Deployment, allowed_modes, deployment_of, resolve, safe_mode
from graphmode.selector.describe import WorkloadDescription
from graphmode.service.schemas import RecommendRequest
from graphmode.vllm_args import compilation_config_of, user_capture_sizes, with_compilation_config

ROOT = Path(__file__).resolve().parents[2]


def _parse_file(path: Path) -> StartupInfo:
    return parse_startup_log(path.read_bytes().decode("utf-8", errors="replace"))

FIXTURES = ROOT / "tests" / "fixtures"
LINES = (FIXTURES / "vllm-downgrades" / "lines.log").read_text().splitlines()
MODELS = ROOT / "models"


# ------------------------------------------------------------------------------------------ log parsing
def test_real_downgrade_lines_are_recorded_with_the_mode_vllm_ran() -> None:
    spec, pooling, blackwell, eager = LINES
    st = parse_startup_log(spec, requested_mode="FULL_AND_PIECEWISE")
    assert st.effective_mode == "PIECEWISE"
    assert st.downgrades == [spec.split("] ", 1)[1]]
    assert parse_startup_log(pooling, requested_mode="FULL").effective_mode == "PIECEWISE"
    assert parse_startup_log(blackwell, requested_mode="FULL").downgrades[0].startswith("NVIDIA Blackwell TRTLLM")
    off = parse_startup_log(eager, requested_mode="FULL")
    assert off.effective_mode == "NONE" and off.downgrades == []  # eager is asked for, not a downgrade


def test_trimmed_sizes_line_from_vllms_format_string() -> None:
    # No real log with this line yet: built from vllm/config/vllm.py's format string.
    line = ("(EngineCore pid=1) WARNING 12-01 10:00:00 [vllm.py:1200] cudagraph_capture_sizes specified in "
            "compilation_config [1, 2, 4, 1024] is overridden by config [1, 2, 4]")
    st = parse_startup_log(line + "\n" + LINES[0])
    assert st.downgrades[0].startswith("cudagraph_capture_sizes specified") and len(st.downgrades) == 2


def test_h200_logs_have_sizes_graph_counts_and_no_downgrade() -> None:
    full = _parse_file(FIXTURES / "vllm-0.24-h200" / "qwen0.5b-FULL_AND_PIECEWISE.log")
    assert full.graph_counts == {"mixed prefill-decode, PIECEWISE": 51, "decode, FULL": 51}
    assert full.capture_sizes is not None and len(full.capture_sizes) == 51 and full.max_capture_size == 512
    for log in (FIXTURES / "vllm-0.24-h200").glob("*.log"):
        st = _parse_file(log)
        assert st.downgrades == [] and st.effective_mode == log.stem.split("-", 1)[1]
    none = _parse_file(FIXTURES / "vllm-0.24-h200" / "llama1b-NONE.log")
    assert none.capture_sizes == [] and none.graph_counts == {}


# ------------------------------------------------------------------------------------------ compat rules
def test_rules_follow_vllms_checks() -> None:
    assert resolve("FULL", Deployment(attention_backend="FLASHINFER"))[0] == "FULL_AND_PIECEWISE"
    assert resolve("FULL_AND_PIECEWISE", Deployment(attention_backend="FLASHINFER", speculative=True))[0] == \
        "PIECEWISE"
    assert resolve("FULL_AND_PIECEWISE", Deployment(attention_backend="FLASH_ATTN", speculative=True))[0] == \
        "FULL_AND_PIECEWISE"
    assert resolve("FULL", Deployment(pooling=True))[0] == "PIECEWISE"
    assert resolve("FULL_AND_PIECEWISE", Deployment(encoder_decoder=True))[0] == "FULL_DECODE_ONLY"
    # ngram runs every mode as asked on a backend with full graphs (vLLM 0.33 on the H200, the fixture below)
    for mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        assert resolve(mode, Deployment(speculative=True, speculative_method="ngram")) == (mode, [])
    assert resolve("FULL", Deployment(attention_backend="FLASHINFER", speculative=True,
                                      speculative_method="ngram"))[0] == "PIECEWISE"
    runs, why = resolve("FULL", Deployment(speculative=True, speculative_method="ngram", dynamic_speculative=True))
    assert runs == "PIECEWISE" and "dynamic speculative decoding" in why[0]
    assert resolve("FULL_DECODE_ONLY", Deployment(attention_backend="TRITON_MLA"))[0] == "PIECEWISE"
    assert resolve("NONE", Deployment(pooling=True)) == ("NONE", [])
    assert resolve("FULL", Deployment(attention_backend="SOMETHING_NEW")) == ("FULL", [])  # no rule: no guess
    allowed = allowed_modes(Deployment(attention_backend="FLASHINFER"))
    assert allowed["FULL"] and "FlashInfer".upper() in allowed["FULL"] and allowed["FULL_AND_PIECEWISE"] is None
    mode, why = safe_mode("FULL", Deployment(attention_backend="FLASHINFER"))
    assert mode == "FULL_AND_PIECEWISE" and why and "not recommended" in why


def test_deployment_read_from_args_env_and_config() -> None:
    dep = deployment_of(["--model", "m", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}'],
                        env={"VLLM_ATTENTION_BACKEND": "flashinfer"})
    assert dep.attention_backend == "FLASHINFER" and dep.speculative and dep.speculative_method == "eagle"
    dynamic = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5, '
               '"num_speculative_tokens_per_batch_size": [[1, 8, 5], [9, 256, 2]]}']
    assert deployment_of(dynamic, env={}).dynamic_speculative
    assert not deployment_of(dynamic, env={"VLLM_USE_V2_MODEL_RUNNER": "1"}).dynamic_speculative
    assert not deployment_of(["--speculative-config", '{"method": "ngram"}'], env={}).dynamic_speculative
    assert deployment_of(["--runner", "pooling"], env={}).pooling
    assert deployment_of(["--task=embed"], env={}).pooling
    assert deployment_of([], {"is_encoder_decoder": True}, env={}).encoder_decoder
    assert deployment_of(["--attention-backend", "TRITON_ATTN"], env={"VLLM_ATTENTION_BACKEND": "X"}) \
        .attention_backend == "TRITON_ATTN"


# ------------------------------------------------------------------------------------------ launch merge
def test_launch_merges_mode_and_sizes_keeping_user_keys() -> None:
    args = ["--model", "m", "--compilation-config", '{"max_cudagraph_capture_size": 64, "backend": "inductor"}']
    capture = {"cudagraph_capture_sizes": [1, 8, 24], "max_cudagraph_capture_size": 24}
    plan = merge_graph_config(args, CudaGraphMode.FULL, capture, force=False)
    cc = compilation_config_of(plan.args)
    assert cc == {"backend": "inductor", "cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 8, 24],
                  "max_cudagraph_capture_size": 24}
    assert plan.args.count("--compilation-config") == 1 and "3 sizes" in plan.message
    mine = ["--compilation-config", '{"cudagraph_capture_sizes": [2, 4]}']
    kept = merge_graph_config(mine, CudaGraphMode.FULL, capture, force=False)
    assert compilation_config_of(kept.args)["cudagraph_capture_sizes"] == [2, 4]
    assert "keeping the user's cudagraph_capture_sizes" in kept.message
    forced = merge_graph_config(mine, CudaGraphMode.FULL, capture, force=True)
    assert compilation_config_of(forced.args)["cudagraph_capture_sizes"] == [1, 8, 24]
    off = merge_graph_config(args, CudaGraphMode.NONE, capture, force=False)
    assert "cudagraph_capture_sizes" not in compilation_config_of(off.args)
    # Sizes without a max drop the user's max: vLLM refuses the two when they disagree.
    only = with_compilation_config(args, {"cudagraph_capture_sizes": [4]})
    assert "max_cudagraph_capture_size" not in compilation_config_of(only)
    with pytest.raises(ConfigError):
        user_capture_sizes(["--compilation-config", '{"cudagraph_capture_sizes": [0, "x"]}'])


def test_remote_capture_block_reaches_launch() -> None:
    seen: list[dict[str, object]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        return httpx.Response(200, json={"mode": "FULL", "model_id": "r",
                                         "capture": {"sizes": [1, 16], "max_capture_size": 16}})

    c = choose_mode(workload=WorkloadDescription(rate=2, input_tokens=64, output_tokens=64),
                    selector_url="http://svc", models_dir=None, transport=httpx.MockTransport(handler),
                    vllm_args=["--attention-backend", "FLASHINFER"], step_sizes={"le": [1.0], "steps": [3.0, 0.0]})
    assert c.capture == {"cudagraph_capture_sizes": [1, 16], "max_cudagraph_capture_size": 16}
    assert seen[0]["vllm_args"] == ["--attention-backend", "FLASHINFER"] and "step_sizes" in seen[0]
    assert capture_keys({"sizes": ["x"]}) is None and capture_keys(None) is None


# ------------------------------------------------------------------------------------------ watch policy
def test_capture_change_is_a_restart_weighed_like_a_mode_switch() -> None:
    clock = [10_000.0]
    policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, min_gain=0.05, horizon_s=1800), clock=lambda: clock[0])
    advice = Advice(best="FULL_AND_PIECEWISE", scores={"NONE": 0.010, "FULL_AND_PIECEWISE": 0.005})
    gain, how = capture_gain(0.2, 1.0, advice, "FULL_AND_PIECEWISE")
    assert gain == pytest.approx(0.8 * 1.0) and "penalty" in how
    d = evaluate_capture(policy, PolicyState(), [1, 2, 512], [1, 2, 700], gain, startup_s=60.0, rate=10.0, how=how)
    assert d.switch and d.numbers["benefit"] > d.numbers["cost"]
    # Memory-only change: no latency gain, no restart.
    gain0, _ = capture_gain(1.0, 1.0, advice, "FULL_AND_PIECEWISE")
    assert not evaluate_capture(policy, PolicyState(), [1, 2, 512], [1, 2], gain0, startup_s=60, rate=10).switch
    assert evaluate_capture(policy, PolicyState(), [1, 2], [2, 1], 1.0, startup_s=60, rate=10).action == "stay"
    # A short horizon does not pay for a long restart.
    short = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, horizon_s=10), clock=lambda: clock[0])
    assert evaluate_capture(short, PolicyState(), [1], [1, 700], 0.5, startup_s=600, rate=10).action == "stay"
    assert capture_gain(None, 1.0, advice, "FULL")[0] is None


def test_watch_prices_padding_a_list_with_gaps_pays_for_a_restart() -> None:
    from graphmode.control.policy import capture_decision
    from graphmode.core.records import StepSizes
    from graphmode.selector.capture_steps import PAD_TOKEN_COST, list_stats, step_distribution

    # The H200 8B's 2 req/s list, now serving 48 in flight: every step graphed, each padded 48 -> 256
    # (ITL 1.47x measured, 2026-12-04). Only padding separates it from the recommended list.
    steps = StepSizes(le=[1.0, 8.0, 16.0, 32.0, 64.0], steps=[0.0, 0.0, 0.0, 0.0, 600.0, 0.0], running={48: 60})
    gappy = [1, 3, 4, 6, 256, 384, 512]
    stats = list_stats(gappy, step_distribution(steps, 8192), None, "FULL_AND_PIECEWISE")
    assert stats.graphed_share == 1.0
    assert stats.padding_cost == pytest.approx(PAD_TOKEN_COST * 208 / (1 + PAD_TOKEN_COST * 48), rel=1e-3)
    gain, how = capture_gain(1.0, 1.0, None, "FULL_AND_PIECEWISE", stats.padding_cost, 0.0)
    assert gain == pytest.approx(stats.padding_cost) and "padding" in how  # no advice needed: no step changes side
    clock = [10_000.0]
    policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, min_gain=0.05, horizon_s=1800), clock=lambda: clock[0])
    args = ["--model", "m", "--compilation-config", json.dumps({"cudagraph_capture_sizes": gappy})]
    d, new_args = capture_decision(policy, PolicyState(), "FULL_AND_PIECEWISE", args, steps, None, rate=10.0,
                                   startup_s=70.0)
    assert d.switch and new_args is not None, d.reason
    assert 0.2 < d.numbers["gain"] < 0.26 and "padding" in d.reason
    sizes = json.loads(new_args[new_args.index("--compilation-config") + 1])["cudagraph_capture_sizes"]
    assert 48 in sizes or min(s for s in sizes if s >= 48) <= 56
    # Restarted on that list, the same traffic asks for nothing more.
    again, _ = capture_decision(policy, PolicyState(), "FULL_AND_PIECEWISE", new_args, steps, None, rate=10.0,
                                startup_s=70.0)
    assert not again.switch


# ------------------------------------------------------------------------------------------ answer surfaces
STEPS = json.dumps({"le": [1.0, 8.0, 16.0, 32.0], "steps": [0.0, 400.0, 100.0, 0.0, 0.0],
                    "running": {"4": 30, "12": 10}})


def test_cli_json_carries_the_capture_block_and_the_downgrade_reason() -> None:
    r = CliRunner().invoke(app, ["recommend", "--rate", "2", "--input-tokens", "64", "--output-tokens", "256",
                                 "--models-dir", str(MODELS), "--gpu", "NVIDIA H200", "--vllm-version", "0.24.0",
                                 "--objective", "ttft_p50", "--step-sizes", STEPS,
                                 "--vllm-args", "--attention-backend FLASHINFER", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    cap = data["capture"]
    # 100 of 500 steps pad 12 → 16: 0.8 tokens per step, within the 1-token tolerance of [4, 12, 16]; 1, 2, 8 are
    # kept by default (small batches replay a graph whatever the load), 4 the window chose itself.
    assert cap["sizes"] == [1, 2, 4, 8, 16] and cap["default"]["sizes"][-1] == 512
    assert any(n.startswith("kept 1, 2, 8 so that") for n in cap["notes"])
    assert cap["chosen"]["graphed_share"] == 1.0 and cap["excluded_modes"]["FULL"]
    assert data["mode"] != "FULL"
    cc = json.loads(data["compilation_config"])
    assert cc["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16] and cc["cudagraph_mode"] == data["mode"]
    base = ["recommend", "--rate", "2", "--input-tokens", "64", "--output-tokens", "256", "--models-dir", str(MODELS),
            "--gpu", "NVIDIA H200", "--vllm-version", "0.24.0", "--step-sizes", STEPS, "--json"]
    alone = CliRunner().invoke(app, [*base, "--capture-keep", "none"])
    # (12: with nothing kept, the padding bound lets a step of 5 pad to 12 at most, not 16)
    assert alone.exit_code == 0 and json.loads(alone.stdout)["capture"]["sizes"] == [4, 12, 16]
    one = CliRunner().invoke(app, [*base, "--capture-keep", "1"])
    assert one.exit_code == 0 and json.loads(one.stdout)["capture"]["sizes"] == [1, 4, 12, 16]
    unbounded = CliRunner().invoke(app, [*base, "--capture-keep", "none", "--capture-max-pad-ratio", "0"])
    assert unbounded.exit_code == 0 and json.loads(unbounded.stdout)["capture"]["sizes"] == [4, 16]
    wrong = CliRunner().invoke(app, [*base, "--capture-keep", "1,zero"])
    assert wrong.exit_code != 0 and "--capture-keep" in wrong.output and "Traceback" not in wrong.output
    for ratio in ("1", "0.5", "-3"):
        bad_ratio = CliRunner().invoke(app, [*base, "--capture-max-pad-ratio", ratio])
        assert bad_ratio.exit_code != 0 and "--capture-max-pad-ratio" in bad_ratio.output, ratio
        assert "Traceback" not in bad_ratio.output
    # Up to 16 the padding bound (1.25x or 8 tokens) holds for [1, 2, 4, 8, 16] already: the same list either way.
    for ratio in ("0", "2"):
        same = CliRunner().invoke(app, [*base, "--capture-max-pad-ratio", ratio])
        assert same.exit_code == 0 and json.loads(same.stdout)["capture"]["sizes"] == [1, 2, 4, 8, 16], same.output
    table = CliRunner().invoke(app, ["recommend", "--rate", "2", "--input-tokens", "64", "--output-tokens", "256",
                                     "--models-dir", str(MODELS), "--gpu", "NVIDIA H200", "--vllm-version", "0.24.0",
                                     "--step-sizes", STEPS])
    assert table.exit_code == 0 and "capture sizes" in table.stdout and "1, 2, 4, 8, 16" in table.stdout
    bad = CliRunner().invoke(app, ["recommend", "--rate", "2", "--input-tokens", "64", "--output-tokens", "256",
                                   "--models-dir", str(MODELS), "--step-sizes", "{\"le\": 3}"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output


def test_service_request_takes_the_optional_inputs() -> None:
    body = RecommendRequest.model_validate({"workload": {"rate": 2, "input_tokens": 64, "output_tokens": 64},
                                            "step_sizes": json.loads(STEPS), "vllm_args": ["--runner", "pooling"],
                                            "capture_budget": {"max_sizes": 4}})
    assert body.step_sizes is not None and body.capture_budget is not None and body.capture_budget.max_sizes == 4
    with pytest.raises(ValueError):
        RecommendRequest.model_validate({"workload": {"rate": 2, "input_tokens": 64, "output_tokens": 64},
                                         "capture_budget": {"max_sizes": 0}})


def test_watch_restarts_with_chosen_sizes_only_when_it_pays(tmp_path: Path) -> None:
    import asyncio

    from graphmode.control.controller import Controller, SwitchResult
    from graphmode.profiling.metrics import Histogram, MetricsSnapshot

    class Managed:
        def __init__(self) -> None:
            self.mode: str | None = "FULL_AND_PIECEWISE"
            self.vllm_args = ["--model", "m", "--max-num-seqs", "1024"]
            self.calls: list[list[str] | None] = []

        def metrics_url(self) -> str | None:
            return None

        def command(self) -> list[str] | None:
            return ["vllm", "serve", *self.vllm_args]

        async def switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> SwitchResult:
            self.calls.append(vllm_args)
            return SwitchResult(True, mode.value, "ok", startup_s=60.0, downtime_s=0.0, command=["x"])

    def advisor(_: object) -> Advice:
        return Advice(best="FULL_AND_PIECEWISE", scores={"NONE": 0.020, "FULL_AND_PIECEWISE": 0.005})

    ex = Managed()
    policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, confirmations=1))
    ctl = Controller("d", ex, advisor, policy, state_dir=tmp_path, capture_sizes=True)
    # 5000 steps of 513..1024 tokens with 700 requests running: beyond the default list's 512.
    for t, cum in enumerate((0.0, 5000.0)):
        hist = Histogram(sum=0.0, count=cum, buckets=[(512.0, 0.0), (1024.0, cum), (float("inf"), cum)])
        ctl.window.add(MetricsSnapshot(t=float(t * 30), num_requests_running=700, num_requests_waiting=0,
                                       iteration_tokens=hist, request_success_total=float(t * 300)))
    asyncio.run(ctl.step())
    assert ex.calls and ex.calls[-1] is not None
    cc = compilation_config_of(ex.calls[-1])
    assert cc["max_cudagraph_capture_size"] == 1024 and 700 in cc["cudagraph_capture_sizes"]
    assert ex.vllm_args == ex.calls[-1]  # later mode switches keep the sizes
    assert ctl.state.decisions[-2]["action"] == "switch" and "capture" in ctl.state.decisions[-2]["current"]
    # After the restart the window starts empty: no step sizes, no capture decision, no second restart.
    asyncio.run(ctl.step())
    assert len(ex.calls) == 1 and "capture" not in str(ctl.state.decisions[-1].get("current"))


def test_service_answers_with_the_capture_block() -> None:
    from starlette.testclient import TestClient

    from graphmode.core.settings import Settings
    from graphmode.service.app import create_app

    app = create_app(Settings(), models_dir=MODELS, target=None)
    body = {"workload": {"rate": 2, "input_tokens": 64, "output_tokens": 256},
            "objective": {"metric": "ttft_p50"}, "step_sizes": json.loads(STEPS),
            "vllm_args": ["--attention-backend", "FLASHINFER"], "capture_budget": {"max_sizes": 1},
            "served_model_config": json.loads((MODELS / "shapes" / "llama-3.1-8b.json").read_text())}
    with TestClient(app) as tc:
        r = tc.post("/v1/recommend", json=body)
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["capture"]["sizes"] == [16]  # the budget allows one size: the top bucket's edge
        assert any("1, 2, 4, 8 dropped" in n for n in data["capture"]["notes"])  # no room for the kept sizes
        assert data["capture"]["kv_tokens_gained"] > 0 and data["mode"] != "FULL"
        assert json.loads(data["compilation_config"])["cudagraph_capture_sizes"] == [16]
        plain = tc.post("/v1/recommend", json={"workload": body["workload"]}).json()
        assert plain["capture"] is None  # a bare description asks for no capture list (it costs tens of ms)
        # asked for (a budget): the description's steps are predicted from the model's profiled cells
        asked = tc.post("/v1/recommend", json={"workload": body["workload"], "capture_budget": {}}).json()
        assert asked["capture"] is not None and asked["capture"]["steps_predicted"]["predicted"] is True
        bad = tc.post("/v1/recommend", json={**body, "step_sizes": {"le": "x"}})
        assert bad.status_code == 422
        roomy = {**body, "capture_budget": {"max_sizes": 3, "always_keep": [1, 2]}}
        assert tc.post("/v1/recommend", json=roomy).json()["capture"]["sizes"] == [1, 2, 16]
        for keep in ([0], ["1"], 2):
            wrong = tc.post("/v1/recommend", json={**body, "capture_budget": {"always_keep": keep}})
            assert wrong.status_code == 422, keep
        for ratio in (1, 0.5, -1, "x"):
            wrong = tc.post("/v1/recommend", json={**body, "capture_budget": {"max_pad_ratio": ratio}})
            assert wrong.status_code == 422 and "max_pad_ratio" in wrong.text, ratio
        loose = tc.post("/v1/recommend", json={**body, "capture_budget": {"max_pad_ratio": 0}})
        assert loose.status_code == 200 and loose.json()["capture"]["sizes"] == [1, 2, 4, 8, 16]


def test_launch_never_passes_a_mode_vllm_would_downgrade(tmp_path: Path) -> None:
    # No model anywhere: vLLM's default FULL_AND_PIECEWISE, which FlashInfer with speculative decoding runs
    # as PIECEWISE; the launcher asks for PIECEWISE and says why.
    args = ["--model", "m", "--attention-backend", "FLASHINFER", "--speculative-config",
            '{"method": "eagle", "num_speculative_tokens": 2}']
    c = choose_mode(models_dir=tmp_path / "none", vllm_args=args)
    assert c.mode is CudaGraphMode.PIECEWISE and c.source == "default"
    assert any("FLASHINFER" in n and "PIECEWISE" in n for n in c.notes)
    assert choose_mode(models_dir=tmp_path / "none", vllm_args=["--model", "m"]).mode is \
        CudaGraphMode.FULL_AND_PIECEWISE


def test_complete_survives_bad_flags_and_a_broken_model_folder(tmp_path: Path) -> None:
    from graphmode.core.records import StepSizes
    from graphmode.selector.graphconfig import complete
    from graphmode.selector.recommend import Recommender

    rec = Recommender.load(MODELS, None)
    ans = rec.recommend(WorkloadDescription(rate=2, input_tokens=64, output_tokens=64), None)
    (tmp_path / "dataset.sqlite").write_text("not sqlite")
    out = complete(ans, step_sizes=StepSizes.model_validate_json(STEPS), model_folder=tmp_path,
                   vllm_args=["--max-num-batched-tokens", "0", "--max-num-seqs", "x"])
    assert out.capture is not None and out.capture.chosen.capture_s is None
    assert any("capture costs unavailable" in n for n in out.notes)
    assert out.capture.default_sizes == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


def test_cli_server_measures_the_step_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    import graphmode.selector.live as live
    from graphmode.profiling.metrics import parse_metrics

    texts = [(FIXTURES / "vllm-0.32-cpu" / n).read_text() for n in ("metrics-idle.txt", "metrics-after-load.txt")]
    calls: list[int] = []

    def fake_scrape(url: str, timeout: float = 5.0, *, clock: Any) -> object:
        calls.append(1)
        return parse_metrics(texts[min(len(calls) - 1, 1)], clock())

    monkeypatch.setattr(live, "scrape_sync", fake_scrape)
    r = CliRunner().invoke(app, ["recommend", "--server", "localhost:8000", "--window", "1", "--interval", "0.5",
                                 "--models-dir", str(MODELS), "--gpu", "NVIDIA H200", "--vllm-version", "0.24.0",
                                 "--json"])
    assert r.exit_code == 0, r.output
    cap = json.loads(r.stdout)["capture"]
    # The real capture: 37 steps, the largest in (16, 32]: the list stops at that bucket's edge.
    assert cap["steps_observed"] == 37 and cap["max_capture_size"] == 32 and cap["chosen"]["graphed_share"] == 1.0


def test_launch_uses_the_step_sizes_watch_saved(tmp_path: Path) -> None:
    from graphmode.control.state import DeploymentState, save_state

    steps = json.loads(STEPS)
    save_state(tmp_path, DeploymentState(deployment_id="d1", last_step_sizes=steps))
    base = ["launch", "--dry-run", "--json", "--models-dir", str(tmp_path / "no-models"), "--state-dir",
            str(tmp_path), "--deployment-id", "d1"]
    r = CliRunner().invoke(app, [*base, "--", "--model", "m", "--compilation-config", '{"backend":"inductor"}'])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # No model: vLLM's default mode, with the sizes chosen for the saved steps, the user's key kept.
    # 1, 2, 8 are kept by default (small batches replay a graph whatever the load).
    assert out["source"] == "default" and out["capture"]["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16]
    cc = compilation_config_of(out["argv"])
    assert cc == {"backend": "inductor", "cudagraph_mode": "FULL_AND_PIECEWISE",
                  "cudagraph_capture_sizes": [1, 2, 4, 8, 16],
                  "max_cudagraph_capture_size": 16}
    # The user's own sizes win without --force.
    mine = CliRunner().invoke(app, [*base, "--", "--compilation-config", '{"cudagraph_capture_sizes":[8]}'])
    assert compilation_config_of(json.loads(mine.stdout.strip().splitlines()[-1])["argv"])[
        "cudagraph_capture_sizes"] == [8]


def test_watch_saves_the_window_step_sizes(tmp_path: Path) -> None:
    import asyncio

    from graphmode.control.controller import Controller
    from graphmode.profiling.metrics import parse_metrics

    class Attached:
        mode: str | None = "FULL_AND_PIECEWISE"

        def metrics_url(self) -> str | None:
            return None

        def command(self) -> list[str] | None:
            return None

        async def switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> Any:
            raise AssertionError("no switch expected")

    ctl = Controller("d2", Attached(), lambda _f: None, Policy(PolicyConfig()), state_dir=tmp_path, dry_run=True)
    for t, name in ((0.0, "metrics-idle.txt"), (10.0, "metrics-after-load.txt")):
        ctl.window.add(parse_metrics((FIXTURES / "vllm-0.32-cpu" / name).read_text(), t))
    asyncio.run(ctl.step())
    saved = ctl.state.last_step_sizes
    assert saved is not None and saved["steps"][:4] == [16.0, 16.0, 4.0, 1.0]


@pytest.mark.parametrize(("message", "mode"), [
    # Built from vLLM's format strings (vllm/config/vllm.py, compilation.py): no real log of these here yet.
    ("Encoder-decoder models do not support FULL_AND_PIECEWISE. Overriding cudagraph_mode to FULL_DECODE_ONLY.",
     "FULL_DECODE_ONLY"),
    ("CUDAGraphMode.FULL is not supported with FlashInferBackend backend (support: "
     "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=FULL_AND_PIECEWISE",
     "FULL_AND_PIECEWISE"),
    ("CUDAGraphMode.FULL_DECODE_ONLY is not supported with FlexAttentionBackend backend (support: "
     "AttentionCGSupport.NEVER); setting cudagraph_mode=PIECEWISE because attention is compiled piecewise",
     "PIECEWISE"),
    ("Truncating max_cudagraph_capture_size to 496", None),
])
def test_vllm_override_messages(message: str, mode: str | None) -> None:
    st = parse_startup_log(f"(EngineCore pid=1) WARNING 12-01 10:00:00 [vllm.py:1] {message}", requested_mode="FULL")
    assert st.downgrades == [message]
    assert st.effective_mode == (mode or None)


def test_the_h200_model_answers_per_attention_backend() -> None:
    """vLLM 0.33 races on the H200 (2026-12-02): on TRITON_ATTN PIECEWISE ran ~3× the default's ITL; on
    FLASHINFER FULL ran as FULL_AND_PIECEWISE. The bundled model says both, and a plain deployment (no backend
    asked for) is vLLM's own pick there, FLASH_ATTN, not an imputed mix of every raced backend."""
    base = ["recommend", "--models-dir", str(MODELS), "--gpu", "NVIDIA H200", "--vllm-version", "0.33.0",
            "--model-path", str(MODELS / "shapes" / "llama-3.2-1b.json"), "--rate", "1", "--input-tokens", "128",
            "--output-tokens", "128", "--concurrency", "1", "--json"]

    def ask(*extra: str) -> dict[str, Any]:
        r = CliRunner().invoke(app, [*base, *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    triton = ask("--vllm-args", "--attention-backend TRITON_ATTN", "--objective", "itl_p50")
    assert triton["race"]["worse"] and "PIECEWISE" in triton["race"]["worse"]
    assert "PIECEWISE" not in triton["ties"]
    itl = {p["mode"]: p["metrics"]["itl_p50"] for p in triton["predictions"]}
    assert itl["PIECEWISE"] > 2 * itl["FULL_AND_PIECEWISE"]
    flashinfer = ask("--vllm-args", "--attention-backend FLASHINFER", "--objective", "ttft_p50")
    assert flashinfer["mode"] != "FULL" and "FULL" not in flashinfer["ties"]
    assert any("FULL ran as FULL_AND_PIECEWISE" in n for n in flashinfer["notes"])
    assert any(n.startswith("never recommended for this deployment") and "FULL (" in n for n in flashinfer["notes"])
    plain = ask("--objective", "ttft_p50")
    assert not [f for f in plain["confidence"]["imputed"] if f.startswith("attention_backend")]


def test_spec_decode_rounds_decode_graphs_as_vllm_does() -> None:
    from graphmode.selector.capture_costs import spec_decode_sizes

    default = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    # the H200 ngram k=3 start (tests/fixtures/vllm-0.33-h200/llama1b-ngram3-FULL_AND_PIECEWISE.log): 49 FULL graphs
    assert len(spec_decode_sizes(default, 4)) == 49 == _parse_file(
        FIXTURES / "vllm-0.33-h200" / "llama1b-ngram3-FULL_AND_PIECEWISE.log").graph_counts["FULL"]
    assert spec_decode_sizes([1, 2, 4, 8, 16], 4) == [4, 8, 16]
    assert spec_decode_sizes([1, 2, 4, 8, 16], 6) == [6, 12]  # 16 -> 18 is above the largest: dropped
    assert spec_decode_sizes([1, 2, 4], 6) == []  # vLLM refuses such a list (no size left) unless 1+k fits
    assert spec_decode_sizes([1, 2, 8], 6) == [6]
    assert spec_decode_sizes([1, 3], 1) == [1, 3]
    assert deployment_of(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'], env={}) \
        .speculative_k == 3
    assert deployment_of(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": true}'], env={}) \
        .speculative_k is None
    assert deployment_of(["--num-speculative-tokens", "5"], env={}).speculative_k == 5


def test_the_capture_answer_says_what_spec_decoding_does_to_the_list() -> None:
    from graphmode.core.records import StepSizes
    from graphmode.selector.graphconfig import complete
    from graphmode.selector.recommend import Recommender

    rec = Recommender.load(MODELS, None)
    ans = rec.recommend(WorkloadDescription(rate=2, input_tokens=64, output_tokens=64), None)
    spec = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    out = complete(ans, step_sizes=StepSizes.model_validate_json(STEPS), vllm_args=spec)
    assert out.capture is not None and out.mode != "PIECEWISE"  # ngram runs the FULL family as asked
    assert out.capture.decode_graph_sizes == [4, 8, 16] and out.capture.sizes == [1, 2, 4, 8, 16]
    assert any("multiples of 4" in n and "49 for the default list" in n for n in out.capture.notes)
    plain = complete(ans, step_sizes=StepSizes.model_validate_json(STEPS))
    assert plain.capture is not None and plain.capture.decode_graph_sizes is None


def test_step_sizes_from_several_api_servers_scale_with_the_deployment_args() -> None:
    from graphmode.core.records import StepSizes
    from graphmode.selector.graphconfig import complete
    from graphmode.selector.recommend import Recommender

    rec = Recommender.load(MODELS, None)
    ans = rec.recommend(WorkloadDescription(rate=2, input_tokens=64, output_tokens=64), None)
    # a live window of a deployment with four API servers at 768 running: each server counts ~192 a step
    steps = StepSizes(le=[64.0, 128.0, 256.0, 512.0], steps=[0.0, 4.0, 352.0, 0.0, 0.0], running={768: 9})
    four = complete(ans, step_sizes=steps, vllm_args=["--max-num-seqs", "1024", "--api-server-count", "4"])
    one = complete(ans, step_sizes=steps, vllm_args=["--max-num-seqs", "1024"])
    assert four.capture is not None and one.capture is not None
    assert max(four.capture.sizes) >= 768 > max(one.capture.sizes)


def test_watch_reads_a_live_window_per_engine_step_with_the_deployments_api_servers() -> None:
    """watch's capture step (policy.capture_decision) gets a live window with no server count: four API
    servers at 768 running read ~192 tokens a step, four times. Read so, the default list to 512 graphs
    every step and nothing changes; per engine step (the deployment's --api-server-count) every step is
    768 tokens, eager under the default list, and the new list takes it (H200 lease 13: TPOT 0.73x)."""
    from graphmode.control.policy import Advice, capture_decision
    from graphmode.core.records import StepSizes

    steps = StepSizes(le=[64.0, 128.0, 256.0, 512.0], steps=[0.0, 4.0, 352.0, 0.0, 0.0], running={768: 9})
    advice = Advice(best="FULL_AND_PIECEWISE", scores={"NONE": 0.045, "FULL_AND_PIECEWISE": 0.030},
                    direction="min", ties=(), noise={}, startup_s={})
    policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, min_gain=0.05, horizon_s=1800), clock=lambda: 1e4)
    base = ["--model", "m", "--max-num-seqs", "1024"]
    four, new_args = capture_decision(policy, PolicyState(), "FULL_AND_PIECEWISE", [*base, "--api-server-count", "4"],
                                      steps, advice, rate=50.0, startup_s=80.0)
    assert four.switch and new_args is not None, four.reason
    sizes = json.loads(new_args[new_args.index("--compilation-config") + 1])["cudagraph_capture_sizes"]
    assert max(sizes) >= 768 and "+" in four.reason and "un-graphed penalty 0.50" in four.reason
    assert four.numbers["gain"] == pytest.approx(0.5, abs=0.03)  # ~every step moves to a graph, penalty 0.5
    one, _ = capture_decision(policy, PolicyState(), "FULL_AND_PIECEWISE", base, steps, advice, rate=50.0,
                              startup_s=80.0)
    assert not one.switch  # read as 192-token steps: the default list already graphs them
