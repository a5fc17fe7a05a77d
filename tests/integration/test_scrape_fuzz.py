"""Property-based fuzzing of the scrape path (issue 44): a "vLLM" whose ``/metrics`` says anything the
exposition format allows (NaN, ±Inf, 1e308, negative values, counters that reset or go backwards between
scrapes, label values that try to inject samples), scraped through ``graphmode recommend --server`` and
through ``POST /v1/recommend`` with ``server_url``. Whatever it says: no traceback, no 5xx, and no negative
or out-of-range feature in an answer.

Examples are bounded and derandomized (CI failures reproduce); each one scrapes for 0.2 s.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.core.records import ObservedFeatures
from graphmode.profiling.features import compute_features, feature_range_error
from graphmode.profiling.metrics import parse_metrics
from graphmode.selector.live import observe_server
from graphmode.service.app import create_app
from tests.integration.test_service_uvicorn import UvicornThread, _settings, models_dir  # noqa: F401 (fixture)

FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
WINDOW = ["--window", "0.2", "--interval", "0.1"]

special = st.sampled_from(["NaN", "+Inf", "-Inf", "1e308", "-1e308", "1.7976931348623157e308", "-3", "-0.0", "0",
                           "1e18", "1e19", "4.9e-324"])
plain = st.floats(min_value=0, max_value=1e6, allow_nan=False).map(repr)
values = st.one_of(special, plain, plain)  # mostly plausible, often hostile
INJECT = st.sampled_from(['0"} -5\nvllm:num_requests_running{engine="9"} -5', 'x\\"} 1e308', "\n-7\n", '"', "\\"])

GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = ["vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "vllm:num_preemptions_total", "process_cpu_seconds_total", "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"]
HISTOGRAMS = ["vllm:iteration_tokens_total", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
              "vllm:inter_token_latency_seconds", "vllm:time_to_first_token_seconds"]


def _label(value: str) -> str:
    """A label value escaped as the exposition format says (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def snapshot_text(draw: st.DrawFn) -> str:
    lines = []
    engine = _label(draw(st.one_of(st.just("0"), INJECT)))
    for name in draw(st.lists(st.sampled_from(GAUGES + COUNTERS), unique=True, min_size=1)):
        for e in (engine, "1")[: draw(st.integers(1, 2))]:
            lines.append(f'{name}{{engine="{e}",model_name="m"}} {draw(values)}')
    for name in draw(st.lists(st.sampled_from(HISTOGRAMS), unique=True, max_size=3)):
        edges = draw(st.lists(st.sampled_from(["1", "8", "16", "64", "512", "1e308", "NaN"]), unique=True, max_size=3))
        for le in [*edges, "+Inf"]:
            lines.append(f'{name}_bucket{{engine="{engine}",le="{le}"}} {draw(values)}')
        lines.append(f'{name}_sum{{engine="{engine}"}} {draw(values)}')
        lines.append(f'{name}_count{{engine="{engine}"}} {draw(values)}')
    return "\n".join(lines) + "\n"


class _Metrics(BaseHTTPRequestHandler):
    texts: ClassVar[list[str]] = ["\n"]
    served: ClassVar[int] = 0

    def do_GET(self) -> None:
        cls = type(self)
        if self.path == "/metrics":
            body = cls.texts[min(cls.served, len(cls.texts) - 1)].encode()
            cls.served += 1
        else:
            body = json.dumps({"version": "0.24.0"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(texts: list[str]) -> None:
    _Metrics.texts, _Metrics.served = texts, 0


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def service(models_dir: Path) -> Iterator[httpx.Client]:  # noqa: F811
    srv = UvicornThread(create_app(_settings(None), models_dir=models_dir, target=None)).start()
    with httpx.Client(base_url=srv.url, trust_env=False, timeout=30.0) as c:
        yield c
    srv.stop()


def _assert_in_range(features: dict[str, Any]) -> None:
    for name, v in features.items():
        if name in ObservedFeatures.model_fields and v is not None and name != "n_samples":
            assert isinstance(v, int | float) and feature_range_error(name, float(v)) is None, (name, v)


@FUZZ
@given(texts=st.lists(snapshot_text(), min_size=2, max_size=4))
def test_features_of_any_metrics_are_in_range(texts: list[str]) -> None:
    """The contract itself, without a server: parse + compute never raise and never leave the range."""
    snaps = [parse_metrics(t, float(i)) for i, t in enumerate(texts)]
    feats = compute_features(snaps).model_dump()
    _assert_in_range(feats)
    assert all(v is None or (isinstance(v, int | float) and math.isfinite(v)) for v in feats.values())


@FUZZ
@given(texts=st.lists(snapshot_text(), min_size=2, max_size=4))
def test_observe_server_on_any_metrics(vllm_url: str, texts: list[str]) -> None:
    _serve(texts)
    _assert_in_range(observe_server(vllm_url, 0.2, 0.1).model_dump())


@FUZZ
@given(texts=st.lists(snapshot_text(), min_size=2, max_size=4))
def test_cli_recommend_server_on_any_metrics(vllm_url: str, models_dir: Path, texts: list[str]) -> None:  # noqa: F811
    _serve(texts)
    result = CliRunner().invoke(app, ["recommend", "--server", vllm_url, *WINDOW, "--json",
                                      "--models-dir", str(models_dir)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        answer = json.loads(result.stdout[result.stdout.index("{"):])
        _assert_in_range(answer["features"])
    else:
        assert "no vLLM traffic metrics were observed" in result.output, result.output


@FUZZ
@given(texts=st.lists(snapshot_text(), min_size=2, max_size=4))
def test_api_recommend_server_url_on_any_metrics(vllm_url: str, service: httpx.Client, texts: list[str]) -> None:
    _serve(texts)
    r = service.post("/v1/recommend", json={"server_url": vllm_url, "window_s": 0.2, "interval_s": 0.1})
    assert r.status_code < 500, r.text
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        _assert_in_range(r.json()["features"])
    else:
        assert "no vLLM traffic metrics" in r.text, r.text
