"""The application factory: ``create_app(settings)`` → a FastAPI app with its models loaded in the lifespan.

::

    uvicorn.run(create_app(load_settings()), host="127.0.0.1", port=8080)
    # or: uvicorn --factory graphmode.service.app:app_from_env

Endpoints: ``POST /v1/recommend``; ``GET /v1/models``, ``GET /v1/models/{id}``; ``POST /v1/reload``,
``POST /v1/retrain``, ``GET|DELETE /v1/jobs/{id}``, ``GET /v1/jobs`` (bearer token); ``GET /healthz``;
``GET /metrics``; OpenAPI at ``/docs`` and ``/openapi.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from graphmode import __version__
from graphmode.core.errors import GraphmodeError
from graphmode.core.records import Fingerprint
from graphmode.core.settings import Settings, load_settings
from graphmode.service.jobs import JobRegistry
from graphmode.service.metrics import ServiceMetrics
from graphmode.service.middleware import (
    BodyLimitMiddleware,
    CatchAllMiddleware,
    HeaderLimitMiddleware,
    LoadShedMiddleware,
    MetricsMiddleware,
)
from graphmode.service.redact import redact_paths
from graphmode.service.routers import check as check_router
from graphmode.service.routers import health, jobs, models
from graphmode.service.routers import recommend as recommend_router
from graphmode.service.state import ServiceState

log = logging.getLogger("graphmode.service")
JOB_LOCK_FILE = ".graphmode-job.lock"

DESCRIPTION = """
Recommends the vLLM CUDA Graph mode (`--compilation-config '{"cudagraph_mode": ...}'`) that suits a
deployment's traffic, from observed features, a workload description or a live server's `/metrics`.

Reading endpoints are open; `reload`, `retrain` and `jobs` need `Authorization: Bearer <token>`
(`GRAPHMODE_SERVICE__TOKEN`) and are disabled (403) when no token is configured.
"""


def create_app(
    settings: Settings | None = None,
    *,
    models_dir: Path | None = None,
    model_id: str | None = None,
    target: Fingerprint | Literal["detect"] | None = "detect",
    retrain_fn: Callable[..., Any] | None = None,
    recommend_in_threadpool: bool = False,
) -> FastAPI:
    """A ready-to-serve app. Models load when the app starts (its lifespan), not here.

    ``models_dir``/``model_id`` default to ``settings.selector``; ``target`` is the fingerprint models
    are matched against ("detect": this host's GPU via NVML, if any); ``retrain_fn`` replaces
    ``graphmode.selector.retrain`` (tests); ``recommend_in_threadpool`` registers a sync recommend
    endpoint instead of the async one (benchmark comparison only).
    """
    s = settings or load_settings()
    metrics = ServiceMetrics()
    root = Path(models_dir or s.selector.models_dir)
    state = ServiceState(
        settings=s,
        models_dir=root,
        model_id=model_id if model_id is not None else s.selector.model_id,
        metrics=metrics,
        jobs=JobRegistry(lock_path=root / JOB_LOCK_FILE, metrics=metrics),
        target=None if target == "detect" else target,
        retrain_fn=retrain_fn,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if target == "detect":
            from graphmode.selector.registry import target_fingerprint

            state.target = await run_in_threadpool(target_fingerprint)
        await run_in_threadpool(state.mark_stamp_seen)
        await run_in_threadpool(state.reload)  # an explicit model_id that cannot load fails start-up
        if s.service.token is None:
            log.warning("no service token configured: reload, retrain and jobs are disabled (403)")
        poll_s = s.service.reload_poll_s
        state.reload_poller = asyncio.create_task(_poll_reloads(state, poll_s)) if poll_s > 0 else None
        try:
            yield
        finally:
            if state.reload_poller is not None:
                state.reload_poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await state.reload_poller
        # The job's vLLM is stopped (its whole process group) before the process exits: uvicorn re-raises
        # SIGTERM once the app has shut down, which would otherwise leave the engine running (issue 12).
        await run_in_threadpool(state.jobs.shutdown)

    app = FastAPI(
        title="graphmode",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        openapi_url="/openapi.json",
        redoc_url=None,
    )
    app.state.service = state
    app.include_router(recommend_router.build_router(threadpool=recommend_in_threadpool))
    app.include_router(models.router)
    app.include_router(jobs.router)
    app.include_router(health.router)
    app.include_router(check_router.router)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return SafeJSONResponse({"detail": validation_details(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code in (204, 304) or exc.status_code < 200:
            return Response(status_code=exc.status_code, headers=exc.headers)
        return SafeJSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(GraphmodeError)
    async def graphmode_error(request: Request, exc: GraphmodeError) -> JSONResponse:
        log.error("%s %s: %s", request.method, request.url.path, exc)
        return SafeJSONResponse({"detail": redact_paths(str(exc))}, status_code=500)

    # Innermost first: the catch-all sits inside the body limit and the metrics, so a 500 it makes is
    # counted, and the connection it answers on stays open. Shedding sits right inside the metrics: a refusal
    # costs no header or body work, and is counted.
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(
        BodyLimitMiddleware, max_body_bytes=s.service.max_body_bytes, body_timeout_s=s.service.body_timeout_s
    )
    app.add_middleware(HeaderLimitMiddleware, max_header_bytes=s.service.max_header_bytes)
    app.add_middleware(LoadShedMiddleware, max_in_flight=s.service.max_in_flight, max_queue_s=s.service.max_queue_s,
                       on_shed=lambda reason: metrics.shed.labels(reason).inc())
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: counts 413s and 503s too
    return app


async def _poll_reloads(state: ServiceState, interval_s: float) -> None:
    """Every ``interval_s``: follow another worker's reload (``ServiceState.poll_once``, in a thread: it
    reads a file and may load models). Runs until cancelled; an unexpected error is logged, not fatal."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await run_in_threadpool(state.poll_once)
        except Exception:
            log.exception("reload poll failed")


def safe_text(value: str) -> str:
    """``value`` encodable as UTF-8: a lone surrogate (JSON allows ``"\\ud800"``) becomes the text of its
    escape sequence instead of failing the response's encoding (issue 12: 500 in the 422 handler)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _safe(value: object) -> object:
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, list | tuple):
        return [_safe(v) for v in value]
    if isinstance(value, dict):
        return {safe_text(str(k)): _safe(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class SafeJSONResponse(JSONResponse):
    """JSON whose strings are made encodable first (error bodies echo parts of the request)."""

    def render(self, content: object) -> bytes:
        return json.dumps(_safe(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _json_safe(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN / inf: JSON has no spelling for them
    if isinstance(value, str):
        return safe_text(value[:200] + "…" if len(value) > 200 else value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return _OMIT


_OMIT = object()


def validation_details(errors: Sequence[object]) -> list[dict[str, object]]:
    """FastAPI's 422 details, made JSON-safe: ``loc``, ``msg``, ``type`` and a scalar ``input`` (NaN and
    inf as strings; FastAPI's default handler would fail to encode them and answer 500)."""
    out: list[dict[str, object]] = []
    for err in errors:
        if not isinstance(err, dict):
            continue
        msg = str(err.get("msg", ""))
        ctx = err.get("ctx")
        if err.get("type") == "json_invalid" and isinstance(ctx, dict) and isinstance(ctx.get("error"), str):
            msg = f"{msg}: {ctx['error']}"
        loc = [safe_text(p) if isinstance(p, str) else p if isinstance(p, int) else safe_text(str(p))
               for p in err.get("loc", ())]
        item: dict[str, object] = {
            "loc": loc,
            "msg": safe_text(msg),
            "type": str(err.get("type", "")),
        }
        value = _json_safe(err.get("input"))
        # A URL may carry credentials (user:password@): the error names the field, not its value.
        if value is not _OMIT and "server_url" not in loc:
            item["input"] = value
        out.append(item)
    return out


def app_from_env() -> FastAPI:
    """For ``uvicorn --factory graphmode.service.app:app_from_env`` (and ``--workers N``): settings from
    ``GRAPHMODE_*`` environment variables."""
    return create_app(load_settings())
