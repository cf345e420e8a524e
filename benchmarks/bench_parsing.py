"""Goal-text parsing is linear: a 40,000-character goal costs about ten times a 4,000-character one.

The runner parses every goal's text and every steer on its event loop, so a parser that backtracks
would stall it for everyone (before the patterns were made linear, the timeout phrase took
0.5 s on 4,000 characters of `1h 1h …` and 1.8 s on 4,000 digits). Each shape below is parsed at
4,000 characters (the bot's limit for a goal) and at 40,000; the ratio of the median times is ~10
for a linear parser and ~100 for a quadratic one. The shapes are the adversarial ones (long digit
runs, repeated duration parts and keywords, dotted numbers) and an ordinary goal, repeated.

    python benchmarks/bench_parsing.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

from goaltender.protocol.budget import GoalTextError, apply_budget_change, parse_duration, parse_goal_text
from goaltender.storage.records import Budget, utcnow

SHAPES = {
    "ordinary goal": "train the model to 90% accuracy within 2h, gpu-hours 3, max 8 experiments, 10m each. ",
    "digit run": "1",
    "duration parts": "1h ",
    "within 1": "within 1 ",
    "budget budget": "budget ",
    "dotted number": "1.1.",
    "parts then no each": "1h 1h 1h x ",
}
SMALL, LARGE = 4_000, 40_000


def text_of(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def parse_everything(text: str) -> None:
    """What the runner does with a goal's text and with a steer's."""
    for parse in (parse_goal_text, lambda t: apply_budget_change(Budget(), t, utcnow()), parse_duration):
        with contextlib.suppress(GoalTextError):  # refused: as much work as accepted
            parse(text)


def median_seconds(work: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    print(f"{'shape':<20} {'4k chars':>10} {'40k chars':>10} {'ratio':>7}  (linear ≈ 10, quadratic ≈ 100)")
    worst = 0.0
    for name, unit in SHAPES.items():
        small, large = text_of(unit, SMALL), text_of(unit, LARGE)
        t_small = median_seconds(lambda text=small: parse_everything(text), args.repeat)
        t_large = median_seconds(lambda text=large: parse_everything(text), args.repeat)
        ratio = t_large / t_small
        worst = max(worst, ratio)
        print(f"{name:<20} {t_small * 1e3:>8.2f}ms {t_large * 1e3:>8.2f}ms {ratio:>7.1f}")
    print(f"worst ratio {worst:.1f}: {'linear' if worst < 30 else 'SUPERLINEAR'}")


if __name__ == "__main__":
    main()
