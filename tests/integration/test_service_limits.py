"""Client limits on a real uvicorn run with ``graphmode serve``'s configuration (issue 44, items 6 and 7):
one client address cannot hold every connection (its extra ones get 503 and close, and ``/healthz`` still
answers others), and a request head above ``max_header_bytes`` is refused even when it arrives in one read.

The flooding client binds 127.0.0.2 (all of 127/8 is loopback on Linux), the probes come from 127.0.0.1."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from graphmode.service.app import create_app
from tests.integration.test_service_hardening import BoundedUvicornThread, _closed_within
from tests.integration.test_service_uvicorn import _settings, models_dir  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs 127.0.0.2 as a source address")


@pytest.fixture
def limited(models_dir: Path) -> Iterator[BoundedUvicornThread]:  # noqa: F811
    s = _settings(None, max_connections=12, max_connections_per_client=4, header_timeout_s=30.0)
    srv = BoundedUvicornThread(create_app(s, models_dir=models_dir, target=None), s).start()
    yield srv
    srv.stop()


def _connect_from(source: str, port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def test_one_client_cannot_hold_every_connection(limited: BoundedUvicornThread) -> None:
    flood = [_connect_from("127.0.0.2", limited.port) for _ in range(20)]  # half-open: no request is sent
    try:
        for s in flood[:4]:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a head that never completes
        refused = 0
        for s in flood[4:]:
            closed, got = _closed_within(s, 5.0)
            refused += closed and got.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in got.lower()
        assert refused == 16
        with httpx.Client(base_url=limited.url, trust_env=False, timeout=5.0) as c:
            for _ in range(5):
                assert c.get("/healthz").status_code == 200
    finally:
        for s in flood:
            s.close()
    time.sleep(0.2)  # the flood's slots are given back when its connections close
    with _connect_from("127.0.0.2", limited.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _, got = _closed_within(s, 5.0)
        assert got.startswith(b"HTTP/1.1 200"), got[:200]


@pytest.fixture
def default_limits(models_dir: Path) -> Iterator[BoundedUvicornThread]:  # noqa: F811
    s = _settings(None)
    assert s.service.max_header_bytes == 16384
    srv = BoundedUvicornThread(create_app(s, models_dir=models_dir, target=None), s).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("size", [20_000, 60_000])
def test_heads_above_the_documented_limit_are_refused(default_limits: BoundedUvicornThread, size: int) -> None:
    with socket.create_connection(("127.0.0.1", default_limits.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
        closed, got = _closed_within(s, 5.0)
        assert closed and got.split(b" ")[1] in (b"400", b"431"), got[:200]
    small = httpx.get(default_limits.url + "/healthz", headers={"X-Big": "a" * 15_000}, trust_env=False)
    assert small.status_code == 200
