"""What the measurements' drafts did, per shape, and the note an answer carries (selector.specdecode)."""

from __future__ import annotations

from graphmode.selector.featurize import shape_key, shape_of_row
from graphmode.selector.specdecode import SpecDecodeMeasured, spec_decode_by_shape, spec_decode_note


def _row(rate: float | None, length: float | None, status: str = "ok", model: str = "8b") -> dict[str, object]:
    return {"status": status, "obs_spec_acceptance_rate": rate, "obs_spec_accept_length": length,
            "fp_model_config_hash": model}


def test_means_per_shape_over_ok_cells_with_counters() -> None:
    rows = [_row(0.0, 1.0), _row(0.1, 1.3), _row(None, None), _row(0.9, 3.7, status="failed"),
            {**_row(None, 2.0), "obs_spec_acceptance_rate": float("nan")}, _row(1.0, 4.0, model="1b")]
    got = spec_decode_by_shape(rows)
    key, other = shape_key(shape_of_row(rows[0])), shape_key(shape_of_row(rows[-1]))
    assert set(got) == {key, other}
    assert got[key] == SpecDecodeMeasured(acceptance_rate=0.05, accept_length=1.433, cells=3)
    assert got[other] == SpecDecodeMeasured(acceptance_rate=1.0, accept_length=4.0, cells=1)
    assert spec_decode_by_shape([_row(None, None)]) == {}


def test_the_note_says_what_was_measured_and_what_the_deployment_shows() -> None:
    never = SpecDecodeMeasured(acceptance_rate=0.0, accept_length=1.0, cells=20)
    text = spec_decode_note(never)
    assert "drafts 0% accepted, 1.00 tokens per verification step (mean over 20 cells)" in text
    assert "with caution" in text
    live = spec_decode_note(never, observed_rate=0.62)
    assert "this deployment's drafts: 62% accepted, unlike the measurements" in live
    close = spec_decode_note(SpecDecodeMeasured(acceptance_rate=0.55, accept_length=2.6, cells=8), 0.6)
    assert "unlike" not in close and "caution" not in close
    assert spec_decode_note(SpecDecodeMeasured(accept_length=2.0, cells=1)).endswith("(mean over 1 cells)")
