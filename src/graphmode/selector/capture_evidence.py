"""What races of capture lists measured on this GPU: the latency side of a capture answer.

The chooser predicts what a list saves at start-up (capture seconds, graph GiB, KV cache tokens) and how many
steps replay a graph; it predicts nothing about latency, and on the H200 the races of such lists against
vLLM's default mostly could not tell (docs/capture-sizes.md: at 2 req/s the 8B's 7-size list read TPOT
1.04x [0.87-1.24] over 16 rounds; the 1B's paired rounds scattered by 12-22%, its engine core at a full core
at 32 req/s). So an answer names the raced list most like the chosen one, for the deployment's shape, with
its verdict per raced workload, rather than letting the savings imply that latency is unchanged.

Read from the model's datasets (its capture datasets hold the capture chain's races): race rows of arms with
``race_capture_sizes``, paired with their race's default arm; verdicts by the race's own rule
(:func:`graphmode.profiling.race_rounds.arm_verdicts`: paired per-round log ratios, t interval over start
blocks, TOST at delta). A raced list counts when it shares at least :data:`MIN_SIMILARITY` of the union of
sizes with the chosen one (Jaccard). Races of one list (same shape, mode and sizes) count as one list: on the
H200 the 8B's list to 1024 was raced in mixed traffic (undecided) and in steady decode (0.73x TPOT, better),
and an answer that named only the race with the most rounds would have said no effect was shown.
"""

from __future__ import annotations

import functools
import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from graphmode.profiling.race_rounds import DEFAULT_ARM, arm_verdicts, table_from_rows
from graphmode.profiling.sequential import SequentialRule

# Half the union shared: a 6-size low-load list and a 7-size one share 4-5 sizes; a 32-size high-load list
# and a 6-size one share 4 of 34 and say nothing about each other.
MIN_SIMILARITY = 0.5
EVIDENCE_METRICS = ("itl_p50", "tpot_p50", "ttft_p50")


class WorkloadVerdict(BaseModel):
    workload: str
    rate: float | None = Field(None, description="the default's observed arrival rate in that race's cells, req/s")
    in_flight: int | None = Field(None, description="requests held in flight (a closed-loop workload); None: "
                                  "open loop, read its rate")
    input_tokens: float | None = Field(None, description="the workload's mean prompt tokens (its spec)")
    output_tokens: float | None = Field(None, description="the workload's mean output tokens (its spec): at one "
                                        "number in flight, short outputs mean mixed steps, long ones steady decode")
    race: str | None = Field(None, description="the race that measured it (dataset file:race id)")
    preemptions: tuple[float, float] | None = Field(
        None, description="mean preemptions a cell, (this list, the default), where either arm preempted: the "
        "arms then ran different batches (measured on the H200, vLLM 0.33, 8B at 768 in flight: 624 against 764 "
        "running), so the ratio is not the list's")
    metric: str
    verdict: str
    ratio: float | None = None
    lo: float | None = None
    hi: float | None = None
    n: int = 0

    def where(self, tokens: bool = True) -> str:
        """The load it was measured at, as the note says it (*tokens*: with its prompt and output lengths)."""
        at = (f"{self.in_flight} in flight" if self.in_flight is not None
              else f"{self.rate:.3g} req/s" if self.rate is not None else self.workload)
        if tokens and self.input_tokens is not None and self.output_tokens is not None:
            at += f" ({self.input_tokens:.0f} prompt, {self.output_tokens:.0f} output tokens)"
        if self.preemptions is not None:
            at += (f", preempting ({self.preemptions[0]:.0f} a cell, the default {self.preemptions[1]:.0f}: "
                   "batches differ)")
        return at


class CaptureEvidence(BaseModel):
    """A raced list like the chosen one, and what its race measured against vLLM's default list."""

    race: str = Field(description="the race of this list with the most rounds (dataset file:race id)")
    races: list[str] = Field(default_factory=list, description="every race of this list, most rounds first")
    mode: str = Field(description="the mode both lists ran in")
    sizes: list[int]
    similarity: float = Field(description="Jaccard similarity of the raced and the chosen list")
    verdicts: list[WorkloadVerdict] = Field(description="per raced workload and metric; where two races of the "
                                            "list ran one workload, the one with more rounds")
    pooled: list[WorkloadVerdict] = Field(
        default_factory=list, description="each race's own verdict per metric, over all its workloads (t over "
        "start blocks where it has them): what the race acted on")

    def note(self) -> str:
        """One line: per raced workload, each metric's ratio, interval and verdict."""
        def one(v: WorkloadVerdict) -> str:
            ci = f" [{v.lo:.2f}-{v.hi:.2f}]" if v.lo is not None and v.hi is not None else ""
            ratio = f"{v.ratio:.3f}x{ci}" if v.ratio is not None else "no ratio"
            return f"{v.metric} {ratio} {v.verdict}"

        by_workload: dict[str, list[WorkloadVerdict]] = defaultdict(list)
        for v in self.verdicts:
            by_workload[v.workload].append(v)
        parts = []
        races = self.races or [self.race]
        for race in races:
            # a race's pooled verdict says more than its workloads' only when it ran several
            own = {v.workload for v in self.verdicts if v.race in (race, None)}
            pooled = [v for v in self.pooled if v.race in (race, None)]
            if pooled and len(own) > 1:
                whose = "its" if len(races) == 1 else f"{race.rsplit(':', 1)[-1]}'s"
                parts.append(f"over {whose} {len(own)} workloads: " + ", ".join(one(v) for v in pooled))
        # lengths only where they tell the workloads apart (768 in flight: mixed steps or steady decode)
        tokens = len({(v.input_tokens, v.output_tokens) for v in self.verdicts}) > 1
        for vs in by_workload.values():
            n = max(v.n for v in vs)
            parts.append(f"at {vs[0].where(tokens)}, {n} round{'' if n == 1 else 's'}: "
                         + ", ".join(one(v) for v in vs))
        shown = ", ".join(map(str, self.sizes)) if len(self.sizes) <= 12 else (
            f"{len(self.sizes)} sizes up to {self.sizes[-1]}")
        head = (f"latency, raced on this GPU for a list like this one ([{shown}], similarity "
                f"{self.similarity:.2f}, {self.mode}) against vLLM's default list: ")
        tail = ""
        if self.verdicts and all(v.verdict == "undecided" for v in [*self.verdicts, *self.pooled]):
            tail = ". No latency effect shown either way: the start-up savings are the measured gain"
        return head + "; ".join(parts) + tail


def jaccard(a: Sequence[int], b: Sequence[int]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 0.0


def capture_evidence(paths: Sequence[Path | str], chosen: Sequence[int], *, model_config_hash: str | None = None,
                     num_params_b: float | None = None, rule: SequentialRule | None = None,
                     metrics: Sequence[str] = EVIDENCE_METRICS) -> CaptureEvidence | None:
    """The raced list most like *chosen* in the datasets at *paths* (the deployment's shape by config hash,
    else the nearest in parameters), with its verdicts; None when no raced list is similar enough."""
    versions = tuple((str(p), os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in paths)
    # two starts a side before "better" or "equivalent", as the selector asks of mode races
    arms = _raced_arms(versions, model_config_hash, num_params_b, rule or SequentialRule(min_starts=2),
                       tuple(metrics))
    ranked = [(jaccard(ev.sizes, chosen), max((v.n for v in ev.verdicts), default=0), i) for i, ev in enumerate(arms)]
    ranked = [r for r in ranked if r[0] >= MIN_SIMILARITY]
    if not ranked:
        return None
    sim, _, i = max(ranked, key=lambda r: (r[0], r[1], -r[2]))  # most alike, then most rounds
    return arms[i].model_copy(update={"similarity": round(sim, 3)})


@functools.lru_cache(maxsize=16)
def _raced_arms(versions: tuple[tuple[str, int, int], ...], model_config_hash: str | None, num_params_b: float | None,
                rule: SequentialRule, metrics: tuple[str, ...]) -> tuple[CaptureEvidence, ...]:
    from graphmode.core.dataset import ProfileStore

    races: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path, _mtime_ns, _size in versions:
        with ProfileStore(path, readonly=True) as store:
            for r in store.rows(status="ok"):
                if r.get("race_id"):
                    races[f"{Path(path).name}:{r['race_id']}"].append(r)
    sized = {k: rows for k, rows in races.items() if any(r.get("race_capture_sizes") for r in rows)}
    if not sized:
        return ()
    shapes = {r.get("fp_model_config_hash") for rows in sized.values() for r in rows}
    pick: Any = None
    if model_config_hash in shapes:
        pick = model_config_hash
    elif num_params_b is not None:
        near = [(abs(float(r["fp_num_params_b"]) - num_params_b), str(r.get("fp_model_config_hash")))
                for rows in sized.values() for r in rows if isinstance(r.get("fp_num_params_b"), int | float)]
        pick = min(near)[1] if near else None
    out: list[CaptureEvidence] = []
    for key, rows in sorted(sized.items()):
        if pick is not None and rows[0].get("fp_model_config_hash") != pick:
            continue
        table = table_from_rows(rows, metrics)
        defaults = [r for r in rows if r.get("race_arm") == DEFAULT_ARM]
        names = {str(r["workload"]) for r in rows}
        rates = {w: _mean(r.get("obs_arrival_rate") for r in defaults if r["workload"] == w) for w in names}
        specs = {w: next(r.get("workload_spec") for r in rows if r["workload"] == w) for w in names}
        fixed = {w: _in_flight(specs[w]) for w in names}
        tokens = {w: _token_means(specs[w]) for w in names}
        lists = {str(r["race_arm"]): _sizes(r.get("race_capture_sizes")) for r in rows if r.get("race_capture_sizes")}
        for arm, sizes in sorted(lists.items()):
            if not sizes:
                continue
            v = arm_verdicts(table, arm, metrics, rule, sorted(names))
            pre = {w: _preemptions(rows, arm, w) for w in names}
            verdicts = [WorkloadVerdict(workload=w, rate=rates[w], in_flight=fixed[w], input_tokens=tokens[w][0],
                                        output_tokens=tokens[w][1], race=key, preemptions=pre[w], metric=m,
                                        verdict=str(d.verdict),
                                        ratio=_round(d.ratio), lo=_round(d.lo), hi=_round(d.hi), n=d.n)
                        for w in sorted(names) for m in metrics
                        if (d := v.by_workload.get((m, w))) is not None and d.n > 0]
            pooled = [WorkloadVerdict(workload="pooled", race=key, metric=m, verdict=str(d.verdict),
                                      ratio=_round(d.ratio), lo=_round(d.lo), hi=_round(d.hi), n=d.n)
                      for m in metrics if (d := v.pooled.get(m)) is not None and d.n > 0]
            if verdicts:
                mode = str(rows[0].get("race_requested_mode") or rows[0].get("mode") or "FULL_AND_PIECEWISE")
                out.append(CaptureEvidence(race=key, races=[key], mode=mode, sizes=sizes, similarity=0.0,
                                           verdicts=verdicts, pooled=pooled))
    return tuple(_one_per_list(out))


def _one_per_list(raced: list[CaptureEvidence]) -> list[CaptureEvidence]:
    """Races of one list (mode and sizes; the caller keeps one shape) merged: every workload any of them ran,
    each (workload, metric) from the race with the most rounds there."""
    groups: dict[tuple[str, tuple[int, ...]], list[CaptureEvidence]] = defaultdict(list)
    for ev in raced:
        groups[(ev.mode, tuple(ev.sizes))].append(ev)
    out = []
    for evs in groups.values():
        evs.sort(key=lambda e: -max(v.n for v in e.verdicts))
        best: dict[tuple[str, str], WorkloadVerdict] = {}
        for v in (v for e in evs for v in e.verdicts):
            if (v.workload, v.metric) not in best or v.n > best[(v.workload, v.metric)].n:
                best[(v.workload, v.metric)] = v
        verdicts = sorted(best.values(), key=_load_order)
        races = [e.race for e in evs]
        used = {v.race for v in verdicts}
        out.append(evs[0].model_copy(update={
            "races": [r for r in races if r in used], "verdicts": verdicts,
            "pooled": [p for e in evs if e.race in used for p in e.pooled]}))
    return out


def _load_order(v: WorkloadVerdict) -> tuple[Any, ...]:
    """Closed loop first (fewest in flight, then the shortest outputs: mixed steps before steady decode),
    then the slowest open load; metrics in the order asked. A closed loop's rate is the cap's, not a load."""
    metric = EVIDENCE_METRICS.index(v.metric) if v.metric in EVIDENCE_METRICS else len(EVIDENCE_METRICS)
    if v.in_flight is not None:
        return (False, v.in_flight, v.output_tokens or 0.0, 0.0, v.workload, metric)
    return (True, 0, v.rate is None, v.rate or 0.0, v.workload, metric)


def _sizes(raw: Any) -> list[int] | None:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        return None
    return sorted(value)


# A closed-loop workload in the capture grid is an open-loop one with a rate no engine keeps up with and a
# cap on requests in flight (bench/grids/capture-sizes.yaml, cap-low-c1 / cap-high-c48).
CLOSED_LOOP_RATE = 1000.0


def _in_flight(spec: Any) -> int | None:
    """The fixed number of requests in flight of a closed-loop workload spec (JSON), else None."""
    try:
        value = json.loads(spec) if isinstance(spec, str) else spec
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    cap, rate = value.get("max_concurrency"), value.get("rate")
    if isinstance(cap, int) and cap > 0 and isinstance(rate, int | float) and rate >= CLOSED_LOOP_RATE:
        return cap
    return None


def _preemptions(rows: Sequence[Mapping[str, Any]], arm: str, workload: str) -> tuple[float, float] | None:
    """Mean ``obs_preemptions`` a cell of *arm* and of the default on *workload*; None when neither preempted."""
    def mean(name: str) -> float:
        got = [float(r["obs_preemptions"]) for r in rows if r.get("race_arm") == name and r["workload"] == workload
               and isinstance(r.get("obs_preemptions"), int | float)]
        return sum(got) / len(got) if got else 0.0

    mine, base = mean(arm), mean(DEFAULT_ARM)
    return (round(mine, 1), round(base, 1)) if mine > 0 or base > 0 else None


def _token_means(spec: Any) -> tuple[float | None, float | None]:
    """The mean prompt and output tokens of a workload spec (JSON: ``input`` / ``output`` ``{mean: ...}``)."""
    try:
        value = json.loads(spec) if isinstance(spec, str) else spec
    except ValueError:
        return None, None
    if not isinstance(value, dict):
        return None, None

    def mean(part: Any) -> float | None:
        m = part.get("mean") if isinstance(part, dict) else None
        return float(m) if isinstance(m, int | float) and not isinstance(m, bool) else None

    return mean(value.get("input")), mean(value.get("output"))


def _mean(values: Any) -> float | None:
    got = [float(v) for v in values if isinstance(v, int | float)]
    return round(sum(got) / len(got), 3) if got else None


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def evidence_for(folder: Path, chosen: Sequence[int],
                 served_config: Mapping[str, Any] | None) -> CaptureEvidence | None:
    """:func:`capture_evidence` over a model folder's datasets (its card's cost sources)."""
    from graphmode.core.fingerprint import shape_of_config
    from graphmode.selector.card import cost_paths

    shape = shape_of_config(dict(served_config)) if served_config else {}
    paths = list(cost_paths(folder))
    return capture_evidence(paths, chosen, model_config_hash=shape.get("model_config_hash"),
                            num_params_b=shape.get("num_params_b"))


__all__ = ["MIN_SIMILARITY", "CaptureEvidence", "WorkloadVerdict", "capture_evidence", "evidence_for", "jaccard"]
