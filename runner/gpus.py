"""The box's GPUs, through NVML (nvidia-ml-py): the one module that talks to the driver.

`inventory()` lists the GPUs this runner may use (all of them, or those CUDA_VISIBLE_DEVICES names
when the runner itself was started with it), with memory and utilisation; `sample()` reads the
memory and utilisation of some of them while a run holds them. A box without a driver, or without
nvidia-ml-py, has no GPUs: NoDriver says why. Tests put a fake `pynvml` first on the path.

Indices are NVML's, which are in PCI bus order; an experiment gets them with
CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA counts the same way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class NoDriver(Exception):
    """NVML cannot start: no NVIDIA driver (or no nvidia-ml-py) on this box."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int  # total
    uuid: str = ""
    memory_used_mib: int = 0
    utilization: int = 0  # percent of the last sample period the GPU was busy
    minor: int | None = None  # its device node is /dev/nvidia<minor>


@dataclass(frozen=True)
class Gpus:
    driver: str
    cuda: str
    devices: list[Gpu]


@contextmanager
def _nvml() -> Iterator[Any]:
    try:
        import pynvml
    except ImportError as exc:
        raise NoDriver("nvidia-ml-py is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoDriver(str(exc)) from exc
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _visible(count: int) -> list[int]:
    """NVML indices this process may use: CUDA_VISIBLE_DEVICES (indices) when set, else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    indices = []
    for word in visible.split(","):
        word = word.strip()
        if not word.isdigit():
            break  # CUDA stops at the first entry it cannot parse ("-1", "", a UUID we don't map)
        if int(word) < count:
            indices.append(int(word))
    return indices


def _device(nvml: Any, index: int) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        busy = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:  # not supported on some boards
        busy = 0
    try:
        minor: int | None = int(nvml.nvmlDeviceGetMinorNumber(handle))
    except nvml.NVMLError:  # not on this platform: the sandbox takes the index for it
        minor = None
    return Gpu(
        index=index,
        minor=minor,
        name=str(nvml.nvmlDeviceGetName(handle)),
        memory_mib=int(memory.total) // 2**20,
        uuid=str(nvml.nvmlDeviceGetUUID(handle)),
        memory_used_mib=int(memory.used) // 2**20,
        utilization=busy,
    )


def read_gpus(*, all_devices: bool = False) -> Gpus:
    """The driver, its CUDA version and the GPUs this runner may use (`all_devices`: the box's),
    as NVML reports them."""
    with _nvml() as nvml:
        cuda = nvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 for 12.4
        count = nvml.nvmlDeviceGetCount()
        devices = [_device(nvml, i) for i in (range(count) if all_devices else _visible(count))]
        driver = str(nvml.nvmlSystemGetDriverVersion())
        return Gpus(driver, f"{cuda // 1000}.{cuda % 1000 // 10}", devices)


def read_all_gpus() -> Gpus:
    """Every GPU on the box (goaltender doctor shows CUDA_VISIBLE_DEVICES' limit beside them)."""
    return read_gpus(all_devices=True)


def inventory() -> list[Gpu]:
    """The GPUs this runner may use; none on a box without a driver."""
    try:
        return read_gpus().devices
    except NoDriver:
        return []


def sample(indices: tuple[int, ...]) -> list[Gpu]:
    """Memory used and utilisation of these GPUs now (none when NVML cannot say)."""
    if not indices:
        return []
    try:
        with _nvml() as nvml:
            return [_device(nvml, i) for i in indices]
    except Exception:  # a sample is best effort: a driver hiccup must not fail the run
        return []


@dataclass
class Usage:
    """What a run's GPUs showed while it ran: the peak of their memory together, the mean of
    their utilisation."""

    peak_memory_mib: float = 0.0
    _busy: float = 0.0
    _samples: int = 0

    def add(self, devices: list[Gpu]) -> None:
        self.peak_memory_mib = max(self.peak_memory_mib, float(sum(d.memory_used_mib for d in devices)))
        self._busy += sum(d.utilization for d in devices) / len(devices)
        self._samples += 1

    @property
    def mean_utilization(self) -> float | None:
        return self._busy / self._samples if self._samples else None


async def watch(indices: tuple[int, ...], every_s: float, usage: Usage) -> None:
    """Sample these GPUs into `usage` until cancelled (NVML calls block: each in a thread)."""
    while True:
        if devices := await asyncio.to_thread(sample, indices):
            usage.add(devices)
        await asyncio.sleep(every_s)
