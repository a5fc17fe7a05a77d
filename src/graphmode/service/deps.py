"""Request dependencies (``Annotated`` aliases, as in the FastAPI full-stack template).

All are ``async def``: a plain ``def`` dependency would be run in the threadpool on every request.

Auth: mutating endpoints (retrain, reload, jobs) depend on :func:`require_token`:

* no token configured (``GRAPHMODE_SERVICE__TOKEN`` unset or empty) → **403**, the endpoint is
  disabled; the service is never open by default;
* no ``Authorization: Bearer …`` header → **401** with ``WWW-Authenticate: Bearer``;
* a wrong token → **401** (``error="invalid_token"``); tokens are compared with ``hmac.compare_digest``.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from graphmode.core.records import Fingerprint
from graphmode.selector.recommend import Recommender
from graphmode.selector.registry import match_card
from graphmode.service.redact import redact_paths
from graphmode.service.state import LoadedModels, ServiceState

bearer = HTTPBearer(
    auto_error=False,
    description="The service token (settings.service.token, env GRAPHMODE_SERVICE__TOKEN).",
)


async def get_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


StateDep = Annotated[ServiceState, Depends(get_state)]


async def get_models(state: StateDep) -> LoadedModels:
    """The models loaded now: one snapshot for the whole request, even if a reload swaps them meanwhile."""
    return state.models


ModelsDep = Annotated[LoadedModels, Depends(get_models)]


def pick_recommender(models: LoadedModels, model_id: str | None) -> Recommender:
    """``model_id``'s recommender (404 if not loaded), or the default one (503 if none is loaded)."""
    if model_id is None:
        if models.default is None:
            raise HTTPException(
                status_code=503,
                detail=f"no model loaded ({redact_paths(models.load_error or 'unknown')}); train one "
                "(graphmode train, or POST /v1/retrain) and POST /v1/reload",
            )
        return models.default
    rec = models.by_id.get(model_id)
    if rec is None:
        why = models.broken.get(model_id)
        known = ", ".join(sorted(models.by_id)) or "none"
        detail = (
            f"model {model_id!r} could not be loaded: {redact_paths(why)}"
            if why
            else f"model {model_id!r} is not loaded (loaded: {known})"
        )
        raise HTTPException(status_code=404, detail=detail)
    return rec


def pick_for_server(models: LoadedModels, target: Fingerprint | None, vllm_version: str) -> Recommender:
    """The loaded model that best fits a scraped server: the service's own ``target`` (its GPU…) with the
    server's ``vllm_version``, scored and tie-broken as the registry's ``select_model`` does (score, rows
    used, newest). 503 when no model is loaded.

    The answer carries the match against that target; the loaded recommender is shared by other requests
    and never changed, so a different match comes as a copy."""
    default = pick_recommender(models, None)
    fp = (target or Fingerprint()).model_copy(update={"vllm_version": vllm_version})
    candidates = {default.model_id: default, **models.by_id}
    matches = {mid: match_card(rec.card, fp) for mid, rec in candidates.items()}

    def key(mid: str) -> tuple[float, int, str]:
        card = candidates[mid].card
        return (matches[mid].score, card.dataset.rows_used, card.created_at)

    best = max(candidates, key=key)
    rec, match = candidates[best], matches[best]
    return rec if rec.match == match else rec.with_match(match)


async def get_recommender(models: ModelsDep) -> Recommender:
    """The default recommender (503 when no model is loaded)."""
    return pick_recommender(models, None)



def _unauthorized(detail: str, error: str | None = None) -> HTTPException:
    challenge = 'Bearer realm="graphmode"' + (f', error="{error}"' if error else "")
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": challenge})


async def require_token(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    token = state.settings.service.token
    if token is None:
        raise HTTPException(
            status_code=403,
            detail="this endpoint is disabled: no service token is configured; set "
            "GRAPHMODE_SERVICE__TOKEN and restart to enable retrain, reload and jobs",
        )
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    expected = token.get_secret_value().encode("utf-8")
    if not hmac.compare_digest(credentials.credentials.encode("utf-8", "backslashreplace"), expected):
        raise _unauthorized("invalid token", "invalid_token")


TokenDep = Depends(require_token)


def token_valid(state: ServiceState, credentials: HTTPAuthorizationCredentials | None) -> bool:
    """Whether the request carries the configured token (never raises: for endpoints open to all that
    allow more to token holders)."""
    token = state.settings.service.token
    if token is None or credentials is None or credentials.scheme.lower() != "bearer":
        return False
    expected = token.get_secret_value().encode("utf-8")
    return hmac.compare_digest(credentials.credentials.encode("utf-8", "backslashreplace"), expected)


CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
