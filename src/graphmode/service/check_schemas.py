"""Request and response bodies of ``POST /v1/check`` (the response is the CLI's :class:`CheckReport`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from graphmode.check.findings import CheckReport
from graphmode.service.schemas import ServedModelConfig

__all__ = ["CheckReport", "CheckRequest"]


class CheckRequest(BaseModel):
    """A vLLM command line to check. The service never reads a path the args name: the served model's
    config.json comes in the body, or the checks that need it are skipped (and say so)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    vllm_args: list[Annotated[str, Field(max_length=65536)]] = Field(
        max_length=200, description="vLLM's serve args, as after `vllm serve`")
    served_model_config: ServedModelConfig | None = Field(None, description="the served model's config.json")
    vllm_version: str | None = Field(None, max_length=64, pattern=r"^[0-9A-Za-z.+\-]+$",
                                     description="vLLM's release: picks the cost model measured on it")
    gpu_memory_gib: float | None = Field(None, gt=0, le=4096, description="the GPU's memory, GiB")
