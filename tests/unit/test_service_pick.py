"""Which loaded model answers a scraped server: the service's own fingerprint with the server's vLLM
version (``pick_for_server``), on the two bundled H200 models of vLLM 0.24 and 0.33."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphmode.core.records import Fingerprint
from graphmode.selector.registry import server_version
from graphmode.service.deps import pick_for_server
from graphmode.service.state import LoadedModels, load_models
from tests.support.net import Request, free_port, serve_http

REPO = Path(__file__).resolve().parents[2]
V024 = "nvidia-h200-vllm0.24.0-ab3c7947c90d"
V033 = "nvidia-h200-vllm0.33.0-3375a87d3889"
H200 = Fingerprint(gpu_name="NVIDIA H200")


@pytest.fixture(scope="module")
def models() -> LoadedModels:
    loaded = load_models(REPO / "models", None, H200)
    assert {V024, V033} <= set(loaded.by_id)
    return loaded


def test_default_is_the_newest_release(models: LoadedModels) -> None:
    # both fit an H200 of unknown release equally: the tie goes to the newest release (what users run), not to
    # the most rows (0.24's 1259 vs 200), and the answer says which release it assumed
    assert models.default is not None and models.default.model_id == V033
    assert models.default.match.release_assumed == "0.33.0"


@pytest.mark.parametrize(
    ("version", "expected", "kind"),
    [
        ("0.33.0", V033, "compatible"),
        ("0.24.0", V024, "compatible"),
        ("0.33.1", V033, "nearest"),  # same minor release
        ("0.25.0", V024, "nearest"),  # unprofiled: the closest release
        ("0.40.0", V033, "nearest"),
    ],
)
def test_pick_follows_the_server_version(models: LoadedModels, version: str, expected: str, kind: str) -> None:
    assert models.default is not None
    before = models.default.match
    rec = pick_for_server(models, H200, version)
    assert rec.model_id == expected
    assert rec.match.kind == kind and rec.match.model_id == expected
    if kind == "nearest":
        assert any(f"vLLM {version}" in w for w in rec.match.warnings)
    assert models.default.match == before  # the shared, loaded recommender is never changed


def test_pick_keeps_the_service_gpu(models: LoadedModels) -> None:
    # another GPU than the models': still picked by release, and the answer says the GPU differs
    rec = pick_for_server(models, Fingerprint(gpu_name="NVIDIA A100"), "0.33.0")
    assert rec.model_id == V033 and any("GPU NVIDIA A100" in d for d in rec.match.differences)


def test_pick_with_nothing_loaded_is_503(tmp_path: Path) -> None:
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as exc:
        pick_for_server(LoadedModels.empty(tmp_path, "none"), H200, "0.33.0")
    assert exc.value.status_code == 503


def test_server_version_reads_only_version() -> None:
    seen: list[str] = []

    def respond(req: Request) -> tuple[int, object]:
        seen.append(req.path)
        return (200, {"version": " 0.33.0 "}) if req.path == "/version" else (404, "")

    with serve_http(respond) as url:
        assert server_version(url + "/metrics") == "0.33.0"
    assert seen == ["/version"]
    with serve_http(lambda req: (200, {"version": 33})) as url:
        assert server_version(url) is None
    with serve_http(lambda req: (200, "not json")) as url:
        assert server_version(url) is None
    # The answer quotes the version: anything but a version-shaped token is not read at all.
    with serve_http(lambda req: (200, {"version": "<html>s3cret token</html>"})) as url:
        assert server_version(url) is None
    with serve_http(lambda req: (200, {"version": "0.33.0+cu130.dev5"})) as url:
        assert server_version(url) == "0.33.0+cu130.dev5"
    assert server_version(f"http://127.0.0.1:{free_port()}", timeout=1.0) is None
