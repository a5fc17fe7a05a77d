"""Start, watch and stop one external vLLM server process.

vLLM runs in its own environment, started from a configurable command prefix (``vllm serve`` or
``/venv/bin/python -m vllm.entrypoints.openai.api_server``). The launcher owns the process group, so
stopping it (terminate → wait → kill) also ends vLLM's engine-core child processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import httpx

from graphmode.core.errors import EngineDiedError, EngineStartError
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import StartupInfo
from graphmode.profiling.logparse import parse_startup_log
from graphmode.vllm_args import get_flag, has_flag, model_arg, with_mode, without_flags


def describe_exit(returncode: int | None) -> str:
    """Human words for a Popen return code (negative = killed by that signal)."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    if returncode > 128:
        try:
            return f"exited {returncode} (likely {signal.Signals(returncode - 128).name})"
        except ValueError:
            pass
    return f"exited with status {returncode}"


_ROOT_CAUSE = re.compile(r"\b[A-Z]\w*(Error|Exception)\b: |\bout of memory\b|unrecognized arguments", re.I)


def tail_lines(path: Path, n: int = 40, max_bytes: int = 256 * 1024, offset: int = 0) -> str:
    """The last *n* lines, preceded by the exception messages found earlier in the log.

    vLLM's engine core prints the root cause (e.g. ``ValueError: ... memory``) and the API server then
    prints a long traceback of its own, so the last lines alone often miss why it died.
    """
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(offset, size - max_bytes))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [ln.split("\r")[-1] for ln in data.splitlines()]
    last = lines[-n:]
    causes = [ln for ln in lines[:-n] if _ROOT_CAUSE.search(ln)]
    causes = list(dict.fromkeys(causes))[:5]  # the first exception printed is the root cause
    head = ["... root cause lines from earlier in the log:", *causes, "... last lines:"] if causes else []
    return "\n".join(head + last)


# Servers whose process runs, by the thread that started them: whoever runs profiling in a worker thread
# (the service's jobs) can stop that thread's engine from another thread, at once, even while start()
# is still waiting for /health (see stop_servers_of).
_LIVE: dict[int, set[VllmServer]] = {}
_LIVE_LOCK = threading.Lock()


def stop_servers_of(thread_id: int, timeout_s: float = 5.0) -> int:
    """Stop every server started by thread ``thread_id`` (terminate its process group, wait up to
    ``timeout_s``, kill the group); returns how many were running. Safe against the owner stopping
    them at the same time."""
    with _LIVE_LOCK:
        servers = list(_LIVE.get(thread_id, ()))
    for server in servers:
        server.stop(timeout_s=timeout_s)
    return len(servers)


class VllmServer:
    """One vLLM server: ``start()`` blocks until /health answers, ``stop()`` always cleans up."""

    def __init__(self, command: list[str], args: list[str], *, mode: CudaGraphMode | None,
                 host: str = "127.0.0.1", port: int = 8000, log_path: Path,
                 startup_timeout_s: float = 900.0, stop_timeout_s: float = 30.0,
                 env: dict[str, str] | None = None) -> None:
        self.command = command
        self.mode = mode
        self.host = host
        self.port = port
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.env = env
        self.args = self._final_args(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self._log_file: IO[bytes] | None = None
        self._log_offset = 0
        self._owner = -1

    def _final_args(self, args: list[str]) -> list[str]:
        out = with_mode(args, self.mode) if self.mode is not None else list(args)
        # The launcher owns the address so it can poll it; a user's --host/--port is replaced.
        out = without_flags(out, "--host", "--port")
        out += ["--host", self.host, "--port", str(self.port)]
        return out

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def model(self) -> str | None:
        return model_arg(self.command, self.args)

    def served_model_name(self) -> str | None:
        if has_flag(self.args, "--served-model-name"):
            return get_flag(self.args, "--served-model-name")
        return self.model

    def start(self) -> StartupInfo:
        """Spawn and wait for /health; on failure the process is stopped and EngineStartError raised."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("ab")
        self._log_offset = self._log_file.tell()
        header = f"\n===== graphmode: {' '.join(self.argv)}\n".encode()
        self._log_file.write(header)
        self._log_file.flush()
        self._log_offset += len(header)
        env = {**os.environ, **(self.env or {})}
        env.setdefault("PYTHONUNBUFFERED", "1")
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        except OSError as exc:
            self._close_log()
            raise EngineStartError(f"cannot run {self.command[0]!r}: {exc.strerror or exc}") from exc
        self._owner = threading.get_ident()
        with _LIVE_LOCK:
            _LIVE.setdefault(self._owner, set()).add(self)
        try:
            self._wait_healthy(t0)
        except EngineStartError:
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - t0, 2)
        info = self.startup_info()
        info.startup_s = self.startup_s
        if info.vllm_version is None:
            info.vllm_version = self.version()
        return info

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        deadline = t0 + self.startup_timeout_s
        with httpx.Client(timeout=httpx.Timeout(5.0)) as client:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    raise EngineStartError(f"vLLM {describe_exit(rc)} before it became healthy",
                                           log_tail=self.log_tail(), returncode=rc)
                try:
                    if client.get(self.base_url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineStartError(f"vLLM not healthy after {self.startup_timeout_s:.0f} s",
                                           log_tail=self.log_tail())
                time.sleep(1.0)

    def startup_info(self) -> StartupInfo:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            text = ""
        return parse_startup_log(text, requested_mode=self.mode.value if self.mode else None)

    def version(self) -> str | None:
        try:
            r = httpx.get(self.base_url + "/version", timeout=5.0)
            v = r.json().get("version") if r.status_code == 200 else None
            return str(v) if v else None
        except (httpx.HTTPError, ValueError):
            return None

    def log_tail(self, n: int = 40) -> str:
        return tail_lines(self.log_path, n, offset=self._log_offset)

    def log_size(self) -> int | None:
        """The log's length in bytes now (None if it cannot be read): a mark for :meth:`log_since`."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return None

    def log_since(self, offset: int | None, max_bytes: int = 4 * 1024 * 1024) -> str:
        """What the server wrote to its log after *offset* (at most the last *max_bytes*); "" if unknown."""
        if offset is None:
            return ""
        try:
            with self.log_path.open("rb") as f:
                end = f.seek(0, os.SEEK_END)
                f.seek(max(offset, end - max_bytes))
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server process while it runs (the root of vLLM's process tree), else None."""
        return self.proc.pid if self.alive() and self.proc is not None else None

    def check_alive(self) -> None:
        """Raise EngineDiedError if the server process has exited."""
        if self.proc is None:
            raise EngineDiedError("vLLM was never started")
        rc = self.proc.poll()
        if rc is not None:
            raise EngineDiedError(f"vLLM {describe_exit(rc)} while serving", log_tail=self.log_tail(),
                                  returncode=rc)

    def stop(self, timeout_s: float | None = None) -> int | None:
        """Terminate the process group, wait (``timeout_s``, default ``stop_timeout_s``), then kill what
        is left. Safe to call twice, and from two threads at once."""
        proc = self.proc
        if proc is None:
            self._close_log()
            return None
        if proc.poll() is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # Children (engine core) can outlive the parent: sweep the group regardless.
        self._signal_group(proc.pid, signal.SIGKILL)
        with _LIVE_LOCK:
            owned = _LIVE.get(self._owner)
            if owned is not None:
                owned.discard(self)
                if not owned:
                    del _LIVE[self._owner]
        self._close_log()
        return proc.returncode

    @staticmethod
    def _signal_group(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
