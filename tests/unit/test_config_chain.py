"""bench/gpu/config_chain.sh end to end on the CPU: two tiny configurations against tests/support/fake_vllm.py,
one of which vLLM refuses (an attention backend it does not know); the chain records vLLM's root cause for
it, goes on to the other, collects into $OUT, and a second call with the same arguments races nothing again."""

from __future__ import annotations

import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.chains import ROOT, chain_env

CHAIN = ROOT / "bench" / "gpu" / "config_chain.sh"

pytestmark = pytest.mark.timeout(300)

GRID = """name: tiny
defaults: {duration_s: 1, warmup_s: 0}
workloads:
  - {name: w-decode, rate: 10, input: {mean: 16}, output: {mean: 16}}
  - {name: w-prefill, rate: 10, burstiness: 0.5, input: {mean: 256}, output: {mean: 8}}
"""


def campaign(tmp_path: Path) -> Path:
    grid = tmp_path / "tiny.yaml"
    grid.write_text(GRID)
    common = (f"shape: llama-3.2-1b, kv: 1G, budget_min: 2, starts: 1, max_rounds: 3, cell_s: 0.6, "
              f"cell_warmup_s: 0.3, modes: [NONE], grid: {grid}")
    p = tmp_path / "campaign.yaml"
    p.write_text(f"name: tiny\nlease_min: 5\nconfigs:\n"
                 f"  - {{name: refused, attention_backend: BOGUS_ATTN, {common}}}\n"
                 f"  - {{name: triton, attention_backend: TRITON_ATTN, {common}}}\n")
    return p


def chain(tmp_path: Path, file: Path, *items: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = chain_env(tmp_path, tmp_path / "work", out)
    return subprocess.run(["bash", str(CHAIN), "240", str(file), *items], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=280)


def test_a_refused_configuration_is_recorded_and_the_chain_goes_on(tmp_path: Path) -> None:
    file = campaign(tmp_path)
    r = chain(tmp_path, file, "@1")
    assert r.returncode == 0, r.stderr
    assert "chain finished" in r.stdout
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text().splitlines()
    refused = next(line for line in summary if line.startswith("refused:"))
    assert refused.startswith("refused: FAILED (every engine failed): ")
    assert "--attention-backend" in refused and "BOGUS_ATTN" in refused  # vLLM's own words, not the wrapper
    ok = next(line for line in summary if line.startswith("triton:"))
    assert ok.startswith("triton: ok, ") and "FAILED" not in ok and "NONE itl_p50 " in ok
    # the window check (bench/race_windows.py): a fixed warm-up, so no spread between an arm and the default
    windows = [line.split() for line in summary if line.startswith("t-triton.sqlite")]
    assert windows and all(w[4] == "0.00" for w in windows), summary
    assert {p.name for p in out.iterdir()} <= {"t-refused.sqlite", "t-triton.sqlite", "logs.tgz", "summary.txt",
                                                "gpu.csv"}
    with sqlite3.connect(out / "t-triton.sqlite") as db:
        backends = {r[0] for r in db.execute("SELECT dep_attention_backend FROM cells WHERE status = 'ok'")}
        n_ok = db.execute("SELECT COUNT(*) FROM cells WHERE status = 'ok'").fetchone()[0]
    assert backends == {"TRITON_ATTN"} and n_ok >= 2
    with sqlite3.connect(out / "t-refused.sqlite") as db:
        rows = db.execute("SELECT status, reason FROM cells").fetchall()
    assert rows and all(s == "failed" and "BOGUS_ATTN" in reason for s, reason in rows)

    # resumable: the same call again races nothing and reports the same lines
    again = chain(tmp_path, file, "refused", "triton")
    assert again.returncode == 0, again.stderr
    lines = (out / "summary.txt").read_text().splitlines()
    assert refused in lines and ok in lines
    assert "(done before)" in (tmp_path / "work" / "chain.out").read_text()


def test_a_bad_campaign_file_stops_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nconfigs:\n  - {name: a, shape: nope, budget_min: 1}\n")
    r = chain(tmp_path, bad, "a")
    assert r.returncode == 2 and "error: campaign" in r.stderr and "nope" in r.stderr
    assert not (tmp_path / "work" / "chain.pid").exists()


def test_a_host_without_the_bundle_stops_in_the_call_and_says_so(tmp_path: Path) -> None:
    # a python that cannot import graphmode's dependencies: what a host new since the bundle calls runs
    isolated = tmp_path / "python-isolated"
    isolated.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S \"$@\"\n")
    isolated.chmod(0o755)
    env = {**os.environ, "GM_CHAIN_WORK": str(tmp_path / "work"), "GM_PYTHON": str(isolated),
           "GM_SITE": str(tmp_path / "no-site"), "RACE_TAG": "t", "OUT": str(tmp_path)}
    r = subprocess.run(["bash", str(CHAIN), "5", str(campaign(tmp_path)), "@1"], cwd=ROOT, env=env, text=True,
                       capture_output=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "does not import" in r.stderr and "make the bundle calls again" in r.stderr
    assert not (tmp_path / "work" / "chain.pid").exists()
