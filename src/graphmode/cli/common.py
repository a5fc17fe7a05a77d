"""Helpers every subcommand shares: settings, error reporting, exit codes."""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
import typer.core
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from graphmode.core.errors import ConfigError, GraphmodeError
from graphmode.core.modes import CudaGraphMode, parse_mode
from graphmode.core.records import CellRecord, ObservedFeatures

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3  # the job finished but some cells/requests failed

err_console = Console(stderr=True)


@contextmanager
def handle_errors() -> Iterator[None]:
    """Print graphmode's own errors as one clear message and exit non-zero, no traceback."""
    try:
        yield
    except ConfigError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    except GraphmodeError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_ERROR) from None


class VllmArgsCommand(typer.core.TyperCommand):
    """A command that passes vLLM's args on: what follows a literal ``--`` lands in ``ctx.args`` unparsed.

    Click keeps those args with ``allow_extra_args``, which would also keep a stray positional arg before ``--``
    as a vLLM arg, and with ``ignore_unknown_options`` an unknown option too: a misspelt option
    (``--model-config`` for ``--model-path``) would silently change what the command does. Here anything left
    over before the ``--`` is a usage error (exit 2, graphmode's one-line error) that names it, with the
    command's own options closest to it; args after ``--`` pass as before. (``ignore_unknown_options`` stays so
    that this class, not click, words the error, the same for unknown options and stray args.) Every such
    command takes vLLM's args only after ``--``: that is how the docs, the deploy files (the image's entrypoint
    is ``graphmode launch --``) and the bench scripts pass them, launch's included.
    """

    def __init__(self, name: str | None, **kwargs: Any) -> None:
        settings = {**(kwargs.pop("context_settings", None) or {}),
                    "allow_extra_args": True, "ignore_unknown_options": True}
        super().__init__(name, context_settings=settings, **kwargs)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # ``ctx`` is the click Context of the click that typer runs on (typer may vendor its own)
        raw = list(args)
        rest = super().parse_args(ctx, args)
        if ctx.resilient_parsing:  # shell completion: nothing is run
            return rest
        extras: list[str] = list(ctx.args)
        before = extras[: len(extras) - _after_separator(raw, extras)]
        if before:
            with handle_errors():
                raise ConfigError(self._leftover_message(ctx, before))
        return rest

    def _leftover_message(self, ctx: Any, before: list[str]) -> str:
        """One line for args left over before ``--``: the first unknown option (else the first positional
        arg), the command's options closest to it, and where vLLM's args go."""
        where = f"for {ctx.command_path} (see --help); vLLM's args go after --"
        option = next((a for a in before if a.startswith("-") and len(a) > 1), None)
        if option is None:
            return f"unexpected argument {terminal_safe(before[0], 80)!r} {where}"
        name = option.split("=", 1)[0]
        own = [o for p in self.get_params(ctx) if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)]
        close = difflib.get_close_matches(name, own, n=3)
        if len(close) > 1:  # "--a, --b or --c"
            close = [", ".join(close[:-1]), close[-1]]
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return f"unknown option {terminal_safe(name, 80)} {where}{hint}"


def _after_separator(raw: list[str], extras: list[str]) -> int:
    """How many of a command's leftover args (``extras``, in order) came after the ``--`` that ended its options
    in ``raw``, its whole command line. Click drops that ``--`` and appends everything after it to the leftovers
    unparsed, so it is the first ``--`` whose whole tail ends ``extras``; an earlier ``--`` was an option's value
    (``--vllm-cmd --``), whose tail click went on parsing. 0 when no ``--`` ended the options."""
    for i, arg in enumerate(raw):
        tail = raw[i + 1:]
        if arg == "--" and len(tail) <= len(extras) and extras[len(extras) - len(tail):] == tail:
            return len(tail)
    return 0


def read_at_file(text: str, option: str) -> str:
    """``text``, or the contents of the file ``@PATH`` names (an option's ``@file`` form); a file that cannot be
    read is a :class:`ConfigError` naming the option and the path, never a traceback."""
    if not text.startswith("@"):
        return text
    path = Path(text[1:])
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{option}: cannot read {terminal_safe(str(path), 200)}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{option}: {terminal_safe(str(path), 200)} is not UTF-8 text") from None


# Table style that fits the most columns in a narrow terminal: no outer edge, no vertical rules, one space
# between columns.
NARROW: dict[str, Any] = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "collapse_padding": True}


def whole_column(table: Table, header: str, values: Iterable[str], **kwargs: Any) -> None:
    """Add a column whose cells are never cut or wrapped, whatever the terminal's width: mode names, numbers,
    and the model ids a user copies into another command (``FULL…`` or ``nvidia-h200-vllm0.24.0-ab3…`` is
    useless). Its header may wrap; the table's other columns wrap to make room."""
    width = max((len(v) for v in values), default=0)
    words = header.split()
    # one word a line when the values are narrower than the header (a no_wrap header would not wrap)
    head = "\n".join(words) if width < len(header) else header
    table.add_column(head, no_wrap=True, min_width=max([width, *map(len, words)]), **kwargs)


# The CLI flag of each workload-description field, for messages about them.
WORKLOAD_FLAGS = {"rate": "--rate", "burstiness": "--burstiness", "input_tokens": "--input-tokens",
                  "output_tokens": "--output-tokens", "concurrency": "--concurrency"}


def validation_message(exc: Exception, flags: Mapping[str, str] | None = None) -> str:
    """The first problem of a pydantic ``ValidationError`` as one line for a person: the field (as its CLI flag
    when ``flags`` names it) and what is wrong, without pydantic's type codes and documentation URLs. A NaN
    or infinite number is said to be one (pydantic would report a bound it "exceeds"). Other exceptions: their
    text."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError) or not exc.errors():
        return str(exc)
    err = exc.errors(include_url=False)[0]
    field = ".".join(map(str, err["loc"]))
    name = (flags or {}).get(field, field)
    value = err.get("input")
    msg = (f"must be a finite number, got {value}" if isinstance(value, float) and not math.isfinite(value)
           else str(err["msg"]))
    return f"{name}: {msg}" if name else msg


# C0 and C1 control characters and DEL (ESC starts terminal escape sequences), and the bidirectional
# overrides: what a remote server's text must not bring to a terminal. Tab stays.
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str, limit: int | None = None) -> str:
    """``text`` fit to print: every control character (escape sequences, NUL, newlines) shown as ``?``, and
    cut to ``limit`` characters when one is given. For anything a remote server says (its ``/version``) that
    the CLI prints, as the service filters what it quotes."""
    clean = _UNSAFE.sub("?", text)
    return clean if limit is None or len(clean) <= limit else clean[: limit - 1] + "…"


# The pyproject extra each command needs, and the extra that brings each optional import (for the rest).
EXTRA_OF_COMMAND = {"profile": "profile", "train": "selector", "retrain": "all", "recommend": "selector",
                    "launch": "selector", "watch": "selector", "serve": "service", "report": "report"}
EXTRA_OF_MODULE = {
    "aiohttp": "profile", "pynvml": "profile", "psutil": "profile", "prometheus_client": "profile",
    "sklearn": "selector", "skops": "selector", "scipy": "selector", "pandas": "selector",
    "fastapi": "service", "uvicorn": "service", "starlette": "service",
    "plotly": "report", "jinja2": "report", "markupsafe": "report",
}


def spec_decode_text(features: ObservedFeatures) -> str:
    """``, drafts 42% accepted, 2.3 tokens per verification step`` for a cell with speculative decoding, else
    ``""``: what the steps held, beside the latency they gave (an ngram proposer that finds no match
    proposes nothing, and a race of such a configuration measures plain decoding)."""
    rate, length = features.spec_acceptance_rate, features.spec_accept_length
    if rate is None and length is None:
        return ""
    bits = ([f"drafts {rate * 100:.0f}% accepted"] if rate is not None else []) + (
        [f"{length:.2f} tokens per verification step"] if length is not None else [])
    return ", " + ", ".join(bits)


def jit_text(record: CellRecord, race: bool = False) -> str:
    """``, JIT-compiled fused_moe_kernel during the cell`` when vLLM's log said so, else ``""``."""
    kernels = record.conditions.engine_jit_kernels
    if not kernels:
        return ""
    return f", JIT-compiled {kernels.replace(',', ', ')} during the cell" + (
        ": its round is left out of the verdicts" if race else "")


# graphmode's own event loop at this many cores may be what limits the load (one Python thread)
LOADGEN_SATURATED_CORES = 0.8


def loadgen_text(record: CellRecord) -> str:
    """``, load generator at 0.93 CPU cores: it may limit the load`` near saturation, else ``""``."""
    cores = record.conditions.loadgen_cpu_cores
    if cores is None or cores < LOADGEN_SATURATED_CORES:
        return ""
    return f", load generator at {cores:.2f} CPU cores: it may limit the load"


# tokens per network read above which the client found events queued often enough to smooth ITL quantiles
CLIENT_COALESCED_TOKENS = 1.5


def client_reads_text(record: CellRecord) -> str:
    """``, 2.1 tokens a read: the client fell behind (vLLM's mean ITL 4.10 ms)`` when the load client found
    several tokens per network read, else ``""``. Each token of a read carries a share of its gap, so ITL
    means and TPOT stand and quantiles are smoothed; vLLM's own mean (from /metrics) is the check. Not said
    with speculative decoding, whose events carry several tokens by design."""
    lat = record.latency
    if (lat.chunk_tokens_mean is None or lat.chunk_tokens_mean < CLIENT_COALESCED_TOKENS
            or record.features.spec_accept_length is not None):
        return ""
    check = f" (vLLM's mean ITL {lat.server_itl_mean * 1e3:.2f} ms)" if lat.server_itl_mean is not None else ""
    return f", {lat.chunk_tokens_mean:.1f} tokens a read: the client fell behind{check}"


def engine_process_text(record: CellRecord) -> str:
    """``, VLLM::EngineCore at 0.97 CPU cores`` when one process of vLLM's tree ran near a full core (the
    threshold of the load generator's own line), else ``""``: a Python process on one core sets the pace."""
    cores, title = record.conditions.engine_busiest_cores, record.conditions.engine_busiest_process
    if cores is None or cores < LOADGEN_SATURATED_CORES:
        return ""
    return f", {title or 'a vLLM process'} at {cores:.2f} CPU cores"


# a smaller concurrency cap is a latency probe, whose running mean is the gap between its requests
RUNNING_CAP_MIN = 32
# the share of a cap that counts as held (the rest is in transit: API servers, between requests);
# bench/race_table.py's CAP_HELD
RUNNING_CAP_HELD = 0.8


def running_text(record: CellRecord) -> str:
    """``, 733 of 768 running`` for a cell whose workload caps its concurrency (32 or more), with
    ``: below the cap`` when the engine ran less than 80% of it: such a cell kept up with its arrivals
    instead of running the cap, and a round that mixes the two compares queue states, not modes."""
    cap = record.workload_spec.get("max_concurrency")
    batch = record.features.batch_mean
    if not isinstance(cap, int) or cap < RUNNING_CAP_MIN or batch is None:
        return ""
    seqs = record.deployment.max_num_seqs if record.deployment is not None else None
    limit = min(cap, seqs) if seqs else cap
    return f", {batch:.0f} of {limit} running" + (": below the cap" if batch < RUNNING_CAP_HELD * limit else "")


def run_app(app: typer.Typer, argv: list[str] | None = None, prog_name: str = "graphmode") -> None:
    """Run ``app``; a command whose extra is not installed says which one to install, not an ImportError."""
    args = sys.argv[1:] if argv is None else argv
    try:
        app(args, prog_name=prog_name)
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root not in EXTRA_OF_MODULE:
            raise
        command = next((a for a in args if a in EXTRA_OF_COMMAND), None)
        extra = EXTRA_OF_COMMAND[command] if command else EXTRA_OF_MODULE[root]
        err_console.print(f"error: {'graphmode ' + command if command else 'this command'} needs the [{extra}] "
                          f"extra ({root} is not installed): pip install 'graphmode[{extra}]'",
                          markup=False, highlight=False, soft_wrap=True)
        sys.exit(EXIT_ERROR)


def parse_modes(value: str | None) -> list[CudaGraphMode]:
    if not value:
        return list(CudaGraphMode)
    try:
        modes = [parse_mode(v) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"--modes: {exc}") from None
    if not modes:
        raise ConfigError("--modes: no mode given")
    return list(dict.fromkeys(modes))


def vllm_invocation(ctx_args: list[str], vllm_cmd: str | None, default_command: list[str], *,
                    need_model: bool) -> tuple[list[str], list[str]]:
    """(command prefix, vLLM args) from a subcommand's ``--vllm-cmd`` and what follows ``--``."""
    import shlex

    from graphmode.vllm_args import model_arg

    vllm_args = list(ctx_args)
    if vllm_args and vllm_args[0] == "--":
        vllm_args = vllm_args[1:]
    command = shlex.split(vllm_cmd) if vllm_cmd else list(default_command)
    if not command:
        raise ConfigError("--vllm-cmd is empty")
    if need_model and model_arg(command, vllm_args) is None:
        raise ConfigError("no model in the vLLM args: pass e.g. `-- --model DIR` after the options")
    return command, vllm_args
