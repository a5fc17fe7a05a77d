"""A race's measurements as rounds, and the verdicts they give (the race loop and the selector share this).

A cell is (arm, round) → (workload, metric values). An *arm* is a mode raced against the default
(``FULL``, ``NONE``, ...), the default itself, or ``CONTROL``: a second engine of the default raced like a
challenger (the A/A arm). A round's paired observation for an arm is ``ln(arm / default)`` of a metric, on
the round's one workload; :mod:`graphmode.profiling.sequential` turns the observations into verdicts.

Each cell also names its engine start (``race_start_id``), so every observation carries its *block*
(the arm's start, the default's start): with two starts or more of each, the blocks, not the rounds, are
the unit of replication, and the A/A arm's blocks measure how much a start alone moves latency.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphmode.core.modes import DEFAULT_MODE
from graphmode.core.records import ITL_FLOOR_S
from graphmode.profiling.sequential import (
    ONE_BLOCK,
    BetweenStarts,
    Block,
    Decision,
    SequentialRule,
    between_from_aa,
    sequential_decision,
)

DEFAULT_ARM = DEFAULT_MODE.value
CONTROL_ARM = "CONTROL"
RACE_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50")
# latency fields (lower is better) a race can decide on
KNOWN_RACE_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50", "tpot_p50", "e2e_p50", "itl_p90", "ttft_p90", "e2e_p90")


@dataclass
class RoundTable:
    """Every ok cell of one race: (arm, round) → (workload, metric → value)."""

    cells: dict[tuple[str, int], tuple[str, dict[str, float]]] = field(default_factory=dict)
    starts: dict[tuple[str, int], str] = field(default_factory=dict)  # (arm, round) -> engine start id

    def add(self, arm: str, round_: int, workload: str, values: Mapping[str, float | None],
            start: str | None = None, excluded: bool = False) -> None:
        """*excluded*: the cell ran, but its values measure something else (a JIT compile): it keeps its
        round and pairs with nothing."""
        clean = {} if excluded else {
            m: float(v) for m, v in values.items() if v is not None and math.isfinite(v) and v > 0
            # rows written before such quantiles were withheld (records.ITL_FLOOR_S): a client artifact
            and not (m.startswith("itl_") and v < ITL_FLOOR_S)}
        self.cells[(arm, round_)] = (workload, clean)
        self.starts[(arm, round_)] = start or ""

    def blocked(self, arm: str, metric: str, workload: str | None = None) -> tuple[list[float], list[Block]]:
        """The log-ratios of :meth:`pairs` and each one's block (the arm's start, the default's start)."""
        ys, blocks = [], []
        for r, _, y in self.pairs(arm, metric, workload):
            ys.append(y)
            blocks.append((self.starts.get((arm, r), ""), self.starts.get((DEFAULT_ARM, r), "")))
        return ys, blocks

    def current_block_rounds(self, arm: str, arm_start: str, default_start: str) -> int:
        """Rounds in which *arm*'s start *arm_start* and the default's *default_start* both measured ok."""
        return sum(1 for (a, r) in self.cells if a == arm and self.starts.get((a, r)) == arm_start
                   and self.starts.get((DEFAULT_ARM, r)) == default_start and (DEFAULT_ARM, r) in self.cells)

    def start_ids(self, arm: str) -> set[str]:
        return {s for (a, _), s in self.starts.items() if a == arm}

    @property
    def rounds(self) -> list[int]:
        return sorted({r for _, r in self.cells})

    def arms(self) -> list[str]:
        return sorted({a for a, _ in self.cells})

    def pairs(self, arm: str, metric: str, workload: str | None = None) -> list[tuple[int, str, float]]:
        """(round, workload, ln(arm / default)) for every round that measured both, oldest first."""
        out = []
        for (a, r), (w, vals) in sorted(self.cells.items(), key=lambda kv: kv[0][1]):
            if a != arm or (workload is not None and w != workload):
                continue
            base = self.cells.get((DEFAULT_ARM, r))
            if base is None or base[0] != w:
                continue
            mine, ref = vals.get(metric), base[1].get(metric)
            if mine is not None and ref is not None:
                out.append((r, w, math.log(mine / ref)))
        return out

    def rounds_per_workload(self) -> dict[str, int]:
        """Rounds the default measured, per workload (every round measures the default)."""
        counts: dict[str, int] = defaultdict(int)
        for (a, _), (w, _vals) in self.cells.items():
            if a == DEFAULT_ARM:
                counts[w] += 1
        return dict(counts)


@dataclass(frozen=True)
class ArmVerdicts:
    arm: str
    pooled: dict[str, Decision]  # metric -> verdict over every round
    by_workload: dict[tuple[str, str], Decision]  # (metric, workload) -> verdict on that workload's rounds

    def decided(self, metrics: Iterable[str]) -> bool:
        return all(self.pooled[m].decided for m in metrics if m in self.pooled)

    def settled(self, metrics: Iterable[str], delta: float) -> bool:
        """Decided on every metric, or worse on one and, on every open one, an interval that rules out
        "better" (its lower bound at least 1 − δ). More rounds of such an arm could only tell "worse" from
        "equivalent" on the open metrics, for a mode never recommended on the metric it lost; since a
        one-start "worse" must clear the start margin (TTFT's is 0.20), PIECEWISE on the H200 would
        otherwise race to the end of the budget on TTFT after losing 2–3× ITL in three rounds."""
        ds = [self.pooled[m] for m in metrics if m in self.pooled]
        if all(d.decided for d in ds):
            return True
        return any(d.verdict == "worse" for d in ds) and all(
            d.decided or (d.lo is not None and d.lo >= 1 - delta) for d in ds)

    def workload_dependent(self, metric: str) -> str | None:
        """Why the pooled verdict is open though every workload decided, or None when that is not so."""
        per = {w: d for (m, w), d in self.by_workload.items() if m == metric}
        if not per or self.pooled[metric].decided or not all(d.decided for d in per.values()):
            return None
        groups: dict[str, list[str]] = defaultdict(list)
        for w, d in sorted(per.items()):
            groups[d.verdict].append(w)
        return "workload-dependent: " + "; ".join(f"{v} on {', '.join(ws)}" for v, ws in sorted(groups.items()))


def arm_verdicts(table: RoundTable, arm: str, metrics: Sequence[str], rule: SequentialRule,
                 workloads: Iterable[str] | None = None, running: Collection[str] = frozenset()) -> ArmVerdicts:
    """Pooled verdicts at *rule*, and per-workload ones at a Bonferroni-corrected confidence. *running*: the
    engine starts still up (a live race's); a block of two running starts is not complete (open_blocks).

    An arm gets one verdict per workload of the design, so at the pooled confidence a six-workload design
    would call a difference on some workload of an A/A arm far more often than 5% of the time; each
    per-workload interval is therefore taken at ``1 - (1 - confidence) / workloads``.
    """
    names = sorted(set(workloads) if workloads is not None else {w for w, _ in table.cells.values()})
    between = {m: aa_between(table, m) if arm != CONTROL_ARM else None for m in metrics}
    pooled = {m: _decide(table.blocked(arm, m), metric_rule(rule, m), between[m], running) for m in metrics}
    per = workload_rule(rule, len(names))
    by_workload = {(m, w): _decide(table.blocked(arm, m, w), metric_rule(per, m), between[m], running)
                   for m in metrics for w in names}
    return ArmVerdicts(arm, pooled, by_workload)


def _decide(data: tuple[list[float], list[Block]], rule: SequentialRule, between: BetweenStarts | None,
            running: Collection[str]) -> Decision:
    # a block gains rounds only while both its engines run: once either stops (a staggered restart), it is complete
    running_blocks = {b for b in data[1] if b[0] in running and b[1] in running}
    return sequential_decision(data[0], rule, data[1], between, running_blocks)


def aa_between(table: RoundTable, metric: str) -> BetweenStarts | None:
    """The start variance the A/A arm (CONTROL) measured on *metric*, if the race had one."""
    ys, blocks = table.blocked(CONTROL_ARM, metric)
    if not ys or all(b == ONE_BLOCK for b in blocks):
        return None
    return between_from_aa(ys, blocks)


def workload_rule(rule: SequentialRule, workloads: int) -> SequentialRule:
    """*rule* with its confidence corrected for one verdict per workload (Bonferroni)."""
    if workloads <= 1:
        return rule
    return dataclasses.replace(rule, confidence=1 - (1 - rule.confidence) / workloads)


# One engine start moves TTFT p50 more than ITL p50: A/A arms on the H200 (one start each) read TTFT 0.842×
# (Llama-3.2-1B, vLLM 0.33, 2026-12-01) and 1.228× (the same shape on FlashInfer, whose "FULL" vLLM ran as the
# default's mode, 2026-12-02), ITL 0.89–1.03×. A "worse" on TTFT without an interval over starts must clear
# ln(1 + δ) plus this much (SequentialRule.start_margin, 0.10, is the ITL figure).
TTFT_START_MARGIN = 0.20


def metric_rule(rule: SequentialRule, metric: str) -> SequentialRule:
    """*rule* with the start margin of *metric* (TTFT's is wider)."""
    if metric.startswith("ttft") and rule.start_margin < TTFT_START_MARGIN:
        return dataclasses.replace(rule, start_margin=TTFT_START_MARGIN)
    return rule


def table_from_rows(rows: Iterable[Mapping[str, Any]], metrics: Sequence[str] = RACE_METRICS) -> RoundTable:
    """The ok cells of race rows (rows without a race round are skipped)."""
    table = RoundTable()
    for r in rows:
        if r.get("status") != "ok" or r.get("race_round") is None or not r.get("race_arm"):
            continue
        table.add(str(r["race_arm"]), int(r["race_round"]), str(r["workload"]), {m: r.get(m) for m in metrics},
                  start=str(r.get("race_start_id") or ""), excluded=jit_tainted(r))
    return table


def jit_tainted(row: Mapping[str, Any]) -> bool:
    """The cell's engine JIT-compiled a kernel during it (``engine_jit_kernels``): its latency holds a
    compile, so its round pairs with nothing. The rule reads the log, never the latency, so leaving such
    rounds out cannot favour either arm."""
    return bool(row.get("engine_jit_kernels"))
