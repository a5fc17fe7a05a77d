"""Property-based fuzzing of ``POST /v1/recommend`` and ``POST /v1/retrain`` bodies against a real
uvicorn (issue 12): whatever the body, the answer is never a 5xx, always JSON, and never contains a
secret: neither the service token nor anything a loopback page holds.

Bodies are drawn three ways: arbitrary JSON (with lone surrogates, huge and tiny numbers, deep nesting),
well-formed requests with one field mutated into arbitrary JSON, and URLs aimed at a local "secret"
server. Examples are bounded and the deadline is off, so the module runs in a few seconds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphmode.service.app import create_app
from tests.integration.test_service_uvicorn import (  # noqa: F401 (models_dir is a fixture)
    AUTH,
    GOOD_FEATURES,
    GOOD_WORKLOAD,
    TOKEN,
    UvicornThread,
    _settings,
    models_dir,
)

SECRET = "FUZZ-SECRET-4b1d"
FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI failures reproduce
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


class _Secret(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"{SECRET}\nvllm:num_requests_running {SECRET}\n".encode()
        self.send_response(200 if self.path == "/metrics" else 403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def secret_port() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Secret)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def fuzz_client(models_dir: Path) -> Iterator[httpx.Client]:  # noqa: F811
    srv = UvicornThread(create_app(_settings(TOKEN), models_dir=models_dir, target=None)).start()
    with httpx.Client(base_url=srv.url, trust_env=False, timeout=30.0) as c:
        yield c
    srv.stop()


text = st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -0.0, 1e-320, 1e154, 1e200, 1.7976931348623157e308, 2**63, -1]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)


def _url(port: int) -> st.SearchStrategy[str]:
    base = f"127.0.0.1:{port}"
    return st.one_of(
        st.sampled_from(
            [f"http://{base}", f"http://{base}/metrics", f"http://{base}/secret", f"http://{base}/secret?",
             f"http://{base}/metrics#x", f"http://u:{SECRET}@{base}", f"{base}", "http://169.254.169.254",
             f"https://{base}", "http://[::1]:1", "http://localhost:0"]
        ),
        text.map(lambda t: f"http://{t}"),
        text,
    )


def _recommend_bodies(port: int) -> st.SearchStrategy[Any]:
    good: list[dict[str, Any]] = [
        {"workload": GOOD_WORKLOAD},
        {"features": GOOD_FEATURES},
        {"workload": GOOD_WORKLOAD, "objective": {"metric": "ttft_p99", "constraints": ["itl_p50<=5ms"],
                                                  "memory_weight": 0.5}},
        {"workload": GOOD_WORKLOAD, "served_model_config": {"architectures": ["LlamaForCausalLM"],
                                                            "hidden_size": 2048, "num_hidden_layers": 16}},
    ]

    @st.composite
    def mutated(draw: st.DrawFn) -> dict[str, Any]:
        body = json.loads(json.dumps(draw(st.sampled_from(good))))
        target = body
        key = draw(st.sampled_from(sorted(body)))
        if isinstance(body[key], dict) and body[key] and draw(st.booleans()):
            target, key = body[key], draw(st.sampled_from(sorted(body[key])))
        target[key] = draw(json_values)
        return body

    scrape = st.fixed_dictionaries(
        {"server_url": _url(port)},
        optional={"window_s": st.floats(0.05, 0.1), "interval_s": st.floats(0.05, 0.1), "model_id": text},
    )
    return st.one_of(json_values, mutated(), scrape, st.dictionaries(text, json_values, max_size=5))


def _retrain_bodies() -> st.SearchStrategy[Any]:
    # Fields that cannot start a job (a valid body with a model would profile): every body here is
    # either invalid or refused before any vLLM runs, so the test starts no process.
    return st.one_of(
        json_values,
        st.fixed_dictionaries(
            {},
            optional={
                "vllm_args": st.one_of(json_values, st.lists(text, max_size=3)),
                "grid_path": st.one_of(text, st.sampled_from(["/etc/passwd", "../../etc/shadow", "x.yaml"])),
                "modes": st.one_of(json_values, st.lists(st.sampled_from(["FULL", "none", "TURBO", ""]), max_size=3)),
                "repeats": json_values,
                "port": json_values,
                "grid": json_values,
                "objective": json_values,
                "regressor": text,
            },
        ),
    )


def _check(r: httpx.Response) -> None:
    # 502 is the one 5xx there is: the scraped server (not the service) failed, and the detail says so.
    scrape_failed = r.status_code == 502 and r.json()["detail"].startswith("could not scrape")
    assert r.status_code < 500 or scrape_failed, (r.status_code, r.text[:500])
    assert SECRET not in r.text and TOKEN not in r.text, r.text[:500]
    r.json()  # always JSON


@pytest.mark.timeout(120)
def test_fuzz_recommend(fuzz_client: httpx.Client, secret_port: int) -> None:
    @FUZZ
    @given(body=_recommend_bodies(secret_port))
    def run(body: Any) -> None:
        _check(fuzz_client.post("/v1/recommend", content=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"}))

    run()


@pytest.mark.timeout(120)
def test_fuzz_retrain(fuzz_client: httpx.Client) -> None:
    @FUZZ
    @given(body=_retrain_bodies())
    def run(body: Any) -> None:
        if isinstance(body, dict) and isinstance(body.get("vllm_args"), list):
            # no job may start: a model argument is what a valid request needs, so leave it out
            body["vllm_args"] = [a for a in body["vllm_args"] if not isinstance(a, str) or a.startswith("-")]
        r = fuzz_client.post("/v1/retrain", content=json.dumps(body).encode(), headers={**AUTH,
                             "Content-Type": "application/json"})
        _check(r)
        assert r.status_code != 202, r.text

    run()


@pytest.mark.timeout(60)
def test_fuzz_raw_bytes(fuzz_client: httpx.Client) -> None:
    """Not even JSON: the body parser's errors are 4xx too."""

    @FUZZ
    @given(raw=st.binary(max_size=300))
    def run(raw: bytes) -> None:
        _check(fuzz_client.post("/v1/recommend", content=raw, headers={"Content-Type": "application/json"}))

    run()
