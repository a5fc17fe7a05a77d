"""What ``graphmode launch`` can tell about the deployment before vLLM starts, to pick the model that fits it.

A models folder holds one model per GPU and vLLM release (the bundled H200 ones for vLLM 0.24.0 and 0.33.0),
each over several model shapes. Without a target the registry takes the model with the most rows and the
model its first shape, which answered an 8B deployment on vLLM 0.33 with the 1B's table of the 0.24 model.
So, before vLLM starts:

* the GPU: NVML on this host (the one vLLM is about to use), when the ``profile`` extra installed it;
* the served model's shape: the ``config.json`` of ``--model`` (or ``vllm serve MODEL``) when that is a local
  directory, else of the model's snapshot in the Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME``/hub,
  ``~/.cache/huggingface/hub``), where ``vllm serve org/name`` has put it;
* vLLM's release: ``--vllm-version``, else the package metadata of the environment that runs the vLLM
  command (milliseconds; graphmode never imports vLLM).

Each element it cannot read leaves that part of the target open and says so in a note.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphmode.core.errors import ConfigError
from graphmode.vllm_args import model_arg

if TYPE_CHECKING:
    from graphmode.core.records import Fingerprint


def hub_cache_dirs() -> list[Path]:
    """Where the Hugging Face hub keeps downloaded models, in the order its own library looks."""
    out: list[Path] = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    out.append(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub")
    return out


def hub_config(model: str, caches: Sequence[Path] | None = None) -> Path | None:
    """The cached ``config.json`` of a hub model name (``org/name``): the snapshot ``refs/main`` names, else
    the newest snapshot that has one; None when the name is not in any cache."""
    parts = model.split("/")
    if len(parts) != 2 or not all(parts) or model.startswith((".", "/", "~")):
        return None
    for cache in caches if caches is not None else hub_cache_dirs():
        repo = cache / f"models--{parts[0]}--{parts[1]}"
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        try:
            ref = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
        except OSError:
            ref = ""
        if ref and (snapshots / ref / "config.json").is_file():
            return snapshots / ref / "config.json"
        found = sorted((p for p in snapshots.glob("*/config.json") if p.is_file()),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return found[0]
    return None


def launch_target(command: Sequence[str], vllm_args: Sequence[str], vllm_version: str | None = None,
                  *, caches: Sequence[Path] | None = None) -> tuple[Fingerprint, list[str]]:
    """The fingerprint to pick a model by (module docstring), and a note per element left open."""
    from graphmode.core.fingerprint import vllm_version_of
    from graphmode.selector.registry import target_fingerprint

    notes: list[str] = []
    version = vllm_version or vllm_version_of(list(command))
    if version is None:
        notes.append(f"vLLM's release could not be read from the environment of {command[0] if command else '?'}"
                     ": pass --vllm-version to pick the model trained on that release")
    path, note = _config_path(command, vllm_args, caches)
    if note:
        notes.append(note)
    try:
        return target_fingerprint(model_path=path, vllm_version=version), notes
    except ConfigError as exc:
        notes.append(f"{exc}: its shape stays unknown")
        return target_fingerprint(vllm_version=version), notes


def served_config(command: Sequence[str], vllm_args: Sequence[str],
                  caches: Sequence[Path] | None = None) -> dict[str, Any] | None:
    """The served model's config.json as an object (what a remote service's ``served_model_config`` takes);
    None when it cannot be read here."""
    from graphmode.core.fingerprint import load_model_config

    path, _ = _config_path(command, vllm_args, caches)
    if path is None:
        return None
    try:
        return load_model_config(path)
    except ConfigError:
        return None


def _config_path(command: Sequence[str], vllm_args: Sequence[str],
                 caches: Sequence[Path] | None) -> tuple[str | None, str | None]:
    """Where the served model's config is (a local path, or its hub cache snapshot), or a note why not."""
    model = model_arg(list(command), list(vllm_args))
    if model is None:
        return None, None
    if Path(model).expanduser().exists():
        return str(Path(model).expanduser()), None
    cached = hub_config(model, caches)
    if cached is not None:
        return str(cached), None
    return None, (f"model {model}: neither a local directory nor in the Hugging Face cache, so its shape is "
                  "unknown here (the model's first shape answers)")
