"""Capture-size arms of a race: vLLM's default mode with a given ``cudagraph_capture_sizes`` list.

Why
    Issue 14 measures recommended capture sizes against vLLM's default list: the same mode (the default,
    FULL_AND_PIECEWISE), another list. A race does that like a mode comparison: each list is one more
    challenger (an arm named by the user, ``--sizes-arm NAME=1,2,4,8``), paired round by round with the
    default engine, with its own verdicts, rows, engine starts and compile cache.

What an arm runs
    The race's vLLM args with ``cudagraph_capture_sizes`` and ``max_cudagraph_capture_size`` (the largest
    size) written into the one ``--compilation-config``, every other key of the user's kept
    (:func:`graphmode.vllm_args.with_compilation_config`); the engine then sets ``cudagraph_mode`` the
    same way. So the default arm runs vLLM's default list and the sizes arm the given one, under otherwise
    identical args. A user config that sets either key already would make the default arm no default:
    refused.

Rows
    ``race_arm`` is the arm's name, ``mode`` and ``race_requested_mode`` the default mode, and
    ``race_capture_sizes`` the list asked for (NULL for every other arm); the start-up columns
    (``capture_sizes``, ``capture_s``, ``graph_gib``, ``kv_cache_tokens``, ``startup_s``) say what vLLM
    resolved and what the start cost. The selector keeps these rows out of mode verdicts and training
    (:func:`is_sizes_row`): they measure a list, not a mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphmode.core.errors import ConfigError
from graphmode.core.modes import CudaGraphMode
from graphmode.vllm_args import compilation_config_of, with_compilation_config

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
MAX_SIZE = 65536  # no vLLM token budget is larger; a bigger size is a typo
RESERVED_NAMES = frozenset({m.value for m in CudaGraphMode} | {"CONTROL"})


@dataclass(frozen=True)
class SizesArm:
    """A challenger that runs the default mode with ``sizes`` as its capture sizes."""

    name: str
    sizes: tuple[int, ...]

    def compilation_config(self) -> dict[str, object]:
        return {"cudagraph_capture_sizes": list(self.sizes), "max_cudagraph_capture_size": self.sizes[-1]}

    def spec(self) -> str:
        return f"{self.name}={','.join(map(str, self.sizes))}"


def sizes_arm(name: str, sizes: Iterable[int]) -> SizesArm:
    """A validated arm: a short name that is no mode and not CONTROL, a non-empty list of positive sizes."""
    if not _NAME.match(name):
        raise ConfigError(f"sizes arm name {name!r}: 1-40 letters, digits, '.', '_' or '-', starting with a "
                          "letter or digit")
    if name.upper() in RESERVED_NAMES:
        raise ConfigError(f"sizes arm name {name!r} is a mode or CONTROL: pick another name")
    clean = sorted(set(sizes))
    if not clean or any(not isinstance(s, int) or isinstance(s, bool) or not 0 < s <= MAX_SIZE for s in clean):
        raise ConfigError(f"sizes arm {name!r}: capture sizes must be integers 1..{MAX_SIZE}, got {list(sizes)!r}")
    return SizesArm(name, tuple(clean))


def parse_sizes_arm(text: str) -> SizesArm:
    """``NAME=1,2,4,8`` (the CLI's ``--sizes-arm``), or ``NAME=@file.json`` holding a list, or a JSON object
    with ``cudagraph_capture_sizes`` (what ``bench/capture_sizes.py --json`` prints per workload)."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise ConfigError(f"--sizes-arm {text!r}: expected NAME=SIZE,SIZE,... (e.g. low=1,2,4,8,16)")
    if value.startswith("@"):
        try:
            raw: Any = json.loads(Path(value[1:]).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--sizes-arm {name}: cannot read {value[1:]}: {exc}") from None
        if isinstance(raw, Mapping):
            raw = raw.get("cudagraph_capture_sizes")
        if not isinstance(raw, list):
            raise ConfigError(f"--sizes-arm {name}: {value[1:]} holds no list of capture sizes")
        return sizes_arm(name, raw)
    try:
        sizes = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--sizes-arm {text!r}: sizes must be comma-separated integers") from None
    return sizes_arm(name, sizes)


def check_sizes_arms(arms: Sequence[SizesArm], vllm_args: list[str], mode_names: Iterable[str]) -> None:
    """Refuse what would make the comparison meaningless: duplicate names, a name taken by another arm,
    or a user compilation config that already overrides vLLM's default list (the default arm's)."""
    if not arms:
        return
    names = [a.name for a in arms]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"sizes arms named twice: {', '.join(dup)}")
    taken = set(mode_names) & set(names)
    if taken:
        raise ConfigError(f"sizes arm names clash with raced modes: {', '.join(sorted(taken))}")
    lists = [a.sizes for a in arms]
    same = sorted({a.name for a in arms if lists.count(a.sizes) > 1})
    if same:
        raise ConfigError(f"sizes arms with the same list: {', '.join(same)} (one arm per list)")
    cc = compilation_config_of(vllm_args)
    set_keys = [k for k in ("cudagraph_capture_sizes", "max_cudagraph_capture_size") if k in cc]
    if set_keys:
        raise ConfigError(f"--sizes-arm races lists against vLLM's default list, but the vLLM args set "
                          f"{' and '.join(set_keys)} in --compilation-config: drop it from the race's args")


def sizes_arm_args(vllm_args: list[str], arm: SizesArm) -> list[str]:
    """*vllm_args* with the arm's sizes merged into the compilation config (other keys kept)."""
    return with_compilation_config(vllm_args, arm.compilation_config())


def is_sizes_row(row: Mapping[str, Any]) -> bool:
    """A row that measured a capture list, not a mode: a capture-size arm of a race (``race_capture_sizes``), or
    an engine started with its own ``cudagraph_capture_sizes`` (vLLM's non-default args in its log say so; the
    capture chain's lone starts of recommended lists are such rows)."""
    if row.get("race_capture_sizes"):
        return True
    args = row.get("non_default_args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return False
    cc = args.get("compilation_config") if isinstance(args, Mapping) else None
    if isinstance(cc, str):
        try:
            cc = json.loads(cc)
        except ValueError:
            return "cudagraph_capture_sizes" in cc
    return isinstance(cc, Mapping) and bool(cc.get("cudagraph_capture_sizes"))
