"""Retraining for a new fingerprint: profile (resuming) + train, as a plain function.

The profile goes to ``<models_dir>/_profiles/<profile key>.sqlite`` (the key fixes GPU, model and vLLM
arguments, so an interrupted retrain resumes where it stopped), and the model to the registry folder
derived from the rows' fingerprint, with a copy of that profile key's rows. A service can run this in a
background job; nothing here prints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from graphmode.core.dataset import ProfileStore
from graphmode.core.fingerprint import model_shape
from graphmode.profiling.gpu import gpu_facts
from graphmode.profiling.runner import ProfileConfig, Profiler, ProfileSummary, Reporter, profile_key
from graphmode.selector.estimators import RegressorKind
from graphmode.selector.objective import Objective
from graphmode.selector.train import Progress, TrainResult, train
from graphmode.vllm_args import model_arg

PROFILES_DIR = "_profiles"


@dataclass
class RetrainResult:
    profile: ProfileSummary
    train: TrainResult
    dataset: Path


def retrain_dataset_path(config: ProfileConfig, models_dir: Path) -> Path:
    """Where the profile for ``config``'s (GPU, model, vLLM args) accumulates."""
    shape = model_shape(model_arg(config.command, config.vllm_args))
    key = profile_key(gpu_facts().get("gpu_name"), shape, config.command, config.vllm_args, config.env)
    return models_dir / PROFILES_DIR / f"{key}.sqlite"


def retrain(
    config: ProfileConfig,
    *,
    models_dir: Path,
    dataset: Path | None = None,
    resume: bool = True,
    objective: Objective | None = None,
    regressor: RegressorKind | Literal["auto"] = "auto",
    reporter: Reporter | None = None,
    progress: Progress | None = None,
) -> RetrainResult:
    """Profile ``config`` (resuming unless told not to), then train on that profile key's rows."""
    path = dataset or retrain_dataset_path(config, models_dir)
    cfg = dataclasses.replace(config, dataset=path, resume=resume)
    with ProfileStore(path) as store:
        profiler = Profiler(cfg, store, reporter)
        summary = profiler.run()
        key = profiler.key
    result = train(
        path,
        models_dir=models_dir,
        objective=objective,
        regressor=regressor,
        profile_key=key,
        progress=progress,
    )
    return RetrainResult(profile=summary, train=result, dataset=path)
