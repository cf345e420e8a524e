"""A run's checkpoints as NeMo RL leaves them, and the best of them.

NeMo RL writes each checkpoint into `tmp_step_N/` and renames it `step_N/` once it is complete
(nemo_rl/utils/checkpoint.py). Its `training_info.json` holds the save state (step, epoch,
consumed samples, ...) and, when `checkpointing.metric_name` is set, that metric under its own name
(`val:val_loss`, `val:accuracy`). `keep_top_k` deletes checkpoints as the run goes on. Only
`step_N` directories count here: a `tmp_step_N` is unfinished.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from goaltender.storage.direction import Direction, sign

STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    info: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Best:
    checkpoint: Checkpoint
    value: float


def info_key(tag: str) -> str | None:
    """The key NeMo RL gives a TensorBoard tag's metric in training_info.json:
    validation/accuracy -> val:accuracy, train/loss -> train:loss."""
    for prefix, key in (("validation/", "val:"), ("train/", "train:")):
        if tag.startswith(prefix):
            return key + tag[len(prefix) :]
    return None


def finished_checkpoints(directory: Path) -> list[Checkpoint]:
    """The finished checkpoints in `directory` now, by step."""
    found = []
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            if (m := STEP_DIR.match(path.name)) and path.is_dir():
                found.append(Checkpoint(int(m.group(1)), path, _training_info(path)))
    return sorted(found, key=lambda c: c.step)


def _training_info(path: Path) -> dict[str, Any]:
    try:
        info = json.loads((path / "training_info.json").read_text())
    except (OSError, ValueError):  # deleted meanwhile (keep_top_k), or not NeMo RL's
        return {}
    return info if isinstance(info, dict) else {}


def best_checkpoint(
    checkpoints: list[Checkpoint], metric: str, direction: Direction, series: Mapping[int, float]
) -> Best | None:
    """The best checkpoint by `metric`: its value in training_info.json, else the metric's value at
    the checkpoint's step in the run's series. Ties go to the later step, as in NeMo RL."""
    key = info_key(metric)
    scored = []
    for checkpoint in checkpoints:
        value = checkpoint.info.get(key) if key else None
        if not _is_number(value):
            value = series.get(checkpoint.step)
        if _is_number(value):
            scored.append(Best(checkpoint, float(value)))
    if not scored:
        return None
    return max(scored, key=lambda best: (sign(direction) * best.value, best.checkpoint.step))


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class CheckpointWatch:
    """Notices each checkpoint of a run as it is finished."""

    directory: Path
    seen: set[int] = field(default_factory=set)

    def new(self) -> list[Checkpoint]:
        fresh = [c for c in finished_checkpoints(self.directory) if c.step not in self.seen]
        self.seen.update(c.step for c in fresh)
        return fresh
