"""What a goal's direction means: which of two results is better, which is best, whether a target is
reached. One meaning for the runner, the bot, the plots, the agents and the launcher: better is strict
(an equal result is no gain), reaching a target is not (hitting it exactly counts), the best of equals
is the first. Standard library only: the sweep agent and the training launcher import it at start."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, TypeVar

Direction = Literal["maximize", "minimize"]
T = TypeVar("T")


def sign(direction: str) -> int:
    """+1 when higher is better, -1 when lower is: `sign * value` sorts best last."""
    return 1 if direction == "maximize" else -1


def better(value: float, than: float, direction: str) -> bool:
    """Is `value` strictly better than `than`?"""
    return sign(direction) * value > sign(direction) * than


def reached(value: float, target: float, direction: str) -> bool:
    """Has `value` reached `target` (equal counts)?"""
    return sign(direction) * value >= sign(direction) * target


def best_of(items: Iterable[T], value: Callable[[T], float], direction: str) -> T | None:
    """The item whose value is best; the first of equals; None for no items."""
    best: T | None = None
    for item in items:
        if best is None or better(value(item), value(best), direction):
            best = item
    return best
