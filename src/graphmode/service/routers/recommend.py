"""``POST /v1/recommend``: the hot path.

The endpoint is ``async def`` and calls the in-process recommender directly on the event loop (~0.1–0.4 ms
of CPU): measured faster than a plain ``def`` endpoint, which FastAPI would run in its threadpool
(see NOTES-service.md). Only the ``server_url`` input blocks (it scrapes a server for ``window_s``), so
that runs in a worker thread, at most :data:`MAX_CONCURRENT_SCRAPES` at once. The answer is serialized
once by pydantic and returned as bytes, never re-validated.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import anyio
from fastapi import APIRouter, HTTPException, Response

from graphmode.core.errors import ObjectiveError, ScrapeError
from graphmode.core.records import ObservedFeatures
from graphmode.selector.recommend import FeatureSource
from graphmode.service.deps import StateDep, pick_recommender
from graphmode.service.schemas import RecommendRequest, RecommendResponse
from graphmode.service.state import LoadedModels, ServiceState

MAX_CONCURRENT_SCRAPES = 8

_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "model_id is not a loaded model"},
    413: {"description": "body larger than settings.service.max_body_bytes"},
    422: {"description": "invalid body: the field, and for metrics the list of known ones"},
    403: {"description": "server_url names a host outside settings.service.scrape_hosts"},
    502: {"description": "server_url could not be scraped"},
    503: {"description": "no model is loaded"},
}
_DOC = (
    "Recommend a CUDA Graph mode. Give exactly one of `features` (observed features), `workload` "
    "(a description) or `server_url` (+ `window_s`: the service scrapes that vLLM's /metrics), and "
    "optionally an `objective`, a `model_id` and the served model's `served_model_config` (its config.json)."
)


def _observe(url: str, window_s: float, interval_s: float) -> ObservedFeatures:
    from graphmode.selector.live import observe_server

    return observe_server(url, window_s, interval_s)


def scrape_refusal(url: str, allowed: Sequence[str]) -> str | None:
    """Why the service will not scrape *url* (its host is not in *allowed*), or None when it may."""
    if "*" in allowed:
        return None
    host = (urlsplit(url if "://" in url else "http://" + url).hostname or "").lower()
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for item in allowed:
        if "/" in item:
            if ip is not None and ip in ipaddress.ip_network(item, strict=False):
                return None
        elif host == item or (ip is not None and _same_ip(ip, item)):
            return None
    return (f"server_url host {host or '(none)'!r} is not one this service may scrape; allowed: "
            f"{', '.join(allowed) or 'none'} (settings.service.scrape_hosts, env GRAPHMODE_SERVICE__SCRAPE_HOSTS)")


def _same_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, item: str) -> bool:
    try:
        return ip == ipaddress.ip_address(item)
    except ValueError:
        return False


def _check_scrape_allowed(state: ServiceState, url: str) -> None:
    why = scrape_refusal(url, state.settings.service.scrape_hosts)
    if why is not None:
        raise HTTPException(status_code=403, detail=why)


def _scrape_failed(url: str, exc: Exception) -> HTTPException:
    return HTTPException(status_code=502, detail=f"could not scrape {url}: {exc}")


def answer(
    state: ServiceState, models: LoadedModels, body: RecommendRequest, observed: ObservedFeatures | None
) -> Response:
    rec = pick_recommender(models, body.model_id)
    shape = body.served_shape()
    if shape is not None:
        rec = rec.for_shape(shape)
    try:
        objective = state.objective(body.objective, rec) if body.objective is not None else None
    except ObjectiveError as exc:
        raise _objective_error(exc) from None
    inputs: Any = body.features or body.workload or observed
    source: FeatureSource | None = "server" if observed is not None else None
    t0 = time.perf_counter()
    try:
        result = rec.recommend(inputs, objective, source=source)
    except ObjectiveError as exc:
        raise _objective_error(exc) from None
    if body.step_sizes is not None or body.vllm_args is not None:
        from graphmode.selector.graphconfig import complete

        result = complete(result, step_sizes=body.step_sizes, vllm_args=body.vllm_args or [],
                          served_config=body.served_model_config, budget=body.capture_budget,
                          model_folder=rec.folder, env={})
    metrics = state.metrics
    metrics.compute.observe(time.perf_counter() - t0)
    metrics.recommendations.labels(result.mode, result.model_id, result.features_source).inc()
    # RecommendResponse is the Recommendation under the API's name: same fields, so the selector's object is
    # serialized as is (no copy, no re-validation).
    return Response(result.model_dump_json(), media_type="application/json")


def _objective_error(exc: ObjectiveError) -> HTTPException:
    return HTTPException(
        status_code=422,
        detail=[{"loc": ["body", "objective"], "msg": str(exc), "type": "objective_error"}],
    )


def build_router(*, threadpool: bool = False) -> APIRouter:
    """The recommend router; ``threadpool=True`` registers a plain ``def`` endpoint instead (for the
    benchmark's comparison only)."""
    router = APIRouter(prefix="/v1", tags=["recommend"])
    if threadpool:

        @router.post("/recommend", response_model=RecommendResponse, responses=_RESPONSES, description=_DOC)
        def recommend_threaded(body: RecommendRequest, state: StateDep) -> Response:
            observed = None
            if body.server_url is not None:
                _check_scrape_allowed(state, body.server_url)
                try:
                    observed = _observe(body.server_url, body.window_s, body.interval_s)
                except ScrapeError as exc:
                    raise _scrape_failed(body.server_url, exc) from None
            return answer(state, state.models, body, observed)

        return router

    limiter: list[anyio.CapacityLimiter] = []

    @router.post("/recommend", response_model=RecommendResponse, responses=_RESPONSES, description=_DOC)
    async def recommend(body: RecommendRequest, state: StateDep) -> Response:
        observed = None
        if body.server_url is not None:
            _check_scrape_allowed(state, body.server_url)
            if not limiter:
                limiter.append(anyio.CapacityLimiter(MAX_CONCURRENT_SCRAPES))
            try:
                observed = await anyio.to_thread.run_sync(
                    _observe, body.server_url, body.window_s, body.interval_s, limiter=limiter[0]
                )
            except ScrapeError as exc:
                raise _scrape_failed(body.server_url, exc) from None
        return answer(state, state.models, body, observed)

    return router
