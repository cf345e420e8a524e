"""How a config, a metric and a count of tokens read on one line, wherever they are shown: the
ledger and report, the terminal and Slack, the sweep agent's milestones, the stop status. On the
standard library alone: the sweep agent imports it, and starts without pydantic."""

from __future__ import annotations

import math
import re

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def format_params(params: Mapping[str, Any], max_len: int | None = None) -> str:
    """`train_size=2048 hidden=64 lr=0.001`; with max_len, whole params only, then " …"."""
    tokens = [f"{k}={_format_value(v)}" for k, v in params.items()]
    text = " ".join(tokens)
    if max_len is not None and len(text) > max_len:
        kept: list[str] = []  # a value cut in half would read as another value
        for token in tokens:
            if len(" ".join([*kept, token])) > max_len - 2:
                break
            kept.append(token)
        text = " ".join([*kept, "…"])
    return text


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ",".join(_format_value(v) for v in value)
    return str(value)


def is_percent_metric(name: str | None) -> bool:
    """Whether a metric is an accuracy-like fraction that reads best as a percentage."""
    if not name:
        return False
    lowered = name.lower()
    if "accuracy" in lowered:
        return True
    return "acc" in re.split(r"[^a-z0-9]+", lowered)


def format_metric(name: str | None, value: float | None) -> str:
    """Accuracy-like metrics as a percentage (87.5%), anything else with 4 significant digits."""
    if value is None:
        return "—"
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if is_percent_metric(name):
        # A value above 1 is taken to be a percentage already.
        return f"{value * 100:.1f}%" if -1.0 <= value <= 1.0 else f"{value:.1f}%"
    return f"{value:.4g}"
