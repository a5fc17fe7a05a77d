#!/usr/bin/env python3
"""Latency of ``POST /v1/recommend`` through a real uvicorn process on loopback, under open-loop load.

::

    .venv/bin/python bench/recommend_latency.py                      # 100, 500, 1000 req/s, 30 s each
    .venv/bin/python bench/recommend_latency.py --duration 10 --compare-threadpool
    .venv/bin/python bench/recommend_latency.py --synthetic          # train a SYNTHETIC model to serve

The service runs in its own process (``graphmode.service.app.create_app`` under ``uvicorn.run``, no access
log), the load generator in this one. Arrivals are open-loop (Poisson by default, ``--arrivals uniform``):
each request has an intended send time and its latency is measured from that time to the last byte of
the response, so a generator or server that falls behind shows up in the numbers rather than being
hidden (no coordinated omission). The generator speaks HTTP/1.1 with keep-alive over raw asyncio streams,
from a pool of connections opened on demand (at most ``--connections``), with pre-encoded request bytes,
so that it costs a fraction of what an HTTP client library would on a 2-core box. ``--pin`` pins the server
to CPU 0 and the generator to CPU 1 (useful on a quiet box; on a shared one it only halves each one's share).

Reported per rate: achieved rate, requests sent, requests shed (the service's fast 503 + Retry-After past its
capacity) and their p99, requests answered (in any way) or timed out more than 1 s after their intended send
time, split into the server's part (more than 1 s from the actual write) and the generator's (written more than
1 s after the intended time: every one of its ``--connections`` was busy), other errors, latency p50/p90/p99/max
of the answered ones (from the intended send time), p99 from the actual write, the generator's own send lag p99
(if that is large, the generator, not the server, was the bottleneck), the server's p99 (upper bound of its
/metrics histogram bucket: time inside the app) and mean, its CPU use and the machine's 1-minute load average
(other work on the box shows up there). Also, in process: what one answer costs (``decide`` and the response's
JSON), p50/p99 and mean over ``--calls`` calls and CPU time per answer (thread CPU time, so other work on the
box does not count), for an observed-features input and a workload description, each warm (the bench's bodies
repeated: the model's memos answer) and cold (a first-seen body every call).

Every rate runs twice on the same server, back to back: first against ``POST /bench/bare`` (the same app,
middleware, request body and schema validation, and a constant answer: no model), then against
``/v1/recommend``. The ratio of their p99s is what the model adds over the box's floor for this server
stack; the target is at most 1.5x at 500 req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import random
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

FEATURES_BODIES = [
    {
        "features": {
            "arrival_rate": r,
            "mean_input_tokens": i,
            "mean_output_tokens": o,
            "batch_mean": b,
            "batch_cv": 0.5,
            "concurrency_mean": b,
            "prefill_decode_ratio": i / o,
        }
    }
    for r, i, o, b in [(2, 512, 128, 1.2), (8, 512, 128, 3.0), (32, 256, 512, 20.0), (8, 2048, 64, 2.5)]
]
WORKLOAD_BODIES = [
    {"workload": {"rate": r, "burstiness": bu, "input_tokens": i, "output_tokens": o}}
    for r, bu, i, o in [(2, 1.0, 512, 128), (8, 0.25, 512, 128), (32, 1.0, 256, 512), (8, 1.0, 2048, 64)]
]
OBJECTIVE = {"metric": "itl_p50", "constraints": ["ttft_p99<=500ms"]}

SERVER_SCRIPT = """
import sys, uvicorn
from pathlib import Path
from graphmode.core.settings import Settings
from graphmode.service.app import create_app
models_dir, model_id, port, threadpool = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), sys.argv[4] == "1"
http, loop = sys.argv[5], sys.argv[6]
app = create_app(Settings(), models_dir=Path(models_dir), model_id=model_id, target=None,
                 recommend_in_threadpool=threadpool)

from fastapi import Response
from graphmode.service.schemas import RecommendRequest

@app.post("/bench/bare")
async def bare(body: RecommendRequest) -> Response:  # the same stack, body and validation; no model
    return Response(b'{"mode":"FULL_AND_PIECEWISE"}', media_type="application/json")

uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http=http, loop=loop)
"""


# ---------------------------------------------------------------------------------------------- load
@dataclass
class RateResult:
    variant: str
    target_rps: float
    duration_s: float
    sent: int = 0
    ok: int = 0
    errors: int = 0
    shed: int = 0  # answered 503 at once: past the service's capacity
    shed_p99_ms: float | None = None
    over_1s: int = 0  # answered (any status) or timed out more than 1 s after the intended send time
    over_1s_sent: int = 0  # ... more than 1 s after it was written: the server's part
    gen_late_1s: int = 0  # written more than 1 s after the intended time (or never): the generator's part
    achieved_rps: float = 0.0
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    p99_from_send_ms: float | None = None
    lag_p99_ms: float | None = None
    server_p99_le_ms: float | None = None
    server_mean_ms: float | None = None
    server_cpu_pct: float | None = None
    gen_cpu_pct: float | None = None
    other_cpu_pct: float | None = None  # the rest of the box: other processes, in % of one CPU
    steal_pct: float | None = None
    loadavg_1m: float | None = None
    connections: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


KEEPALIVE_REUSE_S = 4.0  # uvicorn closes idle keep-alive connections after 5 s: do not reuse older ones


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.last_used = time.perf_counter()


@dataclass
class RunStats:
    latencies: list[float]  # intended send time -> last response byte, ok requests
    from_send: list[float]  # actual write -> last response byte, ok requests
    lags: list[float]  # actual write - intended send time
    sent: int
    errors: dict[str, int]
    wall_s: float
    shed: list[float] = field(default_factory=list)  # intended send time -> 503 answer
    over_1s: int = 0
    over_1s_sent: int = 0
    gen_late_1s: int = 0


class LoadGen:
    """Open-loop HTTP/1.1 keep-alive load over raw asyncio streams."""

    def __init__(self, host: str, port: int, bodies: list[bytes], max_connections: int, timeout_s: float,
                 path: str = "/v1/recommend") -> None:
        self.host, self.port = host, port
        self.requests = [
            (
                f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(b)}\r\n\r\n"
            ).encode()
            + b
            for b in bodies
        ]
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.idle: list[Conn] = []
        self.opened = 0
        self.free = asyncio.Condition()

    async def _acquire(self) -> Conn:
        async with self.free:
            while True:
                if self.idle:
                    conn = self.idle.pop()
                    now = time.perf_counter()
                    if now - conn.last_used < KEEPALIVE_REUSE_S and not conn.reader.at_eof():
                        return conn
                    conn.writer.close()  # the server may have closed it: a real client would not reuse it
                    self.opened -= 1
                    continue
                if self.opened < self.max_connections:
                    self.opened += 1
                    break
                await self.free.wait()
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            async with self.free:
                self.opened -= 1
                self.free.notify()
            raise
        writer.transport.set_write_buffer_limits(high=1 << 20)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return Conn(reader, writer)

    async def _release(self, conn: Conn | None) -> None:
        async with self.free:
            if conn is not None:
                conn.last_used = time.perf_counter()
                self.idle.append(conn)
            else:
                self.opened -= 1
            self.free.notify()

    async def _one(self, payload: bytes, sent: list[float]) -> tuple[int, bytes, float]:
        conn = await self._acquire()
        keep = False
        try:
            sent_at = time.perf_counter()
            sent.append(sent_at)
            conn.writer.write(payload)
            head = await conn.reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
            body = await conn.reader.readexactly(int(m.group(1))) if m else b""
            keep = not re.search(rb"(?i)\r\nconnection:\s*close", head)
            return status, body, sent_at
        finally:
            if not keep:
                conn.writer.close()
            await self._release(conn if keep else None)

    async def run(self, rate: float, duration_s: float, arrivals: str, seed: int) -> RunStats:
        rng = random.Random(seed)
        times: list[float] = []
        t = 0.0
        while True:
            t += rng.expovariate(rate) if arrivals == "poisson" else 1.0 / rate
            if t >= duration_s:
                break
            times.append(t)
        latencies: list[float] = []
        from_send: list[float] = []
        lags: list[float] = []
        errors: dict[str, int] = {}
        shed: list[float] = []
        over = [0, 0, 0]  # over 1 s from the intended time; from the write; written over 1 s late (or never)
        t0 = time.perf_counter() + 0.05
        tasks: list[asyncio.Task[None]] = []

        def late(intended: float, sent: list[float], done: float) -> None:
            over[0] += done - intended > 1.0
            over[1] += bool(sent) and done - sent[0] > 1.0
            over[2] += not sent or sent[0] - intended > 1.0

        async def fire(i: int, intended: float) -> None:
            sent: list[float] = []
            try:
                payload = self.requests[i % len(self.requests)]
                status, body, sent_at = await asyncio.wait_for(self._one(payload, sent), self.timeout_s)
                done = time.perf_counter()
                lags.append(sent_at - intended)
                late(intended, sent, done)
                if status == 200 and b'"mode"' in body:
                    latencies.append(done - intended)
                    from_send.append(done - sent_at)
                elif status == 503:
                    shed.append(done - intended)
                else:
                    errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                late(intended, sent, time.perf_counter())

        i = 0
        n = len(times)
        while i < n:
            now = time.perf_counter()
            while i < n and t0 + times[i] <= now:
                tasks.append(asyncio.ensure_future(fire(i, t0 + times[i])))
                i += 1
            if i < n:
                await asyncio.sleep(max(0.0, t0 + times[i] - time.perf_counter()))
        await asyncio.gather(*tasks)
        return RunStats(latencies, from_send, lags, n, errors, time.perf_counter() - t0, shed, *over)

    async def close(self) -> None:
        for c in self.idle:
            c.writer.close()
        self.idle.clear()
        self.opened = 0


# ---------------------------------------------------------------------------------------------- server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _box_cpu() -> tuple[float, float] | None:
    """Seconds of CPU the whole box spent busy, and stolen by the hypervisor, since boot (/proc/stat)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    return busy / tick, (fields[7] if len(fields) > 7 else 0) / tick


def _server_stats(port: int) -> tuple[float, float, dict[float, float]]:
    """The service's own /metrics for /v1/recommend: (sum s, count, cumulative bucket counts by le)."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
    total = count = 0.0
    buckets: dict[float, float] = {}
    prefix = "graphmode_http_request_duration_seconds"
    for line in text.splitlines():
        if not line.startswith(prefix) or 'route="/v1/recommend"' not in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith(prefix + "_sum"):
            total += value
        elif line.startswith(prefix + "_count"):
            count += value
        elif line.startswith(prefix + "_bucket"):
            m = re.search(r'le="([^"]+)"', line)
            if m:
                le = float(m.group(1))
                buckets[le] = buckets.get(le, 0.0) + value
    return total, count, buckets


def _bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound of the histogram bucket holding quantile ``q`` of what was observed in between."""
    diffs = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    if not diffs or diffs[-1][1] <= 0:
        return None
    need = q * diffs[-1][1]
    return next(le for le, c in diffs if c >= need)


class Server:
    def __init__(
        self,
        models_dir: Path,
        model_id: str | None,
        threadpool: bool,
        cpu: int | None,
        http: str,
        loop: str,
        env: dict[str, str],
    ) -> None:
        self.port = _free_port()
        cmd = [
            sys.executable,
            "-c",
            SERVER_SCRIPT,
            str(models_dir),
            model_id or "",
            str(self.port),
            "1" if threadpool else "0",
            http,
            loop,
        ]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env)
        if cpu is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, {cpu})

    def wait_ready(self, timeout_s: float = 60.0) -> dict[str, Any]:
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                r = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2, trust_env=False)
                if r.status_code == 200:
                    health: dict[str, Any] = r.json()
                    return health
                raise RuntimeError(f"server not healthy: {r.text}")
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------------------------------- in-process
def _unique(kind: str, base: dict[str, Any], i: int) -> Any:
    """Body *base* with its rate moved by a millionth per call: every call a first-seen request (memo misses)."""
    from graphmode.core.records import ObservedFeatures
    from graphmode.selector import WorkloadDescription

    if kind == "features":
        return ObservedFeatures(**{**base, "arrival_rate": base["arrival_rate"] * (1 + (i + 1) * 1e-6)})
    return WorkloadDescription(**{**base, "rate": base["rate"] * (1 + (i + 1) * 1e-6)})


def in_process(models_dir: Path, model_id: str | None, calls: int) -> dict[str, dict[str, float]]:
    """Per input kind, what one answer costs the service's event loop, as its handler runs it: the one decision
    path (``decide``) and the JSON the endpoint sends. Warm: the bench's 4 bodies, repeated (the model's memos
    answer); cold: a body never seen before on every call (a fresh model, so memos only miss). Wall time p50,
    p99 and mean, and CPU time per answer (this thread's, so other work on the box does not count)."""
    from graphmode.core.records import ObservedFeatures
    from graphmode.selector import Recommender, WorkloadDescription
    from graphmode.selector.decide import Request, decide

    rec = Recommender.load(models_dir, model_id)
    out = {}
    bodies: dict[str, list[dict[str, Any]]] = {
        "features": [b["features"] for b in FEATURES_BODIES],
        "workload": [b["workload"] for b in WORKLOAD_BODIES],
    }
    for name, bs in bodies.items():
        make = ObservedFeatures if name == "features" else WorkloadDescription
        for temp in ("warm", "cold"):
            if temp == "cold":
                rec = Recommender.load(models_dir, model_id)
                xs = [_unique(name, bs[i % len(bs)], i) for i in range(calls + 25 * len(bs))]
            else:
                xs = [make(**b) for b in bs]
            for i in range(25 * len(bs)):  # first-call costs (numpy, pydantic) out of the figures
                decide(rec, Request(inputs=xs[(-1 - i) % len(xs)], predict_capture=False)).model_dump_json()
            lat = []
            cpu0 = time.thread_time()
            for i in range(calls):
                x = xs[i % len(xs)]
                t = time.perf_counter()
                decide(rec, Request(inputs=x, predict_capture=False)).model_dump_json()
                lat.append(time.perf_counter() - t)
            cpu = time.thread_time() - cpu0
            out[f"{name} {temp}"] = {
                "p50_ms": (_pct(lat, 50) or 0) * 1e3,
                "p99_ms": (_pct(lat, 99) or 0) * 1e3,
                "mean_ms": statistics.fmean(lat) * 1e3,
                "cpu_ms": cpu / max(1, calls) * 1e3,
            }
    return out


# ---------------------------------------------------------------------------------------------- main
def _synthetic_models(tmp: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support lives beside bench/
    from graphmode.selector.train import train
    from tests.support.synthetic import write_synthetic_dataset

    ds = write_synthetic_dataset(tmp / "synthetic.sqlite", repeats=2)
    train(ds, models_dir=tmp / "models")
    return tmp / "models"


def _resolve_protocols(http: str, loop: str, env: dict[str, str]) -> tuple[str, str]:
    """What uvicorn's "auto" picks in the server's environment: httptools and uvloop when importable."""
    probe = "import importlib.util as u; print(bool(u.find_spec('httptools')), bool(u.find_spec('uvloop')))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    has_httptools, has_uvloop = (w == "True" for w in out.split())
    if http == "auto":
        http = "httptools" if has_httptools else "h11"
    if loop == "auto":
        loop = "uvloop" if has_uvloop else "asyncio"
    return http, loop


def _bodies(kind: str, objective: bool) -> list[bytes]:
    chosen = {
        "features": FEATURES_BODIES,
        "workload": WORKLOAD_BODIES,
        "mixed": [x for pair in zip(FEATURES_BODIES, WORKLOAD_BODIES, strict=True) for x in pair],
    }[kind]
    return [json.dumps({**b, "objective": OBJECTIVE} if objective else b).encode() for b in chosen]


def _fmt(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


TARGET_RATIO, TARGET_RPS = 1.5, 500.0


def ratios(results: list[RateResult]) -> list[dict[str, Any]]:
    """Per variant and rate: p99 of /v1/recommend over p99 of the bare endpoint in the same run."""
    bare = {(r.variant.removesuffix(" bare"), r.target_rps): r for r in results if r.variant.endswith(" bare")}
    out = []
    for r in results:
        b = bare.get((r.variant, r.target_rps))
        if b is None or r.variant.endswith(" bare"):
            continue
        ratio = r.p99_ms / b.p99_ms if r.p99_ms and b.p99_ms else None
        out.append({"variant": r.variant, "target_rps": r.target_rps, "bare_p99_ms": b.p99_ms,
                    "recommend_p99_ms": r.p99_ms, "ratio": ratio})
    return out


def ratio_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| variant | target req/s | bare p99 ms | recommend p99 ms | ratio |", "|---|---|---|---|---|"]
    for x in rows:
        lines.append(f"| {x['variant']} | {x['target_rps']:g} | {_fmt(x['bare_p99_ms'])} | "
                     f"{_fmt(x['recommend_p99_ms'])} | {_fmt(x['ratio'])} |")
    for x in rows:
        if x["target_rps"] == TARGET_RPS and x["ratio"] is not None:
            verdict = "meets" if x["ratio"] <= TARGET_RATIO else "MISSES"
            lines.append(f"{x['variant']} {verdict} the target p99 <= {TARGET_RATIO:g}x bare at "
                         f"{TARGET_RPS:g} req/s ({x['ratio']:.2f}x)")
    return "\n".join(lines)


def in_process_table(inproc: dict[str, dict[str, float]]) -> str:
    lines = ["| input | requests | wall p50 ms | wall p99 ms | wall mean ms | CPU ms per answer |",
             "|---|---|---|---|---|---|"]
    for key, v in inproc.items():
        kind, _, temp = key.partition(" ")
        name = {"features": "observed features", "workload": "workload description"}.get(kind, kind)
        seen = {"warm": "repeated (memos answer)", "cold": "each first-seen"}.get(temp, temp)
        lines.append(f"| {name} | {seen} | {v['p50_ms']:.3f} | {v['p99_ms']:.3f} | {v['mean_ms']:.3f} | "
                     f"{v['cpu_ms']:.3f} |")
    return "\n".join(lines)


def table(results: list[RateResult]) -> str:
    head = (
        "| variant | target req/s | achieved req/s | sent | shed (503) | shed p99 ms | over 1 s | over 1 s from write "
        "| written > 1 s late | errors "
        "| p50 ms | p90 ms | p99 ms | max ms "
        "| p99 from send ms | gen lag p99 ms | server p99 ≤ ms | server mean ms | server CPU % | gen CPU % "
        "| other CPU % | load avg 1m |"
    )
    lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
    for r in results:
        lines.append(
            f"| {r.variant} | {r.target_rps:g} | {r.achieved_rps:.1f} | {r.sent} | {r.shed} | "
            f"{_fmt(r.shed_p99_ms)} | {r.over_1s} | {r.over_1s_sent} | {r.gen_late_1s} | {r.errors} | "
            f"{_fmt(r.p50_ms)} | {_fmt(r.p90_ms)} | {_fmt(r.p99_ms)} | {_fmt(r.max_ms)} | "
            f"{_fmt(r.p99_from_send_ms)} | {_fmt(r.lag_p99_ms)} | {_fmt(r.server_p99_le_ms, 1)} | "
            f"{_fmt(r.server_mean_ms, 3)} | {_fmt(r.server_cpu_pct, 0)} | {_fmt(r.gen_cpu_pct, 0)} | "
            f"{_fmt(r.other_cpu_pct, 0)} | {_fmt(r.loadavg_1m, 1)} |"
        )
    return "\n".join(lines)


BARE = "/bench/bare"


async def drive(server: Server, variant: str, args: argparse.Namespace, bodies: list[bytes]) -> list[RateResult]:
    """Each rate against the bare endpoint, then against /v1/recommend, back to back on one server."""
    gens = {path: LoadGen("127.0.0.1", server.port, bodies, args.connections, args.timeout, path)
            for path in (BARE, "/v1/recommend")}
    for gen in gens.values():
        await gen.run(min(100.0, args.rates[0]), args.warmup, "uniform", 0)  # warm-up: connections, caches
    results = []
    for k, rate in enumerate(args.rates):
        for path, gen in gens.items():
            results.append(await _one_rate(server, f"{variant} bare" if path == BARE else variant, gen,
                                           rate, args, k))
            print(table([results[-1]]).splitlines()[-1], flush=True)
    for gen in gens.values():
        await gen.close()
    return results


async def _one_rate(server: Server, variant: str, gen: LoadGen, rate: float, args: argparse.Namespace,
                    k: int) -> RateResult:
    s0, c0, b0 = _server_stats(server.port)
    cpu0, w0, g0, box0 = _cpu_seconds(server.proc.pid), time.monotonic(), time.process_time(), _box_cpu()
    st = await gen.run(rate, args.duration, args.arrivals, args.seed + k)
    cpu1, w1, g1, box1 = _cpu_seconds(server.proc.pid), time.monotonic(), time.process_time(), _box_cpu()
    s1, c1, b1 = _server_stats(server.port)
    lat = st.latencies
    r = RateResult(
        variant=variant,
        target_rps=rate,
        duration_s=args.duration,
        sent=st.sent,
        ok=len(lat),
        errors=st.sent - len(lat) - len(st.shed),
        shed=len(st.shed),
        shed_p99_ms=None if not st.shed else (_pct(st.shed, 99) or 0.0) * 1e3,
        over_1s=st.over_1s,
        over_1s_sent=st.over_1s_sent,
        gen_late_1s=st.gen_late_1s,
        achieved_rps=len(lat) / st.wall_s if st.wall_s > 0 else 0.0,
        connections=gen.opened,
        error_kinds=st.errors,
    )
    if lat:
        r.p50_ms, r.p90_ms, r.p99_ms = (_pct(lat, q) * 1e3 for q in (50, 90, 99))  # type: ignore[operator]
        r.max_ms = max(lat) * 1e3
        r.p99_from_send_ms = (_pct(st.from_send, 99) or 0.0) * 1e3
    r.lag_p99_ms = (_pct(st.lags, 99) or 0.0) * 1e3
    q99 = _bucket_quantile(b0, b1, 0.99)
    r.server_p99_le_ms = None if q99 is None else q99 * 1e3
    if c1 > c0:
        r.server_mean_ms = (s1 - s0) / (c1 - c0) * 1e3
    if cpu0 is not None and cpu1 is not None:
        r.server_cpu_pct = (cpu1 - cpu0) / (w1 - w0) * 100
    r.gen_cpu_pct = (g1 - g0) / (w1 - w0) * 100
    if box0 is not None and box1 is not None and r.server_cpu_pct is not None:
        busy = (box1[0] - box0[0]) / (w1 - w0) * 100
        r.other_cpu_pct = max(0.0, busy - r.server_cpu_pct - r.gen_cpu_pct)
        r.steal_pct = (box1[1] - box0[1]) / (w1 - w0) * 100
    with contextlib.suppress(OSError):
        r.loadavg_1m = os.getloadavg()[0]
    return r


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=30.0, help="seconds per rate (default 30)")
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[100.0, 500.0, 1000.0])
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up load before the first rate")
    p.add_argument("--models-dir", type=Path, default=None, help="registry (default: settings, repo models/)")
    p.add_argument("--model-id", default=None)
    p.add_argument("--synthetic", action="store_true", help="train and serve a SYNTHETIC model instead")
    p.add_argument(
        "--input",
        choices=["features", "workload", "mixed"],
        default="mixed",
        help="request bodies: observed features, workload descriptions, or alternating (default)",
    )
    p.add_argument("--objective", action="store_true", help="add an objective with a constraint to each request")
    p.add_argument("--arrivals", choices=["poisson", "uniform"], default="poisson")
    p.add_argument("--connections", type=int, default=64, help="most keep-alive connections (default 64)")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, s")
    p.add_argument(
        "--compare-threadpool",
        action="store_true",
        help="also run the service with a sync (threadpool) recommend endpoint",
    )
    p.add_argument("--calls", type=int, default=10_000, help="in-process recommend calls (default 10000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pin", action="store_true", help="pin the server to CPU 0 and the generator to CPU 1")
    p.add_argument("--http", choices=["auto", "h11", "httptools"], default="auto", help="uvicorn's HTTP parser")
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto", help="uvicorn's event loop")
    p.add_argument(
        "--extra-path", type=Path, default=None, help="prepended to the server's PYTHONPATH (e.g. httptools+uvloop)"
    )
    p.add_argument("--gen-uvloop", action="store_true", help="run the load generator on uvloop too")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args()

    if args.extra_path:
        sys.path.insert(0, str(args.extra_path))
    with tempfile.TemporaryDirectory(prefix="graphmode-bench-") as tmp:
        if args.synthetic:
            models_dir, model_id = _synthetic_models(Path(tmp)), None
        else:
            from graphmode.core.settings import load_settings

            models_dir, model_id = args.models_dir or load_settings().selector.models_dir, args.model_id
        ncpu = os.cpu_count() or 1
        pin = args.pin and ncpu >= 2 and hasattr(os, "sched_setaffinity")
        print(f"# in-process decide() + JSON, {args.calls} calls per input kind, warm and cold", flush=True)
        inproc = in_process(models_dir, model_id, args.calls)
        print(in_process_table(inproc), flush=True)
        if pin:
            os.sched_setaffinity(0, {1})
        env = dict(os.environ)
        if args.extra_path:
            env["PYTHONPATH"] = os.pathsep.join([str(args.extra_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        http, loop = _resolve_protocols(args.http, args.loop, env)
        variants = [("async", False)] + ([("threadpool", True)] if args.compare_threadpool else [])
        results: list[RateResult] = []
        health: dict[str, Any] = {}
        for base, threadpool in variants:
            name = f"{base} ({http}, {loop})"
            server = Server(models_dir, model_id, threadpool, 0 if pin else None, http, loop, env)
            try:
                health = server.wait_ready()
                print(
                    f"# {name}: server pid {server.proc.pid} port {server.port}, model "
                    f"{health['default_model_id']} (synthetic: {health['synthetic_model']})",
                    flush=True,
                )
                coro = drive(server, name, args, _bodies(args.input, args.objective))
                if args.gen_uvloop:
                    import uvloop  # type: ignore[import-not-found,unused-ignore]

                    results += uvloop.run(coro)
                else:
                    results += asyncio.run(coro)
            finally:
                server.stop()

    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        cpu = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{ncpu} CPUs ({cpu}), {platform.system()} {platform.release()}, Python {platform.python_version()}",
        "pinned": pin,
        "model_id": health.get("default_model_id"),
        "synthetic_model": health.get("synthetic_model"),
        "input": args.input,
        "objective": OBJECTIVE if args.objective else None,
        "arrivals": args.arrivals,
        "in_process": inproc,
        "results": [asdict(r) for r in results],
        "p99_vs_bare": ratios(results),
    }
    print()
    print(f"date: {report['date']}\nmachine: {report['machine']}\ncommand: {report['command']}")
    print(
        f"model: {report['model_id']} (synthetic: {report['synthetic_model']}); input: {args.input}; "
        f"arrivals: {args.arrivals}; server/generator pinned to CPU 0/1: {pin}"
    )
    print()
    print(table(results))
    print()
    print(ratio_table(report["p99_vs_bare"]))
    print()
    print("in-process, one answer:")
    print(in_process_table(inproc))
    errs = {f"{r.variant}@{r.target_rps:g}": r.error_kinds for r in results if r.error_kinds}
    if errs:
        print(f"errors: {errs}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
