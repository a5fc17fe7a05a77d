"""``POST /v1/retrain`` (start a background profile + train job) and ``/v1/jobs`` (status, cancel).
All need the bearer token: a job runs the vLLM command it was given."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Response

from graphmode.service.deps import StateDep, TokenDep
from graphmode.service.jobs import JobBusy
from graphmode.service.retrain import RequestFieldError, make_work, plan
from graphmode.service.schemas import JobList, JobStatus, RetrainRequest

router = APIRouter(prefix="/v1", tags=["jobs"], dependencies=[TokenDep])
JobIdPath = Annotated[str, Path(max_length=64, pattern=r"^[0-9a-f]+$")]
_AUTH: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or wrong bearer token"},
    403: {"description": "no service token configured: endpoint disabled"},
}


@router.post(
    "/retrain",
    status_code=202,
    response_model=JobStatus,
    responses={**_AUTH, 409: {"description": "a job is already running"}, 422: {"description": "bad body"}},
)
async def start_retrain(body: RetrainRequest, state: StateDep, response: Response) -> JobStatus:
    """Start profiling (resuming) + training in the background; poll ``GET /v1/jobs/{id}``. When it
    succeeds the service reloads its models (unless ``reload`` is false). One job at a time."""
    try:
        config = plan(body, state.settings, state.models_dir)
    except RequestFieldError as exc:
        raise HTTPException(
            status_code=422,
            detail=[{"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}],
        ) from None
    running = state.jobs.running()
    if running is not None:
        raise HTTPException(status_code=409, detail=f"job {running.id} is {running.status}: one job at a time")
    try:
        job = state.jobs.submit(
            "retrain",
            body.model_dump(mode="json", exclude_unset=True),
            make_work(config, body, state),
            planned=config.planned_cells,
        )
    except JobBusy as exc:
        raise HTTPException(status_code=409, detail=f"{exc}: one job at a time") from None
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job.snapshot()


@router.get("/jobs", response_model=JobList, responses=_AUTH)
async def list_jobs(state: StateDep) -> JobList:
    """Recent jobs, newest first."""
    return JobList(jobs=[j.snapshot() for j in state.jobs.list()])


@router.get("/jobs/{job_id}", response_model=JobStatus, responses={**_AUTH, 404: {"description": "no such job"}})
async def get_job(job_id: JobIdPath, state: StateDep) -> JobStatus:
    """Status (queued, running, succeeded, failed, cancelled), progress, result or error."""
    job = state.jobs.get(job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return job.snapshot()


@router.delete("/jobs/{job_id}", response_model=JobStatus, responses={**_AUTH, 404: {"description": "no such job"}})
async def cancel_job(job_id: JobIdPath, state: StateDep) -> JobStatus:
    """Stop a job: its vLLM is stopped now (terminate, then kill its process group after a few seconds),
    even during start-up, and the job ends ``cancelled`` right after. Returns at once."""
    job = state.jobs.cancel(job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return job.snapshot()
