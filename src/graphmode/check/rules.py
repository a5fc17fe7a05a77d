"""The checks: from vLLM's args, the served model's config.json and the release, what the graphs will be.

Resolution follows vLLM's own rules, restated (never imported: vLLM runs only as an external process):

* Mode: ``cudagraph_mode`` from ``--compilation-config`` (vLLM's default FULL_AND_PIECEWISE), ``NONE`` under
  ``--enforce-eager``, then the downgrades of :mod:`graphmode.selector.compat` (attention backend, speculative
  decoding, pooling, encoder-decoder).
* Scheduler defaults where the args leave them out: ``max_num_seqs`` 1024 and ``max_num_batched_tokens`` 8192
  on a GPU with 70 GiB or more, 256 and 2048 below (``EngineArgs._set_default_args`` in
  vllm/engine/arg_utils.py; the H200 logs show 8192).
* Capture list (``VllmConfig._set_cudagraph_sizes`` in vllm/config/vllm.py): a given list keeps its sizes up
  to ``max_num_batched_tokens`` (larger ones are dropped); otherwise vLLM's default list up to
  ``min(max_cudagraph_capture_size or min(2 * max_num_seqs * (1 + k), 512), max_num_batched_tokens)``. With
  speculative decoding and FULL decode graphs, the sizes are rounded up to multiples of ``1 + k``
  (``adjust_cudagraph_sizes_for_spec_decode`` in vllm/config/compilation.py).
* A step above the largest size runs without a graph (``CudagraphDispatcher.dispatch`` in
  vllm/v1/cudagraph_dispatcher.py): a decode step of ``b`` requests has ``b * (1 + k)`` tokens, so every batch
  above ``largest / (1 + k)`` decodes eagerly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphmode.check.findings import SEVERITY_ORDER, CheckReport, Evidence, Finding, GraphCost, Resolved
from graphmode.core.modes import DEFAULT_MODE
from graphmode.selector.capture import MAX_LIMIT
from graphmode.selector.capture_costs import (
    GIB,
    CaptureCosts,
    default_capture_sizes,
    kv_bytes_per_token,
    spec_decode_sizes,
)
from graphmode.selector.compat import BACKEND_SUPPORT, deployment_of, resolve
from graphmode.selector.graphconfig import int_flag
from graphmode.vllm_args import compilation_config_of, get_flag, has_flag

LARGE_GPU_GIB = 70  # vLLM's line between its two sets of scheduler defaults
KV_SHARE_WARN = 0.05  # graphs that take more than this share of the KV cache get a warning
CAPTURE_S_WARN = 60.0  # start-up spent capturing above this gets a warning
FULL_GRAPHS = frozenset({"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"})
_SIZES_SRC = "vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes"
_DISPATCH_SRC = "vllm/v1/cudagraph_dispatcher.py, CudagraphDispatcher.dispatch (no graph above the largest size)"
_MEASURED_1024 = ("H200, vLLM 0.33, --max-num-seqs 1024 with 768 sequences decoding: a list to 1024 instead of "
                  "the default's 512 read TPOT 0.73x on Llama-3.1-8B and 0.57x on Qwen2.5-0.5B "
                  "(docs/capture-sizes.md)")


@dataclass
class CheckInputs:
    """What a check reads: vLLM's args, the served model's config.json, the release, the GPU and the costs."""

    vllm_args: Sequence[str]
    served_config: Mapping[str, Any] | None = None
    vllm_version: str | None = None
    gpu_memory_gib: float | None = None
    costs: CaptureCosts | None = None
    env: Mapping[str, str] = field(default_factory=dict)


def _user_cc(args: list[str]) -> dict[str, Any]:
    return dict(compilation_config_of(args))


def _fix(args: list[str], updates: Mapping[str, Any]) -> list[str]:
    """``--compilation-config`` with the user's keys and ``updates``: the args that replace theirs."""
    cc = {**_user_cc(args), **updates}
    return ["--compilation-config", json.dumps(cc, separators=(",", ":"))]


def extended_sizes(top: int, query_len: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM's default list grown to ``top`` tokens (bounded by the token budget), rounded to multiples of
    ``query_len`` under speculative decoding, with ``top`` itself in it."""
    top = min(top, max_num_batched_tokens, MAX_LIMIT)
    sizes = default_capture_sizes(max_capture_size=top)
    if sizes[-1] != top:
        sizes.append(top)
    return spec_decode_sizes(sizes, query_len) if query_len > 1 else sizes


def check_deployment(inputs: CheckInputs) -> CheckReport:
    """Every finding for ``inputs`` (see the module docstring), worst first."""
    args = list(inputs.vllm_args)
    cc = _user_cc(args)  # a malformed --compilation-config is a ConfigError here, as at launch
    dep = deployment_of(args, inputs.served_config, inputs.env)
    large = inputs.gpu_memory_gib is None or inputs.gpu_memory_gib >= LARGE_GPU_GIB
    seqs_flag = int_flag(args, "--max-num-seqs")
    seqs = seqs_flag or (1024 if large else 256)
    seqs_src = "--max-num-seqs" if seqs_flag else (
        f"vLLM's default on a GPU {'of 70 GiB or more' if large else 'under 70 GiB'}"
        + (" (GPU memory not given: assumed 70 GiB or more)" if inputs.gpu_memory_gib is None else ""))
    tokens = int_flag(args, "--max-num-batched-tokens") or (8192 if large else 2048)
    q = 1 + (dep.speculative_k or 0)
    findings: list[Finding] = []
    requested = str(cc.get("cudagraph_mode") or DEFAULT_MODE.value).upper()
    mode = _mode(args, requested, dep, findings)
    sizes = _capture_list(args, cc, seqs, tokens, q, findings) if mode != "NONE" else []
    decode = spec_decode_sizes(sizes, q) if q > 1 and mode in FULL_GRAPHS else list(sizes)
    if sizes:
        _decode_coverage(args, mode, seqs, seqs_flag is not None, tokens, q, decode, findings)
        _mixed_coverage(mode, sizes, tokens, findings)
    cost = _cost(sizes, mode, inputs, findings)
    if inputs.served_config is None:
        findings.append(Finding(
            code="no-model-config", severity="warning",
            message="the served model's config.json could not be read: encoder-decoder downgrades, KV bytes per "
                    "token and the graphs' KV cost are not checked",
            evidence=Evidence(rule="these checks read the model's shape from config.json",
                              vllm_source="vllm/config/model.py (the Hugging Face config)"),
            fix=None))
    findings.sort(key=lambda f: SEVERITY_ORDER[f.severity])
    resolved = Resolved(
        vllm_version=inputs.vllm_version, requested_mode=requested, mode=mode, max_num_seqs=seqs,
        max_num_seqs_source=seqs_src, max_num_batched_tokens=tokens, speculative_k=dep.speculative_k,
        decode_query_len=q, capture_sizes=sizes, decode_graph_sizes=decode, largest_decode_step=seqs * q, cost=cost)
    return CheckReport(ok=not any(f.severity == "error" for f in findings), resolved=resolved, findings=findings)


def _mode(args: list[str], requested: str, dep: Any, findings: list[Finding]) -> str:
    """The mode vLLM runs, with a finding when it is not the one asked for."""
    if has_flag(args, "--enforce-eager"):
        findings.append(Finding(
            code="enforce-eager", severity="info",
            message="--enforce-eager: vLLM captures no CUDA graph and every step runs eagerly",
            evidence=Evidence(rule="enforce_eager disables torch.compile and CUDA graphs",
                              vllm_source="vllm/config/vllm.py, VllmConfig.__post_init__ ('Enforce eager set, "
                                          "disabling torch.compile and CUDAGraphs')",
                              measured="NONE lost 3.5-8x ITL against FULL_AND_PIECEWISE on every H200 shape "
                                       "raced (bench/gpu/configs/h200-0.33.yaml)"),
            fix=None, drop=["--enforce-eager"]))
        return "NONE"
    runs, why = resolve(requested, dep)
    if dep.attention_backend and dep.attention_backend not in BACKEND_SUPPORT:
        findings.append(Finding(
            code="unknown-backend", severity="info",
            message=f"attention backend {dep.attention_backend}: graphmode knows no CUDA-graph support level "
                    "for it, so its downgrades are not checked",
            evidence=Evidence(rule="each backend declares an AttentionCGSupport level",
                              vllm_source="vllm/v1/attention/backends/*, AttentionCGSupport"),
            fix=None))
    if runs != requested:
        measured = None
        if dep.attention_backend == "FLASHINFER" and requested == "FULL":
            measured = ("H200, vLLM 0.33: FULL with FLASHINFER started as FULL_AND_PIECEWISE on the 1B and 8B "
                        "(its race read the default against itself, docs/configs-campaign.md)")
        findings.append(Finding(
            code="mode-downgrade", severity="warning",
            message=f"{requested} will run as {runs}: {'; '.join(why)}",
            evidence=Evidence(rule="; ".join(why),
                              vllm_source="vllm/config/compilation.py, CompilationConfig."
                                          "resolve_cudagraph_mode_and_sizes; vllm/config/vllm.py (pooling, "
                                          "encoder-decoder, dynamic speculative decoding)",
                              measured=measured),
            fix=_fix(args, {"cudagraph_mode": runs})))
    return runs


def _capture_list(args: list[str], cc: Mapping[str, Any], seqs: int, tokens: int, q: int,
                  findings: list[Finding]) -> list[int]:
    """The list vLLM builds, with a finding for sizes it drops or a maximum it truncates."""
    given = cc.get("cudagraph_capture_sizes")
    top_given = cc.get("max_cudagraph_capture_size")
    if isinstance(given, list) and given and all(isinstance(s, int) and s > 0 for s in given):
        sizes = sorted({s for s in given if s <= tokens})
        dropped = sorted({s for s in given if s > tokens})
    else:
        top = top_given if isinstance(top_given, int) and top_given > 0 else min(2 * seqs * q, 512)
        sizes = default_capture_sizes(max_capture_size=min(top, tokens, MAX_LIMIT))
        dropped = [top] if top > tokens else []
    if dropped:
        findings.append(Finding(
            code="sizes-truncated", severity="error",
            message=f"capture size(s) {', '.join(map(str, dropped[:8]))} exceed --max-num-batched-tokens "
                    f"{tokens}: vLLM drops them silently and the list ends at {sizes[-1] if sizes else 0}",
            evidence=Evidence(rule="sizes above max_num_batched_tokens are filtered out; "
                                   "max_cudagraph_capture_size is truncated to it",
                              vllm_source=_SIZES_SRC,
                              reports=["vllm-project/vllm#37865 (a configured maximum silently truncated)"]),
            fix=["--max-num-batched-tokens", str(max(dropped))]))
    return sizes


def _decode_coverage(args: list[str], mode: str, seqs: int, seqs_given: bool, tokens: int, q: int,
                     decode: list[int], findings: list[Finding]) -> None:
    """A finding when decode steps of ``max_num_seqs x (1 + k)`` tokens are above the largest graph."""
    need = seqs * q
    have = max(decode, default=0)
    if need <= have:
        return
    eager_from = have // q + 1
    fix_sizes = extended_sizes(need, q, tokens)
    fix = _fix(args, {"cudagraph_capture_sizes": fix_sizes, "max_cudagraph_capture_size": fix_sizes[-1]})
    if need > tokens:
        fix = ["--max-num-batched-tokens", str(need), *fix]
    if q > 1:
        findings.append(Finding(
            code="spec-decode-eager", severity="error" if seqs_given else "warning",
            message=f"speculative decoding verifies {q} tokens a request, so a decode step of {seqs} requests "
                    f"(--max-num-seqs) has {need} tokens, but the largest decode graph is {have}: every step with "
                    f"{eager_from} or more requests decodes without a CUDA graph, silently"
                    + ("" if seqs_given else f" ({seqs} is vLLM's default max_num_seqs here: an error once "
                                             "--max-num-seqs is set this high)"),
            evidence=Evidence(rule="a step above the largest capture size runs eagerly; with speculative "
                                   "decoding the FULL decode graphs sit at multiples of 1 + k",
                              vllm_source=f"{_DISPATCH_SRC}; vllm/config/compilation.py, "
                                          "adjust_cudagraph_sizes_for_spec_decode",
                              reports=["vllm-project/vllm#54933 (one missing 42-token graph: 25.3 instead of "
                                       "133.3 tok/s, TTFT 26.0 s instead of 0.84 s)",
                                       "vllm-project/vllm#27325 (default list below max_num_seqs x (1 + k))"]),
            fix=fix))
        return
    findings.append(Finding(
        code="decode-eager", severity="warning" if seqs_given else "info",
        message=f"--max-num-seqs {seqs} lets decode steps reach {need} tokens but the capture list ends at "
                f"{have}: batches of {eager_from}-{seqs} requests decode without a CUDA graph"
                + ("" if seqs_given else " (max_num_seqs is vLLM's default here; this matters only if that "
                                         "many requests run at once)"),
        evidence=Evidence(rule="a step above the largest capture size runs eagerly",
                          vllm_source=f"{_DISPATCH_SRC}; {_SIZES_SRC} (default largest size min(2 x "
                                      "max_num_seqs, 512))",
                          measured=_MEASURED_1024),
        fix=fix))


def _mixed_coverage(mode: str, sizes: list[int], tokens: int, findings: list[Finding]) -> None:
    """An info finding on the steps with prefill tokens that no graph takes."""
    top = sizes[-1]
    if mode == "FULL_DECODE_ONLY":
        msg = ("FULL_DECODE_ONLY graphs decode-only steps: every step that carries prefill tokens runs eagerly "
               "(on the H200 its TTFT read 1.1-2.0x the default's in most configurations raced)")
    elif top < tokens:
        kind = "FULL graphs" if mode == "FULL" else "graphs"
        msg = (f"{kind} cover steps up to {top} tokens; chunked-prefill steps of {top + 1}-{tokens} tokens "
               "(--max-num-batched-tokens) run without a graph, as under vLLM's default list: long prompts' "
               "steps are mostly prefill compute, where a graph saves little")
    else:
        return
    findings.append(Finding(
        code="mixed-steps-eager", severity="info", message=msg,
        evidence=Evidence(rule="mixed prefill-decode steps replay a graph only in FULL or PIECEWISE routines and "
                               "only up to the largest size", vllm_source=_DISPATCH_SRC,
                          measured="docs/capture-sizes.md: a list to 2048 for prefill steps took 0.87 GiB of "
                                   "graphs against 0.45 (-5,280 KV tokens) with no latency gain shown"),
        fix=None))


def _cost(sizes: list[int], mode: str, inputs: CheckInputs, findings: list[Finding]) -> GraphCost:
    """Predicted capture seconds, graph GiB and the KV cache tokens they cost, with the model's error."""
    costs = inputs.costs
    if not sizes or costs is None or not costs.n_starts:
        if sizes:
            findings.append(Finding(
                code="cost-unknown", severity="info",
                message="no measured engine start for this release and shape: capture seconds and graph GiB "
                        "are not predicted",
                evidence=Evidence(rule="the cost model is fit on measured engine starts",
                                  vllm_source="vllm/v1/worker/gpu_model_runner.py, capture_model"),
                fix=None))
        return GraphCost()
    secs, gib = costs.predict(sizes, mode)
    graph_gib = round(gib, 3) if costs.knows_gib(sizes) else None
    reserved = costs.predict_reserved(sizes, mode)
    held = reserved if reserved is not None else graph_gib
    kv_bpt = kv_bytes_per_token(inputs.served_config) if inputs.served_config else None
    if kv_bpt and get_flag(list(inputs.vllm_args), "--kv-cache-dtype", "--kv_cache_dtype") in {"fp8", "fp8_e4m3",
                                                                                             "fp8_e5m2"}:
        kv_bpt /= 2
    kv = int(held * GIB / kv_bpt) if held is not None and kv_bpt else None
    share = _kv_share(held, inputs)
    cost = GraphCost(capture_s=round(secs, 2), graph_gib=graph_gib,
                     reserved_gib=round(reserved, 3) if reserved is not None else None, kv_tokens=kv,
                     kv_share=share, rel_error_s=costs.loo_rel_error_s, rel_error_gib=costs.loo_rel_error_gib,
                     basis=costs.basis)
    err = (f" (±{costs.loo_rel_error_s:.0%} s, ±{costs.loo_rel_error_gib:.0%} GiB leaving each measured start out)"
           if costs.loo_rel_error_s is not None and costs.loo_rel_error_gib is not None else "")
    gib_text = f"{graph_gib:.2f} GiB of graphs" if graph_gib is not None else "graph GiB unknown above the " \
        f"largest measured list ({costs.max_top})"
    kv_text = f", {kv:,} KV cache tokens" if kv is not None else ""
    share_text = f" ({share:.1%} of this GPU's KV cache)" if share is not None else ""
    severe = (share is not None and share > KV_SHARE_WARN) or secs > CAPTURE_S_WARN
    findings.append(Finding(
        code="graph-cost", severity="warning" if severe else "info",
        message=f"{len(sizes)} capture sizes ({mode}): predicted {secs:.1f} s of capture, {gib_text}{kv_text}"
                f"{share_text}{err}",
        evidence=Evidence(rule="graph memory comes out of what vLLM leaves for the KV cache; each graph is one "
                               "capture at start-up",
                          vllm_source="vllm/v1/worker/gpu_model_runner.py, profile_cudagraph_memory and "
                                      "capture_model",
                          measured=f"cost model: {costs.basis}"),
        fix=None))
    return cost


def _kv_share(held: float | None, inputs: CheckInputs) -> float | None:
    """The graphs' GiB as a share of the KV cache this GPU holds: its memory times the utilisation, less the
    weights (parameters from config.json, 1 byte each under FP8, else 2) and the graphs themselves."""
    if held is None or inputs.gpu_memory_gib is None or not inputs.served_config:
        return None
    from graphmode.core.fingerprint import shape_of_config

    params = shape_of_config(dict(inputs.served_config)).get("num_params_b")
    if not isinstance(params, int | float):
        return None
    args = list(inputs.vllm_args)
    util_raw = get_flag(args, "--gpu-memory-utilization")
    try:
        util = float(util_raw) if util_raw else 0.9
    except ValueError:
        util = 0.9
    per = 1 if (get_flag(args, "--quantization", "-q") or "").lower().startswith("fp8") else 2
    free = inputs.gpu_memory_gib * util - params * 1e9 * per / GIB
    return round(held / free, 4) if free > held > 0 else None
