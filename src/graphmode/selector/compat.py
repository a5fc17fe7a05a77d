"""Modes vLLM would silently downgrade for a deployment, so graphmode never recommends them.

vLLM resolves the requested ``cudagraph_mode`` against what the attention backend and the model can run and,
where they cannot, logs a warning and runs another mode. The rules below restate vLLM's own checks
(vLLM 0.24 and 0.33 source: ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` in
vllm/config/compilation.py, the pooling / encoder-decoder checks and, in 0.33, the dynamic speculative
decoding check in vllm/config/vllm.py) and the CUDA-graph support level each attention
backend declares (``AttentionCGSupport`` in vllm/v1/attention/backends/*). The lines vLLM prints are parsed
by :mod:`graphmode.profiling.logparse` (``StartupInfo.downgrades``) and come back as the effective mode.

Support levels, weakest first: NEVER < UNIFORM_SINGLE_TOKEN_DECODE < UNIFORM_BATCH < ALWAYS.

* Mixed (prefill + decode) steps in a FULL graph (FULL) need ALWAYS; below it vLLM runs
  FULL_AND_PIECEWISE (attention split out, vLLM's default splitting) — "... is not supported with X backend
  (support: ...); setting cudagraph_mode=FULL_AND_PIECEWISE".
* FULL decode graphs need more than NEVER; at NEVER, PIECEWISE.
* Speculative decoding (a decode step has more than one token per request) with FULL decode graphs needs
  UNIFORM_BATCH; below it, PIECEWISE ("... not supported with spec-decode for attention backend ...").
  The proposer does not matter: ngram with FLASH_ATTN ran FULL, FULL_DECODE_ONLY and FULL_AND_PIECEWISE as
  asked on the H200 (vLLM 0.33, tests/fixtures/vllm-0.33-h200/llama1b-ngram3-FULL.log). An earlier rule here
  sent every ngram deployment to PIECEWISE, which vLLM's source never did and which costs 1.6x ITL.
* Dynamic speculative decoding (``num_speculative_tokens_per_batch_size`` in the speculative config) on
  Model Runner V1: PIECEWISE ("Dynamic speculative decoding changes the target verification length at
  runtime. Overriding cudagraph_mode ..."); V2 (``VLLM_USE_V2_MODEL_RUNNER=1``) keeps full graphs.
* Pooling models (``--runner pooling``, ``--task embed|classify|score|reward``, or ``--convert``):
  no full graphs, PIECEWISE ("Pooling models do not support full cudagraphs").
* Encoder-decoder models: only NONE or FULL_DECODE_ONLY ("Encoder-decoder models do not support X.
  Overriding cudagraph_mode to FULL_DECODE_ONLY").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from graphmode.vllm_args import get_flag, has_flag

NEVER, SINGLE_TOKEN, UNIFORM, ALWAYS = 0, 1, 2, 3
_LEVEL_NAME: Final = {NEVER: "NEVER", SINGLE_TOKEN: "UNIFORM_SINGLE_TOKEN_DECODE", UNIFORM: "UNIFORM_BATCH",
                      ALWAYS: "ALWAYS"}

# AttentionCGSupport each backend declares (vLLM 0.24). FLASH_ATTN is FlashAttention 3 on Hopper (ALWAYS);
# with FA2 (pre-Hopper) it is UNIFORM_BATCH, which this table cannot tell from the name: it errs on the side
# of the Hopper fixtures, and an unknown backend gets no rule at all.
BACKEND_SUPPORT: Final[dict[str, int]] = {
    "FLASH_ATTN": ALWAYS,
    "TRITON_ATTN": ALWAYS,
    "FLASHINFER": SINGLE_TOKEN,
    "FLEX_ATTENTION": NEVER,
    "FLASHMLA": UNIFORM,
    "FLASH_ATTN_MLA": UNIFORM,
    "CUTLASS_MLA": SINGLE_TOKEN,
    "TRITON_MLA": NEVER,
    "ROCM_AITER_FA": UNIFORM,
    "TREE_ATTN": NEVER,
}
_POOLING_TASKS: Final = frozenset({"embed", "embedding", "classify", "score", "reward", "pooling"})
ALL_MODES: Final = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@dataclass(frozen=True)
class Deployment:
    """What about a deployment decides which modes vLLM runs as asked."""

    attention_backend: str | None = None
    speculative: bool = False
    speculative_method: str | None = None
    speculative_k: int | None = None  # num_speculative_tokens: a decode step verifies 1 + k tokens a request
    dynamic_speculative: bool = False
    pooling: bool = False
    encoder_decoder: bool = False


def deployment_of(args: Sequence[str], served_config: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None) -> Deployment:
    """Read the deciding facts from vLLM's arguments, its environment and the served model's config.json."""
    env = os.environ if env is None else env
    args = list(args)
    backend = get_flag(args, "--attention-backend") or env.get("VLLM_ATTENTION_BACKEND") or None
    spec_raw = get_flag(args, "--speculative-config", "--speculative_config")
    method = None
    dynamic = False
    k: int | None = None
    if spec_raw:
        try:
            spec = json.loads(spec_raw)
        except json.JSONDecodeError:
            spec = None
        if isinstance(spec, dict):
            method = str(spec.get("method")) if spec.get("method") is not None else None
            dynamic = spec.get("num_speculative_tokens_per_batch_size") is not None \
                and env.get("VLLM_USE_V2_MODEL_RUNNER", "0") in {"", "0"}
            raw_k = spec.get("num_speculative_tokens")
            k = raw_k if isinstance(raw_k, int) and not isinstance(raw_k, bool) and raw_k >= 1 else None
            inner = spec.get("attention_backend")
            if isinstance(inner, str) and backend is None:
                backend = inner
    task = (get_flag(args, "--task") or "").lower()
    runner = (get_flag(args, "--runner") or "").lower()
    convert = (get_flag(args, "--convert") or "").lower()
    pooling = runner == "pooling" or task in _POOLING_TASKS or convert in {"embed", "classify", "reward"}
    enc_dec = bool(served_config and served_config.get("is_encoder_decoder"))
    if k is None and spec_raw is None:
        flag_k = get_flag(args, "--num-speculative-tokens")
        k = int(flag_k) if flag_k and flag_k.isdigit() and int(flag_k) >= 1 else None
    return Deployment(attention_backend=backend.upper() if backend else None,
                      speculative=bool(spec_raw) or has_flag(args, "--num-speculative-tokens"),
                      speculative_k=k,
                      speculative_method=method, dynamic_speculative=dynamic, pooling=pooling,
                      encoder_decoder=enc_dec)


def resolve(mode: str, dep: Deployment) -> tuple[str, list[str]]:
    """The mode vLLM would run when asked for ``mode`` in ``dep``, and why (empty when it runs as asked)."""
    mode = mode.upper()
    why: list[str] = []
    if mode == "NONE":
        return mode, why
    if dep.pooling and mode in {"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}:
        why.append(f"pooling models do not support full CUDA graphs: vLLM overrides {mode} to PIECEWISE")
        return "PIECEWISE", why
    if dep.encoder_decoder and mode not in {"FULL_DECODE_ONLY"}:
        why.append(f"encoder-decoder models do not support {mode}: vLLM overrides it to FULL_DECODE_ONLY")
        mode = "FULL_DECODE_ONLY"
    if dep.dynamic_speculative and mode in {"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}:
        why.append("dynamic speculative decoding changes the verification length at run time: vLLM overrides "
                   f"{mode} to PIECEWISE on Model Runner V1")
        return "PIECEWISE", why
    level = BACKEND_SUPPORT.get(dep.attention_backend or "")
    if level is None:
        return mode, why
    name = f"{dep.attention_backend} (support {_LEVEL_NAME[level]})"
    if mode == "FULL" and level != ALWAYS:
        if level == NEVER:
            why.append(f"{name} cannot run full CUDA graphs: vLLM refuses FULL")
            return "PIECEWISE", why
        why.append(f"{name} cannot graph mixed prefill-decode steps: vLLM runs FULL as FULL_AND_PIECEWISE")
        mode = "FULL_AND_PIECEWISE"
    if mode in {"FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"} and level == NEVER:
        why.append(f"{name} cannot run full decode graphs: vLLM sets {mode} to PIECEWISE")
        return "PIECEWISE", why
    if mode in {"FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"} and dep.speculative and level < UNIFORM:
        why.append(f"{name} cannot graph speculative decode steps: vLLM sets {mode} to PIECEWISE")
        return "PIECEWISE", why
    return mode, why


def allowed_modes(dep: Deployment) -> dict[str, str | None]:
    """Every mode mapped to ``None`` when vLLM runs it as asked, else to the reason it would not."""
    out: dict[str, str | None] = {}
    for mode in ALL_MODES:
        runs, why = resolve(mode, dep)
        out[mode] = None if runs == mode else "; ".join(why)
    return out


def safe_mode(mode: str, dep: Deployment) -> tuple[str, str | None]:
    """``mode`` when vLLM runs it as asked; otherwise the mode vLLM would run instead (recommending that
    directly is honest: it is what would be measured) and the reason."""
    runs, why = resolve(mode, dep)
    if runs == mode.upper():
        return runs, None
    return runs, f"{mode.upper()} is not recommended: {'; '.join(why)}; recommending {runs}, what vLLM would run"
