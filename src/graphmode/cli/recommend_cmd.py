"""``graphmode recommend``: the best CUDA Graph mode for some traffic; ``graphmode models``: the registry."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from graphmode.cli.common import (
    NARROW,
    WORKLOAD_FLAGS,
    VllmArgsCommand,
    handle_errors,
    read_at_file,
    terminal_safe,
    validation_message,
    whole_column,
)
from graphmode.core.errors import ConfigError

if TYPE_CHECKING:
    from graphmode.selector.recommend import Recommendation

console = Console(stderr=True)
# Piped output (CI logs, files) gets a width that fits the tables instead of rich's 80 columns.
out_console = Console(width=None if sys.stdout.isatty() else 150)

# Columns of the human-readable table: (metric, header, scale, format).
_COLUMNS: tuple[tuple[str, str, float, str], ...] = (
    ("ttft_p50", "TTFT p50 ms", 1e3, "{:.1f}"),
    ("ttft_p99", "TTFT p99 ms", 1e3, "{:.1f}"),
    ("itl_p50", "ITL p50 ms", 1e3, "{:.2f}"),
    ("itl_p99", "ITL p99 ms", 1e3, "{:.2f}"),
    ("e2e_p50", "E2E p50 s", 1.0, "{:.3f}"),
    ("output_tok_s", "tok/s", 1.0, "{:.0f}"),
    ("graph_gib", "graph GiB", 1.0, "{:.2f}"),
    ("startup_s", "startup s", 1.0, "{:.0f}"),
)



def _shape_label(shape: dict[str, Any]) -> str:
    """``LlamaForCausalLM 8.0B``, ``... 8.0B [tp=2]``: two shapes, or two configurations of one, stay tellable
    apart (a default configuration adds nothing)."""
    from graphmode.core.deployment import config_suffix

    arch = str(shape.get("model_architecture") or "?")
    params = shape.get("num_params_b")
    label = f"{arch} {params:.1f}B" if isinstance(params, int | float) else arch
    suffix = config_suffix(shape)
    return f"{label} [{suffix}]" if suffix else label

def _fmt(v: float | None, scale: float, fmt: str) -> str:
    return "-" if v is None else fmt.format(v * scale)


def _read_features(text: str) -> dict[str, Any]:
    raw = read_at_file(text, "--features")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--features is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ConfigError("--features must be a JSON object of observed features")
    return value


def _read_step_sizes(text: str) -> Any:
    from pydantic import ValidationError

    from graphmode.core.records import StepSizes

    raw = read_at_file(text, "--step-sizes")
    try:
        return StepSizes.model_validate_json(raw)
    except ValidationError as exc:
        raise ConfigError(f"--step-sizes is not a StepSizes JSON object: {exc.errors()[0]['msg']}") from None


def _deployment(argv: list[str], served: dict[str, Any] | None) -> Any:
    """The deployment's configuration from its vLLM args (+ the served config.json, this environment)."""
    import os

    from graphmode.core.deployment import DeploymentConfig, DeploymentError

    try:
        return DeploymentConfig.from_vllm_args(argv, dict(os.environ), served)
    except DeploymentError as exc:
        raise ConfigError(f"vLLM args: {exc}") from None


def _read_keep(text: str) -> tuple[int, ...]:
    from graphmode.selector.capture import parse_keep

    try:
        return parse_keep(text)
    except ValueError as exc:
        raise ConfigError(f"--capture-keep: {exc}") from None


def _budget(max_sizes: int | None, max_s: float | None, max_gib: float | None, keep: tuple[int, ...] | None,
            pad_ratio: float | None) -> Any:
    from pydantic import ValidationError

    from graphmode.selector.capture import CaptureBudget

    try:
        return CaptureBudget(max_sizes=max_sizes, max_capture_s=max_s, max_graph_gib=max_gib,
                             always_keep=None if keep is None else list(keep), max_pad_ratio=pad_ratio)
    except ValidationError as exc:
        err = exc.errors()[0]
        flag = {"max_capture_s": "--capture-max-s", "max_graph_gib": "--capture-max-gib",
                "max_pad_ratio": "--capture-max-pad-ratio"}.get(str(err["loc"][0]), "--capture-*")
        raise ConfigError(f"{flag}: {err['msg']}") from None


_MODEL_COLUMNS = ("model id", "GPU", "vLLM", "shapes", "rows", "workloads", "modes", "CV regret", "vs default",
                  "here")
# Narrower than this, ``models`` prints a block per model instead of a table (ten columns do not fit 80).
MODELS_TABLE_MIN_WIDTH = 120


def _print_model_blocks(root: Path, entries: list[Any], cells: list[list[str] | None]) -> None:
    """``models`` for a narrow terminal: each model's id whole on its own line, its facts below."""
    out_console.print(f"Models under {escape(str(root))}", highlight=False)
    for e, row in zip(entries, cells, strict=True):
        if row is None:
            out_console.print(f"\n[bold]{escape(e.model_id)}[/]\n  [red]broken: {escape(str(e.error))}[/]",
                              highlight=False)
            continue
        facts = ", ".join(f"{name} {value}" for name, value in zip(_MODEL_COLUMNS[1:], row[1:], strict=True)
                          if name != "shapes")
        shapes = row[3].replace("\n", ", ")
        out_console.print(f"\n[bold]{escape(row[0])}[/]\n  {escape(facts)}\n  shapes: {escape(shapes)}",
                          highlight=False)


def _model_cells(e: Any, m: Any) -> list[str]:
    """The ``models`` table's row for a registry entry with a card (``m``: its match against this host)."""
    c = e.card
    s = c.cv.summaries[0] if c.cv.summaries else None
    return [
        c.model_id + (" (synthetic)" if c.synthetic else ""),
        c.gpu_name or "-",
        c.vllm_version or "-",
        "\n".join(_shape_label(x) for x in c.shapes),  # one shape a line: each label stays whole
        str(c.dataset.rows_used),
        str(c.dataset.n_workloads),
        str(len(c.modes)),
        "-" if s is None or s.mean_regret_pct is None else f"{s.mean_regret_pct:.1f}%",
        "-" if s is None or s.mean_gain_vs_default_pct is None else f"{s.mean_gain_vs_default_pct:+.1f}%",
        m.kind + (" (stale)" if m.stale else ""),
    ]


def print_recommendation(rec: Recommendation, console: Console) -> None:
    metric = rec.objective.metric
    t = Table(title=f"Predicted per mode — objective: {rec.objective_description}", title_justify="left", **NARROW)
    whole_column(t, "mode", [str(p.mode) for p in rec.predictions])
    cols = [c for c in _COLUMNS if any(p.metrics.get(c[0]) is not None for p in rec.predictions)]
    for m, header, scale, fmt in cols:
        whole_column(t, header, [_fmt(p.metrics.get(m), scale, fmt) for p in rec.predictions], justify="right")
    t.add_column("", justify="left", overflow="fold")
    for p in rec.predictions:
        flags = []
        if p.mode == rec.mode:
            flags.append("◀ chosen")
        elif p.tied:
            flags.append("tie")
        if p.mode == rec.default_mode:
            flags.append("vLLM default")
        if p.status == "violates":
            flags.append("violates: " + "; ".join(p.violations))
        elif p.status == "unverified":
            flags.append("constraints unverified")
        name = f"[bold green]{p.mode}[/]" if p.mode == rec.mode else p.mode
        cells = []
        for m, _, scale, fmt in cols:
            cell = _fmt(p.metrics.get(m), scale, fmt)
            cells.append(f"[bold]{cell}[/]" if m == metric else cell)
        t.add_row(name, *cells, ", ".join(flags))
    console.print(t)
    console.print(
        f"[bold]mode:[/] [bold green]{rec.mode}[/]    --compilation-config '{rec.compilation_config}'",
        highlight=False,
    )
    if rec.gain_vs_default_pct is not None and rec.mode != rec.default_mode:
        sig = "" if rec.gain_significant else " [yellow](within noise)[/]"
        console.print(
            f"[bold]expected gain vs {rec.default_mode}:[/] {rec.gain_vs_default_pct:+.1f}% on {metric}{sig}",
            highlight=False,
        )
    elif rec.mode == rec.default_mode:
        others = [m for m in rec.ties if m != rec.mode]
        tail = f" (tied within noise: {', '.join(others)})" if others else ""
        console.print(f"[bold]vLLM's default is the answer[/]{tail}", highlight=False)
    c = rec.confidence
    margin = "-" if c.margin_sigma is None else f"{c.margin_sigma:.1f}σ over {c.runner_up}"
    dist = "-" if c.distance_ratio is None else f"{c.distance_ratio:.1f}× usual spacing"
    colour = {"high": "green", "medium": "yellow", "low": "red"}[c.level]
    console.print(
        f"[bold]confidence:[/] [{colour}]{c.level}[/] (margin {margin}; distance to profiled data "
        f"{dist})" + (": " + "; ".join(c.reasons) if c.reasons else ""),
        highlight=False,
    )
    console.print(
        f"[dim]model {rec.model_id} (fingerprint {', '.join(rec.fingerprint_keys)}, match: "
        f"{rec.fingerprint_match}); features from {rec.features_source}[/]",
        highlight=False,
    )
    if rec.capture is not None:
        from graphmode.selector.graphconfig import capture_lines

        for line in capture_lines(rec.capture):
            console.print(line, highlight=False)
    cautions = {f.text for f in rec.cautions()}
    for n in rec.notes:  # the findings' texts in order, then what completing the answer added
        if n in cautions:
            console.print(f"[bold yellow]caution:[/] {escape(terminal_safe(n))}", highlight=False)
        else:
            console.print(f"[dim]note: {escape(terminal_safe(n))}[/]", highlight=False)
    for w in rec.warnings:
        console.print(f"[bold yellow]warning:[/] {escape(terminal_safe(w))}", highlight=False)


@dataclass(frozen=True)
class RecommendOptions:
    """The options of ``graphmode recommend`` as given."""

    rate: float | None = None
    burstiness: float = 1.0
    input_tokens: float | None = None
    output_tokens: float | None = None
    concurrency: int | None = None
    features: str | None = None
    server: str | None = None
    window: float = 30.0
    interval: float = 1.0
    objective: str | None = None
    constraint: list[str] | None = None
    memory_weight: float = 0.0
    startup_weight: float = 0.0
    max_graph_gib: float | None = None
    max_startup_s: float | None = None
    model_id: str | None = None
    models_dir: Path | None = None
    gpu: str | None = None
    vllm_version: str | None = None
    model_path: str | None = None
    strict: bool = False
    as_json: bool = False
    step_sizes: str | None = None
    vllm_args: str | None = None
    capture_max_sizes: int | None = None
    capture_max_s: float | None = None
    capture_max_gib: float | None = None
    capture_keep: str | None = None
    capture_max_pad_ratio: float | None = None


def _vllm_argv(opts: RecommendOptions, tail: list[str]) -> list[str] | None:
    """The deployment's vLLM args: --vllm-args, then what follows ``--`` (None: neither was given)."""
    import shlex

    if tail and tail[0] == "--":
        tail = tail[1:]
    if opts.vllm_args is None and not tail:
        return None
    try:
        head = shlex.split(opts.vllm_args or "")
    except ValueError as exc:
        raise ConfigError(f"--vllm-args: {exc}") from None
    return [*head, *tail]


def _served_model(opts: RecommendOptions, argv: list[str] | None) -> str | None:
    """The served model's config: --model-path, else the vLLM args' --model (a local directory, or the model's
    snapshot in the Hugging Face cache). A --model whose config cannot be read is an error, not ignored."""
    from graphmode.control.target import hub_config
    from graphmode.vllm_args import model_arg

    model = model_arg([], argv) if argv else None
    if opts.model_path is not None or model is None:
        return opts.model_path
    local = Path(model).expanduser()
    if local.exists():
        return str(local)
    cached = hub_config(model)
    if cached is None:
        raise ConfigError(f"--model {model} in the vLLM args: neither a local directory nor in the Hugging Face "
                          "cache, so its shape cannot be read; pass --model-path DIR (its config.json)")
    return str(cached)


def _inputs(opts: RecommendOptions) -> Any:
    """The workload description or the observed features given (None: --server gives them)."""
    from pydantic import ValidationError

    from graphmode.core.records import ObservedFeatures
    from graphmode.selector.describe import WorkloadDescription

    described = opts.rate is not None or opts.input_tokens is not None or opts.output_tokens is not None
    if sum([described, opts.features is not None, opts.server is not None]) != 1:
        raise ConfigError("give exactly one input: --rate/--input-tokens/--output-tokens, --features JSON, or "
                          "--server URL")
    if described:
        if opts.rate is None or opts.input_tokens is None or opts.output_tokens is None:
            raise ConfigError("a workload description needs --rate, --input-tokens and --output-tokens")
        try:
            return WorkloadDescription(rate=opts.rate, burstiness=opts.burstiness, input_tokens=opts.input_tokens,
                                       output_tokens=opts.output_tokens, concurrency=opts.concurrency)
        except ValueError as exc:
            raise ConfigError(f"workload description: {validation_message(exc, WORKLOAD_FLAGS)}") from None
    if opts.features is None:
        return None
    # the service's schema (its import reaches the scraping code, the profile extra): only for --features
    from graphmode.service.schemas import FeaturesIn

    try:  # the service's rules: finite, >= 0, within each feature's range, one traffic feature
        return ObservedFeatures.model_validate(
            FeaturesIn.model_validate(_read_features(opts.features)).model_dump(exclude_unset=True))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ConfigError(f"--features: {where + ': ' if where else ''}{first['msg']} "
                          f"(known: {', '.join(ObservedFeatures.model_fields)})") from None


def _objective(opts: RecommendOptions, default_metric: str) -> Any:
    from graphmode.selector.objective import make_objective

    weights = dict(memory_weight=opts.memory_weight, startup_weight=opts.startup_weight,
                   max_graph_gib=opts.max_graph_gib, max_startup_s=opts.max_startup_s)
    if not (opts.objective or opts.constraint or any(v for v in weights.values())):
        return None
    return make_objective(opts.objective or default_metric, opts.constraint or [], **weights)  # type: ignore[arg-type]


def _observe(opts: RecommendOptions) -> tuple[Any, Any]:
    """Features scraped from --server over --window, and the step sizes its first window saw."""
    from graphmode.selector.live import observe_server
    from graphmode.service.schemas import TRAFFIC_FEATURES

    assert opts.server is not None
    console.print(f"scraping {opts.server} for {opts.window:g} s ...", highlight=False)
    windows: list[Any] = []
    inputs = observe_server(opts.server, opts.window, opts.interval, windows=windows)
    if all(getattr(inputs, n) is None for n in TRAFFIC_FEATURES):  # as the service answers it
        raise ConfigError(f"no vLLM traffic metrics were observed at {opts.server} ({inputs.n_samples or 0} "
                          "scrapes): is it a vLLM server?")
    return inputs, (windows[0].step_sizes() if windows else None)


def run_recommend(opts: RecommendOptions, tail: list[str]) -> Recommendation:
    """The answer for ``graphmode recommend``'s options and its ``--`` tail, through the one decision path."""
    from graphmode.core.fingerprint import load_model_config
    from graphmode.selector.decide import Request, decide
    from graphmode.selector.recommend import Recommender
    from graphmode.selector.registry import target_fingerprint

    steps = _read_step_sizes(opts.step_sizes) if opts.step_sizes is not None else None
    keep = _read_keep(opts.capture_keep) if opts.capture_keep is not None else None
    budget = _budget(opts.capture_max_sizes, opts.capture_max_s, opts.capture_max_gib, keep,
                     opts.capture_max_pad_ratio)
    inputs = _inputs(opts)
    argv = _vllm_argv(opts, tail)
    model_path = _served_model(opts, argv)
    target = target_fingerprint(server_url=opts.server, model_path=model_path, gpu_name=opts.gpu,
                                vllm_version=opts.vllm_version)
    rec = Recommender.load(opts.models_dir, opts.model_id, target=target, strict=opts.strict)
    obj = _objective(opts, rec.default_objective.metric)
    if opts.server is not None:
        inputs, seen = _observe(opts)
        steps = steps if steps is not None else seen
    served = load_model_config(model_path) if model_path else None
    deployment = _deployment(argv, served) if argv is not None else None
    return decide(rec, Request(inputs=inputs, objective=obj, source="server" if opts.server else None,
                               vllm_args=argv, served_config=served, deployment=deployment, step_sizes=steps,
                               budget=budget))


# The options of ``graphmode recommend``, declared once here so that the command reads as its signature.
_Rate = Annotated[float | None, typer.Option("--rate", help="Arrival rate, req/s (workload description).")]
_Burst = Annotated[float, typer.Option("--burstiness", help="Gamma shape of arrivals; 1 = Poisson.")]
_InTok = Annotated[float | None, typer.Option("--input-tokens", help="Mean prompt tokens.")]
_OutTok = Annotated[float | None, typer.Option("--output-tokens", help="Mean generated tokens.")]
_Conc = Annotated[int | None, typer.Option("--concurrency", help="Client-side cap on requests in flight.")]
_Feats = Annotated[str | None, typer.Option("--features", help="Observed features as JSON (or @file).")]
_Server = Annotated[str | None, typer.Option("--server", help="Live vLLM server URL: scrape its /metrics.")]
_Window = Annotated[float, typer.Option("--window", help="Seconds to scrape --server for.")]
_Interval = Annotated[float, typer.Option("--interval", help="Seconds between scrapes.")]
_Obj = Annotated[str | None, typer.Option(
    "--objective", help="Metric to optimise (itl_p50, ttft_p99, throughput, ...). Default: the model's.")]
_Cons = Annotated[list[str] | None, typer.Option("--constraint", help="e.g. 'ttft_p99<=200ms'. Repeatable.")]
_MemW = Annotated[float, typer.Option("--memory-weight", help="Relative cost of 1 GiB graph memory.")]
_StartW = Annotated[float, typer.Option("--startup-weight", help="Relative cost of 1 s of startup.")]
_MaxGib = Annotated[float | None, typer.Option("--max-graph-gib", help="Constraint: graph memory ≤ this.")]
_MaxStart = Annotated[float | None, typer.Option("--max-startup-s", help="Constraint: startup seconds ≤ this.")]
_ModelId = Annotated[str | None, typer.Option("--model-id", help="Use this model (default: best fingerprint match).")]
_ModelsDir = Annotated[Path | None, typer.Option("--models-dir", help="Registry root (default: settings).")]
_Gpu = Annotated[str | None, typer.Option("--gpu", help="Target GPU name (default: this host's, via NVML).")]
_Vllm = Annotated[str | None, typer.Option("--vllm-version", help="Target vLLM version (default: the newest "
                                                                  "profiled release).")]
_ModelPath = Annotated[str | None, typer.Option(
    "--model-path", help="Target model: its directory or its config.json (default: the --model of the vLLM args).")]
_Strict = Annotated[bool, typer.Option("--strict", help="Fail instead of warning when the model is stale.")]
_Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
_Steps = Annotated[str | None, typer.Option("--step-sizes", help="Tokens per step (StepSizes JSON or @file): also "
                                            "choose cudagraph_capture_sizes. --server measures them.")]
_VllmArgs = Annotated[str | None, typer.Option(
    "--vllm-args", help="The deployment's vLLM args as one string (or after --, as launch, profile and watch take "
    "them): modes vLLM would downgrade are not recommended, its --model names the served model, and a configuration "
    "(TP, attention backend, quantization, speculative decoding) unlike the trained ones is reported.")]
_CapSizes = Annotated[int | None, typer.Option("--capture-max-sizes", min=1, help="Budget: at most this many sizes.")]
_CapS = Annotated[float | None, typer.Option("--capture-max-s", help="Budget: predicted capture seconds.")]
_CapGib = Annotated[float | None, typer.Option("--capture-max-gib", help="Budget: predicted graph GiB.")]
_CapKeep = Annotated[str | None, typer.Option("--capture-keep", help="Capture sizes kept whatever the window saw, "
                                              "up to the largest chosen: '1,2,4,8' (the default) or 'none'.")]
_CapPad = Annotated[float | None, typer.Option(
    "--capture-max-pad-ratio", help="The most any step up to the largest size may be padded, seen in the window "
    "or not, as a factor (default 1.25; 0 for no bound).")]


def register(app: typer.Typer) -> None:
    @app.command(cls=VllmArgsCommand,
                 epilog="Everything after -- is the deployment's vLLM args (as --vllm-args).")
    def recommend(
        ctx: typer.Context, rate: _Rate = None, burstiness: _Burst = 1.0, input_tokens: _InTok = None,
        output_tokens: _OutTok = None, concurrency: _Conc = None, features: _Feats = None, server: _Server = None,
        window: _Window = 30.0, interval: _Interval = 1.0, objective: _Obj = None, constraint: _Cons = None,
        memory_weight: _MemW = 0.0, startup_weight: _StartW = 0.0, max_graph_gib: _MaxGib = None,
        max_startup_s: _MaxStart = None, model_id: _ModelId = None, models_dir: _ModelsDir = None,
        gpu: _Gpu = None, vllm_version: _Vllm = None, model_path: _ModelPath = None, strict: _Strict = False,
        as_json: _Json = False, step_sizes: _Steps = None, vllm_args: _VllmArgs = None,
        capture_max_sizes: _CapSizes = None, capture_max_s: _CapS = None, capture_max_gib: _CapGib = None,
        capture_keep: _CapKeep = None, capture_max_pad_ratio: _CapPad = None,
    ) -> None:
        """Recommend a CUDA Graph mode from observed features, a workload description or a live server."""
        opts = RecommendOptions(**{k: v for k, v in locals().items() if k != "ctx"})
        with handle_errors():
            answer = run_recommend(opts, list(ctx.args))
            if as_json:
                out_console.print_json(json.dumps(answer.model_dump(mode="json")))
            else:
                print_recommendation(answer, out_console)

    @app.command()
    def models(
        models_dir: _ModelsDir = None,
        model_id: Annotated[str | None, typer.Option("--model-id", help="Print this model's card.")] = None,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """List the models in the registry (or print one card), with staleness against this host."""
        list_registry(models_dir, model_id, as_json)


def list_registry(models_dir: Path | None, model_id: str | None, as_json: bool) -> None:
    """``graphmode models``: the registry's models (or one card), with staleness against this host."""
    from graphmode.selector.registry import (
        default_models_dir,
        list_models,
        match_card,
        model_card,
        target_fingerprint,
    )

    with handle_errors():
        root = models_dir or default_models_dir()
        if model_id:
            c = model_card(model_id, root)
            out_console.print_json(c.model_dump_json())
            return
        target = target_fingerprint()
        entries = list_models(root)
        if as_json:
            out_console.print_json(
                json.dumps(
                    [
                        {
                            "model_id": e.model_id,
                            "folder": str(e.folder),
                            "error": e.error,
                            "card": e.card.model_dump(mode="json") if e.card else None,
                            "match": match_card(e.card, target).model_dump() if e.card else None,
                        }
                        for e in entries
                    ]
                )
            )
            return
        if not entries:
            out_console.print(f"no models under {root}", highlight=False)
            return
        cells = [_model_cells(e, match_card(e.card, target)) if e.card is not None else None for e in entries]
        if out_console.width < MODELS_TABLE_MIN_WIDTH:
            _print_model_blocks(root, entries, cells)
            return
        t = Table(title=f"Models under {root}", title_justify="left")
        for i, col in enumerate(_MODEL_COLUMNS):
            if i in (0, 3):  # ids copied into --model-id, shape labels (one a line): never cut
                whole_column(t, col, [line for row, e in zip(cells, entries, strict=True)
                                      for line in (e.model_id if row is None else row[i]).splitlines()])
            else:  # folds to make room, never cut either
                t.add_column(col, overflow="fold")
        for e, row in zip(entries, cells, strict=True):
            if row is None:
                t.add_row(e.model_id, f"[red]broken: {escape(str(e.error))}[/]", *[""] * 8)
            else:
                t.add_row(*(escape(x) for x in row))
        out_console.print(t)
