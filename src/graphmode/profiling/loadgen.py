"""Async open-loop load against vLLM's OpenAI-compatible ``/v1/completions`` with streaming.

Requests leave on their schedule whether or not earlier ones finished (open loop); an optional
concurrency cap makes late ones wait, as ``vllm bench serve --max-concurrency`` does. Prompts are
token-id lists with ``ignore_eos`` and a fixed ``max_tokens``, so lengths are exact and no tokenizer
is needed. The whole run is bounded by a deadline; what is still in flight then is cancelled and
counted as an error. A *stop* event ends the run early (an adaptive cell that has seen enough): what
is in flight then is cancelled and marked ``cut``, not counted as an error.

The client is aiohttp, and a chunk's tokens are counted from its ``"token_ids":[...]`` list without
parsing the JSON: at ~150 concurrent streams an httpx client parsing every chunk fell behind the
server (chunks arrived coalesced, so pooled inter-token latency collapsed). JSON is parsed only when
the fast path cannot answer. Tokens are timed per network read, not per SSE line: the events of one
read arrived together, and ``chunk_tokens_mean`` > 1 says the client or server coalesced them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from graphmode.profiling.arrivals import PlannedRequest
from graphmode.profiling.stats import RequestResult

_IDS = b'"token_ids":['
_USAGE = b'"usage":{'


def _request_body(model: str, plan: PlannedRequest) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": plan.prompt,
        "max_tokens": plan.max_tokens,
        "min_tokens": plan.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Token ids let us count tokens per chunk without a tokenizer (text is empty then).
        "return_token_ids": True,
    }


def _tokens_in_chunk(chunk: dict[str, Any]) -> int:
    n = 0
    for choice in chunk.get("choices") or []:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            n += len(ids)
        elif choice.get("text"):
            n += 1
    return n


def count_tokens(data: bytes) -> tuple[int, int | None]:
    """(tokens in this SSE data payload, completion_tokens from a usage block or None)."""
    usage: int | None = None
    if _USAGE in data or _IDS not in data:
        chunk = json.loads(data)
        u = chunk.get("usage")
        if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
            usage = u["completion_tokens"]
        return _tokens_in_chunk(chunk), usage
    n = 0
    pos = data.find(_IDS)
    while pos >= 0:
        a = pos + len(_IDS)
        b = data.index(b"]", a)
        if b > a:
            n += data.count(b",", a, b) + 1
        pos = data.find(_IDS, b)
    return n, usage


def read_events(lines: Sequence[bytes]) -> tuple[int, int | None, bool]:
    """(tokens, completion_tokens from a usage block or None, whether ``[DONE]`` came) over SSE lines."""
    n, usage = 0, None
    for raw in lines:
        if not raw.startswith(b"data:"):
            continue
        event = raw[5:].strip()
        if event == b"[DONE]":
            return n, usage, True
        k, u = count_tokens(event)
        n += k
        if u is not None:
            usage = u
    return n, usage, False


async def _one_request(session: aiohttp.ClientSession, url: str, model: str, plan: PlannedRequest,
                       result: RequestResult) -> None:
    start = time.perf_counter()
    result.started_at = start
    last = start
    usage_tokens: int | None = None
    counted = 0
    try:
        async with session.post(url, json=_request_body(model, plan)) as resp:
            if resp.status != 200:
                body = (await resp.read()).decode(errors="replace")
                result.error = f"HTTP {resp.status}: {body[:300]}"
                return
            pending = b""
            done = False
            # One network read is one arrival: events read together reached the client together, so
            # they share its gap. Read line by line, a client that fell behind timed the events of one
            # read microseconds apart and pooled ITL collapsed toward zero (CPU CI, 2026-12-04).
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                *lines, pending = (pending + data).split(b"\n")
                n, usage, done = read_events(lines)
                if usage is not None:
                    usage_tokens = usage
                if n:
                    if counted == 0:
                        result.ttft = now - start
                        result.first_at = now
                    else:
                        # A read carrying k tokens spreads its gap over them, as the user saw them arrive.
                        result.itls.extend([(now - last) / n] * n)
                        result.itl_at.extend([now] * n)
                    result.chunk_at.append(now)
                    result.chunk_n.append(n)
                    counted += n
                    result.chunks += 1
                    last = now
                if done:
                    break
            if not done and pending.strip():  # a last event without its newline
                _, usage, _ = read_events([pending])
                if usage is not None:
                    usage_tokens = usage
        result.done_at = time.perf_counter()
        result.e2e = result.done_at - start
        result.output_tokens = usage_tokens if usage_tokens is not None else counted
        if result.output_tokens != plan.max_tokens:
            result.error = f"asked {plan.max_tokens} tokens, got {result.output_tokens}"
            return
        result.ok = True
    except asyncio.CancelledError:
        result.output_tokens = counted
        if result.error is None:
            result.error = "cancelled at the run's deadline"
        raise
    except (aiohttp.ClientError, json.JSONDecodeError, ValueError, OSError, TimeoutError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]


async def run_load(base_url: str, model: str, plans: Sequence[PlannedRequest], *,
                   max_concurrency: int | None = None, deadline_s: float,
                   connect_timeout_s: float = 5.0, read_timeout_s: float = 300.0,
                   on_done: Callable[[RequestResult], None] | None = None,
                   t0: float | None = None, stop: asyncio.Event | None = None,
                   results: list[RequestResult] | None = None,
                   send_until: float | None = None) -> list[RequestResult]:
    """Send *plans* open-loop from *t0* (perf_counter; now if None); return one result per plan, in order.

    Pass *results* (empty) to watch them fill while the load runs; *stop* ends the run early. With
    *max_concurrency*, a request that gets its slot at or after *send_until* (perf_counter) is not sent: a
    closed loop above its cap keeps a backlog, and sending it after the measured window only holds the cell
    open until the deadline.
    """
    url = base_url.rstrip("/") + "/v1/completions"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    if results is None:
        results = []
    results[:] = [RequestResult(sent_at=p.at_s, input_tokens=len(p.prompt), max_tokens=p.max_tokens) for p in plans]
    start = time.perf_counter() if t0 is None else t0
    connector = aiohttp.TCPConnector(limit=0, force_close=False)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=2**20) as session:

        async def fire(plan: PlannedRequest, result: RequestResult) -> None:
            delay = start + plan.at_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is None:
                await _one_request(session, url, model, plan, result)
            else:
                async with sem:
                    if send_until is not None and time.perf_counter() >= send_until:
                        return
                    await _one_request(session, url, model, plan, result)
            if on_done is not None:
                on_done(result)

        tasks = [asyncio.create_task(fire(p, r)) for p, r in zip(plans, results, strict=True)]
        remaining = max(start + deadline_s - time.perf_counter(), 0.0)
        if stop is None:
            _, pending = await asyncio.wait(tasks, timeout=remaining)
        else:
            stopper: asyncio.Future[Any] = asyncio.create_task(stop.wait())
            everything: asyncio.Future[Any] = asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.wait({stopper, everything}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            everything.cancel()  # cancels only what is still running; results are read from *results*
            pending = {t for t in tasks if not t.done()}
            if stop.is_set():
                for r in results:
                    if r.started_at is not None and not r.ok and r.error is None:
                        r.cut = True
                        r.error = "cut: the cell had measured enough"
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if stop is not None:
            await asyncio.gather(stopper, everything, return_exceptions=True)
    for r in results:
        if not r.ok and r.error is None:
            r.error = "not sent or cancelled before the run's deadline"
    return results
