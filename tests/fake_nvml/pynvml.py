"""A fake `pynvml` (nvidia-ml-py's module) for boxes without a GPU: put this directory first on
PYTHONPATH and describe the GPUs in the JSON file FAKE_NVML_STATE names:

    {"driver": "550.54.15", "devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
      "used_mib": 0, "utilization": 0}]}

`"devices": null` is a box whose driver is not loaded. The file is read at each nvmlInit, so a
test changes what the GPUs report while a run holds them. Only the calls goaltender makes exist.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

_state: dict = {}


class NVMLError(Exception):
    pass


def nvmlInit() -> None:
    global _state
    with open(os.environ["FAKE_NVML_STATE"]) as f:
        _state = json.load(f)
    if _state.get("devices") is None:
        raise NVMLError("Driver Not Loaded")


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return _state.get("driver", "550.54.15")


def nvmlSystemGetCudaDriverVersion() -> int:
    return 12040


def nvmlDeviceGetCount() -> int:
    return len(_state["devices"])


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_state["devices"]):
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return _state["devices"][handle]["name"]


def nvmlDeviceGetMinorNumber(handle: int) -> int:
    return _state["devices"][handle].get("minor", handle)


def nvmlDeviceGetUUID(handle: int) -> str:
    return f"GPU-fake-{handle:04d}"


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    device = _state["devices"][handle]
    total, used = device["memory_mib"] * 2**20, device.get("used_mib", 0) * 2**20
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=_state["devices"][handle].get("utilization", 0), memory=0)
