#!/usr/bin/env python3
"""Soak the HTTP service: an open-loop mix of valid and invalid requests at a fixed rate.

Starts ``graphmode serve`` (the real CLI, with its client limits) on a free loopback port with the given
models directory, sends ``rate`` requests per second for ``duration`` seconds (request *i* is due at
``t0 + i / rate``, whatever the earlier ones are doing; at most ``--concurrency`` in flight), then prints:

* a status-code table per request kind (valid workload / features / objective, invalid bodies of several
  sorts, oversized bodies, health and model reads);
* latency percentiles (p50, p90, p99, max) per kind and overall, the achieved rate, and how late the
  client was on its schedule (if the client cannot keep up, the rate measured is the client's);
* the server's RSS and open file descriptors before and after, and after a settle.

Any 5xx is a failure (exit status 1), as is a server that died.

    python bench/soak.py                          # 60 s at 500 req/s, the bundled models
    python bench/soak.py --duration 10 --rate 200 --models-dir models
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = {"rate": 8, "burstiness": 1.0, "input_tokens": 512, "output_tokens": 128}
FEATURES = {"arrival_rate": 8.0, "mean_input_tokens": 512.0, "mean_output_tokens": 128.0, "batch_mean": 3.0}

# (kind, weight, method, path, body bytes or None)
MIX: list[tuple[str, int, str, str, bytes | None]] = [
    ("valid:workload", 30, "POST", "/v1/recommend", json.dumps({"workload": WORKLOAD}).encode()),
    ("valid:features", 15, "POST", "/v1/recommend", json.dumps({"features": FEATURES}).encode()),
    ("valid:objective", 10, "POST", "/v1/recommend", json.dumps(
        {"workload": WORKLOAD, "objective": {"metric": "ttft_p99", "constraints": ["itl_p50<=50ms"],
                                             "memory_weight": 0.2}}).encode()),
    ("invalid:nan", 5, "POST", "/v1/recommend", b'{"features": {"arrival_rate": NaN}}'),
    ("invalid:huge", 5, "POST", "/v1/recommend", b'{"features": {"batch_cv": 1e200}}'),
    ("invalid:surrogate", 5, "POST", "/v1/recommend", b'{"workload": {"rate": "\\ud800"}}'),
    ("invalid:string-number", 5, "POST", "/v1/recommend",
     json.dumps({"workload": {**WORKLOAD, "rate": "8"}}).encode()),
    ("invalid:unknown-field", 4, "POST", "/v1/recommend", b'{"features": {"qps": 3}}'),
    ("invalid:not-json", 4, "POST", "/v1/recommend", b'{"features": '),
    ("invalid:config", 3, "POST", "/v1/recommend", json.dumps(
        {"workload": WORKLOAD, "served_model_config": {"architectures": [{"a": 1}]}}).encode()),
    ("invalid:url-path", 3, "POST", "/v1/recommend", b'{"server_url": "http://127.0.0.1:1/secret?"}'),
    ("invalid:too-large", 2, "POST", "/v1/recommend", b'{"features": {"arrival_rate": 1}, "p": "'
     + b"x" * (128 * 1024) + b'"}'),
    ("read:healthz", 5, "GET", "/healthz", None),
    ("read:models", 4, "GET", "/v1/models", None),
]


@dataclass
class Result:
    sent: int
    wall: float = 0.0
    statuses: dict[str, Counter[int | str]] = field(default_factory=lambda: defaultdict(Counter))
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    lateness: list[float] = field(default_factory=list)  # ms behind schedule, for requests sent late


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


async def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"graphmode serve exited with {proc.returncode} during start-up")
            try:
                async with session.get(url + "/healthz") as r:
                    if r.status in (200, 503):
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("graphmode serve did not come up")
            await asyncio.sleep(0.2)


async def soak(url: str, duration: float, rate: float, concurrency: int, seed: int) -> Result:
    rng = random.Random(seed)
    kinds = [m for m in MIX for _ in range(m[1])]
    total = int(duration * rate)
    plan = [rng.choice(kinds) for _ in range(total)]
    res = Result(sent=total)
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(kind: str, method: str, path: str, body: bytes | None) -> None:
            async with gate:
                t = time.perf_counter()
                try:
                    async with session.request(method, url + path, data=body,
                                               headers={"Content-Type": "application/json"}) as r:
                        await r.read()
                        res.statuses[kind][r.status] += 1
                except (TimeoutError, aiohttp.ClientError) as exc:
                    res.statuses[kind][type(exc).__name__] += 1
                res.latency[kind].append((time.perf_counter() - t) * 1e3)

        tasks = []
        t0 = time.perf_counter()
        for i, (kind, _, method, path, body) in enumerate(plan):
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                res.lateness.append(-delay * 1e3)
            tasks.append(asyncio.create_task(one(kind, method, path, body)))
        await asyncio.gather(*tasks)
        res.wall = time.perf_counter() - t0
    return res


def print_report(res: Result, rss: list[tuple[str, float, int]]) -> bool:
    statuses, latency = res.statuses, res.latency
    codes = sorted({c for cnt in statuses.values() for c in cnt}, key=str)
    print(f"\nsent {res.sent} requests in {res.wall:.1f} s = {res.sent / res.wall:.0f} req/s "
          f"(sent late: {len(res.lateness)}, worst {max(res.lateness, default=0.0):.0f} ms behind schedule)\n")
    head = f"{'kind':24}" + "".join(f"{c!s:>14}" for c in codes)
    head += f"{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
    print(head)
    print("-" * len(head))
    every: list[float] = []
    for kind in [m[0] for m in MIX]:
        if kind not in statuses:
            continue
        lat = latency[kind]
        every += lat
        print(f"{kind:24}" + "".join(f"{statuses[kind].get(c, 0):>14}" for c in codes)
              + "".join(f"{percentile(lat, q):>9.2f}" for q in (50, 90, 99)) + f"{max(lat):>9.2f}")
    total = Counter[int | str]()
    for cnt in statuses.values():
        total.update(cnt)
    print("-" * len(head))
    print(f"{'all':24}" + "".join(f"{total.get(c, 0):>14}" for c in codes)
          + "".join(f"{percentile(every, q):>9.2f}" for q in (50, 90, 99)) + f"{max(every, default=0):>9.2f}")
    print("\nserver process:")
    for label, mb, fds in rss:
        print(f"  {label:14} RSS {mb:7.1f} MB   open fds {fds}")
    bad = sum(n for c, n in total.items() if isinstance(c, int) and c >= 500)
    errors = sum(n for c, n in total.items() if isinstance(c, str))
    print(f"\n5xx: {bad}   client-side errors: {errors}")
    return bad == 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--rate", type=float, default=500.0, help="requests per second (default 500)")
    p.add_argument("--concurrency", type=int, default=64, help="most requests (and connections) in flight (default 64)")
    p.add_argument("--models-dir", type=Path, default=ROOT / "models", help="registry to serve")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.duration <= 0 or args.rate <= 0 or args.duration * args.rate > 1_000_000:
        p.error("duration and rate must be positive, and at most 1e6 requests in all")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-c", "from graphmode.cli.main import app; app()", "serve", "--port", str(port),
           "--models-dir", str(args.models_dir), "--log-level", "error", "--no-access-log"]
    env = {k: v for k, v in os.environ.items() if k != "GRAPHMODE_SERVICE__TOKEN"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        asyncio.run(wait_up(url, proc, 120))
        rss = [("before", rss_mb(proc.pid), open_fds(proc.pid))]
        print(f"soak: {args.duration:g} s at {args.rate:g} req/s against {url} (pid {proc.pid}, models "
              f"{args.models_dir})", flush=True)
        res = asyncio.run(soak(url, args.duration, args.rate, args.concurrency, args.seed))
        rss.append(("after", rss_mb(proc.pid), open_fds(proc.pid)))
        time.sleep(2.0)
        rss.append(("after +2 s", rss_mb(proc.pid), open_fds(proc.pid)))
        alive = proc.poll() is None
        ok = print_report(res, rss)
        if not alive:
            print("the server died during the soak")
        return 0 if ok and alive else 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
