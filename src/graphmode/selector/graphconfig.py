"""The whole CUDA graph configuration for a recommendation: a mode vLLM will not downgrade, and capture sizes.

One call (:func:`complete`) after the mode recommendation: it replaces a mode the deployment cannot run
(:mod:`graphmode.selector.compat`) by the best-scoring one it can, with the reason; chooses the capture
sizes for the observed steps (:mod:`graphmode.selector.capture`); and writes both into the
``--compilation-config`` the answer carries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphmode.core.errors import DatasetError, ModelError
from graphmode.core.fingerprint import shape_of_config
from graphmode.core.records import StepSizes
from graphmode.selector.capture import CaptureAnswer, CaptureBudget, choose_capture_sizes
from graphmode.selector.capture_costs import (
    CaptureCosts,
    costs_from_dataset,
    kv_bytes_per_token,
    spec_decode_sizes,
)
from graphmode.selector.compat import allowed_modes, deployment_of
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.step_predict import StepPrediction, predict_steps, shape_rows

if TYPE_CHECKING:
    from graphmode.core.records import Fingerprint
    from graphmode.selector.recommend import Recommendation


# What graphmode takes for vLLM's --max-num-seqs where the args leave it out. vLLM's own default depends on the
# GPU (1024 on cards with 70 GiB or more, 256 below: EngineArgs._set_default_args in vllm/engine/arg_utils.py);
# 256 is the one every earlier answer assumed, and the conservative one for capture sizes.
DEFAULT_MAX_NUM_SEQS = 256


def int_flag(args: Sequence[str], *names: str) -> int | None:
    from graphmode.vllm_args import get_flag

    raw = get_flag(list(args), *names)
    try:
        value = int(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 1 else None  # vLLM would refuse it anyway


def complete(rec: Recommendation, *, step_sizes: StepSizes | None = None, vllm_args: Sequence[str] = (),
             served_config: Mapping[str, Any] | None = None, budget: CaptureBudget | None = None,
             costs: CaptureCosts | None = None, model_folder: Path | None = None,
             env: Mapping[str, str] | None = None,
             description: WorkloadDescription | None = None) -> Recommendation:
    """``rec`` with a mode vLLM runs as asked for this deployment and, when steps are given, capture sizes.

    Without observed ``step_sizes``, a ``description`` (and ``model_folder``, whose datasets hold the profiled
    cells) has its steps predicted (:mod:`graphmode.selector.step_predict`) and the list chosen for them as
    for observed ones; the answer's ``steps_predicted`` says so, from which cells, and how uncertain."""
    dep = deployment_of(vllm_args, served_config, env)
    blocked = {m: why for m, why in allowed_modes(dep).items() if why}
    mode, notes = rec.mode, list(rec.notes)
    if mode in blocked:
        sign = -1.0 if rec.objective.direction == "max" else 1.0
        ok = [p for p in rec.predictions if p.mode not in blocked]
        scored = sorted((p for p in ok if p.score is not None), key=lambda p: sign * float(p.score or 0.0))
        new = scored[0].mode if scored else next((p.mode for p in ok), "PIECEWISE")
        notes.append(f"{mode} is not recommended for this deployment: {blocked[mode]}. Recommending {new}, "
                     "the best mode vLLM runs as asked here")
        mode = new
    elif blocked:
        notes.append("never recommended for this deployment, since vLLM would not run them as asked: "
                     + "; ".join(f"{m} ({why})" for m, why in sorted(blocked.items())))
    ties = [m for m in rec.ties if m not in blocked]
    predictions = [p.model_copy(update={"tied": False}) if p.mode in blocked else p for p in rec.predictions]
    capture: CaptureAnswer | None = None
    prediction: StepPrediction | None = None
    if step_sizes is None and description is not None and mode != "NONE":
        step_sizes, prediction = predicted_steps(description, rec, vllm_args, served_config, model_folder, notes)
    if step_sizes is not None and mode != "NONE":
        capture = capture_answer(mode, step_sizes, vllm_args=vllm_args, served_config=served_config, budget=budget,
                                 costs=costs, model_folder=model_folder, env=env, prediction=prediction, notes=notes)
    cc = json.loads(rec.compilation_config) if rec.compilation_config else {}
    cc["cudagraph_mode"] = mode
    if capture is not None:
        cc.update(capture.compilation_config())
    text = json.dumps(cc, separators=(",", ":"))
    return rec.model_copy(update={
        "mode": mode, "compilation_config": text, "vllm_args": ["--compilation-config", text],
        "notes": notes, "capture": capture, "ties": ties, "predictions": predictions,
    })



def capture_answer(mode: str, step_sizes: StepSizes, *, vllm_args: Sequence[str] = (),
                   served_config: Mapping[str, Any] | None = None, budget: CaptureBudget | None = None,
                   costs: CaptureCosts | None = None, model_folder: Path | None = None,
                   env: Mapping[str, str] | None = None, prediction: StepPrediction | None = None,
                   notes: list[str] | None = None, evidence: bool = True) -> CaptureAnswer:
    """The capture sizes for ``mode`` and ``step_sizes`` in this deployment, priced by the model folder's
    engine starts, with what its races measured and what speculative decoding does to the list."""
    dep = deployment_of(vllm_args, served_config, env)
    if costs is None and model_folder is not None:
        shape = shape_of_config(dict(served_config)) if served_config else {}
        try:
            from graphmode.selector.card import cost_paths

            paths = list(cost_paths(model_folder))
            costs = costs_from_dataset(*paths, model_config_hash=shape.get("model_config_hash"),
                                       num_params_b=shape.get("num_params_b"))
        except (DatasetError, ModelError, OSError) as exc:
            if notes is not None:
                notes.append(f"capture costs unavailable ({exc}): sizes chosen without predicted seconds or GiB")
    kv = kv_bytes_per_token(served_config) if served_config else None
    # several API servers: the histogram holds each one's share of a step
    servers = int_flag(vllm_args, "--api-server-count", "-asc", "--api_server_count")
    capture = choose_capture_sizes(
        step_sizes.per_engine_step(servers), mode=mode, max_num_seqs=max_num_seqs_of(vllm_args),
        max_num_batched_tokens=int_flag(vllm_args, "--max-num-batched-tokens"), budget=budget, costs=costs,
        kv_bytes_per_token=kv)
    capture.excluded_modes = {m: why for m, why in allowed_modes(dep).items() if why}
    if prediction is not None:
        capture.steps_predicted = prediction
        capture.notes.insert(0, prediction.note())
    if model_folder is not None and evidence:
        _add_evidence(capture, model_folder, served_config)
    if dep.speculative_k and mode in {"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}:
        _spec_decode_note(capture, dep.speculative_k + 1)
    return capture


def described_capture(desc: WorkloadDescription, mode: str, *, vllm_args: Sequence[str] = (),
                      served_config: Mapping[str, Any] | None = None, model_folder: Path | None = None,
                      notes: list[str], evidence: bool = True) -> CaptureAnswer | None:
    """The capture answer for a described workload when no recommendation went through :func:`complete`
    (a mode from the decision table or the card): its steps predicted from the model folder's cells."""
    if mode == "NONE":
        return None
    steps, prediction = predicted_steps(desc, None, vllm_args, served_config, model_folder, notes)
    if steps is None or prediction is None:
        return None
    notes.append(prediction.note())
    return capture_answer(mode, steps, vllm_args=vllm_args, served_config=served_config,
                          model_folder=model_folder, prediction=prediction, notes=notes, evidence=evidence)


def described_capture_in(models_dir: Path, model_id: str | None, target: Fingerprint | None,
                         desc: WorkloadDescription, mode: str, vllm_args: Sequence[str],
                         served_config: Mapping[str, Any] | None, notes: list[str]) -> CaptureAnswer | None:
    """:func:`described_capture` with the model folder the registry picks for ``target`` (``launch``'s path);
    ``None`` with a note when there is none."""
    from graphmode.selector.registry import select_model

    try:
        entry, _ = select_model(models_dir, model_id, target)
    except (ModelError, OSError) as exc:
        notes.append(f"no model to predict the described workload's step sizes from ({exc}): vLLM's default "
                     "capture sizes")
        return None
    # no race evidence here: it recomputes verdicts (scipy's t quantiles), and launch's decision-table path
    # must start vLLM without importing scipy; `recommend` carries the evidence
    return described_capture(desc, mode, vllm_args=vllm_args, served_config=served_config,
                             model_folder=entry.folder, notes=notes, evidence=False)


def predicted_steps(desc: WorkloadDescription, rec: Recommendation | None, vllm_args: Sequence[str],
                    served_config: Mapping[str, Any] | None, model_folder: Path | None,
                    notes: list[str]) -> tuple[StepSizes | None, StepPrediction | None]:
    """The description's step sizes predicted from the model folder's profiled cells (of the served model's
    shape where its config.json is known), or ``(None, None)`` with a note saying why not."""
    if model_folder is None:
        notes.append("no model folder to predict the described workload's step sizes from: vLLM's default "
                     "capture sizes")
        return None, None
    shape = shape_of_config(dict(served_config)) if served_config else {}
    try:
        from graphmode.selector.card import cost_paths

        paths = list(cost_paths(model_folder))
        rows = shape_rows(paths, shape.get("model_config_hash"), shape.get("num_params_b"))
    except (DatasetError, ModelError, OSError) as exc:
        notes.append(f"step sizes not predicted ({exc}): vLLM's default capture sizes")
        return None, None
    feats = rec.features if rec is not None and rec.features_source == "description" else {}
    batch = feats.get("batch_mean")
    got = predict_steps(desc, rows, max_num_seqs=max_num_seqs_of(vllm_args),
                        batch_mean=float(batch) if isinstance(batch, int | float) else None)
    if got is None:
        notes.append("no profiled cell with step sizes to predict the described workload's from: vLLM's "
                     "default capture sizes")
        return None, None
    return got


def max_num_seqs_of(vllm_args: Sequence[str]) -> int:
    """The deployment's ``--max-num-seqs``; vLLM's default where not given (:data:`DEFAULT_MAX_NUM_SEQS`)."""
    return int_flag(vllm_args, "--max-num-seqs") or DEFAULT_MAX_NUM_SEQS


def _add_evidence(capture: CaptureAnswer, folder: Path, served_config: Mapping[str, Any] | None) -> None:
    """What a race measured for a list like the chosen one (capture_evidence), as a field and a note."""
    from graphmode.selector.capture_evidence import evidence_for

    try:
        ev = evidence_for(folder, capture.sizes, served_config)
    except (DatasetError, ModelError, OSError) as exc:
        capture.notes.append(f"raced capture lists unavailable ({exc})")
        return
    if ev is not None:
        capture.evidence = ev
        capture.notes.append(ev.note())


def _spec_decode_note(capture: CaptureAnswer, query_len: int) -> None:
    """Say what vLLM does to the list under speculative decoding: its FULL decode graphs sit at multiples of
    1 + k (a decode step verifies that many tokens a request), so a batch of b requests pads to such a size."""
    chosen = spec_decode_sizes(capture.sizes, query_len)
    default = spec_decode_sizes(capture.default_sizes, query_len)
    capture.decode_graph_sizes = chosen
    capture.notes.append(
        f"speculative decoding verifies {query_len} tokens a request per decode step: vLLM rounds the FULL decode "
        f"graphs' sizes up to multiples of {query_len} ({len(chosen)} decode graphs for this list: "
        f"{_sizes(chosen)}; {len(default)} for the default list), so the decode-graph count and padding differ "
        "from the figures above, which count the list as given")


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 16 else f"{sizes[0]}, {sizes[1]}, ... {sizes[-1]} ({len(sizes)})"


def capture_lines(ans: CaptureAnswer) -> list[str]:
    """The capture answer as lines for a terminal: chosen vs vLLM's default, then the notes."""
    c, d = ans.chosen, ans.default

    def share(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    lines = [
        f"[bold]capture sizes ({ans.mode}):[/] {_sizes(ans.sizes)}    (vLLM default: {_sizes(ans.default_sizes)})",
        f"  steps replaying a graph {share(c.graphed_share)} (default {share(d.graphed_share)}); padding "
        f"{_num(c.padded_tokens_per_step, '{:.2f}')} tokens/step (default {_num(d.padded_tokens_per_step, '{:.2f}')}), "
        f"~{share(c.padding_cost)} of a graphed step's time (default ~{share(d.padding_cost)})",
        f"  predicted capture {_num(c.capture_s, '{:.1f}')} s, graphs {_num(c.graph_gib, '{:.3f}')} GiB (default "
        f"{_num(d.capture_s, '{:.1f}')} s, {_num(d.graph_gib, '{:.3f}')} GiB); KV cache tokens gained "
        f"{'-' if ans.kv_tokens_gained is None else f'{ans.kv_tokens_gained:,}'}",
        f"  [dim]{ans.steps_observed:g} steps observed (decode-only ≤ {_num(ans.decode_steps, '{:g}')}, mixed ≥ "
        f"{_num(ans.mixed_steps, '{:g}')}); costs: {ans.costs_basis}[/]",
    ]
    lines += [f"  excluded {m}: {why}" for m, why in ans.excluded_modes.items()]
    lines += [f"  note: {n}" for n in ans.notes]
    return lines
