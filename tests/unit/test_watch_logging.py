"""``graphmode watch``'s log: its decisions, not a line per request its proxy forwards or scrape it makes."""

from __future__ import annotations

import logging

import httpx
import pytest

from graphmode.cli.watch_cmd import configure_logging


def test_watch_logs_its_decisions_not_every_proxied_request(caplog: pytest.LogCaptureFixture) -> None:
    httpx_logger = logging.getLogger("httpx")
    before = httpx_logger.level
    try:
        configure_logging()
        caplog.set_level(logging.INFO)
        with httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(200))) as client:
            client.post("http://backend/v1/completions", json={"prompt": [1, 2]})  # what the proxy forwards
        logging.getLogger("graphmode.watch").info("SWITCH PIECEWISE → FULL: ...")
    finally:
        httpx_logger.setLevel(before)
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("graphmode.watch", "SWITCH PIECEWISE → FULL: ...")]
