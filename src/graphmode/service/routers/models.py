"""``GET /v1/models``, ``GET /v1/models/{model_id}`` (the card) and ``POST /v1/reload`` (token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from graphmode.core.errors import GraphmodeError
from graphmode.selector.card import ModelCard
from graphmode.service.deps import ModelsDep, StateDep, TokenDep
from graphmode.service.redact import redact_paths, redact_tree
from graphmode.service.schemas import MODEL_ID_PATTERN, ModelList, ModelSummary, ReloadResponse

router = APIRouter(prefix="/v1", tags=["models"])
ModelIdPath = Annotated[str, Path(max_length=200, pattern=MODEL_ID_PATTERN)]


@router.get("/models", response_model=ModelList)
async def list_loaded_models(models: ModelsDep) -> ModelList:
    """The models the service loaded (at start-up or the last reload), and the ones it could not load."""
    default_id = models.default.model_id if models.default is not None else None
    items = [
        ModelSummary.of(mid, rec.card, loaded=True, default=mid == default_id, match=rec.match)
        for mid, rec in sorted(models.by_id.items())
    ]
    items += [
        ModelSummary.of(mid, None, loaded=False, default=False, error=redact_paths(err))
        for mid, err in sorted(models.broken.items())
    ]
    return ModelList(
        models_dir=models.models_dir.name,  # open endpoint: the folder's name, not its place on this host
        default_model_id=default_id,
        loaded_at=models.loaded_at,
        models=items,
    )


@router.get(
    "/models/{model_id}",
    response_model=ModelCard,
    responses={404: {"description": "no such model loaded"}},
)
async def get_model_card(model_id: ModelIdPath, models: ModelsDep) -> Response:
    """A loaded model's card: fingerprints, training data, CV results, metrics, default objective."""
    rec = models.by_id.get(model_id)
    if rec is None:
        why = models.broken.get(model_id)
        known = ", ".join(sorted(models.by_id)) or "none"
        raise HTTPException(
            status_code=404,
            detail=f"model {model_id!r} could not be loaded: {redact_paths(why)}"
            if why
            else f"no model {model_id!r} loaded (loaded: {known})",
        )
    # Paths in the card (the training host's model folders in vLLM arguments, dataset files) are reduced
    # to their last component: the endpoint is open.
    return JSONResponse(redact_tree(rec.card.model_dump(mode="json")))


@router.post(
    "/reload",
    response_model=ReloadResponse,
    dependencies=[TokenDep],
    responses={
        401: {"description": "missing or wrong bearer token"},
        403: {"description": "no service token configured: endpoint disabled"},
        500: {"description": "the models could not be loaded; the old ones stay"},
    },
)
async def reload_models(state: StateDep) -> ReloadResponse:
    """Load the registry again and swap it in atomically (requests in flight finish on the old models);
    the service's other workers follow within ``reload_poll_s`` seconds."""
    try:
        previous, new = await run_in_threadpool(state.reload_all)
    except GraphmodeError as exc:
        raise HTTPException(status_code=500, detail=f"reload failed, the previous models stay loaded: {exc}") from None
    warnings = []
    if new.default is None:
        warnings.append(f"no model loaded: {new.load_error}")
    warnings += [f"{mid} not loaded: {err}" for mid, err in sorted(new.broken.items())]
    return ReloadResponse(
        default_model_id=new.default.model_id if new.default is not None else None,
        models_loaded=len(new.by_id),
        models_broken=len(new.broken),
        previous_default_model_id=previous,
        loaded_at=new.loaded_at or 0.0,
        warnings=warnings,
    )
