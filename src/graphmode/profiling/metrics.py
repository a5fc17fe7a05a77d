"""Read a vLLM server's Prometheus ``/metrics`` text into a :class:`MetricsSnapshot`.

One snapshot is the raw material for :mod:`graphmode.profiling.features`: the cumulative counters and
histograms plus the instantaneous gauges graphmode needs, each summed over every label set (vLLM labels
its series by ``model_name`` and ``engine``; ``request_success`` also by ``finished_reason``). A metric the
server does not expose is ``None``, never an error, because the set of metrics changes between vLLM
versions. Names that vLLM renamed are read under both spellings, the newer one preferred:

* ``kv_cache_usage``: ``vllm:kv_cache_usage_perc``, formerly ``vllm:gpu_cache_usage_perc``;
* ``inter_token_latency``: ``vllm:inter_token_latency_seconds``, formerly
  ``vllm:time_per_output_token_seconds``.

(vLLM deprecated the old names in 0.9 and 0.11 and has since removed them, vllm PRs #29330 and #32661;
0.24 and 0.32 expose only the new ones.)

prometheus_client's parser strips ``_total`` from a *counter family* name but keeps it on the samples,
puts ``_created`` samples in families of their own, and keeps ``_total`` on histogram families (such as
``vllm:iteration_tokens_total``). Everything here therefore looks metrics up by **sample** name, which
is the same whether or not the text carried ``# TYPE`` lines.

``process_cpu_seconds_total`` is prometheus_client's standard process collector, not a vLLM metric: the
CPU seconds of the process that served ``/metrics``, which for vLLM is the API server (the frontend that
tokenizes, detokenizes and streams). Multiprocess Prometheus setups (several API servers) do not
register that collector, so it is then absent.

Values no vLLM exports are unreadable, not errors: a metric with any sample that is NaN, ±Inf, negative or
above :data:`SAMPLE_MAX` (or a histogram with such a bucket edge) is ``None``
in that snapshot, as if the server did not expose it. The features are then computed from what is left (a
counter that reappears lower than it was counts as a reset), and no arithmetic downstream can overflow: a
server exporting ``vllm:num_requests_running 1e308`` or ``-3`` says nothing about its traffic.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from graphmode.core.errors import ScrapeError

# Sample names, without the `_total` counters carry on the wire (added when looking them up).
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"
NUM_PREEMPTIONS = "vllm:num_preemptions"
PROCESS_CPU_SECONDS = "process_cpu_seconds"
# Speculative decoding (vllm/v1/spec_decode/metrics.py): drafts proposed (one per request per verification
# step that had a proposal), draft tokens proposed, draft tokens accepted. Absent without a speculative config.
SPEC_DECODE_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DECODE_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"

NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")

ITERATION_TOKENS = "vllm:iteration_tokens_total"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY_NAMES = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")

# Largest sample value read (counters, gauges, histogram sums, counts and edges): a billion tokens a second
# for thirty years stays below it, and sums and squares of such values stay far from float overflow.
SAMPLE_MAX = 1e18

_T = TypeVar("_T")
_Labels = dict[str, str]
_Index = dict[str, list[tuple[_Labels, float]]]


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram summed over label sets.

    ``buckets`` are cumulative ``(le, count)`` pairs sorted by ``le``; the last one is ``(inf, count)``
    when the server exposed a ``+Inf`` bucket, as Prometheus clients always do.
    """

    sum: float
    count: float
    buckets: list[tuple[float, float]] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one scrape of ``/metrics`` said, at time ``t`` (seconds, any clock the caller keeps fixed).

    Counters and histograms are cumulative since the server started; gauges are instantaneous. Every
    value is summed over label sets, except ``kv_cache_usage``, a 0..1 fraction, which is averaged
    over engines so that it stays a fraction with data parallelism.
    """

    t: float
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    request_success_total: float | None = None
    num_preemptions_total: float | None = None
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    iteration_tokens: Histogram | None = None
    request_prompt_tokens: Histogram | None = None
    request_generation_tokens: Histogram | None = None
    time_to_first_token: Histogram | None = None
    inter_token_latency: Histogram | None = None
    process_cpu_seconds_total: float | None = None  # CPU seconds of the process serving /metrics
    spec_decode_drafts_total: float | None = None
    spec_decode_draft_tokens_total: float | None = None
    spec_decode_accepted_tokens_total: float | None = None


def parse_metrics(text: str, t: float) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a snapshot taken at ``t``.

    Raises :class:`ScrapeError` when the text is not valid exposition format (an HTML error page, a
    truncated body); metrics that are simply absent become ``None``.
    """
    index = _index_samples(text)
    return MetricsSnapshot(
        t=t,
        prompt_tokens_total=_counter(index, PROMPT_TOKENS),
        generation_tokens_total=_counter(index, GENERATION_TOKENS),
        request_success_total=_counter(index, REQUEST_SUCCESS),
        num_preemptions_total=_counter(index, NUM_PREEMPTIONS),
        num_requests_running=_gauge_sum(index, NUM_REQUESTS_RUNNING),
        num_requests_waiting=_gauge_sum(index, NUM_REQUESTS_WAITING),
        kv_cache_usage=_first(lambda n: _gauge_mean(index, n), KV_CACHE_USAGE_NAMES),
        iteration_tokens=_histogram(index, ITERATION_TOKENS),
        request_prompt_tokens=_histogram(index, REQUEST_PROMPT_TOKENS),
        request_generation_tokens=_histogram(index, REQUEST_GENERATION_TOKENS),
        time_to_first_token=_histogram(index, TIME_TO_FIRST_TOKEN),
        inter_token_latency=_first(lambda n: _histogram(index, n), INTER_TOKEN_LATENCY_NAMES),
        process_cpu_seconds_total=_counter(index, PROCESS_CPU_SECONDS),
        spec_decode_drafts_total=_counter(index, SPEC_DECODE_DRAFTS),
        spec_decode_draft_tokens_total=_counter(index, SPEC_DECODE_DRAFT_TOKENS),
        spec_decode_accepted_tokens_total=_counter(index, SPEC_DECODE_ACCEPTED_TOKENS),
    )


async def scrape(
    client: httpx.AsyncClient, url: str, *, clock: Callable[[], float] = time.monotonic
) -> MetricsSnapshot:
    """GET ``url`` and parse it; ``t`` is ``clock()`` halfway through the request.

    The midpoint, because the server renders the page at some moment between sending and receiving,
    and rates computed from snapshot pairs should not be biased by the request's own latency.
    """
    t0 = clock()
    try:
        response = await client.get(url)
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise ScrapeError(f"could not fetch {url}: {_describe(e)}") from e
    t1 = clock()
    return parse_metrics(response.text, (t0 + t1) / 2)


def scrape_sync(
    url: str, timeout: float = 5.0, *, clock: Callable[[], float] = time.monotonic
) -> MetricsSnapshot:
    """Blocking :func:`scrape` with its own short-lived client."""
    t0 = clock()
    try:
        with httpx.Client(timeout=timeout) as client:
            response = client.get(url)
            response.raise_for_status()
    except httpx.HTTPError as e:
        raise ScrapeError(f"could not fetch {url}: {_describe(e)}") from e
    t1 = clock()
    return parse_metrics(response.text, (t0 + t1) / 2)


def _describe(e: httpx.HTTPError) -> str:
    # Some httpx errors (timeouts in particular) stringify to "", which makes a useless message.
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _index_samples(text: str) -> _Index:
    """Every sample, by sample name, with its labels. ``_created`` samples are dropped."""
    index: _Index = defaultdict(list)
    try:
        # The parser is lazy: errors surface while iterating, so the whole walk sits in the try.
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # creation timestamps, not values
                index[sample.name].append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError, KeyError) as e:
        snippet = text[:120].replace("\n", "\\n")
        raise ScrapeError(
            f"/metrics text is not Prometheus exposition format ({e}); it starts {snippet!r}"
        ) from e
    return index


def _first(read: Callable[[str], _T | None], names: Iterable[str]) -> _T | None:
    """The value under the first of ``names`` the server exposes: newest spelling first."""
    for name in names:
        value = read(name)
        if value is not None:
            return value
    return None


def readable(value: float) -> bool:
    """Whether a sample value (or a finite bucket edge) is one a vLLM server can export: finite, >= 0 and at
    most :data:`SAMPLE_MAX`."""
    return math.isfinite(value) and 0.0 <= value <= SAMPLE_MAX


def _sum(values: list[tuple[_Labels, float]] | None) -> float | None:
    if not values or not all(readable(v) for _, v in values):
        return None  # absent, or unreadable (see the module docstring)
    return math.fsum(v for _, v in values)


def _counter(index: _Index, name: str) -> float | None:
    # `_total` is what every vLLM release puts on the wire; the bare name covers text without it.
    total = _sum(index.get(name + "_total"))
    return total if total is not None else _sum(index.get(name))


def _gauge_sum(index: _Index, name: str) -> float | None:
    return _sum(index.get(name))


def _gauge_mean(index: _Index, name: str) -> float | None:
    values = index.get(name)
    total = _sum(values)
    return None if total is None or not values else total / len(values)


def _histogram(index: _Index, name: str) -> Histogram | None:
    total, count = _sum(index.get(name + "_sum")), _sum(index.get(name + "_count"))
    if total is None or count is None:
        return None
    by_le: dict[float, float] = defaultdict(float)
    for labels, value in index.get(name + "_bucket", []):
        le = labels.get("le")
        if le is None:
            continue
        edge = _parse_le(le)
        if not (readable(value) and (edge == math.inf or readable(edge))):
            return None  # unreadable (see the module docstring)
        by_le[edge] += value
    return Histogram(sum=total, count=count, buckets=sorted(by_le.items()))


def _parse_le(le: str) -> float:
    try:
        return float(le)  # float() reads "+Inf" too
    except ValueError as e:
        raise ScrapeError(f"histogram bucket has a non-numeric le={le!r}") from e
