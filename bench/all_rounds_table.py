#!/usr/bin/env python3
"""All-rounds ratios of raced datasets: per race, each mode against vLLM's default over every round it measured
(not the verdict's ratio at its first crossing), then across races (one race, one sample; t interval), as
the selector weighs them (graphmode.selector.verdicts: ``ratio_all``, ``across_races``, ``across_aa_arms``).
These are the numbers the README and docs/results quote.

    .venv/bin/python bench/all_rounds_table.py models/profiles/race-h200-vllm0.33-*.sqlite \
        models/profiles/cfg-h200-vllm0.33-*.sqlite

No GPU; runs without scikit-learn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
try:
    import graphmode  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(BENCH.parent / "src"))

from graphmode.core.dataset import ProfileStore  # noqa: E402
from graphmode.selector.verdicts import AcrossRaces, RaceVerdict, across_aa_arms, across_races, race_verdicts  # noqa: E402

MODES = ("FULL", "FULL_DECODE_ONLY", "PIECEWISE", "NONE")
METRICS = ("itl_p50", "ttft_p50")


def pooled(paths: list[Path]) -> tuple[list[RaceVerdict], dict[tuple[str, int | None, int | None], list[str]]]:
    """The pooled verdicts of every dataset's rows together, and which datasets each pool's races came from."""
    rows = []
    names: dict[tuple[str, int | None, int | None], list[str]] = {}
    for path in paths:
        with ProfileStore(path, readonly=True) as store:
            mine = store.rows()
        rows += mine
        for pool in {v.pool for v in race_verdicts(mine) if v.workload is None}:
            names.setdefault(pool, []).append(path.stem)
    return [v for v in race_verdicts(rows) if v.workload is None], names


def race_cell(v: RaceVerdict | None) -> str:
    if v is None or v.ratio_all is None:
        return "-"
    ran = f" (ran as {v.runs_as})" if v.runs_as else ""
    return f"{v.ratio_all:.3f}× n={v.rounds_all} ({v.verdict}){ran}"


def across_cell(a: AcrossRaces | None) -> str:
    return "-" if a is None else f"{a.ratio:.3f}× [{a.lo:.2f}–{a.hi:.2f}] races={a.races} ({a.verdict})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("datasets", nargs="+", type=Path)
    args = ap.parse_args(argv)
    verdicts, names = pooled(args.datasets)
    print("### Per race: all-rounds ratio to the default (verdict in brackets)\n")
    print("| race (dataset) | mode | " + " | ".join(METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for pool in sorted({v.pool for v in verdicts}, key=lambda p: names.get(p, [p[0]])):
        for mode in (*MODES, "CONTROL"):
            cells = [next((v for v in verdicts if v.pool == pool and v.mode == mode and v.metric == m), None)
                     for m in METRICS]
            if any(c is not None for c in cells):
                name = " + ".join(names.get(pool, [pool[0]]))
                print(f"| {name} | {mode} | " + " | ".join(race_cell(c) for c in cells) + " |")
    print("\n### Across races: t interval over the races' all-rounds ratios (95%)\n")
    print("| mode | " + " | ".join(METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for mode in MODES:
        print(f"| {mode} | " + " | ".join(across_cell(across_races(verdicts, mode, m)) for m in METRICS) + " |")
    print("| A/A (two engines of the default) | "
          + " | ".join(across_cell(across_aa_arms(verdicts, m)) for m in METRICS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
