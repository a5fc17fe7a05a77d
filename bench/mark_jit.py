#!/usr/bin/env python3
"""Mark a dataset's cells whose engine JIT-compiled a kernel during them, from the engines' logs.

The profiler records ``engine_jit_kernels`` per cell itself (the bytes the engine's log grew by during the
cell; ``graphmode.profiling.jitlog``). Datasets measured before it did, whose engine logs were kept, get
the same marks from the logs' time stamps: a warning at second *t* marks the cell of that engine whose
``[started_at, finished_at]`` holds *t* (both at one-second resolution, so a warning on the second one
cell ends and the engine's next begins marks both). Cells the logs say nothing of are marked ``''``
(read, clean); cells of engines without a log stay unset. A marked cell's round pairs with nothing in the
verdicts (``race_rounds.jit_tainted``).

    .venv/bin/python bench/mark_jit.py DATASET LOG_DIR [--write] [--utc-offset-h H]

LOG_DIR holds the race's engine logs, ``RUN_ID-ARM.log`` (``--log-dir`` of the race; the chain's
``logs-CONFIG/``). vLLM stamps its lines in the host's local time without a year: H is that zone's offset
from UTC (0 on the H200 hosts). Without ``--write`` it only prints the table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
from collections import defaultdict
from pathlib import Path

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import GraphmodeError
from graphmode.profiling.jitlog import jit_events


def _stamp_epoch(stamp: str, year: int, utc_offset_h: float) -> float:
    t = dt.datetime.strptime(f"{year}-{stamp}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
    return t.timestamp() - utc_offset_h * 3600


def marks_for(rows: list[dict], log_dir: Path, utc_offset_h: float = 0.0) -> tuple[dict[int, str], list[str]]:
    """(cell id → kernels, "" for a clean cell) and the (run, arm) pairs that had no log."""
    by_engine: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("race_arm") and r.get("run_id") and r.get("engine_jit_kernels") is None:
            by_engine[(str(r["run_id"]), str(r["race_arm"]))].append(r)
    marks: dict[int, str] = {}
    missing: list[str] = []
    for (run, arm), cells in sorted(by_engine.items()):
        log = log_dir / f"{run}-{arm}.log"
        if not log.is_file():
            missing.append(f"{run}-{arm}")
            continue
        text = log.read_bytes().decode("utf-8", errors="replace")
        found: dict[int, list[str]] = defaultdict(list)
        for stamp, kernel in jit_events(text):
            if stamp is None:
                continue
            for c in cells:
                year = dt.datetime.fromtimestamp(float(c["started_at"]), dt.UTC).year
                t = _stamp_epoch(stamp, year, utc_offset_h)
                inside = math.floor(float(c["started_at"])) <= t <= math.ceil(float(c["finished_at"]))
                if inside and kernel not in found[int(c["id"])]:
                    found[int(c["id"])].append(kernel)
        for c in cells:
            marks[int(c["id"])] = ",".join(found.get(int(c["id"]), []))
    return marks, missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=Path)
    ap.add_argument("log_dir", type=Path)
    ap.add_argument("--write", action="store_true", help="store the marks (only cells never marked)")
    ap.add_argument("--utc-offset-h", type=float, default=0.0)
    a = ap.parse_args(argv)
    if not a.log_dir.is_dir():
        print(f"error: {a.log_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        with ProfileStore(a.dataset, readonly=not a.write) as store:
            rows = store.rows()
            marks, missing = marks_for(rows, a.log_dir, a.utc_offset_h)
            by_id = {int(r["id"]): r for r in rows}
            print("| round | arm | workload | JIT-compiled during the cell |\n|---|---|---|---|")
            for i, kernels in sorted(marks.items(), key=lambda kv: (by_id[kv[0]].get("race_round") or 0, kv[0])):
                if kernels:
                    r = by_id[i]
                    print(f"| {r.get('race_round')} | {r.get('race_arm')} | {r.get('workload')} | {kernels} |")
            tainted = sum(1 for k in marks.values() if k)
            print(f"\n{tainted} of {len(marks)} cells read from logs were marked; "
                  f"{len(missing)} engines had no log{': ' + ', '.join(missing) if missing else ''}")
            if a.write:
                print(f"stored: {store.mark_jit_kernels(marks)} rows")
    except GraphmodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
