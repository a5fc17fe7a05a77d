"""``POST /v1/check``: ``graphmode check`` as a service, for a CI pipeline that gates a manifest on it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from graphmode.check.load import release_costs
from graphmode.check.rules import CheckInputs, check_deployment
from graphmode.core.errors import GraphmodeError
from graphmode.service.check_schemas import CheckReport, CheckRequest
from graphmode.service.deps import StateDep

router = APIRouter(tags=["check"])


@router.post("/v1/check", response_model=CheckReport,
             responses={422: {"description": "args vLLM would refuse (e.g. a malformed --compilation-config)"}})
def check(body: CheckRequest, state: StateDep) -> CheckReport:
    """The mode, capture list, decode coverage and graph costs vLLM will have for ``vllm_args``; ``ok`` is
    False when a finding is an error."""
    served = body.served_model_config.as_dict() if body.served_model_config is not None else None
    costs, _ = release_costs(state.models.models_dir, body.vllm_version, None, served)
    try:
        return check_deployment(CheckInputs(vllm_args=body.vllm_args, served_config=served,
                                            vllm_version=body.vllm_version, gpu_memory_gib=body.gpu_memory_gib,
                                            costs=costs))
    except GraphmodeError as exc:
        raise HTTPException(status_code=422, detail=[{"loc": ["body", "vllm_args"], "msg": str(exc),
                                                      "type": "value_error"}]) from None
