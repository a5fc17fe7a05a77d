"""A ``server_url`` request is answered by the loaded model of the scraped server's vLLM release; when the
server's /version cannot be read, by the default model, with a warning saying so. The service loads the
two bundled H200 models (vLLM 0.24 and 0.33); the server is a fake vLLM replaying real /metrics text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from graphmode.core.records import Fingerprint
from graphmode.core.settings import Settings
from graphmode.service.app import create_app
from tests.integration.test_service_uvicorn import FakeVllmMetrics
from tests.support.net import Request, serve_http

REPO = Path(__file__).resolve().parents[2]
V024 = "nvidia-h200-vllm0.24.0-ab3c7947c90d"
V033 = "nvidia-h200-vllm0.33.0-3375a87d3889"
SCRAPE = {"window_s": 0.5, "interval_s": 0.25}


class FakeVllm(FakeVllmMetrics):
    """/metrics as FakeVllmMetrics, and /version saying ``version`` (None: 404, as a server without it)."""

    def __init__(self, version: str | None) -> None:
        super().__init__()
        self.version = version
        self.paths: list[str] = []

    def respond(self, req: Request) -> tuple[int, object]:  # type: ignore[override]
        self.paths.append(req.path)
        if req.path == "/version":
            return (200, {"version": self.version}) if self.version else (404, "")
        return super().respond(req)


@pytest.fixture(scope="module", params=[False, True], ids=["async", "threadpool"])
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("two-releases")
    for name in (V024, V033, "profiles", "shapes"):  # read-only: linked, not copied
        (root / name).symlink_to(REPO / "models" / name)
    app = create_app(Settings(), models_dir=root, target=Fingerprint(gpu_name="NVIDIA H200"),
                     recommend_in_threadpool=request.param)
    with TestClient(app) as c:
        assert c.get("/healthz").json()["default_model_id"] == V033  # no release given: the newest
        yield c


@pytest.mark.parametrize(("version", "expected"), [("0.33.0", V033), ("0.24.0", V024)])
def test_model_follows_the_server_version(client: TestClient, version: str, expected: str) -> None:
    fake = FakeVllm(version)
    with serve_http(fake.respond) as url:
        r = client.post("/v1/recommend", json={"server_url": url, **SCRAPE})
    assert r.status_code == 200, r.text
    ans = r.json()
    assert ans["model_id"] == expected and ans["features_source"] == "server"
    assert ans["fingerprint_match"] == "compatible"
    assert f"model {expected} chosen for the server's vLLM {version}" in ans["notes"]
    assert not any("could not be read" in w for w in ans["warnings"])
    assert "/version" in fake.paths and set(fake.paths) <= {"/version", "/metrics"}


def test_unreadable_version_keeps_the_default_and_says_so(client: TestClient) -> None:
    fake = FakeVllm(None)
    with serve_http(fake.respond) as url:
        r = client.post("/v1/recommend", json={"server_url": url, **SCRAPE})
    assert r.status_code == 200, r.text
    ans = r.json()
    assert ans["model_id"] == V033
    assert any("vLLM version could not be read" in w and V033 in w for w in ans["warnings"])


def test_an_explicit_model_id_wins_and_version_is_not_asked(client: TestClient) -> None:
    fake = FakeVllm("0.33.0")
    with serve_http(fake.respond) as url:
        r = client.post("/v1/recommend", json={"server_url": url, "model_id": V024, **SCRAPE})
    assert r.status_code == 200, r.text
    assert r.json()["model_id"] == V024 and "/version" not in fake.paths


@pytest.mark.parametrize(("version", "expected"), [("0.33.0", V033), ("0.24.0", V024)])
def test_a_request_naming_its_release_gets_that_releases_model(client: TestClient, version: str,
                                                               expected: str) -> None:
    """What `graphmode launch --selector-url` sends: the deployment's release and its model's config.json."""
    import json

    config = json.loads((REPO / "models" / "shapes" / "llama-3.2-1b.json").read_text())
    r = client.post("/v1/recommend", json={
        "workload": {"rate": 4, "input_tokens": 256, "output_tokens": 128}, "objective": {"metric": "ttft_p50"},
        "vllm_version": version, "served_model_config": config})
    assert r.status_code == 200, r.text
    ans = r.json()
    assert ans["model_id"] == expected
    assert f"model {expected} chosen for the deployment's vLLM {version}" in ans["notes"]
    if version == "0.33.0":  # the 1B's short-prompt races: FULL for TTFT (docs/configs-campaign.md, Lease 4b)
        assert ans["mode"] == "FULL"
    pinned = client.post("/v1/recommend", json={"workload": {"rate": 4, "input_tokens": 256, "output_tokens": 128},
                                                "vllm_version": version, "model_id": V024})
    assert pinned.status_code == 200 and pinned.json()["model_id"] == V024  # an explicit model id wins
    bad = client.post("/v1/recommend", json={"workload": {"rate": 4, "input_tokens": 256, "output_tokens": 128},
                                             "vllm_version": "0.33; rm -rf /"})
    assert bad.status_code == 422 and "vllm_version" in bad.text
