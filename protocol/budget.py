"""Stop rules and budgets: read them from a goal's words, make them explicit, and do the arithmetic.

A goal is accepted with every limit explicit: an absolute deadline (fixed at acceptance),
compute-hours, an attempted-experiment count, a per-experiment timeout. With no stop rule at
all, the default is the baseline plus three experiments, then ask before going on.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import NoReturn

from pydantic import BaseModel, ConfigDict

from goaltender.storage.records import Budget


def format_tokens(count: float) -> str:
    """`812`, `45.2k`, `20k`, `1.25M`, `2M`: as a budget is written (`max 20k tokens`)."""
    if count < 999.5:  # the bounds as rounded: never `1000` nor `1000k`
        return f"{count:.0f}"
    if count < 999_950:
        return f"{count / 1000:.1f}".removesuffix(".0") + "k"
    return f"{count / 1_000_000:.2f}".rstrip("0").removesuffix(".") + "M"


DEFAULT_BLOCK = 4  # baseline + 3; also how many more each "continue?" approval grants

# What a goal may ask for. Zero is refused rather than read as "no limit" (leave the phrase out
# for none), and so is anything past these caps: a typo, not a plan.
MIN_DURATION_S = 1.0
MAX_DURATION_S = 365 * 86400.0
MAX_COMPUTE_HOURS = 100_000.0
MAX_EXPERIMENTS = 10_000
MAX_TOKENS = 10**11
MAX_TARGET = 1e12  # `target 25` is any metric's value (BLEU, say); only `to 90%` is a share


class GoalTextError(ValueError):
    """The words ask for a limit that cannot be (zero, absurdly large, a target over 100%).

    The message quotes the phrase and says what is accepted; the runner answers it as a
    `bad_request`, the bot and the CLI show it as it is."""


# Every pattern here runs in linear time, whatever the text (goals are up to 4,000 characters and
# parsed on the runner's event loop), and means the same on every Python 3.11: no possessive
# quantifier or atomic group (3.11.0-3.11.4, Debian 12's 3.11.2 among them, mis-match those:
# CPython gh-106052, gh-100061). Instead each unbounded repeat is of one character class and is
# followed only by characters outside it (`\d+` then `.`, a space or a unit), so giving a character
# back can never lead to a match: the repeat behaves as a possessive one would. A repeat of a
# group (a run of duration parts) only ends a pattern, where nothing after it can make it give
# back; and a number starts only where a digit run starts (`(?<![\d.])`), so no two attempts scan
# the same run. tests/test_parsing_fuzz.py checks these rules on every pattern, and the time.
_NUM = r"(?<![\d.])\d+(?:\.\d+|(?!\.\d))"  # read whole: a fraction is taken when there is one
_UNITS = r"(?:days?|d|hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)(?![a-z])"
_PART = rf"({_NUM})\s*({_UNITS})"
_RUN = rf"(?:{_NUM}\s*{_UNITS}\s*)+"  # "1h 30m ": consecutive duration parts, taken whole
_DURATION_PART = re.compile(_PART, re.I)
_DURATION = re.compile(rf"\s*{_RUN}", re.I)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_LONGEST_COUNT = 18  # digits; int() of more is refused by CPython past 4,300, and no count is that big


class GoalSpec(BaseModel):
    """What a goal's text asks for, before defaults are applied."""

    model_config = ConfigDict(defer_build=True)  # built on first use: CLI verbs import this module

    text: str
    wall_seconds: float | None = None
    compute_hours: float | None = None
    max_experiments: int | None = None
    experiment_timeout_s: float | None = None
    target: float | None = None
    runner: str | None = None
    agent: str | None = None  # a built-in agent or a `<name>-agent` the text names
    # Every `with <word>` of the text, in order: the runner picks the first that names one of its
    # configured agents (a box's own "staged" agent is named without "-agent").
    agent_words: list[str] = []
    max_tokens: int | None = None  # "max 2M tokens", "token budget 500k"
    executor: str | None = None  # "via slurm", "via ray", "via local"
    gpus_per_experiment: int | None = None  # "2 GPUs each", "1 GPU per experiment"

    @property
    def has_stop_rule(self) -> bool:
        return any(v is not None for v in (self.wall_seconds, self.compute_hours, self.max_experiments))


def parse_duration(text: str) -> float | None:
    """'5h' -> 18000, '1h30m' -> 5400, '90 s' -> 90, '2.5 hours' -> 9000; None if not a duration.

    Any size: callers that take a limit from it check its bounds (`check_duration`)."""
    if not _DURATION.fullmatch(text):
        return None
    return sum(
        float(p.group(1)) * _UNIT_SECONDS[p.group(2)[0].lower()] for p in _DURATION_PART.finditer(text)
    )


def _count(digits: str) -> int:
    """A whole number as written; one too long to be a count reads as past every cap."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _LONGEST_COUNT else 10**_LONGEST_COUNT


def _quote(phrase: str) -> str:
    phrase = " ".join(phrase.split())
    return f"`{phrase if len(phrase) <= 60 else phrase[:59] + '…'}`"


def check_duration(seconds: float, phrase: str, what: str, example: str) -> float:
    """`seconds` if it is a sane limit (1 second to a year); GoalTextError saying why not."""
    if MIN_DURATION_S <= seconds <= MAX_DURATION_S:
        return seconds
    return _refuse(phrase, f"{what} must be at least 1s and at most 365 days (e.g. {example})")


def _check_compute(hours: float, phrase: str) -> float:
    if 0 < hours <= MAX_COMPUTE_HOURS:
        return hours
    return _refuse(
        phrase,
        f"compute-hours must be more than 0 and at most {MAX_COMPUTE_HOURS:,.0f} "
        "(e.g. `gpu-hours 8`; leave it out for no compute limit)",
    )


def _check_experiments(count: int, phrase: str, what: str, example: str) -> int:
    if 1 <= count <= MAX_EXPERIMENTS:
        return count
    return _refuse(phrase, f"{what} must be from 1 to {MAX_EXPERIMENTS:,} (e.g. {example})")


def _check_percent(percent: float, phrase: str) -> float:
    if percent <= 100:
        return percent / 100
    return _refuse(
        phrase,
        "a percentage target is at most 100% (e.g. `to 90% accuracy`); for another value say `target 1.5`",
    )


def _check_target(value: float, phrase: str) -> float:
    if value <= MAX_TARGET:
        return value
    return _refuse(phrase, f"a target is a value of the goal's metric, at most {MAX_TARGET:g}")


def _refuse(phrase: str, rule: str) -> NoReturn:
    raise GoalTextError(f"{_quote(phrase)}: {rule}")


_PATTERNS = {
    "wall": re.compile(rf"\b(?:time\s+)?budget\s*(?:of\s+)?({_RUN})", re.I),
    "within": re.compile(rf"\bwithin\s+({_RUN})", re.I),
    "compute": re.compile(rf"\b(?:gpu|cpu|compute)[- ]hours?\s*(?:of\s+)?({_NUM})", re.I),
    "compute_after": re.compile(rf"\b({_NUM})\s*(?:gpu|cpu|compute)[- ]hours?\b", re.I),
    "max_exp": re.compile(r"\b(?:max(?:imum)?|up\s+to|at\s+most)\s+(\d+)\s+(?:experiments?|runs?)\b", re.I),
    "timeout": re.compile(rf"\btimeout\s+({_RUN})", re.I),
    "tokens": re.compile(
        rf"\b(?:(?:max(?:imum)?|up\s+to|at\s+most)\s+({_NUM})\s*(?:([km])\s*)?tokens?"
        rf"|tokens?\s+budget\s+(?:of\s+)?({_NUM})\s*(?!\s)([km]?))\b",  # (?!\s): spaces taken whole
        re.I,
    ),
    # "10m each": found as duration runs, each run once, then what follows it is looked at.
    "run": re.compile(rf"(?<![\w.]){_RUN}", re.I),
    "each": re.compile(r"\s*(?:each|per\s+(?:experiments?|runs?))\b", re.I),
    "target_pct": re.compile(rf"(?:\bto|\breach|\btarget|>=|≥)\s*({_NUM})\s*%", re.I),
    "target": re.compile(r"\btarget\s+(?:of\s+)?(\d*\.\d+|\d+)\b(?!\s*%)", re.I),
    "runner": re.compile(r"\bon\s+([A-Za-z0-9][\w.-]*)\s*$|\bon\s+runner\s+([\w.-]+)", re.I),
    "with": re.compile(r"\bwith\s+([\w-]+)", re.I),
    "executor": re.compile(r"\bvia\s+(local|ray|slurm)\b", re.I),
    "gpus": re.compile(r"\b(\d{1,3})\s*gpus?\s+(?:each|per\s+(?:experiments?|runs?))\b", re.I),
    # A minus where a limit's number goes ("budget -2h", "max -3 experiments", "-10m each"): read
    # as no limit at all, it would quietly be none.
    "negative": re.compile(
        rf"\b(?:budget|within|timeout)\s*(?:of\s+)?-\s*{_NUM}\s*{_UNITS}"
        rf"|\b(?:max(?:imum)?|up\s+to|at\s+most)\s+-\s*\d+\s*(?:experiments?|runs?|(?:[km]\s*)?tokens?)\b"
        rf"|\b(?:gpu|cpu|compute)[- ]hours?\s*(?:of\s+)?-\s*\d"
        rf"|(?<![\w.-])-\s*{_NUM}\s*(?:(?:gpu|cpu|compute)[- ]hours?\b|{_UNITS}\s*(?:each|per\s+(?:experiments?|runs?))\b)",
        re.I,
    ),
}
NO_WORDS = "a goal needs words: say what to reach, e.g. `reach 90% accuracy, budget 2h`"
_AGENTS = ("sweep", "codex", "openai")  # built in; any other is named `<something>-agent`


def parse_goal_text(text: str) -> GoalSpec:
    """Find budget and stop-rule phrases in free text ("... budget 5h, max 20 experiments").

    GoalTextError when there are no words, or a phrase asks for a limit that cannot be (see
    `GoalTextError`)."""
    if not text.strip():
        raise GoalTextError(NO_WORDS)
    spec = _read_limits(text)
    spec.target = _target(text)
    if m := _PATTERNS["runner"].search(text):
        spec.runner = m.group(1) or m.group(2)
    spec.agent_words = [m.group(1).lower() for m in _PATTERNS["with"].finditer(text)]
    spec.agent = _agent(spec.agent_words)
    if m := _PATTERNS["executor"].search(text):
        spec.executor = m.group(1).lower()
    if m := _PATTERNS["gpus"].search(text):
        spec.gpus_per_experiment = int(m.group(1))
    return spec


def _read_limits(text: str) -> GoalSpec:
    """The budget phrases alone (what a budget change reads too), each checked."""
    spec = GoalSpec(text=text.strip())
    if m := _PATTERNS["negative"].search(text):
        _refuse(
            m.group(0),
            "a budget or limit is never negative (e.g. `budget 2h`, `max 8 experiments`, `gpu-hours 8`; "
            "to shorten a running goal's, give the new one: `budget 1h`)",
        )
    if m := _PATTERNS["wall"].search(text) or _PATTERNS["within"].search(text):
        spec.wall_seconds = check_duration(
            _seconds(m.group(1)),
            m.group(0),
            "a time budget",
            "`budget 2h` or `within 30m`; leave it out for no time limit",
        )
    if m := _PATTERNS["compute"].search(text) or _PATTERNS["compute_after"].search(text):
        spec.compute_hours = _check_compute(float(m.group(1)), m.group(0))
    if m := _PATTERNS["max_exp"].search(text):
        spec.max_experiments = _check_experiments(
            _count(m.group(1)), m.group(0), "an experiment count", "`max 8 experiments`"
        )
    if m := _PATTERNS["tokens"].search(text):
        number, unit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        tokens = float(number) * {"": 1, "k": 1e3, "m": 1e6}[(unit or "").lower()]
        if not 1 <= tokens <= MAX_TOKENS:
            _refuse(m.group(0), f"a token budget must be from 1 to {MAX_TOKENS:,} (e.g. `max 2M tokens`)")
        spec.max_tokens = int(tokens)
    if timeout := _timeout_phrase(text):
        phrase, seconds = timeout
        spec.experiment_timeout_s = check_duration(
            seconds,
            phrase,
            "a per-experiment timeout",
            "`10m each` or `timeout 30m`; leave it out for the runner's default",
        )
    return spec


def _seconds(run: str) -> float:
    return parse_duration(run) or 0.0  # a run always parses: it is made of duration parts


def _timeout_phrase(text: str) -> tuple[str, float] | None:
    """'timeout 30m' or '30m each' / '30m per experiment': the phrase and its seconds."""
    if m := _PATTERNS["timeout"].search(text):
        return m.group(0), _seconds(m.group(1))
    for run in _PATTERNS["run"].finditer(text):
        if each := _PATTERNS["each"].match(text, run.end()):
            return text[run.start() : each.end()], _seconds(run.group(0))
    return None


def _target(text: str) -> float | None:
    if m := _PATTERNS["target_pct"].search(text):
        return _check_percent(float(m.group(1)), m.group(0))
    if m := _PATTERNS["target"].search(text):
        return _check_target(float(m.group(1)), m.group(0))
    return None


def _agent(words: list[str]) -> str | None:
    """Of a text's `with <word>`s, the first naming an agent by itself: `with sweep`, `with codex`,
    `with openai`, or `with <name>-agent`."""
    return next((w for w in words if w in _AGENTS or (w.endswith("-agent") and w != "-agent")), None)


def explicit_budget(spec: GoalSpec, now: datetime, default_timeout_s: float | None) -> Budget:
    """The budget a goal is accepted with: every limit spelled out, the deadline absolute."""
    budget = Budget(
        wall_seconds=spec.wall_seconds,
        deadline=now + timedelta(seconds=spec.wall_seconds) if spec.wall_seconds else None,
        compute_hours=spec.compute_hours,
        max_experiments=spec.max_experiments,
        max_tokens=spec.max_tokens,
        experiment_timeout_s=spec.experiment_timeout_s or default_timeout_s,
    )
    if not spec.has_stop_rule:
        budget.max_experiments = DEFAULT_BLOCK
        budget.ask_to_continue = True
    return budget


_EXTEND = re.compile(rf"\s*(?:budget\s*)?\+\s*({_RUN})", re.I)
_MORE_EXP = re.compile(r"\s*\+\s*(\d+)\s+(?:experiments?|runs?)\s*", re.I)


def apply_budget_change(budget: Budget, change: str, now: datetime) -> tuple[Budget, str] | None:
    """Apply a person's budget phrase to a running goal's budget.

    Understands "+2h" / "budget +2h" (extend the deadline), "+5 experiments", and the phrases of
    `parse_goal_text` ("budget 5h" resets the deadline from now, "max 10 experiments", "gpu-hours 8").
    Returns (new budget, what changed) or None when the phrase names no budget; GoalTextError when
    it asks for what cannot be: nothing more ("+0h"), or past a cap, by itself or in total.
    """
    if m := _EXTEND.fullmatch(change):
        return _extend_deadline(budget, change, _seconds(m.group(1)), now)
    if m := _MORE_EXP.fullmatch(change):
        return _more_experiments(budget, change, _count(m.group(1)))
    return _set_limits(budget, _read_limits(change), now)


def _extend_deadline(budget: Budget, change: str, extra: float, now: datetime) -> tuple[Budget, str]:
    check_duration(extra, change, "an extension", "`budget +2h`")
    total = (budget.wall_seconds or 0) + extra
    if total > MAX_DURATION_S:
        _refuse(change, f"the time budget would be {_fmt_seconds(total)}, and at most 365 days is accepted")
    base = max(budget.deadline, now) if budget.deadline else now
    new = budget.model_copy(update={"deadline": base + timedelta(seconds=extra), "wall_seconds": total})
    return new, f"deadline +{_fmt_seconds(extra)}"


def _more_experiments(budget: Budget, change: str, more: int) -> tuple[Budget, str]:
    _check_experiments(more, change, "more experiments", "`+3 experiments`")
    total = (budget.max_experiments or 0) + more
    _check_experiments(total, change, f"the experiment count ({total:,} in all)", "`+3 experiments`")
    new = budget.model_copy(update={"max_experiments": total, "ask_to_continue": False})
    return new, f"max experiments {total}"


def _set_limits(budget: Budget, spec: GoalSpec, now: datetime) -> tuple[Budget, str] | None:
    """A budget's limits set as `spec` names them (each already checked)."""
    new = budget.model_copy()
    changes = []
    if spec.wall_seconds:
        new.deadline = now + timedelta(seconds=spec.wall_seconds)
        new.wall_seconds = spec.wall_seconds
        changes.append(f"deadline {_fmt_seconds(spec.wall_seconds)} from now")
    if spec.max_experiments is not None:
        new.max_experiments = spec.max_experiments
        new.ask_to_continue = False
        changes.append(f"max experiments {spec.max_experiments}")
    if spec.compute_hours is not None:
        new.compute_hours = spec.compute_hours
        changes.append(f"compute-hours {spec.compute_hours:g}")
    if spec.experiment_timeout_s is not None:
        new.experiment_timeout_s = spec.experiment_timeout_s
        changes.append(f"per-experiment timeout {_fmt_seconds(spec.experiment_timeout_s)}")
    if spec.max_tokens is not None:
        new.max_tokens = spec.max_tokens
        changes.append(f"max tokens {spec.max_tokens:,}")
    return (new, ", ".join(changes)) if changes else None


class BudgetCheck(BaseModel):
    model_config = ConfigDict(defer_build=True)

    ok: bool
    reason: str = ""  # why not, when not ok
    needs_continue_approval: bool = False  # the default stop rule was reached: ask before going on


def check_new_experiment(budget: Budget, attempted: int, compute_used: float, now: datetime) -> BudgetCheck:
    """May the goal start one more experiment?"""
    if budget.deadline and now >= budget.deadline:
        return BudgetCheck(ok=False, reason="the time budget is used up (deadline passed)")
    if budget.compute_hours is not None and compute_used >= budget.compute_hours:
        return BudgetCheck(
            ok=False, reason=f"compute budget used: {compute_used:.3g}/{budget.compute_hours:g} compute-hours"
        )
    if budget.max_experiments is not None and attempted >= budget.max_experiments:
        if budget.ask_to_continue:
            return BudgetCheck(
                ok=False,
                needs_continue_approval=True,
                reason=f"default stop rule reached: {attempted}/{budget.max_experiments} attempted",
            )
        return BudgetCheck(
            ok=False, reason=f"experiment budget used: {attempted}/{budget.max_experiments} attempted"
        )
    return BudgetCheck(ok=True)


def experiment_timeout(budget: Budget, requested: float | None, now: datetime) -> float | None:
    """The tighter of the requested timeout, the goal's per-experiment timeout and the time left."""
    limits = [t for t in (requested, budget.experiment_timeout_s) if t]
    if budget.deadline:
        limits.append(max(1.0, (budget.deadline - now).total_seconds()))
    return min(limits) if limits else None


STOP_MET = "stop condition met"


def stop_met(status: str) -> bool:
    """Does a stop_status line say the goal's stop rule is met?"""
    return status.startswith(STOP_MET)


def stop_status(
    budget: Budget,
    attempted: int,
    compute_used: float,
    now: datetime,
    *,
    tokens_used: int = 0,
    target_reached: bool = False,
) -> str:
    """One line, as the autoresearch skill asks after every run: '3/8 attempted, 1m52s left'. The
    goal's target (a stop rule of the goal's text, not a budget) counts as met when `target_reached`;
    a token budget by the agent's `tokens_used` (the runner ends a goal that spent it)."""
    parts: list[str] = []
    met = ["target"] if target_reached else []
    if budget.max_experiments is not None:
        parts.append(f"{attempted}/{budget.max_experiments} attempted")
        if attempted >= budget.max_experiments:
            met.append("experiment count")
    else:
        parts.append(f"{attempted} attempted")
    if budget.deadline:
        left = (budget.deadline - now).total_seconds()
        parts.append(f"{_fmt_seconds(max(left, 0))} left")
        if left <= 0:
            met.append("deadline")
    if budget.compute_hours is not None:
        parts.append(f"{compute_used:.3g}/{budget.compute_hours:g} compute-h")
        if compute_used >= budget.compute_hours:
            met.append("compute")
    if budget.max_tokens is not None:
        parts.append(f"{format_tokens(tokens_used)}/{format_tokens(budget.max_tokens)} tokens")
        if tokens_used >= budget.max_tokens:
            met.append("tokens")
    head = f"{STOP_MET} ({', '.join(met)})" if met else "stop condition not yet met"
    return f"{head}: {', '.join(parts)}"


def _fmt_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
