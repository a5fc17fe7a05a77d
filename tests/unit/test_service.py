"""Service pieces without a server: request schemas, 422 details, the job registry, the body-limit
middleware (driven as a raw ASGI app), auth helpers. The API itself is tested through a real uvicorn
server in tests/integration/test_service_uvicorn.py."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from graphmode.cli.serve_cmd import _is_loopback
from graphmode.core.errors import EngineStartError
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import ObservedFeatures
from graphmode.core.settings import Settings
from graphmode.selector.objective import METRICS
from graphmode.selector.recommend import Recommendation
from graphmode.service.app import validation_details
from graphmode.service.jobs import JobBusy, JobContext, JobRegistry
from graphmode.service.metrics import ServiceMetrics
from graphmode.service.middleware import BodyLimitMiddleware
from graphmode.service.retrain import RequestFieldError, plan
from graphmode.service.schemas import (
    FeaturesIn,
    JobResult,
    ObjectiveIn,
    RecommendRequest,
    RecommendResponse,
    RetrainRequest,
    WorkloadIn,
)

WORKLOAD = {"rate": 4, "input_tokens": 256, "output_tokens": 64}


def _errors(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple[tuple[Any, ...], str]]:
    return [(tuple(e["loc"]), e["msg"]) for e in exc.value.errors()]


# ---------------------------------------------------------------------------------------------- schemas
def test_request_inputs_are_the_selector_types() -> None:
    r = RecommendRequest.model_validate({"features": {"arrival_rate": 3, "batch_mean": 2}})
    assert isinstance(r.features, ObservedFeatures) and r.features.arrival_rate == 3
    assert set(FeaturesIn.model_fields) == set(ObservedFeatures.model_fields)  # follows the selector's fields
    r = RecommendRequest.model_validate({"workload": WORKLOAD})
    assert isinstance(r.workload, WorkloadIn) and r.workload.burstiness == 1.0
    r = RecommendRequest.model_validate({"server_url": "localhost:8000"})
    assert r.server_url == "localhost:8000" and r.window_s == 30.0


@pytest.mark.parametrize(
    ("body", "loc", "needle"),
    [
        ({"features": {"arrival_rate": math.nan}}, ("features", "arrival_rate"), "finite"),
        ({"features": {"kv_usage_mean": math.inf}}, ("features", "kv_usage_mean"), "finite"),
        ({"features": {"arrival_rate": -0.5}}, ("features", "arrival_rate"), ">= 0"),
        ({"features": {"window_s": 30}}, ("features",), "at least one traffic feature"),
        ({"workload": {**WORKLOAD, "burstiness": math.nan}}, ("workload", "burstiness"), "finite"),
        ({"workload": {**WORKLOAD, "concurrency": 0}}, ("workload", "concurrency"), "greater than 0"),
        ({"workload": WORKLOAD, "objective": {"metric": "p99"}}, ("objective", "metric"), "known:"),
        ({"workload": WORKLOAD, "objective": {"max_graph_gib": math.nan}}, ("objective", "max_graph_gib"), "finite"),
        (
            {"workload": WORKLOAD, "objective": {"constraints": ["ttft_p99 <= 5 lightyears"]}},
            ("objective", "constraints", 0),
            "unit",
        ),
        ({"workload": WORKLOAD, "server_url": "http://x"}, (), "exactly one"),
        ({"server_url": "http://x:8000", "window_s": 0}, ("window_s",), "greater than 0"),
        ({"server_url": "http://x:8000", "window_s": 3600}, ("window_s",), "less than or equal"),
        ({"server_url": "http://x:8000", "window_s": 2, "interval_s": 5}, (), "interval_s must not exceed"),
        ({"server_url": "http://x:99999"}, ("server_url",), "port"),
        ({"server_url": "file:///etc/passwd"}, ("server_url",), "http://"),
        ({"workload": WORKLOAD, "served_model_config": {"foo": 1}}, ("served_model_config",), "config.json"),
        ({"workload": WORKLOAD, "served_model_config": [1]}, ("served_model_config",), "dictionary"),
    ],
)
def test_recommend_request_rejects(body: dict[str, Any], loc: tuple[Any, ...], needle: str) -> None:
    with pytest.raises(ValidationError) as exc:
        RecommendRequest.model_validate(body)
    errs = _errors(exc)
    assert any(e_loc == loc and needle in msg for e_loc, msg in errs), errs


def test_response_schema_is_the_recommendation() -> None:
    """The endpoint serializes the selector's Recommendation as the RecommendResponse: same fields."""
    assert set(RecommendResponse.model_fields) == set(Recommendation.model_fields)
    assert {"mode", "compilation_config", "predictions", "confidence", "model_id"} <= set(
        RecommendResponse.model_fields
    )
    assert "mode" not in RecommendRequest.model_fields


def test_unknown_metric_lists_the_known_ones() -> None:
    with pytest.raises(ValidationError) as exc:
        ObjectiveIn(metric="latency_p42")
    msg = exc.value.errors()[0]["msg"]
    assert all(m in msg for m in METRICS) and "throughput" in msg


def test_objective_in() -> None:
    assert ObjectiveIn().is_default() and ObjectiveIn.model_validate({}).is_default()
    assert not ObjectiveIn(metric="itl_p50").is_default()
    assert not ObjectiveIn(prefer_default_on_tie=False).is_default()
    obj = ObjectiveIn(metric="tok_s", constraints=["ttft_p99<=200ms"], max_graph_gib=0.5).build("itl_p50")
    assert obj.metric == "output_tok_s"
    assert [(c.metric, c.op, c.value) for c in obj.constraints] == [
        ("ttft_p99", "<=", pytest.approx(0.2)),
        ("graph_gib", "<=", 0.5),
    ]
    assert ObjectiveIn(constraints=["itl_p50<2ms"]).build("ttft_p50").metric == "ttft_p50"


def test_retrain_request_modes_and_command() -> None:
    r = RetrainRequest.model_validate(
        {"vllm_args": ["--model", "/m"], "modes": ["full", "CUDAGraphMode.PIECEWISE", "none"]}
    )
    assert r.modes == [CudaGraphMode.FULL, CudaGraphMode.PIECEWISE, CudaGraphMode.NONE]
    assert r.command(["vllm", "serve"]) == ["vllm", "serve"]
    assert r.model_copy(update={"vllm_command": "/v/bin/python -m vllm.entrypoints.openai.api_server"}).command([]) == [
        "/v/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    with pytest.raises(ValidationError) as exc:
        RetrainRequest.model_validate({"modes": ["FULL", "WARP"]})
    assert _errors(exc)[0][0] == ("modes", 1) and "expected one of" in _errors(exc)[0][1]
    with pytest.raises(ValidationError):
        RetrainRequest.model_validate({"grid_path": "a.yaml", "grid": {"workloads": []}})
    with pytest.raises(ValidationError):
        RetrainRequest.model_validate({"regressor": "xgboost"})


def test_retrain_plan(tmp_path: Path) -> None:
    s = Settings()
    req = RetrainRequest.model_validate(
        {"vllm_args": ["--model", "/m"], "workloads": ["chat-r2-b1"], "modes": ["FULL", "full"], "port": 9001}
    )
    cfg = plan(req, s)
    assert cfg.modes == [CudaGraphMode.FULL] and cfg.port == 9001 and cfg.command == s.vllm.argv()
    assert [w.name for w in cfg.workloads] == ["chat-r2-b1"] and cfg.planned_cells == 1
    # `vllm serve MODEL`: the positional model counts.
    cfg = plan(RetrainRequest(vllm_command="vllm serve", vllm_args=["/models/x"]), s)
    assert len(cfg.workloads) > 1 and len(cfg.modes) == 5
    with pytest.raises(RequestFieldError) as err:
        plan(RetrainRequest(vllm_command=[], vllm_args=["--model", "/m"]), s)
    assert err.value.field == "vllm_command"
    grid = tmp_path / "grids" / "g.yaml"  # the registry's grids folder
    grid.parent.mkdir()
    grid.write_text("workloads: [{name: w, rate: 1, input: {mean: 8}, output: {mean: 8}, repeats: 3}]\n")
    cfg = plan(RetrainRequest(vllm_args=["--model", "/m"], grid_path="g.yaml", modes=["NONE", "FULL"]), s, tmp_path)
    assert cfg.planned_cells == 6


def test_validation_details_are_json_safe() -> None:
    with pytest.raises(ValidationError) as exc:
        RecommendRequest.model_validate({"features": {"arrival_rate": math.nan, "batch_mean": -math.inf}})
    details = validation_details(exc.value.errors())
    text = json.dumps(details, allow_nan=False)  # must not raise
    assert '"input": "nan"' in text and '"input": "-inf"' in text
    assert all(set(d) <= {"loc", "msg", "type", "input"} for d in details)
    long = validation_details([{"loc": ("body",), "msg": "m", "type": "t", "input": "x" * 1000}])
    assert len(str(long[0]["input"])) < 210
    assert "input" not in validation_details([{"loc": ("body",), "msg": "m", "type": "t", "input": {"a": 1}}])[0]


# ---------------------------------------------------------------------------------------------- jobs
def _result() -> JobResult:
    return JobResult(model_id="m", model_dir="/d", dataset="/d.sqlite")


def _wait(registry: JobRegistry, job_id: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        job = registry.get(job_id)
        assert job is not None
        if job.done:
            return job.status
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_job_registry_lifecycle(tmp_path: Path) -> None:
    metrics = ServiceMetrics()
    reg = JobRegistry(lock_path=tmp_path / "job.lock", metrics=metrics)
    gate = threading.Event()

    def work(ctx: JobContext) -> JobResult:
        ctx.phase("profiling", "starting")
        ctx.cell_done(True)
        ctx.cell_done(False)
        assert gate.wait(10)
        return _result()

    job = reg.submit("retrain", {"a": 1}, work, planned=2)
    with pytest.raises(JobBusy):
        reg.submit("retrain", {}, work)
    # Another process (another registry on the same lock file) is refused too.
    other = JobRegistry(lock_path=tmp_path / "job.lock")
    deadline = time.monotonic() + 5
    while job.status == "queued" and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(JobBusy, match="another graphmode process"):
        other.submit("retrain", {}, work)
    assert reg.running() is job
    gate.set()
    assert _wait(reg, job.id) == "succeeded"
    snap = job.snapshot()
    assert snap.progress.cells_done == 2 and snap.progress.cells_failed == 1 and snap.result is not None
    assert snap.progress.phase == "done" and snap.request == {"a": 1} and snap.progress.cells_planned == 2
    # The lock is free again, for this registry and the other one.
    job2 = other.submit("retrain", {}, lambda ctx: _result())
    assert _wait(other, job2.id) == "succeeded"
    reg.shutdown()
    other.shutdown()
    assert 'graphmode_jobs_total{kind="retrain",status="succeeded"} 1.0' in metrics.render()[0].decode()


def test_job_registry_failures_and_cancel() -> None:
    reg = JobRegistry()

    def fails(ctx: JobContext) -> JobResult:
        raise EngineStartError("no GPU")

    def crashes(ctx: JobContext) -> JobResult:
        raise KeyError("bug")

    started = threading.Event()

    def loops(ctx: JobContext) -> JobResult:
        started.set()
        for _ in range(1000):
            ctx.check_cancelled()
            time.sleep(0.005)
        return _result()

    j = reg.submit("retrain", {}, fails)
    assert _wait(reg, j.id) == "failed" and j.error == "no GPU"
    j = reg.submit("retrain", {}, crashes)
    assert _wait(reg, j.id) == "failed" and j.error is not None and j.error.startswith("KeyError")
    j = reg.submit("retrain", {}, loops)
    assert started.wait(5)
    assert reg.cancel(j.id) is j and j.snapshot().cancel_requested
    assert _wait(reg, j.id) == "cancelled"
    assert reg.cancel("nope") is None and reg.get("nope") is None
    assert [x.status for x in reg.list()] == ["cancelled", "failed", "failed"]
    reg.shutdown()


def test_job_registry_keeps_the_last_jobs() -> None:
    reg = JobRegistry(keep=3)
    ids = []
    for _ in range(5):
        j = reg.submit("retrain", {}, lambda ctx: _result())
        _wait(reg, j.id)
        ids.append(j.id)
    assert [j.id for j in reg.list()] == ids[::-1][:3]
    reg.shutdown()


# ---------------------------------------------------------------------------------------------- middleware
async def _echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def _call(app: Any, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes, list[Any]]:
    sent: list[dict[str, Any]] = []
    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body, start["headers"]


def test_body_limit_middleware() -> None:
    app = BodyLimitMiddleware(_echo_app, max_body_bytes=100)
    # Within the limit: passes through, with or without a length.
    assert _call(app, [b"x" * 100], [(b"content-length", b"100")])[:2] == (200, b"100")
    assert _call(app, [b"x" * 50, b"y" * 50], [])[:2] == (200, b"100")
    # Content-Length over the limit: 413 before reading anything.
    status, body, headers = _call(app, [b"x" * 101], [(b"content-length", b"101")])
    assert status == 413 and b"100 bytes" in body and (b"connection", b"close") in headers
    # Chunked (no Content-Length), over the limit: 413 once the 101st byte arrives.
    status, body, _ = _call(app, [b"x" * 60, b"y" * 60, b"z" * 60], [])
    assert status == 413
    # A lying Content-Length does not help.
    assert _call(app, [b"x" * 60, b"y" * 60], [(b"content-length", b"10")])[0] == 413


def test_is_loopback() -> None:
    assert _is_loopback("127.0.0.1") and _is_loopback("localhost") and _is_loopback("::1")
    assert _is_loopback("127.0.0.2") and _is_loopback("[::1]")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("10.1.2.3") and not _is_loopback("example.com")


# ------------------------------------------------------------------------------------- scrape hosts
@pytest.mark.parametrize("url, allowed, ok", [
    ("http://127.0.0.1:8000", ["127.0.0.1", "::1", "localhost"], True),
    ("localhost:8000", ["127.0.0.1", "::1", "localhost"], True),
    ("http://[::1]:8000/metrics", ["127.0.0.1", "::1", "localhost"], True),
    ("http://LOCALHOST:8000", ["localhost"], True),
    ("http://10.1.2.3:8000", ["127.0.0.1", "localhost"], False),
    ("http://10.1.2.3:8000", ["10.0.0.0/8"], True),
    ("http://10.1.2.3:8000", ["10.0.0.0/16"], False),
    ("http://vllm.internal:8000", ["10.0.0.0/8"], False),  # names are never resolved to match a network
    ("http://vllm.internal:8000", ["vllm.internal"], True),
    ("http://evil.vllm.internal:8000", ["vllm.internal"], False),  # exact names, no suffix match
    ("http://169.254.169.254/", ["*"], True),
    ("http://127.0.0.1:8000", [], False),
])
def test_scrape_refusal(url: str, allowed: list[str], ok: bool) -> None:
    from graphmode.service.routers.recommend import scrape_refusal

    why = scrape_refusal(url, allowed)
    assert (why is None) == ok, why
    if not ok:
        assert "GRAPHMODE_SERVICE__SCRAPE_HOSTS" in str(why)


def test_scrape_hosts_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().service.scrape_hosts == ["127.0.0.1", "::1", "localhost"]
    monkeypatch.setenv("GRAPHMODE_SERVICE__SCRAPE_HOSTS", '["10.0.0.0/8", " VLLM.internal ", ""]')
    assert Settings().service.scrape_hosts == ["10.0.0.0/8", "vllm.internal"]
    monkeypatch.setenv("GRAPHMODE_SERVICE__SCRAPE_HOSTS", '["10.0.0.0/33"]')
    with pytest.raises(ValidationError, match=r"10\.0\.0\.0/33"):
        Settings()
