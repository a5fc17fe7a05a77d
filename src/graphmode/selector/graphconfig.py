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

if TYPE_CHECKING:
    from graphmode.selector.recommend import Recommendation


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
             env: Mapping[str, str] | None = None) -> Recommendation:
    """``rec`` with a mode vLLM runs as asked for this deployment and, when steps are given, capture sizes."""
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
    if step_sizes is not None and mode != "NONE":
        if costs is None and model_folder is not None:
            shape = shape_of_config(dict(served_config)) if served_config else {}
            try:
                from graphmode.selector.card import ModelCard

                paths = [src.resolve(model_folder) for src in ModelCard.load(model_folder).dataset.cost_sources()]
                costs = costs_from_dataset(*paths, model_config_hash=shape.get("model_config_hash"),
                                           num_params_b=shape.get("num_params_b"))
            except (DatasetError, ModelError, OSError) as exc:
                notes.append(f"capture costs unavailable ({exc}): sizes chosen without predicted seconds or GiB")
        kv = kv_bytes_per_token(served_config) if served_config else None
        # several API servers: the histogram holds each one's share of a step
        servers = int_flag(vllm_args, "--api-server-count", "-asc", "--api_server_count")
        capture = choose_capture_sizes(
            step_sizes.per_engine_step(servers), mode=mode, max_num_seqs=int_flag(vllm_args, "--max-num-seqs") or 256,
            max_num_batched_tokens=int_flag(vllm_args, "--max-num-batched-tokens"), budget=budget, costs=costs,
            kv_bytes_per_token=kv)
        capture.excluded_modes = blocked
        if model_folder is not None:
            _add_evidence(capture, model_folder, served_config)
        if dep.speculative_k and mode in {"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}:
            _spec_decode_note(capture, dep.speculative_k + 1)
    cc = json.loads(rec.compilation_config) if rec.compilation_config else {}
    cc["cudagraph_mode"] = mode
    if capture is not None:
        cc.update(capture.compilation_config())
    text = json.dumps(cc, separators=(",", ":"))
    return rec.model_copy(update={
        "mode": mode, "compilation_config": text, "vllm_args": ["--compilation-config", text],
        "notes": notes, "capture": capture, "ties": ties, "predictions": predictions,
    })



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
