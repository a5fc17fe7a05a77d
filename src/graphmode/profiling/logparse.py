"""Read what vLLM says about its own start-up out of its server log.

Every value comes from a line vLLM printed (only ``effective_mode`` may fall back to the requested mode);
a line that is absent leaves its field ``None``.
Parsing never raises on the log's content, whatever it is, because a failed or truncated start is exactly
the case a profiler has to report on.
"""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from graphmode.core.records import StartupInfo

__all__ = ["CUDAGRAPH_MODES", "parse_startup_log"]

CUDAGRAPH_MODES: Final = frozenset({"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"})

_NUM: Final = r"(\d+(?:\.\d+)?)"
# Graph memory is free memory before minus after capture, so engines starting side by side on one GPU make
# it negative (vLLM 0.33 race logs: "took -8.25 GiB"); kept as printed, since the time on that line is good.
_SIGNED_NUM: Final = r"(-?\d+(?:\.\d+)?)"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_SOURCE = re.compile(r"\[(?:[\w.\-]*/)*([\w\-]+)\.py:\d+\]")

# The model runner names itself only through the source file of these messages (CPU: cpu_model_runner).
_RUNNER_EVENT = re.compile(
    r"Model loading took|Graph capturing finished|Starting to load model|Loading model from scratch"
)
_CAPTURE_LABEL = re.compile(r"Capturing CUDA graphs? \(([^()]+)\)")
_NON_DEFAULT_ARGS = re.compile(r"non-default args: (\{.*\})\s*$")
_ENGINE_INIT = re.compile(r"Initializing a V\d LLM engine")
# vLLM prints enums with their repr, e.g. <CUDAGraphMode.FULL: 2>, which literal_eval cannot read.
_ENUM_REPR = re.compile(r"<([A-Za-z_][\w.]*): [^<>]*>")
_REQUESTED_IN_ARGS = re.compile(r"'cudagraph_mode': (?:<CUDAGraphMode\.(\w+)|'(\w+)')")

_CONFIG_MODE_ENUM = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")
# Older releases printed the compilation config as JSON with the enum's value.
_CONFIG_MODE_VALUE = re.compile(r"\"cudagraph_mode\": ?(\d|\[\d, ?\d\])")
_MODE_BY_VALUE: Final = {
    "0": "NONE",
    "1": "PIECEWISE",
    "2": "FULL",
    "[2,0]": "FULL_DECODE_ONLY",
    "[2,1]": "FULL_AND_PIECEWISE",
}

# The ways vLLM announces that it changed the cudagraph mode (vllm/config/compilation.py, vllm/config/vllm.py,
# vllm/platforms/*.py). The first group is the mode it switched to.
_MODE_CHANGES: Final = (
    re.compile(r"setting cudagraph_mode ?(?:=|to) ?(\w+)", re.IGNORECASE),
    # "to B", "from A to B", and 0.33's "Overriding cudagraph_mode A to NONE" (stock torch.compile on V2).
    re.compile(r"Overriding cudagraph_mode (?:(?:from )?\w+ )?to (\w+)"),
    re.compile(r"Cudagraph mode \S+ .*Overriding to (?:CUDAGraphMode\.)?(\w+)"),
    re.compile(r"cudagraph_mode will be set to (\w+)"),
)
# Messages after which vLLM runs without CUDA graphs.
_MODE_OFF: Final = re.compile(
    r"Skipping CUDA graph capture"
    r"|Skipping encoder and decoder CUDA graph capture"
    r"|Cudagraph is disabled under eager mode"
    r"|Enforce eager set, disabling torch\.compile"
    r"|Disabling CUDA Graphs since"
    r"|disabling cudagraph_mode"
)


# Lines where vLLM changes what was asked of it: a different cudagraph mode or fewer capture sizes. The texts
# are vLLM's own (vllm/config/compilation.py resolve_cudagraph_mode_and_sizes, vllm/config/vllm.py
# _set_cudagraph_sizes and its pooling / encoder-decoder / context-parallel / dynamic speculative decoding checks);
# the fixtures under tests/fixtures/vllm-downgrades hold real lines of each kind.
_DOWNGRADE: Final = re.compile(
    r"is not supported (?:with|for) .*setting cudagraph_mode ?="
    r"|Overriding cudagraph_mode"
    r"|cudagraph_capture_sizes specified in compilation_config"
    r"|Truncating max_cudagraph_capture_size"
    r"|CUDAGraph is not supported for .*setting cudagraph_mode"
)
_CAPTURE_SIZES: Final = re.compile(r"'cudagraph_capture_sizes': \[([\d,\s]*)\]")
_MAX_CAPTURE_SIZE: Final = re.compile(r"'max_cudagraph_capture_size': (\d+)")
_CAPTURE_PROGRESS: Final = re.compile(r"Capturing CUDA graphs? \(([^()]+)\):[^|]*\|[^|]*\|\s*(\d+)/(\d+)")
_LOG_PREFIX: Final = re.compile(r"^.*?\[[\w.\-]+\.py:\d+\]\s*")

# Yes/no facts vLLM states in a line of its own; the last such line wins, none leaves the field ``None``.
# Model Runner V2: gpu_worker.py says it is in use; config/vllm.py says when it falls back to V1.
# Breakable CUDA graphs (vLLM >= 0.29): auto-enabled per architecture or by VLLM_USE_BREAKABLE_CUDAGRAPH=1.
_FLAGS: Final = (
    (re.compile(r"Using V2 Model Runner"), "model_runner_v2", True),
    (re.compile(r"Model Runner V2 (?:does not yet support .*|requires \w+); using the V1 model runner"),
     "model_runner_v2", False),
    (re.compile(r"Breakable CUDA graph enabled|Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1"),
     "breakable_cudagraph", True),
)


def _float(text: str) -> float:
    return float(text.replace(",", ""))


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _str(text: str) -> str:
    return text.strip()


@dataclass(frozen=True)
class _Rule:
    """A line pattern whose groups fill fields; of two rules for a field the lower ``priority`` wins.

    Of two lines matching rules of the same priority the first wins, or the last when ``last`` is set.
    """

    pattern: re.Pattern[str]
    fields: tuple[tuple[str, Callable[[str], Any]], ...]
    priority: int = 0
    last: bool = False


def _rule(
    pattern: str, *fields: tuple[str, Callable[[str], Any]], priority: int = 0, last: bool = False
) -> _Rule:
    return _Rule(re.compile(pattern), fields, priority, last)


_RULES: Final = (
    # "vLLM API server version X" (older), "vLLM server version X, serving model M" (logo turned off).
    _rule(r"vLLM (?:API )?server version ([^\s,]+)", ("vllm_version", _str)),
    _rule(r"Initializing a V\d LLM engine \(v([^)\s]+)\)", ("vllm_version", _str)),
    _rule(r"[█▄▀]\s+version (\d[^\s]*)", ("vllm_version", _str)),
    _rule(r"Resolved architecture: (\w+)", ("architecture", _str)),
    _rule(r"Using (\w+) attention backend", ("attention_backend", _str)),
    # Older and platform-specific phrasings ("Using Flash Attention backend on V1 engine.", CPU "Using
    # Torch SDPA backend."); anchored at the line end so "Using X backend for MoE" is not mistaken for one.
    _rule(
        r"Using (?:AttentionBackendEnum\.|_Backend\.)?(\w+(?: \w+){0,2}?) backend(?: on V1 engine)?\.?\s*$",
        ("attention_backend", _str),
        priority=1,
    ),
    _rule(r"Using FlashAttention version (\d+)", ("flash_attn_version", _int)),
    _rule(r"Dynamo bytecode transform time: " + _NUM + r" s", ("dynamo_s", _float)),
    _rule(r"torch\.compile took " + _NUM + r" s in total", ("compile_s", _float)),
    _rule(
        r"Model loading took " + _NUM + r" GiB(?: memory)? and " + _NUM + r" seconds",
        ("model_load_gib", _float),
        ("model_load_s", _float),
    ),
    # Model Runner V2 with graph-memory profiling (vLLM 0.33) captures twice, once to measure and once for
    # the graphs it serves with; the last line is the capture that stays (and matches the pool's "actual").
    _rule(
        r"Graph capturing finished in " + _NUM + r" secs?, took " + _SIGNED_NUM + r" GiB",
        ("capture_s", _float),
        ("graph_gib", _float),
        last=True,
    ),
    _rule(r"Estimated CUDA graph memory: " + _NUM + r" GiB", ("estimated_graph_gib", _float)),
    # V2 prints no "Estimated" line; its estimate is only in the pool summary after the capture.
    _rule(
        r"CUDA graph pool memory: -?[\d.]+ GiB \(actual\), " + _NUM + r" GiB \(estimated\)",
        ("estimated_graph_gib", _float),
        priority=1,
    ),
    _rule(r"Available KV cache memory: " + _NUM + r" GiB", ("kv_cache_gib", _float)),
    # With --kv-cache-memory-bytes vLLM skips memory profiling and reports the reservation instead.
    _rule(
        r"reserved " + _NUM + r" GiB memory for KV Cache as specified by kv_cache_memory_bytes",
        ("kv_cache_gib", _float),
        priority=1,
    ),
    # The CPU worker reports the KV cache it reserved as "(Auto|Explicitly) set (kv/total) GiB for KV cache".
    _rule(r"(?:Auto|Explicitly) set \(" + _NUM + r"/[\d.]+\) GiB for KV cache", ("kv_cache_gib", _float)),
    _rule(r"KV cache size: (\d[\d,]*) tokens", ("kv_cache_tokens", _int)),
    _rule(r"Maximum concurrency for [\d,]+ tokens per request: " + _NUM + r"x", ("max_concurrency", _float)),
    _rule(r"init engine \([^)]*\) took " + _NUM + r" s", ("init_engine_s", _float)),
    _rule(r"max_num_batched_tokens=(\d+)", ("max_num_batched_tokens", _int)),
)


def _lines(text: str) -> list[str]:
    # Progress bars redraw with \r and colour with ANSI codes; both would hide log lines from the patterns.
    return _ANSI.sub("", text).splitlines()


def _apply_rules(line: str, found: dict[str, tuple[int, Any]]) -> None:
    for rule in _RULES:
        match = rule.pattern.search(line)
        if match is None:
            continue
        for index, (name, convert) in enumerate(rule.fields, start=1):
            held = found.get(name)
            if held is not None and (held[0] < rule.priority or (held[0] == rule.priority and not rule.last)):
                continue
            try:
                found[name] = (rule.priority, convert(match.group(index)))
            except (ValueError, OverflowError):
                continue


def _mode_name(text: str | None) -> str | None:
    """``'CUDAGraphMode.FULL'``, ``'full'`` or ``'FULL'`` → ``'FULL'``; anything else → ``None``."""
    if not text:
        return None
    name = text.rsplit(".", 1)[-1].strip().upper()
    return name if name in CUDAGRAPH_MODES else None


def _mode_set_by(line: str) -> str | None:
    """The cudagraph mode this line says vLLM is now using, if it says so."""
    if _ENGINE_INIT.search(line):
        enum_match = _CONFIG_MODE_ENUM.search(line)
        if enum_match:
            return _mode_name(enum_match.group(1))
        value_match = _CONFIG_MODE_VALUE.search(line)
        if value_match:
            return _MODE_BY_VALUE.get(value_match.group(1).replace(" ", ""))
        return None
    for pattern in _MODE_CHANGES:
        change = pattern.search(line)
        if change:
            return _mode_name(change.group(1))
    if _MODE_OFF.search(line):
        return "NONE"
    return None


# CPython 3.11's parser is not thread-safe: a race's start wave parses every engine's log in its own thread,
# and two at once raised "SystemError: AST constructor recursion depth mismatch" (CI, 2026-12-03), which
# left that engine neither live nor failed
_AST_LOCK = threading.Lock()


def _literal_dict(text: str) -> dict[str, Any] | None:
    try:
        with _AST_LOCK:
            value = ast.literal_eval(_ENUM_REPR.sub(lambda m: repr(m.group(1)), text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, SystemError):
        return None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        return None
    return value


def _requested_from_args(args: dict[str, Any] | None, raw: str | None) -> str | None:
    if args is not None:
        config = args.get("compilation_config")
        if isinstance(config, dict):
            mode = config.get("cudagraph_mode")
            if isinstance(mode, str):
                return _mode_name(mode)
    if raw is not None:
        match = _REQUESTED_IN_ARGS.search(raw)
        if match:
            return _mode_name(match.group(1) or match.group(2))
    return None


def _unique_in_order(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _effective_mode(logged: str | None, requested: str | None, captured: bool) -> str | None:
    if logged is not None:
        return logged
    if requested is not None and captured:
        return requested
    if _mode_name(requested) == "NONE" and not captured:
        return "NONE"
    return None


def parse_startup_log(text: str, requested_mode: str | None = None) -> StartupInfo:
    """Pull what vLLM reported about its start-up out of ``text``, a server log (APIServer and EngineCore).

    ``requested_mode`` is the cudagraph mode the launcher asked for; without it, the one in vLLM's
    "non-default args" line is used. ``effective_mode`` is the mode vLLM says it ended with (its
    resolved compilation config, then any later downgrade warning, the last one winning); failing that,
    the requested mode once graphs were captured, or ``NONE`` when ``NONE`` was asked and none were.
    Enum values in ``non_default_args`` become their qualified names, e.g. ``'CUDAGraphMode.FULL'``.
    """
    found: dict[str, tuple[int, Any]] = {}
    labels: list[str] = []
    runner: str | None = None
    logged_mode: str | None = None
    args_raw: str | None = None
    sizes: list[int] | None = None
    max_size: int | None = None
    counts: dict[str, int] = {}
    downgrades: list[str] = []
    flags: dict[str, bool] = {}
    for line in _lines(text):
        _apply_rules(line, found)
        for flag_pattern, flag_name, flag_value in _FLAGS:
            if flag_pattern.search(line):
                flags[flag_name] = flag_value
        labels.extend(match.group(1).strip() for match in _CAPTURE_LABEL.finditer(line))
        if runner is None and _RUNNER_EVENT.search(line):
            source = _SOURCE.search(line)
            runner = source.group(1) if source else None
        logged_mode = _mode_set_by(line) or logged_mode
        if _ENGINE_INIT.search(line):
            sizes_match = _CAPTURE_SIZES.search(line)
            if sizes_match:
                sizes = [int(x) for x in sizes_match.group(1).replace(",", " ").split()]
            max_match = _MAX_CAPTURE_SIZE.search(line)
            if max_match:
                max_size = int(max_match.group(1))
        for progress in _CAPTURE_PROGRESS.finditer(line):
            label = progress.group(1).strip()
            counts[label] = max(counts.get(label, 0), int(progress.group(3)))
        if _DOWNGRADE.search(line):
            downgrades.append(_LOG_PREFIX.sub("", line).strip())
        if args_raw is None:
            args_match = _NON_DEFAULT_ARGS.search(line)
            args_raw = args_match.group(1) if args_match else None
    values = {name: value for name, (_, value) in found.items()}
    args = _literal_dict(args_raw) if args_raw is not None else None
    requested = requested_mode if requested_mode is not None else _requested_from_args(args, args_raw)
    captured = bool(labels) or values.get("capture_s") is not None
    return StartupInfo(
        **values,
        **flags,
        model_runner=runner,
        capture_labels=_unique_in_order(labels),
        capture_sizes=sizes,
        max_capture_size=max_size,
        graph_counts=counts,
        downgrades=_unique_in_order(downgrades),
        non_default_args=args,
        requested_mode=requested,
        effective_mode=_effective_mode(logged_mode, requested, captured),
    )
