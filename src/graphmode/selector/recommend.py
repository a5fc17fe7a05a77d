"""Recommending a mode: load a model once, answer many requests fast.

::

    rec = Recommender.load(models_dir, model_id=None, target=fingerprint)   # once
    answer = rec.recommend(ObservedFeatures(...) | WorkloadDescription(...), "itl_p50")

Everything that does not depend on the request is done at load: the artifact is verified and loaded,
the regressors are compiled to numpy (:meth:`ColumnwiseRegressor.compile`), the training inputs are
standardized for the distance check, and the per-mode constants are predicted for the target shape.
A request is then one vectorization, one matrix product (or neighbour lookup) for every (mode,
metric), a ranking of at most five modes and one pydantic object. A :class:`Recommender` is
immutable after load and safe to share between threads.
"""

from __future__ import annotations

import copy
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from graphmode.core.deployment import DeploymentConfig
from graphmode.core.errors import ModelError, ObjectiveError, StaleModelError
from graphmode.core.modes import compilation_config, parse_mode
from graphmode.core.records import Fingerprint, ObservedFeatures
from graphmode.selector.artifacts import load_artifact
from graphmode.selector.capture import CaptureAnswer
from graphmode.selector.card import ARTIFACT_FILE, ModelCard
from graphmode.selector.deployments import with_auto_backend
from graphmode.selector.describe import WorkloadDescription, describe_features
from graphmode.selector.featurize import ARCH_FIELD, SHAPE_FEATURES, shape_key
from graphmode.selector.frontend import frontend_note
from graphmode.selector.model import SelectorModel, _design
from graphmode.selector.noise import RaceNoise, noise_for
from graphmode.selector.objective import METRICS, TIE_Z, Objective, make_objective, rank, relative_gain
from graphmode.selector.paired import PairedVerdict
from graphmode.selector.registry import FingerprintMatch, match_card, select_model
from graphmode.selector.specdecode import spec_decode_note
from graphmode.selector.verdicts import RaceAnswer, race_decision

FeatureSource = Literal["observed", "description", "server"]
ConfidenceLevel = Literal["high", "medium", "low"]
FAR_RATIO = 4.0  # distance to the nearest training workload, in typical training spacings, that is "far"
NEAR_RATIO = 2.0
SHAPE_CACHE = 64  # per-shape copies a recommender keeps (Recommender.for_shape)
# What a target model contributes to its shape: the shape features, its identity, and its active parameters
# (a mixture of experts runs a fraction of its weights; featurize.CONFIG_FEATURES).
_TARGET_SHAPE_KEYS: tuple[str, ...] = (
    *(n for n, _ in SHAPE_FEATURES), ARCH_FIELD, "model_config_hash", "model_type", "num_active_params_b")


class ModePrediction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: str
    metrics: dict[str, float | None] = Field(description="predicted values, base units (s, tok/s, GiB, ...)")
    objective_value: float | None
    score: float | None = Field(description="objective value with memory/startup weights applied")
    noise: float | None = Field(description="one standard deviation of the objective value (run-to-run)")
    status: str = Field(description="ok | unverified | violates | unknown (constraints)")
    violations: list[str] = Field(default_factory=list)
    tied: bool = Field(description="within the noise of the chosen mode")


class Confidence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    level: ConfidenceLevel
    margin_sigma: float | None = Field(
        description="chosen vs runner-up score gap, in noise standard deviations"
    )
    runner_up: str | None
    distance: float = Field(description="standardized distance to the nearest profiled workload")
    distance_ratio: float | None = Field(
        description="that distance over the typical spacing of profiled workloads"
    )
    in_distribution: bool
    out_of_range: list[str] = Field(default_factory=list, description="features outside the profiled range")
    imputed: list[str] = Field(
        default_factory=list, description="features not given, filled with training medians"
    )
    reasons: list[str] = Field(default_factory=list)


class Recommendation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: str
    compilation_config: str = Field(description="JSON for vLLM's --compilation-config")
    vllm_args: list[str]
    objective: Objective
    objective_description: str
    predicted_value: float | None = Field(description="predicted objective metric of the chosen mode")
    default_mode: str
    gain_vs_default_pct: float | None = Field(
        description="predicted improvement over vLLM's default on the objective's metric, %"
    )
    score_gain_vs_default_pct: float | None = Field(
        None,
        description="improvement of the weighted score (metric with the memory and start-up weights) "
        "over the default's, %; equals gain_vs_default_pct when no weight is set",
    )
    gain_significant: bool = Field(
        description="False when the default is within the noise of the chosen mode"
    )
    ties: list[str]
    constraints_met: bool
    predictions: list[ModePrediction]
    confidence: Confidence
    features: dict[str, float | None]
    features_source: FeatureSource
    model_id: str
    fingerprint_keys: list[str]
    fingerprint_match: str
    synthetic_model: bool = False
    race: RaceAnswer | None = Field(None, description="what the race verdicts decided (None: no race rounds)")
    noise: RaceNoise | None = Field(
        None, description="what a restart alone and the clock alone moved the objective's metric by on this shape")
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    elapsed_ms: float | None = None
    capture: CaptureAnswer | None = Field(None, description="capture sizes for the observed steps (graphconfig)")


Inputs = ObservedFeatures | WorkloadDescription | Mapping[str, Any]


class Recommender:
    """A loaded model, ready to answer. Build with :meth:`load` or :meth:`from_dir`."""

    def __init__(
        self,
        folder: Path,
        card: ModelCard,
        model: SelectorModel,
        match: FingerprintMatch | None = None,
        target: Fingerprint | None = None,
    ) -> None:
        self.folder = folder
        self.card = card
        self.model = model
        self.match = match or match_card(card, target)
        self.target = target
        self.model_id = card.model_id
        self.spec = model.spec
        self.modes: list[str] = list(model.modes)
        self.metrics: list[str] = list(model.metrics)
        self.constants: list[str] = list(model.constants)
        self.default_objective = card.default_objective
        self.default_mode = card.default_mode
        self._n_modes, self._n_metrics = len(self.modes), len(self.metrics)
        self._reg = model.regressor.compile()
        self._const = model.const_regressor.compile()
        self._train_z = self.spec.standardize(model.train_x) if model.train_x.size else model.train_x
        self._const_cache: dict[str, list[dict[str, float | None]]] = {}
        self._shape_warning: str | None = None
        self._deployment_warning: str | None = None
        self._by_shape: dict[str, Recommender] = {}
        self._paired: dict[tuple[str, str], list[PairedVerdict]] = defaultdict(list)
        for v in card.paired:
            if v.decisive:
                self._paired[(v.shape, v.metric)].append(v)
        shape = self._target_shape(target)
        self._shape = with_auto_backend(shape, card.shapes) if shape is not None else None
        self._const_rows = self._constants_for(self._shape)
        e2e = "e2e_p50" in self.metrics
        self._e2e_col = self.metrics.index("e2e_p50") if e2e else None
        # the description fixed point asks for e2e_p50 of every mode up to 30 times: predict only those
        if self._e2e_col is not None:
            self._reg_e2e = model.regressor.compile(
                [i * self._n_metrics + self._e2e_col for i in range(self._n_modes)]
            )

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        models_dir: Path | str | None = None,
        model_id: str | None = None,
        *,
        target: Fingerprint | None = None,
        strict: bool = False,
    ) -> Recommender:
        """The registry's best model for ``target`` (or ``model_id``), verified and compiled.

        ``strict`` raises :class:`StaleModelError` instead of warning when the model's fingerprint
        differs from the target's.
        """
        entry, match = select_model(Path(models_dir) if models_dir is not None else None, model_id, target)
        if strict and match.stale:
            raise StaleModelError(
                f"model {entry.model_id} is stale for the target: " + "; ".join(match.differences)
            )
        rec = cls.from_dir(entry.folder, target=target)
        rec.match = match
        return rec

    @classmethod
    def from_dir(cls, folder: Path | str, *, target: Fingerprint | None = None) -> Recommender:
        folder = Path(folder)
        card = ModelCard.load(folder)
        info = card.artifacts.get(ARTIFACT_FILE)
        if info is None:
            raise ModelError(f"model card in {folder} lists no {ARTIFACT_FILE}")
        obj = load_artifact(folder / info.file, info)
        model = SelectorModel.from_artifact(
            obj,
            spec=card.features,
            modes=card.modes,
            metrics=card.workload_metrics,
            constants=card.constant_metrics,
            noise_cv={k: v.noise_cv for k, v in card.metrics.items()},
            default_mode=card.default_mode,
        )
        return cls(folder, card, model, target=target)

    # ---------------------------------------------------------------- shapes
    def _target_shape(self, target: Fingerprint | None) -> dict[str, Any] | None:
        shapes = self.card.shapes
        if target is not None and (
            target.model_config_hash or target.num_params_b or target.model_architecture
        ):
            shape = {
                k: getattr(target, k)
                for k in _TARGET_SHAPE_KEYS
            }
            self._check_shape(shape)
            return shape
        if len(shapes) > 1:
            self._shape_warning = (
                f"model covers {len(shapes)} model shapes and no target shape was given: "
                f"assuming {shapes[0].get(ARCH_FIELD)} ({shapes[0].get('num_params_b')}B), the one it measured "
                "most under vLLM's defaults (--model-path DIR or --server URL names the deployment's)"
            )
        return dict(shapes[0]) if shapes else None

    def with_match(self, match: FingerprintMatch) -> Recommender:
        """This model answering under another fingerprint match (a service choosing per request for a
        server it scraped); the copy shares the compiled estimators, not the shape copies (they carry
        this model's match)."""
        other = copy.copy(self)
        other.match = match
        other._by_shape = {}
        return other

    def for_shape(self, shape: Mapping[str, Any]) -> Recommender:
        """This model answering for another served model (a service that advises several deployments).

        ``shape`` holds the fields :func:`graphmode.core.fingerprint.shape_of_config` reads from a config.json.
        The copy shares the compiled estimators; its constants and its warning (an untrained or unlike
        shape) are its own. Copies are cached per shape, at most :data:`SHAPE_CACHE` of them.
        """
        key = shape_key(shape)
        hit = self._by_shape.get(key)
        if hit is not None:
            return hit
        other = copy.copy(self)
        other._shape_warning = None
        other._shape = with_auto_backend({k: shape.get(k) for k in _TARGET_SHAPE_KEYS}, self.card.shapes)
        other._check_shape(other._shape)
        other._const_rows = other._constants_for(other._shape)
        if len(self._by_shape) >= SHAPE_CACHE:
            self._by_shape.pop(next(iter(self._by_shape)))
        self._by_shape[key] = other
        return other

    def for_deployment(self, deployment: DeploymentConfig) -> Recommender:
        """This model answering for a deployment with ``deployment``'s configuration (TP size, attention
        backend, quantization, speculative decoding, max_num_seqs; :mod:`graphmode.core.deployment`).

        The configuration joins the target shape (its key picks that configuration's constants and race
        verdicts, its fields the configuration features), and every answer warns when no trained
        configuration is like it (:func:`graphmode.selector.deployments.deployment_warning`).
        """
        from graphmode.selector.deployments import deployment_shape, deployment_warning, trained_configurations

        trained = trained_configurations(self.card, self.folder)
        other = copy.copy(self)
        other._shape = with_auto_backend(deployment_shape(self._shape, deployment, trained), trained)
        other._deployment_warning = deployment_warning(other._shape, trained)
        other._const_rows = other._constants_for(other._shape)
        return other

    @property
    def deployment_warning(self) -> str | None:
        """Why the deployment given to :meth:`for_deployment` is unlike the trained ones (None: it is not)."""
        return self._deployment_warning

    def _check_shape(self, shape: Mapping[str, Any]) -> None:
        known = {shape_key(s) for s in self.card.shapes}
        if shape_key(shape) in known:
            return
        archs = {s.get(ARCH_FIELD) for s in self.card.shapes}
        params = [float(s["num_params_b"]) for s in self.card.shapes if s.get("num_params_b")]
        p = shape.get("num_params_b")
        unlike = []
        if shape.get(ARCH_FIELD) and shape.get(ARCH_FIELD) not in archs:
            unlike.append(
                f"architecture {shape.get(ARCH_FIELD)} (trained: {', '.join(sorted(map(str, archs)))})"
            )
        if p and params and not (min(params) / 2 <= p <= max(params) * 2):
            unlike.append(f"{p:.3g}B parameters (trained: {min(params):.3g}–{max(params):.3g}B)")
        if unlike:
            self._shape_warning = (
                "the deployment's model is unlike any this model was trained on: "
                + "; ".join(unlike)
                + "; predictions are extrapolations"
            )
        elif not self.spec.uses_shape:
            self._shape_warning = (
                "the deployment's model is not one this model was trained on and the model "
                "has no shape features (one shape in its data): predictions assume the "
                "trained shape"
            )

    def _unmeasured_modes(self, table: Mapping[str, Any]) -> list[str]:
        """Modes of ``table`` that the training data never measured on the target shape, when it measured
        that shape at all (a configuration race leaves NONE out: the regressors would still predict it from
        the bare shapes' cells, at another load). The default stays: the answer's reference."""
        if not self._shape or not self.card.shape_modes:
            return []
        measured = self.card.shape_modes.get(shape_key(self._shape))
        if not measured:
            return []
        return [m for m in table if m not in measured and m != self.default_mode]

    def _constants_for(self, shape: Mapping[str, Any] | None) -> list[dict[str, float | None]]:
        key = shape_key(shape) if shape else ""
        cached = self._const_cache.get(key)
        if cached is not None:
            return cached
        rows: list[dict[str, float | None]] = [{} for _ in self.modes]
        if self.constants:
            x, _ = self.spec.vectorize({}, shape)
            cols = self.model.const_cols
            xc = _design(x[cols][None, :] if cols else np.zeros((1, 0)))[0]
            vals = np.expm1(self._const(xc))
            nc = len(self.constants)
            for i in range(self._n_modes):
                for k, c in enumerate(self.constants):
                    v = float(vals[i * nc + k])
                    rows[i][c] = v if math.isfinite(v) else None
        self._const_cache[key] = rows
        return rows

    def _paired_better(self, metric: str) -> list[str]:
        """Modes that every paired campaign round on this shape put on the better side of the default."""
        if not self._shape or not self._paired:
            return []
        better = "lower" if METRICS[metric].direction == "min" else "higher"
        return [v.mode for v in self._paired.get((shape_key(self._shape), metric), []) if v.verdict == better]

    def _paired_notes(self, metric: str, best: str) -> list[str]:
        """What the rounds measured on one host say against this answer (graphmode.selector.paired)."""
        if not self._shape or not self._paired:
            return []
        better = "lower" if METRICS[metric].direction == "min" else "higher"
        out = []
        for v in self._paired.get((shape_key(self._shape), metric), []):
            if v.mode != best and v.verdict == better and best == self.default_mode:
                out.append(
                    f"paired inside rounds on one GPU for this model shape, {v.describe()}; the tie rule "
                    f"counts differences between hosts as noise and keeps {best}. A paired round of "
                    f"{v.mode} and {best} (graphmode profile --modes {v.mode},{best}) would settle it"
                )
            elif v.mode == best and v.verdict != better:
                out.append(
                    f"paired inside rounds on one GPU for this model shape, {v.describe()}: inside one "
                    f"host the default measured better"
                )
        return out

    # ---------------------------------------------------------------- inputs
    def features_of(self, inputs: Inputs) -> tuple[dict[str, Any], FeatureSource]:
        if isinstance(inputs, ObservedFeatures):
            return dict(inputs.__dict__), "observed"
        if isinstance(inputs, WorkloadDescription):
            return dict(self.describe(inputs).__dict__), "description"
        if isinstance(inputs, Mapping):
            if {"rate", "input_tokens", "output_tokens"} <= set(inputs):
                return dict(
                    self.describe(WorkloadDescription.model_validate(dict(inputs))).__dict__
                ), "description"
            return dict(ObservedFeatures.model_validate(dict(inputs)).__dict__), "observed"
        raise TypeError(f"cannot recommend from {type(inputs).__name__}")

    def describe(self, desc: WorkloadDescription) -> ObservedFeatures:
        """Expected observed features of a described workload, iterated with this model's latency."""
        calib = {d.feature: d.calibration for d in self.card.describe}
        return describe_features(desc, self._e2e_predictor(), calib)

    def _e2e_predictor(self) -> Callable[[dict[str, float | None]], float | None] | None:
        col = self._e2e_col
        if col is None:
            return None

        def e2e(feats: dict[str, float | None]) -> float | None:
            x, _ = self.spec.vectorize(feats, self._shape)
            vals = self._reg_e2e(_design(x[None, :])[0])
            vals = vals[np.isfinite(vals)]
            return float(np.exp(vals.mean())) if vals.size else None  # geometric mean over modes

        return e2e

    # ---------------------------------------------------------------- predicting
    def predict(self, inputs: Inputs) -> dict[str, dict[str, float | None]]:
        """Predicted metrics and constants of every mode the model knows: mode -> metric -> value."""
        feats, _ = self.features_of(inputs)
        x, _ = self.spec.vectorize(feats, self._shape)
        return self._table(x)

    def _table(self, x: np.ndarray) -> dict[str, dict[str, float | None]]:
        with np.errstate(over="ignore"):  # far outside the data a prediction overflows: None below, not a warning
            y = np.exp(self._reg(_design(x[None, :])[0]))
        nm = self._n_metrics
        table: dict[str, dict[str, float | None]] = {}
        for i, mode in enumerate(self.modes):
            row: dict[str, float | None] = {}
            for j, metric in enumerate(self.metrics):
                v = float(y[i * nm + j])
                row[metric] = v if math.isfinite(v) else None
            row.update(self._const_rows[i])
            if any(v is not None for v in row.values()):
                table[mode] = row
        return table

    def recommend(
        self, inputs: Inputs, objective: Objective | str | None = None, *, source: FeatureSource | None = None
    ) -> Recommendation:
        """The best mode for ``inputs`` under ``objective`` (default: the model's default objective)."""
        t0 = time.perf_counter()
        obj = self._objective(objective)
        feats, src = self.features_of(inputs)
        x, imputed = self.spec.vectorize(feats, self._shape)
        table = self._table(x)
        unmeasured = self._unmeasured_modes(table)
        for m in unmeasured:
            del table[m]
        missing = obj.required_metrics() - set(self.metrics) - set(self.constants)
        if obj.metric in missing:
            raise ObjectiveError(
                f"model {self.model_id} has no {obj.metric} (it knows: "
                f"{', '.join(self.metrics + self.constants)})"
            )
        cv = self.model.noise_cv.get(obj.metric)
        noise = {
            m: (None if cv is None or row.get(obj.metric) is None else cv * abs(row[obj.metric] or 0.0))
            for m, row in table.items()
        }
        ranking = rank(table, noise, obj, self.default_mode)
        best = ranking.best
        assert best is not None
        warnings = list(self.match.warnings)
        notes = list(ranking.notes)
        if missing:
            warnings.append("the model cannot check " + ", ".join(sorted(missing)))
        if self._shape_warning:
            warnings.append(self._shape_warning)
        if self._deployment_warning:
            warnings.append(self._deployment_warning)
        if unmeasured:
            notes.append("not measured on this model shape and configuration, so never chosen (its predictions would "
                         "borrow other shapes'): " + ", ".join(unmeasured))
        spec = self.card.shape_spec_decode.get(shape_key(self._shape)) if self._shape else None
        if spec is not None:
            rate = feats.get("spec_acceptance_rate")
            notes.append(spec_decode_note(spec, float(rate) if isinstance(rate, int | float) else None))
        notes += self._paired_notes(obj.metric, best)
        # Race verdicts (paired rounds) decide where they exist; the tie rule above stands without them.
        race = race_decision(
            self.card.race, shape_key(self._shape) if self._shape else "", obj.metric, feats, ranking.order,
            table, weighted=bool(obj.memory_weight or obj.startup_weight),
            allowed=[m for m, s in ranking.scores.items() if s is not None and s.status != "violates"],
            default_mode=self.default_mode, corroborated=self._paired_better(obj.metric),
            max_model_len=_int_or_none(self._shape.get("max_model_len") if self._shape else None),
            api_server_count=_int_or_none(self._shape.get("api_server_count") if self._shape else None),
        ) if self.card.race else None
        if race is not None and race.mode in ranking.scores:
            if race.basis != "default" or best != self.default_mode:
                # the verdicts overrule the tie rule: its "within noise" and the paired "would settle it"
                # notes argued about the evidence the race has now weighed
                notes = [n for n in notes if "within noise of the default" not in n and "would settle it" not in n]
            else:  # a mode the race found worse is no near miss of the tie rule's
                notes = [n for n in notes if not any(n.startswith(f"{m} scores best") for m in race.worse)]
            best = race.mode
            notes += race.notes
        spread = noise_for(self.card.race_noise, shape_key(self._shape) if self._shape else "", obj.metric)
        if spread is not None and spread.describe():
            notes.append(f"noise on this model shape: {spread.describe()}")
        frontend = frontend_note(feats.get("frontend_cpu_cores"))  # advice only: the mode stands
        if frontend:
            notes.append(frontend)
        if self.card.synthetic:
            warnings.append("this model was trained on SYNTHETIC data: its numbers are not measurements")

        dist = self.spec.distance(x, self._train_z) if self._train_z.size else 0.0
        spacing = self.spec.nn_dist_median
        ratio = dist / spacing if spacing > 0 else None
        oor = self.spec.out_of_range(x)
        conf = self._confidence(
            ranking.margin_sigma,
            ranking.runner_up,
            dist,
            ratio,
            oor,
            imputed,
            best,
            ranking.constraints_met,
            src,
        )
        if not conf.in_distribution:
            warnings.append(
                "the input is outside what was profiled ("
                + (
                    "; ".join([f"out of range: {', '.join(oor)}"] if oor else [])
                    or f"{dist:.2f} from the nearest profiled workload, {ratio or 0:.1f}× the usual spacing"
                )
                + "): treat the answer as a guess and profile this traffic"
            )

        chosen_score = ranking.scores[best].score
        default_score = (
            ranking.scores[self.default_mode].score if self.default_mode in ranking.scores else None
        )
        default_value = (
            ranking.scores[self.default_mode].value if self.default_mode in ranking.scores else None
        )
        # The gain is on the metric the caller asked about; the weighted score's gain is reported apart.
        gain = relative_gain(ranking.scores[best].value, default_value, obj.metric)
        score_gain = relative_gain(chosen_score, default_score, obj.metric)
        # a mode the race found worse than the default on this metric is no tie, whatever the regressors say
        ties = [m for m in ranking.ties if race is None or m not in race.worse]
        preds = [
            ModePrediction(
                mode=m,
                metrics=table.get(m, {}),
                objective_value=s.value,
                score=s.score,
                noise=s.noise,
                status=s.status,
                violations=s.violations,
                tied=m in ties,
            )
            for m in ranking.order
            if (s := ranking.scores[m]) is not None
        ]
        mode_enum = parse_mode(best)
        cc = compilation_config(mode_enum)
        return Recommendation(
            mode=best,
            compilation_config=cc,
            vllm_args=["--compilation-config", cc],
            objective=obj,
            objective_description=obj.describe(),
            predicted_value=ranking.scores[best].value,
            default_mode=self.default_mode,
            gain_vs_default_pct=gain,
            score_gain_vs_default_pct=score_gain,
            gain_significant=(race.basis == "better" and best == race.mode) if race is not None
            else self.default_mode not in ranking.ties and best != self.default_mode,
            ties=ties,
            constraints_met=ranking.constraints_met,
            predictions=preds,
            confidence=conf,
            features={k: feats.get(k) for k in ObservedFeatures.model_fields},
            features_source=source or src,
            model_id=self.model_id,
            fingerprint_keys=self.card.fingerprint_keys,
            fingerprint_match=self.match.kind,
            synthetic_model=self.card.synthetic,
            race=race,
            noise=spread,
            warnings=warnings,
            notes=notes,
            elapsed_ms=(time.perf_counter() - t0) * 1e3,
        )

    def _objective(self, objective: Objective | str | None) -> Objective:
        if objective is None:
            return self.default_objective
        if isinstance(objective, Objective):
            return objective
        return make_objective(objective)

    def _confidence(
        self,
        margin: float | None,
        runner: str | None,
        dist: float,
        ratio: float | None,
        oor: list[str],
        imputed: list[str],
        best: str,
        constraints_met: bool,
        src: FeatureSource,
    ) -> Confidence:
        low, medium = [], []
        if oor:
            low.append(f"features outside the profiled range: {', '.join(oor)}")
        if ratio is not None and ratio > FAR_RATIO:
            low.append(f"far from every profiled workload ({ratio:.1f}× the usual spacing)")
        elif ratio is not None and ratio > NEAR_RATIO:
            medium.append(f"between profiled workloads ({ratio:.1f}× the usual spacing)")
        if self._shape_warning and "unlike" in self._shape_warning:
            low.append("model shape unlike the trained ones")
        if self._deployment_warning:
            low.append("deployment configuration unlike the trained ones")
        if self.match.kind == "nearest":
            medium.append("the model's fingerprint is not the target's")
        if not constraints_met:
            low.append("constraints not met by any mode")
        if imputed:
            (low if len(imputed) > 2 else medium).append(f"features imputed: {', '.join(imputed)}")
        if margin is not None and 0 <= margin < TIE_Z and best != self.default_mode:
            medium.append(f"runner-up {runner} is within {TIE_Z:g} noise standard deviations")
        if self.card.synthetic:
            low.append("synthetic training data")
        if src == "description":
            medium.append("features derived from a description, not observed")
        level: ConfidenceLevel = "low" if low else "medium" if medium else "high"
        in_dist = not oor and (ratio is None or ratio <= FAR_RATIO)
        return Confidence(
            level=level,
            margin_sigma=None if margin is None or not math.isfinite(margin) else margin,
            runner_up=runner,
            distance=dist,
            distance_ratio=ratio,
            in_distribution=in_dist,
            out_of_range=oor,
            imputed=imputed,
            reasons=low + medium,
        )


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
