"""Which deployment configurations a model was trained on, and whether a deployment is one of them.

A card trained since configurations were recorded carries one per shape (``card.shapes``: the deployment
configuration fields that change which graphs vLLM runs). An older card does not; its own evidence then decides: the
vLLM args of its fingerprints (the exact arguments the profiler passed, so an absent flag was vLLM's default)
and, for the attention backend, the start-up logs its datasets recorded when those files are still where the
card says. What neither proves stays unknown, and the answer says so.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from graphmode.core.deployment import DeploymentConfig, config_suffix, describe, unlike
from graphmode.selector.card import ModelCard
from graphmode.selector.featurize import ARCH_FIELD, shape_key


def _logged_backends(card: ModelCard, folder: Path | None) -> dict[str, str]:
    """Model config hash -> the one attention backend its rows' start-up logs named (where there is one)."""
    if folder is None:
        return {}
    seen: dict[str, set[str]] = {}
    for source in card.dataset.sources:
        path = (folder / source.path).resolve()
        if not path.is_file():
            continue
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows = db.execute("SELECT DISTINCT fp_model_config_hash, attention_backend FROM cells "
                                  "WHERE status = 'ok' AND attention_backend IS NOT NULL").fetchall()
            finally:
                db.close()
        except sqlite3.Error:
            continue
        for model_hash, backend in rows:
            seen.setdefault(str(model_hash), set()).add(str(backend))
    return {h: next(iter(b)) for h, b in seen.items() if len(b) == 1}


def trained_configurations(card: ModelCard, folder: Path | None = None) -> list[dict[str, Any]]:
    """One shape dict per trained shape, each with its configuration fields (unknown where unproven)."""
    backends: dict[str, str] | None = None
    out: list[dict[str, Any]] = []
    for shape in card.shapes:
        if isinstance(shape.get("deployment_unknown"), list):
            out.append(dict(shape))
            continue
        if backends is None:
            backends = _logged_backends(card, folder)
        model_hash = shape.get("model_config_hash")
        args = next((fp.vllm_args for fp in card.fingerprints if model_hash and fp.model_config_hash == model_hash
                     and fp.vllm_args), None)
        if args is None:
            dep = DeploymentConfig(unknown=["attention_backend", "max_model_len", "max_num_seqs",
                                            "num_active_params_b", "quantization", "speculative",
                                            "tensor_parallel_size"])
        else:
            from graphmode.core.records import StartupInfo

            backend = backends.get(str(model_hash)) if model_hash else None
            dep = DeploymentConfig.from_vllm_args(args, {}, None, StartupInfo(attention_backend=backend),
                                                  shape={"num_params_b": shape.get("num_params_b")}, strict=False)
        out.append({**shape, **dep.shape_fields()})
    return out


def deployment_shape(shape: Mapping[str, Any] | None, deployment: DeploymentConfig,
                     trained: list[dict[str, Any]]) -> dict[str, Any]:
    """The target shape under ``deployment``. A requested backend that the training data got without
    asking (vLLM's own pick there) is that same configuration, so it keeps that configuration's key."""
    fields = deployment.shape_fields()
    if fields["num_active_params_b"] is None and shape is not None:
        fields["num_active_params_b"] = shape.get("num_active_params_b")
    if fields["attention_backend_requested"] and any(
            s.get("attention_backend") == fields["attention_backend"] and not s.get("attention_backend_requested")
            for s in trained):
        fields["attention_backend_requested"] = False
    return {**(shape or {}), **fields}


def with_auto_backend(shape: Mapping[str, Any], trained: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A target that asks for no attention backend runs vLLM's own pick: the one every trained shape that
    asked for none resolved to (FLASH_ATTN for these models on the H200), when they agree. Without this,
    a model trained on FLASHINFER and TRITON_ATTN races too would impute every backend column for a plain
    deployment and lower its confidence."""
    out = dict(shape)
    if out.get("attention_backend") is not None or out.get("attention_backend_requested"):
        return out
    picks = {str(s["attention_backend"]) for s in trained
             if s.get("attention_backend") and not s.get("attention_backend_requested")}
    if len(picks) != 1:
        return out
    out["attention_backend"], out["attention_backend_requested"] = picks.pop(), False
    unknown = out.get("deployment_unknown")
    if isinstance(unknown, list):
        out["deployment_unknown"] = [u for u in unknown if u != "attention_backend"]
    else:  # a shape from a config.json alone: only the backend becomes known
        out["deployment_unknown"] = ["max_model_len", "max_num_seqs", "num_active_params_b", "quantization",
                                     "speculative", "tensor_parallel_size"]
    return out


def deployment_warning(target: Mapping[str, Any], trained: list[dict[str, Any]]) -> str | None:
    """'trained on ...; this deployment: ...: the answer is extrapolated (...)' when ``target``'s
    configuration is unlike every trained one; None when some trained configuration matches it."""
    differs = unlike(target, trained)
    if not differs:
        suffix = config_suffix(target)
        same = [s for s in trained if config_suffix(s) == suffix]
        if not trained:
            return None
        if same:
            return _carried_over(target, suffix, same, trained)
        differs = ["a combination of these no trained shape had"]
    seen = sorted({describe(s) for s in trained})
    return (f"trained on {' / '.join(seen)}; this deployment: {describe(target)}: the answer is extrapolated "
            f"({'; '.join(differs)})")


def _carried_over(target: Mapping[str, Any], suffix: str, same: list[dict[str, Any]],
                  trained: list[dict[str, Any]]) -> str | None:
    """A configuration profiled on other models only, for a model trained in other configurations: no race of
    this pair exists, so its answer is carried over (8B with ngram k=5, where only the 1B raced k=5)."""
    model = target.get("model_config_hash")
    if not suffix or not model or any(s.get("model_config_hash") == model for s in same) \
            or not any(s.get("model_config_hash") == model for s in trained):
        return None
    others = sorted({f"{s.get('model_architecture') or 'a model'} {float(s['num_params_b']):.3g}B"
                     if s.get("num_params_b") else str(s.get("model_architecture") or "another model")
                     for s in same})
    return (f"this configuration ({suffix}) was profiled on {', '.join(others)} only, not on this model: "
            "the answer is carried over from there (no race of this model in it)")


def shape_warning(card: ModelCard, shape: Mapping[str, Any], uses_shape: bool) -> str | None:
    """Why a target *shape* is not one *card* was trained on (None: it is one): an architecture or size unlike
    every trained one (an extrapolation), or, for a model without shape features (*uses_shape* false), that
    its predictions assume the trained shape."""
    if shape_key(shape) in {shape_key(s) for s in card.shapes}:
        return None
    archs = {s.get(ARCH_FIELD) for s in card.shapes}
    params = [float(s["num_params_b"]) for s in card.shapes if s.get("num_params_b")]
    p = shape.get("num_params_b")
    unlike = []
    if shape.get(ARCH_FIELD) and shape.get(ARCH_FIELD) not in archs:
        unlike.append(f"architecture {shape.get(ARCH_FIELD)} (trained: {', '.join(sorted(map(str, archs)))})")
    if p and params and not (min(params) / 2 <= p <= max(params) * 2):
        unlike.append(f"{p:.3g}B parameters (trained: {min(params):.3g}–{max(params):.3g}B)")
    if unlike:
        return ("the deployment's model is unlike any this model was trained on: " + "; ".join(unlike)
                + "; predictions are extrapolations")
    if not uses_shape:
        return ("the deployment's model is not one this model was trained on and the model has no shape features "
                "(one shape in its data): predictions assume the trained shape")
    return None
