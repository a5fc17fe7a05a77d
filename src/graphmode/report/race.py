"""The report's race section: each mode against vLLM's default as the races decided it, per model shape.

The verdicts are the model card's (``card.race``, :mod:`graphmode.selector.verdicts`): the ones the
recommender acts on. Pooled verdicts only; the A/A arm (a second engine start of the default) is listed
after the modes, since its ratio is the engine-start effect every one-start verdict carries, and last the
default's round-to-round spread inside one start (``card.race_noise``): what the clock alone moves. Under
the tables, each mode over every race of the model (``verdicts.across_races``: one race one sample, each its
own engine starts), with the A/A arms' row as its control.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from graphmode.selector.card import ModelCard
from graphmode.selector.noise import RaceNoise, noise_for
from graphmode.selector.verdicts import AcrossRaces, RaceVerdict, across_aa_arms, across_races

CONTROL = "CONTROL"


def shape_names(card: ModelCard) -> dict[str, str]:
    out = {}
    for s in card.shapes:
        arch, params = s.get("model_architecture") or "?", s.get("num_params_b")
        name = f"{arch} {params:.2f}B" if isinstance(params, int | float) else str(arch)
        out[str(s.get("model_config_hash"))] = name
    return out


def tables(card: ModelCard) -> list[tuple[str, list[str], list[list[str]]]]:
    """(shape name, header, rows) per raced shape: mode and one cell per metric (n rounds, s engine starts)."""
    pooled: dict[tuple[str, int | None, int | None], list[RaceVerdict]] = defaultdict(list)
    for v in card.race:
        if v.workload is None:
            pooled[v.pool].append(v)
    names = shape_names(card)
    lengths: dict[str, set[int | None]] = defaultdict(set)
    for shape, length, _ in pooled:
        lengths[shape].add(length)
    out = []
    for (shape, length, servers), vs in sorted(pooled.items(), key=lambda kv: (names.get(kv[0][0], kv[0][0]),
                                                                               kv[0][1] or 0, kv[0][2] or 1)):
        metrics = sorted({v.metric for v in vs})
        by = {(v.mode, v.metric): v for v in vs}
        modes = sorted({v.mode for v in vs}, key=lambda m: (m == CONTROL, m))
        rows = [[("A/A: 2nd start of the default" if m == CONTROL else m),
                 *(by[(m, k)].cell() if (m, k) in by else "–" for k in metrics)] for m in modes]
        wander = {k: n for k in metrics if (n := noise_for(card.race_noise, shape, k)) and n.wander_cv_pct is not None}
        if wander:
            rows.append(["the default again, same start: round-to-round CV",
                         *(_wander_cell(wander[k]) if k in wander else "–" for k in metrics)])
        # a shape raced at several max_model_len gets a table per length (its pools: selector.verdicts)
        at = f" at max_model_len={length}" if len(lengths[shape]) > 1 and length is not None else ""
        at += f" with {servers} API servers" if servers else ""
        out.append((names.get(shape, shape) + at, ["mode", *metrics], rows))
    return out


def across(card: ModelCard) -> tuple[list[str], list[list[str]]] | None:
    """(header, rows) of each mode against the default over the model's races, and the A/A arms' row; None
    with fewer than three races for every mode and metric."""
    pooled = [v for v in card.race if v.workload is None]
    metrics = sorted({v.metric for v in pooled})
    modes = sorted({v.mode for v in pooled if v.mode != CONTROL and not v.runs_as})
    delta = pooled[0].delta if pooled else 0.03
    confidence = pooled[0].confidence if pooled else 0.95
    rows = [[m, *(_across_cell(across_races(pooled, m, k, delta=delta, confidence=confidence)) for k in metrics)]
            for m in modes]
    rows.append(["A/A arms (the control: truth 1)",
                 *(_across_cell(across_aa_arms(pooled, k, delta=delta, confidence=confidence)) for k in metrics)])
    if all(c == "–" for r in rows for c in r[1:]):
        return None
    return ["mode", *metrics], rows


def _across_cell(a: AcrossRaces | None) -> str:
    return "–" if a is None else f"{a.verdict} {a.ratio:.3f}× [{a.lo:.2f}–{a.hi:.2f}] races={a.races}"


def _wander_cell(n: RaceNoise) -> str:
    span = f", ≤ {n.wander_minutes:g} min" if n.wander_minutes else ""
    return f"{n.wander_cv_pct:.1f}% (n={n.wander_rounds}{span})"


def markdown(card: ModelCard) -> list[str]:
    if not card.race:
        return []
    lines = ["", "## Races: each mode against vLLM's default (ratio, 95% interval, n rounds, s engine starts)", ""]
    for name, head, rows in tables(card):
        lines += [f"**{name}**", "", _md_row(head), _md_row(["---"] * len(head)), *(_md_row(r) for r in rows), ""]
    if (over := across(card)) is not None:
        head, rows = over
        lines += ["**Across races** (t interval over the races' ratios, one race one sample)", "",
                  _md_row(head), _md_row(["---"] * len(head)), *(_md_row(r) for r in rows), ""]
    return lines[:-1]


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
