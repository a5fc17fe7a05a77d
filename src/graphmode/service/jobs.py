"""Background jobs: one at a time, in a worker thread, with status and progress kept in memory.

A job is a function ``work(ctx) -> JobResult`` run by a one-thread executor. ``submit`` refuses a second
job while one is queued or running (:class:`JobBusy`, HTTP 409). When the registry has a ``lock_path``
it also takes an exclusive ``flock`` on it for the job's lifetime, so that two service processes (``graphmode
serve --workers N``, or two services on one models dir) never profile at once either.

Cancelling stops the job's vLLM at once: the registry terminates the process group of every engine the
job's thread started (terminate, wait :data:`CANCEL_STOP_S`, kill), and keeps doing so until the job ends,
so an engine still starting up (a hung vLLM could wait out a 900 s start-up timeout) or one started just
after the cancel goes too; the job then raises :class:`JobCancelled` at its next checkpoint
(:meth:`JobContext.check_cancelled`, before each mode and each cell). Shutting the registry down does the
same and waits for the job to end (bounded), so the service never exits with its engine running.
The last ``keep`` finished jobs are remembered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from graphmode.core.errors import GraphmodeError
from graphmode.service.metrics import ServiceMetrics
from graphmode.service.schemas import JobPhase, JobProgress, JobResult, JobState, JobStatus

log = logging.getLogger("graphmode.service.jobs")
MAX_MESSAGES = 20
CANCEL_STOP_S = 3.0  # grace between SIGTERM and SIGKILL for a cancelled job's engine
SHUTDOWN_WAIT_S = 20.0  # how long shutdown waits for the cancelled job to end


class JobBusy(Exception):
    def __init__(self, running: str | None, message: str) -> None:
        super().__init__(message)
        self.running = running


class JobCancelled(GraphmodeError):
    pass


class Job:
    def __init__(self, kind: str, request: dict[str, Any], planned: int | None) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.kind = kind
        self.request = request
        self.created_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.status: JobState = "queued"
        self.progress = JobProgress(cells_planned=planned)
        self.result: JobResult | None = None
        self.error: str | None = None
        self.cancel = threading.Event()
        self.lock = threading.Lock()
        self.thread_id: int | None = None  # the worker thread running it: its engines are the job's
        self.finished = threading.Event()

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")

    def snapshot(self) -> JobStatus:
        with self.lock:
            return JobStatus(
                id=self.id,
                kind=self.kind,
                status=self.status,
                created_at=self.created_at,
                started_at=self.started_at,
                finished_at=self.finished_at,
                cancel_requested=self.cancel.is_set(),
                progress=self.progress.model_copy(deep=True),
                result=self.result,
                error=self.error,
                request=self.request,
            )


class JobContext:
    """What a job's work function uses to report progress and to notice a cancel."""

    def __init__(self, job: Job) -> None:
        self._job = job

    @property
    def job_id(self) -> str:
        return self._job.id

    def phase(self, phase: JobPhase, current: str | None = None) -> None:
        with self._job.lock:
            self._job.progress.phase = phase
            self._job.progress.current = current
        if current:
            self.note(current)

    def current(self, text: str) -> None:
        with self._job.lock:
            self._job.progress.current = text

    def note(self, message: str) -> None:
        with self._job.lock:
            msgs = self._job.progress.messages
            msgs.append(message)
            del msgs[:-MAX_MESSAGES]

    def cell_done(self, ok: bool) -> None:
        with self._job.lock:
            self._job.progress.cells_done += 1
            self._job.progress.cells_failed += 0 if ok else 1

    def check_cancelled(self) -> None:
        if self._job.cancel.is_set():
            raise JobCancelled(f"job {self._job.id} cancelled")


Work = Callable[[JobContext], JobResult]


class JobRegistry:
    def __init__(self, *, lock_path: Path | None = None, metrics: ServiceMetrics | None = None, keep: int = 50) -> None:
        self.lock_path = lock_path
        self.metrics = metrics
        self.keep = keep
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._current: Job | None = None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ queries
    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def list(self) -> list[Job]:
        with self._lock:
            return list(reversed(self._jobs.values()))

    def running(self) -> Job | None:
        with self._lock:
            job = self._current
            return job if job is not None and not job.done else None

    # ------------------------------------------------------------------ control
    def submit(self, kind: str, request: dict[str, Any], work: Work, *, planned: int | None = None) -> Job:
        """Queue ``work``; :class:`JobBusy` when a job is already queued or running (here or elsewhere)."""
        with self._lock:
            if self._current is not None and not self._current.done:
                raise JobBusy(self._current.id, f"job {self._current.id} is {self._current.status}")
            lock_file = self._acquire_file_lock()
            job = Job(kind, request, planned)
            self._current = job
            self._jobs[job.id] = job
            while len(self._jobs) > self.keep:
                oldest = next(iter(self._jobs))
                if self._jobs[oldest] is job:
                    break
                del self._jobs[oldest]
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graphmode-job")
            self._executor.submit(self._run, job, work, lock_file)
        return job

    def cancel(self, job_id: str) -> Job | None:
        """Ask ``job_id`` to stop and stop its engine now (in the background: this returns at once)."""
        job = self.get(job_id)
        if job is not None and not job.done and not job.cancel.is_set():
            job.cancel.set()
            threading.Thread(target=self._reap, args=(job,), name=f"graphmode-cancel-{job.id}", daemon=True).start()
        return job

    def shutdown(self, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """Cancel the running job, stop its engine (terminate, wait, kill its process group) and wait up to
        ``wait_s`` for the job to end: the process may exit right after this returns."""
        job = self.running()
        if job is not None:
            log.warning("shutting down with job %s %s: cancelling it and stopping its vLLM", job.id, job.status)
            job.cancel.set()
            self._reap(job, wait_s)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=False)

    @staticmethod
    def _reap(job: Job, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """Stop the engines ``job``'s thread starts until the job ends (or ``wait_s`` passes)."""
        from graphmode.profiling.engine import stop_servers_of

        deadline = time.monotonic() + wait_s
        while not job.finished.is_set():
            if job.thread_id is not None:
                stopped = stop_servers_of(job.thread_id, timeout_s=CANCEL_STOP_S)
                if stopped:
                    log.info("job %s cancelled: stopped %d vLLM process group(s)", job.id, stopped)
            if time.monotonic() > deadline:
                log.error("job %s still running %.0f s after its cancel", job.id, wait_s)
                return
            job.finished.wait(0.1)

    # ------------------------------------------------------------------ internals
    def _acquire_file_lock(self) -> IO[str] | None:
        if self.lock_path is None:
            return None
        try:
            import fcntl
        except ImportError:  # not POSIX: the in-process lock is all there is
            return None
        try:
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.lock_path, "a+", encoding="utf-8")  # noqa: SIM115 (held for the job's life)
        except OSError as exc:
            log.warning("job lock %s unavailable (%s): only this process is guarded", self.lock_path, exc)
            return None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise JobBusy(None, f"another graphmode process holds {self.lock_path}: a job runs there") from None
        with contextlib.suppress(OSError):
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
        return fh

    def _run(self, job: Job, work: Work, lock_file: IO[str] | None) -> None:
        ctx = JobContext(job)
        with job.lock:
            job.status = "running"
            job.started_at = time.time()
            job.thread_id = threading.get_ident()
        if self.metrics is not None:
            self.metrics.job_running.set(1)
        status: JobState = "failed"
        try:
            ctx.check_cancelled()
            result = work(ctx)
            with job.lock:
                job.result = result
            status = "succeeded"
        except JobCancelled as exc:
            status = "cancelled"
            with job.lock:
                job.error = str(exc)
        except GraphmodeError as exc:
            # After a cancel, stopping the engine makes the work fail however it was busy: that is the cancel.
            status = "cancelled" if job.cancel.is_set() else "failed"
            with job.lock:
                job.error = f"job {job.id} cancelled ({exc})" if status == "cancelled" else str(exc)
        except Exception as exc:  # a bug or an unexpected failure: keep the service up, report it
            log.exception("job %s failed", job.id)
            with job.lock:
                job.error = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc(limit=8))
        finally:
            # Release the cross-process lock and count the job before it shows as done, so whoever sees
            # it done can start the next one and finds the metrics already updated.
            if lock_file is not None:
                with contextlib.suppress(OSError):
                    lock_file.close()  # releases the flock
            if self.metrics is not None:
                self.metrics.job_running.set(0)
                self.metrics.jobs.labels(kind=job.kind, status=status).inc()
            with job.lock:
                job.status = status
                job.finished_at = time.time()
                job.progress.phase = "done"
            job.finished.set()
            log.info("job %s %s", job.id, status)
