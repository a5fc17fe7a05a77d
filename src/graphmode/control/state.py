"""The controller's persisted state: one JSON file per deployment, written atomically.

``<state_dir>/<deployment_id>.json`` holds the last observed features (``launch`` reads them), the
current and last-good command and mode, the policy's timers and attempt history, and a bounded log of
decisions. Writes go to a temporary file in the same folder, are fsynced, then renamed over the old file,
so a crash leaves either the old or the new state, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from graphmode.control.policy import PolicyState
from graphmode.core.errors import ConfigError

MAX_DECISIONS = 200
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_deployment_id(deployment_id: str) -> str:
    if not _ID.match(deployment_id):
        raise ConfigError(
            f"deployment id {deployment_id!r} must be 1-128 characters of letters, digits, '.', '_', '-'"
        )
    return deployment_id


class DeploymentState(BaseModel):
    deployment_id: str
    updated_at: float | None = None
    last_features: dict[str, Any] | None = None
    last_features_at: float | None = None
    last_step_sizes: dict[str, Any] | None = Field(None, description="StepSizes of the last window (launch sizes)")
    current_mode: str | None = None
    current_command: list[str] | None = None
    last_good_mode: str | None = None
    last_good_command: list[str] | None = None
    startup_s: float | None = Field(None, description="measured start-up of the last good server")
    policy: PolicyState = Field(default_factory=PolicyState)
    decisions: list[dict[str, Any]] = Field(default_factory=list)
    switches: int = 0
    failed_switches: int = 0
    last_error: str | None = None

    def add_decision(self, decision: dict[str, Any]) -> None:
        self.decisions = [*self.decisions, decision][-MAX_DECISIONS:]


def state_path(state_dir: Path, deployment_id: str) -> Path:
    return Path(state_dir) / f"{check_deployment_id(deployment_id)}.json"


def load_state(state_dir: Path, deployment_id: str) -> DeploymentState:
    """The saved state, or a fresh one when there is none. A corrupt file is a :class:`ConfigError`."""
    path = state_path(state_dir, deployment_id)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return DeploymentState(deployment_id=deployment_id)
    except OSError as exc:
        raise ConfigError(f"cannot read state {path}: {exc.strerror or exc}") from exc
    try:
        return DeploymentState.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(f"state file {path} is not valid ({exc.error_count()} problems): move it away "
                          "to start fresh") from None


def save_state(state_dir: Path, state: DeploymentState) -> Path:
    path = state_path(state_dir, state.deployment_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(state.model_dump(mode="json"), indent=1, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path
