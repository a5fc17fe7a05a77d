"""Drive a managed ``graphmode watch --listen`` through a traffic shift and record what it decided.

Starts ``graphmode watch`` (it starts vLLM behind its proxy), then sends two phases of traffic through
the proxy with token-level timing (graphmode's own load generator):

* **A**: concurrency 1, short prompts (64 tokens in, 128 out): the race verdicts give FULL the best TTFT
  here. It ends ``--a-after-s`` after a switch completes, or at ``--a-max-s`` with no switch under way.
* **B**: an open-loop Poisson load of long prompts (2048 in, 128 out at 4 req/s): FULL's TTFT win is
  gone (the verdicts tie it with the default). It runs ``--b-s`` seconds (longer while a switch is under
  way), always ending before ``--deadline-s``.

A poller reads watch's ``/v1/deployments/ID`` every 0.25 s (serving mode, switch counts) and, where
``nvidia-smi`` exists, GPU memory every 2 s (a blue/green switch holds two servers). At the end watch is
stopped (SIGTERM: it stops vLLM and saves its state) and ``--out`` gets at most six flat files:
``summary.json`` (requests sent/ok/failed/cut per phase, TTFT/ITL before/during/after each switch, each
decision with its numbers, each switch's overlap or downtime), ``decisions.jsonl`` (watch's decision log
from its state file), ``watch.log``, ``requests.csv.gz``, ``engines.tgz`` (the vLLM logs) and
``state.json``. A request is *lost* when it got no full answer (an error or a non-200, a 503 during a
stop-then-start included); one the client itself cut at a phase's end is *cut*, not lost.

Settings that watch reads from ``GRAPHMODE_CONTROL__*`` (window, dwell, cooldown) are shortened here so a
decision fits a few minutes; the policy's rule (gain, hysteresis, benefit vs restart cost) is unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gzip
import itertools
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np

from graphmode.control.target import launch_target
from graphmode.core.errors import GraphmodeError
from graphmode.core.settings import load_settings
from graphmode.profiling.arrivals import PlannedRequest
from graphmode.profiling.loadgen import _one_request, run_load
from graphmode.profiling.stats import RequestResult
from graphmode.selector.recommend import Recommender

DEPLOYMENT = "watch-run"
ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Options; each defaults to its ``GM_WATCH_*`` environment variable where one is set."""
    e = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path(e("GM_WATCH_WORK", "/tmp/gmw")))
    p.add_argument("--out", type=Path, default=None, help="default: WORK/out")
    p.add_argument("--model-dir", type=Path, required=True, help="the served model (its config.json)")
    p.add_argument("--vllm-cmd", default=e("GM_VLLM_CMD", "python3 -m vllm.entrypoints.openai.api_server"))
    p.add_argument("--python", default=e("GM_PYTHON", sys.executable), help="runs graphmode")
    p.add_argument("--models-dir", type=Path, default=None, help="graphmode's registry (default: its own)")
    p.add_argument("--model-id", default=e("GM_WATCH_MODEL_ID") or None)
    p.add_argument("--port", type=int, default=int(e("GM_WATCH_PORT", "8400")))
    p.add_argument("--api-port", type=int, default=int(e("GM_WATCH_API_PORT", "9400")))
    p.add_argument("--strategy", default=e("GM_WATCH_STRATEGY", "blue-green"))
    p.add_argument("--initial-mode", default=e("GM_WATCH_INITIAL", "") or None,
                   help="watch's first mode (default: vLLM's default)")
    p.add_argument("--objective", default=e("GM_WATCH_OBJECTIVE", "ttft_p50"))
    p.add_argument("--interval", type=float, default=float(e("GM_WATCH_INTERVAL", "1")))
    p.add_argument("--evaluate-every", type=float, default=float(e("GM_WATCH_EVALUATE_EVERY", "3")))
    p.add_argument("--confirmations", type=int, default=int(e("GM_WATCH_CONFIRMATIONS", "3")))
    p.add_argument("--window-s", type=float, default=float(e("GM_WATCH_WINDOW_S", "15")))
    p.add_argument("--min-dwell-s", type=float, default=float(e("GM_WATCH_MIN_DWELL_S", "20")))
    p.add_argument("--cooldown-s", type=float, default=float(e("GM_WATCH_COOLDOWN_S", "30")))
    p.add_argument("--a-max-s", type=float, default=float(e("GM_WATCH_A_MAX_S", "180")))
    p.add_argument("--a-after-s", type=float, default=float(e("GM_WATCH_A_AFTER_S", "20")))
    p.add_argument("--a-input", type=int, default=int(e("GM_WATCH_A_INPUT", "64")))
    p.add_argument("--a-output", type=int, default=int(e("GM_WATCH_A_OUTPUT", "128")))
    p.add_argument("--b-s", type=float, default=float(e("GM_WATCH_B_S", "60")))
    p.add_argument("--b-rate", type=float, default=float(e("GM_WATCH_B_RATE", "4")))
    p.add_argument("--b-input", type=int, default=int(e("GM_WATCH_B_INPUT", "2048")))
    p.add_argument("--b-output", type=int, default=int(e("GM_WATCH_B_OUTPUT", "128")))
    p.add_argument("--deadline-s", type=float, default=float(e("GM_WATCH_DEADLINE_S", "560")),
                   help="everything (vLLM starts included) ends by then and the output is written")
    p.add_argument("--startup-timeout-s", type=float, default=float(e("GM_WATCH_STARTUP_TIMEOUT_S", "400")))
    p.add_argument("vllm_args", nargs="*", help="vLLM args after --model (after --)")
    a = p.parse_args(argv)
    a.out = a.out or a.work / "out"
    return a


@dataclass
class Watched:
    """What the poller saw of watch: serving-mode changes and switch counts, GPU memory samples."""

    modes: list[tuple[float, str | None]] = field(default_factory=list)
    switches: int = 0
    failed: int = 0
    switch_done_at: float | None = None
    in_switch: bool = False
    gpu_mem: list[tuple[float, float]] = field(default_factory=list)
    features: list[dict[str, Any]] = field(default_factory=list)  # what each evaluation saw
    snapshot: dict[str, Any] = field(default_factory=dict)

    def mode_at(self, t: float) -> str | None:
        mode = None
        for at, m in self.modes:
            if at <= t:
                mode = m
        return mode


def poll(api: str, seen: Watched, stop: threading.Event) -> None:
    """Every 0.25 s: watch's deployment snapshot; every 2 s: GPU memory used (MiB) where nvidia-smi runs."""
    smi = shutil.which("nvidia-smi")
    next_gpu = 0.0
    with httpx.Client(timeout=2.0) as c:
        while not stop.is_set():
            now = time.time()
            try:
                snap = c.get(f"{api}/v1/deployments/{DEPLOYMENT}").json()
            except (httpx.HTTPError, ValueError):
                snap = None
            if isinstance(snap, dict):
                seen.snapshot = snap
                mode = snap.get("serving_mode")
                if not seen.modes or seen.modes[-1][1] != mode:
                    seen.modes.append((now, mode))
                done = int(snap.get("switches") or 0) + int(snap.get("failed_switches") or 0)
                if done > seen.switches + seen.failed:
                    seen.switch_done_at = now
                seen.switches, seen.failed = int(snap.get("switches") or 0), int(snap.get("failed_switches") or 0)
                feats, at = snap.get("last_features"), snap.get("last_features_at")
                if isinstance(feats, dict) and at and (not seen.features or seen.features[-1]["t"] != at):
                    seen.features.append({"t": at, **{k: v for k, v in feats.items() if v is not None}})
                last = snap.get("last_decision") or {}
                seen.in_switch = last.get("action") == "switch" and (seen.switch_done_at or 0) < last.get("t", 0)
            if smi and now >= next_gpu:
                next_gpu = now + 2.0
                try:
                    r = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                       capture_output=True, text=True, timeout=5, check=False)
                    seen.gpu_mem.append((now, sum(float(x) for x in r.stdout.split())))
                except (OSError, ValueError, subprocess.TimeoutExpired):
                    smi = None
            stop.wait(0.25)


def start_watch(a: argparse.Namespace) -> subprocess.Popen[bytes]:
    """``graphmode watch --listen`` managing one vLLM of ``--model-dir``, its log in WORK/watch.log."""
    env = dict(os.environ,
               GRAPHMODE_CONTROL__WINDOW_S=str(a.window_s), GRAPHMODE_CONTROL__MIN_DWELL_S=str(a.min_dwell_s),
               GRAPHMODE_CONTROL__COOLDOWN_S=str(a.cooldown_s),
               GRAPHMODE_VLLM__STARTUP_TIMEOUT_S=str(a.startup_timeout_s), PYTHONUNBUFFERED="1")
    cmd = [a.python, "-m", "graphmode.cli", "watch", "--deployment-id", DEPLOYMENT,
           "--listen", f"127.0.0.1:{a.port}", "--api-port", str(a.api_port), "--strategy", a.strategy,
           "--objective", a.objective, "--interval", str(a.interval), "--evaluate-every", str(a.evaluate_every),
           "--confirmations", str(a.confirmations), "--state-dir", str(a.work / "state"),
           "--vllm-cmd", a.vllm_cmd]
    if a.initial_mode:
        cmd += ["--initial-mode", a.initial_mode]
    if a.models_dir:
        cmd += ["--models-dir", str(a.models_dir)]
    if a.model_id:
        cmd += ["--model-id", a.model_id]
    cmd += ["--", "--model", str(a.model_dir), *a.vllm_args]
    a.watch_cmd = shlex.join(cmd)
    (a.work / "watch.cmd").write_text(a.watch_cmd + "\n")
    log = (a.work / "watch.log").open("ab")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def wait_ready(a: argparse.Namespace, proc: subprocess.Popen[bytes], until: float) -> str | None:
    """The served model's name once the proxy answers /v1/models; None when watch exited or time ran out."""
    with httpx.Client(timeout=2.0) as c:
        while time.time() < until and proc.poll() is None:
            try:
                r = c.get(f"http://127.0.0.1:{a.port}/v1/models")
                if r.status_code == 200:
                    return str(r.json()["data"][0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                pass
            time.sleep(0.5)
    return None


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``n`` random token-id prompts (random ids defeat prefix caching, so each prefill is real)."""
    ids: list[list[int]] = np.random.default_rng(seed).integers(10, vocab, size=(n, length)).tolist()
    return ids


@dataclass
class Phase:
    name: str
    results: list[RequestResult]
    t0_wall: float
    t0_perf: float
    end_wall: float = 0.0

    def wall(self, perf: float | None) -> float | None:
        return None if perf is None else self.t0_wall + (perf - self.t0_perf)


def should_stop(ph: Phase, seen: Watched, switches_at_start: int, *, min_s: float, after_s: float,
                hard_end: float, end_after_switch: bool) -> bool:
    """Whether a phase has seen enough: never before a switch under way ends (unless ``hard_end``); then
    ``after_s`` of the new mode; without a switch, ``min_s``. ``end_after_switch`` ends the phase
    ``after_s`` after a switch even before ``min_s``."""
    now = time.time()
    if now >= hard_end:
        return True
    if seen.in_switch:
        return False
    switched = seen.switches + seen.failed > switches_at_start and seen.switch_done_at is not None
    settled = not switched or now - (seen.switch_done_at or now) >= after_s
    if switched and end_after_switch:
        return settled
    return now - ph.t0_wall >= min_s and settled


async def closed_loop(base: str, model: str, plans: list[PlannedRequest], results: list[RequestResult],
                      stop: asyncio.Event) -> None:
    """Concurrency 1: each request as soon as the previous one ended; after a failure (a 503 while a
    restart has nothing serving) wait 0.5 s instead of spinning."""
    url = base + "/v1/completions"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=300.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for plan in plans:
            if stop.is_set():
                return
            r = RequestResult(sent_at=time.perf_counter(), input_tokens=len(plan.prompt), max_tokens=plan.max_tokens)
            results.append(r)
            task = asyncio.create_task(_one_request(session, url, model, plan, r))
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                r.cut, r.error = True, "cut: the phase ended"
                return
            if not r.ok:
                await asyncio.sleep(0.5)


async def run_phase(name: str, base: str, model: str, plans: list[PlannedRequest], seen: Watched, *,
                    closed: bool, min_s: float, after_s: float, hard_end: float) -> Phase:
    """Send ``plans`` (closed loop at concurrency 1, else open loop on their schedule) until
    :func:`should_stop`; what is in flight then is cut."""
    results: list[RequestResult] = []
    stop = asyncio.Event()
    ph = Phase(name, results, time.time(), time.perf_counter())
    at_start = seen.switches + seen.failed

    async def monitor() -> None:
        while not stop.is_set() and not should_stop(ph, seen, at_start, min_s=min_s, after_s=after_s,
                                                    hard_end=hard_end, end_after_switch=closed):
            await asyncio.sleep(0.2)
        stop.set()

    mon = asyncio.create_task(monitor())
    if closed:
        await closed_loop(base, model, plans, results, stop)
    else:
        await run_load(base, model, plans, deadline_s=hard_end - ph.t0_wall + 5, t0=ph.t0_perf, stop=stop,
                       results=results)
    stop.set()
    await mon
    ph.end_wall = time.time()
    return ph


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def r3(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def latency(rs: list[RequestResult]) -> dict[str, Any]:
    """TTFT/ITL/E2E (ms) of the ok requests in ``rs``."""
    ok = [r for r in rs if r.ok]
    ttft = [r.ttft * 1e3 for r in ok if r.ttft is not None]
    itl = [x * 1e3 for r in ok for x in r.itls]
    e2e = [r.e2e * 1e3 for r in ok if r.e2e is not None]
    return {"ok": len(ok), "ttft_p50_ms": r3(pct(ttft, 0.5)), "ttft_p90_ms": r3(pct(ttft, 0.9)),
            "ttft_mean_ms": r3(statistics.fmean(ttft)) if ttft else None,
            "itl_p50_ms": r3(pct(itl, 0.5)), "itl_p90_ms": r3(pct(itl, 0.9)),
            "e2e_p50_ms": r3(pct(e2e, 0.5))}


def counts(rs: list[RequestResult]) -> dict[str, int]:
    sent = [r for r in rs if r.started_at is not None]
    return {"sent": len(sent), "ok": sum(r.ok for r in sent), "cut": sum(r.cut for r in sent),
            "lost": sum(1 for r in sent if not r.ok and not r.cut), "planned_not_sent": len(rs) - len(sent)}


def switch_events(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each switch attempt: when watch decided it, when it ended, the decision's numbers and the result."""
    out: list[dict[str, Any]] = []
    decided: dict[str, Any] | None = None
    for d in decisions:
        if d.get("action") == "switch":
            decided = d
        elif d.get("action") in ("switched", "switch-failed"):
            t0 = decided["t"] if decided else None
            out.append({"from": decided.get("current") if decided else None, "to": d.get("target"),
                        "ok": d["action"] == "switched", "decided_at": t0, "done_at": d.get("t"),
                        "switch_s": round(d["t"] - t0, 3) if t0 else None, "reason": d.get("reason"),
                        "downtime_s": d.get("downtime_s"), "new_server_startup_s": d.get("startup_s"),
                        "decision_numbers": decided.get("numbers") if decided else None})
            decided = None
    return out


def around_switch(phases: list[Phase], sw: dict[str, Any], seen: Watched) -> dict[str, Any]:
    """Client-side view of one switch: requests sent while it ran and how many were lost (every phase),
    the longest gap between two answered requests, TTFT/ITL before and after it within the phase it was
    decided in (the same traffic) and while it ran (the old server shares the GPU with the new one's
    start), GPU memory before and at most during it."""
    t0, t1 = sw["decided_at"], sw["done_at"]
    if t0 is None or t1 is None:
        return {}
    home = next((ph for ph in phases if ph.t0_wall <= t0 <= ph.end_wall), None)
    during: list[RequestResult] = []
    before: list[RequestResult] = []
    after: list[RequestResult] = []
    ends: list[float] = []
    for ph in phases:
        for r in ph.results:
            sent = ph.wall(r.started_at)
            if sent is None:
                continue
            if t0 <= sent <= t1:
                during.append(r)
            elif ph is home:
                (before if sent < t0 else after).append(r)
            done = ph.wall(r.done_at)
            if r.ok and done is not None:
                ends.append(done)
    ends.sort()
    gaps = [b - a for a, b in itertools.pairwise(ends) if b >= t0 and a <= t1 + 1]
    mem_before = [m for t, m in seen.gpu_mem if t < t0]
    mem_during = [m for t, m in seen.gpu_mem if t0 <= t <= t1]
    return {"phase": home.name if home else None, "sent_during": len(during),
            "lost_during": sum(1 for r in during if not r.ok and not r.cut),
            "longest_gap_between_answers_s": round(max(gaps), 3) if gaps else None,
            "before": latency(before[-60:]), "during": latency(during), "after": latency(after),
            "gpu_mem_mib_before": mem_before[-1] if mem_before else None,
            "gpu_mem_mib_max_during": max(mem_during) if mem_during else None}


def picked_model(a: argparse.Namespace) -> dict[str, Any]:
    """The model watch's local advisor loads for this deployment (the same target: this host's GPU, vLLM's
    release from the command's environment, the served shape) and the notes on what it could not read."""
    target, notes = launch_target(shlex.split(a.vllm_cmd), ["--model", str(a.model_dir), *a.vllm_args])
    try:
        rec = Recommender.load(a.models_dir or load_settings().selector.models_dir, a.model_id, target=target)
    except (GraphmodeError, OSError, ValueError) as exc:
        return {"model_id": None, "error": str(exc), "notes": notes}
    return {"model_id": rec.model_id, "target_gpu": target.gpu_name, "target_vllm": target.vllm_version,
            "notes": notes}


def copy_log(src: Path, dst: Path) -> int:
    """Copy watch's log without httpx's line per proxied request or scrape (``HTTP Request: ...``): what
    is left are the decisions, switches and notes. The number of lines left out is appended."""
    dropped = 0
    with src.open(errors="replace") as fin, dst.open("w") as fout:
        for line in fin:
            if " HTTP Request: " in line:
                dropped += 1
            else:
                fout.write(line)
        fout.write(f"[watch_drive: {dropped} 'HTTP Request:' lines of httpx left out]\n")
    return dropped


def write_requests(path: Path, phases: list[Phase], seen: Watched) -> None:
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["phase", "i", "sent_at", "mode_at_send", "ok", "cut", "error", "input_tokens",
                    "output_tokens", "ttft_s", "itl_mean_s", "e2e_s", "done_at"])
        for ph in phases:
            for i, r in enumerate(ph.results):
                sent = ph.wall(r.started_at)
                if sent is None:
                    continue
                itl = statistics.fmean(r.itls) if r.itls else None
                w.writerow([ph.name, i, f"{sent:.4f}", seen.mode_at(sent), int(r.ok), int(r.cut), r.error or "",
                            r.input_tokens, r.output_tokens, r.ttft, itl, r.e2e, ph.wall(r.done_at)])


def stop_watch(proc: subprocess.Popen[bytes], timeout_s: float = 90.0) -> int | None:
    """SIGTERM watch (it stops vLLM and saves its state); SIGKILL it after ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def phase_summary(ph: Phase, seen: Watched) -> dict[str, Any]:
    """Counts and latency of one phase, split by the mode serving when each request was sent."""
    by_mode: dict[str, list[RequestResult]] = {}
    for r in ph.results:
        sent = ph.wall(r.started_at)
        if sent is not None:
            by_mode.setdefault(str(seen.mode_at(sent)), []).append(r)
    return {"name": ph.name, "start": ph.t0_wall, "end": ph.end_wall, "seconds": round(ph.end_wall - ph.t0_wall, 2),
            **counts(ph.results), "latency": latency(ph.results),
            "by_mode_at_send": {m: {**counts(rs), **latency(rs)} for m, rs in by_mode.items()}}


def collect(a: argparse.Namespace, phases: list[Phase], seen: Watched, info: dict[str, Any]) -> dict[str, Any]:
    """Write the output files; the summary."""
    a.out.mkdir(parents=True, exist_ok=True)
    state_file = a.work / "state" / f"{DEPLOYMENT}.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    if state_file.exists():
        shutil.copy(state_file, a.out / "state.json")
    decisions = state.get("decisions") or (seen.snapshot.get("decisions") or [])
    with (a.out / "decisions.jsonl").open("w") as f:
        for d in decisions:
            f.write(json.dumps(d, sort_keys=True) + "\n")
    if (a.work / "watch.log").exists():
        copy_log(a.work / "watch.log", a.out / "watch.log")
    write_requests(a.out / "requests.csv.gz", phases, seen)
    logs = a.work / "state" / "logs"
    with tarfile.open(a.out / "engines.tgz", "w:gz") as tar:
        for log in sorted(logs.rglob("*.log")) if logs.exists() else []:  # logs only, never a cache
            tar.add(log, arcname=f"engine-logs/{log.relative_to(logs)}")
    switches = switch_events(decisions)
    for sw in switches:
        sw["client"] = around_switch(phases, sw, seen)
    total = [r for ph in phases for r in ph.results]
    summary = {**info, "deployment": DEPLOYMENT, "watch_command": getattr(a, "watch_cmd", None),
               "strategy": a.strategy, "objective": a.objective,
               "settings": {k: getattr(a, k) for k in ("interval", "evaluate_every", "confirmations", "window_s",
                                                       "min_dwell_s", "cooldown_s", "initial_mode")},
               "requests": counts(total), "phases": [phase_summary(ph, seen) for ph in phases],
               "modes_seen": [{"t": t, "mode": m} for t, m in seen.modes], "switches": switches,
               "features_seen": seen.features,
               "decisions": [{k: d.get(k) for k in ("t", "action", "current", "target", "reason", "numbers")}
                             for d in decisions if d.get("action") in ("stay", "hold", "switch")],
               "final_mode": state.get("current_mode")}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True, default=str) + "\n")
    return summary


def plans_a(a: argparse.Namespace, vocab: int, seconds: float) -> list[PlannedRequest]:
    n = int(seconds * 20) + 20  # closed loop at concurrency 1: more than it can send
    return [PlannedRequest(0.0, p, a.a_output) for p in prompts(n, a.a_input, vocab, 1)]


def plans_b(a: argparse.Namespace, vocab: int, seconds: float) -> list[PlannedRequest]:
    rng, t, times = random.Random(2), 0.0, []
    while True:
        t += rng.expovariate(a.b_rate)
        if t >= seconds:
            break
        times.append(t)
    return [PlannedRequest(at, p, a.b_output) for at, p in zip(times, prompts(len(times), a.b_input, vocab, 3),
                                                                strict=True)]


async def drive(a: argparse.Namespace, model: str, seen: Watched, t_start: float) -> list[Phase]:
    cfg = json.loads((a.model_dir / "config.json").read_text())
    vocab = int(cfg.get("vocab_size") or 32000)
    base = f"http://127.0.0.1:{a.port}"
    end = t_start + a.deadline_s - 30  # room to stop watch and write the output
    phases = []
    a_end = end - min(a.b_s, 30.0)  # phase B gets at least 30 s
    phases.append(await run_phase("A", base, model, plans_a(a, vocab, a_end - time.time()), seen, closed=True,
                                  min_s=a.a_max_s, after_s=a.a_after_s, hard_end=a_end))
    b_s = max(min(a.b_s, end - time.time()), 0.0)
    if b_s > 1:
        plans = plans_b(a, vocab, min(end - time.time(), b_s + a.startup_timeout_s))
        phases.append(await run_phase("B", base, model, plans, seen, closed=False, min_s=b_s, after_s=a.a_after_s,
                                      hard_end=end))
    return phases


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.time()
    a.work.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"started_at": t_start, "model_dir": str(a.model_dir), "vllm_cmd": a.vllm_cmd,
                            "vllm_args": a.vllm_args, "advisor_model": picked_model(a)}
    proc = start_watch(a)
    model = wait_ready(a, proc, t_start + a.deadline_s - 30)
    info["first_server_ready_s"] = round(time.time() - t_start, 2) if model else None
    seen, stop = Watched(), threading.Event()
    poller = threading.Thread(target=poll, args=(f"http://127.0.0.1:{a.api_port}", seen, stop), daemon=True)
    poller.start()
    for _ in range(40):  # the serving mode of the first requests
        if seen.modes:
            break
        time.sleep(0.25)
    phases: list[Phase] = []
    try:
        if model is None:
            info["error"] = f"watch never served (exit {proc.poll()}): see watch.log"
        else:
            phases = asyncio.run(drive(a, model, seen, t_start))
    finally:
        time.sleep(1.0)  # a last snapshot
        stop.set()
        poller.join(5)
        info["watch_exit"] = stop_watch(proc)
        info["wall_s"] = round(time.time() - t_start, 2)
        s = collect(a, phases, seen, info)
    print_summary(s)
    return 0 if model is not None else 1


def print_summary(s: dict[str, Any]) -> None:
    print(f"watch run: {s['wall_s']} s, first server ready after {s.get('first_server_ready_s')} s, "
          f"final mode {s.get('final_mode')}; requests {s['requests']}")
    print(f"  advisor model: {s['advisor_model'].get('model_id')} (target GPU "
          f"{s['advisor_model'].get('target_gpu')}, vLLM {s['advisor_model'].get('target_vllm')})")
    for ph in s["phases"]:
        lat = ph["latency"]
        print(f"  phase {ph['name']} {ph['seconds']} s: sent {ph['sent']} ok {ph['ok']} lost {ph['lost']} "
              f"cut {ph['cut']}; TTFT p50 {lat['ttft_p50_ms']} ms, ITL p50 {lat['itl_p50_ms']} ms; "
              f"by mode {json.dumps({m: v['ttft_p50_ms'] for m, v in ph['by_mode_at_send'].items()})}")
    for sw in s["switches"]:
        c = sw.get("client") or {}
        print(f"  switch {sw['from']} -> {sw['to']} ok={sw['ok']} in {sw['switch_s']} s (downtime "
              f"{sw['downtime_s']} s): sent {c.get('sent_during')} lost {c.get('lost_during')} during it, "
              f"TTFT p50 {c.get('before', {}).get('ttft_p50_ms')} -> {c.get('after', {}).get('ttft_p50_ms')} ms")
    acts: dict[str, int] = {}
    for d in s["decisions"]:
        acts[d["action"]] = acts.get(d["action"], 0) + 1
    print(f"  decisions {acts}; last: {s['decisions'][-1]['reason'] if s['decisions'] else None}")
    if s.get("error"):
        print(f"  ERROR: {s['error']}")


if __name__ == "__main__":
    raise SystemExit(main())
