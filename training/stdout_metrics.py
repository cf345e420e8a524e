"""NeMo RL's per-step stdout blocks as metrics: the fallback when no TensorBoard reader is installed.

The blocks, as nemo_rl/algorithms/sft.py and grpo.py print them:

    ========================= Step 7/60 =========================
    📊 Training Results:
      • Loss: 0.5123
    ⏱️  Timing:
      • Total step time: 3.21s
      • policy_training: 2.90s (90.3%)
    📊 Validation Results:
        • Validation loss: 0.4321
      ⏱️  Validation Timing:
        • Total validation time: 12.34s

Each value gets the name NeMo RL gives it in TensorBoard (train/loss, timing/train/policy_training,
validation/val_loss, validation/accuracy) and the step of the block it is in. That step is the
number of step headers so far, since NeMo RL's header restarts its count every epoch; values
before the first header (validation at start) are step 0.
"""

from __future__ import annotations

import math
import re

from goaltender.training.tb_events import Scalar

STEP_HEADER = re.compile(r"^=+ Step \d+/\d+ =+$")
BULLET = re.compile(r"^•\s*(?P<label>[^:]+?):\s*(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")

# Section headers, tried in this order ("Validation Timing" before "Timing").
SECTIONS = (
    ("Training Results", "train"),
    ("Validation Timing", "timing/validation"),
    ("Validation Results", "validation"),
    ("Timing:", "timing/train"),
)
# Label -> TensorBoard name, in the sections where NeMo RL names its values in words.
TRAIN_LABELS = {"Loss": "loss", "Draft Loss": "draft_loss", "Generation KL Error": "gen_kl_error"}
TRAIN_LABELS |= {"Avg Reward": "reward"}
VALIDATION_LABELS = {
    "Validation loss": "val_loss",
    "Validation accuracy": "accuracy",
    "Accuracy": "accuracy",
    "Average response length": "avg_length",
}
LABELS = {"train": TRAIN_LABELS, "validation": VALIDATION_LABELS}


class StdoutMetrics:
    """Fed NeMo RL's output line by line; `take()` returns the values read since the last call."""

    def __init__(self) -> None:
        self.step = 0
        self.section: str | None = None
        self._found: list[Scalar] = []

    def feed(self, line: str) -> None:
        text = line.strip()
        if STEP_HEADER.match(text):
            self.step += 1
            self.section = None
            return
        if (section := _section(text)) is not None:
            self.section = section
            return
        if self.section is not None and (m := BULLET.match(text)):
            name = _name(self.section, m.group("label").strip())
            value = float(m.group("value"))
            if name is not None and math.isfinite(value):
                self._found.append(Scalar(name, self.step, value))

    def take(self) -> list[Scalar]:
        found, self._found = self._found, []
        return found


def _section(text: str) -> str | None:
    if "•" in text:
        return None
    return next((prefix for marker, prefix in SECTIONS if marker in text), None)


def _name(section: str, label: str) -> str | None:
    """The TensorBoard name of a labelled value: named ones from the tables, timers by their own name."""
    if section.startswith("timing/"):
        return f"{section}/{label.lower().replace(' ', '_')}"
    short = LABELS[section].get(label)
    return f"{section}/{short}" if short else None
