"""Recommending a mode: load a model once, answer many requests fast.

::

    rec = Recommender.load(models_dir, model_id=None, target=fingerprint)   # once
    answer = rec.recommend(ObservedFeatures(...) | WorkloadDescription(...), "itl_p50")

Everything that does not depend on the request is done at load: the artifact is verified and loaded,
the regressors are compiled to numpy (:meth:`ColumnwiseRegressor.compile`), the training inputs are
standardized for the distance check, and the per-mode constants are predicted for the target shape.
A request is then one vectorization, one neighbour lookup for every (mode, metric), the race verdicts
whose region holds it, a ranking of at most five modes and one pydantic object; the pure parts (regressor
outputs, a description's features, the race's answer) are memoised per model (:meth:`memos`), so a repeated
or similar request skips them. Apart from those bounded memos a :class:`Recommender` is immutable after
load; it is safe to share between threads.
"""

from __future__ import annotations

import copy
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graphmode.core.deployment import DeploymentConfig
from graphmode.core.errors import ModelError, ObjectiveError, StaleModelError
from graphmode.core.modes import compilation_config, parse_mode
from graphmode.core.records import Fingerprint, ObservedFeatures
from graphmode.selector.answer import (
    FAR_RATIO,
    NEAR_RATIO,
    Confidence,
    ConfidenceLevel,
    FeatureSource,
    Finding,
    FindingKind,
    ModePrediction,
    Recommendation,
    confidence_of,
    margin_over,
)
from graphmode.selector.artifacts import load_artifact
from graphmode.selector.card import ARTIFACT_FILE, ModelCard
from graphmode.selector.deployments import shape_warning, with_auto_backend
from graphmode.selector.describe import WorkloadDescription, describe_features
from graphmode.selector.featurize import ARCH_FIELD, SHAPE_FEATURES, shape_key
from graphmode.selector.frontend import frontend_note
from graphmode.selector.memo import Memo
from graphmode.selector.model import SelectorModel, _design
from graphmode.selector.noise import noise_for
from graphmode.selector.objective import METRICS, Objective, Ranking, make_objective, rank, relative_gain
from graphmode.selector.paired import PairedVerdict, paired_notes
from graphmode.selector.region import REGION_FEATURES, race_command
from graphmode.selector.registry import FingerprintMatch, match_card, select_model
from graphmode.selector.specdecode import spec_decode_note
from graphmode.selector.verdicts import RaceAnswer, race_decision

# what race_decision reads of the predictions: the savings an equivalent mode offers against the default
_EQUIVALENT_COSTS: tuple[str, ...] = ("graph_gib", "startup_s")
SHAPE_CACHE = 64  # per-shape copies a recommender keeps (Recommender.for_shape)
# What a target model contributes to its shape: the shape features, its identity, and its active parameters
# (a mixture of experts runs a fraction of its weights; featurize.CONFIG_FEATURES).
_TARGET_SHAPE_KEYS: tuple[str, ...] = (
    *(n for n, _ in SHAPE_FEATURES), ARCH_FIELD, "model_config_hash", "model_type", "num_active_params_b")
__all__ = ["FAR_RATIO", "NEAR_RATIO", "Confidence", "ConfidenceLevel", "FeatureSource", "Finding", "Inputs",
           "ModePrediction", "Recommendation", "Recommender"]

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
        self._across: dict[Any, Any] = {}  # across-races intervals of this card's verdicts (race_decision's memo)
        # Pure per-model memos shared by the shape and deployment copies, each key all its value depends on
        # beyond the model (graphmode.selector.memo: bounded; a reload starts empty ones). See memos().
        self._y_memo: Memo[np.ndarray] = Memo()
        self._describe_memo: Memo[ObservedFeatures] = Memo()
        self._race_memo: Memo[RaceAnswer | None] = Memo()
        self._vec_shape: Mapping[str, Any] | bool | None = False  # the _shape the vectorizer below is for
        self._vec: Callable[[Mapping[str, Any]], tuple[np.ndarray, list[str]]] = self.spec.vectorizer(None)
        self._shape_ident = self._shape_key = ""
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

    def memos(self) -> dict[str, Memo[Any]]:
        """This model's memos: regressor outputs per row, description features per shape, race answers."""
        return {"predictions": self._y_memo, "describe": self._describe_memo, "race": self._race_memo}

    @property
    def deployment_warning(self) -> str | None:
        """Why the deployment given to :meth:`for_deployment` is unlike the trained ones (None: it is not)."""
        return self._deployment_warning

    def _check_shape(self, shape: Mapping[str, Any]) -> None:
        self._shape_warning = shape_warning(self.card, shape, self.spec.uses_shape) or self._shape_warning

    def _unmeasured_modes(self, table: Mapping[str, Any]) -> list[str]:
        """Modes of ``table`` that the training data never measured on the target shape, when it measured
        that shape at all (a configuration race leaves NONE out: the regressors would still predict it from
        the bare shapes' cells, at another load). The default stays: the answer's reference."""
        if not self._shape or not self.card.shape_modes:
            return []
        measured = self.card.shape_modes.get(self._key)
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
        return [v.mode for v in self._paired.get((self._key, metric), []) if v.verdict == better]

    def _paired_notes(self, metric: str, best: str) -> tuple[list[str], list[str]]:
        """What the rounds measured on one host say against this answer (graphmode.selector.paired): the notes
        that a paired round would settle a tie the rule kept, and those where the default measured better."""
        if not self._shape or not self._paired:
            return [], []
        better = "lower" if METRICS[metric].direction == "min" else "higher"
        return paired_notes(self._paired.get((self._key, metric), []), better, best, self.default_mode)

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
        """Expected observed features of a described workload, iterated with this model's latency (memoised
        per description and target shape: the fixed point is most of a description's answer)."""
        self._vectorize({})  # brings _shape_ident up to date

        def compute() -> ObservedFeatures:
            calib = {d.feature: d.calibration for d in self.card.describe}
            return describe_features(desc, self._e2e_predictor(), calib)

        return self._describe_memo.get((self._shape_ident, desc), compute)

    def _vectorize(self, feats: Mapping[str, Any]) -> tuple[np.ndarray, list[str]]:
        """``spec.vectorize(feats, self._shape)``, the shape's columns computed once per shape (and copy)."""
        if self._vec_shape is not self._shape:
            shape = self._shape
            self._vec = self.spec.vectorizer(shape)
            self._shape_ident = repr(sorted(shape.items())) if shape is not None else ""
            self._shape_key = shape_key(shape) if shape else ""
            self._vec_shape = shape
        return self._vec(feats)

    @property
    def _key(self) -> str:
        """``shape_key(self._shape)`` ("" without a shape), computed once per shape (and copy)."""
        if self._vec_shape is not self._shape:
            self._vectorize({})
        return self._shape_key

    def _e2e_predictor(self) -> Callable[[dict[str, float | None]], float | None] | None:
        col = self._e2e_col
        if col is None:
            return None

        def e2e(feats: dict[str, float | None]) -> float | None:
            x, _ = self._vectorize(feats)
            vals = self._reg_e2e(_design(x[None, :])[0])
            vals = vals[np.isfinite(vals)]
            return float(np.exp(vals.mean())) if vals.size else None  # geometric mean over modes

        return e2e

    # ---------------------------------------------------------------- predicting
    def predict(self, inputs: Inputs) -> dict[str, dict[str, float | None]]:
        """Predicted metrics and constants of every mode the model knows: mode -> metric -> value."""
        feats, _ = self.features_of(inputs)
        x, _ = self._vectorize(feats)
        return self._table(x)

    def _table(self, x: np.ndarray) -> dict[str, dict[str, float | None]]:
        y = self._y_memo.get(x.tobytes(), lambda: self._predict_row(x))
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

    def _predict_row(self, x: np.ndarray) -> np.ndarray:
        """Every (mode, metric) prediction for one input row (kept by :attr:`_y_memo`: read-only)."""
        with np.errstate(over="ignore"):  # far outside the data a prediction overflows: None below, not a warning
            y = np.exp(self._reg(_design(x[None, :])[0]))
        y.flags.writeable = False
        return y

    def recommend(
        self, inputs: Inputs, objective: Objective | str | None = None, *, source: FeatureSource | None = None
    ) -> Recommendation:
        """The best mode for ``inputs`` under ``objective`` (default: the model's default objective).

        The race verdicts whose raced region holds the request choose the mode; the regressors fill the
        predicted numbers and choose only where no verdict speaks to the objective's metric, and then never
        a mode the races found worse on a latency metric (:meth:`_latency_worse`)."""
        t0 = time.perf_counter()
        obj = self._objective(objective)
        feats, src = self.features_of(inputs)
        x, imputed = self._vectorize(feats)
        table = self._table(x)
        unmeasured = self._unmeasured_modes(table)
        for m in unmeasured:
            del table[m]
        missing = self._check_objective(obj, table)
        cv = self.model.noise_cv.get(obj.metric)
        noise = {m: (None if cv is None or row.get(obj.metric) is None else cv * abs(row[obj.metric] or 0.0))
                 for m, row in table.items()}
        ranking = rank(table, noise, obj, self.default_mode)
        findings: list[Finding] = []
        race = self._race(obj, feats, ranking, table)
        best = self._choose(obj, ranking, race, findings)
        warnings = list(self.match.warnings)
        if missing:
            warnings.append("the model cannot check " + ", ".join(sorted(missing)))
        warnings += [w for w in (self._shape_warning, self._deployment_warning) if w]
        if self.card.synthetic:
            warnings.append("this model was trained on SYNTHETIC data: its numbers are not measurements")
        findings += self._context_findings(obj, feats, best, unmeasured)
        chosen = ranking.scores[best]
        constraints_met = chosen.status == "ok"
        if chosen.status == "violates":
            findings.append(Finding(kind="constraints", text=f"{best} violates: " + "; ".join(chosen.violations)))
        elif chosen.status == "unverified":
            findings.append(Finding(kind="constraints", text="some constraints cannot be checked for the chosen "
                                    "mode: " + ", ".join(chosen.unverified)))
        dist = self.spec.distance(x, self._train_z) if self._train_z.size else 0.0
        spacing = self.spec.nn_dist_median
        ratio = dist / spacing if spacing > 0 else None
        oor = self.spec.out_of_range(x)
        margin, runner = margin_over({m: (s.score, s.noise) for m, s in ranking.scores.items()}, ranking.order,
                                     best, obj.direction == "min")
        conf = confidence_of(
            margin=margin, runner=runner, dist=dist, ratio=ratio, oor=oor, imputed=imputed, best=best,
            default_mode=self.default_mode, constraints_met=constraints_met, described=src == "description",
            synthetic=self.card.synthetic, shape_unlike=bool(self._shape_warning and "unlike" in self._shape_warning),
            deployment_unlike=bool(self._deployment_warning), fingerprint_differs=self.match.kind == "nearest",
            other_gpu=self.match.other_gpu, outside_region=race is not None and race.basis == "outside")
        if not conf.in_distribution:
            warnings.append(
                "the input is outside what was profiled ("
                + ("; ".join([f"out of range: {', '.join(oor)}"] if oor else [])
                   or f"{dist:.2f} from the nearest profiled workload, {ratio or 0:.1f}× the usual spacing")
                + "): treat the answer as a guess and profile this traffic")
        default_score = ranking.scores.get(self.default_mode)
        # a mode the race found worse than the default on this metric is no tie, whatever the regressors say
        ties = [m for m in ranking.ties if race is None or m not in race.worse]
        if best not in ties:
            ties = [best, *ties]
        preds = [
            ModePrediction(mode=m, metrics=table.get(m, {}), objective_value=s.value, score=s.score, noise=s.noise,
                           status=s.status, violations=s.violations, tied=m in ties)
            for m in [best, *[m for m in ranking.order if m != best]] if (s := ranking.scores[m]) is not None
        ]
        cc = compilation_config(parse_mode(best))
        return Recommendation(
            mode=best, compilation_config=cc, vllm_args=["--compilation-config", cc], objective=obj,
            objective_description=obj.describe(), predicted_value=chosen.value, default_mode=self.default_mode,
            gain_vs_default_pct=relative_gain(chosen.value, default_score.value if default_score else None,
                                              obj.metric),
            score_gain_vs_default_pct=relative_gain(chosen.score, default_score.score if default_score else None,
                                                    obj.metric),
            gain_significant=race is not None and race.basis == "better" and best == race.mode,
            ties=ties, constraints_met=constraints_met, predictions=preds, confidence=conf,
            features={k: feats.get(k) for k in ObservedFeatures.model_fields}, features_source=source or src,
            model_id=self.model_id, fingerprint_keys=self.card.fingerprint_keys, fingerprint_match=self.match.kind,
            synthetic_model=self.card.synthetic, race=race,
            noise=noise_for(self.card.race_noise, self._key, obj.metric),
            warnings=warnings, findings=findings, notes=[f.text for f in findings],
            elapsed_ms=(time.perf_counter() - t0) * 1e3,
        )

    def _check_objective(self, obj: Objective, table: Mapping[str, Mapping[str, float | None]]) -> set[str]:
        """The objective's metrics the model does not know; ObjectiveError when it cannot answer at all: its
        metric unknown, or known by name but predicted for no mode (never measured, e.g. graph memory in a
        model trained on races, which start engines side by side and read no graph pool)."""
        known = self.metrics + self.constants
        missing = obj.required_metrics() - set(known)
        valued = [m for m in known if any(row.get(m) is not None for row in table.values())]
        if obj.metric in missing:
            raise ObjectiveError(f"model {self.model_id} has no {obj.metric} (it knows: {', '.join(valued)})")
        if obj.metric not in valued:
            info = self.card.metrics.get(obj.metric)
            cells = info.measured_cells if info is not None else 0
            raise ObjectiveError(
                f"model {self.model_id} cannot answer for {obj.metric}: its data measured it in {cells} cells, so "
                f"it predicts no value for any mode. Objectives it can answer: {', '.join(valued)}. A model "
                f"trained on grid cells measures it (graphmode models lists each model's metrics; --model-id or "
                f"--vllm-version picks one)")
        return missing

    def _race(self, obj: Objective, feats: Mapping[str, Any], ranking: Ranking,
              table: Mapping[str, Mapping[str, float | None]]) -> RaceAnswer | None:
        """What the race verdicts whose region holds the request decide (None: no verdicts for the shape).

        :func:`race_decision` is pure in what it is given here (region features, ranking, each mode's costs, the
        objective, the shape): memoised under exactly that; each caller gets its own copy of the lists."""
        if not self.card.race:
            return None
        shape = self._key
        region = {f: feats[f] for f in REGION_FEATURES if feats.get(f) is not None}
        costs = {m: {k: row.get(k) for k in _EQUIVALENT_COSTS} for m, row in table.items()}
        allowed = [m for m, s in ranking.scores.items() if s is not None and s.status != "violates"]
        weighted = bool(obj.memory_weight or obj.startup_weight)
        corroborated = self._paired_better(obj.metric)
        max_model_len = _int_or_none(self._shape.get("max_model_len") if self._shape else None)
        api_server_count = _int_or_none(self._shape.get("api_server_count") if self._shape else None)
        key = (shape, obj.metric, tuple(region.items()), tuple(ranking.order),
               tuple((m, *c.values()) for m, c in costs.items()), weighted, tuple(allowed), self.default_mode,
               tuple(corroborated), max_model_len, api_server_count)

        def compute() -> RaceAnswer | None:
            return race_decision(
                self.card.race, shape, obj.metric, region, ranking.order, costs, weighted=weighted,
                allowed=allowed, default_mode=self.default_mode, corroborated=corroborated,
                max_model_len=max_model_len, api_server_count=api_server_count, memo=self._across)

        race = self._race_memo.get(key, compute)
        if race is None:
            return None
        return race.model_copy(update={"outside": list(race.outside), "equivalent": list(race.equivalent),
                                       "worse": list(race.worse), "undecided": list(race.undecided),
                                       "notes": list(race.notes)})

    def _choose(self, obj: Objective, ranking: Ranking, race: RaceAnswer | None, findings: list[Finding]) -> str:
        """The mode: the race's where its verdicts speak, else the regressors' best that the races never found
        worse on a latency metric; *findings* gets the notes of whichever decided."""
        best = ranking.best
        assert best is not None
        settle, against = self._paired_notes(obj.metric, best)
        tie = ranking.tie_note
        if race is not None and race.mode in ranking.scores:
            if race.basis != "default" or best != self.default_mode:
                # the verdicts overrule the tie rule: its "within noise" and the paired "would settle it" notes
                # argued about the evidence the race has now weighed
                tie, settle = None, []
            elif ranking.top in race.worse:  # a mode the race found worse is no near miss of the tie rule's
                tie = None
            best = race.mode
        elif METRICS[obj.metric].unit == "s" and METRICS[obj.metric].direction == "min":
            banned = self._latency_worse()
            if best in banned:
                best = next((m for m in ranking.order if m not in banned and ranking.scores[m].score is not None),
                            self.default_mode)
                tie = None
                findings.append(Finding(kind="not_chosen", text=f"no race verdict on {obj.metric} for this shape; "
                                        f"the regressors' pick is kept from modes the races found worse on a "
                                        f"latency metric ({', '.join(sorted(banned))}): {best}"))
        if tie:
            findings.append(Finding(kind="tie_rule", text=tie))
        findings += [Finding(kind="paired", text=t) for t in settle + against]
        if race is not None:
            kind: FindingKind = "outside_region" if race.basis == "outside" else "race"
            findings += [Finding(kind=kind, text=n, outside=race.outside if kind == "outside_region" else [],
                                 command=race.command if kind == "outside_region" else None) for n in race.notes]
        return best

    def _latency_worse(self) -> set[str]:
        """Modes a pooled race verdict of this model found worse than the default on a latency metric, on any
        shape (NONE and PIECEWISE on the dense FLASH_ATTN shapes)."""
        return {v.mode for v in self.card.race if v.workload is None and v.verdict == "worse" and not v.runs_as
                and v.mode != self.default_mode and v.metric in METRICS and METRICS[v.metric].unit == "s"}

    def _context_findings(self, obj: Objective, feats: Mapping[str, Any], best: str,
                          unmeasured: list[str]) -> list[Finding]:
        """Notes that inform but do not decide: unmeasured modes, speculative decoding, noise, the frontend,
        and whose GPU the evidence is."""
        out: list[Finding] = []
        if unmeasured:
            out.append(Finding(kind="unmeasured", text="not measured on this model shape and configuration, so never "
                               "chosen (its predictions would borrow other shapes'): " + ", ".join(unmeasured)))
        spec = self.card.shape_spec_decode.get(self._key) if self._shape else None
        if spec is not None:
            rate = feats.get("spec_acceptance_rate")
            out.append(Finding(kind="spec_decode", text=spec_decode_note(
                spec, float(rate) if isinstance(rate, int | float) else None)))
        spread = noise_for(self.card.race_noise, self._key, obj.metric)
        if spread is not None and spread.describe():
            out.append(Finding(kind="noise", text=f"noise on this model shape: {spread.describe()}"))
        frontend = frontend_note(feats.get("frontend_cpu_cores"))  # advice only: the mode stands
        if frontend:
            out.append(Finding(kind="frontend", text=frontend))
        if self.match.other_gpu:
            cmd = race_command(feats)
            out.append(Finding(kind="other_gpu", command=cmd, text=(
                f"the race verdicts and predictions are {self.match.other_gpu}'s, not this GPU's: the answer is "
                f"that GPU's, at low confidence. To measure this GPU: {cmd}")))
        if self.match.release_assumed:
            out.append(Finding(kind="release_assumed", text=(
                f"no vLLM release given: answered from the newest profiled release's model (vLLM "
                f"{self.match.release_assumed}); pass --vllm-version for another")))
        return out

    def _objective(self, objective: Objective | str | None) -> Objective:
        if objective is None:
            return self.default_objective
        if isinstance(objective, Objective):
            return objective
        return make_objective(objective)

def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
