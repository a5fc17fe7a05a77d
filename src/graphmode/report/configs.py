"""The report's configuration axis: rows grouped by deployment configuration and vLLM release.

A configuration is what :func:`graphmode.core.deployment.deployment_of_row` says a row ran under (rows from
before the ``dep_*`` columns: what their own args and log prove, unknown elements staying unknown) plus
the GPU and the vLLM release (``fp_vllm_version`` without a local build tag). Two releases of one model
shape are two configurations: an engine change moves the mode effects, so their race verdicts are
computed apart (:func:`graphmode.selector.verdicts.race_verdicts` on each configuration's rows) and never
pooled.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphmode.core.deployment import deployment_of_row
from graphmode.report.arms import ArmCost, arm_costs
from graphmode.report.shapes import shape_labels
from graphmode.selector.featurize import shape_key, shape_of_row
from graphmode.selector.verdicts import RaceVerdict, race_verdicts

# The verdict cells the summary lists per configuration and shape: (mode, metric).
SUMMARY_CELLS: tuple[tuple[str, str], ...] = (
    ("FULL", "itl_p50"), ("FULL", "ttft_p50"), ("FULL_DECODE_ONLY", "itl_p50"), ("FULL_DECODE_ONLY", "ttft_p50"),
)
CONTROL = "CONTROL"


def release(version: Any) -> str | None:
    """``0.24.0+cu129`` → ``0.24.0``: a local build tag does not make another release."""
    if version is None or str(version).strip() == "":
        return None
    return str(version).split("+", 1)[0].strip()


def config_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Identity of a row's configuration: GPU, vLLM release and every deployment element (unknown ones as
    unknown, so rows that cannot be told apart from a known value are never merged with it)."""
    dep = deployment_of_row(row)
    unknown = set(dep.unknown)

    def part(name: str, value: Any) -> Any:
        return ("?",) if name in unknown else value

    return (
        str(row.get("fp_gpu_name") or "?"),
        release(row.get("fp_vllm_version")) or "?",
        part("attention_backend", dep.attention_backend),
        part("speculative", (dep.speculative_method, dep.speculative_k)),
        part("quantization", dep.quantization),
        part("max_num_seqs", dep.max_num_seqs),
        part("max_model_len", dep.max_model_len),
        part("tensor_parallel_size", dep.tensor_parallel_size),
        part("num_active_params_b", (dep.num_experts, dep.num_experts_per_tok, dep.num_active_params_b)),
        dep.api_server_count if (dep.api_server_count or 1) > 1 else None,
    )


def config_label(key: tuple[Any, ...]) -> str:
    """``H200 · vLLM 0.24.0 · FLASH_ATTN · unquantized · max_model_len 4096`` (defaults left out)."""
    gpu, vllm, backend, spec, quant, seqs, length, tp, moe, *rest = key
    servers = rest[0] if rest else None
    unk = ("?",)
    parts = [re.sub(r"^NVIDIA\s+", "", gpu), f"vLLM {vllm}", "backend ?" if backend in (unk, None) else str(backend)]
    if tp == unk:
        parts.append("TP ?")
    elif tp not in (None, 1):
        parts.append(f"TP={tp}")
    parts.append("quantization ?" if quant == unk else "unquantized" if quant is None else str(quant))
    if spec == unk:
        parts.append("speculative ?")
    elif spec != (None, None):
        method, k = spec
        parts.append(f"{method or '?'}" + (f" k={k}" if k is not None else ""))
    if seqs == unk:
        parts.append("max_num_seqs ?")
    elif seqs is not None:
        parts.append(f"max_num_seqs {seqs}")
    if servers:
        parts.append(f"{servers} API servers")
    if length == unk:
        parts.append("max_model_len ?")
    elif length is not None:
        parts.append(f"max_model_len {length}")
    if moe != unk and moe[0]:
        experts, per_tok, active = moe
        parts.append(f"MoE {experts}×{per_tok or '?'}" + (f", {active:.2g}B active" if active else ""))
    return " · ".join(parts)


@dataclass
class Configuration:
    key: tuple[Any, ...]
    label: str
    slug: str  # the filter's value and the HTML id
    rows: int = 0  # rows of every status
    ok_rows: int = 0
    shapes: dict[str, str] = field(default_factory=dict)  # shape key -> short name
    shape_rows: dict[str, int] = field(default_factory=dict)  # shape key -> ok rows
    verdicts: list[RaceVerdict] = field(default_factory=list)  # this configuration's alone
    costs: dict[str, dict[str, ArmCost]] = field(default_factory=dict)  # shape key -> arm -> memory, start-up

    def raced(self, shape: str | None = None) -> bool:
        return any(v.shape == shape or shape is None for v in self.verdicts)

    def pooled(self, shape: str) -> dict[tuple[str, str], RaceVerdict]:
        """(mode, metric) -> the verdict over every round of ``shape`` in this configuration."""
        return {(v.mode, v.metric): v for v in self.verdicts if v.shape == shape and v.workload is None}

    def tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        """(shape name, header, rows) per raced shape: mode and a verdict cell per raced metric."""
        out = []
        for skey, name in sorted(self.shapes.items(), key=lambda kv: kv[1]):
            by = self.pooled(skey)
            if not by:
                continue
            metrics = sorted({m for _, m in by})
            modes = sorted({mode for mode, _ in by}, key=lambda m: (m == CONTROL, m))
            rows = [[("A/A: 2nd start of the default" if m == CONTROL else m),
                     *(by[(m, k)].cell() if (m, k) in by else "–" for k in metrics)] for m in modes]
            out.append((name, ["mode", *metrics], rows))
        return out


def configurations(rows: Iterable[Mapping[str, Any]], names: Mapping[str, str] | None = None) -> list[Configuration]:
    """Group ``rows`` (deduplicated dataset rows) by configuration and race each group's rows on their own.

    ``names`` maps config hashes to model-shape names (``models/shapes`` file stems).
    """
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[config_key(r)].append(r)
    out: list[Configuration] = []
    for key, grows in groups.items():
        c = Configuration(key, config_label(key), "")
        c.rows = len(grows)
        ok = [r for r in grows if r.get("status") == "ok"]
        c.ok_rows = len(ok)
        skeys: dict[int, str] = {}  # id(row) -> shape key (shape_of_row reads the deployment: once a row)
        for r in grows:
            shape = shape_of_row(r)
            skey = skeys[id(r)] = shape_key(shape)
            c.shapes.setdefault(skey, shape_labels(shape, names or {})[1])
            c.shape_rows[skey] = c.shape_rows.get(skey, 0) + (r.get("status") == "ok")
        c.verdicts = race_verdicts(ok)
        by_shape: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in ok:
            if r.get("race_arm"):
                by_shape[skeys[id(r)]].append(r)
        c.costs = {skey: arm_costs(srows) for skey, srows in by_shape.items()}
        out.append(c)
    out.sort(key=lambda c: (c.key[0], _version_order(c.key[1]), c.label))
    for i, c in enumerate(out):
        c.slug = f"cfg{i}"
    return out


def _version_order(v: str) -> tuple[Any, ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.\-]", v))


# ---------------------------------------------------------------- Markdown (the summary)
def markdown(configs: Sequence[Configuration]) -> list[str]:
    if not configs:
        return []
    head = ["configuration", "shape", "rows", "raced", *(f"{m} {k}" for m, k in SUMMARY_CELLS)]
    lines = ["", "## Configurations: deployment and vLLM release (race verdicts per configuration, never pooled)",
             "", _md_row(head), _md_row(["---"] * len(head))]
    for c in configs:
        for skey, name in sorted(c.shapes.items(), key=lambda kv: kv[1]):
            by = c.pooled(skey)
            cells = [by[(m, k)].cell() if (m, k) in by else "–" for m, k in SUMMARY_CELLS]
            lines.append(_md_row([c.label, name, str(c.shape_rows.get(skey, 0)), "yes" if by else "no", *cells]))
    return lines


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |"
