"""The one decision path: a request in, one typed answer out.

::

    answer = decide(recommender, Request(inputs=WorkloadDescription(...), objective="ttft_p50",
                                         vllm_args=[...], served_config=config_json))

``graphmode recommend``, ``POST /v1/recommend``, ``graphmode launch`` and ``graphmode watch`` each pick the
model for their target (GPU, vLLM release: :func:`graphmode.selector.registry.select_model` or the service's
loaded models) and then call :func:`decide`; they render its :class:`~graphmode.selector.answer.Recommendation`
and assemble nothing. What the answer stands on (the race verdicts whose region holds the request, or vLLM's
default with the region it lies outside) is decided once, in :meth:`Recommender.recommend`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphmode.core.deployment import DeploymentConfig
from graphmode.core.fingerprint import shape_of_config
from graphmode.core.records import ObservedFeatures, StepSizes
from graphmode.selector.answer import FeatureSource, Finding, Recommendation
from graphmode.selector.capture import CaptureBudget
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.objective import Objective
from graphmode.selector.recommend import Recommender


@dataclass(frozen=True)
class Request:
    """What a caller asks: the traffic (a description or observed features), the objective, and the
    deployment (its vLLM args, the served model's config.json, its environment, the step sizes seen)."""

    inputs: ObservedFeatures | WorkloadDescription | Mapping[str, Any]
    objective: Objective | str | None = None
    source: FeatureSource | None = None
    vllm_args: Sequence[str] | None = None
    served_config: Mapping[str, Any] | None = None
    deployment: DeploymentConfig | None = None  # built by the caller (strict or not); else from vllm_args
    env: Mapping[str, str] | None = None
    step_sizes: StepSizes | None = None
    budget: CaptureBudget | None = None
    # a capture list predicted from a workload description (tens of ms: the profiled cells are scored): the
    # CLI and launch ask for it; the service only when the body asks for capture sizes (a budget, args, steps)
    predict_capture: bool = True


def decide(rec: Recommender, request: Request) -> Recommendation:
    """The answer for *request* from model *rec*: for the served model's shape, under the deployment's
    configuration, with the modes vLLM would downgrade there left out and, given step sizes, capture sizes."""
    served = dict(request.served_config) if request.served_config is not None else None
    if served is not None:
        rec = rec.for_shape(shape_of_config(served))
    deployment = request.deployment
    if deployment is None and request.vllm_args is not None:
        deployment = DeploymentConfig.from_vllm_args(list(request.vllm_args), dict(request.env or {}), served,
                                                     strict=False)
    if deployment is not None:
        rec = rec.for_deployment(deployment)
    answer = rec.recommend(request.inputs, request.objective, source=request.source)
    # a description's step sizes are predicted for a capture list, where asked
    described = isinstance(request.inputs, WorkloadDescription) and request.predict_capture
    if request.step_sizes is None and request.vllm_args is None and not described:
        return answer
    return _complete(answer, rec, request, served)


def _complete(answer: Recommendation, rec: Recommender, request: Request,
              served: dict[str, Any] | None) -> Recommendation:
    from graphmode.selector.graphconfig import complete

    description = (request.inputs if isinstance(request.inputs, WorkloadDescription) and request.predict_capture
                   else None)
    kwargs: dict[str, Any] = dict(step_sizes=request.step_sizes, vllm_args=list(request.vllm_args or []),
                                  served_config=served, budget=request.budget, model_folder=rec.folder,
                                  env=request.env)
    # a workload description predicts the step sizes the capture list is chosen for
    out = complete(answer, **kwargs, description=description)
    if out.mode != answer.mode:  # vLLM would downgrade the chosen mode here: complete() said why, first
        out.findings.append(Finding(kind="downgraded", text=out.notes[len(answer.notes)]))
    return out
