"""What a retrain job says when its profile fails everywhere (issue 44, item 9): the cells' own reason
("cannot run ..."), not the trainer's "no usable ok rows"."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from graphmode.service.app import create_app
from tests.integration.test_service_hardening import TINY_LLAMA, _job_settings, _tiny_grid, _wait_job
from tests.integration.test_service_uvicorn import AUTH, UvicornThread, models_dir  # noqa: F401 (fixture)


def test_a_job_whose_every_cell_cannot_run_vllm_says_so(models_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    root = tmp_path / "models"
    shutil.copytree(models_dir, root)
    srv = UvicornThread(create_app(_job_settings(tmp_path), models_dir=root, target=None)).start()
    body = {
        "vllm_command": [str(tmp_path / "no-such-vllm")],
        "vllm_args": ["--model", str(TINY_LLAMA)],
        "grid": _tiny_grid(["a", "b"]),
        "modes": ["FULL", "NONE"],
        "regressor": "mean",
    }
    try:
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            r = c.post("/v1/retrain", json=body, headers=AUTH)
            assert r.status_code == 202, r.text
            job = _wait_job(c, r.json()["id"], 120, lambda j: j["status"] not in ("queued", "running"))
    finally:
        srv.stop()
    assert job["status"] == "failed", job
    error = job["error"]
    assert "every profiled cell failed (4 of 4)" in error, error
    assert "cannot run" in error and "no-such-vllm" in error and "no usable ok rows" not in error, error
