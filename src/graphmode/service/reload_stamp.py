"""The reload generation stamp: how a reload in one ``serve --workers N`` process reaches the others.

Every worker has its own :class:`~graphmode.service.state.ServiceState`. The worker that reloads on request
(``POST /v1/reload``, a finished retrain job) then writes a fresh stamp into ``<models_dir>/.graphmode-reload``;
every worker polls the stamp every ``settings.service.reload_poll_s`` seconds and reloads when it changed.
The stamp is opaque (time, pid, random): only "differs from the one I last saw" matters. A missing stamp
is generation 0, the same for every worker, so nothing reloads until someone writes one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import tempfile
import time
from pathlib import Path

log = logging.getLogger("graphmode.service")
RELOAD_STAMP_FILE = ".graphmode-reload"
NO_STAMP = ""  # generation 0: the file does not exist
_MAX_STAMP_BYTES = 256


def stamp_path(models_dir: Path) -> Path:
    return models_dir / RELOAD_STAMP_FILE


def read_stamp(models_dir: Path) -> str:
    """The current stamp (``NO_STAMP`` when there is none). Raises :class:`OSError` when it exists but
    cannot be read."""
    try:
        with stamp_path(models_dir).open("rb") as f:
            return f.read(_MAX_STAMP_BYTES).decode("ascii", "replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return NO_STAMP


def write_stamp(models_dir: Path) -> str | None:
    """Write a new stamp atomically (a temporary file renamed over the old one, so a reader sees the old
    stamp or the new one, never half of one); returns it, or None when the models dir cannot be written
    (logged: the caller's own reload has already happened, only the other workers miss it)."""
    stamp = f"{time.time_ns()}-{os.getpid()}-{secrets.token_hex(8)}"
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=models_dir, prefix=RELOAD_STAMP_FILE + ".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(stamp + "\n")
        os.replace(tmp, stamp_path(models_dir))
        tmp = None
    except OSError as exc:
        log.warning("reload stamp not written (%s): other workers of this service keep their models", exc)
        return None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return stamp
