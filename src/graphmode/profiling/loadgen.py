"""Async open-loop load against vLLM's OpenAI-compatible ``/v1/completions`` with streaming.

Requests leave on their schedule whether or not earlier ones finished (open loop); an optional
concurrency cap makes late ones wait, as ``vllm bench serve --max-concurrency`` does. Prompts are
token-id lists with ``ignore_eos`` and a fixed ``max_tokens``, so lengths are exact and no tokenizer
is needed. The whole run is bounded by a deadline; what is still in flight then is cancelled and
counted as an error.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from graphmode.profiling.arrivals import PlannedRequest
from graphmode.profiling.stats import RequestResult


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


async def _one_request(client: httpx.AsyncClient, url: str, model: str, plan: PlannedRequest,
                       result: RequestResult) -> None:
    start = time.perf_counter()
    last = start
    usage_tokens: int | None = None
    counted = 0
    try:
        async with client.stream("POST", url, json=_request_body(model, plan)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:300]}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens", usage_tokens)
                n = _tokens_in_chunk(chunk)
                if n == 0:
                    continue
                now = time.perf_counter()
                if counted == 0:
                    result.ttft = now - start
                else:
                    # A chunk carrying k tokens spreads its gap over them, as the user saw them arrive.
                    result.itls.extend([(now - last) / n] * n)
                counted += n
                result.chunks += 1
                last = now
        result.e2e = time.perf_counter() - start
        result.output_tokens = usage_tokens if usage_tokens is not None else counted
        if result.output_tokens != plan.max_tokens:
            result.error = f"asked {plan.max_tokens} tokens, got {result.output_tokens}"
            return
        result.ok = True
    except asyncio.CancelledError:
        result.error = "cancelled at the run's deadline"
        raise
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]


async def run_load(base_url: str, model: str, plans: Sequence[PlannedRequest], *,
                   max_concurrency: int | None = None, deadline_s: float,
                   connect_timeout_s: float = 5.0, read_timeout_s: float = 300.0,
                   on_done: Callable[[RequestResult], None] | None = None,
                   t0: float | None = None) -> list[RequestResult]:
    """Send *plans* open-loop from *t0* (perf_counter; now if None); return one result per plan, in order."""
    url = base_url.rstrip("/") + "/v1/completions"
    timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=30.0, pool=None)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    results = [RequestResult(sent_at=p.at_s, input_tokens=len(p.prompt), max_tokens=p.max_tokens) for p in plans]
    start = time.perf_counter() if t0 is None else t0

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def fire(plan: PlannedRequest, result: RequestResult) -> None:
            delay = start + plan.at_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is None:
                await _one_request(client, url, model, plan, result)
            else:
                async with sem:
                    await _one_request(client, url, model, plan, result)
            if on_done is not None:
                on_done(result)

        tasks = [asyncio.create_task(fire(p, r)) for p, r in zip(plans, results, strict=True)]
        remaining = start + deadline_s - time.perf_counter()
        _, pending = await asyncio.wait(tasks, timeout=max(remaining, 0.0))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for r in results:
        if not r.ok and r.error is None:
            r.error = "not sent or cancelled before the run's deadline"
    return results
