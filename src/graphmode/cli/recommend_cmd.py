"""``graphmode recommend``: the best CUDA Graph mode for some traffic; ``graphmode models``: the registry."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from graphmode.cli.common import (
    NARROW,
    WORKLOAD_FLAGS,
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


def _deployment(vllm_args: str, model_path: str | None) -> Any:
    """The deployment's configuration from --vllm-args (+ --model-path's config.json, this environment)."""
    import os
    import shlex

    from graphmode.core.deployment import DeploymentConfig, DeploymentError
    from graphmode.core.fingerprint import load_model_config

    try:
        argv = shlex.split(vllm_args)
    except ValueError as exc:
        raise ConfigError(f"--vllm-args: {exc}") from None
    served = load_model_config(model_path) if model_path else None
    try:
        return DeploymentConfig.from_vllm_args(argv, dict(os.environ), served)
    except DeploymentError as exc:
        raise ConfigError(f"--vllm-args: {exc}") from None


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


def _complete(answer: Recommendation, rec: Any, steps: Any, vllm_args: str | None, model_path: str | None,
              budget: Any, description: Any = None) -> Recommendation:
    import shlex

    from graphmode.core.fingerprint import load_model_config
    from graphmode.selector.graphconfig import complete

    served = load_model_config(model_path) if model_path else None
    return complete(answer, step_sizes=steps, vllm_args=shlex.split(vllm_args or ""), served_config=served,
                    budget=budget, model_folder=rec.folder, description=description)


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
    for n in rec.notes:
        console.print(f"[dim]note: {escape(terminal_safe(n))}[/]", highlight=False)
    for w in rec.warnings:
        console.print(f"[bold yellow]warning:[/] {escape(terminal_safe(w))}", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def recommend(
        rate: Annotated[
            float | None, typer.Option("--rate", help="Arrival rate, req/s (workload description).")
        ] = None,
        burstiness: Annotated[
            float, typer.Option("--burstiness", help="Gamma shape of arrivals; 1 = Poisson.")
        ] = 1.0,
        input_tokens: Annotated[
            float | None, typer.Option("--input-tokens", help="Mean prompt tokens.")
        ] = None,
        output_tokens: Annotated[
            float | None, typer.Option("--output-tokens", help="Mean generated tokens.")
        ] = None,
        concurrency: Annotated[
            int | None, typer.Option("--concurrency", help="Client-side cap on requests in flight.")
        ] = None,
        features: Annotated[
            str | None, typer.Option("--features", help="Observed features as JSON (or @file).")
        ] = None,
        server: Annotated[
            str | None, typer.Option("--server", help="Live vLLM server URL: scrape its /metrics.")
        ] = None,
        window: Annotated[float, typer.Option("--window", help="Seconds to scrape --server for.")] = 30.0,
        interval: Annotated[float, typer.Option("--interval", help="Seconds between scrapes.")] = 1.0,
        objective: Annotated[
            str | None,
            typer.Option(
                "--objective",
                help="Metric to optimise (itl_p50, ttft_p99, throughput, ...). Default: the model's.",
            ),
        ] = None,
        constraint: Annotated[
            list[str] | None, typer.Option("--constraint", help="e.g. 'ttft_p99<=200ms'. Repeatable.")
        ] = None,
        memory_weight: Annotated[
            float, typer.Option("--memory-weight", help="Relative cost of 1 GiB graph memory.")
        ] = 0.0,
        startup_weight: Annotated[
            float, typer.Option("--startup-weight", help="Relative cost of 1 s of startup.")
        ] = 0.0,
        max_graph_gib: Annotated[
            float | None, typer.Option("--max-graph-gib", help="Constraint: graph memory ≤ this.")
        ] = None,
        max_startup_s: Annotated[
            float | None, typer.Option("--max-startup-s", help="Constraint: startup seconds ≤ this.")
        ] = None,
        model_id: Annotated[
            str | None, typer.Option("--model-id", help="Use this model (default: best fingerprint match).")
        ] = None,
        models_dir: Annotated[
            Path | None, typer.Option("--models-dir", help="Registry root (default: settings).")
        ] = None,
        gpu: Annotated[
            str | None, typer.Option("--gpu", help="Target GPU name (default: this host's, via NVML).")
        ] = None,
        vllm_version: Annotated[
            str | None, typer.Option("--vllm-version", help="Target vLLM version.")
        ] = None,
        model_path: Annotated[
            str | None, typer.Option("--model-path", help="Target model: its directory or its config.json.")
        ] = None,
        strict: Annotated[
            bool, typer.Option("--strict", help="Fail instead of warning when the model is stale.")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
        step_sizes: Annotated[
            str | None, typer.Option("--step-sizes", help="Tokens per step (StepSizes JSON or @file): "
                                     "also choose cudagraph_capture_sizes. --server measures them.")
        ] = None,
        vllm_args: Annotated[
            str | None, typer.Option("--vllm-args", help="The deployment's vLLM args (one string): modes vLLM "
                                     "would downgrade there are not recommended, and a "
                                     "configuration (TP, attention backend, quantization, speculative "
                                     "decoding) unlike the trained ones is reported.")
        ] = None,
        capture_max_sizes: Annotated[
            int | None, typer.Option("--capture-max-sizes", min=1, help="Budget: at most this many sizes.")
        ] = None,
        capture_max_s: Annotated[
            float | None, typer.Option("--capture-max-s", help="Budget: predicted capture seconds.")
        ] = None,
        capture_max_gib: Annotated[
            float | None, typer.Option("--capture-max-gib", help="Budget: predicted graph GiB.")
        ] = None,
        capture_keep: Annotated[
            str | None, typer.Option("--capture-keep", help="Capture sizes kept whatever the window saw, up to "
                                     "the largest chosen: '1,2,4,8' (the default) or 'none'.")
        ] = None,
        capture_max_pad_ratio: Annotated[
            float | None, typer.Option("--capture-max-pad-ratio", help="The most any step up to the largest "
                                       "size may be padded, seen in the window or not, as a factor (default "
                                       "1.25; 0 for no bound).")
        ] = None,
    ) -> None:
        """Recommend a CUDA Graph mode from observed features, a workload description or a live server."""
        from graphmode.selector.describe import WorkloadDescription
        from graphmode.selector.objective import make_objective
        from graphmode.selector.recommend import Recommender
        from graphmode.selector.registry import target_fingerprint

        with handle_errors():
            steps = _read_step_sizes(step_sizes) if step_sizes is not None else None
            keep = _read_keep(capture_keep) if capture_keep is not None else None
            budget = _budget(capture_max_sizes, capture_max_s, capture_max_gib, keep, capture_max_pad_ratio)
            described = rate is not None or input_tokens is not None or output_tokens is not None
            given = sum([described, features is not None, server is not None])
            if given != 1:
                raise ConfigError(
                    "give exactly one input: --rate/--input-tokens/--output-tokens, --features "
                    "JSON, or --server URL"
                )
            inputs: Any
            if described:
                if rate is None or input_tokens is None or output_tokens is None:
                    raise ConfigError(
                        "a workload description needs --rate, --input-tokens and --output-tokens"
                    )
                try:
                    inputs = WorkloadDescription(
                        rate=rate,
                        burstiness=burstiness,
                        input_tokens=input_tokens,
                        output_tokens=output_tokens,
                        concurrency=concurrency,
                    )
                except ValueError as exc:
                    raise ConfigError(f"workload description: {validation_message(exc, WORKLOAD_FLAGS)}") from None
            elif features is not None:
                from pydantic import ValidationError

                from graphmode.core.records import ObservedFeatures
                from graphmode.service.schemas import FeaturesIn

                try:
                    # The service's rules: finite, >= 0, within each feature's range, one traffic feature.
                    inputs = ObservedFeatures.model_validate(
                        FeaturesIn.model_validate(_read_features(features)).model_dump(exclude_unset=True)
                    )
                except ValidationError as exc:
                    first = exc.errors()[0]
                    where = ".".join(map(str, first["loc"]))
                    raise ConfigError(
                        f"--features: {where + ': ' if where else ''}{first['msg']} "
                        f"(known: {', '.join(ObservedFeatures.model_fields)})"
                    ) from None
            obj_args = dict(
                memory_weight=memory_weight,
                startup_weight=startup_weight,
                max_graph_gib=max_graph_gib,
                max_startup_s=max_startup_s,
            )
            target = target_fingerprint(
                server_url=server, model_path=model_path, gpu_name=gpu, vllm_version=vllm_version
            )
            rec = Recommender.load(models_dir, model_id, target=target, strict=strict)
            if vllm_args is not None:
                rec = rec.for_deployment(_deployment(vllm_args, model_path))
            obj = (
                make_objective(objective, constraint or [], **obj_args)  # type: ignore[arg-type]
                if (objective or constraint or any(v for v in obj_args.values()))
                else None
            )
            if obj is not None and objective is None:
                obj = obj.model_copy(update={"metric": rec.default_objective.metric})
            if server is not None:
                from graphmode.selector.live import observe_server

                console.print(f"scraping {server} for {window:g} s ...", highlight=False)
                windows: list[Any] = []
                inputs = observe_server(server, window, interval, windows=windows)
                from graphmode.service.schemas import TRAFFIC_FEATURES

                if all(getattr(inputs, n) is None for n in TRAFFIC_FEATURES):  # as the service answers it
                    raise ConfigError(
                        f"no vLLM traffic metrics were observed at {server} ({inputs.n_samples or 0} scrapes): "
                        "is it a vLLM server?"
                    )
                if step_sizes is None and windows:
                    steps = windows[0].step_sizes()
            answer = rec.recommend(inputs, obj, source="server" if server is not None else None)
            if steps is not None or vllm_args is not None or described:
                answer = _complete(answer, rec, steps, vllm_args, model_path, budget, inputs if described else None)
            if as_json:
                out_console.print_json(json.dumps(answer.model_dump(mode="json")))
            else:
                print_recommendation(answer, out_console)

    @app.command()
    def models(
        models_dir: Annotated[
            Path | None, typer.Option("--models-dir", help="Registry root (default: settings).")
        ] = None,
        model_id: Annotated[str | None, typer.Option("--model-id", help="Print this model's card.")] = None,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """List the models in the registry (or print one card), with staleness against this host."""
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
