"""Fixture logs read as the runner reads a captured one."""

from __future__ import annotations

from pathlib import Path

from graphmode.core.records import StartupInfo
from graphmode.profiling.logparse import parse_startup_log


def parse_startup_log_file(path: Path, requested_mode: str | None = None) -> StartupInfo:
    """A fixture log parsed as the runner parses a captured one (undecodable bytes replaced)."""
    return parse_startup_log(path.read_bytes().decode("utf-8", errors="replace"), requested_mode)
