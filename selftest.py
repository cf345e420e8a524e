"""Does this Python read budgets as Goaltender means? A start-up self-test of the interpreter.

Budgets, stop rules and stages are read from people's words with regular expressions. Some
interpreters' `re` gets some constructions wrong: CPython 3.11.0-3.11.4 (Debian 12's
/usr/bin/python3 is 3.11.2) mis-match possessive quantifiers (gh-106052, gh-100061, fixed in
3.11.5), which read `budget 3m` as no time at all. The parsers no longer use those constructions,
and this module keeps it that way on whatever interpreter runs them: the runner, the bot and the
CLI commands that read budgets parse a few known phrases at start (`interpreter_problem`) and
refuse to run, in one line, when one comes out wrong; `goaltender doctor` also says which known
engine bugs the interpreter has (`engine_bugs`), which code a goal's agent writes may meet.
"""

from __future__ import annotations

import functools
import platform
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

# The bugs' own reproducers (each: the issue, a pattern, a text, and what a correct `re` returns).
# Matching, not version numbers: a distribution may patch its 3.11.2, or a new release regress.
ENGINE_BUGS = [
    ("gh-106052", r"(?:ab?c)*+", "a", None),  # a possessive repeat matched where the greedy one does not
    ("gh-100061", r"(?:(?<=a)b)++", "ab", "b"),  # the input position not restored inside a possessive repeat
]
FIX = "run goaltender on Python 3.11.5 or newer (docs/install.md: 'An interpreter of its own')"


def engine_bugs() -> list[str]:
    """The known `re` engine bugs this interpreter has (by their CPython issue)."""
    found = []
    for issue, pattern, text, expected in ENGINE_BUGS:
        match = re.search(pattern, text) if expected else re.fullmatch(pattern, text)
        if (match.group(0) if match else None) != expected:
            found.append(issue)
    return found


def _samples() -> list[tuple[str, Callable[[], object], object]]:
    """(phrase, how it is read, what it must read as): one of each parser, the possessives' old failures."""
    from goaltender.bot.budget_size import Threshold
    from goaltender.protocol.budget import apply_budget_change, parse_duration, parse_goal_text
    from goaltender.runner.stages import parse_stages
    from goaltender.storage.records import Budget

    now = datetime(2026, 1, 1, tzinfo=UTC)
    goal = "reach 90% accuracy, budget 1h30m, max 3 experiments, 10m each, max 2M tokens"
    extended = Budget(wall_seconds=3600, deadline=now + timedelta(hours=1))

    def spec() -> object:
        s = parse_goal_text(goal)
        return (s.target, s.wall_seconds, s.max_experiments, s.experiment_timeout_s, s.max_tokens)

    def change(phrase: str) -> Callable[[], object]:
        return lambda: (
            changed[0].wall_seconds if (changed := apply_budget_change(extended, phrase, now)) else None
        )

    return [
        ("3m", lambda: parse_duration("3m"), 180.0),
        ("1h 30m", lambda: parse_duration("1h 30m"), 5400.0),
        (goal, spec, (0.9, 5400.0, 3, 600.0, 2_000_000)),
        ("budget +2h", change("budget +2h"), 3600.0 + 7200.0),
        ("+90m", change("+90m"), 3600.0 + 5400.0),
        ("1h (a budget size)", lambda: Threshold.parse("1h"), Threshold("1h00m", hours=1.0)),
        ("+50% (a budget size)", lambda: Threshold.parse("+50%"), Threshold("50%", share=0.5)),
        ("stages: plan, campaign", lambda: parse_stages("stages: plan, campaign"), ["plan", "campaign"]),
    ]


def misread_samples() -> list[str]:
    """Each known phrase this interpreter reads wrongly, said as `phrase` read as X, not Y."""
    wrong = []
    for phrase, read, expected in _samples():
        try:
            got: object = read()
        except Exception as exc:  # a refusal where a reading was due is a misreading too
            got = f"{type(exc).__name__}: {exc}"
        if got != expected:
            wrong.append(f"`{phrase}` read as {str(got)[:80]}, not {expected}")
    return wrong


def interpreter_name() -> str:
    return f"Python {platform.python_version()} ({sys.executable})"


@functools.cache
def interpreter_problem() -> str | None:
    """One line saying this interpreter misreads budgets and what to do; None when it reads them right.

    Cached: the samples run once a process (well under a millisecond)."""
    if not (wrong := misread_samples()):
        return None
    bugs = engine_bugs()
    known = f" (its re module has CPython {', '.join(bugs)})" if bugs else ""
    return f"{interpreter_name()} misreads budgets{known}: {'; '.join(wrong[:2])}. To fix: {FIX}"
