"""How far a measured metric can be trusted: its interval, and whether a gain lies inside it.

A headline measured on n examples (the run prints `n: 64`, `n_heldout: 64`, `n_eval: …` or
`<metric>/n: …` beside it) gets a Wilson 95% interval when it is a proportion (an accuracy in
[0, 1]); a headline averaged over seeds (`goaltender experiment --repeat 3`) gets mean ± sd. A new
best whose predecessor lies inside that interval is *within noise*: kept, but not yet a finding.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from goaltender.storage.direction import reached

LOW_SIGNAL_ANSWER = "On the low-signal prompt"  # how the humans' answer reaches the agent's inbox
Z95 = 1.959964  # the normal quantile of a two-sided 95% interval
SAMPLE_SIZE_KEYS = ("n", "n_heldout", "n_eval", "n_examples")


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    how: str  # "Wilson 95%, n=64", "mean ± sd of 3 seeds"


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion: sound at 0 and 1 and on small n, where the
    normal approximation is not."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At 0 and n successes the bounds are exactly 0 and 1; rounding must not move them inside.
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return low, high


def sample_size(metric: str, summary: dict[str, float]) -> int | None:
    """The examples the metric was measured on, as the run printed them."""
    for key in (f"{metric}/n", *SAMPLE_SIZE_KEYS):
        value = summary.get(key)
        if value is not None and value >= 1 and float(value).is_integer():
            return int(value)
    return None


def interval(
    metric: str, value: float, summary: dict[str, float], seeds: list[float] | None = None
) -> Interval | None:
    """The headline's interval: mean ± sd over seeds when there are several, else Wilson's for a
    proportion on a known sample size; None when neither can be said."""
    if seeds and len(seeds) >= 2:
        sd = statistics.stdev(seeds)
        return Interval(value - sd, value + sd, f"mean ± sd of {len(seeds)} seeds")
    n = sample_size(metric, summary)
    if n is not None and 0.0 <= value <= 1.0:
        low, high = wilson(value * n, n)
        return Interval(low, high, f"Wilson 95%, n={n}")
    return None


def within_noise(found: Interval | None, previous_best: float | None, direction: str) -> bool:
    """Is the gain over `previous_best` inside the new result's interval?"""
    if found is None or previous_best is None:
        return False
    return reached(previous_best, found.low if direction == "maximize" else found.high, direction)


FLAT = 0.01  # a loss curve that moved less than this share of its start "has not moved"
FLAT_MIN_POINTS = 5


def flat_curve(curves: dict[str, tuple[float, float, int]]) -> tuple[str, tuple[float, float, int]] | None:
    """The first loss curve (first value, last value, points) that has not moved, with at least
    FLAT_MIN_POINTS points, if any."""
    for name, (start, end, points) in curves.items():
        if points >= FLAT_MIN_POINTS and abs(end - start) <= FLAT * max(abs(start), 1e-12):
            return name, (start, end, points)
    return None
