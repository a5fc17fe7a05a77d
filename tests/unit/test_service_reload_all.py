"""A reload on one ``serve --workers N`` worker reaches the others: the reloading worker writes the models
dir's reload stamp and every worker's poller reloads once when the stamp changed. Two ``ServiceState``s on
one models dir play two workers; the model is the bundled H200 one, linked (not copied) into a temp dir."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from starlette.testclient import TestClient

from graphmode.core.settings import ServiceSettings, Settings
from graphmode.service import reload_stamp
from graphmode.service.app import JOB_LOCK_FILE, create_app
from graphmode.service.jobs import JobRegistry
from graphmode.service.metrics import ServiceMetrics
from graphmode.service.reload_stamp import NO_STAMP, RELOAD_STAMP_FILE, read_stamp, write_stamp
from graphmode.service.state import ServiceState

REPO = Path(__file__).resolve().parents[2]
MODEL = "nvidia-h200-vllm0.33.0-3375a87d3889"
TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
needs_bundled = pytest.mark.skipif(not (REPO / "models" / MODEL).is_dir(), reason="bundled model missing")


def _settings(**service: Any) -> Settings:
    s = Settings()
    s.service.token = SecretStr(TOKEN)
    for k, v in service.items():
        setattr(s.service, k, v)
    return s


def _worker(models_dir: Path, model_id: str | None = None) -> ServiceState:
    """A worker as the lifespan starts it: stamp taken as seen, models loaded."""
    metrics = ServiceMetrics()
    state = ServiceState(
        settings=_settings(),
        models_dir=models_dir,
        model_id=model_id,
        metrics=metrics,
        jobs=JobRegistry(lock_path=models_dir / JOB_LOCK_FILE, metrics=metrics),
    )
    state.mark_stamp_seen()
    state.reload()
    return state


def _default(state: ServiceState) -> str | None:
    return state.models.default.model_id if state.models.default is not None else None


def _add_model(models_dir: Path) -> None:
    (models_dir / MODEL).symlink_to(REPO / "models" / MODEL)


@needs_bundled
def test_a_reload_reaches_the_other_worker_once(tmp_path: Path) -> None:
    a, b = _worker(tmp_path), _worker(tmp_path)
    assert _default(a) is None and _default(b) is None
    assert not a.poll_once() and not b.poll_once()  # no stamp yet: generation 0, nothing to follow

    _add_model(tmp_path)  # a retrain wrote a model; A is asked to reload
    _, new = a.reload_all()
    assert new.default is not None and new.default.model_id == MODEL
    stamp = read_stamp(tmp_path)
    assert stamp != NO_STAMP and str(os.getpid()) in stamp
    assert not list(tmp_path.glob(RELOAD_STAMP_FILE + ".*"))  # no temporary file left behind

    assert b.poll_once() and _default(b) == MODEL  # B follows
    snapshot = b.models
    assert not b.poll_once() and b.models is snapshot  # ... exactly once
    a_snapshot = a.models
    assert not a.poll_once() and a.models is a_snapshot  # A wrote the stamp: it does not reload again

    # The other way round, and a third worker started after the reload does not reload either.
    (tmp_path / MODEL).unlink()
    b.reload_all()
    assert _default(b) is None
    c = _worker(tmp_path)
    assert a.poll_once() and _default(a) is None and not a.poll_once()
    assert not c.poll_once()


@needs_bundled
def test_a_failed_follow_up_reload_keeps_the_models_and_polling_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _add_model(tmp_path)
    a, b = _worker(tmp_path), _worker(tmp_path, model_id=MODEL)  # B insists on MODEL
    (tmp_path / MODEL).unlink()
    a.reload_all()  # A is fine without it
    with caplog.at_level(logging.ERROR, logger="graphmode.service"):
        assert b.poll_once()
    assert _default(b) == MODEL  # the old models stay
    assert "previous models stay" in caplog.text
    assert not b.poll_once()  # not retried every poll
    _add_model(tmp_path)
    a.reload_all()
    assert b.poll_once() and _default(b) == MODEL and b.models.loaded_at is not None


def test_a_stamp_present_at_start_up_is_not_followed(tmp_path: Path) -> None:
    assert write_stamp(tmp_path) is not None
    w = _worker(tmp_path)
    assert not w.poll_once()
    (tmp_path / RELOAD_STAMP_FILE).unlink()  # gone again: generation 0, differs from the seen stamp
    assert w.poll_once() and not w.poll_once()


def test_an_unreadable_stamp_is_logged_once_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = _worker(tmp_path)
    (tmp_path / RELOAD_STAMP_FILE).mkdir()  # reading it fails with IsADirectoryError
    with caplog.at_level(logging.WARNING, logger="graphmode.service"):
        assert not w.poll_once() and not w.poll_once()
    assert caplog.text.count("reload stamp unreadable") == 1


def test_an_unwritable_models_dir_does_not_break_the_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def read_only(src: object, dst: object) -> None:
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(reload_stamp.os, "replace", read_only)  # the tests run as root: chmod would not stop it
    app = create_app(_settings(reload_poll_s=0), models_dir=tmp_path, target=None)
    with caplog.at_level(logging.WARNING, logger="graphmode.service"), TestClient(app) as tc:
        r = tc.post("/v1/reload", headers=AUTH)
        assert r.status_code == 200, r.text
    assert "reload stamp not written" in caplog.text and "Read-only file system" in caplog.text
    assert list(tmp_path.iterdir()) == []  # neither a stamp nor a temporary file


def test_a_missing_models_dir_does_not_break_the_reload(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    app = create_app(_settings(reload_poll_s=0), models_dir=missing, target=None)
    with TestClient(app) as tc:
        r = tc.post("/v1/reload", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["models_loaded"] == 0
        assert not app.state.service.poll_once()
    assert not missing.exists()


def test_reload_poll_setting() -> None:
    assert ServiceSettings().reload_poll_s == 1.0
    assert ServiceSettings(reload_poll_s=0).reload_poll_s == 0
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValidationError, match="reload_poll_s"):
            ServiceSettings(reload_poll_s=bad)


def test_reload_poll_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHMODE_SERVICE__RELOAD_POLL_S", "0.25")
    assert Settings().service.reload_poll_s == 0.25


def _wait(cond: Any, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_the_lifespan_runs_the_poller(tmp_path: Path) -> None:
    app = create_app(_settings(reload_poll_s=0.05), models_dir=tmp_path, target=None)
    state: ServiceState = app.state.service
    with TestClient(app) as tc:
        poller = state.reload_poller
        assert poller is not None and not poller.done()
        before = state.models
        assert write_stamp(tmp_path) is not None  # another worker reloaded
        assert _wait(lambda: state.models is not before), "the poller did not follow the stamp"
        # Its own reload writes a stamp it does not follow.
        assert tc.post("/v1/reload", headers=AUTH).status_code == 200
        own = state.models
        time.sleep(0.3)  # several poll periods
        assert state.models is own
    assert poller.done() and poller.cancelled()


def test_no_poller_when_disabled(tmp_path: Path) -> None:
    app = create_app(_settings(reload_poll_s=0), models_dir=tmp_path, target=None)
    with TestClient(app):
        assert app.state.service.reload_poller is None
