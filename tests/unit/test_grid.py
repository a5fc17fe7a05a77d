"""The workload grid: bundled default, matrix expansion, defaults, YAML/TOML, errors naming the field."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from graphmode.core.errors import ConfigError, GridError
from graphmode.profiling.grid import Grid, LengthDist, Workload, load_grid

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_GRID = ROOT / "src" / "graphmode" / "data" / "default_grid.yaml"
SLICE1 = ROOT / "bench" / "grids" / "h200-slice1.yaml"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _grid_error(tmp_path: Path, name: str, text: str) -> str:
    with pytest.raises(GridError) as info:
        load_grid(_write(tmp_path, name, text))
    return str(info.value)


ONE = "{name: a, rate: 1, input: {mean: 10}, output: {mean: 10}}"


# ---------------------------------------------------------------- the bundled default grid


def test_default_grid_is_packaged_and_matches_source() -> None:
    packaged = resources.files("graphmode") / "data" / "default_grid.yaml"
    assert packaged.is_file()
    assert packaged.read_text(encoding="utf-8") == DEFAULT_GRID.read_text(encoding="utf-8")


def test_default_grid_covers_the_space() -> None:
    grid = load_grid(DEFAULT_GRID)
    ws = grid.workloads
    assert grid.name == "default"
    assert len(ws) >= 24
    assert len({w.name for w in ws}) == len(ws)

    rates = {w.rate for w in ws}
    assert min(rates) <= 2 and max(rates) >= 32, rates  # low and high load
    assert any(w.burstiness < 1 for w in ws), "no bursty workload"
    assert any(w.burstiness == 1.0 for w in ws), "no smooth (Poisson) workload"
    prefill_heavy = [w for w in ws if w.input.mean >= 8 * w.output.mean]
    decode_heavy = [w for w in ws if w.output.mean >= 4 * w.input.mean]
    assert prefill_heavy and decode_heavy
    # every (rate, burstiness) combination meets both a prefill-heavy and a decode-heavy shape
    for rate in rates:
        for burst in {w.burstiness for w in ws}:
            cell = [w for w in ws if w.rate == rate and w.burstiness == burst]
            assert any(w in prefill_heavy for w in cell) and any(w in decode_heavy for w in cell), (rate, burst)
    # the grid's defaults reached every workload
    assert all(w.duration_s == 6 and w.warmup_s == 5 and w.repeats == 1 for w in ws)
    assert all(w.adaptive is not None and w.adaptive.ci == {"itl_p50": 0.03, "ttft_p50": 0.10} for w in ws)


def test_default_grid_matrix_names() -> None:
    names = {w.name for w in load_grid(DEFAULT_GRID).workloads}
    for expected in ("prefill-heavy-r2-b1", "chat-r8-b0.25", "balanced-r32-b1", "decode-heavy-r32-b0.25"):
        assert expected in names


def test_pilot_slice1_shares_names_not_specs_with_the_adaptive_default_grid() -> None:
    """The pilot's fixed 12-s windows are another measurement: --resume must not count them done."""
    default = {w.name: w for w in load_grid(DEFAULT_GRID).workloads}
    slice1 = load_grid(SLICE1)
    assert slice1.name == "h200-slice1"
    assert len(slice1.workloads) >= 4
    for w in slice1.workloads:
        assert w.name in default, w.name
        assert w.adaptive is None and w.spec_hash() != default[w.name].spec_hash(), w.name
        fixed = default[w.name].model_copy(update={"adaptive": None, "duration_s": 12.0, "warmup_s": 3.0})
        assert w.spec_hash() == fixed.spec_hash(), w.name  # adding the field left old hashes alone
    assert {w.name: w.repeats for w in slice1.workloads}["chat-r8-b1"] == 2


# ---------------------------------------------------------------- matrix and defaults


MATRIX = """
name: m
defaults: {duration_s: 5, warmup_s: 1, repeats: 2, seed: 7}
matrix:
  rate: [2, 0.5]
  burstiness: [1.0, 0.25]
  max_concurrency: [null, 4]
  shape:
    - {name: pre, input: {mean: 100, spread: 0.1}, output: {mean: 10}}
workloads:
  - {name: spike, rate: 50, burstiness: 0.1, input: {mean: 8}, output: {mean: 8}, repeats: 1}
"""


def test_matrix_expansion_names_and_defaults(tmp_path: Path) -> None:
    grid = load_grid(_write(tmp_path, "m.yaml", MATRIX))
    names = [w.name for w in grid.workloads]
    assert names == [
        "pre-r2-b1", "pre-r2-b1-c4", "pre-r2-b0.25", "pre-r2-b0.25-c4",
        "pre-r0.5-b1", "pre-r0.5-b1-c4", "pre-r0.5-b0.25", "pre-r0.5-b0.25-c4",
        "spike",
    ]
    by = {w.name: w for w in grid.workloads}
    w = by["pre-r0.5-b0.25-c4"]
    assert (w.rate, w.burstiness, w.max_concurrency) == (0.5, 0.25, 4)
    assert w.input == LengthDist(mean=100, spread=0.1) and w.output == LengthDist(mean=10)
    assert (w.duration_s, w.warmup_s, w.repeats, w.seed) == (5, 1, 2, 7)
    assert by["pre-r2-b1"].max_concurrency is None
    # defaults apply to explicit workloads too, and a workload's own value wins
    spike = by["spike"]
    assert (spike.duration_s, spike.warmup_s, spike.seed, spike.repeats) == (5, 1, 7, 1)
    assert grid.matrix is None


def test_field_defaults_without_grid_defaults(tmp_path: Path) -> None:
    grid = load_grid(_write(tmp_path, "plain.yaml", f"workloads: [{ONE}]\n"))
    (w,) = grid.workloads
    assert grid.name == "plain"  # the file's stem when the file gives no name
    assert (w.burstiness, w.duration_s, w.warmup_s, w.repeats, w.seed) == (1.0, 20.0, 3.0, 1, 0)
    assert w.max_concurrency is None and w.max_requests is None
    assert w.slo_ttft_s is None and w.slo_itl_s is None
    assert w.input.spread == 0.0 and w.input.bounds() == (10, 10)


def test_length_bounds() -> None:
    assert LengthDist(mean=100, spread=0.2).bounds() == (80, 120)
    assert LengthDist(mean=1, spread=0.9).bounds() == (1, 2)  # never below one token
    assert LengthDist(mean=3).bounds() == (3, 3)


def test_yaml_and_toml_give_the_same_workloads(tmp_path: Path) -> None:
    yaml_text = """
name: same
defaults: {duration_s: 6}
workloads:
  - {name: a, rate: 8, burstiness: 0.5, input: {mean: 64, spread: 0.2}, output: {mean: 16}}
  - {name: b, rate: 2.5, input: {mean: 16}, output: {mean: 128, spread: 0.1}, slo_ttft_s: 0.5}
"""
    toml_text = """
name = "same"

[defaults]
duration_s = 6

[[workloads]]
name = "a"
rate = 8
burstiness = 0.5
input = {mean = 64, spread = 0.2}
output = {mean = 16}

[[workloads]]
name = "b"
rate = 2.5
input = {mean = 16}
output = {mean = 128, spread = 0.1}
slo_ttft_s = 0.5
"""
    from_yaml = load_grid(_write(tmp_path, "g.yaml", yaml_text))
    from_toml = load_grid(_write(tmp_path, "g.toml", toml_text))
    assert [w.spec() for w in from_yaml.workloads] == [w.spec() for w in from_toml.workloads]
    assert [w.spec_hash() for w in from_yaml.workloads] == [w.spec_hash() for w in from_toml.workloads]
    assert from_toml.workloads[1].slo_ttft_s == 0.5


def test_toml_matrix(tmp_path: Path) -> None:
    text = """
[matrix]
rate = [1, 4]
[[matrix.shape]]
name = "s"
input = {mean = 32}
output = {mean = 32}
"""
    grid = load_grid(_write(tmp_path, "mx.toml", text))
    assert [w.name for w in grid.workloads] == ["s-r1-b1", "s-r4-b1"]


# ---------------------------------------------------------------- spec_hash


def test_spec_hash_ignores_repeats_but_not_the_load() -> None:
    w = Workload(name="x", rate=4, input=LengthDist(mean=64), output=LengthDist(mean=64))
    h = w.spec_hash()
    assert len(h) == 10 and h == w.spec_hash()
    assert w.model_copy(update={"repeats": 5}).spec_hash() == h
    for change in ({"rate": 4.5}, {"burstiness": 0.5}, {"duration_s": 21.0}, {"seed": 1},
                   {"input": LengthDist(mean=65)}, {"output": LengthDist(mean=64, spread=0.1)},
                   {"max_concurrency": 8}, {"warmup_s": 0.0}, {"name": "y"}):
        assert w.model_copy(update=change).spec_hash() != h, change


def test_spec_roundtrips() -> None:
    w = Workload(name="x", rate=4, input=LengthDist(mean=64), output=LengthDist(mean=8), slo_itl_s=0.05)
    assert Workload.model_validate(w.spec()) == w


# ---------------------------------------------------------------- select


def test_select() -> None:
    grid = Grid.model_validate({"name": "g", "workloads": [
        {"name": n, "rate": 1, "input": {"mean": 1}, "output": {"mean": 1}} for n in ("a", "b", "c")]})
    assert [w.name for w in grid.select(None)] == ["a", "b", "c"]
    assert [w.name for w in grid.select([])] == ["a", "b", "c"]
    assert [w.name for w in grid.select(["c", "a"])] == ["c", "a"]
    with pytest.raises(GridError) as info:
        grid.select(["a", "nope", "zilch"])
    msg = str(info.value)
    assert "nope" in msg and "zilch" in msg and "'g'" in msg and "a," not in msg


# ---------------------------------------------------------------- invalid files


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("workloads: [{name: a, rate: -1, input: {mean: 10}, output: {mean: 10}}]",
         "workloads.0.rate", "greater than 0"),
        (f"workloads: [{ONE}, {{name: b, rate: 1, burstiness: 0, input: {{mean: 1}}, output: {{mean: 1}}}}]",
         "workloads.1.burstiness", "greater than 0"),
        ("workloads: [{name: a, rate: 1, colour: red, input: {mean: 10}, output: {mean: 10}}]",
         "workloads.0.colour", "Extra inputs"),
        ("workloads: [{name: a, rate: 1, input: {mean: 10, spread: 1.0}, output: {mean: 10}}]",
         "workloads.0.input.spread", "less than 1"),
        ("workloads: [{name: a, rate: 1, input: {mean: 10}, output: {mean: 0}}]",
         "workloads.0.output.mean", "greater than 0"),
        ("workloads: [{name: a, rate: 1, input: {mean: 10}}]", "workloads.0.output", "Field required"),
        ("workloads: [{name: 'a b', rate: 1, input: {mean: 10}, output: {mean: 10}}]",
         "workloads.0.name", "pattern"),
        ("workloads: [{name: a, rate: 1, repeats: 0, input: {mean: 1}, output: {mean: 1}}]",
         "workloads.0.repeats", "greater than or equal to 1"),
        (f"defaults: {{durration_s: 3}}\nworkloads: [{ONE}]", "workloads.0.durration_s", "Extra inputs"),
        (f"colour: red\nworkloads: [{ONE}]", "colour", "Extra inputs"),
        (f"defaults: 3\nworkloads: [{ONE}]", "defaults", "dictionary"),
        (f"workloads: [{ONE}, {ONE}]", "duplicate workload name 'a'", ""),
        ("name: nothing\n", "grid has no workloads", ""),
        ("workloads: []\n", "grid has no workloads", ""),
        ("matrix: {rate: [], shape: [{name: s, input: {mean: 1}, output: {mean: 1}}]}", "matrix.rate", ""),
        ("matrix: {rate: [1], shape: [{name: s, input: {mean: 1}}]}", "matrix.shape.0.output", "required"),
        ("matrix: {rate: [-1], shape: [{name: s, input: {mean: 1}, output: {mean: 1}}]}", "rate",
         "greater than 0"),
    ],
)
def test_invalid_grid_names_the_field(tmp_path: Path, text: str, field: str, words: str) -> None:
    msg = _grid_error(tmp_path, "bad.yaml", text)
    assert "invalid grid file" in msg and "bad.yaml" in msg
    assert field in msg, msg
    assert words in msg, msg


def test_grid_error_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_grid(_write(tmp_path, "x.yaml", "workloads: []\n"))


def test_duplicate_between_matrix_and_workloads(tmp_path: Path) -> None:
    text = (
        "matrix: {rate: [1], shape: [{name: s, input: {mean: 1}, output: {mean: 1}}]}\n"
        "workloads: [{name: s-r1-b1, rate: 3, input: {mean: 1}, output: {mean: 1}}]\n"
    )
    assert "duplicate workload name 's-r1-b1'" in _grid_error(tmp_path, "dup.yaml", text)


@pytest.mark.parametrize(("text", "got"), [("- a\n- b\n", "list"), ("", "NoneType"), ("just text\n", "str")])
def test_not_a_mapping(tmp_path: Path, text: str, got: str) -> None:
    msg = _grid_error(tmp_path, "list.yaml", text)
    assert "mapping" in msg and got in msg


def test_bad_yaml(tmp_path: Path) -> None:
    msg = _grid_error(tmp_path, "broken.yaml", "workloads: [\n  {name: a\n")
    assert "broken.yaml" in msg and "not valid YAML" in msg


def test_bad_toml(tmp_path: Path) -> None:
    msg = _grid_error(tmp_path, "broken.toml", "workloads = [\n")
    assert "broken.toml" in msg and "not valid TOML" in msg


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(GridError, match=r"cannot read grid file .*missing\.yaml"):
        load_grid(tmp_path / "missing.yaml")
    with pytest.raises(GridError, match="cannot read grid file"):
        load_grid(tmp_path)  # a directory
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(GridError, match=r"cannot read grid file .*binary\.yaml.*UTF-8"):
        load_grid(binary)
