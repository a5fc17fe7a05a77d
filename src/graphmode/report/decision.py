"""The trained selector in the report: loading it, its cross-validation, and its decision over a grid.

The model is loaded the way ``graphmode recommend`` loads it (card, sha256-checked skops artifact, never
pickle) through :class:`~graphmode.selector.recommend.Recommender`. The decision map asks it, for every
point of a dense grid of arrival rate × prefill/decode ratio at each burstiness, what
:meth:`Recommender.recommend` answers for an objective. A point is a
:class:`~graphmode.selector.describe.WorkloadDescription`, turned into the observed features the model
takes (batch mean and CV, concurrency, ...) by :meth:`Recommender.describe`, the same path as
``graphmode recommend --rate .. --burstiness .. --input-tokens .. --output-tokens ..``. Token lengths
along the ratio axis: ``input = G·√ratio``, ``output = G/√ratio`` with ``G`` (the geometric mean of the
two) interpolated in log space between the profiled workloads, so the map passes through them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from graphmode.core.errors import GraphmodeError, ModelError
from graphmode.core.records import Fingerprint, ObservedFeatures
from graphmode.report.views import ReportData, ShapeView
from graphmode.selector.card import CV_FILE, CVReport, ModelCard
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.featurize import shape_key
from graphmode.selector.recommend import Recommender
from graphmode.selector.registry import list_models, select_model

MAP_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50")
DEFAULT_GRID_POINTS = 8
_FALLBACK_RATE = (1.0, 64.0)
_FALLBACK_RATIO = (0.1, 50.0)
_FALLBACK_G = 256.0


@dataclass
class LoadedModel:
    folder: Path
    card: ModelCard
    recommender: Recommender
    cv: CVReport
    cv_source: str
    notes: list[str] = field(default_factory=list)

    @property
    def model_id(self) -> str:
        return self.card.model_id


def load_model(folder: Path) -> LoadedModel:
    """A model folder: card, artifact and ``cv.json`` (the card's copy if the file is missing)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelError(f"no model folder at {folder}")
    rec = Recommender.from_dir(folder)
    notes: list[str] = []
    cv_path = folder / CV_FILE
    if cv_path.is_file():
        try:
            cv = CVReport.model_validate_json(cv_path.read_text(encoding="utf-8"))
        except (OSError, ValidationError, ValueError) as exc:
            raise ModelError(f"{cv_path} is not a readable cross-validation report: "
                             f"{str(exc).splitlines()[0]}") from None
        source = str(cv_path)
    else:
        cv, source = rec.card.cv, f"{folder / 'card.json'} (no {CV_FILE})"
        notes.append(f"{CV_FILE} missing in {folder}: the CV table is the model card's copy")
    return LoadedModel(folder, rec.card, rec, cv, source, notes)


def default_model_folder(models_dir: Path, data: ReportData) -> Path | None:
    """The model ``graphmode recommend`` would use for the data's GPU and vLLM; None when there is none."""
    if not any(e.card is not None for e in list_models(models_dir)):
        return None
    hosts = data.hosts
    target = Fingerprint(gpu_name=hosts[0].gpu_name, vllm_version=hosts[0].vllm_version) if hosts else None
    entry, _ = select_model(models_dir, None, target)
    return entry.folder


@dataclass
class DecisionMap:
    """The model's chosen mode over rate × ratio at each burstiness, for one shape and each objective."""

    shape_key: str
    shape_label: str
    rates: list[float]
    ratios: list[float]
    burstiness: list[float]
    metrics: list[str]
    tokens: list[tuple[float, float]]  # (input, output) per ratio row
    choice: dict[tuple[str, float], list[list[str | None]]]  # (metric, burstiness) -> [ratio][rate]
    measured: list[MeasuredPoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class MeasuredPoint:
    workload: str
    rate: float
    ratio: float
    burstiness: float
    winner: dict[str, str]  # metric -> measured best mode
    ties: dict[str, list[str]]
    predicted: dict[str, str | None]  # metric -> the model's answer at the observed features


def _span(spec_names: list[str], lo: list[float], hi: list[float], name: str, measured: Sequence[float],
          fallback: tuple[float, float]) -> tuple[float, float]:
    """Raw range of a log1p feature: the model's training range, else the measured one, widened ×1.5."""
    if name in spec_names:
        i = spec_names.index(name)
        a, b = math.expm1(lo[i]), math.expm1(hi[i])
    elif measured:
        a, b = min(measured), max(measured)
    else:
        a, b = fallback
    a, b = max(a, 1e-3), max(b, 1e-3)
    if b <= a * 1.01:
        a, b = a / 2, b * 2
    return a / 1.5, b * 1.5


def decision_maps(
    model: LoadedModel, data: ReportData, *, points: int = DEFAULT_GRID_POINTS,
    metrics: Sequence[str] = MAP_METRICS,
) -> list[DecisionMap]:
    """One :class:`DecisionMap` per model shape (see the module docstring)."""
    card = model.card
    metrics = [m for m in metrics if m in card.workload_metrics]
    if not metrics:
        return []
    base = model.recommender
    shapes = card.shapes or [{}]
    out: list[DecisionMap] = []
    all_bursts = sorted({w.burstiness for v in data.shapes for w in v.workloads if w.burstiness is not None},
                        reverse=True) or [1.0]
    for shape in shapes:
        skey = shape_key(shape) if shape else ""
        views = [s for s in data.shapes if s.key == skey] if shape else list(data.shapes[:1])
        view: ShapeView | None = views[0] if views else None
        fp = Fingerprint.model_validate({k: v for k, v in shape.items() if k in Fingerprint.model_fields})
        rec = Recommender(base.folder, card, base.model, target=fp) if len(shapes) > 1 else base
        spec = card.features
        wl = view.workloads if view else []
        rate_lo, rate_hi = _span(spec.names, spec.lo, spec.hi, "arrival_rate",
                                 [w.rate for w in wl if w.rate], _FALLBACK_RATE)
        ratio_lo, ratio_hi = _span(spec.names, spec.lo, spec.hi, "prefill_decode_ratio",
                                   [w.input_tokens / w.output_tokens for w in wl
                                    if w.input_tokens and w.output_tokens], _FALLBACK_RATIO)
        rates = np.geomspace(rate_lo, rate_hi, points).tolist()
        ratios = np.geomspace(ratio_lo, ratio_hi, points).tolist()
        known = sorted({(w.input_tokens / w.output_tokens, math.sqrt(w.input_tokens * w.output_tokens))
                        for w in wl if w.input_tokens and w.output_tokens})
        if known:
            lr = np.log([k[0] for k in known])
            lg = np.log([k[1] for k in known])
            gs = np.exp(np.interp(np.log(ratios), lr, lg)).tolist()
        else:
            gs = [_FALLBACK_G] * len(ratios)
        tokens = [(g * math.sqrt(r), g / math.sqrt(r)) for g, r in zip(gs, ratios, strict=True)]
        # A model shape this report has no rows for still gets every burstiness the data has.
        bursts = sorted({w.burstiness for w in wl if w.burstiness is not None}, reverse=True) or all_bursts
        choice: dict[tuple[str, float], list[list[str | None]]] = {}
        for b in bursts:
            grids: dict[str, list[list[str | None]]] = {m: [[None] * len(rates) for _ in ratios] for m in metrics}
            for i, (inp, outp) in enumerate(tokens):
                for j, rate in enumerate(rates):
                    desc = WorkloadDescription(rate=rate, burstiness=b, input_tokens=inp, output_tokens=outp)
                    feats = rec.describe(desc)
                    for m in metrics:
                        grids[m][i][j] = _answer(rec, feats, m)
            for m in metrics:
                choice[(m, b)] = grids[m]
        measured: list[MeasuredPoint] = []
        for w in wl:
            rate, ratio = w.features.get("arrival_rate"), w.features.get("prefill_decode_ratio")
            if rate is None or ratio is None or not w.verdicts:
                continue
            feats = ObservedFeatures.model_validate({k: v for k, v in w.features.items() if v is not None})
            measured.append(
                MeasuredPoint(
                    workload=w.label,
                    rate=rate,
                    ratio=ratio,
                    burstiness=w.burstiness if w.burstiness is not None else bursts[0],
                    winner={m: w.verdicts[m].best for m in metrics if m in w.verdicts},
                    ties={m: w.verdicts[m].ties for m in metrics if m in w.verdicts},
                    predicted={m: _answer(rec, feats, m) for m in metrics},
                )
            )
        label = view.short if view else str(shape.get("model_architecture") or "model shape")
        notes = [] if view else [f"no measured rows of {label} in the datasets: map without measured winners"]
        out.append(DecisionMap(skey, label, rates, ratios, bursts, list(metrics), tokens, choice, measured, notes))
    return out


def _answer(rec: Recommender, feats: ObservedFeatures | dict[str, Any], metric: str) -> str | None:
    try:
        return rec.recommend(feats, metric).mode
    except GraphmodeError:
        return None
