"""What ``graphmode report`` costs on the bundled datasets: seconds per step and bytes per file.

    python bench/report_cost.py [--models-dir models] [--out /tmp/report/report.html]

Runs ``graphmode report`` on them (a fresh process: imports included) for the end-to-end seconds, then builds
the report in this process with each step timed, and prints both tables: seconds per step and in all, bytes of
the page and of plotly.js beside it. The targets are under 20 s end to end and under 3 MB for the page.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from graphmode.report import build as build_mod
from graphmode.report.build import build_report, default_datasets

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def timed(spent: dict[str, float], name: str, module: Any, attr: str) -> Iterator[None]:
    """Time every call of ``module.attr`` into ``spent[name]`` while the block runs."""
    original: Callable[..., Any] = getattr(module, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

    setattr(module, attr, wrapper)
    try:
        yield
    finally:
        setattr(module, attr, original)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", type=Path, default=REPO / "models")
    ap.add_argument("--out", type=Path, default=Path("/tmp/graphmode-report-cost/report.html"))
    args = ap.parse_args()
    paths, _ = default_datasets(args.models_dir)
    cli = [sys.executable, "-c", "from graphmode.cli.main import run; run()", "report", "--models-dir",
           str(args.models_dir), "--out", str(args.out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cli, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cli_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    spent: dict[str, float] = {}
    steps = [("load datasets", "load_report_data"), ("decision map", "decision_maps"),
             ("capture sizes", "capture_section"), ("race releases + model answers", "releases"),
             ("render page", "html")]
    t0 = time.perf_counter()
    with timed(spent, steps[0][0], build_mod, steps[0][1]), timed(spent, steps[1][0], build_mod, steps[1][1]), \
            timed(spent, steps[2][0], build_mod, steps[2][1]), timed(spent, steps[3][0], build_mod, steps[3][1]), \
            timed(spent, steps[4][0], build_mod.html, "page"):
        res = build_report(paths, args.out, models_dir=args.models_dir)
    total = time.perf_counter() - t0
    print(f"{'step':<32}{'seconds':>10}")
    for name, _ in steps:
        print(f"{name:<32}{spent.get(name, 0.0):>10.1f}")
    print(f"{'total (in process)':<32}{total:>10.1f}")
    print(f"{'graphmode report, end to end':<32}{cli_s:>10.1f}")
    print(f"{'  of which CPU (user + sys)':<32}{cli_cpu:>10.1f}")
    print()
    print(f"{'file':<32}{'bytes':>12}")
    print(f"{res.out.name:<32}{res.bytes:>12,}")
    if res.script is not None:
        print(f"{res.script.name:<32}{res.script_bytes:>12,}")
    print(f"datasets: {len(paths)}, ok cells: {res.data.n_ok}")


if __name__ == "__main__":
    main()
