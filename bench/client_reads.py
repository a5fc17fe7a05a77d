#!/usr/bin/env python3
"""Does the load client's ITL survive a client that falls behind? Per-read timing against per-line timing.

A server process streams one token per step to every open request (one SSE event each, as vLLM does) and
records the true gap between its own writes. The client process runs graphmode's load client
(``profiling.loadgen.run_load``, which times tokens per network read) while a stall coroutine blocks its
event loop for ``stall`` ms of every ``every`` ms: what a client sharing a busy core sees. The same traffic is
then read by a reference client that times each SSE line as it is parsed (graphmode's client before session
28). Per row:

* true ITL p50: the server's own gaps between writes to one request;
* per-read ITL p50 / mean: graphmode's client; tokens a read: ``chunk_tokens_mean``;
* per-line ITL p50: the reference; a median near 0 is the collapse this fixed;
* TPOT p50: (e2e − TTFT) / (tokens − 1) per request, from graphmode's client: immune to either timing.

    .venv/bin/python bench/client_reads.py [--streams 32] [--tokens 200] [--step-ms 5] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import statistics
import sys
import time
from collections.abc import Sequence

import aiohttp
from aiohttp import web

from graphmode.profiling.arrivals import PlannedRequest
from graphmode.profiling.loadgen import count_tokens, run_load
from graphmode.profiling.stats import aggregate, percentile

STALLS = ((0, 0), (5, 20), (20, 40), (40, 60), (60, 75))  # (stall ms, of every ms)


def _serve(port: int, step_s: float, ready: mp.synchronize.Event) -> None:  # type: ignore[name-defined]
    gaps: list[float] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        last = None
        for i in range(int(body["max_tokens"])):
            await asyncio.sleep(step_s)
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
            chunk = {"choices": [{"index": 0, "text": "", "token_ids": [i % 997]}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def stats(_: web.Request) -> web.Response:
        out = {"p50": percentile(gaps, 50), "n": len(gaps)}
        gaps.clear()
        return web.json_response(out)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/stats", stats)

    async def main() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


async def _stall(stall_s: float, every_s: float, stop: asyncio.Event) -> None:
    while stall_s > 0 and not stop.is_set():
        await asyncio.sleep(every_s - stall_s)
        time.sleep(stall_s)  # blocks the loop, as another busy process on the client's core would


async def _per_line(url: str, plans: Sequence[PlannedRequest]) -> list[float]:
    """The reference: one timestamp per SSE line as it is parsed."""
    itls: list[float] = []

    async def one(session: aiohttp.ClientSession, plan: PlannedRequest) -> None:
        body = {"model": "m", "prompt": plan.prompt, "max_tokens": plan.max_tokens, "stream": True}
        async with session.post(url + "/v1/completions", json=body) as resp:
            last = None
            async for raw in resp.content:
                if not raw.startswith(b"data:") or raw[5:].strip() == b"[DONE]":
                    continue
                n, _ = count_tokens(raw[5:].strip())
                now = time.perf_counter()
                if n and last is not None:
                    itls.extend([(now - last) / n] * n)
                last = now if n else last

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, p) for p in plans))
    return itls


async def _measure(url: str, plans: Sequence[PlannedRequest], stall_ms: int, every_ms: int) -> dict[str, float | None]:
    async with aiohttp.ClientSession() as s:  # forget the warm-up's gaps
        await (await s.get(url + "/stats")).json()
    stop = asyncio.Event()
    staller = asyncio.create_task(_stall(stall_ms / 1e3, every_ms / 1e3, stop))
    results = await run_load(url, "m", plans, deadline_s=120)
    stats = aggregate(results, 1.0)
    line_itls = await _per_line(url, plans)
    stop.set()
    await staller
    async with aiohttp.ClientSession() as s:
        true = await (await s.get(url + "/stats")).json()
    itls = [g for r in results if r.ok for g in r.itls]
    return {"true": true["p50"], "read_p50": percentile(itls, 50),
            "read_mean": statistics.fmean(itls) if itls else None, "tokens": stats.chunk_tokens_mean,
            "line_p50": percentile(line_itls, 50), "tpot": stats.tpot_p50, "ok": sum(r.ok for r in results)}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ready = mp.get_context("spawn").Event()
    server = mp.get_context("spawn").Process(target=_serve, args=(port, a.step_ms / 1e3, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            print("the stream server did not start", file=sys.stderr)
            return 1
        url = f"http://127.0.0.1:{port}"
        plans = [PlannedRequest(0.0, [1, 2, 3], a.tokens) for _ in range(a.streams)]
        head = ["stall ms / of every", "true ITL p50", "per-read p50", "per-read mean", "tokens a read",
                "per-line p50", "TPOT p50", "ok"]
        rows = []
        for stall, every in STALLS:
            m = asyncio.run(_measure(url, plans, stall, every))
            rows.append([f"{stall} / {every}" if stall else "none", _ms(m["true"]), _ms(m["read_p50"]),
                         _ms(m["read_mean"]), f"{m['tokens']:.2f}" if m["tokens"] else "-", _ms(m["line_p50"]),
                         _ms(m["tpot"]), f"{m['ok']}/{a.streams}"])
    finally:
        server.kill()
    print(f"{a.streams} streams x {a.tokens} tokens, one token a step every {a.step_ms:g} ms; times in ms")
    if a.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        print("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
        for r in rows:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
