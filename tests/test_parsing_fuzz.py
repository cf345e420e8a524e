"""Goal text and budget changes under fuzzing: every input ends in a sane spec or a GoalTextError.

A parse either gives limits that are positive, finite and within the caps, or refuses with the
dedicated GoalTextError (whose message quotes the phrase) — never another exception, never a limit
of zero read as "no limit". And parsing stays linear: every pattern's unbounded repeats are
possessive (checked on the patterns themselves), and 100,000-character adversarial texts parse
within a deadline a quadratic parser would miss by minutes. Seeded (derandomize): every run tries
the same ~3,300 cases.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from re import _constants as sre  # the parsed form of a pattern, to check its repeats
from re import _parser as sre_parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goaltender.bot import budget_size
from goaltender.bot.budget_size import Threshold
from goaltender.runner import budget
from goaltender.runner.budget import (
    MAX_COMPUTE_HOURS,
    MAX_DURATION_S,
    MAX_EXPERIMENTS,
    MAX_TARGET,
    MIN_DURATION_S,
    NO_WORDS,
    GoalSpec,
    GoalTextError,
    apply_budget_change,
    explicit_budget,
    parse_duration,
    parse_goal_text,
)
from goaltender.storage.records import Budget

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SEEDED = {"derandomize": True, "database": None}

# ---- strategies: goal words as people (and fuzzers) write them ----

NUMBERS = st.one_of(
    st.sampled_from(
        [
            *("0", "00", "0.0", "0.4", "1", "1.5", ".5", "1.", "99", "100", "100.0", "101", "365", "366"),
            *("8760", "10000", "10001", "100000", "100001", "99999999", "9" * 30, "1" * 400, "1.1.1"),
        ]
    ),
    st.integers(0, 10**13).map(str),
    st.floats(0, 1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
)
UNITS = st.sampled_from(
    [
        *("h", "hours", "hour", "hrs", "m", "min", "mins", "minutes", "s", "sec", "secs", "seconds"),
        *("d", "day", "days", " h", "H", "x", "months", "w", "ms", ""),
    ]
)
TEMPLATES = [
    "budget {n}{u}",
    "budget of {n} {u}",
    "time budget {n}{u}{n}{u}",
    "budget {n}{u} {n}{u}",
    "within {n}{u}",
    "gpu-hours {n}",
    "{n} cpu-hours",
    "compute hours of {n}",
    "{n} GPU hours",
    "max {n} experiments",
    "maximum {n} runs",
    "up to {n} runs",
    "at most {n} experiments",
    "timeout {n}{u}",
    "{n}{u} each",
    "{n}{u} per experiment",
    "{n} {u} per run",
    "to {n}%",
    "reach {n} %",
    "target {n}",
    "target of {n}",
    ">= {n}%",
    "≥{n}%",
    "on gpu{n}",
    "on runner {w}",
    "with sweep",
    "with {w}-agent",
    "with {w}",
    "+{n}{u}",
    "budget +{n}{u}",
    "+{n} experiments",
    "{w}",
]
PHRASES = st.builds(
    lambda template, n, u, w: template.format(n=n, u=u, w=w),
    st.sampled_from(TEMPLATES),
    NUMBERS,
    UNITS,
    st.text(st.characters(codec="utf-8"), max_size=12),
)
SEPARATORS = st.sampled_from([" ", ", ", "; ", "\n", "", "  ", "\t", ". "])
GOAL_TEXTS = st.lists(st.tuples(st.one_of(PHRASES, st.text(max_size=30)), SEPARATORS), max_size=8).map(
    lambda parts: "".join(phrase + sep for phrase, sep in parts)
)
CHANGES = st.one_of(PHRASES, GOAL_TEXTS, st.text(max_size=40))


@st.composite
def budgets(draw) -> Budget:
    """A running goal's budget, within the caps; its deadline may have passed."""
    wall = draw(st.none() | st.floats(MIN_DURATION_S, MAX_DURATION_S))
    elapsed = draw(st.floats(0, 2)) * (wall or 0)
    return Budget(
        wall_seconds=wall,
        deadline=NOW - timedelta(seconds=elapsed) + timedelta(seconds=wall) if wall else None,
        compute_hours=draw(st.none() | st.floats(0.01, MAX_COMPUTE_HOURS)),
        max_experiments=draw(st.none() | st.integers(1, MAX_EXPERIMENTS)),
        experiment_timeout_s=draw(st.none() | st.floats(MIN_DURATION_S, MAX_DURATION_S)),
        ask_to_continue=draw(st.booleans()),
    )


# ---- what every parse must end in ----


def assert_refusal(refusal: GoalTextError) -> None:
    message = str(refusal)
    if message == NO_WORDS:  # a blank goal
        return
    assert message.startswith("`") and "`: " in message  # the phrase, then what is accepted
    assert len(message) < 400


def assert_sane_limits(limits: GoalSpec | Budget) -> None:
    def within(value: float | None, low: float, high: float) -> bool:
        return value is None or (math.isfinite(value) and low <= value <= high)

    assert within(limits.wall_seconds, MIN_DURATION_S, MAX_DURATION_S), limits
    assert within(limits.experiment_timeout_s, MIN_DURATION_S, MAX_DURATION_S), limits
    assert within(limits.compute_hours, 1e-300, MAX_COMPUTE_HOURS), limits
    assert within(limits.max_experiments, 1, MAX_EXPERIMENTS), limits


def assert_sane_spec(spec: GoalSpec) -> None:
    assert_sane_limits(spec)
    assert spec.target is None or (math.isfinite(spec.target) and 0 <= spec.target <= MAX_TARGET)
    accepted = explicit_budget(spec, NOW, default_timeout_s=600)  # no overflow, every limit explicit
    assert accepted.deadline is None or NOW < accepted.deadline <= NOW + timedelta(seconds=MAX_DURATION_S)
    assert_sane_limits(accepted)


def parse_or_refuse(text: str) -> None:
    try:
        spec = parse_goal_text(text)
    except GoalTextError as refusal:
        assert_refusal(refusal)
    else:
        assert_sane_spec(spec)


def change_or_refuse(before: Budget, change: str) -> None:
    try:
        changed = apply_budget_change(before, change, NOW)
    except GoalTextError as refusal:
        assert_refusal(refusal)
        return
    if changed is None:
        return
    after, said = changed
    assert said
    assert_sane_limits(after)
    if after.deadline != before.deadline:
        assert after.deadline is not None and after.deadline <= NOW + timedelta(seconds=MAX_DURATION_S)


# ---- properties: 1,500 + 1,000 + 300 + 300 + 200 + 40 cases ----


@settings(max_examples=1500, **SEEDED)
@given(GOAL_TEXTS)
def test_goal_text_is_a_sane_spec_or_a_refusal(text):
    parse_or_refuse(text)


@settings(max_examples=1000, **SEEDED)
@given(budgets(), CHANGES)
def test_budget_change_keeps_every_limit_sane_or_is_refused(before, change):
    change_or_refuse(before, change)


@settings(max_examples=300, **SEEDED)
@given(st.one_of(PHRASES, st.text(max_size=30)))
def test_duration_is_a_number_of_seconds_or_none(text):
    seconds = parse_duration(text)
    assert seconds is None or seconds >= 0  # any size: callers check the bounds


@settings(max_examples=300, **SEEDED)
@given(st.one_of(PHRASES, NUMBERS.map(lambda n: n + "%"), st.text(max_size=20)))
def test_budget_size_threshold_is_sane_or_a_value_error(text):
    try:
        threshold = Threshold.parse(text)
    except ValueError as refusal:
        assert str(refusal).startswith("`")
        return
    if threshold is not None:
        assert threshold.hours is None or 0 <= threshold.hours <= MAX_DURATION_S / 3600
        assert threshold.share is None or math.isfinite(threshold.share)


@settings(max_examples=200, **SEEDED)
@given(st.sampled_from(["budget", "within", "timeout", "max", "+", "gpu-hours", "to", ""]), NUMBERS, UNITS)
def test_zero_is_never_no_limit(keyword, number, unit):
    """A limit that reads as zero is refused, whatever unit or phrase carries it."""
    zero = f"{keyword} {'0' * len(number)}{unit} experiments each %"
    try:
        spec = parse_goal_text(zero)
    except GoalTextError:
        return
    assert_sane_spec(spec)  # parsed: then no limit in it is zero


# ---- linear time ----

ADVERSARIAL = st.lists(
    st.sampled_from(
        [
            *("1", "1h", "1h ", "1 h ", "within 1 ", "within ", "budget ", "budget budget 1", "1.", "1.1."),
            *("gpu-hours ", "1 gpu-", "to 1", "target ", "target 1", "on ", "on a", "with a-", "with "),
            *("max 1 ", " ", "+", "%", "≥", "1 ", "1h each ", "timeout ", "a", "-", "9", "0", "\n", "."),
        ]
    ),
    min_size=1,
    max_size=3,
)
TAILS = st.sampled_from(["", "x", "h", " each", "%", " experiments", "1h", " gpu-hours"])


@settings(
    max_examples=40,
    deadline=timedelta(seconds=10),  # linear: ~0.1 s; quadratic: minutes
    suppress_health_check=[HealthCheck.too_slow],
    **SEEDED,
)
@given(ADVERSARIAL, TAILS)
def test_100k_adversarial_characters_parse_in_linear_time(unit, tail):
    text = "".join(unit) * (100_000 // len("".join(unit))) + tail
    parse_or_refuse(text)
    change_or_refuse(Budget(max_experiments=4), text)
    parse_duration(text)
    with pytest.raises(ValueError):  # too long to be a budget size; refused, quickly
        Threshold.parse(text + "x")


def module_patterns() -> list[tuple[str, re.Pattern[str]]]:
    found = []
    for module in (budget, budget_size):
        for name, value in vars(module).items():
            values = value.items() if isinstance(value, dict) else [(name, value)]
            found += [(f"{module.__name__}.{key}", v) for key, v in values if isinstance(v, re.Pattern)]
    return found


def backtracking_repeats(pattern: re.Pattern[str]) -> list[str]:
    """The unbounded repeats that may give back what they matched (not possessive)."""
    found: list[str] = []

    def walk(items) -> None:
        for op, arg in items:
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
                _, high, body = arg
                if high == sre.MAXREPEAT and op != sre.POSSESSIVE_REPEAT:
                    found.append(f"{op} over {list(body)}")
                walk(body)
            elif op == sre.SUBPATTERN:
                walk(arg[-1])
            elif op == sre.BRANCH:
                for branch in arg[1]:
                    walk(branch)
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                walk(arg[1])
            elif op == sre.ATOMIC_GROUP:
                walk(arg)

    walk(sre_parse.parse(pattern.pattern, pattern.flags))
    return found


def test_every_pattern_is_linear_by_construction():
    """No unbounded repeat can backtrack: each is possessive (or bounded, like `s?`)."""
    patterns = module_patterns()
    assert len(patterns) >= 15, [name for name, _ in patterns]
    problems = {name: repeats for name, pattern in patterns if (repeats := backtracking_repeats(pattern))}
    assert not problems
    assert backtracking_repeats(re.compile(r"\d+h")) and not backtracking_repeats(re.compile(r"\d++h"))


def test_a_number_is_read_whole_or_not_at_all():
    """A number starts where its digit run starts: a long run is never read from its middle."""
    with pytest.raises(GoalTextError, match="at most 365 days"):
        parse_goal_text("x, budget 12345678901234567890h")
    assert parse_duration("x1h") is None and parse_duration("1.1.1h") is None
    assert parse_goal_text("v2.5h each").experiment_timeout_s is None  # part of a word, not a duration
    assert parse_goal_text("x, max 0000000000000000000000000007 experiments").max_experiments == 7
