"""Star-count task environment: count the stars of each colour in a rendered canvas."""

from .generate import (
    DEFAULT_CONFIG,
    HELDOUT_SEED_OFFSET,
    HELDOUT_SIZE,
    Example,
    Star,
    StarCountConfig,
    heldout_split,
    make_example,
    render,
    train_split,
)
from .prompt import SYSTEM_PROMPT, format_answer, system_prompt, user_prompt
from .verify import Verdict, parse_answer, score, verify

__all__ = [
    "DEFAULT_CONFIG",
    "HELDOUT_SEED_OFFSET",
    "HELDOUT_SIZE",
    "SYSTEM_PROMPT",
    "Example",
    "Star",
    "StarCountConfig",
    "Verdict",
    "format_answer",
    "heldout_split",
    "make_example",
    "parse_answer",
    "render",
    "score",
    "system_prompt",
    "train_split",
    "user_prompt",
    "verify",
]
