"""Traffic features from a sequence of ``/metrics`` snapshots: the contract the selector is trained on.

The profiler (offline, one window per measured cell) and the live ``watch`` controller (a sliding
:class:`FeatureWindow`) both call :func:`compute_features`, so a model sees in production exactly the
quantities it was trained on. Changing a definition below changes that contract: retrain after.

Window
    Snapshots are taken in time order (sorted by ``t`` if they are not). If a cumulative value (a counter,
    or a histogram's count, sum or any bucket) goes *down* from the last snapshot that had it, the server
    restarted (Prometheus reads any decrease of a counter as a reset), and the window starts at the first
    snapshot after the last such reset; everything below, gauge statistics included, uses only that
    part. ``window_s = t_last - t_first``; ``n_samples`` = snapshots in the window.

Range
    Every feature is held to the rules a ``features`` body of the service is held to
    (:func:`feature_range_error`: finite, >= 0, at most :data:`FEATURE_MAX`, KV-cache usage at most 100):
    a value outside them (a server exporting absurd counters) is dropped (``None``), never returned, so a
    scraped feature can be neither negative nor beyond what the estimators can take.

Δ quantities (need >= 2 snapshots and ``window_s > 0``; otherwise ``None``)
    ``Δx = x(last) - x(first)`` of a cumulative counter or histogram, summed over label sets.

    * ``completion_rate = Δrequest_success / window_s`` — requests finished, summed over every
      ``finished_reason`` label vLLM reports.
    * ``arrival_rate = (Δrequest_success + Δ(running + waiting)) / window_s`` — conservation: what
      arrived either finished or is still in the system. Requests that leave without reaching
      ``request_success`` (rejected, failed, aborted by the client before vLLM records them) are not
      counted, so this under-counts under heavy aborting; a negative value can only come from such
      departures and is clamped to 0.
    * ``prompt_tokens_rate = Δprompt_tokens / window_s``, ``generation_tokens_rate`` likewise.
    * ``prefill_decode_ratio = Δprompt_tokens / Δgeneration_tokens`` (``None`` when Δgeneration is 0).
    * ``mean_input_tokens = Δsum / Δcount`` of ``vllm:request_prompt_tokens``;
      ``mean_output_tokens`` likewise of ``vllm:request_generation_tokens`` (per *finished* request;
      ``None`` when no request finished in the window).
    * ``iter_tokens_mean = Δsum / Δcount`` of ``vllm:iteration_tokens_total`` (tokens per engine step).
    * ``iter_tokens_cv``: from the Δ of that histogram's buckets, each bucket's steps placed at its
      midpoint ``(lower + le) / 2`` (the first bucket's lower edge is 0; the ``+Inf`` bucket is placed
      at its lower edge, the largest finite ``le``); ``cv = sqrt(var) / mean`` of that binned
      distribution, population variance, mean and variance both from the midpoints so the ratio is
      self-consistent. ``None`` when no step fell in the window or the binned mean is 0.
    * ``preemptions = Δnum_preemptions``.
    * ``frontend_cpu_cores = Δprocess_cpu_seconds_total / window_s``: CPU cores the process serving
      ``/metrics`` (vLLM's API server) used; 1.0 is one core saturated. ``None`` when either end lacks
      the counter (multiprocess Prometheus). Advice only: the selector does not read it.
    * ``spec_acceptance_rate = Δspec_decode_num_accepted_tokens / Δspec_decode_num_draft_tokens``: the share
      of proposed draft tokens the target model accepted; ``spec_accept_length = 1 +
      Δaccepted_tokens / Δspec_decode_num_drafts``: tokens a request emits per verification step that had a
      proposal (the bonus token included). ``None`` without speculative decoding or when nothing was
      proposed in the window. They say what a speculative configuration's steps held (a decode step of a
      request is 1 + k tokens whenever a draft was proposed; an ngram proposer with no match proposes
      nothing), which a race of such a configuration must report beside its latency. Not model inputs.

Sample statistics (from the gauge samples in the window; work with a single snapshot)
    Samples are taken at a fixed interval, so plain (not time-weighted) statistics; variances are
    population variances; a snapshot missing a gauge is skipped for that gauge.

    * ``batch_mean``, ``batch_var``, ``batch_max`` of ``vllm:num_requests_running``;
      ``batch_cv = sqrt(batch_var) / batch_mean`` (``None`` when the mean is 0).
    * ``queue_mean``: mean of ``vllm:num_requests_waiting``.
    * ``concurrency_mean``: mean of ``running + waiting`` over snapshots that have both.
    * ``kv_usage_mean``, ``kv_usage_max`` of the KV-cache usage fraction (0..1).

Server-side latency (:func:`server_latency`, recorded per cell beside the client's figures; not features)
    Same window. ``Δsum / Δcount`` of ``vllm:inter_token_latency_seconds`` and
    ``vllm:time_to_first_token_seconds``: the mean ITL and TTFT as vLLM timed them (ITL from the engine
    core's output timestamps, TTFT in the API server), before the HTTP stream and the load client. A client
    that fell behind reads gaps short or bunched; these do not.

Step sizes (:func:`compute_step_sizes`, recorded per cell and fed to the capture-size chooser)
    Same window. ``le``/``steps``: the Δ of ``vllm:iteration_tokens_total``'s buckets, de-cumulated:
    ``steps[i]`` steps had ``le[i-1] < tokens <= le[i]`` (the first bucket starts at 0), and the last
    entry of ``steps`` counts the steps above the largest finite ``le``. vLLM observes
    ``num_prompt_tokens + num_generation_tokens`` of the step into it (vllm/v1/metrics/loggers.py), with
    fixed edges 1, 8, 16, ..., 16384 since 0.1x; older releases used the capture sizes themselves as edges,
    and whatever edges the server exposes are kept. ``running``: how many samples of
    ``vllm:num_requests_running`` had each value; inside a bucket these are the only integer-resolution
    evidence of step size (a decode-only step has one token per running request).

    Decode-only vs mixed: /metrics does not label steps, so the split is a bound. Without speculative
    decoding a decode-only step has exactly as many tokens as running requests, never more than
    ``batch_max`` (the largest running sample in the window). Steps in buckets whose lower edge is at or
    above ``batch_max`` hold more tokens than any batch ran sequences, so they carry prefill tokens:
    ``mixed_steps`` (a lower bound on mixed steps). The rest are ``decode_steps`` (an upper bound on
    decode-only steps: a short prefill chunk in a small step is indistinguishable). ``None`` both when no
    running sample above 0 exists. The whole result is ``None`` when the window has no usable histogram Δ.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterator, Sequence

from graphmode.core.records import (  # the feature rules live beside ObservedFeatures; re-exported here
    FEATURE_MAX,
    FEATURE_MAX_BY_NAME,
    ObservedFeatures,
    StepSizes,
    feature_range_error,
    split_decode_mixed,
)
from graphmode.profiling.metrics import Histogram, MetricsSnapshot

__all__ = ["FEATURE_MAX", "FEATURE_MAX_BY_NAME", "compute_features", "feature_range_error"]

def compute_features(snapshots: Sequence[MetricsSnapshot]) -> ObservedFeatures:
    """The :class:`ObservedFeatures` of ``snapshots`` (see the module docstring for definitions)."""
    window = since_last_reset(sorted(snapshots, key=lambda s: s.t))
    if not window:
        return ObservedFeatures(n_samples=0)
    first, last = window[0], window[-1]
    window_s = last.t - first.t
    has_deltas = len(window) >= 2 and window_s > 0

    running = [s.num_requests_running for s in window if s.num_requests_running is not None]
    waiting = [s.num_requests_waiting for s in window if s.num_requests_waiting is not None]
    in_system = [
        s.num_requests_running + s.num_requests_waiting
        for s in window
        if s.num_requests_running is not None and s.num_requests_waiting is not None
    ]
    kv = [s.kv_cache_usage for s in window if s.kv_cache_usage is not None]
    batch_mean, batch_var = _mean(running), _pvar(running)

    d_prompt = _delta(first.prompt_tokens_total, last.prompt_tokens_total)
    d_gen = _delta(first.generation_tokens_total, last.generation_tokens_total)
    d_success = _delta(first.request_success_total, last.request_success_total)
    d_iter = _hist_delta(first.iteration_tokens, last.iteration_tokens)
    d_drafts = _delta(first.spec_decode_drafts_total, last.spec_decode_drafts_total)
    d_draft_tokens = _delta(first.spec_decode_draft_tokens_total, last.spec_decode_draft_tokens_total)
    d_accepted = _delta(first.spec_decode_accepted_tokens_total, last.spec_decode_accepted_tokens_total)
    accepted_per_draft = _ratio(d_accepted, d_drafts) if has_deltas else None

    return _in_range(
        window_s=window_s,
        n_samples=len(window),
        arrival_rate=_arrival_rate(first, last, window_s) if has_deltas else None,
        completion_rate=_rate(d_success, window_s) if has_deltas else None,
        prompt_tokens_rate=_rate(d_prompt, window_s) if has_deltas else None,
        generation_tokens_rate=_rate(d_gen, window_s) if has_deltas else None,
        prefill_decode_ratio=_ratio(d_prompt, d_gen) if has_deltas else None,
        mean_input_tokens=_hist_mean(_hist_delta(first.request_prompt_tokens, last.request_prompt_tokens))
        if has_deltas
        else None,
        mean_output_tokens=_hist_mean(
            _hist_delta(first.request_generation_tokens, last.request_generation_tokens)
        )
        if has_deltas
        else None,
        batch_mean=batch_mean,
        batch_var=batch_var,
        batch_cv=_cv(batch_mean, batch_var),
        batch_max=max(running) if running else None,
        iter_tokens_mean=_hist_mean(d_iter) if has_deltas else None,
        iter_tokens_cv=binned_cv(d_iter.buckets) if has_deltas and d_iter is not None else None,
        queue_mean=_mean(waiting),
        concurrency_mean=_mean(in_system),
        kv_usage_mean=_mean(kv),
        kv_usage_max=max(kv) if kv else None,
        preemptions=_delta(first.num_preemptions_total, last.num_preemptions_total) if has_deltas else None,
        frontend_cpu_cores=_rate(_delta(first.process_cpu_seconds_total, last.process_cpu_seconds_total),
                                 window_s) if has_deltas else None,
        spec_acceptance_rate=_ratio(d_accepted, d_draft_tokens) if has_deltas else None,
        spec_accept_length=None if accepted_per_draft is None else 1.0 + accepted_per_draft,
    )


def _in_range(**values: float | None) -> ObservedFeatures:
    """The features, each value outside :func:`feature_range_error`'s rules dropped (see Range above)."""
    kept = {k: (None if v is not None and feature_range_error(k, v) else v) for k, v in values.items()}
    return ObservedFeatures.model_validate(kept)


def server_latency(snapshots: Sequence[MetricsSnapshot]) -> tuple[float | None, float | None]:
    """(mean ITL, mean TTFT) in seconds as vLLM timed them over the window: Δsum/Δcount of
    ``vllm:inter_token_latency_seconds`` and ``vllm:time_to_first_token_seconds``; ``None`` each without
    two snapshots after the last reset or without a token in the window."""
    window = since_last_reset(sorted(snapshots, key=lambda s: s.t))
    if len(window) < 2:
        return None, None
    first, last = window[0], window[-1]
    return (_hist_mean(_hist_delta(first.inter_token_latency, last.inter_token_latency)),
            _hist_mean(_hist_delta(first.time_to_first_token, last.time_to_first_token)))


def compute_step_sizes(snapshots: Sequence[MetricsSnapshot], api_servers: int | None = None) -> StepSizes | None:
    """The :class:`StepSizes` of ``snapshots`` (see the module docstring), ``None`` without a histogram Δ.

    ``api_servers`` (vLLM's --api-server-count, when known) is kept with the histogram as observed: each
    server counts its own requests' share of a step (:meth:`StepSizes.per_engine_step`); the decode/mixed
    split is taken on the per-step scale.
    """
    window = since_last_reset(sorted(snapshots, key=lambda s: s.t))
    if len(window) < 2:
        return None
    delta = _hist_delta(window[0].iteration_tokens, window[-1].iteration_tokens)
    if delta is None or not delta.buckets:
        return None
    le: list[float] = []
    steps: list[float] = []
    below = 0.0  # steps at or under the last finite edge seen
    total = max(delta.count, 0.0)
    for edge, cum in sorted(delta.buckets):
        if math.isinf(edge):
            total = max(cum, total)
            continue
        le.append(edge)
        steps.append(max(cum - below, 0.0))  # scrape races can make cumulative counts dip by a hair
        below = max(cum, below)
    steps.append(max(total - below, 0.0))  # above the largest finite edge
    running: dict[int, int] = {}
    for s in window:
        if s.num_requests_running is not None:
            key = round(s.num_requests_running)
            running[key] = running.get(key, 0) + 1
    n = api_servers if api_servers and api_servers > 1 else 1
    decode, mixed = split_decode_mixed([e * n for e in le], [c / n for c in steps], running)
    return StepSizes(le=le, steps=steps, running=running, decode_steps=decode, mixed_steps=mixed,
                     api_servers=api_servers)


class FeatureWindow:
    """The snapshots of the last ``window_s`` seconds, for live feature computation.

    A snapshot is kept while ``t >= newest.t - window_s``, so at a fixed scrape interval the window
    spans ``window_s`` once full. A counter reset (server restart) empties the window: pre-restart
    counters cannot be differenced against post-restart ones.
    """

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._snapshots: deque[MetricsSnapshot] = deque()

    def add(self, snapshot: MetricsSnapshot) -> None:
        """Append ``snapshot`` (``t`` must not go backwards) and drop what fell out of the window."""
        if self._snapshots:
            newest = self._snapshots[-1]
            if snapshot.t < newest.t:
                raise ValueError(f"snapshot at t={snapshot.t} is older than the newest one (t={newest.t})")
            if counters_reset(newest, snapshot):
                self._snapshots.clear()
        self._snapshots.append(snapshot)
        horizon = snapshot.t - self.window_s
        while self._snapshots[0].t < horizon:
            self._snapshots.popleft()

    def features(self) -> ObservedFeatures:
        return compute_features(list(self._snapshots))

    def step_sizes(self) -> StepSizes | None:
        return compute_step_sizes(list(self._snapshots))

    @property
    def snapshots(self) -> tuple[MetricsSnapshot, ...]:
        return tuple(self._snapshots)

    def __len__(self) -> int:
        return len(self._snapshots)

    def __iter__(self) -> Iterator[MetricsSnapshot]:
        return iter(tuple(self._snapshots))


def counters_reset(prev: MetricsSnapshot, cur: MetricsSnapshot) -> bool:
    """Whether any cumulative value went down from ``prev`` to ``cur``, i.e. the server restarted."""
    before = dict(_cumulative(prev))
    return any(k in before and v < before[k] for k, v in _cumulative(cur))


def since_last_reset(snapshots: Sequence[MetricsSnapshot]) -> list[MetricsSnapshot]:
    """The tail of time-ordered ``snapshots`` that starts after the last counter reset.

    Each cumulative value is compared with the last snapshot that had it, so a reset hidden behind a scrape
    where the value was absent or unreadable is still a reset.
    """
    start = 0
    seen: dict[tuple[str, float], float] = {}
    for i, snap in enumerate(snapshots):
        for key, value in _cumulative(snap):
            if key in seen and value < seen[key]:
                start = i
            seen[key] = value
    return list(snapshots[start:])


def binned_cv(cumulative: Sequence[tuple[float, float]]) -> float | None:
    """Coefficient of variation of a distribution given as cumulative ``(le, count)`` buckets.

    Each bucket's mass sits at its midpoint; the first bucket starts at 0 and the ``+Inf`` bucket
    sits at its lower edge (nothing better is known about it).
    """
    points: list[tuple[float, float]] = []  # (position, mass)
    lower, below = 0.0, 0.0
    for le, cum in sorted(cumulative):
        mass = max(cum - below, 0.0)  # scrape races can make cumulative counts dip by a hair
        points.append((lower if math.isinf(le) else (lower + le) / 2, mass))
        lower, below = (lower if math.isinf(le) else le), max(cum, below)
    total = math.fsum(m for _, m in points)
    if total <= 0:
        return None
    mean = math.fsum(x * m for x, m in points) / total
    if mean <= 0:
        return None
    var = math.fsum(m * (x - mean) ** 2 for x, m in points) / total
    return math.sqrt(var) / mean


def _cumulative(snap: MetricsSnapshot) -> Iterator[tuple[tuple[str, float], float]]:
    """Every cumulative value ``snap`` has, keyed by (name, bucket edge; 0 for a plain counter)."""
    counters = {
        "prompt_tokens": snap.prompt_tokens_total,
        "generation_tokens": snap.generation_tokens_total,
        "request_success": snap.request_success_total,
        "num_preemptions": snap.num_preemptions_total,
        "process_cpu_seconds": snap.process_cpu_seconds_total,  # a new API server process starts at 0
        "spec_decode_drafts": snap.spec_decode_drafts_total,
        "spec_decode_draft_tokens": snap.spec_decode_draft_tokens_total,
        "spec_decode_accepted_tokens": snap.spec_decode_accepted_tokens_total,
    }
    for name, value in counters.items():
        if value is not None:
            yield (name, 0.0), value
    histograms = {
        "iteration_tokens": snap.iteration_tokens,
        "request_prompt_tokens": snap.request_prompt_tokens,
        "request_generation_tokens": snap.request_generation_tokens,
        "time_to_first_token": snap.time_to_first_token,
        "inter_token_latency": snap.inter_token_latency,
    }
    for name, h in histograms.items():
        if h is not None:
            yield (name + ":count", 0.0), h.count
            yield (name + ":sum", 0.0), h.sum
            for le, c in h.buckets:
                yield (name + ":bucket", le), c


def _delta(a: float | None, b: float | None) -> float | None:
    # A cumulative value never goes down inside a window (that is a reset, which starts a new window).
    return None if a is None or b is None or b < a else b - a


def _rate(delta: float | None, dt: float) -> float | None:
    return None if delta is None else delta / dt


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def _arrival_rate(first: MetricsSnapshot, last: MetricsSnapshot, dt: float) -> float | None:
    d_success = _delta(first.request_success_total, last.request_success_total)
    r0, r1 = first.num_requests_running, last.num_requests_running
    w0, w1 = first.num_requests_waiting, last.num_requests_waiting
    if d_success is None or r0 is None or r1 is None or w0 is None or w1 is None:
        return None
    return max(d_success + (r1 - r0) + (w1 - w0), 0.0) / dt  # gauges: they may go down


def _hist_delta(first: Histogram | None, last: Histogram | None) -> Histogram | None:
    if first is None or last is None:
        return None
    # Buckets are fixed at server start, so both snapshots share the same `le`s; keep only common ones
    # in case a scrape caught something odd.
    before = dict(first.buckets)
    buckets = [(le, c - before[le]) for le, c in last.buckets if le in before]
    if last.sum < first.sum or last.count < first.count or any(c < 0 for _, c in buckets):
        return None  # went down: a reset, which since_last_reset keeps out of a window
    return Histogram(sum=last.sum - first.sum, count=last.count - first.count, buckets=buckets)


def _hist_mean(h: Histogram | None) -> float | None:
    return None if h is None else h.mean


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _pvar(xs: Sequence[float]) -> float | None:
    return statistics.pvariance(xs) if xs else None


def _cv(mean: float | None, var: float | None) -> float | None:
    return None if mean is None or var is None or mean == 0 else math.sqrt(var) / mean
