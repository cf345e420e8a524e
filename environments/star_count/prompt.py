"""The star-count task prompt (system prompt + per-example user text)."""

from __future__ import annotations

from collections.abc import Iterable

from .generate import DEFAULT_CONFIG, Example, StarCountConfig


def answer_template(colours: Iterable[str], values: Iterable[int] | None = None) -> str:
    """``\\boxed{red: 3, green: 0, blue: 1}`` for the given colours (placeholder counts if no values)."""
    names = list(colours)
    vals = list(values) if values is not None else [(3, 0, 1, 2)[i % 4] for i in range(len(names))]
    inner = ", ".join(f"{name}: {v}" for name, v in zip(names, vals, strict=True))
    return "\\boxed{" + inner + "}"


def system_prompt(cfg: StarCountConfig = DEFAULT_CONFIG) -> str:
    names = cfg.colour_names
    listed = ", ".join(names)
    lo, hi = cfg.count_range
    return (
        "You are a careful visual counter. The image shows a dark canvas with five-pointed stars in "
        f"these colours: {listed}. Count the stars of EVERY colour (there are between {lo} and {hi} "
        "of each). Report every colour, writing 0 for a colour that does not appear. You may reason "
        "briefly first, but end your reply with the final answer in exactly this form, with the colours "
        f"in this order:\n{answer_template(names)}"
    )


SYSTEM_PROMPT = system_prompt(DEFAULT_CONFIG)


def user_prompt(example: Example | None = None, cfg: StarCountConfig = DEFAULT_CONFIG) -> str:
    """User text that accompanies the image."""
    listed = ", ".join(cfg.colour_names)
    size = f" ({example.width}x{example.height} pixels)" if example is not None else ""
    return (
        f"How many stars of each colour ({listed}) are in this image{size}? "
        "Answer as \\boxed{colour: count, ...} listing every colour."
    )


def format_answer(counts: dict[str, int], colours: Iterable[str] | None = None) -> str:
    """Canonical answer text for ``counts`` (what a perfect model would reply)."""
    names = list(colours) if colours is not None else list(counts)
    return answer_template(names, [int(counts[n]) for n in names])
