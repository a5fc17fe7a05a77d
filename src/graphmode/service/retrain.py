"""``POST /v1/retrain``: turn a request into a :class:`ProfileConfig` (validated before the job is
accepted) and a job that runs ``graphmode.selector.retrain`` (profile, resuming, then train), reports
progress, and reloads the service's models when it succeeds.

A request's grid is inline (``grid``), or a file of the registry's grids folder (``grid_path``, a name
under ``<models_dir>/grids/``), or the settings' default grid: never any other file of the host, and a
grid file's problems are reported without quoting it (issue 12: ``grid_path=/etc/shadow`` answered a 422
that quoted the file)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphmode.core.errors import ConfigError, DatasetError, EngineError, GraphmodeError
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import CellRecord, StartupInfo
from graphmode.core.settings import Settings
from graphmode.profiling.grid import Workload, load_grid
from graphmode.profiling.runner import ProfileConfig
from graphmode.service.jobs import JobContext, Work
from graphmode.service.schemas import JobResult, ProfileOutcome, RetrainRequest
from graphmode.vllm_args import model_arg

if TYPE_CHECKING:
    from graphmode.selector.retrain import RetrainResult
    from graphmode.service.state import ServiceState

RetrainFn = Callable[..., "RetrainResult"]


class RequestFieldError(ConfigError):
    """A request that validates as JSON but cannot be carried out; names the field (HTTP 422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


GRIDS_DIR = "grids"
GRID_SUFFIXES = (".yaml", ".yml", ".toml")


def grid_file(name: str, models_dir: Path) -> Path:
    """The grid file ``name`` of the registry's grids folder (a name, or a path inside that folder);
    :class:`RequestFieldError` for anything else."""
    folder = (models_dir / GRIDS_DIR).resolve()
    path = (folder / name).resolve()  # an absolute name replaces the folder: checked just below
    if not path.is_relative_to(folder) or path.suffix not in GRID_SUFFIXES:
        raise RequestFieldError(
            "grid_path",
            f"grid_path must name a {'/'.join(GRID_SUFFIXES)} grid file in the registry's grids folder "
            f"(<models_dir>/{GRIDS_DIR}/NAME); send any other grid inline, as grid",
        )
    if not path.is_file():
        raise RequestFieldError("grid_path", f"no grid file {path.name!r} in the registry's grids folder")
    return path


def plan(req: RetrainRequest, settings: Settings, models_dir: Path | None = None) -> ProfileConfig:
    """The profile to run; :class:`RequestFieldError` names what is wrong. ``models_dir`` (default:
    the settings') holds the grids folder ``grid_path`` names a file of."""
    command = req.command(settings.vllm.argv())
    if not command:
        raise RequestFieldError("vllm_command", "the vLLM command is empty")
    if model_arg(command, req.vllm_args) is None:
        raise RequestFieldError("vllm_args", 'no model in the vLLM args: give e.g. ["--model", "/path/to/model"]')
    if req.grid is not None:
        grid = req.grid
    elif req.grid_path is not None:
        path = grid_file(req.grid_path, Path(models_dir or settings.selector.models_dir))
        try:
            grid = load_grid(path)
        except GraphmodeError:
            # The loader's message quotes the file (a YAML error shows the line): say which file only.
            raise RequestFieldError(
                "grid_path", f"grid file {path.name!r} is not a valid grid (its contents are not quoted here)"
            ) from None
    else:
        try:
            grid = load_grid(settings.profile.grid)
        except GraphmodeError:
            raise RequestFieldError("grid_path", "the service's default grid (settings.profile.grid) is "
                                    "not a valid grid; send a grid inline") from None
    try:
        workloads = grid.select(list(req.workloads or []))
    except GraphmodeError as exc:
        raise RequestFieldError("workloads", str(exc)) from None
    return ProfileConfig.from_settings(
        settings, command=command, vllm_args=list(req.vllm_args),
        modes=list(dict.fromkeys(req.modes or list(CudaGraphMode))), workloads=workloads,
        port=req.port, resume=req.resume, repeats=req.repeats,
    )  # the dataset: retrain() puts it under models_dir/_profiles/<key>.sqlite


class JobReporter:
    """The profiler's :class:`~graphmode.profiling.runner.Reporter`, feeding the job's progress; it is
    also where a cancel takes effect (before a mode's server starts, before each cell)."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.ok = 0
        self.failures: Counter[str] = Counter()  # first line of each failed cell's reason

    def mode_starting(self, mode: CudaGraphMode, pending: int) -> None:
        self.ctx.check_cancelled()
        self.ctx.current(f"{mode.value}: starting vLLM ({pending} cells)")
        self.ctx.note(f"{mode.value}: starting vLLM for {pending} cells")

    def mode_started(self, mode: CudaGraphMode, startup: StartupInfo) -> None:
        took = f" in {startup.startup_s:.0f} s" if startup.startup_s else ""
        self.ctx.note(f"{mode.value}: vLLM started{took}")

    def cell_starting(self, mode: CudaGraphMode, workload: Workload, repeat: int) -> None:
        self.ctx.check_cancelled()
        self.ctx.current(f"{mode.value} · {workload.name} #{repeat}")

    def cell_finished(self, record: CellRecord) -> None:
        self.ctx.cell_done(record.status == "ok")
        if record.status == "ok":
            self.ok += 1
        else:
            first = (record.reason or "").splitlines()[0] if record.reason else ""
            self.failures[first or "no reason recorded"] += 1
            self.ctx.note(f"FAILED {record.mode}/{record.workload}#{record.repeat}: {first}")

    def all_failed(self) -> str | None:
        """When this run profiled cells and every one failed: why, most frequent reasons first; else None."""
        n = sum(self.failures.values())
        if self.ok or not n:
            return None
        reasons = "; ".join(f"{why} ({k} cells)" if len(self.failures) > 1 else why
                            for why, k in self.failures.most_common(3))
        more = f"; and {len(self.failures) - 3} other reasons" if len(self.failures) > 3 else ""
        return f"every profiled cell failed ({n} of {n}), so there is nothing to train on: {reasons}{more}"


def default_retrain(config: ProfileConfig, **kwargs: Any) -> RetrainResult:
    # Looked up at call time, so tests (and embedders) can replace graphmode.selector.retrain.
    import graphmode.selector as selector

    result: RetrainResult = selector.retrain(config, **kwargs)
    return result


def make_work(config: ProfileConfig, req: RetrainRequest, state: ServiceState) -> Work:
    settings = state.settings
    objective = (
        req.objective.build(settings.selector.objective)
        if req.objective is not None and not req.objective.is_default()
        else None
    )
    retrain_fn: RetrainFn = state.retrain_fn or default_retrain

    def work(ctx: JobContext) -> JobResult:
        n_modes, n_workloads = len(config.modes), len(config.workloads)
        ctx.phase("profiling", f"profiling {n_modes} modes × {n_workloads} workloads")

        def progress(message: str) -> None:
            ctx.check_cancelled()
            ctx.phase("training", message)

        reporter = JobReporter(ctx)
        try:
            result = retrain_fn(
                config,
                models_dir=state.models_dir,
                resume=req.resume,
                objective=objective,
                regressor=req.regressor,
                reporter=reporter,
                progress=progress,
            )
        except DatasetError as exc:
            # "no usable ok rows" says less than the cells did (every one "cannot run 'vllm'", say)
            why = reporter.all_failed()
            if why is None:
                raise
            raise EngineError(why) from exc
        summary = result.profile
        cv = result.train.card.cv.summaries
        out = JobResult(
            model_id=result.train.model_id,
            model_dir=str(result.train.out_dir),
            dataset=str(result.dataset),
            profile=ProfileOutcome(
                run_id=summary.run_id,
                profile_key=summary.profile_key,
                ok=summary.ok,
                failed=summary.failed,
                skipped=summary.skipped,
                engine_starts=summary.engine_starts,
                wall_s=summary.wall_s,
                failures=[f.splitlines()[0] for f in summary.failures[:20]],
            ),
            cv_mean_regret_pct=cv[0].mean_regret_pct if cv else None,
        )
        if req.reload:
            ctx.phase("reloading", "reloading the service's models")
            try:
                state.reload_all()
                out.reloaded = True
            except GraphmodeError as exc:
                out.reload_error = str(exc)
                ctx.note(f"reload failed: {exc}")
        ctx.note(f"trained {out.model_id}")
        return out

    return work
