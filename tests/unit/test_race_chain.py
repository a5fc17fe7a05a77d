"""bench/gpu/race_chain.sh on the CPU against tests/support/fake_vllm.py: a race that would start too late for
GM_CHAIN_END_S is skipped and the chain goes on; a race that runs collects its dataset into $OUT; the host's
kernel caches go back as kcache.tgz and a later chain restores them before it races."""

from __future__ import annotations

import sqlite3
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.support.chains import ROOT, chain_env

CHAIN = ROOT / "bench" / "gpu" / "race_chain.sh"

pytestmark = pytest.mark.timeout(300)

GRID = """name: one-workload
defaults: {duration_s: 1, warmup_s: 0}
workloads: [{name: w-decode, rate: 10, input: {mean: 16}, output: {mean: 16}}]
"""
RACE = ["--modes", "NONE", "--starts", "1", "--max-rounds", "2", "--cell-s", "0.6", "--cell-warmup-s", "0.3"]


def chain(tmp_path: Path, name: str, *assign: str, env: dict[str, str] | None = None,
          race: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    out = tmp_path / f"out-{name}"
    out.mkdir()
    grid = tmp_path / "tiny.yaml"
    grid.write_text(GRID)
    full = chain_env(tmp_path, tmp_path / f"work-{name}", out, HOME=str(tmp_path / "home"), **(env or {}))
    options = [*(race if race is not None else RACE), "--grid", str(grid)]
    return subprocess.run(["bash", str(CHAIN), "240", *assign, "--", *options], cwd=ROOT, env=full, text=True,
                          capture_output=True, timeout=280)


def test_a_race_that_would_start_too_late_is_skipped_and_the_chain_goes_on(tmp_path: Path) -> None:
    r = chain(tmp_path, "late", "qwen2.5-0.5b:1G::2", "llama-3.2-1b:1G::2",
              env={"GM_CHAIN_END_S": "0", "GM_KCACHE_DIRS": str(tmp_path / "none")})
    assert "chain finished" in r.stdout, r.stderr
    log = (tmp_path / "work-late" / "chain.out").read_text()
    for a in ("qwen2.5-0.5b:1G::2", "llama-3.2-1b:1G::2"):
        assert f"chain: {a} skipped: " in log and "before GM_CHAIN_END_S, a race needs 420" in log
    assert "racing" not in log and not list((tmp_path / "work-late").glob("race-*.out"))
    summary = (tmp_path / "out-late" / "summary.txt").read_text()
    assert "qwen2.5-0.5b: not started" in summary and "llama-3.2-1b: not started" in summary


def test_a_bad_deadline_is_refused_before_anything_starts(tmp_path: Path) -> None:
    r = chain(tmp_path, "bad", "qwen2.5-0.5b:1G::2", env={"GM_CHAIN_END_S": "ten"})
    assert r.returncode == 2 and "GM_CHAIN_END_S, GM_CHAIN_MIN_RACE_S: seconds" in r.stderr
    assert not (tmp_path / "work-bad" / "chain.pid").exists()


def test_a_race_runs_collects_and_its_kernel_caches_travel_to_the_next_host(tmp_path: Path) -> None:
    cache = tmp_path / "home" / ".cache" / "flashinfer"
    (cache / "sampling").mkdir(parents=True)
    (cache / "sampling" / "sampling.so").write_bytes(b"built once")
    r = chain(tmp_path, "run", "qwen2.5-0.5b:1G::2", env={"GM_CHAIN_END_S": "100000", "GM_KCACHE_DIRS": str(cache)})
    assert "chain finished" in r.stdout, r.stdout + r.stderr
    out = tmp_path / "out-run"
    with sqlite3.connect(out / "t-qwen2.5-0.5b.sqlite") as db:
        modes = {m for (m,) in db.execute("SELECT mode FROM cells WHERE status = 'ok'")}
    assert modes == {"NONE", "FULL_AND_PIECEWISE"}
    assert "skipped" not in (tmp_path / "work-run" / "chain.out").read_text()
    with tarfile.open(out / "kcache.tgz") as tar:
        assert str(cache / "sampling" / "sampling.so").lstrip("/") in tar.getnames()
    assert f"kcache.tgz: {str(cache).lstrip('/')}" in (out / "summary.txt").read_text()

    # the next host: the cache is gone until the chain restores it from the archive that came back
    (cache / "sampling" / "sampling.so").unlink()
    r2 = chain(tmp_path, "next", "qwen2.5-0.5b:1G::2", race=["--modes", "NONE", "--max-rounds", "1"],
               env={"GM_CHAIN_END_S": "0", "GM_KCACHE_FROM": str(out / "kcache.tgz"),
                    "GM_KCACHE_DIRS": str(tmp_path / "none")})
    assert f"restored kernel caches from {out / 'kcache.tgz'}" in r2.stdout, r2.stdout + r2.stderr
    assert (cache / "sampling" / "sampling.so").read_bytes() == b"built once"
