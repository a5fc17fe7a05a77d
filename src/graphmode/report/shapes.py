"""Model-shape names for the report: the ``models/shapes`` file stems and the labels built from a shape."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphmode.selector.aggregate import finite_number


def known_shape_names(shapes_dir: Path | None) -> dict[str, str]:
    """config hash -> file stem of each ``models/shapes/*.json`` (hashed as the fingerprint does)."""
    out: dict[str, str] = {}
    if shapes_dir is None or not shapes_dir.is_dir():
        return out
    for p in sorted(shapes_dir.glob("*.json")):
        try:
            cfg = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(cfg, dict):
            out[hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]] = p.stem
    return out


def shape_labels(shape: Mapping[str, Any], names: Mapping[str, str]) -> tuple[str, str]:
    """(long label, short label) of a model shape."""
    arch = shape.get("model_architecture") or "unknown architecture"
    p = finite_number(shape.get("num_params_b"))
    dims = "×".join(str(shape.get(k)) for k in ("num_layers", "hidden_size") if shape.get(k) is not None)
    detail = ", ".join(x for x in (str(arch), f"{p:.2f}B params" if p else "", f"{dims} layers×hidden" if dims
                                   else "") if x)
    name = names.get(str(shape.get("model_config_hash") or ""))
    short = name or (f"{arch} {p:.2g}B" if p else str(arch))
    return (f"{name} ({detail})" if name else detail), short
