"""``GET /healthz`` (200 with models loaded, 503 without) and ``GET /metrics`` (Prometheus)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response

from graphmode import __version__
from graphmode.service.deps import StateDep
from graphmode.service.redact import redact_paths
from graphmode.service.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": "no model"}})
async def healthz(state: StateDep) -> Response:
    models = state.models
    job = state.jobs.running()
    health = Health(
        status="ok" if models.default is not None else "no_models",
        version=__version__,
        models_loaded=len(models.by_id),
        models_broken=len(models.broken),
        default_model_id=models.default.model_id if models.default is not None else None,
        synthetic_model=models.default.card.synthetic if models.default is not None else None,
        models_dir=models.models_dir.name,  # not where it lives on this host: the endpoint is open
        loaded_at=models.loaded_at,
        uptime_s=round(time.time() - state.started_at, 3),
        job_running=job.id if job is not None else None,
        load_error=redact_paths(models.load_error) if models.load_error else None,
    )
    return Response(
        health.model_dump_json(),
        status_code=200 if models.default is not None else 503,
        media_type="application/json",
    )


@router.get("/metrics", include_in_schema=False)
async def metrics(state: StateDep) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)
