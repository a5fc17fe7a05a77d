"""Do a race's resident engines fit the GPU (profiling/race_fit.py)? Refused before any engine starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import ConfigError
from graphmode.core.modes import CudaGraphMode
from graphmode.profiling.race import Racer
from graphmode.profiling.race_fit import ENGINE_OVERHEAD_GIB, fit_problem, size_gib, weights_gib
from tests.unit.test_race_fake import race_config

ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = ROOT / "models" / "shapes" / "llama-3.1-8b.json"


def test_sizes_parse_like_vllm_binary_units() -> None:
    assert size_gib("8G") == 8 and size_gib("4096M") == 4 and size_gib("16GiB") == 16 and size_gib("2Gi") == 2
    assert size_gib(str(2**30)) == 1 and size_gib("lots") is None and size_gib("0G") is None


def test_weights_from_the_config_and_fp8_halves_them() -> None:
    cfg = json.loads(LLAMA_8B.read_text())
    bf16 = weights_gib(cfg, None)
    assert bf16 is not None and 14.0 < bf16 < 16.0  # 8.03B parameters × 2 bytes
    assert weights_gib(cfg, "fp8") == pytest.approx(bf16 / 2)
    assert weights_gib({**cfg, "quantization_config": {"quant_method": "fp8"}}, None) == pytest.approx(bf16 / 2)
    assert weights_gib({}, None) is None


def test_what_fits_and_what_does_not() -> None:
    args = ["--model", str(LLAMA_8B), "--load-format", "dummy"]
    per_engine = (weights_gib(json.loads(LLAMA_8B.read_text()), None) or 0) + 4 + ENGINE_OVERHEAD_GIB
    assert fit_problem(5, args, 141.0, "4G", None, "fewer modes") is None  # 5 × ~25 GiB
    problem = fit_problem(8, args, 141.0, "4G", None, "fewer modes or fewer replicas")
    assert problem is not None and f"{int(141 // per_engine)} fit" in problem and "fewer replicas" in problem
    assert "no GiB of KV cache" in problem  # 8 × 8B weights and overhead alone: 152 GiB
    six = fit_problem(6, args, 141.0, "5G", None, "x")  # 141 / 6 - 15.0 - 4 = 4.5
    assert six is not None and "at most 4G of KV cache" in six
    assert fit_problem(6, args, 141.0, "4G", None, "x") is None  # the advice fits
    # the 1B of lease 8: twelve engines at 4G fit now (they used ~7 GiB each at 3G), at 6G they do not
    small = ["--model", str(LLAMA_8B.with_name("llama-3.2-1b.json"))]
    assert fit_problem(12, small, 140.4, "4G", None, "x") is None
    refused = fit_problem(12, small, 140.4, "6G", None, "x")
    assert refused is not None and "at most 5G of KV cache" in refused
    # nothing known, nothing refused: no GPU, a hub id, an unreadable KV size
    assert fit_problem(8, args, None, "4G", None, "x") is None
    assert fit_problem(8, ["--model", "meta-llama/Llama-3.1-8B"], 141.0, "4G", None, "x") is None
    assert fit_problem(8, args, 141.0, "lots", None, "x") is None
    # utilisation shares must add up to at most the whole GPU
    assert fit_problem(6, args, 141.0, None, 0.15, "x") is None
    share = fit_problem(8, args, 141.0, None, 0.15, "fewer modes")
    assert share is not None and "1.20 of the GPU" in share


def test_a_race_that_cannot_fit_is_refused_before_any_engine_starts(tmp_path: Path) -> None:
    with ProfileStore(tmp_path / "race.sqlite") as store:
        racer = Racer(race_config(tmp_path, [CudaGraphMode.NONE], replicas=3, kv_cache_memory_bytes="40G"), store)
        racer.profiler.gpu["gpu_memory_gib"] = 141.0
        with pytest.raises(ConfigError, match=r"do not fit the GPU: 6 engines .* 3 fit"):
            racer.run()
        assert store.count() == 0 and not any((tmp_path / "logs").glob("*.log"))
        racer.profiler.gpu["gpu_memory_gib"] = None  # no NVML (this box): nothing to check
        racer.check_fit()
