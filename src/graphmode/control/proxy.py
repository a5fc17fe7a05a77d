"""A small streaming reverse proxy in front of the active vLLM backend, so a switch can move traffic.

Requests go to whichever backend is active when they arrive and finish there (streams included): a
switch flips ``active`` and then :meth:`Proxy.drain` waits for the old backend's in-flight count to reach
zero before it is stopped. With no active backend (stop-then-start downtime) the proxy answers 503 with
``Retry-After``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length"}


@dataclass
class Upstream:
    name: str
    base_url: str
    inflight: int = 0
    served: int = 0


class Proxy:
    def __init__(self, read_timeout_s: float = 600.0, retry_after_s: int = 30) -> None:
        self.active: Upstream | None = None
        self.retry_after_s = retry_after_s
        self.rejected = 0
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(read_timeout_s, connect=5.0))
        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=methods)])

    async def handle(self, request: Request) -> Response:
        up = self.active
        if up is None:
            self.rejected += 1
            return JSONResponse({"error": "graphmode: vLLM is restarting to switch CUDA Graph mode"},
                                status_code=503, headers={"Retry-After": str(self.retry_after_s)})
        up.inflight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                up.inflight -= 1
                up.served += 1

        try:
            body = await request.body()
            headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
            url = up.base_url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
            req = self._client.build_request(request.method, url, headers=headers, content=body)
            resp = await self._client.send(req, stream=True)
        except httpx.HTTPError as exc:
            release()
            return JSONResponse({"error": f"graphmode proxy: backend {up.name} failed: {exc}"}, status_code=502)
        except BaseException:
            release()
            raise

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()
                release()

        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(stream(), status_code=resp.status_code, headers=out_headers)

    async def drain(self, up: Upstream, timeout_s: float) -> int:
        """Wait until ``up`` has no request in flight (or the timeout); the count left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while up.inflight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.1)
        return up.inflight

    async def aclose(self) -> None:
        await self._client.aclose()
