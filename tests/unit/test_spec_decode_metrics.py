"""Speculative decoding's counters (vllm:spec_decode_*): parsed from real vLLM pages, turned into the
acceptance rate and tokens per verification step per window, recorded per cell, shown beside the latency,
and never read by a model or sent to a service as traffic."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from graphmode.cli.common import spec_decode_text
from graphmode.core.records import ObservedFeatures
from graphmode.profiling.features import compute_features
from graphmode.profiling.metrics import MetricsSnapshot, parse_metrics
from graphmode.selector.featurize import OBS_FEATURES
from graphmode.service.schemas import TRAFFIC_FEATURES

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu"
FAKE = ROOT / "tests" / "support" / "fake_vllm.py"


def _snap(t: float, drafts: float | None, proposed: float | None, accepted: float | None,
          gen: float = 0.0) -> MetricsSnapshot:
    return MetricsSnapshot(t=t, generation_tokens_total=gen, spec_decode_drafts_total=drafts,
                           spec_decode_draft_tokens_total=proposed, spec_decode_accepted_tokens_total=accepted)


def test_the_real_pages_carry_the_counters() -> None:
    idle = parse_metrics((CPU / "metrics-ngram-idle.txt").read_text(), t=0.0)
    after = parse_metrics((CPU / "metrics-ngram-after.txt").read_text(), t=10.0)
    assert (idle.spec_decode_drafts_total, idle.spec_decode_draft_tokens_total,
            idle.spec_decode_accepted_tokens_total) == (0.0, 0.0, 0.0)
    # the per-position counter (..._accepted_tokens_per_pos_total) is not summed into the accepted tokens
    assert (after.spec_decode_drafts_total, after.spec_decode_draft_tokens_total,
            after.spec_decode_accepted_tokens_total) == (24.0, 68.0, 68.0)
    feats = compute_features([idle, after])
    assert feats.spec_acceptance_rate == pytest.approx(1.0)
    assert feats.spec_accept_length == pytest.approx(1 + 68 / 24)
    # a server without speculative decoding has none of them
    plain = parse_metrics((CPU / "metrics-after-load.txt").read_text(), t=1.0)
    assert plain.spec_decode_drafts_total is None
    assert compute_features([parse_metrics((CPU / "metrics-idle.txt").read_text(), t=0.0), plain]) \
        .spec_acceptance_rate is None


def test_an_eagle_draft_that_never_hits_reads_zero_not_none() -> None:
    # real page: one-layer EAGLE draft, dummy weights, one 32-token greedy completion (SOURCE.md)
    after = parse_metrics((CPU / "metrics-eagle-after.txt").read_text(), t=10.0)
    assert (after.spec_decode_drafts_total, after.spec_decode_draft_tokens_total,
            after.spec_decode_accepted_tokens_total) == (31.0, 93.0, 0.0)
    feats = compute_features([_snap(0.0, 0.0, 0.0, 0.0), after])
    assert feats.spec_acceptance_rate == 0.0
    assert feats.spec_accept_length == 1.0


def test_rates_over_the_window_only() -> None:
    snaps = [_snap(0.0, 100, 300, 150), _snap(5.0, 140, 420, 210), _snap(10.0, 200, 600, 240)]
    feats = compute_features(snaps)
    assert feats.spec_acceptance_rate == pytest.approx(90 / 300)
    assert feats.spec_accept_length == pytest.approx(1 + 90 / 100)


@pytest.mark.parametrize("snaps", [
    [_snap(0.0, 10, 30, 5), _snap(5.0, 10, 30, 5)],  # nothing proposed in the window (ngram found no match)
    [_snap(0.0, None, None, None), _snap(5.0, None, None, None)],  # no speculative config
    [_snap(0.0, 10, 30, 5)],  # one snapshot
])
def test_nothing_proposed_or_no_counters_is_none(snaps: list[MetricsSnapshot]) -> None:
    feats = compute_features(snaps)
    assert feats.spec_acceptance_rate is None and feats.spec_accept_length is None


def test_a_restart_starts_the_window_after_it() -> None:
    # the server restarted between t=5 and t=6: the draft counter going down is a reset too
    snaps = [_snap(0.0, 100, 300, 150, 500), _snap(5.0, 200, 600, 300, 900), _snap(6.0, 2, 6, 6, 10),
             _snap(11.0, 12, 36, 12, 60)]
    feats = compute_features(snaps)
    assert feats.spec_acceptance_rate == pytest.approx(6 / 30)
    assert feats.spec_accept_length == pytest.approx(1 + 6 / 10)


def test_no_model_reads_them_and_no_request_sends_them() -> None:
    names = {"spec_acceptance_rate", "spec_accept_length"}
    assert not names & {n for n, _ in OBS_FEATURES}
    assert not names & set(TRAFFIC_FEATURES)


def test_the_cell_line_names_them() -> None:
    assert spec_decode_text(ObservedFeatures()) == ""
    text = spec_decode_text(ObservedFeatures(spec_acceptance_rate=0.42, spec_accept_length=2.26))
    assert text == ", drafts 42% accepted, 2.26 tokens per verification step"


def test_the_fake_server_speculates_like_vllm(tmp_path: Path) -> None:
    port = 18000 + os.getpid() % 1000
    proc = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port), "--speculative-config",
                             '{"method": "ngram", "num_speculative_tokens": 3}'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        before = parse_metrics(httpx.get(url + "/metrics").text, t=0.0)
        r = httpx.post(url + "/v1/completions", json={"model": "fake-model", "prompt": [1, 2, 3],
                                                      "max_tokens": 40}, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 40
        after = parse_metrics(httpx.get(url + "/metrics").text, t=1.0)
        feats = compute_features([before, after])
        assert feats.spec_acceptance_rate is not None and 0.0 < feats.spec_acceptance_rate < 1.0
        # fewer steps than tokens: accepted drafts emit several tokens a step
        assert feats.spec_accept_length is not None and feats.spec_accept_length > 1.0
        assert after.generation_tokens_total == 40
    finally:
        proc.terminate()
        proc.wait(timeout=10)
