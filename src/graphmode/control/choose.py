"""Choosing the mode before vLLM starts (``graphmode launch``), and merging it into vLLM's arguments.

Basis, in order: an explicit workload description; the last features ``watch`` observed for this
deployment; the model's best static mode for the objective. Source, in order: a remote graphmode
service (``selector_url``), the local model, vLLM's own default. Locally, a description is first
looked up in the model's decision table (:mod:`graphmode.selector.table`) and a static choice in its
card, both plain JSON: the launcher imports no scikit-learn and no HTTP client unless it must. Every
step that fails is recorded in ``notes`` so the launcher can say which source answered and why the
others did not.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from graphmode.core.errors import GraphmodeError
from graphmode.core.modes import DEFAULT_MODE, CudaGraphMode, parse_mode
from graphmode.vllm_args import (
    compilation_config_of,
    user_capture_sizes,
    user_mode,
    with_compilation_config,
    with_mode,
)

if TYPE_CHECKING:
    import httpx

    from graphmode.core.deployment import DeploymentConfig
    from graphmode.core.records import Fingerprint, ObservedFeatures
    from graphmode.selector.card import ModelCard
    from graphmode.selector.describe import WorkloadDescription
    from graphmode.selector.objective import Objective
    from graphmode.selector.recommend import Recommender

Source = Literal["remote", "local", "default", "user"]
Basis = Literal["workload", "features", "static", "user", "default"]


@dataclass(frozen=True)
class ObjectiveSpec:
    """An objective as the user wrote it: sent as-is to a remote service, parsed for the local model."""

    metric: str | None = None
    constraints: tuple[str, ...] = ()

    def build(self, default_metric: str) -> Objective:
        from graphmode.selector.objective import make_objective

        return make_objective(self.metric, list(self.constraints), default_metric=default_metric)

    def payload(self, default_metric: str) -> dict[str, Any]:
        return {"metric": self.metric or default_metric, "constraints": list(self.constraints)}


@dataclass
class Choice:
    mode: CudaGraphMode
    source: Source
    basis: Basis
    reason: str
    notes: list[str] = field(default_factory=list)
    model_id: str | None = None
    elapsed_ms: float = 0.0
    capture: dict[str, Any] | None = None  # capture-size keys for --compilation-config, when chosen

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode.value, "source": self.source, "basis": self.basis, "reason": self.reason,
                "notes": self.notes, "model_id": self.model_id, "elapsed_ms": round(self.elapsed_ms, 1),
                "capture": self.capture}


def capture_keys(block: Any) -> dict[str, Any] | None:
    """The compilation-config keys of a recommendation's ``capture`` block (object or JSON dict)."""
    if block is None:
        return None
    data = block if isinstance(block, Mapping) else block.model_dump()
    sizes, top = data.get("sizes"), data.get("max_capture_size")
    if not isinstance(sizes, list) or not sizes or not all(isinstance(x, int) and x > 0 for x in sizes):
        return None
    return {"cudagraph_capture_sizes": sizes, "max_cudagraph_capture_size": top if isinstance(top, int) else max(sizes)}


RecommenderLoader = Callable[[Path, str | None, "Fingerprint | None"], "Recommender"]


def _load_local(models_dir: Path, model_id: str | None, target: Fingerprint | None = None) -> Recommender:
    from graphmode.selector.recommend import Recommender

    return Recommender.load(models_dir, model_id, target=target)


def remote_recommend(url: str, body: Mapping[str, Any], *, connect_timeout_s: float = 0.3,
                     read_timeout_s: float = 0.7,
                     transport: httpx.BaseTransport | None = None) -> tuple[CudaGraphMode, dict[str, Any]]:
    """Ask a graphmode service; raises :class:`GraphmodeError` with a one-line reason on any failure."""
    import httpx

    endpoint = url.rstrip("/") + "/v1/recommend"
    timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s,
                            pool=connect_timeout_s)
    try:
        with httpx.Client(timeout=timeout, transport=transport) as client:
            r = client.post(endpoint, json=dict(body))
    except httpx.TimeoutException as exc:
        raise GraphmodeError(f"selector service {endpoint} timed out ({type(exc).__name__})") from None
    except httpx.HTTPError as exc:
        raise GraphmodeError(f"selector service {endpoint} unreachable: {exc}") from None
    if r.status_code != 200:
        raise GraphmodeError(f"selector service answered HTTP {r.status_code}: {r.text[:200]}")
    try:
        data = r.json()
        mode = parse_mode(str(data["mode"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise GraphmodeError(f"selector service gave an unusable answer: {exc}") from None
    if not isinstance(data, dict):
        raise GraphmodeError("selector service gave a non-object answer")
    return mode, data


def service_body(objective: dict[str, Any], workload: WorkloadDescription | None,
                 features: ObservedFeatures | Mapping[str, Any] | None, *, model_id: str | None,
                 step_sizes: Mapping[str, Any] | None, vllm_args: Sequence[str] | None,
                 served_config: Mapping[str, Any] | None, target: Fingerprint | None) -> dict[str, Any]:
    """The ``POST /v1/recommend`` body for a launch: the same request the local decision path gets."""
    body: dict[str, Any] = {"objective": objective}
    if model_id:
        body["model_id"] = model_id
    if step_sizes is not None:
        body["step_sizes"] = dict(step_sizes)
    if vllm_args is not None:
        body["vllm_args"] = list(vllm_args)
    if served_config is not None:
        body["served_model_config"] = dict(served_config)
    if target is not None and target.vllm_version:
        body["vllm_version"] = target.vllm_version
    if workload is not None:
        body["workload"] = workload.model_dump(exclude_none=True)
    else:
        feats = features if isinstance(features, Mapping) else features.model_dump()  # type: ignore[union-attr]
        body["features"] = {k: v for k, v in dict(feats).items() if v is not None}
    return body


def remote_cautions(data: Mapping[str, Any]) -> list[str]:
    """The texts of a service answer's findings that limit its trust (:data:`graphmode.selector.answer.CAUTION`),
    picked by kind; a service older than typed findings gives none."""
    from graphmode.selector.answer import CAUTION

    found = data.get("findings")
    if not isinstance(found, list):
        return []
    return [str(f["text"]) for f in found if isinstance(f, dict) and f.get("kind") in CAUTION and f.get("text")]


def card_static_mode(card: ModelCard, objective: Objective) -> str | None:
    desc = objective.describe()
    for s in card.cv.summaries:
        if s.objective == desc and s.static_mode:
            return s.static_mode
    return None


def best_static_mode(rec: Recommender, objective: Objective) -> tuple[str, str]:
    """The mode best on most profiled workloads for ``objective``, and where that came from.

    The card's cross-validation summary names it for the objectives it evaluated; for any other
    objective every training workload is ranked with the model's predictions and the majority wins
    (vLLM's default on a tie).
    """
    from graphmode.selector.objective import rank

    static = card_static_mode(rec.card, objective)
    if static is not None:
        return static, "model card (measured, cross-validation)"
    votes: Counter[str] = Counter()
    cv = rec.model.noise_cv.get(objective.metric)
    for x in rec.model.train_x:
        table = rec._table(x)
        noise = {m: (None if cv is None or row.get(objective.metric) is None
                     else cv * abs(row[objective.metric] or 0.0)) for m, row in table.items()}
        r = rank(table, noise, objective, rec.default_mode)
        if r.best is not None:
            votes[r.best] += 1
    if not votes:
        return DEFAULT_MODE.value, "no training workload could be ranked: vLLM's default"
    best = max(votes, key=lambda m: (votes[m], m == DEFAULT_MODE.value))
    return best, f"predicted best on {votes[best]}/{sum(votes.values())} profiled workloads"


def deployment_of_args(vllm_args: Sequence[str]) -> DeploymentConfig:
    """The configuration vLLM will run with these args in this environment (the launcher's, which vLLM
    inherits). Never fails a launch: an unreadable element is reported unknown, and vLLM judges the args."""
    import os

    from graphmode.core.deployment import DeploymentConfig

    return DeploymentConfig.from_vllm_args(list(vllm_args), dict(os.environ), strict=False)


def deployment_note(card: ModelCard, folder: Path, vllm_args: Sequence[str] | None) -> str | None:
    """The warning an answer from ``card`` carries for the deployment of ``vllm_args`` (None: like a trained one)."""
    if vllm_args is None:
        return None
    from graphmode.selector.deployments import deployment_shape, deployment_warning, trained_configurations

    trained = trained_configurations(card, folder)
    target = deployment_shape(card.shapes[0] if len(card.shapes) == 1 else None, deployment_of_args(vllm_args),
                              trained)
    return deployment_warning(target, trained)


def choose_mode(
    *,
    workload: WorkloadDescription | None = None,
    features: ObservedFeatures | Mapping[str, Any] | None = None,
    objective: ObjectiveSpec = ObjectiveSpec(),
    default_metric: str = "itl_p50",
    selector_url: str | None = None,
    models_dir: Path | None = None,
    model_id: str | None = None,
    connect_timeout_s: float = 0.3,
    read_timeout_s: float = 0.7,
    loader: RecommenderLoader = _load_local,
    transport: httpx.BaseTransport | None = None,
    step_sizes: Mapping[str, Any] | None = None,
    vllm_args: Sequence[str] | None = None,
    target: Fingerprint | None = None,
    served_config: Mapping[str, Any] | None = None,
) -> Choice:
    """``step_sizes`` (a StepSizes dict) asks for capture sizes too; ``vllm_args`` keeps out modes vLLM would
    downgrade in that deployment (both through :func:`graphmode.selector.graphconfig.complete`); ``target``
    (:func:`graphmode.control.target.launch_target`) picks the local model and the shape it answers for;
    a remote service gets its release and ``served_config`` (the served model's config.json) instead."""
    t0 = time.perf_counter()
    notes: list[str] = []
    obj = objective.build(default_metric)  # a bad objective is the caller's error, not a fallback
    inputs: Any = workload if workload is not None else features
    basis: Basis = "workload" if workload is not None else "features" if features is not None else "static"

    def done(c: Choice) -> Choice:
        if vllm_args is not None:  # whatever answered, never a mode vLLM would downgrade in this deployment
            from graphmode.selector.compat import deployment_of, safe_mode

            runs, why = safe_mode(c.mode.value, deployment_of(vllm_args))
            if why:
                c.mode = parse_mode(runs)
                c.notes.append(why)
        if step_sizes is not None and c.mode.value != "NONE" and c.capture is None:
            c.capture = _capture_for(c.mode.value, step_sizes, vllm_args or [], c.notes)
        if step_sizes is None and workload is not None and c.capture is None and c.mode.value != "NONE" and models_dir:
            from graphmode.selector.graphconfig import described_capture_in  # capture sizes for the description
            c.capture = capture_keys(described_capture_in(models_dir, model_id, target, workload, c.mode.value,
                                                          vllm_args or [], served_config, c.notes))
        c.elapsed_ms = (time.perf_counter() - t0) * 1e3
        return c

    if selector_url and inputs is not None:
        body = service_body(objective.payload(default_metric), workload, features, model_id=model_id,
                            step_sizes=step_sizes, vllm_args=vllm_args, served_config=served_config, target=target)
        try:
            mode, data = remote_recommend(selector_url, body, connect_timeout_s=connect_timeout_s,
                                          read_timeout_s=read_timeout_s, transport=transport)
            notes += [w for w in data.get("warnings") or [] if isinstance(w, str) and "this deployment:" in w]
            notes += remote_cautions(data)  # outside the raced region, another GPU's verdicts, ...
            return done(Choice(mode, "remote", basis, f"selector service {selector_url} recommends "
                               f"{mode.value} for the {basis}", notes, model_id=data.get("model_id"),
                               capture=capture_keys(data.get("capture"))))
        except GraphmodeError as exc:
            notes.append(f"{exc}; falling back to the local model")
    elif selector_url:
        notes.append("the selector service is asked only for a workload or observed features; "
                     "the static choice comes from the local model")

    if models_dir is None:
        notes.append("no local models folder configured")
        return done(Choice(DEFAULT_MODE, "default", "default", f"vLLM's default {DEFAULT_MODE.value}", notes))
    try:
        if basis != "features" and loader is _load_local:
            hit = _from_json(models_dir, model_id, obj, workload, vllm_args, target)
            if hit is not None:
                hit.notes[:0] = notes
                return done(hit)
        rec = loader(models_dir, model_id, target)
        if inputs is None:
            if vllm_args is not None:
                rec = rec.for_deployment(deployment_of_args(vllm_args))
            note = rec.deployment_warning
            if note:
                notes.append(note)
            mode_name, how = best_static_mode(rec, obj)
            mode = parse_mode(mode_name)
            return done(Choice(mode, "local", "static", f"model {rec.model_id}: best static mode for "
                               f"{obj.describe()} ({how})", notes, model_id=rec.model_id))
        from graphmode.core.records import StepSizes
        from graphmode.selector.decide import Request, decide

        steps = StepSizes.model_validate(dict(step_sizes)) if step_sizes is not None else None
        deployment = deployment_of_args(vllm_args) if vllm_args is not None else None
        ans = decide(rec, Request(inputs=inputs, objective=obj, vllm_args=vllm_args, deployment=deployment,
                                  step_sizes=steps))
        notes.extend(ans.warnings)
        notes.extend(f.text for f in ans.cautions())  # outside the raced region, another GPU's, a downgrade
        return done(Choice(parse_mode(ans.mode), "local", basis,
                           f"model {rec.model_id} recommends {ans.mode} for the {basis} ({obj.describe()}, "
                           f"confidence {ans.confidence.level})", notes, model_id=rec.model_id,
                           capture=capture_keys(ans.capture)))
    except (GraphmodeError, OSError, ValueError) as exc:
        notes.append(f"local model unavailable: {exc}")
    return done(Choice(DEFAULT_MODE, "default", "default",
                       f"no selector answered: vLLM's default {DEFAULT_MODE.value}", notes))


def _from_json(models_dir: Path, model_id: str | None, obj: Objective,
               workload: WorkloadDescription | None, vllm_args: Sequence[str] | None = None,
               target: Fingerprint | None = None) -> Choice | None:
    """The static mode from the card, or a described workload's mode from the decision table; None when
    neither holds the answer and the full model must be loaded."""
    from graphmode.selector.card import ARTIFACT_FILE
    from graphmode.selector.registry import select_model
    from graphmode.selector.table import load_table, lookup

    entry, match = select_model(models_dir, model_id, target)
    if entry.card is None:
        return None
    if workload is not None and not _table_answers_for(entry.card, target, vllm_args):
        return None
    mid = entry.model_id
    note = deployment_note(entry.card, entry.folder, vllm_args)
    if workload is None:
        static = card_static_mode(entry.card, obj)
        if static is None:
            return None
        return Choice(parse_mode(static), "local", "static", f"model {mid}: best static mode for "
                      f"{obj.describe()} (model card, measured, cross-validation)", [note] if note else [],
                      model_id=mid)
    info = entry.card.artifacts.get(ARTIFACT_FILE)
    table = load_table(entry.folder, info.sha256) if info is not None else None
    ans = lookup(table, workload, obj.describe()) if table is not None else None
    if ans is None or table is None or not _verdicts_agree(entry.card, obj, workload, ans.mode):
        return None
    at = ", ".join(f"{k} {v:g}" for k, v in ans.point.items())
    return Choice(parse_mode(ans.mode), "local", "workload",
                  f"model {mid} recommends {ans.mode} for the workload ({obj.describe()}; decision table, "
                  f"nearest grid point {at})",
                  list(dict.fromkeys([*match.warnings, *table["warnings"], *([note] if note else [])])),
                  model_id=mid)


def _verdicts_agree(card: ModelCard, obj: Objective, workload: WorkloadDescription, mode: str) -> bool:
    """Whether the race verdicts, asked as the decision path asks them, give the table's *mode* for this
    workload: a table written before the evidence region (or any other rule) changed is only a cache of the
    answer, so where the verdicts answer otherwise (outside every raced region, a pooled verdict the nearest
    workload contradicts) the full model decides."""
    from graphmode.selector.featurize import shape_key
    from graphmode.selector.verdicts import race_decision

    if not card.race or not card.shapes:
        return True
    feats = {"arrival_rate": workload.rate, "mean_input_tokens": workload.input_tokens,
             "mean_output_tokens": workload.output_tokens}
    race = race_decision(card.race, shape_key(card.shapes[0]), obj.metric, feats, [mode], {}, weighted=False,
                         default_mode=card.default_mode)
    return race is None or (race.basis != "outside" and race.mode == mode)


def _table_answers_for(card: ModelCard, target: Fingerprint | None, vllm_args: Sequence[str] | None) -> bool:
    """Whether the decision table speaks for this deployment: it was built for the card's first shape under
    vLLM's default configuration (the recommender's answer without a target), so another target shape or a
    configuration apart from the defaults (a backend asked for, speculative decoding, FP8, TP...) needs the
    full model."""
    from graphmode.core.deployment import config_suffix
    from graphmode.selector.featurize import shape_key

    if not card.shapes:
        return False
    first = card.shapes[0]
    if target is not None and (target.model_config_hash or target.num_params_b or target.model_architecture):
        # the model's identity alone (no configuration fields, so no configuration suffix on either side)
        fields = [k for k in first if k in type(target).model_fields]
        if shape_key({k: getattr(target, k) for k in fields}) != shape_key({k: first.get(k) for k in fields}):
            return False
    mine = config_suffix(deployment_of_args(vllm_args).shape_fields()) if vllm_args else ""
    return mine == config_suffix(first)


def _capture_for(mode: str, step_sizes: Mapping[str, Any], vllm_args: Sequence[str],
                 notes: list[str]) -> dict[str, Any] | None:
    """Capture-size keys for ``mode`` when no selector gave them (static or default choice)."""
    from pydantic import ValidationError

    from graphmode.core.records import StepSizes
    from graphmode.selector.capture import choose_capture_sizes
    from graphmode.selector.graphconfig import int_flag

    try:
        steps = StepSizes.model_validate(dict(step_sizes))
    except ValidationError as exc:
        notes.append(f"saved step sizes unusable ({exc.errors()[0]['msg']}): vLLM's default capture sizes")
        return None
    servers = int_flag(vllm_args, "--api-server-count", "-asc", "--api_server_count")
    ans = choose_capture_sizes(steps.per_engine_step(servers), mode=mode,
                               max_num_seqs=int_flag(vllm_args, "--max-num-seqs") or 256,
                               max_num_batched_tokens=int_flag(vllm_args, "--max-num-batched-tokens"))
    notes.extend(ans.notes)
    return capture_keys(ans) if ans.sizes != ans.default_sizes else None


@dataclass(frozen=True)
class LaunchPlan:
    args: list[str]
    mode: CudaGraphMode
    applied: bool  # False when the user's own cudagraph_mode was kept
    message: str


def user_choice(args: Sequence[str]) -> CudaGraphMode | None:
    """The user's cudagraph_mode, if any (raises ConfigError on a malformed compilation config)."""
    return user_mode(list(args))


def merge_mode(args: Sequence[str], mode: CudaGraphMode, *, force: bool) -> LaunchPlan:
    """``args`` with ``cudagraph_mode`` set, every other compilation-config key kept; a user mode wins."""
    args = list(args)
    mine = user_mode(args)
    if mine is not None and not force:
        why = (f"graphmode would pick {mode.value}; --force overrides" if mode != mine
               else "--force lets graphmode choose")
        return LaunchPlan(args, mine, False, f"keeping the user's cudagraph_mode {mine.value} ({why})")
    kept = {k: v for k, v in compilation_config_of(args).items() if k != "cudagraph_mode"}
    extra = f", other compilation-config keys kept: {', '.join(sorted(kept))}" if kept else ""
    over = f" (overriding the user's {mine.value})" if mine is not None and mine != mode else ""
    return LaunchPlan(with_mode(args, mode), mode, True, f"cudagraph_mode {mode.value}{over}{extra}")


def merge_graph_config(args: Sequence[str], mode: CudaGraphMode, capture: Mapping[str, Any] | None, *,
                       force: bool) -> LaunchPlan:
    """:func:`merge_mode`, plus ``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size`` from a capture
    answer (its :meth:`~graphmode.selector.capture.CaptureAnswer.compilation_config`). The user's own sizes
    win as the user's mode does, unless ``force``; every other key is kept."""
    plan = merge_mode(args, mode, force=force)
    if not capture or plan.mode.value == "NONE":
        return plan
    mine = user_capture_sizes(list(args))
    if mine is not None and not force:
        return LaunchPlan(plan.args, plan.mode, plan.applied,
                          f"{plan.message}; keeping the user's cudagraph_capture_sizes ({len(mine)} sizes)")
    keys = {k: capture[k] for k in ("cudagraph_capture_sizes", "max_cudagraph_capture_size") if k in capture}
    sizes = keys.get("cudagraph_capture_sizes")
    n = len(sizes) if isinstance(sizes, list) else "?"
    over = " (overriding the user's)" if mine is not None else ""
    return LaunchPlan(with_compilation_config(plan.args, keys), plan.mode, True,
                      f"{plan.message}; cudagraph_capture_sizes: {n} sizes{over}")
