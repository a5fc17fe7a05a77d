"""Pure ASGI middleware (no ``BaseHTTPMiddleware``: it would add a task per request on the hot path).

:class:`BodyLimitMiddleware` answers 413 when a request body is larger than the limit: at once when
``Content-Length`` says so, and while reading when the body comes chunked or without a length; the 413
closes the connection, so the rest of the body is never read. With ``body_timeout_s`` it also answers 408
(and closes) when the body has not all arrived that long after the app first asked for it: a client that
sends less than its Content-Length, or trickles it, cannot hold a connection and a task.
:class:`CatchAllMiddleware` turns an exception no handler took into a JSON 500 on a connection that stays
usable (Starlette's own error middleware would re-raise it, and uvicorn would then drop the keep-alive
connection under the client).
:class:`MetricsMiddleware` counts and times every request by route template.
:class:`HeaderLimitMiddleware` answers 431 (and closes) when a request head is larger than
``max_header_bytes``: uvicorn's own limit only applies to a head still incomplete after one read, so a head
that arrives whole in one read (20 KB, 60 KB) would pass it.
:class:`LoadShedMiddleware` answers 503 with ``Retry-After`` at once, before reading the body, when the
service is past its capacity: too many requests in flight, or the event loop running behind by more than
``max_queue_s`` (:class:`LoopLag`), so that past capacity callers get a fast refusal instead of a queue that
grows until they time out. Only ``/v1/recommend`` is shed: ``/healthz``, ``/metrics`` and the rest never are.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import anyio
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from graphmode.service.metrics import ServiceMetrics

log = logging.getLogger("graphmode.service")


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(
            status_code=413,
            detail=f"request body larger than {limit} bytes",
            headers={"Connection": "close"},
        )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyReadTimeout(HTTPException):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            status_code=408,
            detail=f"request body not received within {timeout_s:g} s",
            headers={"Connection": "close"},
        )


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        length = _content_length(scope)
        if length is not None and length > limit:
            await _send_413(send, limit)
            return
        received = 0
        started = False
        complete = False
        timeout = self.body_timeout_s
        deadline: float | None = None  # the whole body must arrive within body_timeout_s of the first read

        async def limited_receive() -> Message:
            nonlocal received, complete, deadline
            if timeout is None or complete:
                message = await receive()
            else:
                if deadline is None:
                    deadline = anyio.current_time() + timeout
                with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as waited:
                    message = await receive()
                if waited.cancelled_caught:
                    raise BodyReadTimeout(timeout)
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except (BodyTooLarge, BodyReadTimeout) as exc:
            # Normally FastAPI turns them into the response itself; this catches readers that let one escape.
            if started:
                raise
            await send_json(send, exc.status_code, {"detail": exc.detail}, close=True)


async def _send_413(send: Send, limit: int) -> None:
    await send_json(send, 413, {"detail": f"request body larger than {limit} bytes"}, close=True)


async def send_json(
    send: Send, status: int, content: object, *, close: bool = False, headers: Mapping[str, str] | None = None
) -> None:
    body = json.dumps(content, ensure_ascii=True).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    if close and not any(k == b"connection" for k, _ in raw):
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class CatchAllMiddleware:
    """The last line: any exception the app's handlers did not turn into a response becomes
    ``500 {"detail": "internal error ..."}`` (logged with its traceback, never sent), or the status of an
    HTTPException that escaped. The connection stays open for the client's next request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:  # half a response went out: only closing the connection is left
                raise
            if isinstance(exc, HTTPException):
                await send_json(send, exc.status_code, {"detail": _ascii(exc.detail)}, headers=exc.headers)
                return
            log.exception("%s %s: unexpected error", scope.get("method"), scope.get("path"))
            await send_json(
                send,
                500,
                {"detail": f"internal error ({type(exc).__name__}); the service logged it and goes on serving"},
            )


def _ascii(value: object) -> object:
    """Strings made encodable (a lone surrogate from the request becomes its escape sequence as text)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list | tuple):
        return [_ascii(v) for v in value]
    if isinstance(value, dict):
        return {str(_ascii(k)): _ascii(v) for k, v in value.items()}
    return value


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def status_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, status_send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.requests.labels(method, path, str(status)).inc()
            self.metrics.latency.labels(method, path).observe(time.perf_counter() - t0)


def head_bytes(scope: Scope) -> int:
    """The size of a request's head as it came on the wire (request line and header lines, give or take the
    spelling of the HTTP version)."""
    line = len(scope.get("method", "")) + len(scope.get("raw_path") or b"") + len(scope.get("query_string", b""))
    return line + 12 + sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ())) + 2


class HeaderLimitMiddleware:
    """431 and close for a request head larger than ``max_header_bytes`` (see the module docstring)."""

    def __init__(self, app: ASGIApp, max_header_bytes: int) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and head_bytes(scope) > self.max_header_bytes:
            await send_json(send, 431, {"detail": f"request head larger than {self.max_header_bytes} bytes"},
                            close=True)
            return
        await self.app(scope, receive, send)


class LoopLag:
    """How far behind the running event loop is: a timer is due every ``interval_s``, and how long it is
    overdue right now is the lag. A saturated loop runs the ready callbacks (each request's task) before that
    timer's, so a request that finds it overdue by X has waited about X. A loop that caught up (the timer
    fired) reads 0 at once, so a stall that is over refuses nothing.

    :meth:`arrival` also counts the requests that arrived while the timer was overdue (reset when it fires):
    one slow iteration with one request in it is a stall (the machine is busy elsewhere), many are a queue.
    Follows the loop it is called on (a new loop starts a new timer)."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0
        self.late = 0  # arrivals since the timer fell due

    def __call__(self) -> float:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._schedule()
            return 0.0
        return max(0.0, loop.time() - self._due)

    def arrival(self) -> tuple[float, int]:
        """(the lag now, arrivals while overdue, this one included) for a request that arrives now."""
        lag = self()
        if lag > 0:
            self.late += 1
        return lag, self.late

    def _schedule(self) -> None:
        assert self._loop is not None
        self.late = 0
        self._due = self._loop.time() + self.interval_s
        self._loop.call_later(self.interval_s, self._tick, self._loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is self._loop:  # else another loop took over
            self._schedule()


class Lag(Protocol):
    def arrival(self) -> tuple[float, int]: ...


class LoadShedMiddleware:
    """503 + ``Retry-After`` at once, past capacity (see the module docstring).

    A request to one of ``paths`` (the hot path: ``POST /v1/recommend``) is refused when ``max_in_flight``
    of them are already in the app, or when the event loop runs more than ``max_queue_s`` behind with at
    least ``min_late`` requests arrived meanwhile (``lag``: :class:`LoopLag` unless given). Other paths
    (``/healthz``, ``/metrics``, jobs, models: cheap and rare) always go through, uncounted. ``on_shed`` is
    called with the reason of each refusal (a counter).
    """

    def __init__(self, app: ASGIApp, max_in_flight: int, max_queue_s: float, lag: Lag | None = None,
                 paths: Collection[str] = ("/v1/recommend",), on_shed: Callable[[str], None] | None = None,
                 min_late: int = 8) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_queue_s = max_queue_s
        self.min_late = min_late
        self.lag = lag or LoopLag()
        self.paths = frozenset(paths)
        self.on_shed = on_shed
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        overload = self._overload()
        if overload is not None:
            reason, why = overload
            if self.on_shed is not None:
                self.on_shed(reason)
            retry = max(1, math.ceil(self.max_queue_s))
            await send_json(send, 503, {"detail": f"overloaded: {why}; retry in {retry} s"},
                            headers={"Retry-After": str(retry)})
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    def _overload(self) -> tuple[str, str] | None:
        """(reason, message) when a request must be shed now, else None."""
        if self.in_flight >= self.max_in_flight:
            return "in_flight", f"{self.in_flight} requests in progress (limit {self.max_in_flight})"
        behind, late = self.lag.arrival()
        if behind > self.max_queue_s and late >= self.min_late:
            return "queue", f"requests wait {behind:.2f} s for the event loop (limit {self.max_queue_s:g} s)"
        return None
