"""Scalars from TensorBoard event files, read as they are written: NeMo RL's own record of a run.

Reading needs the `tensorboard` package (the `nemo` extra). Its EventFileLoader goes on from where
the last read stopped and leaves a half-written record for the next read, so a file that is still
growing can be polled. Without the package `available()` is False, and the launcher reads NeMo RL's
stdout instead (stdout_metrics.py).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EVENT_FILES = "events.out.tfevents.*"


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    value: float


def available() -> bool:
    """Whether event files can be read here (the `nemo` extra is installed)."""
    return importlib.util.find_spec("tensorboard") is not None


class EventDirectory:
    """Every event file under `root`, each read on from where the last read stopped. NeMo RL writes
    <log_dir>/exp_NNN/tensorboard/events.out.tfevents.*; add_hparams adds one in a subfolder."""

    def __init__(self, root: Path):
        self.root = root
        self._loaders: dict[Path, Any] = {}

    def read_new(self) -> list[Scalar]:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        if self.root.is_dir():
            for path in sorted(self.root.rglob(EVENT_FILES)):
                if path not in self._loaders and path.is_file():
                    self._loaders[path] = EventFileLoader(str(path))
        return [scalar for loader in self._loaders.values() for e in loader.Load() for scalar in _scalars(e)]


def _scalars(event: Any) -> list[Scalar]:
    """The scalar values of one Event proto (others: hparams, text, images, are not metrics)."""
    found = []
    for value in event.summary.value:
        number = _number(value)
        if number is not None and math.isfinite(number):
            found.append(Scalar(value.tag, int(event.step), number))
    return found


def _number(value: Any) -> float | None:
    from tensorboard.util import tensor_util

    kind = value.WhichOneof("value")
    if kind == "simple_value":  # as torch's SummaryWriter writes it (the loader may convert it)
        return _from_float32(value.simple_value)
    if kind == "tensor" and value.metadata.plugin_data.plugin_name == "scalars":
        array = tensor_util.make_ndarray(value.tensor)
        if array.size != 1:
            return None
        number = array.reshape(())[()]
        return _from_float32(number) if array.dtype == np.float32 else float(number)
    return None


def _from_float32(number: Any) -> float:
    """A float32 as its shortest decimal: 0.969 as logged, not 0.968999981880188."""
    return float(str(np.float32(number)))
