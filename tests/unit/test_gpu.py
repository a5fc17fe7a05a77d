"""NVML facts and memory sampling, against a fake NVML: CUDA_VISIBLE_DEVICES decides which GPUs count."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from graphmode.core.fingerprint import build_fingerprint
from graphmode.profiling import gpu


class FakeNvml:
    """Two H200s; GPU 1 has 30 GiB in use, GPU 0 has 10 GiB."""

    GIB = 1024**3

    def __init__(self) -> None:
        self.used = [10 * self.GIB, 30 * self.GIB]
        self.uuids = ["GPU-b8e3abb9-b45f-584c", "GPU-a9241cab-157d-d393"]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2
    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.159.04"
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000
    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i
    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"
    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.uuids[h]
    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=140 * self.GIB, used=self.used[h])
    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return [1980, 1500][h]
    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return [350_000, 500_000][h]  # mW
    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=[40, 90][h], memory=10)
    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return [45, 61][h]
    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=[b"00000000:1B:00.0", b"00000000:9A:00.0"][h])
    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        # GPU 0: an engine core (pid 11, 6 GiB) and a neighbour's (pid 12); GPU 1: the engine core again
        return [[SimpleNamespace(pid=11, usedGpuMemory=6 * self.GIB), SimpleNamespace(pid=12, usedGpuMemory=self.GIB)],
                [SimpleNamespace(pid=11, usedGpuMemory=2 * self.GIB), SimpleNamespace(pid=13, usedGpuMemory=None)]][h]


class OldBoardNvml(FakeNvml):
    """A board whose NVML answers memory but nothing else (NVML_ERROR_NOT_SUPPORTED)."""

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
    nvmlDeviceGetPowerUsage = nvmlDeviceGetUtilizationRates = nvmlDeviceGetTemperature = (  # type: ignore[assignment]
        nvmlDeviceGetClockInfo)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setattr(gpu, "pynvml", fake)
    return fake


@pytest.mark.parametrize("env, expected", [
    (None, [0, 1]),
    ("", [0, 1]),
    ("1", [1]),
    ("1,0", [1, 0]),
    ("GPU-a9241cab", [1]),  # UUID prefixes, as CUDA accepts them
    ("0,7,1", [0]),  # CUDA stops at the first invalid entry
])
def test_visible_indices_follow_cuda_visible_devices(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch,
                                                     env: str | None, expected: list[int]) -> None:
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert gpu.visible_indices() == expected


def test_facts_describe_the_visible_gpu_and_keep_its_uuid_out_of_the_fingerprint(
        nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    facts = gpu.gpu_facts()
    assert facts["gpu_count"] == 1 and facts["gpu_name"] == "NVIDIA H200"
    assert facts["gpu_uuid"] == "GPU-a9241cab-157d-d393"
    assert facts["driver_version"] == "580.159.04" and facts["cuda_version"] == "13.0"
    fp = build_fingerprint(facts, {"model_architecture": "LlamaForCausalLM"}, ["--model", "m"])
    assert fp.gpu_count == 1 and not hasattr(fp, "gpu_uuid")


def test_memory_sampler_counts_only_visible_gpus(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    sampler = gpu.MemorySampler(interval_s=0.01).start()
    time.sleep(0.05)
    peak, mean = sampler.stop()
    assert peak == pytest.approx(30.0) and mean == pytest.approx(30.0)  # GPU 0's 10 GiB is another profiler's
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    sampler = gpu.MemorySampler(interval_s=0.01).start()
    time.sleep(0.05)
    assert sampler.stop()[0] == pytest.approx(40.0)


def test_no_nvml_means_no_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "pynvml", None)
    assert all(v is None for v in gpu.gpu_facts().values())
    assert gpu.MemorySampler().start().stop() == (None, None)


def test_sampler_reads_clock_power_util_and_temperature_of_visible_gpus(
        nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    sampler = gpu.MemorySampler(interval_s=0.01).start()
    time.sleep(0.05)
    sampler.stop()
    assert sampler.conditions() == {"gpu_sm_clock_mhz_mean": 1500.0, "gpu_sm_clock_mhz_min": 1500.0,
                                    "gpu_power_w_mean": 500.0, "gpu_util_pct_mean": 90.0, "gpu_temp_c_max": 61.0}
    assert gpu.pci_bus_id() == "0000:9a:00.0"  # sysfs spelling of NVML's bus id


def test_unsupported_readings_are_none_and_memory_still_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "pynvml", OldBoardNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    sampler = gpu.MemorySampler(interval_s=0.01).start()
    time.sleep(0.05)
    assert sampler.stop()[0] == pytest.approx(10.0)
    assert all(v is None for v in sampler.conditions().values())


def test_no_nvml_means_no_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "pynvml", None)
    sampler = gpu.MemorySampler().start()
    sampler.stop()
    assert all(v is None for v in sampler.conditions().values())
    assert gpu.pci_bus_id() is None


def test_process_memory_counts_only_the_engines_processes_on_visible_gpus(
        nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu.process_gpu_gib({10, 11}) == pytest.approx(8.0)  # the API server (10) holds none
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert gpu.process_gpu_gib({11}) == pytest.approx(6.0)
    # NVML lists none of them (another PID namespace), or no per-process accounting, or no NVML: unknown
    assert gpu.process_gpu_gib({99}) is None
    assert gpu.process_gpu_gib(set()) is None

    def unsupported(h: int) -> list[Any]:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
    monkeypatch.setattr(nvml, "nvmlDeviceGetComputeRunningProcesses", unsupported)
    assert gpu.process_gpu_gib({11}) is None
    monkeypatch.setattr(gpu, "pynvml", None)
    assert gpu.process_gpu_gib({11}) is None
