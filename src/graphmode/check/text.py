"""A check report as lines for a terminal (the CLI and ``launch`` print these)."""

from __future__ import annotations

import shlex

from graphmode.check.findings import CheckReport

_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 12 else f"{sizes[0]}, {sizes[1]}, ... {sizes[-1]} ({len(sizes)})"


def report_lines(report: CheckReport, *, markup: bool = True) -> list[str]:
    """The resolved configuration, then each finding with its evidence and fix."""
    r, c = report.resolved, report.resolved.cost

    def tag(sev: str) -> str:
        return f"[{_STYLE[sev]}]{sev.upper()}[/]" if markup else sev.upper()

    mode = r.mode if r.mode == r.requested_mode else f"{r.mode} (asked: {r.requested_mode})"
    lines = [f"vLLM {r.vllm_version or '(release not given)'}: cudagraph_mode {mode}; max_num_seqs {r.max_num_seqs} "
             f"({r.max_num_seqs_source}), max_num_batched_tokens {r.max_num_batched_tokens}",
             f"capture list: {_sizes(r.capture_sizes) or 'none'}"]
    if r.decode_graph_sizes != r.capture_sizes:
        lines.append(f"FULL decode graphs (multiples of {r.decode_query_len}): {_sizes(r.decode_graph_sizes)}")
    if c.capture_s is not None:
        lines.append(f"predicted: {c.capture_s:.1f} s capture, "
                     f"{'-' if c.graph_gib is None else f'{c.graph_gib:.2f}'} GiB graphs, "
                     f"{'-' if c.kv_tokens is None else f'{c.kv_tokens:,}'} KV cache tokens")
    for f in report.findings:
        lines.append(f"{tag(f.severity)} {f.code}: {f.message}")
        ev = f.evidence
        lines.append(f"    rule: {ev.rule} ({ev.vllm_source})")
        if ev.measured:
            lines.append(f"    measured: {ev.measured}")
        lines += [f"    reported: {rep}" for rep in ev.reports]
        if f.fix:
            lines.append(f"    fix: {shlex.join(f.fix)}")
        if f.drop:
            lines.append(f"    fix: remove {' '.join(f.drop)}")
    errors = report.errors
    lines.append(f"{'FAIL' if errors else 'ok'}: {errors} error(s), "
                 f"{sum(f.severity == 'warning' for f in report.findings)} warning(s)")
    return lines
