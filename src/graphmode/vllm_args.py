"""Reading and rewriting a vLLM command line without importing vLLM.

graphmode only ever touches ``cudagraph_mode`` (and capture sizes) inside the compilation config. Every form
vLLM reads one in counts as the user's, and is folded, in command-line order, into the one
``--compilation-config`` a rewrite emits (every other key the user gave kept as it was):

* ``--compilation-config JSON`` / ``=JSON``, alias ``-cc``, ``--compilation_config``: a whole config, which
  replaces what came before;
* ``-O JSON`` / ``-O=JSON`` when the value is a JSON object (older vLLM: ``-O`` was ``--compilation-config``;
  ``-O3`` or ``-O 3``, an optimization level in newer ones, is left alone);
* ``-O.key=value``, ``-O.key value``, ``--compilation-config.key=value``, ``-cc.key=value`` (vLLM's dotted
  form, nested keys allowed): one key, its value JSON when it parses as JSON, else the string.
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


@dataclass(frozen=True)
class _CcArg:
    index: int  # index of the flag token
    width: int  # tokens taken: 1 (flag=value) or 2 (flag value)
    key: str | None  # the dotted key, None for a whole config
    value: str


def _cc_args(args: list[str]) -> list[_CcArg]:
    """Every compilation-config argument in ``args``, in order (see the module docstring)."""
    found: list[_CcArg] = []
    i = 0
    while i < len(args):
        tok = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None
        arg: _CcArg | None = None
        if nxt is not None and (tok in _CC_FLAGS or (tok == "-O" and nxt.lstrip().startswith("{"))):
            arg = _CcArg(i, 2, None, nxt)
        elif any(tok.startswith(f + "=") for f in _CC_FLAGS) or (
                tok.startswith("-O=") and tok[3:].lstrip().startswith("{")):
            arg = _CcArg(i, 1, None, tok.split("=", 1)[1])
        else:
            flag = next((f for f in (*_CC_FLAGS, "-O") if tok.startswith(f + ".")), None)
            if flag is not None:
                rest = tok[len(flag) + 1:]
                if "=" in rest:
                    key, value = rest.split("=", 1)
                    arg = _CcArg(i, 1, key, value)
                elif nxt is not None:
                    arg = _CcArg(i, 2, rest, nxt)
        if arg is not None:
            found.append(arg)
            i += arg.width
        else:
            i += 1
    return found


def _dotted_value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def compilation_config_of(args: list[str]) -> dict[str, object]:
    """The compilation config ``args`` give vLLM, every form folded in order (see the module docstring)."""
    cc: dict[str, object] = {}
    for arg in _cc_args(args):
        if arg.key is None:
            try:
                value = json.loads(arg.value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"--compilation-config is not valid JSON: {arg.value!r} ({exc.msg})") from None
            if not isinstance(value, dict):
                raise ConfigError(f"--compilation-config must be a JSON object, got {arg.value!r}")
            cc = value
            continue
        parts = arg.key.split(".")
        if not all(parts):
            raise ConfigError(f"compilation config key {arg.key!r} has an empty part")
        node = cc
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = _dotted_value(arg.value)
    return cc


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
    taken = {arg.index + k for arg in _cc_args(args) for k in range(arg.width)}
    out = [tok for i, tok in enumerate(args) if i not in taken]
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
