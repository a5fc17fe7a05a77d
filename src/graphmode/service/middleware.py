"""Pure ASGI middleware (no ``BaseHTTPMiddleware``: it would add a task per request on the hot path).

:class:`BodyLimitMiddleware` answers 413 when a request body is larger than the limit: at once when
``Content-Length`` says so, and while reading when the body comes chunked or without a length; the 413
closes the connection, so the rest of the body is never read. :class:`MetricsMiddleware` counts and
times every request by route template.
"""

from __future__ import annotations

import json
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from graphmode.service.metrics import ServiceMetrics


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


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

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

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            # Normally FastAPI turns it into the 413 itself; this catches readers that let it escape.
            if started:
                raise
            await _send_413(send, limit)


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"request body larger than {limit} bytes"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


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
