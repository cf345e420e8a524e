"""Goal text and budget changes under fuzzing: every input ends in a sane spec or a GoalTextError.

A parse either gives limits that are positive, finite and within the caps, or refuses with the
dedicated GoalTextError (whose message quotes the phrase) — never another exception, never a limit
of zero read as "no limit". Parsing stays linear without possessive quantifiers (Python
3.11.0-3.11.4 mis-match them): no repeat can give back and retry (checked on the patterns
themselves), no string in the package is a possessive or atomic pattern, and 100,000 adversarial
characters take about ten times what 10,000 do. Every pattern reads as the possessive one it
replaced did (on an interpreter that matches those right). Seeded (derandomize): every run tries
the same cases.
"""

from __future__ import annotations

import ast
import math
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from re import _constants as sre  # the parsed form of a pattern, to check its repeats
from re import _parser as sre_parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import goaltender
from goaltender.bot import budget_size
from goaltender.bot.budget_size import Threshold
from goaltender.protocol import budget
from goaltender.protocol.budget import (
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
from goaltender.runner import stages
from goaltender.runner.stages import parse_stages
from goaltender.selftest import engine_bugs
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


# ---- linear time, without possessive quantifiers ----

ADVERSARIAL = st.lists(
    st.sampled_from(
        [
            *("1", "1h", "1h ", "1 h ", "within 1 ", "within ", "budget ", "budget budget 1", "1.", "1.1."),
            *("gpu-hours ", "1 gpu-", "to 1", "target ", "target 1", "on ", "on a", "with a-", "with "),
            *("max 1 ", " ", "+", "%", "≥", "1 ", "1h each ", "timeout ", "a", "-", "9", "0", "\n", "."),
            *("max 1 k ", "token budget 1 ", "1 k", "stages: a, ", "stages: a-", "max -1 ", "-1 ", "1 gpus "),
        ]
    ),
    min_size=1,
    max_size=3,
)
TAILS = st.sampled_from(["", "x", "h", " each", "%", " experiments", "1h", " gpu-hours", " tokens"])


def parse_every_way(text: str) -> None:
    """Every parser the runner, the bot and the CLI put people's words through."""
    parse_or_refuse(text)
    change_or_refuse(Budget(max_experiments=4), text)
    parse_duration(text)
    parse_stages(text)
    with pytest.raises(ValueError):  # too long to be a budget size; refused, quickly
        Threshold.parse(text + "x")


def cpu_seconds(text: str) -> float:
    """The least CPU time of three parses (the least is the one least disturbed by the machine)."""
    return min(cpu_second(text) for _ in range(3))


def cpu_second(text: str) -> float:
    start = time.process_time()
    parse_every_way(text)
    return time.process_time() - start


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], **SEEDED)
@given(ADVERSARIAL, TAILS)
def test_ten_times_the_adversarial_text_takes_about_ten_times_as_long(unit, tail):
    """Linear, measured against itself: 40,000 characters (ten goals' worth) take ~10× what 4,000 do
    (a quadratic parser ~100×, a backtracking blow-up far more), on a fast machine or a slow one."""
    piece = "".join(unit)
    small, large = (piece * (n // len(piece)) + tail for n in (4_000, 40_000))
    limit = 30 * max(cpu_seconds(small), 1e-4)
    # Up to three tries, the first under the limit enough (a quadratic parser takes ~100× each time).
    assert any(cpu_second(large) < limit for _ in range(3)), limit


def module_patterns() -> list[tuple[str, re.Pattern[str]]]:
    found = []
    for module in (budget, budget_size, stages):
        for name, value in vars(module).items():
            values = value.items() if isinstance(value, dict) else [(name, value)]
            found += [(f"{module.__name__}.{key}", v) for key, v in values if isinstance(v, re.Pattern)]
    return found


# The characters a pattern's classes are tried on: ASCII, Latin-1 and beyond, and the Unicode
# digits and spaces `\d` and `\s` take in.
PROBE = [chr(c) for c in range(0x300)] + list("\u0660\u06f1\u0966\uff11\u2003\u3000\u2028→≥")
REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)
ONE_CHARACTER = (sre.LITERAL, sre.NOT_LITERAL, sre.IN, sre.ANY)


def backtracking_repeats(pattern: re.Pattern[str]) -> list[str]:
    """The repeats that could give back what they matched and then match otherwise (so a text can
    make them retry), and what the patterns must not use at all. Allowed: an unbounded repeat of
    one character class followed only by characters outside it (giving one back can never lead
    on: the repeat behaves as a possessive one, on every interpreter), or of a group, ending the
    pattern (nothing after it to give back for)."""
    parsed = sre_parse.parse(pattern.pattern, pattern.flags)
    found: list[str] = []

    def chars(item) -> frozenset[str]:
        one = re._compiler.compile(sre_parse.SubPattern(parsed.state, [item]), pattern.flags)
        return frozenset(c for c in PROBE if one.fullmatch(c))

    def first(items) -> tuple[frozenset[str], bool]:
        """The characters a sequence may start with, and whether it may match nothing."""
        starts: frozenset[str] = frozenset()
        for op, arg in items:
            if op in ONE_CHARACTER:
                return starts | chars((op, arg)), False
            if op == sre.SUBPATTERN:
                more, empty = first(arg[-1])
            elif op == sre.BRANCH:
                both = [first(branch) for branch in arg[1]]
                more, empty = frozenset().union(*(c for c, _ in both)), any(e for _, e in both)
            elif op in REPEATS:
                more, empty = first(arg[2])
                empty = empty or arg[0] == 0
            else:  # \b, $, lookarounds: match no character
                more, empty = frozenset(), True
            starts |= more
            if not empty:
                return starts, False
        return starts, True

    def walk(items, after: frozenset[str]) -> None:
        for i, (op, arg) in enumerate(items):
            rest, rest_empty = first(items[i + 1 :])
            follow = rest | after if rest_empty else rest
            if op in (sre.POSSESSIVE_REPEAT, sre.ATOMIC_GROUP):
                found.append(f"{op}: mis-matched by Python 3.11.0-3.11.4")
            if op in REPEATS:
                _, high, body = arg
                if high == sre.MAXREPEAT:
                    one = len(body) == 1 and body[0][0] in ONE_CHARACTER
                    if one and (both := chars(body[0]) & follow):
                        found.append(f"{op} over {list(body)}, then {''.join(sorted(both))[:20]!r}")
                    elif not one and follow:
                        found.append(f"{op} over a group, then {''.join(sorted(follow))[:20]!r}")
                walk(body, first(body)[0] | follow)
            elif op == sre.SUBPATTERN:
                walk(arg[-1], follow)
            elif op == sre.BRANCH:
                for branch in arg[1]:
                    walk(branch, follow)
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                walk(arg[1], frozenset())
            elif op == sre.ATOMIC_GROUP:
                walk(arg, follow)

    walk(parsed, frozenset())
    return found


def test_every_pattern_is_linear_by_construction():
    """No repeat can give back and retry, and none is possessive (Debian 12's Python mis-matches those)."""
    patterns = module_patterns()
    assert len(patterns) >= 17, [name for name, _ in patterns]
    problems = {name: repeats for name, pattern in patterns if (repeats := backtracking_repeats(pattern))}
    assert not problems
    # The rule on patterns known to retry or not:
    assert backtracking_repeats(re.compile(r"\d+\d")) and backtracking_repeats(re.compile(r"\s*x?\s*y"))
    assert backtracking_repeats(re.compile(r"(?:a\s*)+b")) and backtracking_repeats(re.compile(r"\d++h"))
    assert backtracking_repeats(re.compile(r"(?>a)")) and backtracking_repeats(re.compile(r"\d+(?:٠)"))
    assert not backtracking_repeats(re.compile(r"\d+h")) and not backtracking_repeats(
        re.compile(r"(?:a\s*)+")
    )
    assert not backtracking_repeats(re.compile(r"X\s*(?:y|\d+)", re.I))


def package_sources() -> list[Path]:
    root = Path(goaltender.__file__).parent

    def ours(parts: tuple[str, ...]) -> bool:  # not the tests, nor a venv or cache kept in the checkout
        return not any(part.startswith(".") or part in ("tests", "benchmarks", "build") for part in parts)

    return [path for path in root.rglob("*.py") if ours(path.relative_to(root).parts)]


def string_literals(source: str) -> list[str]:
    """Every string in a module, an f-string's fields read as `x` (a pattern assembled of pieces)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            found.append("".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values))
    return found


def test_no_pattern_in_the_package_is_possessive_or_atomic():
    """Python 3.11.0-3.11.4 mis-match possessive quantifiers and atomic groups (gh-106052,
    gh-100061): no string in the package that reads as a regular expression uses one."""
    sources = [path for path in package_sources() if path.name != "selftest.py"]  # the bugs' reproducers
    assert len(sources) > 100 and any(path.name == "budget.py" for path in sources)
    found = []
    for path in sources:
        for text in string_literals(path.read_text()):
            try:
                parsed = sre_parse.parse(text)
            except (re.error, OverflowError, RecursionError):
                continue  # not a pattern
            if possessive_or_atomic(parsed):
                found.append(f"{path.name}: {text[:60]!r}")
    assert not found
    assert possessive_or_atomic(sre_parse.parse(r"a(?:\s*+b)")) and possessive_or_atomic(
        sre_parse.parse("(?>a)")
    )


def possessive_or_atomic(items) -> bool:
    return any(
        op in (sre.POSSESSIVE_REPEAT, sre.ATOMIC_GROUP) or any(map(possessive_or_atomic, inside(op, arg)))
        for op, arg in items
    )


def inside(op, arg) -> list:
    """The sequences an item of a parsed pattern holds."""
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        return [arg[2]]
    if op == sre.SUBPATTERN:
        return [arg[-1]]
    if op == sre.BRANCH:
        return list(arg[1])
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return [arg[1]]
    return []


# ---- the same readings as the possessive patterns they replace ----

# The patterns as they were until 2026-12 (possessive), on an interpreter that matches them right.
_NUM = r"(?<![\d.])\d++(?:\.\d++)?+"
_UNITS = budget._UNITS
_RUN = rf"(?:{_NUM}\s*+{_UNITS}\s*+)++"
POSSESSIVE = {
    "wall": rf"\b(?:time\s++)?budget\s*+(?:of\s++)?({_RUN})",
    "within": rf"\bwithin\s++({_RUN})",
    "compute": rf"\b(?:gpu|cpu|compute)[- ]hours?\s*+(?:of\s++)?({_NUM})",
    "compute_after": rf"\b({_NUM})\s*+(?:gpu|cpu|compute)[- ]hours?\b",
    "max_exp": r"\b(?:max(?:imum)?|up\s++to|at\s++most)\s++(\d++)\s++(?:experiments?|runs?)\b",
    "timeout": rf"\btimeout\s++({_RUN})",
    "tokens": rf"\b(?:(?:max(?:imum)?|up\s++to|at\s++most)\s++({_NUM})\s*+([km]?)\s*+tokens?"
    rf"|tokens?\s++budget\s++(?:of\s++)?({_NUM})\s*+([km]?))\b",
    "run": rf"(?<![\w.]){_RUN}",
    "each": r"\s*+(?:each|per\s++(?:experiments?|runs?))\b",
    "target_pct": rf"(?:\bto|\breach|\btarget|>=|≥)\s*+({_NUM})\s*+%",
    "target": r"\btarget\s++(?:of\s++)?(\d*+\.\d++|\d++)\b(?!\s*+%)",
    "runner": r"\bon\s++([A-Za-z0-9][\w.-]*+)\s*+$|\bon\s++runner\s++([\w.-]++)",
    "with": r"\bwith\s++([\w-]++)",
    "executor": r"\bvia\s++(local|ray|slurm)\b",
    "gpus": r"\b(\d{1,3})\s*+gpus?\s++(?:each|per\s++(?:experiments?|runs?))\b",
    "negative": rf"\b(?:budget|within|timeout)\s*+(?:of\s++)?-\s*+{_NUM}\s*+{_UNITS}"
    rf"|\b(?:max(?:imum)?|up\s++to|at\s++most)\s++-\s*+\d++\s*+(?:experiments?|runs?|[km]?\s*+tokens?)\b"
    rf"|\b(?:gpu|cpu|compute)[- ]hours?\s*+(?:of\s++)?-\s*+\d"
    rf"|(?<![\w.-])-\s*+{_NUM}\s*+(?:(?:gpu|cpu|compute)[- ]hours?\b|{_UNITS}\s*+(?:each|per\s++(?:experiments?|runs?))\b)",
}
POSSESSIVE_WHOLE = {  # read with fullmatch
    budget._DURATION: rf"\s*+{_RUN}",
    budget._EXTEND: rf"\s*+(?:budget\s*+)?\+\s*+({_RUN})",
    budget._MORE_EXP: r"\s*+\+\s*+(\d++)\s++(?:experiments?|runs?)\s*+",
    budget_size._SHARE: r"\+?+\s*+(\d++(?:\.\d++)?+)\s*+%",
}
POSSESSIVE_STAGES = (
    r"\bstages?\s*+:\s*+([a-z][a-z0-9-]{0,39}(?:\s*+(?:,|->|→)\s*+[a-z][a-z0-9-]{0,39}){0,11})"
)
MORE_PHRASES = st.builds(
    lambda template, n, u, w: template.format(n=n, u=u, w=w),
    st.sampled_from(
        [
            *("max {n}{u} tokens", "max {n} {u} tokens", "token budget {n} {u}", "token budget of {n}k ."),
            *("up to {n} k  tokens", "stages: {w}, {w} -> {w}", "stage :{w}→{w}", "{n} GPUs each", "{n}%"),
            *("budget -{n}{u}", "max -{n} k tokens", "-{n}{u} each", "on {w}  ", "via slurm", "+ {n} runs "),
        ]
    ),
    NUMBERS,
    st.sampled_from(["", " ", "k", "K", "m", "M", "h", "m ", "  "]),
    st.text(st.characters(codec="utf-8"), max_size=12),
)
WORDS = st.lists(
    st.tuples(st.one_of(PHRASES, MORE_PHRASES, st.text(max_size=20)), SEPARATORS), max_size=6
).map(lambda parts: "".join(phrase + sep for phrase, sep in parts))


def readings(matches) -> list[tuple[tuple[int, int], tuple[str, ...]]]:
    """Where each match is and what its groups hold (a group that took part empty or not at all: "")."""
    return [(m.span(), tuple(g or "" for g in m.groups())) for m in matches]


@pytest.mark.skipif(bool(engine_bugs()), reason="this Python mis-matches possessive quantifiers")
@settings(max_examples=1500, **SEEDED)
@given(st.one_of(WORDS, MORE_PHRASES, PHRASES))
def test_every_pattern_reads_as_its_possessive_original_did(text):
    for name, original in POSSESSIVE.items():
        now, then = budget._PATTERNS[name], re.compile(original, re.I)
        assert readings(now.finditer(text)) == readings(then.finditer(text)), name
    for pattern, original in POSSESSIVE_WHOLE.items():
        for piece in (text, text.strip(), text[:12]):
            now, then = pattern.fullmatch(piece), re.compile(original, pattern.flags).fullmatch(piece)
            assert readings([now] if now else []) == readings([then] if then else []), original
    then = re.compile(POSSESSIVE_STAGES, re.I)
    assert readings(stages._STAGES.finditer(text)) == readings(then.finditer(text))


@pytest.mark.parametrize(
    ("text", "wall", "each"),
    [
        ("budget 3m", 180, None),
        ("budget 1h30m, 2 h 5 s each", 5400, 7205),
        ("within 2.5 hours", 9000, None),
        ("10m each, timeout 1h 5s", None, 3605),
    ],
)
def test_durations_read_whole_on_this_interpreter(text, wall, each):
    """What Python 3.11.2 read wrongly with possessive patterns: `3m` as nothing, `1h30m` as 1 h."""
    spec = parse_goal_text("x, " + text)
    assert (spec.wall_seconds, spec.experiment_timeout_s) == (wall, each)
    changed = apply_budget_change(Budget(wall_seconds=60, deadline=NOW), "budget +1h 30m", NOW)
    assert changed and changed[0].wall_seconds == 60 + 5400


def test_a_number_is_read_whole_or_not_at_all():
    """A number starts where its digit run starts: a long run is never read from its middle."""
    with pytest.raises(GoalTextError, match="at most 365 days"):
        parse_goal_text("x, budget 12345678901234567890h")
    assert parse_duration("x1h") is None and parse_duration("1.1.1h") is None
    assert parse_goal_text("v2.5h each").experiment_timeout_s is None  # part of a word, not a duration
    assert parse_goal_text("x, max 0000000000000000000000000007 experiments").max_experiments == 7
