"""How ``graphmode serve`` runs the app on uvicorn, with slow and oversized clients bounded.

uvicorn alone keeps a connection whose request head never completes for as long as the client likes
(issue 12: 300 such connections took the service from 16 to 316 open files), and its httptools parser
takes request heads of any size (an 8 MB header was accepted). So the service runs on uvicorn's h11
protocol with:

* ``h11_max_incomplete_event_size`` = ``settings.service.max_header_bytes``: a larger head is answered
  400 and the connection closed;
* :class:`BoundedH11Protocol`: a request head must be complete within ``header_timeout_s`` of the
  connection or of its first byte, else ``408`` and close;
* ``timeout_keep_alive`` = ``keep_alive_s`` for idle connections between requests;
* ``limit_concurrency`` = ``max_connections``: beyond that many connections (or requests), 503;
* at most ``max_connections_per_client`` open connections from one client address
  (:class:`BoundedH11Protocol`): a further one is answered 503 with ``Retry-After`` and closed at once, so one
  client's half-open connections cannot fill ``max_connections`` and keep ``/healthz`` and others out;
* a head larger than ``max_header_bytes`` that arrives in one read, which h11's limit does not see, is
  :class:`~graphmode.service.middleware.HeaderLimitMiddleware`'s (431);
* the body read timeout (``body_timeout_s``) is :class:`~graphmode.service.middleware.BodyLimitMiddleware`'s.
"""

from __future__ import annotations

import asyncio
import functools
import json
import weakref
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from graphmode.core.settings import Settings, load_settings

_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


_BUSY_BODY = json.dumps({"detail": "too many connections from this client; retry in 1 s"}).encode()
_503 = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
        b"content-length: " + str(len(_BUSY_BODY)).encode() + b"\r\nconnection: close\r\n\r\n" + _BUSY_BODY)

# Open connections per client address, per server (one uvicorn server in a process, several in tests).
_OPEN: weakref.WeakKeyDictionary[ServerState, dict[str, int]] = weakref.WeakKeyDictionary()


@functools.cache
def _settings_header_timeout() -> float:
    # Worker processes (serve --workers N) unpickle the protocol class, not its configuration: they read
    # the same GRAPHMODE_* environment the parent did.
    return load_settings().service.header_timeout_s


@functools.cache
def _settings_per_client() -> int:
    return load_settings().service.max_connections_per_client


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on receiving each request's head and a cap on the connections
    one client address holds open."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, server_state, *args, **kwargs)
        timeout = getattr(config, "header_timeout_s", None)
        self.header_timeout_s: float = timeout if timeout is not None else _settings_header_timeout()
        per_client = getattr(config, "max_connections_per_client", None)
        self.max_per_client: int = per_client if per_client is not None else _settings_per_client()
        self._open = _OPEN.setdefault(server_state, {})
        self._peer: str | None = None  # set while this connection counts against its client's cap
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else None
        if peer is not None:
            if self._open.get(peer, 0) >= self.max_per_client:
                transport.write(_503)
                transport.close()
                return
            self._open[peer] = self._open.get(peer, 0) + 1
            self._peer = peer
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            self._disarm_head_timer()
        elif self.conn.their_state is h11.IDLE:
            # Bytes of a request head, not yet all of it: the clock runs from its first byte.
            if self._head_timer is None:
                self._arm_head_timer()
        else:
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        if self._peer is not None:
            left = self._open.get(self._peer, 1) - 1
            if left > 0:
                self._open[self._peer] = left
            else:
                self._open.pop(self._peer, None)
            self._peer = None
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is being written (pipelining): the keep-alive logic takes over
        self.transport.write(_408)
        self.transport.close()


def uvicorn_config(app: Any, settings: Settings | None = None, **kwargs: Any) -> uvicorn.Config:
    """A uvicorn configuration for ``app`` with the service's client limits (``kwargs`` go to uvicorn:
    host, port, log_level, ...)."""
    service = (settings or load_settings()).service
    config = uvicorn.Config(app, **uvicorn_options(settings), **kwargs)
    config.header_timeout_s = service.header_timeout_s  # type: ignore[attr-defined]
    config.max_connections_per_client = service.max_connections_per_client  # type: ignore[attr-defined]
    return config


def uvicorn_options(settings: Settings | None = None) -> dict[str, Any]:
    """``uvicorn.run``/``uvicorn.Config`` keyword arguments that bound slow and oversized clients."""
    service = (settings or load_settings()).service
    return {
        "http": BoundedH11Protocol,
        "h11_max_incomplete_event_size": service.max_header_bytes,
        "timeout_keep_alive": max(1, round(service.keep_alive_s)),
        "limit_concurrency": service.max_connections,
    }
