"""Scraped ``/metrics`` values no vLLM exports (issue 44, items 1 and 2): huge, non-finite and negative
samples, and counters that go backwards, never crash the feature code and never become a negative or
out-of-range feature; a ``features`` body and scraped features follow the same range rules."""

from __future__ import annotations

import math

import pytest

from graphmode.profiling.features import (
    FEATURE_MAX,
    compute_features,
    feature_range_error,
    since_last_reset,
)
from graphmode.profiling.metrics import Histogram, MetricsSnapshot, parse_metrics

BASE = """\
vllm:num_requests_running{engine="0"} 4
vllm:num_requests_waiting{engine="0"} 1
vllm:request_success_total{engine="0",finished_reason="stop"} %(success)s
vllm:prompt_tokens_total{engine="0"} %(prompt)s
vllm:generation_tokens_total{engine="0"} %(gen)s
"""


def _text(success: float = 10, prompt: float = 1000, gen: float = 500, extra: str = "") -> str:
    return BASE % {"success": success, "prompt": prompt, "gen": gen} + extra


def _features(*texts: str) -> dict[str, float | None]:
    snaps = [parse_metrics(t, float(i)) for i, t in enumerate(texts)]
    return compute_features(snaps).model_dump()


def _no_bad_feature(feats: dict[str, float | None]) -> None:
    for name, v in feats.items():
        if v is not None and name != "n_samples":
            assert feature_range_error(name, v) is None, (name, v)


def test_huge_gauges_on_two_label_sets_do_not_overflow() -> None:
    """1e308 on two series overflowed math.fsum (OverflowError) before; such a gauge is unreadable now."""
    huge = 'vllm:num_requests_running{engine="1"} 1e308\nvllm:num_requests_running{engine="2"} 1e308\n'
    feats = _features(_text(extra=huge), _text(success=20, extra=huge))
    assert feats["batch_mean"] is None and feats["concurrency_mean"] is None
    assert feats["completion_rate"] == 10.0  # the readable counters still count
    _no_bad_feature(feats)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-3", "1e308"])
def test_an_unreadable_gauge_is_absent_not_a_feature(value: str) -> None:
    text = f'vllm:num_requests_running{{engine="0"}} {value}\nvllm:num_requests_waiting{{engine="0"}} -1\n'
    snap = parse_metrics(text, 0.0)
    assert snap.num_requests_running is None and snap.num_requests_waiting is None
    feats = _features(text, text)
    assert feats["batch_mean"] is None and feats["concurrency_mean"] is None and feats["queue_mean"] is None


def test_a_histogram_with_a_huge_edge_or_count_is_unreadable() -> None:
    hist = ('vllm:iteration_tokens_total_bucket{le="1e308"} 5\nvllm:iteration_tokens_total_bucket{le="+Inf"} 5\n'
            "vllm:iteration_tokens_total_sum 40\nvllm:iteration_tokens_total_count 5\n")
    assert parse_metrics(hist, 0.0).iteration_tokens is None
    fine = hist.replace("1e308", "16")
    assert parse_metrics(fine, 0.0).iteration_tokens is not None
    assert parse_metrics(fine.replace("_sum 40", "_sum -40"), 0.0).iteration_tokens is None


def test_a_counter_going_backwards_is_a_reset_never_a_negative_rate() -> None:
    feats = _features(_text(success=100, prompt=5000), _text(success=40, prompt=6000), _text(success=50, prompt=6500))
    assert feats["n_samples"] == 2  # the window restarts after the decrease, as Prometheus reads a counter
    assert feats["completion_rate"] == 10.0
    _no_bad_feature(feats)


def test_a_reset_hidden_behind_an_unreadable_scrape_is_still_a_reset() -> None:
    """100, then NaN, then 50: the decrease is against the last scrape that had the counter."""
    texts = [_text(success=100), _text(success=float("nan")), _text(success=50)]
    snaps = [parse_metrics(t, float(i)) for i, t in enumerate(texts)]
    assert snaps[1].request_success_total is None
    assert since_last_reset(snaps) == snaps[2:]
    feats = compute_features(snaps).model_dump()
    assert feats["completion_rate"] is None
    _no_bad_feature(feats)


def test_a_histogram_sum_going_backwards_is_a_reset() -> None:
    """Only the sum went down (the count rose): before, that gave a negative mean_input_tokens."""
    a = MetricsSnapshot(t=0.0, request_prompt_tokens=Histogram(sum=5000.0, count=10.0, buckets=[(math.inf, 10.0)]))
    b = MetricsSnapshot(t=1.0, request_prompt_tokens=Histogram(sum=3000.0, count=12.0, buckets=[(math.inf, 12.0)]))
    feats = compute_features([a, b]).model_dump()
    assert feats["mean_input_tokens"] is None
    assert feats["n_samples"] == 1


def test_spec_decode_counters_going_backwards_give_no_negative_length() -> None:
    a = MetricsSnapshot(t=0.0, spec_decode_drafts_total=100.0, spec_decode_accepted_tokens_total=500.0,
                        spec_decode_draft_tokens_total=1000.0)
    b = MetricsSnapshot(t=1.0, spec_decode_drafts_total=200.0, spec_decode_accepted_tokens_total=100.0,
                        spec_decode_draft_tokens_total=1200.0)
    feats = compute_features([a, b]).model_dump()
    assert feats["spec_accept_length"] is None and feats["spec_acceptance_rate"] is None


def test_a_feature_beyond_the_body_rules_is_dropped() -> None:
    """1e17 requests finished in one second: a body would get 422 for it, a scrape drops it."""
    feats = _features(_text(success=0), _text(success=1e17))
    assert feats["completion_rate"] is None and feats["arrival_rate"] is None
    assert feats["prompt_tokens_rate"] == 0.0
    assert feature_range_error("arrival_rate", FEATURE_MAX * 2) is not None
    assert feature_range_error("kv_usage_mean", 101.0) is not None
    assert feature_range_error("batch_mean", -1.0) is not None
    assert feature_range_error("batch_mean", float("nan")) is not None
    assert feature_range_error("batch_mean", 3.0) is None
