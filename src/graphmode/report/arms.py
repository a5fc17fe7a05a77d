"""What each arm of a race cost and what its steps held: engine GPU memory, start-up, speculative decoding.

Per arm, from its ok race rows (one model shape and configuration at a time):

* ``engine_gpu_gib``: the mean over the arm's starts of what NVML charged to the engine's own processes
  (``engine_gpu_gib``; older rows lack it). With the KV cache fixed per engine
  (``--kv-cache-memory-bytes``) an arm's difference to the default's engine is its graphs' (and compiled
  code's) memory; two engines of one mode in one wave landed 0.2 GiB apart on the H200, so smaller
  differences are not graph memory. vLLM's own "took X GiB" is not used: it is device-wide, and a race
  starts its engines side by side.
* ``startup_s``: the mean start-up of those starts, and the start waves' sizes (engines started side by
  side share the GPU and the host, so start-up compares within a race, not with lone starts).
* speculative decoding: the mean over the arm's cells of the draft tokens accepted and of the tokens per
  verification step (``obs_spec_*``); ``spec_cells`` counts the cells that had a draft.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_ARM = "FULL_AND_PIECEWISE"


@dataclass(frozen=True)
class ArmCost:
    arm: str
    starts: int
    cells: int
    engine_gpu_gib: float | None = None
    startup_s: float | None = None
    waves: tuple[int, ...] = ()
    spec_acceptance: float | None = None
    spec_accept_length: float | None = None
    spec_cells: int = 0


def arm_costs(rows: Iterable[Mapping[str, Any]]) -> dict[str, ArmCost]:
    """:class:`ArmCost` per race arm of *rows* (ok race rows only), the default first."""
    starts: dict[str, dict[str, tuple[float | None, float | None, int | None]]] = defaultdict(dict)
    cells: dict[str, int] = defaultdict(int)
    spec: dict[str, list[tuple[float | None, float | None]]] = defaultdict(list)
    for r in rows:
        arm = r.get("race_arm")
        if r.get("status") != "ok" or not arm:
            continue
        arm = str(arm)
        cells[arm] += 1
        if r.get("race_start_id"):
            wave = r.get("start_wave_engines")
            starts[arm][str(r["race_start_id"])] = (_num(r.get("engine_gpu_gib")), _num(r.get("startup_s")),
                                                    wave if isinstance(wave, int) else None)
        rate, length = _num(r.get("obs_spec_acceptance_rate")), _num(r.get("obs_spec_accept_length"))
        if rate is not None or length is not None:
            spec[arm].append((rate, length))
    out = {}
    for arm in sorted(cells, key=lambda a: (a != DEFAULT_ARM, a)):
        per = starts.get(arm, {})
        out[arm] = ArmCost(
            arm=arm, starts=len(per), cells=cells[arm],
            engine_gpu_gib=_mean([g for g, _, _ in per.values()]), startup_s=_mean([u for _, u, _ in per.values()]),
            waves=tuple(sorted({w for _, _, w in per.values() if w is not None})),
            spec_acceptance=_mean([a for a, _ in spec[arm]]), spec_accept_length=_mean([b for _, b in spec[arm]]),
            spec_cells=len(spec[arm]))
    return out


def memory_line(costs: Mapping[str, ArmCost]) -> str | None:
    """Engine GPU memory and start-up per arm in one line; None when no arm has the memory."""
    if not any(c.engine_gpu_gib is not None for c in costs.values()):
        return None
    base = costs[DEFAULT_ARM].engine_gpu_gib if DEFAULT_ARM in costs else None
    parts = []
    for c in costs.values():
        g = c.engine_gpu_gib
        delta = f" ({g - base:+.2f} vs default)" if g is not None and base is not None and c.arm != DEFAULT_ARM else ""
        waves = f" in waves of {'/'.join(map(str, c.waves))}" if c.waves else ""
        parts.append(f"{c.arm} {'-' if g is None else f'{g:.2f}'} GiB{delta}, start-up "
                     f"{'-' if c.startup_s is None else f'{c.startup_s:.0f}'} s{waves}")
    return "engine GPU memory (NVML, the engine's own processes) and start-up per arm: " + "; ".join(parts)


def spec_line(costs: Mapping[str, ArmCost]) -> str | None:
    """Speculative decoding per arm in one line; None when no cell of any arm had a draft."""
    if not any(c.spec_cells for c in costs.values()):
        return None
    parts = [f"{c.arm} {_fmt(c.spec_acceptance)} accepted, {_fmt(c.spec_accept_length)} tokens per step "
             f"({c.spec_cells} cells)" for c in costs.values() if c.spec_cells]
    return "speculative decoding per arm (draft tokens accepted, tokens per verification step): " + "; ".join(parts)


def table(costs: Mapping[str, ArmCost]) -> tuple[list[str], list[list[str]]] | None:
    """(header, rows) for the report: one row per arm; None when no arm has memory, start-up or drafts."""
    if not any(c.engine_gpu_gib is not None or c.startup_s is not None or c.spec_cells for c in costs.values()):
        return None
    base = costs[DEFAULT_ARM].engine_gpu_gib if DEFAULT_ARM in costs else None
    spec = any(c.spec_cells for c in costs.values())
    head = ["arm", "engine GPU GiB", "vs default", "start-up s", "starts"] + (
        ["drafts accepted", "tokens per step"] if spec else [])
    rows = []
    for c in costs.values():
        g = c.engine_gpu_gib
        row = [c.arm, _fmt(g), f"{g - base:+.2f}" if g is not None and base is not None and c.arm != DEFAULT_ARM
               else "–", "–" if c.startup_s is None else f"{c.startup_s:.0f}" + (
                   f" (waves of {'/'.join(map(str, c.waves))})" if c.waves else ""), str(c.starts)]
        if spec:
            row += [_fmt(c.spec_acceptance), _fmt(c.spec_accept_length)]
        rows.append(row)
    return head, rows


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _mean(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return sum(got) / len(got) if got else None


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"
