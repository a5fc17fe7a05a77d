"""The report's first section: per GPU × vLLM release, what the races decided and what the bundled model answers.

The verdicts are :func:`graphmode.selector.verdicts.race_verdicts` over each configuration's own rows
(:mod:`graphmode.report.configs`); each cell shows the verdict, the ratio over every round (``ratio_all``)
and the verdict's interval. The answers are :meth:`graphmode.selector.recommend.Recommender.recommend` of
the registry's model for that GPU and release on a few described workloads, the first being the README's
first recommendation.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graphmode.core.errors import GraphmodeError
from graphmode.report import race as card_race
from graphmode.report.arms import table as arm_table
from graphmode.report.configs import CONTROL, Configuration, release
from graphmode.report.table import Cell, Table, num
from graphmode.selector.card import ModelCard
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.recommend import Recommender
from graphmode.selector.registry import list_models
from graphmode.selector.verdicts import RaceVerdict

# Described workloads the model answers: (label, rate req/s, input tokens, output tokens).
REFERENCE_WORKLOADS: tuple[tuple[str, float, float, float], ...] = (
    ("chat: 8 req/s, 64 → 512 tokens", 8.0, 64.0, 512.0),
    ("long prompts: 2 req/s, 2048 → 128 tokens", 2.0, 2048.0, 128.0),
    ("busy: 32 req/s, 256 → 256 tokens", 32.0, 256.0, 256.0),
)
ANSWER_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50")
# RaceAnswer.basis in words
RACE_BASIS: dict[str, str] = {
    "better": "races: beat the default by more than the equivalence margin",
    "equivalent": "races: equivalent to the default, and cheaper",
    "default": "races: nothing beat the default",
}


@dataclass
class Release:
    """One GPU × vLLM release: its configurations' verdicts and the bundled model's answers."""

    gpu: str
    vllm: str
    slug: str
    configs: list[Configuration]
    verdicts: Table
    model_id: str | None = None
    answers: Table | None = None
    card_tables: list[tuple[str, Table]] = field(default_factory=list)
    costs: list[tuple[str, Table]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        gpu = re.sub(r"^NVIDIA\s+", "", self.gpu)
        return f"{gpu} · vLLM {self.vllm}"


def verdict_cell(v: RaceVerdict | None) -> Cell:
    """``better`` in bold, then the ratio over every round and the verdict's own interval."""
    if v is None:
        return Cell("–", cls="muted")
    if v.ratio is None:
        return Cell(v.verdict, cls=f"v-{v.verdict}", note=f"n={v.rounds}")
    ratio_all = v.ratio_all if v.ratio_all is not None else v.ratio
    rounds_all = v.rounds_all or v.rounds
    ci = f" [{v.lo:.2f}–{v.hi:.2f}]" if v.lo is not None and v.hi is not None else ""
    held = f"; reads {v.reads}" if v.reads else ""
    ran = f"; ran as {v.runs_as}" if v.runs_as else ""
    return Cell(v.verdict, cls=f"v-{v.verdict}", strong=True,
                note=f"{ratio_all:.3f}× over {rounds_all} rounds · {v.ratio:.3f}×{ci} n={v.rounds} s={v.starts}"
                     f"{held}{ran}",
                title=v.describe())


def _config_detail(c: Configuration) -> str:
    """The configuration label without its GPU and release (the section heading says those)."""
    return " · ".join(c.label.split(" · ")[2:]) or "default"


def verdict_table(configs: Sequence[Configuration]) -> Table:
    """One row per (configuration, shape, arm); one column per raced metric."""
    metrics = sorted({v.metric for c in configs for v in c.verdicts if v.workload is None})
    rows: list[list[Cell]] = []
    for c in configs:
        for skey, name in sorted(c.shapes.items(), key=lambda kv: kv[1]):
            by = c.pooled(skey)
            modes = sorted({mode for mode, _ in by}, key=lambda m: (m == CONTROL, m))
            for i, m in enumerate(modes):
                lead = [Cell(_config_detail(c), title=c.label), Cell(name, strong=True)] if i == 0 else [Cell(), Cell()]
                arm = "A/A: 2nd start of the default" if m == CONTROL else m
                rows.append([*lead, Cell(arm), *(verdict_cell(by.get((m, k))) for k in metrics)])
    return Table.of(["configuration", "model shape", "mode vs default", *metrics], rows, "verdicts")


def answer_table(rec: Recommender) -> Table:
    """The model's answer on each reference workload and objective."""
    metrics = [m for m in ANSWER_METRICS if m in rec.card.workload_metrics]
    rows: list[list[Cell]] = []
    for label, rate, inp, out in REFERENCE_WORKLOADS:
        desc = WorkloadDescription(rate=rate, input_tokens=inp, output_tokens=out)
        for j, metric in enumerate(metrics):
            lead = Cell(label, strong=True) if j == 0 else Cell()
            try:
                r = rec.recommend(desc, metric)
            except GraphmodeError as exc:
                rows.append([lead, Cell(metric), Cell("–", cls="muted", note=str(exc)), Cell(), Cell()])
                continue
            gain = "–" if r.gain_vs_default_pct is None else f"{r.gain_vs_default_pct:+.1f}%"
            basis = (RACE_BASIS.get(r.race.basis, r.race.basis) if r.race is not None else
                     ("model: within noise of the default" if not r.gain_significant else "model prediction"))
            rows.append([lead, Cell(metric), Cell(r.mode, strong=True, cls="answer"), num(gain), Cell(basis)])
    return Table.of(["workload", "objective", "mode", "predicted vs default", "why"], rows, "answers")


def _models_for(models_dir: Path | None) -> dict[tuple[str, str], list[tuple[ModelCard, Path]]]:
    out: dict[tuple[str, str], list[tuple[ModelCard, Path]]] = defaultdict(list)
    if models_dir is None:
        return out
    for e in list_models(models_dir):
        if e.card is not None:
            out[(e.card.gpu_name or "?", release(e.card.vllm_version) or "?")].append((e.card, e.folder))
    return out


def releases(configs: Sequence[Configuration], models_dir: Path | None, use_model: bool = True) -> list[Release]:
    """Configurations grouped by (GPU, vLLM release), each with the bundled model's answers when one exists."""
    groups: dict[tuple[str, str], list[Configuration]] = defaultdict(list)
    for c in configs:
        groups[(str(c.key[0]), str(c.key[1]))].append(c)
    cards = _models_for(models_dir) if use_model else {}
    out = []
    for i, ((gpu, vllm), cs) in enumerate(groups.items()):
        rel = Release(gpu, vllm, f"rel{i}", cs, verdict_table(cs))
        for c in cs:
            for skey, name in sorted(c.shapes.items(), key=lambda kv: kv[1]):
                costs = arm_table(c.costs.get(skey, {}))
                if costs is not None:
                    rel.costs.append((f"{name} · {_config_detail(c)}", Table.of(*costs)))
        mine = cards.get((gpu, vllm), [])
        if mine:
            card, folder = max(mine, key=lambda k: k[0].model_id)
            rel.model_id = card.model_id
            try:
                rec = Recommender.from_dir(folder)
                rel.answers = answer_table(rec)
            except GraphmodeError as exc:
                rel.notes.append(f"model {card.model_id} cannot answer: {exc}")
            rel.card_tables = [(name, Table.of(head, rows)) for name, head, rows in card_race.tables(card)]
            if (over := card_race.across(card)) is not None:
                rel.card_tables.append(("across races (one race one sample)", Table.of(*over)))
        elif use_model and models_dir is not None:
            rel.notes.append(f"no bundled model for {gpu}, vLLM {vllm}: train one (graphmode train) to get answers")
        out.append(rel)
    return out
