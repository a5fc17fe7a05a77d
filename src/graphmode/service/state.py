"""What the service holds between requests: the loaded models (one immutable snapshot, swapped whole on
reload), the background jobs and the metrics.

Models are loaded at start-up (the app's lifespan) and by ``POST /v1/reload`` or a finished retrain job;
never per request. A reload builds a complete new :class:`LoadedModels` off to the side and then replaces
the reference in one assignment, so a request sees either the old set or the new one, never a mix; a
failed reload leaves the old set in place. With ``serve --workers N`` a requested reload writes the models
dir's reload stamp, and every worker's poller (:meth:`ServiceState.poll_once`) reloads when the stamp
changed (``reload_stamp``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphmode.core.errors import GraphmodeError, ModelError
from graphmode.core.records import Fingerprint
from graphmode.core.settings import Settings
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.objective import Objective
from graphmode.selector.recommend import Recommender
from graphmode.selector.registry import list_models
from graphmode.service.jobs import JobRegistry
from graphmode.service.metrics import ServiceMetrics
from graphmode.service.reload_stamp import NO_STAMP, read_stamp, write_stamp

if TYPE_CHECKING:
    from graphmode.service.schemas import ObjectiveIn

log = logging.getLogger("graphmode.service")
OBJECTIVE_CACHE_SIZE = 256


@dataclass(frozen=True)
class LoadedModels:
    """Every model of the registry that could be loaded, and which one answers by default."""

    models_dir: Path
    default: Recommender | None
    by_id: dict[str, Recommender]
    broken: dict[str, str]  # model id -> why it could not be loaded
    loaded_at: float | None
    load_error: str | None = None

    @classmethod
    def empty(cls, models_dir: Path, error: str | None = None) -> LoadedModels:
        return cls(models_dir, None, {}, {}, None, error)


def load_models(models_dir: Path, model_id: str | None, target: Fingerprint | None) -> LoadedModels:
    """Load the default model (``model_id`` or the registry's best match for ``target``) and every other
    readable model under ``models_dir``.

    Raises :class:`ModelError` when ``model_id`` is given and cannot be loaded; with no ``model_id`` and no
    usable model, returns an empty set that says why.
    """
    try:
        default = Recommender.load(models_dir, model_id, target=target)
    except ModelError as exc:
        if model_id:
            raise
        return LoadedModels.empty(models_dir, str(exc))
    _warm_up(default)
    by_id = {default.model_id: default}
    broken: dict[str, str] = {}
    for entry in list_models(models_dir):
        if entry.model_id in by_id:
            continue
        if entry.card is None:
            broken[entry.model_id] = entry.error or "unreadable card"
            continue
        try:
            rec = Recommender.from_dir(entry.folder, target=target)
            _warm_up(rec)
            by_id[entry.model_id] = rec
        except GraphmodeError as exc:
            broken[entry.model_id] = str(exc)
            log.warning("model %s not loaded: %s", entry.model_id, exc)
    return LoadedModels(models_dir, default, by_id, broken, time.time())


def _freeze_heap() -> None:
    """Move everything alive now (modules, the models) out of the cyclic GC's reach: a full collection
    then scans only what requests allocate, instead of every estimator node, and cannot stall a request
    for tens of milliseconds. The previous models, now unreachable, are collected first."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _warm_up(rec: Recommender) -> None:
    """One answer at load time, so the first request does not pay numpy's and pydantic's first-call costs."""
    try:
        rec.recommend(WorkloadDescription(rate=1.0, input_tokens=256, output_tokens=128)).model_dump_json()
    except GraphmodeError as exc:
        log.warning("model %s: warm-up answer failed: %s", rec.model_id, exc)


@dataclass
class ServiceState:
    """Everything a request handler may need; lives in ``app.state.service``."""

    settings: Settings
    models_dir: Path
    model_id: str | None
    metrics: ServiceMetrics
    jobs: JobRegistry
    target: Fingerprint | None = None
    retrain_fn: Callable[..., Any] | None = None
    started_at: float = field(default_factory=time.time)
    reload_poller: asyncio.Task[None] | None = field(default=None, init=False, repr=False)  # set by the lifespan
    models: LoadedModels = field(init=False)
    _reload_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _objectives: dict[tuple[Any, ...], Objective] = field(default_factory=dict, init=False, repr=False)
    # The reload stamp this worker last acted on (or wrote); guarded by _stamp_lock, since the poller's
    # thread and a reload request's thread both move it.
    _seen_stamp: str = field(default=NO_STAMP, init=False, repr=False)
    _stamp_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stamp_error: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.models = LoadedModels.empty(self.models_dir, "not loaded yet")

    def reload(self) -> tuple[str | None, LoadedModels]:
        """Load the registry afresh and swap it in; returns (the previous default model's id, the new set).
        Raises :class:`GraphmodeError` and keeps the old set when an explicitly configured model cannot be
        loaded."""
        with self._reload_lock:
            previous = self.models.default.model_id if self.models.default is not None else None
            try:
                new = load_models(self.models_dir, self.model_id, self.target)
            except GraphmodeError:
                self.metrics.reloads.labels(result="error").inc()
                raise
            self.models = new  # the swap: one reference assignment
            self.metrics.reloads.labels(result="ok").inc()
            self.metrics.set_models(new)
            _freeze_heap()
            if new.default is not None:
                log.info(
                    "models loaded from %s: default %s, %d loaded, %d broken",
                    self.models_dir,
                    new.default.model_id,
                    len(new.by_id),
                    len(new.broken),
                )
            else:
                log.warning("no model loaded from %s: %s", self.models_dir, new.load_error)
            return previous, new

    def reload_all(self) -> tuple[str | None, LoadedModels]:
        """:meth:`reload`, then a new reload stamp so that the other workers reload too. The stamp is
        written only after a successful reload; when it cannot be written this worker still has its new
        models (``write_stamp`` logs why the others do not)."""
        result = self.reload()
        with self._stamp_lock:
            stamp = write_stamp(self.models_dir)
            if stamp is not None:
                self._seen_stamp = stamp  # our own stamp: the poller must not reload a second time
        return result

    def mark_stamp_seen(self) -> None:
        """Take the current stamp as seen; called at start-up, before the first load, so that a stamp
        written while the models load is still acted on."""
        stamp = self._read_stamp()
        with self._stamp_lock:
            self._seen_stamp = stamp if stamp is not None else NO_STAMP

    def poll_once(self) -> bool:
        """One poll: reload when the stamp differs from the last one seen; True when a reload ran. Blocking
        (a small file read, maybe a reload): called from a worker thread. A failed reload keeps the old
        models and is logged; the stamp still counts as seen, so a broken registry is not reloaded every
        poll (the next reload request writes a new stamp)."""
        # Read under the lock: a read from before this worker's own reload_all wrote its stamp, compared after
        # it, would look new and reload twice (CI, 2026-12-02).
        with self._stamp_lock:
            stamp = self._read_stamp()
            if stamp is None or stamp == self._seen_stamp:
                return False
            self._seen_stamp = stamp  # before loading: a stamp written meanwhile triggers the next poll
        log.info("reload stamp changed: another worker reloaded, reloading here too")
        try:
            self.reload()
        except GraphmodeError as exc:
            log.error("reload after another worker's reload failed, the previous models stay: %s", exc)
        return True

    def _read_stamp(self) -> str | None:
        try:
            stamp = read_stamp(self.models_dir)
        except OSError as exc:
            if str(exc) != self._stamp_error:  # once per distinct error, not every poll
                log.warning("reload stamp unreadable, reloads of other workers are missed: %s", exc)
            self._stamp_error = str(exc)
            return None
        self._stamp_error = None
        return stamp

    def objective(self, spec: ObjectiveIn, rec: Recommender) -> Objective | None:
        """The objective a request asks for (None: the model's default); built objectives are cached."""
        if spec.is_default():
            return None
        key = (rec.default_objective.metric, *spec.cache_key())
        obj = self._objectives.get(key)
        if obj is None:
            obj = spec.build(rec.default_objective.metric)
            if len(self._objectives) >= OBJECTIVE_CACHE_SIZE:
                self._objectives.clear()
            self._objectives[key] = obj
        return obj
