#!/usr/bin/env python3
"""Capture sizes per (shape, workload) of profile datasets, against vLLM's default list.

For the H200 comparison of issue 14 (docs/capture-sizes.md, runbook): after a profile of the default list,
this prints for each shape and workload the step sizes the cells recorded (summed over modes and repeats),
the sizes the chooser picks for them, the predicted capture seconds, graph GiB and KV cache tokens against
the default, and the ``--compilation-config`` keys to profile the recommended list with. Rows from before
step sizes were recorded are counted and skipped, and so are race cells unless ``--include-race``: a race's
arms run other capture lists in short cells, and a chooser fed them would answer differently each time a
race adds rows (a seeded dataset gave a new list, hence a new race key, on the capture chain's smoke test).

    .venv/bin/python bench/capture_sizes.py cap.sqlite [--workload NAME] [--mode FULL_AND_PIECEWISE]
        [--max-num-seqs 256] [--max-num-batched-tokens 8192] [--keep 1,2,4,8 | none] [--graph-long-prefill]
        [--max-pad-ratio 1.25 | 0] [--include-race] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from graphmode.core.dataset import ProfileStore, step_sizes_of
from graphmode.core.records import StepSizes
from graphmode.report.capture import add_steps, shape_label
from graphmode.selector.capture import (
    ALWAYS_KEEP,
    MAX_PAD_RATIO,
    check_pad_ratio,
    choose_capture_sizes,
    parse_keep,
)
from graphmode.selector.capture_costs import costs_from_dataset, measured_kv_bytes_per_token


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("datasets", nargs="+", type=Path)
    ap.add_argument("--workload", action="append", help="only these workloads (repeatable)")
    ap.add_argument("--mode", default="FULL_AND_PIECEWISE")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--keep", default=",".join(map(str, ALWAYS_KEEP)),
                    help="sizes kept whatever the window saw, up to the largest chosen (default %(default)s), "
                         "or 'none'")
    ap.add_argument("--graph-long-prefill", action="store_true",
                    help="let mixed steps above vLLM's default largest size raise the largest size")
    ap.add_argument("--include-race", action="store_true", help="also read race cells' step sizes")
    ap.add_argument("--max-pad-ratio", type=float, default=MAX_PAD_RATIO,
                    help=f"the most any step up to the largest size pads, as a factor (default {MAX_PAD_RATIO:g}; "
                    "0 for no bound)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        keep = parse_keep(a.keep)
    except ValueError as exc:
        ap.error(f"--keep: {exc}")
    try:
        check_pad_ratio(a.max_pad_ratio)
    except ValueError as exc:
        ap.error(f"--max-pad-ratio: {exc}")
    out = []
    skipped = 0
    for path in a.datasets:
        if not path.is_file():
            print(f"no dataset at {path}", file=sys.stderr)
            return 2
        with ProfileStore(path, readonly=True) as store:
            rows = store.rows(status="ok")
        groups: dict[tuple[str, str | None, str], StepSizes | None] = {}
        cells: dict[tuple[str, str | None, str], int] = defaultdict(int)
        for r in rows:
            if a.workload and r["workload"] not in a.workload:
                continue
            if r.get("race_id") and not a.include_race:
                continue
            s = step_sizes_of(r)
            if s is None:
                skipped += 1
                continue
            key = (shape_label(r), r.get("fp_model_config_hash"), r["workload"])
            groups[key] = add_steps(groups[key], s) if key in groups else s
            cells[key] += 1
        for (label, chash, workload), steps in sorted(groups.items(), key=lambda kv: kv[0][0] + kv[0][2]):
            if steps is None:
                print(f"{label} {workload}: cells with different histogram edges, skipped", file=sys.stderr)
                continue
            ans = choose_capture_sizes(steps, mode=a.mode, max_num_seqs=a.max_num_seqs,
                                       max_num_batched_tokens=a.max_num_batched_tokens, always_keep=keep,
                                       graph_long_prefill=a.graph_long_prefill, max_pad_ratio=a.max_pad_ratio,
                                       costs=costs_from_dataset(path, model_config_hash=chash),
                                       kv_bytes_per_token=measured_kv_bytes_per_token(rows, chash))
            out.append({"dataset": str(path), "shape": label, "workload": workload,
                        "cells": cells[(label, chash, workload)], "answer": ans.model_dump(mode="json"),
                        "compilation_config": ans.compilation_config()})
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print("| shape | workload | cells | steps | sizes | graphed chosen / default | padding tok/step "
              "chosen / default | capture s | graph GiB | KV tokens gained |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for o in out:
            ans = o["answer"]
            c, d = ans["chosen"], ans["default"]
            print(f"| {o['shape']} | {o['workload']} | {o['cells']} | {ans['steps_observed']:,.0f} | "
                  f"{', '.join(map(str, ans['sizes']))} | {c['graphed_share']} / {d['graphed_share']} | "
                  f"{c['padded_tokens_per_step']} / {d['padded_tokens_per_step']} | {c['capture_s']} / "
                  f"{d['capture_s']} | {c['graph_gib']} / {d['graph_gib']} | {ans['kv_tokens_gained']} |")
    if skipped:
        print(f"{skipped} ok rows recorded no step sizes (profiled before graphmode recorded them): skipped",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
