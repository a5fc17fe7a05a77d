"""Network doubles every test shares: a free local port, and a fake HTTP server in a thread."""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


SPAN = 8  # races and the series put engine i on port + i: the block is checked whole


def free_port(host: str = "127.0.0.1") -> int:
    """The first of ``SPAN`` consecutive ports nothing is bound to right now, below Linux's ephemeral range.

    Why not ``bind(0)``: that hands out an ephemeral port, and the ports after it are where the kernel puts
    the client side of outgoing connections, so an engine on ``port + 1`` found it taken ("Address already
    in use", seen in CI). Below 32768 the kernel never picks a port by itself."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32768 - SPAN)
        if all(_bindable(host, base + i) for i in range(SPAN)):
            return base
    with socket.socket() as s:  # a box with that whole range busy: the old way
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


# (status, body): a dict or list is sent as JSON, a str as Prometheus text, bytes as they are.
Respond = Callable[[Request], tuple[int, Any]]


@contextmanager
def serve_http(respond: Respond, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve every request with ``respond`` (on a free port by default); yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            req = Request(self.command, self.path, dict(self.headers.items()), self.rfile.read(n) if n else b"")
            status, body = respond(req)
            if isinstance(body, dict | list):
                data, ctype = json.dumps(body).encode(), "application/json"
            elif isinstance(body, str):
                data, ctype = body.encode(), PROMETHEUS_TEXT
            else:
                data, ctype = bytes(body), "application/octet-stream"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _handle

        def log_message(self, *args: Any) -> None:
            pass  # keep pytest's output clean

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
