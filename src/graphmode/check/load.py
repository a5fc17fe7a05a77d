"""What a check reads from the host: the served model's config.json and the cost model of the release's model.

Kept apart from :mod:`graphmode.check.rules` so the rules stay pure functions of their inputs (the tests give
them a config and a cost model directly).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graphmode.check.rules import CheckInputs
from graphmode.core.errors import ConfigError, DatasetError, ModelError
from graphmode.core.fingerprint import load_model_config, shape_of_config
from graphmode.selector.capture_costs import CaptureCosts, costs_from_dataset
from graphmode.vllm_args import model_arg


def served_config_of(vllm_args: Sequence[str]) -> dict[str, Any] | None:
    """The config.json of the ``--model`` (or positional model) directory; ``None`` when not a local one."""
    model = model_arg(["serve"], list(vllm_args))  # `vllm serve MODEL` or --model MODEL
    if not model or not Path(model).exists():
        return None
    try:
        return load_model_config(model)
    except ConfigError:
        return None


def release_costs(models_dir: Path | None, vllm_version: str | None, model_id: str | None,
                  served_config: Mapping[str, Any] | None) -> tuple[CaptureCosts | None, str | None]:
    """The capture cost model from the datasets of the model trained on ``vllm_version`` (the shape of
    ``served_config`` where measured), and a note when there is none."""
    from graphmode.core.records import Fingerprint
    from graphmode.selector.card import ModelCard
    from graphmode.selector.registry import select_model

    shape = shape_of_config(dict(served_config)) if served_config else {}
    target = Fingerprint.model_validate({"vllm_version": vllm_version} if vllm_version else {})
    try:
        entry, _ = select_model(models_dir, model_id, target)
        paths = [src.resolve(entry.folder) for src in ModelCard.load(entry.folder).dataset.cost_sources()]
        return costs_from_dataset(*paths, model_config_hash=shape.get("model_config_hash"),
                                  num_params_b=shape.get("num_params_b")), None
    except (DatasetError, ModelError, OSError) as exc:
        return None, f"no cost model ({exc})"


def inputs_for(vllm_args: Sequence[str], *, vllm_version: str | None, gpu_memory_gib: float | None,
               models_dir: Path | None = None, model_id: str | None = None,
               served_config: Mapping[str, Any] | None = None,
               env: Mapping[str, str] | None = None) -> tuple[CheckInputs, list[str]]:
    """:class:`CheckInputs` for a command line, read from this host, and notes on what could not be read."""
    served = dict(served_config) if served_config is not None else served_config_of(vllm_args)
    costs, note = release_costs(models_dir, vllm_version, model_id, served)
    return CheckInputs(vllm_args=list(vllm_args), served_config=served, vllm_version=vllm_version,
                       gpu_memory_gib=gpu_memory_gib, costs=costs, env=dict(env or {})), [note] if note else []
