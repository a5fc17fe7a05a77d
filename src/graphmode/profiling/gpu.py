"""GPU facts and memory sampling through NVML (nvidia-ml-py). Without a GPU every value is None."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Collection
from typing import Any

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency; be graceful if it is gone
    pynvml = None

_GIB = 1024**3


def _init() -> bool:
    if pynvml is None:
        return False
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPU here
        return False
    return True


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_indices() -> list[int]:
    """NVML indices of the GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) or all.

    NVML ignores that variable, so without this a profiler pinned to GPU 1 would read GPU 0's name and
    add every GPU's memory (another profiler's included) to its own.
    """
    count = pynvml.nvmlDeviceGetCount()
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or not raw.strip():
        return list(range(count))
    uuids = {_str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))): i for i in range(count)}
    out: list[int] = []
    for item in raw.split(","):
        item = item.strip()
        if item.isdigit() and int(item) < count:
            out.append(int(item))
        elif item.startswith("GPU-"):
            match = [i for u, i in uuids.items() if u.startswith(item)]
            if match:
                out.append(match[0])
        else:
            break  # CUDA stops at the first invalid entry
    return out


def gpu_facts() -> dict[str, Any]:
    """GPU name, count, memory, driver and CUDA driver version, and the first visible GPU's UUID; all None
    without NVML."""
    facts: dict[str, Any] = {"gpu_name": None, "gpu_count": None, "gpu_memory_gib": None,
                             "driver_version": None, "cuda_version": None, "gpu_uuid": None}
    if not _init():
        return facts
    try:
        visible = visible_indices()
        facts["gpu_count"] = len(visible)
        facts["driver_version"] = _str(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        facts["cuda_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        if visible:
            handle = pynvml.nvmlDeviceGetHandleByIndex(visible[0])
            facts["gpu_name"] = _str(pynvml.nvmlDeviceGetName(handle))
            facts["gpu_memory_gib"] = round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / _GIB, 2)
            # Which physical GPU: repeats of a campaign land on different GPUs and hosts, and the noise
            # between engine starts is only separable from the noise between GPUs if rows say which.
            facts["gpu_uuid"] = _str(pynvml.nvmlDeviceGetUUID(handle))
    except Exception:
        pass
    finally:
        pynvml.nvmlShutdown()
    return facts


def _tick(devices: list[Any], fn: Any, *args: Any) -> list[float]:
    out: list[float] = []
    for h in devices:
        with contextlib.suppress(Exception):  # NVML_ERROR_NOT_SUPPORTED on some boards: that value is None
            out.append(float(fn(h, *args)))
    return out


class MemorySampler:
    """Samples the visible GPUs on a thread between ``start()`` and ``stop()``: used memory (summed) and
    the conditions that explain noise between engine starts (SM clock, power, utilisation, temperature)."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.samples_gib: list[float] = []
        self._clock: list[float] = []
        self._power: list[float] = []
        self._util: list[float] = []
        self._temp: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ok = False
        self._indices: list[int] = []

    def _read(self) -> float | None:
        try:
            total = 0
            for i in self._indices:
                total += pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used
            return total / _GIB
        except Exception:
            return None

    def _read_conditions(self) -> None:
        try:
            devices = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self._indices]
        except Exception:
            return
        clocks = _tick(devices, pynvml.nvmlDeviceGetClockInfo, getattr(pynvml, "NVML_CLOCK_SM", 1))
        power = _tick(devices, pynvml.nvmlDeviceGetPowerUsage)  # mW
        util = _tick(devices, lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
        temp = _tick(devices, pynvml.nvmlDeviceGetTemperature, getattr(pynvml, "NVML_TEMPERATURE_GPU", 0))
        if clocks:
            self._clock.append(sum(clocks) / len(clocks))
        if power:
            self._power.append(sum(power) / 1000.0)
        if util:
            self._util.append(sum(util) / len(util))
        if temp:
            self._temp.append(max(temp))

    def _loop(self) -> None:
        while not self._stop.is_set():
            v = self._read()
            if v is not None:
                self.samples_gib.append(v)
            self._read_conditions()
            self._stop.wait(self.interval_s)

    def start(self) -> MemorySampler:
        self._ok = _init()
        if self._ok:
            try:
                self._indices = visible_indices()
            except Exception:
                self._indices = []
            self._thread = threading.Thread(target=self._loop, name="gpu-mem", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> tuple[float | None, float | None]:
        """(max, mean) GiB used while sampling, or (None, None) without a GPU."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._ok and pynvml is not None:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
        if not self.samples_gib:
            return None, None
        return round(max(self.samples_gib), 3), round(sum(self.samples_gib) / len(self.samples_gib), 3)

    def conditions(self) -> dict[str, float | None]:
        """Means (clock also its minimum, temperature its maximum) over the samples; None where NVML had none."""
        def mean(xs: list[float], nd: int = 1) -> float | None:
            return round(sum(xs) / len(xs), nd) if xs else None

        return {
            "gpu_sm_clock_mhz_mean": mean(self._clock), "gpu_sm_clock_mhz_min": min(self._clock, default=None),
            "gpu_power_w_mean": mean(self._power), "gpu_util_pct_mean": mean(self._util),
            "gpu_temp_c_max": max(self._temp, default=None),
        }


def process_gpu_gib(pids: Collection[int]) -> float | None:
    """GPU memory NVML charges to *pids* on the visible GPUs, in GiB; None without NVML, or when NVML lists
    none of them (a container's PID namespace can hide them).

    Why this and not vLLM's "Graph capturing finished ..., took X GiB": that is the device's free memory
    before minus after the capture, so engines starting side by side on one GPU (a race's start wave) read
    each other's allocations in it (-5.6 to +16 GiB for a 1B model on the H200). A process's own memory is
    its own whoever else starts, and with the KV cache fixed per engine (``--kv-cache-memory-bytes``) the
    difference between two modes' engines is what their graphs (and compiled code) take.
    """
    if not pids or not _init():
        return None
    total, seen = 0, False
    try:
        for i in visible_indices():
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(proc, "usedGpuMemory", None)
                if proc.pid in pids and isinstance(used, int):
                    total, seen = total + used, True
    except Exception:  # NVML without per-process accounting (NVMLError_NotSupported, ...)
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return round(total / _GIB, 3) if seen else None


def pci_bus_id() -> str | None:
    """sysfs name (``0000:1b:00.0``) of the first visible GPU, to find its NUMA node; None without NVML."""
    if not _init():
        return None
    try:
        visible = visible_indices()
        if not visible:
            return None
        raw = _str(pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(visible[0])).busId)
        domain, rest = raw.split(":", 1)  # NVML: 8-digit domain, upper case; sysfs: 4 digits, lower case
        return f"{int(domain, 16):04x}:{rest}".lower()
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
