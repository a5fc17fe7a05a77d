"""``POST /v1/recommend``: the hot path.

The endpoint is ``async def`` and calls the in-process recommender directly on the event loop (a fraction of a
millisecond of CPU per answer: docs/results/service-latency.md): measured faster than a plain ``def`` endpoint,
which FastAPI would run in its threadpool (docs/lab/operations.md). Only the ``server_url`` input blocks (it
scrapes a server for ``window_s``), so that runs in a worker thread, in one of :data:`MAX_CONCURRENT_SCRAPES`
slots: when every slot is taken the request is answered 429 with ``Retry-After`` at once, never queued. Without
the bearer token ``window_s`` may not exceed ``settings.service.open_max_window_s``, so nobody holds the slots
for long unannounced. The scrape fetches ``scheme://host:port/metrics`` only and its errors never quote what
the server sent; right before the window it asks the same ``host:port`` for ``/version`` (nothing else), so
that a request without ``model_id`` is answered by the loaded model of that server's vLLM release
(``pick_for_server``). The answer is serialized once by pydantic and returned as bytes, never re-validated.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from fastapi import APIRouter, HTTPException, Response

from graphmode.core.errors import ObjectiveError, ScrapeError
from graphmode.core.records import ObservedFeatures
from graphmode.selector.decide import Request, decide
from graphmode.selector.recommend import FeatureSource, Recommender
from graphmode.service.deps import CredentialsDep, StateDep, pick_for_server, pick_recommender, token_valid
from graphmode.service.schemas import TRAFFIC_FEATURES, RecommendRequest, RecommendResponse
from graphmode.service.state import LoadedModels, ServiceState

MAX_CONCURRENT_SCRAPES = 8

_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "model_id is not a loaded model"},
    413: {"description": "body larger than settings.service.max_body_bytes"},
    422: {
        "description": "invalid body: the field, and for metrics the list of known ones; a server_url "
        "whose /metrics shows no vLLM traffic metrics; window_s above the open limit without the token"
    },
    403: {"description": "server_url names a host or port outside settings.service.scrape_hosts/scrape_ports"},
    429: {"description": "every scrape slot is taken: retry after Retry-After seconds"},
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


def _observe_server(
    url: str, window_s: float, interval_s: float, want_version: bool
) -> tuple[ObservedFeatures, str | None]:
    """The server's features and, when asked, its vLLM version (read first, from the URL already allowed)."""
    from graphmode.selector.registry import server_version

    version = server_version(url) if want_version else None
    return _observe(url, window_s, interval_s), version


def scrape_refusal(url: str, allowed: Sequence[str], ports: Sequence[int] = ()) -> str | None:
    """Why the service will not scrape *url* (its host is not in *allowed*, or its port not in a
    non-empty *ports*), or None when it may."""
    parts = urlsplit(url if "://" in url else "http://" + url)
    if ports:
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            port = -1
        if port not in ports:
            return (f"server_url port {port} is not one this service may scrape; allowed: "
                    f"{', '.join(map(str, ports))} (settings.service.scrape_ports, env "
                    "GRAPHMODE_SERVICE__SCRAPE_PORTS)")
    if "*" in allowed:
        return None
    host = (parts.hostname or "").lower()
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


def _check_scrape_allowed(state: ServiceState, body: RecommendRequest, authorized: bool) -> str:
    """The URL to scrape, once the request may scrape it (HTTPException otherwise)."""
    from graphmode.selector.live import metrics_url

    assert body.server_url is not None
    service = state.settings.service
    why = scrape_refusal(body.server_url, service.scrape_hosts, service.scrape_ports)
    if why is not None:
        raise HTTPException(status_code=403, detail=why)
    if body.window_s > service.open_max_window_s and not authorized:
        raise HTTPException(
            status_code=422,
            detail=[
                {
                    "loc": ["body", "window_s"],
                    "msg": f"window_s above {service.open_max_window_s:g} s needs the service token "
                    "(Authorization: Bearer)",
                    "type": "value_error",
                }
            ],
        )
    return metrics_url(body.server_url)


def _scrape_failed(url: str, exc: ScrapeError) -> HTTPException:
    # What went wrong, in our words only: the server's reply (a page that is not vLLM's /metrics, an
    # error body) is never quoted back to the caller.
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPStatusError):
        why = f"it answered HTTP {cause.response.status_code}"
    elif isinstance(cause, httpx.TimeoutException):
        why = "it did not answer in time"
    elif isinstance(cause, httpx.HTTPError):
        why = f"no connection ({type(cause).__name__})"
    else:
        why = "its reply is not Prometheus metrics text"
    return HTTPException(status_code=502, detail=f"could not scrape {url}: {why}")


def _no_vllm_traffic(url: str, observed: ObservedFeatures) -> HTTPException:
    return HTTPException(
        status_code=422,
        detail=[
            {
                "loc": ["body", "server_url"],
                "msg": f"no vLLM traffic metrics were observed at {url} ({observed.n_samples or 0} scrapes "
                "over the window): is it a vLLM server? Same rule as features: at least one traffic "
                "feature is needed",
                "type": "value_error",
            }
        ],
    )


class ScrapeSlots:
    """At most ``size`` scrapes at once; a request finding every slot taken is refused at once (429)
    with ``Retry-After``: the seconds until the earliest running scrape should end. Used from the event
    loop only, so plain counters suffice."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.ends: dict[int, float] = {}
        self._next = 0
        self._threads: anyio.CapacityLimiter | None = None

    def take(self, window_s: float) -> int:
        now = time.monotonic()
        if len(self.ends) >= self.size:
            wait = max(1, math.ceil(min(self.ends.values()) - now))
            raise HTTPException(
                status_code=429,
                detail=f"all {self.size} scrape slots are in use; retry in {wait} s",
                headers={"Retry-After": str(wait)},
            )
        self._next += 1
        self.ends[self._next] = now + window_s
        return self._next

    def give(self, slot: int) -> None:
        self.ends.pop(slot, None)

    async def observe(
        self, url: str, window_s: float, interval_s: float, want_version: bool = False
    ) -> tuple[ObservedFeatures, str | None]:
        if self._threads is None:  # created on the running loop
            self._threads = anyio.CapacityLimiter(self.size)
        slot = self.take(window_s)
        try:
            return await anyio.to_thread.run_sync(
                _observe_server, url, window_s, interval_s, want_version, limiter=self._threads
            )
        finally:
            self.give(slot)


def _picks_by_server(state: ServiceState, body: RecommendRequest) -> bool:
    """Whether a request's model follows the scraped server's vLLM version: a server_url request naming no
    model, on a service not pinned to one (as the CLI: an explicit model id wins over any fingerprint)."""
    return body.server_url is not None and body.model_id is None and not state.model_id


def _picks_by_release(state: ServiceState, body: RecommendRequest) -> bool:
    """Whether a request's own ``vllm_version`` picks its model (``graphmode launch`` sends it): as a
    server's, but named in the request."""
    return body.vllm_version is not None and body.model_id is None and not state.model_id


def answer(
    state: ServiceState,
    models: LoadedModels,
    body: RecommendRequest,
    observed: ObservedFeatures | None,
    server_vllm: str | None = None,
) -> Response:
    unread: str | None = None
    if server_vllm is not None and _picks_by_server(state, body):
        rec = pick_for_server(models, state.target, server_vllm)
    elif body.vllm_version is not None and _picks_by_release(state, body):
        rec = pick_for_server(models, state.target, body.vllm_version)
    else:
        rec = pick_recommender(models, body.model_id)
        if observed is not None and _picks_by_server(state, body):
            unread = (f"the server's vLLM version could not be read (GET /version): the default model "
                      f"{rec.model_id} answered, chosen for this service's own fingerprint")
    try:
        objective = state.objective(body.objective, rec) if body.objective is not None else None
    except ObjectiveError as exc:
        raise _objective_error(exc) from None
    inputs: Any = body.features or body.workload or observed
    source: FeatureSource | None = "server" if observed is not None else None
    t0 = time.perf_counter()
    served = body.served_model_config.as_dict() if body.served_model_config is not None else None
    request = Request(inputs=inputs, objective=objective, source=source, vllm_args=body.vllm_args,
                      served_config=served, deployment=body.deployment(), env={}, step_sizes=body.step_sizes,
                      budget=body.capture_budget,
                      predict_capture=body.capture_budget is not None or body.vllm_args is not None)
    try:
        result = decide(rec, request)
    except ObjectiveError as exc:
        far = _far_out(rec, inputs)
        if far:  # the estimators predict nothing usable that far out: say why, about the input
            raise HTTPException(
                status_code=422,
                detail=[
                    {
                        "loc": ["body", "features" if body.features is not None else "workload"],
                        "msg": f"the input is too far outside what model {rec.model_id} was profiled on "
                        f"({', '.join(far)}) for any prediction: {exc}",
                        "type": "value_error",
                    }
                ],
            ) from None
        raise _objective_error(exc) from None
    if unread is not None:
        result.warnings.append(unread)
    elif server_vllm is not None and _picks_by_server(state, body):
        result.notes.append(f"model {result.model_id} chosen for the server's vLLM {server_vllm}")
    elif body.vllm_version is not None and _picks_by_release(state, body):
        result.notes.append(f"model {result.model_id} chosen for the deployment's vLLM {body.vllm_version}")
    metrics = state.metrics
    metrics.compute.observe(time.perf_counter() - t0)
    metrics.recommendations.labels(result.mode, result.model_id, result.features_source).inc()
    # RecommendResponse is the Recommendation under the API's name: same fields, so the selector's object is
    # serialized as is (no copy, no re-validation).
    return Response(result.model_dump_json(), media_type="application/json")


def _far_out(rec: Recommender, inputs: Any) -> list[str]:
    """The input's features outside the model's profiled range (none when that cannot be told)."""
    try:
        feats, _ = rec.features_of(inputs)
        x, _ = rec.spec.vectorize(feats)
        return list(rec.spec.out_of_range(x))
    except Exception:  # only for wording an error: never the cause of another
        return []


def _objective_error(exc: ObjectiveError) -> HTTPException:
    return HTTPException(
        status_code=422,
        detail=[{"loc": ["body", "objective"], "msg": str(exc), "type": "objective_error"}],
    )


def _observed_or_error(url: str, observed: ObservedFeatures) -> ObservedFeatures:
    if all(getattr(observed, n) is None for n in TRAFFIC_FEATURES):
        raise _no_vllm_traffic(url, observed)
    return observed


def build_router(*, threadpool: bool = False) -> APIRouter:
    """The recommend router; ``threadpool=True`` registers a plain ``def`` endpoint instead (for the
    benchmark's comparison only)."""
    router = APIRouter(prefix="/v1", tags=["recommend"])
    if threadpool:

        @router.post("/recommend", response_model=RecommendResponse, responses=_RESPONSES, description=_DOC)
        def recommend_threaded(body: RecommendRequest, state: StateDep, credentials: CredentialsDep) -> Response:
            observed, version = None, None
            if body.server_url is not None:
                url = _check_scrape_allowed(state, body, token_valid(state, credentials))
                try:
                    observed, version = _observe_server(
                        url, body.window_s, body.interval_s, _picks_by_server(state, body))
                except ScrapeError as exc:
                    raise _scrape_failed(url, exc) from None
                observed = _observed_or_error(url, observed)
            return answer(state, state.models, body, observed, version)

        return router

    slots = ScrapeSlots(MAX_CONCURRENT_SCRAPES)

    @router.post("/recommend", response_model=RecommendResponse, responses=_RESPONSES, description=_DOC)
    async def recommend(body: RecommendRequest, state: StateDep, credentials: CredentialsDep) -> Response:
        observed, version = None, None
        if body.server_url is not None:
            url = _check_scrape_allowed(state, body, token_valid(state, credentials))
            try:
                observed, version = await slots.observe(
                    url, body.window_s, body.interval_s, _picks_by_server(state, body))
            except ScrapeError as exc:
                raise _scrape_failed(url, exc) from None
            observed = _observed_or_error(url, observed)
        return answer(state, state.models, body, observed, version)

    return router
