"""What ``graphmode check`` reports: findings with a severity, evidence and a fix, and the resolved config."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


class Evidence(BaseModel):
    """Why a finding holds: vLLM's rule and where it lives, and what was measured or reported."""

    model_config = ConfigDict(extra="forbid")

    rule: str = Field(description="the rule vLLM applies, in words")
    vllm_source: str = Field(description="where vLLM applies it (file and function)")
    measured: str | None = Field(None, description="a race or measurement that shows what it costs")
    reports: list[str] = Field(default_factory=list, description="public vLLM issues of this class")


class Finding(BaseModel):
    """One thing about the configuration, with what to pass instead."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="the finding's type, stable for scripts")
    severity: Severity
    message: str
    evidence: Evidence
    fix: list[str] | None = Field(None, description="vLLM args that fix it (replacing the same flags)")
    drop: list[str] = Field(default_factory=list, description="vLLM flags the fix removes")


class GraphCost(BaseModel):
    """Predicted start-up and memory cost of the capture list, with the cost model's uncertainty."""

    model_config = ConfigDict(extra="forbid")

    capture_s: float | None = None
    graph_gib: float | None = None
    reserved_gib: float | None = Field(None, description="GiB vLLM reserves for the graphs before the KV cache")
    kv_tokens: int | None = Field(None, description="KV cache tokens the graphs' memory would otherwise hold")
    kv_share: float | None = Field(None, description="those tokens as a share of the KV cache this GPU holds")
    rel_error_s: float | None = Field(None, description="largest leave-one-out relative error of capture s")
    rel_error_gib: float | None = Field(None, description="largest leave-one-out relative error of graph GiB")
    basis: str = "no cost model"


class Resolved(BaseModel):
    """What vLLM will run, read from the args, the model's config.json and the release."""

    model_config = ConfigDict(extra="forbid")

    vllm_version: str | None
    requested_mode: str
    mode: str = Field(description="the mode vLLM will run")
    max_num_seqs: int
    max_num_seqs_source: str
    max_num_batched_tokens: int
    speculative_k: int | None
    decode_query_len: int = Field(description="tokens a request per decode step: 1 + speculative tokens")
    capture_sizes: list[int] = Field(description="the list vLLM will capture")
    decode_graph_sizes: list[int] = Field(description="sizes of the FULL decode graphs (multiples of 1 + k "
                                          "with speculative decoding); the list itself without it")
    largest_decode_step: int = Field(description="max_num_seqs x (1 + k): the largest decode step")
    cost: GraphCost


class CheckReport(BaseModel):
    """Every finding, worst first, and what was resolved; ``ok`` is False when any finding is an error."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    resolved: Resolved
    findings: list[Finding]

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)
