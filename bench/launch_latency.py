"""Wall time of `graphmode --help` and `graphmode launch --dry-run` against `python -c pass`.

``launch --dry-run`` stops where vLLM would be exec'd, so its wall time is the launcher's whole cost
(target: at most 1 s where the decision table answers). Two launches: one serving the shape the bundled
default model's table was built for (Llama-3.2-1B's config.json: the table answers), one serving the 8B
shape (since 2026-12-03 the table answers only for its own shape, so the model is loaded).

Each command runs ``--runs`` times after one warm-up (page cache, and bytecode:
PYTHONDONTWRITEBYTECODE is unset, as for an installed package); the table holds the median wall time,
the slowest, the median CPU time (user + system: what the command costs whatever else the box runs) and
each median's ratio to the bare interpreter's.

    .venv/bin/python bench/launch_latency.py [--runs 7] [--models-dir models]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each run."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(argv, capture_output=True, check=True, env=env)  # warm-up
    walls, cpus = [], []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, env=env)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--models-dir", type=Path, default=REPO / "models")
    args = ap.parse_args()
    exe = shutil.which("graphmode", path=str(Path(sys.executable).parent))
    graphmode = [exe] if exe else [sys.executable, "-m", "graphmode.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for shape in ("llama-3.2-1b", "llama-3.1-8b"):
            dirs[shape] = Path(tmp) / shape
            dirs[shape].mkdir()
            shutil.copy(REPO / "models" / "shapes" / f"{shape}.json", dirs[shape] / "config.json")

        def launch(shape: str) -> list[str]:
            return [*graphmode, "launch", "--dry-run", "--models-dir", str(args.models_dir), "--vllm-version",
                    "0.24.0", "--rate", "8", "--input-tokens", "512", "--output-tokens", "128",
                    "--", "--model", str(dirs[shape])]

        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "graphmode --help": [*graphmode, "--help"],
            "launch --dry-run": launch("llama-3.2-1b"),
            "launch, other shape": launch("llama-3.1-8b"),
        }
        times = {name: timed(argv, args.runs) for name, argv in cases.items()}
    base = statistics.median(times["python -c pass"][0])
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.runs} runs each")
    print(f"{'command':<20} {'wall s':>7} {'max s':>7} {'CPU s':>7} {'wall × python -c pass':>22}")
    for name, (walls, cpus) in times.items():
        med = statistics.median(walls)
        print(f"{name:<20} {med:>7.3f} {max(walls):>7.3f} {statistics.median(cpus):>7.3f} {med / base:>22.1f}")
    walls, cpus = times["launch --dry-run"]
    verdict = "meets" if statistics.median(walls) <= 1.0 else "MISSES"
    print(f"launch --dry-run {verdict} the 1 s target: median wall {statistics.median(walls):.2f} s, "
          f"CPU {statistics.median(cpus):.2f} s (decision table); another shape loads the model: "
          f"{statistics.median(times['launch, other shape'][0]):.2f} s")


if __name__ == "__main__":
    main()
