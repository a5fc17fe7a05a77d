"""The service's capacity limits without a server (issue 44, items 7 and 11): request heads above
``max_header_bytes`` get 431 whatever read they came in; past capacity (too many requests in flight, or the
event loop running behind) a request gets 503 + Retry-After at once, and ``/healthz`` is never shed. The
loop's lag is injected where the rule is tested, so nothing here depends on how fast or loaded the machine is."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from graphmode.service.middleware import HeaderLimitMiddleware, LoadShedMiddleware, LoopLag, head_bytes


def _scope(path: str = "/v1/recommend", headers: list[tuple[bytes, bytes]] | None = None) -> Scope:
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": headers or [(b"host", b"x")]}


class _Sent:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])


async def _receive() -> Message:
    return {"type": "http.request", "body": b"{}", "more_body": False}


class _App:
    """Answers 200; while ``hold`` is set, waits for ``release`` first."""

    def __init__(self, hold: bool = False) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.hold = hold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        if self.hold:
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("size", [20_000, 60_000])
def test_a_head_above_the_limit_gets_431(size: int) -> None:
    app = _App()
    sent = _Sent()
    big = _scope(headers=[(b"host", b"x"), (b"x-big", b"a" * size)])
    assert head_bytes(big) > size
    _run(HeaderLimitMiddleware(app, 16384)(big, _receive, sent))
    assert sent.status == 431 and sent.headers[b"connection"] == b"close" and app.calls == 0
    ok = _Sent()
    _run(HeaderLimitMiddleware(app, 16384)(_scope(headers=[(b"x-big", b"a" * 16000)]), _receive, ok))
    assert ok.status == 200 and app.calls == 1


class _FakeLag:
    """An injected lag reading: (seconds behind, requests arrived while behind)."""

    def __init__(self) -> None:
        self.reading = (0.0, 0)

    def arrival(self) -> tuple[float, int]:
        return self.reading


def test_a_loop_running_behind_sheds_with_retry_after() -> None:
    lag = _FakeLag()
    shed: list[str] = []
    app = _App()
    mw = LoadShedMiddleware(app, max_in_flight=100, max_queue_s=0.1, lag=lag, on_shed=shed.append, min_late=4)
    first = _Sent()
    _run(mw(_scope(), _receive, first))
    assert first.status == 200
    lag.reading = (0.3, 12)  # behind, with a queue
    refused = _Sent()
    _run(mw(_scope(), _receive, refused))
    assert refused.status == 503 and refused.headers[b"retry-after"] == b"1" and shed == ["queue"]
    assert b"overloaded" in refused.messages[1]["body"]
    for path in ("/healthz", "/metrics", "/v1/jobs"):  # only the hot path is shed
        other = _Sent()
        _run(mw(_scope(path), _receive, other))
        assert other.status == 200
    assert app.calls == 4
    lag.reading = (0.3, 1)  # one request in a slow iteration: a stall of the machine, not a queue
    stalled = _Sent()
    _run(mw(_scope(), _receive, stalled))
    assert stalled.status == 200 and shed == ["queue"]


def test_too_many_in_flight_are_shed_at_once() -> None:
    async def scenario() -> tuple[list[int], int]:
        app = _App(hold=True)
        mw = LoadShedMiddleware(app, max_in_flight=2, max_queue_s=10.0, lag=_FakeLag())
        held = [_Sent() for _ in range(2)]
        tasks = [asyncio.create_task(mw(_scope(), _receive, s)) for s in held]
        await asyncio.sleep(0)
        third = _Sent()
        await mw(_scope(), _receive, third)  # returns without waiting for the held ones
        assert mw.in_flight == 2
        app.release.set()
        await asyncio.gather(*tasks)
        after = _Sent()
        await mw(_scope(), _receive, after)
        return [*(s.status for s in held), third.status, after.status], mw.in_flight

    statuses, in_flight = _run(scenario())
    assert statuses == [200, 200, 503, 200] and in_flight == 0


def test_loop_lag_counts_a_blocked_loop() -> None:
    """The rule, not the host's speed: a loop blocked for 0.3 s is at least 0.25 s behind its 0.05 s timer."""
    async def scenario() -> tuple[float, float]:
        lag = LoopLag(interval_s=0.05)
        start = lag()
        time.sleep(0.3)  # a callback hogging the loop
        return start, lag()

    start, blocked = _run(scenario())
    assert start == 0.0 and blocked >= 0.25


def test_loop_lag_counts_arrivals_while_behind() -> None:
    async def scenario() -> list[tuple[float, int]]:
        lag = LoopLag(interval_s=0.05)
        readings = [lag.arrival()]  # starts the timer: not behind
        time.sleep(0.2)
        readings += [lag.arrival() for _ in range(3)]  # three requests of one slow iteration
        await asyncio.sleep(0.06)  # the timer fires: a new period
        readings.append((lag(), lag.late))
        return readings

    readings = _run(scenario())
    assert readings[0] == (0.0, 0)
    assert [late for _, late in readings[1:4]] == [1, 2, 3] and all(b >= 0.15 for b, _ in readings[1:4])
    assert readings[4][1] == 0


def test_a_stall_that_is_over_refuses_nothing() -> None:
    """Once the loop has run its timer again it reads caught up, however long the stall before was."""
    async def scenario() -> float:
        lag = LoopLag(interval_s=0.05)
        lag()
        time.sleep(0.3)
        await asyncio.sleep(0.06)  # the overdue timer fires before this sleep's
        return lag()

    assert _run(scenario()) < 0.25


def test_loop_lag_follows_a_new_loop() -> None:
    lag = LoopLag(interval_s=0.05)

    async def read() -> float:
        return lag()

    _run(read())
    time.sleep(0.2)  # the first loop is gone: its overdue timer must not count on the next one
    assert _run(read()) == 0.0
