"""Reading and rewriting a vLLM command line without importing vLLM.

graphmode only ever touches ``cudagraph_mode`` inside ``--compilation-config`` (alias ``-cc``; ``-O`` takes
the same JSON in some versions). Every other key the user gave is kept as it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from graphmode.core.errors import ConfigError
from graphmode.core.modes import CudaGraphMode, parse_mode

_CC_FLAGS = ("--compilation-config", "-cc", "--compilation_config")


@dataclass(frozen=True)
class _Found:
    index: int  # index of the flag (or of the flag=value token)
    inline: bool  # --flag=value form
    value: str


def _find(args: list[str], names: tuple[str, ...]) -> _Found | None:
    found = None
    for i, tok in enumerate(args):
        for name in names:
            if tok == name and i + 1 < len(args):
                found = _Found(i, False, args[i + 1])
            elif tok.startswith(name + "="):
                found = _Found(i, True, tok.split("=", 1)[1])
    return found  # the last occurrence wins, as argparse does


def get_flag(args: list[str], *names: str) -> str | None:
    f = _find(args, tuple(names))
    return f.value if f else None


def has_flag(args: list[str], *names: str) -> bool:
    return any(tok in names or any(tok.startswith(n + "=") for n in names) for tok in args)


def model_arg(command: list[str], args: list[str]) -> str | None:
    """The model vLLM will serve: ``--model X`` or, for ``vllm serve X``, the first positional."""
    explicit = get_flag(args, "--model")
    if explicit:
        return explicit
    if command and command[-1] == "serve" and args and not args[0].startswith("-"):
        return args[0]
    return None


def compilation_config_of(args: list[str]) -> dict[str, object]:
    found = _find(args, _CC_FLAGS)
    if found is None:
        return {}
    try:
        value = json.loads(found.value)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--compilation-config is not valid JSON: {found.value!r} ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--compilation-config must be a JSON object, got {found.value!r}")
    return value


def user_mode(args: list[str]) -> CudaGraphMode | None:
    cc = compilation_config_of(args)
    raw = cc.get("cudagraph_mode")
    if raw is None:
        return None
    try:
        return parse_mode(str(raw))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def with_mode(args: list[str], mode: CudaGraphMode) -> list[str]:
    """*args* with ``cudagraph_mode`` set to *mode* in the (one) compilation config, other keys kept."""
    return with_compilation_config(args, {"cudagraph_mode": mode.value})


def user_capture_sizes(args: list[str]) -> list[int] | None:
    """The user's ``cudagraph_capture_sizes``, if any (ConfigError when it is not a list of positive ints)."""
    raw = compilation_config_of(args).get("cudagraph_capture_sizes")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(x, int) and x > 0 for x in raw):
        raise ConfigError(f"cudagraph_capture_sizes must be a non-empty list of positive integers, got {raw!r}")
    return sorted(set(raw))


def with_compilation_config(args: list[str], updates: dict[str, object]) -> list[str]:
    """*args* with *updates* written into the (one) compilation config, every other key kept.

    A ``cudagraph_capture_sizes`` update drops a ``max_cudagraph_capture_size`` the update does not set,
    since vLLM refuses the two when they disagree (vllm/config/vllm.py).
    """
    cc = compilation_config_of(args)
    if "cudagraph_capture_sizes" in updates and "max_cudagraph_capture_size" not in updates:
        cc.pop("max_cudagraph_capture_size", None)
    cc.update(updates)
    value = json.dumps(cc, separators=(",", ":"))
    out: list[str] = []
    skip_next = False
    for i, tok in enumerate(args):
        if skip_next:
            skip_next = False
            continue
        if tok in _CC_FLAGS and i + 1 < len(args):
            skip_next = True
            continue
        if any(tok.startswith(f + "=") for f in _CC_FLAGS):
            continue
        out.append(tok)
    return [*out, "--compilation-config", value]


def without_flags(args: list[str], *names: str) -> list[str]:
    """Drop flags that take one value (both ``--f v`` and ``--f=v``)."""
    out: list[str] = []
    skip_next = False
    for tok in args:
        if skip_next:
            skip_next = False
            continue
        if tok in names:
            skip_next = True
            continue
        if any(tok.startswith(n + "=") for n in names):
            continue
        out.append(tok)
    return out
