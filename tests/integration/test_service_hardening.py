"""Issue 12 (hardening) through a real uvicorn on loopback: large numbers, lone surrogates, typed
served_model_config, a clean 500 on a connection that stays usable, /metrics-only scrapes that never
quote what they fetched, the open window cap and the 429 of full scrape slots, two retrain jobs in a row
through the real ``graphmode.selector.retrain`` against ``tests/support/fake_vllm.py``, cancel and SIGTERM that
stop the job's engine, slow clients (raw sockets), grid files, and strict numbers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

import graphmode.service.routers.recommend as recommend_router
from graphmode.core.settings import Settings
from graphmode.service.app import create_app
from graphmode.service.server import uvicorn_config
from tests.integration.test_service_uvicorn import (  # noqa: F401 (models_dir is a fixture)
    AUTH,
    GOOD_FEATURES,
    GOOD_WORKLOAD,
    TOKEN,
    FakeVllmMetrics,
    UvicornThread,
    _settings,
    models_dir,
)
from tests.support.net import free_port
from tests.unit.test_service_hardening import FAKE_ENGINE, alive, wait_for

REPO = Path(__file__).resolve().parents[2]
FAKE_VLLM = REPO / "tests" / "support" / "fake_vllm.py"
TINY_LLAMA = REPO / "tests" / "fixtures" / "tiny-llama"
SECRET = "TOP-SECRET-7f3a9c"


class BoundedUvicornThread(UvicornThread):
    """UvicornThread run with ``graphmode serve``'s uvicorn configuration (client limits)."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        super().__init__(app)
        self.server = uvicorn.Server(uvicorn_config(app, settings, log_level="warning", lifespan="on"))


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[UvicornThread]:  # noqa: F811
    srv = UvicornThread(create_app(_settings(TOKEN), models_dir=models_dir, target=None)).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: UvicornThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, trust_env=False, timeout=30.0) as c:
        yield c


def _post_raw(c: httpx.Client, text: str, path: str = "/v1/recommend") -> httpx.Response:
    return c.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


# ---------------------------------------------------------------------------------------------- 1-3
@pytest.mark.parametrize(
    ("features", "loc"),
    [
        ({"batch_cv": 1e200}, "batch_cv"),
        ({"batch_cv": 1e154}, "batch_cv"),
        ({n: 1e154 for n in GOOD_FEATURES}, "arrival_rate"),
    ],
)
def test_large_finite_features_are_422(client: httpx.Client, features: dict[str, float], loc: str) -> None:
    r = client.post("/v1/recommend", json={"features": features})
    assert r.status_code == 422, r.text
    assert any(e["loc"] == ["body", "features", loc] and "must be <=" in e["msg"] for e in r.json()["detail"])


def test_features_at_their_bounds_are_answered(client: httpx.Client) -> None:
    from graphmode.core.records import ObservedFeatures
    from graphmode.service.schemas import FEATURE_MAX, FEATURE_MAX_BY_NAME

    top = {n: FEATURE_MAX_BY_NAME.get(n, FEATURE_MAX) for n in ObservedFeatures.model_fields if n != "n_samples"}
    r = client.post("/v1/recommend", json={"features": top})
    # Within the schema's bounds the arithmetic holds: an answer that says the input is out of range, or a
    # 422 that says no prediction is possible that far out (the synthetic model's ridge overflows there).
    if r.status_code == 200:
        assert r.json()["confidence"]["out_of_range"]
    else:
        assert r.status_code == 422, r.text
        assert "too far outside what model" in r.json()["detail"][0]["msg"]
    half = {n: 50.0 for n in GOOD_FEATURES}
    r = client.post("/v1/recommend", json={"features": half})
    assert r.status_code == 200 and r.json()["confidence"]["out_of_range"], r.text


@pytest.mark.parametrize(
    "text",
    [
        '{"workload": {"rate": 2, "input_tokens": 5, "output_tokens": 5}, "objective": {"metric": "\\ud800"}}',
        '{"workload": {"rate": "\\ud800", "input_tokens": 5, "output_tokens": 5}}',
        '{"features": {"arrival_rate": 3, "\\ud800": 1}}',
        '{"server_url": "http://\\ud800:8000"}',
        '{"server_url": "\\udfff://x"}',
        '{"features": {"arrival_rate": 3}, "model_id": "\\ud800"}',
        '{"features": {"arrival_rate": 3}, "served_model_config": {"architectures": ["\\ud800"], "x": "\\ud800"},'
        ' "objective": {"constraints": ["\\ud800"]}}',
    ],
)
def test_lone_surrogates_get_a_422(client: httpx.Client, text: str) -> None:
    r = _post_raw(client, text)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


def test_non_string_architecture_is_422(client: httpx.Client) -> None:
    body = {"workload": GOOD_WORKLOAD, "served_model_config": {"architectures": [{"a": 1}]}}
    r = client.post("/v1/recommend", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "served_model_config", "architectures", 0]


@pytest.mark.parametrize(
    "body",
    [
        {"workload": {**GOOD_WORKLOAD, "rate": "8"}},
        {"workload": {**GOOD_WORKLOAD, "rate": True}},
        {"features": {**GOOD_FEATURES, "batch_mean": "3"}},
        {"workload": GOOD_WORKLOAD, "objective": {"memory_weight": "0.5"}},
    ],
)
def test_numbers_given_as_strings_or_booleans_are_422(client: httpx.Client, body: dict[str, Any]) -> None:
    assert client.post("/v1/recommend", json=body).status_code == 422


# ---------------------------------------------------------------------------------------------- 4
def _raw_request(sock: socket.socket, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    head = (f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    sock.sendall(head.encode() + body)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response to {method} {path}"
        data += chunk
    raw_head, rest = data.split(b"\r\n\r\n", 1)
    lines = raw_head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    return status, headers, rest[:length]


def test_unexpected_error_is_json_500_on_a_connection_that_stays_usable(
    server: UvicornThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("an unforeseen bug")

    body = json.dumps({"workload": GOOD_WORKLOAD}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        monkeypatch.setattr(recommend_router, "answer", broken)
        status, headers, payload = _raw_request(sock, "POST", "/v1/recommend", body)
        assert status == 500 and headers["content-type"] == "application/json"
        assert headers.get("connection", "").lower() != "close"
        assert "RuntimeError" in json.loads(payload)["detail"] and "unforeseen" not in payload.decode()
        monkeypatch.undo()
        status, _, payload = _raw_request(sock, "POST", "/v1/recommend", body)  # same connection
        assert status == 200 and json.loads(payload)["mode"]
        status, _, _ = _raw_request(sock, "GET", "/healthz")
        assert status == 200


# ---------------------------------------------------------------------------------------------- 5
class SecretServer:
    """A loopback HTTP service with a secret at /secret, and a /metrics that is not Prometheus text."""

    def __init__(self, metrics_status: int = 200) -> None:
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits.append(self.path)
                body = f"<html>{SECRET} {SECRET}</html>\n".encode()
                self.send_response(metrics_status if self.path.startswith("/metrics") else 200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("metrics_status", [200, 500])
def test_scrapes_read_only_metrics_and_never_quote_it(client: httpx.Client, metrics_status: int) -> None:
    secret = SecretServer(metrics_status)
    try:
        base = f"http://127.0.0.1:{secret.port}"
        for url in (f"{base}/secret?", f"{base}/secret", f"{base}/metrics?x", f"{base}/#f", f"http://u:p@127.0.0.1:{secret.port}"):
            r = client.post("/v1/recommend", json={"server_url": url, "window_s": 1, "interval_s": 1})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "server_url"], (url, r.text)
        assert secret.hits == []  # refused before anything was fetched
        r = client.post("/v1/recommend", json={"server_url": base, "window_s": 0.2, "interval_s": 0.2})
        assert r.status_code == 502, r.text
        assert SECRET not in r.text and "could not scrape" in r.json()["detail"]
        # /metrics, and /version for the model of the server's release (nothing else, never quoted)
        assert "/metrics" in secret.hits and set(secret.hits) <= {"/metrics", "/version"}
    finally:
        secret.close()


def test_a_server_without_vllm_metrics_is_422(client: httpx.Client, server: UvicornThread) -> None:
    """The service's own /metrics is Prometheus text with no vLLM metric: nothing about traffic was
    observed, which is a 422 as for a features body without a traffic feature."""
    r = client.post("/v1/recommend", json={"server_url": server.url, "window_s": 0.3, "interval_s": 0.1})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "server_url"] and "no vLLM traffic metrics were observed" in err["msg"]


def test_scrape_port_allow_list(models_dir: Path) -> None:  # noqa: F811
    srv = UvicornThread(create_app(_settings(None, scrape_ports=[1]), models_dir=models_dir, target=None)).start()
    try:
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            r = c.post("/v1/recommend", json={"server_url": srv.url, "window_s": 1, "interval_s": 1})
            assert r.status_code == 403 and "scrape_ports" in r.json()["detail"]
    finally:
        srv.stop()


# ---------------------------------------------------------------------------------------------- 6
def test_open_window_cap_and_full_slots(models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(recommend_router, "MAX_CONCURRENT_SCRAPES", 1)
    app = create_app(_settings(TOKEN, open_max_window_s=0.5), models_dir=models_dir, target=None)
    srv = UvicornThread(app).start()
    try:
        vllm = FakeVllmMetrics()
        with vllm.serving() as vllm_url, httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            long = {"server_url": vllm_url, "window_s": 1.5, "interval_s": 0.25}
            r = c.post("/v1/recommend", json=long)
            assert r.status_code == 422 and "needs the service token" in r.json()["detail"][0]["msg"]
            r = c.post("/v1/recommend", json=long, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 422
            results: list[httpx.Response] = []
            first = threading.Thread(target=lambda: results.append(c.post("/v1/recommend", json=long, headers=AUTH)))
            first.start()
            wait_for(lambda: vllm.scrapes >= 1, 10, "the first scrape")
            t0 = time.monotonic()
            with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c2:
                busy = c2.post("/v1/recommend", json={**long, "window_s": 0.5}, headers=AUTH)
            assert busy.status_code == 429 and time.monotonic() - t0 < 1.0  # at once, not queued
            assert 1 <= int(busy.headers["retry-after"]) <= 2
            first.join(20)
            assert results[0].status_code == 200, results[0].text
    finally:
        srv.stop()


# ---------------------------------------------------------------------------------------------- 7-9
def _job_settings(tmp_path: Path, **vllm: Any) -> Settings:
    s = _settings(TOKEN)
    s.profile.log_dir = tmp_path / "logs"
    s.vllm.port = free_port()
    for k, v in vllm.items():
        setattr(s.vllm, k, v)
    return s


def _wait_job(c: httpx.Client, job_id: str, timeout: float, until: Any) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = c.get(f"/v1/jobs/{job_id}", headers=AUTH).json()
        if until(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def _tiny_grid(names: list[str]) -> dict[str, Any]:
    return {
        "name": "tiny",
        "workloads": [
            {"name": n, "rate": 6 + 2 * i, "burstiness": 1.0, "input": {"mean": 16 + 48 * i}, "output": {"mean": 8},
             "duration_s": 1.0, "warmup_s": 0.2}
            for i, n in enumerate(names)
        ],
    }


@pytest.mark.timeout(300)
def test_two_retrain_jobs_in_a_row_through_the_real_retrain(models_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """No stand-in for graphmode.selector.retrain: the job profiles tests/support/fake_vllm.py and trains; the
    second job (resuming: nothing left to profile) must find ``retrain`` still a function."""
    root = tmp_path / "models"
    shutil.copytree(models_dir, root)
    settings = _job_settings(tmp_path, startup_timeout_s=60.0, stop_timeout_s=10.0)
    srv = UvicornThread(create_app(settings, models_dir=root, target=None)).start()
    body = {
        "vllm_command": [sys.executable, str(FAKE_VLLM)],
        "vllm_args": ["--model", str(TINY_LLAMA), "--max-model-len", "2048"],
        "grid": _tiny_grid(["a", "b", "c"]),
        "modes": ["FULL", "NONE"],
        "regressor": "mean",
    }
    try:
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            for n in (1, 2):
                r = c.post("/v1/retrain", json=body, headers=AUTH)
                assert r.status_code == 202, r.text
                job = _wait_job(c, r.json()["id"], 200, lambda j: j["status"] not in ("queued", "running"))
                assert job["status"] == "succeeded", (n, job["error"])
                result = job["result"]
                assert result["reloaded"] is True and result["model_id"]
                assert result["profile"]["ok"] == (6 if n == 1 else 0)
                assert result["profile"]["skipped"] == (0 if n == 1 else 6)
    finally:
        srv.stop()


def _engine_body(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE)
    pidfile = tmp_path / "engine.pids"
    body = {
        "vllm_command": [sys.executable, str(script), str(pidfile)],
        "vllm_args": ["--model", str(TINY_LLAMA)],
        "grid": _tiny_grid(["a"]),
        "modes": ["FULL", "NONE"],
    }
    return body, pidfile


def _engine_pids(pidfile: Path) -> list[int]:
    wait_for(pidfile.exists, 30, "the fake engine to start")
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    return pids


@pytest.mark.timeout(120)
def test_cancel_during_engine_startup_is_prompt(models_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    settings = _job_settings(tmp_path)  # startup_timeout_s stays 900 s, stop_timeout_s 30 s
    srv = UvicornThread(create_app(settings, models_dir=models_dir, target=None)).start()
    body, pidfile = _engine_body(tmp_path)
    try:
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            r = c.post("/v1/retrain", json=body, headers=AUTH)
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            pids = _engine_pids(pidfile)
            t0 = time.monotonic()
            r = c.delete(f"/v1/jobs/{job_id}", headers=AUTH)
            assert r.status_code == 200 and r.json()["cancel_requested"] is True
            assert time.monotonic() - t0 < 1.0  # the DELETE does not wait for the engine
            job = _wait_job(c, job_id, 15, lambda j: j["status"] not in ("queued", "running"))
            assert job["status"] == "cancelled", job
            assert time.monotonic() - t0 < 10
            wait_for(lambda: not any(alive(p) for p in pids), 5, "the engine's process group to go")
            assert job["progress"]["cells_done"] <= 1
    finally:
        srv.stop()


@pytest.mark.timeout(120)
def test_sigterm_stops_the_job_engine_before_exit(models_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    port = free_port()
    env = {
        **os.environ,
        "GRAPHMODE_SERVICE__TOKEN": TOKEN,
        "GRAPHMODE_PROFILE__LOG_DIR": str(tmp_path / "logs"),
        "GRAPHMODE_VLLM__PORT": str(free_port()),
    }
    cmd = [sys.executable, "-c", "from graphmode.cli.main import app; app()", "serve", "--port", str(port),
           "--models-dir", str(models_dir), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    body, pidfile = _engine_body(tmp_path)
    pids: list[int] = []
    try:
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as c:
            def up() -> bool:
                assert proc.poll() is None
                try:
                    return c.get("/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(up, 60, "graphmode serve")
            r = c.post("/v1/retrain", json=body, headers=AUTH)
            assert r.status_code == 202, r.text
            pids = _engine_pids(pidfile)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode()
        assert proc.returncode in (0, -signal.SIGTERM), out
        dead = [p for p in pids if not alive(p)]
        assert dead == pids, f"engine processes left running after the service exited: {out}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- 10
@pytest.fixture
def bounded(models_dir: Path) -> Iterator[BoundedUvicornThread]:  # noqa: F811
    s = _settings(None, header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1.0, max_header_bytes=8192)
    srv = BoundedUvicornThread(create_app(s, models_dir=models_dir, target=None), s).start()
    yield srv
    srv.stop()


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closes ``sock`` within ``seconds`` (and what it sent first)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got


def test_incomplete_request_heads_are_cut_off(bounded: BoundedUvicornThread) -> None:
    socks = [socket.create_connection(("127.0.0.1", bounded.port)) for _ in range(20)]
    try:
        for s in socks:
            s.sendall(b"POST /v1/recommend HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finishes the head
        t0 = time.monotonic()
        for s in socks:
            closed, got = _closed_within(s, 5.0)
            assert closed and (got == b"" or got.startswith(b"HTTP/1.1 408")), got
        assert time.monotonic() - t0 < 5.0
    finally:
        for s in socks:
            s.close()
    assert httpx.get(bounded.url + "/healthz", trust_env=False).status_code == 200


def test_silent_connections_are_closed(bounded: BoundedUvicornThread) -> None:
    with socket.create_connection(("127.0.0.1", bounded.port)) as s:
        closed, _ = _closed_within(s, 5.0)
        assert closed


def test_short_bodies_time_out_with_408(bounded: BoundedUvicornThread) -> None:
    with socket.create_connection(("127.0.0.1", bounded.port)) as s:
        s.sendall(b"POST /v1/recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 500\r\n\r\n{\"features\": ")
        t0 = time.monotonic()
        closed, got = _closed_within(s, 6.0)
        assert closed and got.startswith(b"HTTP/1.1 408"), got
        assert time.monotonic() - t0 < 5.0


def test_oversized_heads_are_refused(bounded: BoundedUvicornThread) -> None:
    with socket.create_connection(("127.0.0.1", bounded.port)) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused while still sending
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n")
        closed, got = _closed_within(s, 5.0)
        assert closed and (got == b"" or got.startswith(b"HTTP/1.1 4")), got[:200]
    assert httpx.get(bounded.url + "/healthz", trust_env=False).status_code == 200


def test_keep_alive_still_works_under_the_limits(bounded: BoundedUvicornThread) -> None:
    with socket.create_connection(("127.0.0.1", bounded.port), timeout=10) as s:
        for _ in range(3):
            status, _, _ = _raw_request(s, "POST", "/v1/recommend", json.dumps({"workload": GOOD_WORKLOAD}).encode())
            assert status == 200
        closed, _ = _closed_within(s, 5.0)  # idle after its last response: keep_alive_s
        assert closed


# ---------------------------------------------------------------------------------------------- 11
def test_grid_path_outside_the_grids_folder_is_refused_unquoted(client: httpx.Client, tmp_path: Path) -> None:
    secret = tmp_path / "grid.yaml"
    secret.write_text(f"workloads: {SECRET}\n")
    for path in ("/etc/passwd", "/etc/shadow", str(secret), "../../etc/passwd.yaml"):
        r = client.post("/v1/retrain", json={"vllm_args": ["--model", "/m"], "grid_path": path}, headers=AUTH)
        assert r.status_code == 422, r.text
        assert "root:" not in r.text and SECRET not in r.text
        assert r.json()["detail"][0]["loc"] == ["body", "grid_path"]
