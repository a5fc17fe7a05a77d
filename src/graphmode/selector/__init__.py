"""The mode selector: train per-mode models on a profile, recommend a CUDA Graph mode for observed traffic.

Public API (the service and the CLI use nothing else)::

    from graphmode.selector import Recommender, WorkloadDescription, make_objective

    rec = Recommender.load(models_dir, model_id=None, target=fingerprint)   # once, at start-up
    answer = rec.recommend(ObservedFeatures(...) or WorkloadDescription(...), make_objective("ttft_p99"))
    answer.mode, answer.compilation_config, answer.predictions, answer.confidence

    list_models(models_dir); model_card(model_id, models_dir)
    train(dataset, out_dir=None, models_dir=...)            # graphmode train
    retrain(profile_config, models_dir=...)                 # graphmode retrain: profile (resume) + train

Modules: :mod:`.objective` (metrics, objectives, ranking), :mod:`.featurize` (inputs), :mod:`.aggregate`
(rows → training set), :mod:`.estimators`, :mod:`.model`, :mod:`.evaluate` (leave-one-workload-out CV),
:mod:`.train`, :mod:`.retrain`, :mod:`.card`, :mod:`.artifacts` (skops I/O), :mod:`.registry`,
:mod:`.describe` (description → features), :mod:`.table` (the decision table ``launch`` looks up),
:mod:`.live` (scrape a server), :mod:`.recommend`, :mod:`.verdicts` (race verdicts).
Synthetic development rows live in ``tests/support/synthetic.py``, outside the package.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphmode.selector.card import ModelCard
    from graphmode.selector.describe import WorkloadDescription, describe_features
    from graphmode.selector.live import observe_server
    from graphmode.selector.objective import Constraint, Objective, make_objective, resolve_metric
    from graphmode.selector.recommend import Confidence, ModePrediction, Recommendation, Recommender
    from graphmode.selector.registry import (
        FingerprintMatch,
        ModelEntry,
        list_models,
        model_card,
        select_model,
        target_fingerprint,
    )
    from graphmode.selector.retrain import RetrainResult, retrain
    from graphmode.selector.train import TrainResult, train

# Imported on first use: scikit-learn takes a second to import and `graphmode --help` needs none of it.
_LAZY = {
    "ModelCard": "card",
    "WorkloadDescription": "describe",
    "describe_features": "describe",
    "observe_server": "live",
    "Constraint": "objective",
    "Objective": "objective",
    "make_objective": "objective",
    "resolve_metric": "objective",
    "Confidence": "recommend",
    "ModePrediction": "recommend",
    "Recommendation": "recommend",
    "Recommender": "recommend",
    "FingerprintMatch": "registry",
    "ModelEntry": "registry",
    "model_card": "registry",
    "list_models": "registry",
    "select_model": "registry",
    "target_fingerprint": "registry",
    "RetrainResult": "retrain",
    "retrain": "retrain",
    "TrainResult": "train",
    "train": "train",
}
__all__ = [
    "Confidence",
    "Constraint",
    "FingerprintMatch",
    "ModePrediction",
    "ModelCard",
    "ModelEntry",
    "Objective",
    "Recommendation",
    "Recommender",
    "RetrainResult",
    "TrainResult",
    "WorkloadDescription",
    "describe_features",
    "list_models",
    "make_objective",
    "model_card",
    "observe_server",
    "resolve_metric",
    "retrain",
    "select_model",
    "target_fingerprint",
    "train",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphmode.selector' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"graphmode.selector.{module}"), name)
    globals()[name] = value  # once imported, the name is bound here and __getattr__ is not asked again
    return value


class _Package(types.ModuleType):
    """The package's module type. Importing the submodule ``retrain`` (or ``train``) makes the import
    system bind it to the package attribute of the same name, which would hide the function that name
    exports: ``graphmode.selector.retrain(...)`` then fails with "'module' object is not callable" from
    the second call on (issue 12). Such a binding stores the submodule's function instead; other values
    (a test's stand-in, say) are stored as given."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (
            isinstance(value, types.ModuleType)
            and value.__name__ == f"{__name__}.{name}"
            and _LAZY.get(name) == name
        ):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
