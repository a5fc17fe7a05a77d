"""The HTTP service through a real uvicorn server on loopback (no ASGI shortcuts).

The model is trained once per session on SYNTHETIC rows (tests.support.synthetic): these tests check
the service's behaviour, not what vLLM does. The ``server_url`` input is served by a tiny HTTP server that
replays the real vLLM 0.32 ``/metrics`` text of ``tests/fixtures/vllm-0.32-cpu`` with counters advancing
between scrapes. Retrain jobs run a fake ``graphmode.selector.retrain`` (monkeypatched), so no vLLM runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr

import graphmode.selector
from graphmode.core.modes import CudaGraphMode
from graphmode.core.settings import DEFAULT_GRID, Settings
from graphmode.profiling.grid import load_grid
from graphmode.profiling.runner import ProfileConfig, ProfileSummary
from graphmode.selector.card import ModelCard
from graphmode.selector.train import train
from graphmode.service.app import create_app
from tests.support.net import Request, free_port, serve_http
from tests.support.synthetic import write_synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/vllm-0.32-cpu/metrics-after-load.txt"
TOKEN = "s3cret-token-for-tests"
MODES = sorted(m.value for m in CudaGraphMode)
WORKLOADS = ["chat-r2-b1", "chat-r8-b0.25", "decode-heavy-r32-b1", "prefill-heavy-r2-b1", "balanced-r8-b1"]
GOOD_WORKLOAD = {"rate": 8, "burstiness": 1.0, "input_tokens": 512, "output_tokens": 128}
GOOD_FEATURES = {
    "arrival_rate": 8.0,
    "mean_input_tokens": 512.0,
    "mean_output_tokens": 128.0,
    "batch_mean": 3.0,
    "batch_cv": 0.5,
    "concurrency_mean": 3.0,
    "prefill_decode_ratio": 4.0,
}


# ---------------------------------------------------------------------------------------------- servers
class UvicornThread:
    """A real uvicorn server in a thread, on a socket bound here (127.0.0.1, free port, no race)."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.exit_code: int | str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except SystemExit as exc:  # uvicorn exits this way when the app's start-up fails
            self.exit_code = exc.code

    def start(self, timeout: float = 30.0) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"uvicorn exited during start-up (exit code {self.exit_code})")
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.02)
        with httpx.Client(trust_env=False) as c:  # poll /healthz: up when it answers at all
            while True:
                try:
                    c.get(self.url + "/healthz", timeout=2.0)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


class FakeVllmMetrics:
    """Serves vLLM 0.32's /metrics text; every scrape advances the counters as if 4 requests of 512 in /
    128 out finished, and flips the running batch between 3 and 4."""

    DELTAS: ClassVar[dict[str, float]] = {
        "vllm:prompt_tokens_total": 4 * 512,
        "vllm:generation_tokens_total": 4 * 128,
        "vllm:request_prompt_tokens_sum": 4 * 512,
        "vllm:request_prompt_tokens_count": 4,
        "vllm:request_generation_tokens_sum": 4 * 128,
        "vllm:request_generation_tokens_count": 4,
        "vllm:iteration_tokens_total_sum": 4 * 640,
        "vllm:iteration_tokens_total_count": 130,
    }
    LINE = re.compile(r"^(?P<name>[^{\s]+)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)$")

    def __init__(self) -> None:
        self.text = FIXTURE.read_text()
        self.scrapes = 0

    def respond(self, req: Request) -> tuple[int, str]:
        if req.path != "/metrics":
            return 404, ""
        self.scrapes += 1
        return 200, self.render(self.scrapes - 1)

    def render(self, n: int) -> str:
        out = []
        for line in self.text.splitlines():
            m = self.LINE.match(line)
            if m and not line.startswith("#"):
                name, labels, value = m["name"], m["labels"] or "", float(m["value"])
                if name in self.DELTAS:
                    value += n * self.DELTAS[name]
                elif name == "vllm:request_success_total" and 'finished_reason="length"' in labels:
                    value += n * 4
                elif name == "vllm:num_requests_running":
                    value = 3.0 + n % 2
                line = f"{name}{labels} {value!r}"
            out.append(line)
        return "\n".join(out) + "\n"

    @contextmanager
    def serving(self) -> Iterator[str]:
        with serve_http(self.respond) as url:
            yield url


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SYNTHETIC model, trained once per session."""
    root = tmp_path_factory.mktemp("service-models")
    ds = write_synthetic_dataset(root / "ds.sqlite", workloads=load_grid(DEFAULT_GRID).select(WORKLOADS), repeats=2)
    train(ds, models_dir=root / "models")
    return root / "models"


def _settings(token: str | None, **service: Any) -> Settings:
    s = Settings()
    s.service.token = SecretStr(token) if token else None
    for k, v in service.items():
        setattr(s.service, k, v)
    return s


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[UvicornThread]:
    """The service with a token configured."""
    srv = UvicornThread(create_app(_settings(TOKEN), models_dir=models_dir, target=None)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def open_server(models_dir: Path) -> Iterator[UvicornThread]:
    """The service with no token configured."""
    srv = UvicornThread(create_app(_settings(None), models_dir=models_dir, target=None)).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: UvicornThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, trust_env=False, timeout=30.0) as c:
        yield c


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _post_raw(c: httpx.Client, path: str, text: str) -> httpx.Response:
    return c.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


# ---------------------------------------------------------------------------------------------- health
def test_healthz_and_docs(client: httpx.Client) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    h = r.json()
    assert h["status"] == "ok" and h["models_loaded"] == 1 and h["default_model_id"]
    assert h["version"] == graphmode.__version__ and h["synthetic_model"] is True
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert {
        "/v1/recommend",
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/retrain",
        "/v1/jobs/{job_id}",
        "/v1/reload",
        "/healthz",
    } <= set(spec["paths"])
    schemas = spec["components"]["schemas"]
    assert "RecommendRequest" in schemas and "RecommendResponse" in schemas
    assert {"mode", "compilation_config"} <= set(schemas["RecommendResponse"]["properties"])
    assert "mode" not in schemas["RecommendRequest"]["properties"]
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


# ---------------------------------------------------------------------------------------------- recommend
def _check_answer(ans: dict[str, Any]) -> None:
    assert ans["mode"] in MODES
    assert json.loads(ans["compilation_config"]) == {"cudagraph_mode": ans["mode"]}
    assert sorted(p["mode"] for p in ans["predictions"]) == MODES
    assert ans["predictions"][0]["mode"] == ans["mode"]
    assert ans["confidence"]["level"] in ("high", "medium", "low")
    assert ans["model_id"] and ans["fingerprint_keys"] and ans["fingerprint_match"]
    assert "gain_vs_default_pct" in ans and ans["default_mode"] in MODES
    assert any("SYNTHETIC" in w for w in ans["warnings"])


def test_recommend_workload(client: httpx.Client) -> None:
    r = client.post("/v1/recommend", json={"workload": GOOD_WORKLOAD})
    assert r.status_code == 200, r.text
    ans = r.json()
    _check_answer(ans)
    assert ans["features_source"] == "description"
    assert ans["features"]["arrival_rate"] == pytest.approx(8.0)


def test_recommend_for_the_served_model(client: httpx.Client) -> None:
    mixtral = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
               "num_local_experts": 8, "vocab_size": 32000}
    r = client.post("/v1/recommend", json={"workload": GOOD_WORKLOAD, "served_model_config": mixtral})
    assert r.status_code == 200, r.text
    ans = r.json()
    _check_answer(ans)
    assert any("unlike any this model was trained on" in w and "MixtralForCausalLM" in w for w in ans["warnings"])
    r = client.post("/v1/recommend", json={"workload": GOOD_WORKLOAD, "served_model_config": {"foo": 1}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "served_model_config"]


def test_recommend_features_with_objective(client: httpx.Client) -> None:
    body = {
        "features": GOOD_FEATURES,
        "objective": {
            "metric": "throughput",
            "constraints": ["ttft_p99<=2s", "graph_gib <= 1GiB"],
            "memory_weight": 0.1,
        },
    }
    r = client.post("/v1/recommend", json=body)
    assert r.status_code == 200, r.text
    ans = r.json()
    _check_answer(ans)
    assert ans["features_source"] == "observed"
    assert ans["objective"]["metric"] == "output_tok_s"  # the alias resolved
    assert [c["metric"] for c in ans["objective"]["constraints"]] == ["ttft_p99", "graph_gib"]
    assert ans["objective"]["constraints"][0]["value"] == pytest.approx(2.0)
    # Only the objective's metric and no constraint: the model's default metric stays for "metric": null.
    r = client.post("/v1/recommend", json={"features": GOOD_FEATURES, "objective": {"max_graph_gib": 0.3}})
    assert r.status_code == 200 and r.json()["objective"]["metric"] == "itl_p50"


def test_recommend_server_url(client: httpx.Client) -> None:
    vllm = FakeVllmMetrics()
    with vllm.serving() as url:
        r = client.post("/v1/recommend", json={"server_url": url, "window_s": 1.0, "interval_s": 0.25})
        assert r.status_code == 200, r.text
        assert vllm.scrapes >= 2
    ans = r.json()
    _check_answer(ans)
    assert ans["features_source"] == "server"
    f = ans["features"]
    assert f["n_samples"] >= 2 and f["arrival_rate"] > 0
    assert f["mean_input_tokens"] == pytest.approx(512) and f["mean_output_tokens"] == pytest.approx(128)
    assert f["prefill_decode_ratio"] == pytest.approx(4.0)


def test_recommend_server_url_unreachable(client: httpx.Client) -> None:
    r = client.post("/v1/recommend", json={"server_url": f"127.0.0.1:{free_port()}", "window_s": 1, "interval_s": 0.5})
    assert r.status_code == 502 and "could not scrape" in r.json()["detail"]


def test_recommend_server_url_outside_the_allowed_hosts_is_refused(client: httpx.Client) -> None:
    # the default list is loopback only: nothing is fetched from elsewhere, whatever the port
    for url in ("http://169.254.169.254", "10.0.0.5:8000", "http://internal.example:80/metrics"):
        r = client.post("/v1/recommend", json={"server_url": url, "window_s": 1, "interval_s": 0.5})
        assert r.status_code == 403, (url, r.text)
        assert "scrape_hosts" in r.json()["detail"] and "not one this service may scrape" in r.json()["detail"]


def test_recommend_model_id(client: httpx.Client) -> None:
    mid = client.get("/healthz").json()["default_model_id"]
    r = client.post("/v1/recommend", json={"workload": GOOD_WORKLOAD, "model_id": mid})
    assert r.status_code == 200 and r.json()["model_id"] == mid
    r = client.post("/v1/recommend", json={"workload": GOOD_WORKLOAD, "model_id": "no-such-model"})
    assert r.status_code == 404 and mid in r.json()["detail"]


BAD: list[tuple[str, str, list[Any], str]] = [
    ("nan", '{"features": {"arrival_rate": NaN}}', ["body", "features", "arrival_rate"], "finite"),
    (
        "inf",
        '{"workload": {"rate": Infinity, "input_tokens": 5, "output_tokens": 5}}',
        ["body", "workload", "rate"],
        "finite",
    ),
    (
        "huge",
        '{"workload": {"rate": 1e400, "input_tokens": 5, "output_tokens": 5}}',
        ["body", "workload", "rate"],
        "finite",
    ),
    (
        "negative rate",
        '{"workload": {"rate": -2, "input_tokens": 5, "output_tokens": 5}}',
        ["body", "workload", "rate"],
        "greater than 0",
    ),
    (
        "negative feature",
        '{"features": {"arrival_rate": 3, "batch_mean": -1}}',
        ["body", "features", "batch_mean"],
        ">= 0",
    ),
    (
        "unknown metric",
        '{"workload": {"rate": 2, "input_tokens": 5, "output_tokens": 5}, "objective": {"metric": "goodput"}}',
        ["body", "objective", "metric"],
        "known: ttft_p50",
    ),
    (
        "bad constraint",
        '{"features": {"arrival_rate": 3}, "objective": {"constraints": ["itl_p50<=1ms", "vibes>=3"]}}',
        ["body", "objective", "constraints", 1],
        "unknown metric 'vibes'",
    ),
    (
        "negative weight",
        '{"features": {"arrival_rate": 3}, "objective": {"memory_weight": -1}}',
        ["body", "objective", "memory_weight"],
        "greater than or equal to 0",
    ),
    (
        "two inputs",
        '{"features": {"arrival_rate": 3}, "workload": {"rate": 2, "input_tokens": 5, "output_tokens": 5}}',
        ["body"],
        "exactly one of features, workload, server_url",
    ),
    ("no input", '{"objective": {"metric": "itl_p50"}}', ["body"], "exactly one"),
    ("unknown field", '{"features": {"arrival_rate": 3, "qps": 9}}', ["body", "features", "qps"], "Extra inputs"),
    ("empty features", '{"features": {}}', ["body", "features"], "at least one traffic feature"),
    ("window without url", '{"features": {"arrival_rate": 3}, "window_s": 5}', ["body"], "only with server_url"),
    ("bad url", '{"server_url": "ftp://host/metrics"}', ["body", "server_url"], "http://"),
    ("bad model id", '{"features": {"arrival_rate": 3}, "model_id": "../etc"}', ["body", "model_id"], "pattern"),
    ("not json", '{"features": ', ["body", 13], "JSON decode error: Expecting value"),
]


@pytest.mark.parametrize(("text", "loc", "needle"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_recommend_rejects_bad_bodies(client: httpx.Client, text: str, loc: list[Any], needle: str) -> None:
    r = _post_raw(client, "/v1/recommend", text)
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    match = [e for e in errors if e["loc"] == loc]
    assert match, errors
    assert any(needle in e["msg"] for e in match), match


def test_unknown_mode_in_retrain_is_422(client: httpx.Client) -> None:
    body = {"vllm_args": ["--model", "/m"], "modes": ["full", "TURBO"]}
    r = client.post("/v1/retrain", json=body, headers=AUTH)
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "modes", 1] and "expected one of NONE, PIECEWISE" in err["msg"]


def test_body_size_limit(client: httpx.Client, server: UvicornThread) -> None:
    limit = Settings().service.max_body_bytes
    pad = "x" * (limit + 10)
    r = client.post(
        "/v1/recommend",
        content=json.dumps({"features": {"arrival_rate": 1}, "p": pad}),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413 and str(limit) in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        yield b'{"features": {"arrival_rate": 1}, "p": "'
        for _ in range(limit // 1000 + 2):
            yield b"y" * 1000
        yield b'"}'

    with httpx.Client(trust_env=False) as c:
        r = c.post(server.url + "/v1/recommend", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    # Just under the limit is read and validated (422: unknown field), not refused.
    small = json.dumps({"features": {"arrival_rate": 1}, "p": "z" * (limit - 200)})
    assert _post_raw(client, "/v1/recommend", small).status_code == 422
    # The server is fine afterwards.
    assert client.post("/v1/recommend", json={"workload": GOOD_WORKLOAD}).status_code == 200


def test_concurrent_requests_during_reload(client: httpx.Client, server: UvicornThread) -> None:
    """Requests in flight while the models are swapped all get complete answers."""

    def one(i: int) -> int:
        with httpx.Client(base_url=server.url, trust_env=False, timeout=30) as c:
            codes = []
            for _ in range(10):
                codes.append(c.post("/v1/recommend", json={"workload": {**GOOD_WORKLOAD, "rate": 1 + i}}).status_code)
            return max(codes)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        for _ in range(3):
            assert client.post("/v1/reload", headers=AUTH).status_code == 200
        assert all(f.result() == 200 for f in futures)


# ---------------------------------------------------------------------------------------------- models
def test_models_endpoints(client: httpx.Client, models_dir: Path) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200
    listing = r.json()
    assert listing["models_dir"] == models_dir.name  # the folder's name only: the endpoint is open
    assert str(models_dir.parent) not in r.text and str(models_dir.parent) not in client.get("/healthz").text
    (m,) = listing["models"]
    assert m["loaded"] and m["default"] and m["synthetic"] and m["model_id"] == listing["default_model_id"]
    assert sorted(m["modes"]) == MODES and m["rows_used"] > 0
    card = client.get(f"/v1/models/{m['model_id']}")
    assert card.status_code == 200
    ModelCard.model_validate(card.json())  # the full card, its paths reduced to their last component
    assert card.json()["model_id"] == m["model_id"]
    assert str(models_dir.parent) not in card.text
    assert client.get("/v1/models/nope").status_code == 404
    assert client.get("/v1/models/bad$id").status_code == 422


# ---------------------------------------------------------------------------------------------- auth
def test_auth_on_mutating_endpoints(client: httpx.Client) -> None:
    for method, path in (
        ("POST", "/v1/reload"),
        ("POST", "/v1/retrain"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/abc123"),
    ):
        r = client.request(method, path)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = client.request(method, path, headers={"Authorization": "Bearer wrong-token"})
        assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]
        r = client.request(method, path, headers={"Authorization": f"Basic {TOKEN}"})
        assert r.status_code == 401
    r = client.post("/v1/reload", headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["models_loaded"] == 1 and r.json()["default_model_id"]
    assert client.post("/v1/reload", headers={"Authorization": f"Bearer {TOKEN}x"}).status_code == 401
    # Non-ASCII tokens are compared as bytes, not rejected with a 500.
    r = client.post("/v1/reload", headers={b"Authorization": "Bearer t\u00f6ken".encode()})
    assert r.status_code == 401


def test_no_token_configured_disables_mutations(open_server: UvicornThread) -> None:
    with httpx.Client(base_url=open_server.url, trust_env=False) as c:
        for method, path in (("POST", "/v1/reload"), ("POST", "/v1/retrain"), ("GET", "/v1/jobs/abc")):
            for headers in ({}, AUTH, {"Authorization": "Basic abc"}):
                r = c.request(method, path, headers=headers)
                assert r.status_code == 403, (path, r.text)
                assert "no service token is configured" in r.json()["detail"]
        assert c.post("/v1/recommend", json={"workload": GOOD_WORKLOAD}).status_code == 200  # reading is open


# ---------------------------------------------------------------------------------------------- metrics
def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_requests(client: httpx.Client) -> None:
    before = client.get("/metrics").text
    for _ in range(3):
        assert client.post("/v1/recommend", json={"workload": GOOD_WORKLOAD}).status_code == 200
    assert _post_raw(client, "/v1/recommend", '{"features": {"arrival_rate": NaN}}').status_code == 422
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    after = r.text
    route = {"method": "POST", "route": "/v1/recommend"}

    def delta(name: str, **labels: str) -> float:
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    assert delta("graphmode_http_requests_total", **route, status="200") == 3
    assert delta("graphmode_http_requests_total", **route, status="422") == 1
    assert delta("graphmode_http_request_duration_seconds_count", **route) == 4
    mode = client.post("/v1/recommend", json={"workload": GOOD_WORKLOAD}).json()["mode"]
    final = client.get("/metrics").text
    assert _sample(final, "graphmode_recommendations_total", mode=mode, source="description") >= 4
    assert _sample(final, "graphmode_model_info", default="true", synthetic="true") == 1
    assert _sample(final, "graphmode_models_loaded") == 1
    assert _sample(final, "graphmode_recommend_compute_seconds_count") >= 4
    # Route templates, not raw paths, label the requests.
    client.get("/v1/models/whatever")
    assert 'route="/v1/models/{model_id}"' in client.get("/metrics").text
    assert "/v1/models/whatever" not in client.get("/metrics").text


# ---------------------------------------------------------------------------------------------- retrain
class FakeRetrain:
    """Stands in for graphmode.selector.retrain: reports cells, waits for ``release``, returns the
    session model's card as the "trained" one."""

    def __init__(self, models_dir: Path, *, fail: bool = False, cells: int = 4) -> None:
        self.models_dir = models_dir
        self.fail = fail
        self.cells = cells
        self.release = threading.Event()
        self.started = threading.Event()
        self.calls: list[tuple[ProfileConfig, dict[str, Any]]] = []

    def __call__(self, config: ProfileConfig, **kw: Any) -> Any:
        from types import SimpleNamespace

        from graphmode.core.records import CellRecord

        self.calls.append((config, kw))
        reporter, progress = kw["reporter"], kw["progress"]
        mode = config.modes[0]
        reporter.mode_starting(mode, self.cells)
        for i in range(self.cells):
            w = config.workloads[i % len(config.workloads)]
            reporter.cell_starting(mode, w, 0)
            reporter.cell_finished(
                CellRecord(
                    run_id="fake",
                    profile_key="k",
                    mode=mode.value,
                    workload=w.name,
                    workload_spec=w.spec(),
                    repeat=0,
                    status="ok",
                    started_at=0.0,
                    finished_at=0.0,
                )
            )
            if i == 1:
                self.started.set()
                assert self.release.wait(20), "test never released the fake retrain"
        if self.fail:
            from graphmode.core.errors import EngineStartError

            raise EngineStartError("vLLM exited during start-up (fake)")
        progress("training on 4 rows")
        folder = next(p for p in self.models_dir.iterdir() if (p / "card.json").is_file())
        card = ModelCard.load(folder)
        summary = ProfileSummary(run_id="fake-run", profile_key="k", ok=self.cells, engine_starts=1, wall_s=0.1)
        return SimpleNamespace(
            profile=summary,
            train=SimpleNamespace(model_id=card.model_id, out_dir=folder, card=card),
            dataset=self.models_dir / "_profiles" / "k.sqlite",
        )


def _wait_job(c: httpx.Client, job_id: str, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        r = c.get(f"/v1/jobs/{job_id}", headers=AUTH)
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()
        if until(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.02)


RETRAIN_BODY = {
    "vllm_command": "/opt/vllm/bin/vllm serve",
    "vllm_args": ["--model", "/models/tiny", "--max-model-len", "2048"],
    "workloads": ["chat-r2-b1", "chat-r8-b1"],
    "modes": ["full_and_piecewise", "CUDAGraphMode.NONE"],
    "repeats": 2,
}


def test_retrain_job_lifecycle(client: httpx.Client, models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRetrain(models_dir)
    monkeypatch.setattr(graphmode.selector, "retrain", fake)
    loaded_at = client.get("/healthz").json()["loaded_at"]
    r = client.post("/v1/retrain", json=RETRAIN_BODY, headers=AUTH)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] in ("queued", "running") and job["kind"] == "retrain"
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["progress"]["cells_planned"] == 2 * 2 * 2  # workloads × repeats × modes
    assert fake.started.wait(10)
    # Busy: a second job is refused, whoever asks.
    r2 = client.post("/v1/retrain", json=RETRAIN_BODY, headers=AUTH)
    assert r2.status_code == 409 and job["id"] in r2.json()["detail"]
    running = _wait_job(client, job["id"], lambda j: j["progress"]["cells_done"] >= 2)
    assert running["status"] == "running" and running["progress"]["phase"] == "profiling"
    assert running["progress"]["current"].startswith("FULL_AND_PIECEWISE")
    assert client.get("/healthz").json()["job_running"] == job["id"]
    fake.release.set()
    done = _wait_job(client, job["id"], lambda j: j["status"] not in ("queued", "running"))
    assert done["status"] == "succeeded", done
    assert done["error"] is None and done["finished_at"] >= done["started_at"]
    res = done["result"]
    assert res["model_id"] and res["reloaded"] is True and res["profile"]["ok"] == 4
    assert done["progress"]["cells_done"] == 4 and done["progress"]["phase"] == "done"
    assert any("training" in m for m in done["progress"]["messages"])
    assert client.get("/healthz").json()["loaded_at"] > loaded_at  # the models were reloaded
    # What reached retrain: the plan built from the request and the settings.
    config, kw = fake.calls[0]
    assert config.command == ["/opt/vllm/bin/vllm", "serve"]
    assert config.vllm_args == RETRAIN_BODY["vllm_args"]
    assert [m.value for m in config.modes] == ["FULL_AND_PIECEWISE", "NONE"]
    assert [w.name for w in config.workloads] == ["chat-r2-b1", "chat-r8-b1"] and config.repeats == 2
    assert kw["models_dir"] == models_dir and kw["resume"] is True
    listed = client.get("/v1/jobs", headers=AUTH).json()["jobs"]
    assert listed[0]["id"] == job["id"]
    # A new job may start now.
    fake2 = FakeRetrain(models_dir, cells=2)
    fake2.release.set()
    monkeypatch.setattr(graphmode.selector, "retrain", fake2)
    r = client.post("/v1/retrain", json={**RETRAIN_BODY, "reload": False}, headers=AUTH)
    assert r.status_code == 202
    done2 = _wait_job(client, r.json()["id"], lambda j: j["status"] == "succeeded")
    assert done2["result"]["reloaded"] is False


def test_retrain_job_failure_and_cancel(
    client: httpx.Client, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeRetrain(models_dir, fail=True)
    fake.release.set()
    monkeypatch.setattr(graphmode.selector, "retrain", fake)
    r = client.post("/v1/retrain", json=RETRAIN_BODY, headers=AUTH)
    assert r.status_code == 202
    failed = _wait_job(client, r.json()["id"], lambda j: j["status"] not in ("queued", "running"))
    assert failed["status"] == "failed" and "vLLM exited during start-up" in failed["error"]
    assert failed["result"] is None
    # Cancel: takes effect at the next cell.
    fake = FakeRetrain(models_dir, cells=50)
    monkeypatch.setattr(graphmode.selector, "retrain", fake)
    r = client.post("/v1/retrain", json=RETRAIN_BODY, headers=AUTH)
    job_id = r.json()["id"]
    assert fake.started.wait(10)
    r = client.delete(f"/v1/jobs/{job_id}", headers=AUTH)
    assert r.status_code == 200 and r.json()["cancel_requested"] is True
    fake.release.set()
    cancelled = _wait_job(client, job_id, lambda j: j["status"] not in ("queued", "running"))
    assert cancelled["status"] == "cancelled" and cancelled["progress"]["cells_done"] < 50
    assert client.get("/v1/jobs/0123456789ab", headers=AUTH).status_code == 404
    text = client.get("/metrics").text
    assert _sample(text, "graphmode_jobs_total", kind="retrain", status="cancelled") >= 1
    assert _sample(text, "graphmode_jobs_total", kind="retrain", status="failed") >= 1


def test_retrain_request_problems_are_422(client: httpx.Client) -> None:
    cases = [
        ({"vllm_args": ["--max-model-len", "2048"]}, ["body", "vllm_args"], "no model"),
        ({"vllm_args": ["--model", "/m"], "workloads": ["nope"]}, ["body", "workloads"], "not in grid"),
        ({"vllm_args": ["--model", "/m"], "grid_path": "/no/grid.yaml"}, ["body", "grid_path"], "grids folder"),
        ({"vllm_args": ["--model", "/m"], "repeats": 0}, ["body", "repeats"], "greater than or equal to 1"),
        (
            {
                "vllm_args": ["--model", "/m"],
                "grid": {"workloads": [{"name": "x", "rate": -1, "input": {"mean": 8}, "output": {"mean": 8}}]},
            },
            ["body", "grid", "workloads", 0, "rate"],
            "greater than 0",
        ),
    ]
    for body, loc, needle in cases:
        r = client.post("/v1/retrain", json=body, headers=AUTH)
        assert r.status_code == 422, (body, r.text)
        errs = [e for e in r.json()["detail"] if e["loc"] == loc]
        assert errs and needle in errs[0]["msg"], r.json()


# ---------------------------------------------------------------------------------------------- start-up
def test_no_models_starts_degraded(tmp_path: Path) -> None:
    srv = UvicornThread(create_app(_settings(TOKEN), models_dir=tmp_path / "empty", target=None)).start()
    try:
        with httpx.Client(base_url=srv.url, trust_env=False) as c:
            r = c.get("/healthz")
            assert r.status_code == 503 and r.json()["status"] == "no_models"
            assert "no trained model" in r.json()["load_error"]
            r = c.post("/v1/recommend", json={"workload": GOOD_WORKLOAD})
            assert r.status_code == 503 and "no model loaded" in r.json()["detail"]
            assert c.get("/v1/models").json()["models"] == []
    finally:
        srv.stop()


def test_missing_explicit_model_fails_startup(models_dir: Path) -> None:
    srv = UvicornThread(create_app(_settings(None), models_dir=models_dir, model_id="nope", target=None))
    with pytest.raises(RuntimeError, match=r"start-up \(exit code 3\)"):
        srv.start()
    srv.stop()


def test_graphmode_serve_cli(models_dir: Path, tmp_path: Path) -> None:
    """`graphmode serve` as a separate process: binds loopback, serves, stops on SIGTERM."""
    port = free_port()
    env = {**os.environ, "GRAPHMODE_SERVICE__TOKEN": TOKEN}
    cmd = [
        sys.executable,
        "-c",
        "from graphmode.cli.main import app; app()",
        "serve",
        "--port",
        str(port),
        "--models-dir",
        str(models_dir),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        with httpx.Client(trust_env=False) as c:
            while True:
                try:
                    if c.get(url + "/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert c.post(url + "/v1/recommend", json={"workload": GOOD_WORKLOAD}).status_code == 200
            assert c.post(url + "/v1/reload", headers=AUTH).status_code == 200
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0].decode()
    assert proc.returncode in (0, -signal.SIGTERM), out  # uvicorn re-raises the signal after a clean stop
    assert f"http://127.0.0.1:{port}" in out and "token configured" in out
