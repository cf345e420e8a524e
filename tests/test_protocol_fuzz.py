"""The protocol boundary under generated input (hypothesis, derandomized: the same cases every run).

Lines come from strategies over valid requests with one field mutated, wrong types, integers of
any size, NaN and the infinities, lone surrogates, deep nesting, random bytes (invalid UTF-8 among
them) and over-long lines. Most go to the real parsing function, which is fast; thousands go
through a real runner's socket, on one connection, each checked for its one reply (an error with a
sensible code, never `internal`), and afterwards the runner's state for damage. 12,000 cases in
all; `EXAMPLES` says how they are spread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import socket
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from helpers import eventually, submit, write_agent
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from goaltender.protocol import messages as p
from goaltender.protocol import wire

EXAMPLES = {
    "mutated": 4000,
    "bytes": 2000,
    "hostile": 2000,
    "profile": 1000,
    "socket": 3000,
}
SENSIBLE_CODES = {"bad_json", "bad_request", "unknown_type"}  # what parsing alone may answer
BIG = 2**70  # past every 64-bit bound


def fuzz_settings(name: str, shrink: bool = True):
    return settings(
        max_examples=EXAMPLES[name],
        phases=[Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else []),
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


# ---- building lines: JSON text with fragments json.dumps would not write ----


@dataclass(frozen=True)
class Raw:
    """A JSON fragment written as is: a 5,000-digit integer, NaN, 40 levels of brackets."""

    text: str


def dumps(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    return json.dumps(value)  # ASCII: a lone surrogate becomes its \udXXX escape, as a client would send


def line_of(message: dict[str, Any]) -> bytes:
    return dumps(message).encode() + b"\n"


GOAL, APPROVAL, EXPERIMENT = 1, 1, 1  # the socket test's real ones (the first of each)
MISSING = 10**12


def templates(goal: int, approval: int, experiment: int) -> list[dict[str, Any]]:
    """One valid request of every type, as JSON objects."""
    return [
        {"type": "hello", "id": 1, "version": p.PROTOCOL_VERSION, "client": "fuzz"},
        {
            "type": "submit_goal",
            "id": 2,
            "text": "reach 90%, budget 1h",
            "agent": "a",
            "budget": {"max_experiments": 3},
        },
        {"type": "steer", "id": 3, "goal_id": goal, "text": "focus on lr", "author": "ana"},
        {"type": "change_budget", "id": 4, "goal_id": goal, "change": "+2h", "by": "ana"},
        {"type": "stop", "id": "stop-5", "goal_id": goal, "by": "ana", "reason": "enough"},
        {"type": "pause", "id": 6, "goal_id": goal},
        {"type": "resume", "id": 7, "goal_id": goal},
        {"type": "decide", "id": 8, "approval_id": approval, "approve": True, "by": "ana"},
        {"type": "status", "id": 9, "goal_id": goal},
        {"type": "summary", "id": 10, "goal_id": goal},
        {"type": "subscribe", "id": 11, "since": 0, "goal_id": goal},
        {"type": "ack", "id": 12, "seq": 1},
        {"type": "get_log", "id": 13, "experiment_id": experiment, "offset": 0, "limit": 100},
        {"type": "get_series", "id": 14, "goal_id": goal, "name": "loss"},
        {"type": "get_artifact", "id": 41, "experiment_id": experiment, "name": "errors.json"},
        {"type": "milestone", "id": 15, "goal_id": goal, "title": "baseline", "text": "25%"},
        {
            "type": "log_metrics",
            "id": 16,
            "goal_id": goal,
            "points": [{"name": "loss", "value": 0.5, "step": 3}],
        },
        {
            "type": "run_experiment",
            "id": 17,
            "goal_id": goal,
            "command": ["true"],
            "description": "d",
            "params": {"lr": 0.1},
            "timeout_s": 30,
            "env": {"A": "b"},
        },
        {"type": "ask", "id": "a-18", "goal_id": goal, "question": "ok?", "timeout_s": 30},
        {"type": "read_inbox", "id": 19, "goal_id": goal},
        {"type": "write_diary", "id": 20, "goal_id": goal, "text": "plan", "kind": "handoff"},
        {"type": "read_diary", "id": 21, "goal_id": goal, "last": 3},
        {"type": "submit_report", "id": 22, "goal_id": goal, "text": "done"},
        {"type": "audit", "id": 23, "goal_id": goal, "limit": 5},
        {"type": "prune", "id": 66, "days": 90, "dry_run": True},
        {"type": "put_input", "id": 67, "goal_id": goal, "name": "notes.txt", "size": 5, "data": "aGVsbG8="},
        {"type": "disk_usage", "id": 40, "goal_id": goal},
        {"type": "stage_done", "id": 50, "goal_id": goal, "summary": "planned", "document": "# Plan"},
        {
            "type": "cross_check",
            "id": 51,
            "goal_id": goal,
            "description": "toy",
            "a": ["true"],
            "b": ["true"],
        },
        {
            "type": "fetch",
            "id": 24,
            "goal_id": goal,
            "repo": "org/tiny",
            "repo_type": "dataset",
            "revision": "v1",
            "include": ["*.json"],
        },
        {
            "type": "skill_edit",
            "id": 42,
            "goal_id": goal,
            "skill": "autoresearch",
            "path": "references/x.md",
            "content": "what I learned",
            "why": "so",
            "timeout_s": 30,
        },
        {"type": "skill_log", "id": 43, "limit": 5},
        {"type": "revert_skill", "id": 44, "commit": "abc1234", "by": "ana"},
    ]


def test_templates_are_valid_and_cover_every_request():
    requests = [p.parse_request(line_of(t)) for t in templates(GOAL, APPROVAL, EXPERIMENT)]
    assert not [r for r in requests if isinstance(r, p.Error)]
    assert {r.type for r in requests} == p.REQUEST_TYPES


# ---- strategies ----

lone_surrogates = st.integers(0xD800, 0xDFFF).map(chr)
texts = st.text(max_size=20)
surrogate_texts = st.builds(lambda a, s, b: a + s + b, texts, lone_surrogates, texts)
huge_ints = st.builds(
    lambda sign, digits: Raw(sign + "9" * digits), st.sampled_from(["", "-"]), st.integers(19, 6000)
)
edge_ints = st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 0, -1, 2**53 + 1])
non_finite = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "1.8e308"]).map(Raw)
deep = st.builds(
    lambda n, brackets: Raw(brackets[0] * n + "1" + brackets[1] * n),
    st.integers(wire.MAX_DEPTH - 3, 3000),
    st.sampled_from([("[", "]"), ('{"a": ', "}")]),
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-BIG, BIG)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=8,
)
plausible_values = (  # the right kind of thing, often, in the wrong amount
    st.integers(-3, 10**6)
    | st.floats(-1e6, 1e6)
    | texts
    | st.booleans()
    | st.none()
    | st.lists(texts, max_size=3)
)
hostile_values = json_values | huge_ints | edge_ints | non_finite | surrogate_texts | deep
hostile_ids = hostile_values | st.text(min_size=wire.MAX_ID_CHARS + 1, max_size=wire.MAX_ID_CHARS + 5)


UNKNOWN = object()  # junk bytes may have landed in the id


@dataclass
class Case:
    line: bytes
    sent_id: Any  # the id as sent (None: there is none), or UNKNOWN
    echoes: bool  # an error must echo sent_id (it is safe, and the line is readable JSON)


def _safe(value: Any) -> bool:
    return not isinstance(value, Raw) and wire.safe_id(value) is not None and value == wire.safe_id(value)


def _readable(value: Any) -> bool:
    """Whether json.loads gets through `value` (it gives up only on nesting past ~1,000 levels)."""
    return not (isinstance(value, Raw) and value.text.count("[") + value.text.count("{") > 900)


@st.composite
def mutated_requests(draw, goal: int = GOAL, approval: int = APPROVAL, experiment: int = EXPERIMENT) -> Case:
    """A valid request with one thing wrong (or, now and then, nothing wrong at all)."""
    message = dict(draw(st.sampled_from(templates(goal, approval, experiment))))
    how = draw(
        st.sampled_from(["field", "field", "field", "new_field", "drop", "type", "id", "junk", "none"])
    )
    if how in ("field", "new_field"):
        fields = st.sampled_from(sorted(set(message) - {"type", "id"}) or ["x"])
        name = draw(fields if how == "field" else texts.filter(lambda k: k not in ("type", "id")))
        message[name] = value = draw(plausible_values | hostile_values)
        return Case(line_of(message), message["id"], _safe(message["id"]) and _readable(value))
    if how == "drop":
        message.pop(draw(st.sampled_from(sorted(message))))
    elif how == "type":
        message["type"] = draw(
            hostile_values | st.sampled_from(["", "STATUS", "status ", "event", "welcome"])
        )
    elif how == "id":
        message["id"] = draw(hostile_ids)
    line = line_of(message)
    if how == "junk":  # bytes dropped into the JSON text, or the line cut short
        at = draw(st.integers(0, len(line) - 1))
        line = line[:at] + draw(st.binary(max_size=4)) + line[at + draw(st.integers(0, 3)) :]
        return Case(line, UNKNOWN, False)
    sent = message.get("id")
    return Case(line, sent, "id" in message and _safe(sent) and _readable(message.get("type")))


random_lines = st.builds(
    lambda line: Case(line, UNKNOWN, False),
    st.binary(max_size=200)
    | st.builds(
        lambda head, tail: head + tail,
        st.sampled_from([b"{", b'{"type": "status", "id": 1', b"[", b'"', b"\xef\xbb\xbf{"]),
        st.binary(max_size=50),
    ),
)


def with_one(message: dict[str, Any], field: str):
    """Lines of `message` with `field` set to each drawn value; the id is 1 unless that is the field."""
    sent_id = (lambda value: value) if field == "id" else (lambda value: 1)
    return lambda value: Case(
        line_of(message | {field: value}), sent_id(value), field != "id" and _readable(value)
    )


hostile_lines = st.one_of(
    st.builds(with_one({"type": "status", "id": 1}, "goal_id"), hostile_values),
    st.builds(with_one({"type": "ack", "id": 1}, "seq"), huge_ints | edge_ints | non_finite),
    st.builds(with_one({"type": "status", "id": 1}, "type"), hostile_values),
    st.builds(
        with_one({"type": "stop", "id": 1, "goal_id": GOAL}, "id"), surrogate_texts | huge_ints | edge_ints
    ),
    st.builds(
        with_one({"type": "log_metrics", "id": 1, "goal_id": GOAL, "points": []}, "points"),
        st.lists(
            st.fixed_dictionaries({"name": texts, "value": non_finite | scalars}), min_size=1, max_size=3
        ),
    ),
    st.builds(lambda v: Case(dumps(v).encode() + b"\n", None, False), json_values | deep),  # any JSON at all
)


# ---- properties of the parsing function ----


def check_parsed(case: Case) -> p.AnyRequest | p.Error:
    """What every line must come to: a clean request, or one short, encodable error."""
    result = p.parse_request(case.line)
    if isinstance(result, p.Error):
        assert result.code in SENSIBLE_CODES, result
        assert result.message and len(p.encode(result)) < 4096, result
        assert result.id is None or case.sent_id in (result.id, UNKNOWN), (result, case)
        if case.echoes:
            assert result.id == case.sent_id, (result, case)
    else:  # accepted: then it is within the profile, and survives the trip back
        encoded = p.encode(result)
        assert p.parse_request(encoded) == result
        json.loads(encoded, parse_constant=_no_constants)
    return result


def _no_constants(name: str):
    raise AssertionError(f"{name} in an accepted request")


@fuzz_settings("mutated")
@given(mutated_requests())
def test_mutated_requests_are_refused_or_clean(case):
    check_parsed(case)


@fuzz_settings("bytes")
@given(random_lines)
def test_random_bytes_get_an_error(case):
    assert isinstance(check_parsed(case), p.Error)


@fuzz_settings("hostile")
@given(hostile_lines)
def test_hostile_numbers_strings_and_nesting_are_refused_or_in_range(case):
    result = check_parsed(case)
    if not isinstance(result, p.Error):  # what got through is in range
        for field in ("seq", "goal_id", "id"):
            value = getattr(result, field, None)
            assert not isinstance(value, int) or wire.INT64_MIN <= value <= wire.INT64_MAX


@fuzz_settings("profile")
@given(json_values | deep | huge_ints | non_finite | surrogate_texts)
def test_decoded_objects_stay_within_the_profile(value):
    """Whatever decode_object returns holds only text, finite floats and 64-bit integers, shallowly."""
    try:
        decoded = wire.decode_object(line_of({"v": value}))
    except wire.LineRefused as refused:
        assert refused.message
        return
    _within_profile(decoded["v"], depth=2)


def _within_profile(value: Any, depth: int) -> None:
    assert depth <= wire.MAX_DEPTH + 1
    if isinstance(value, str):
        value.encode("utf-8")  # a lone surrogate would raise
    elif isinstance(value, float):
        assert math.isfinite(value)
    elif isinstance(value, int):
        assert wire.INT64_MIN <= value <= wire.INT64_MAX
    elif isinstance(value, dict):
        for key, item in value.items():
            _within_profile(key, depth)
            _within_profile(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _within_profile(item, depth + 1)


def test_the_findings_are_refused_with_their_reasons():
    """The outside fuzzer's findings, one line each: what the runner now answers."""
    cases = [
        (
            {
                "type": "log_metrics",
                "id": 1,
                "goal_id": 1,
                "points": [{"name": "x", "value": Raw("Infinity")}],
            },
            "bad_json",
            1,
            "Infinity",
        ),
        ({"type": ["status"], "id": 2}, "bad_request", 2, "not an array"),
        ({"type": {"a": 1}, "id": 3}, "bad_request", 3, "not an object"),
        ({"type": "status", "id": 4, "goal_id": Raw("9" * 4301)}, "bad_json", 4, "64-bit"),
        ({"type": "status", "id": 5, "goal_id": Raw("[" * 5000 + "]" * 5000)}, "bad_json", None, "nested"),
        ({"type": "status", "id": 6, "goal_id": Raw("[" * 40 + "]" * 40)}, "bad_json", 6, "nested"),
        ({"type": "ack", "id": 7, "seq": 2**64}, "bad_json", 7, "64-bit"),
        ({"type": "stop", "id": "\ud800", "goal_id": 1}, "bad_json", None, "surrogate"),
        ({"type": "subscribe", "id": 9, "goal_id": 2**63}, "bad_json", 9, "64-bit"),
        ({"type": "subscribe", "id": 10, "goal_id": 0}, "bad_request", 10, "greater than or equal to 1"),
        (
            {"type": "ask", "id": 11, "goal_id": 1, "question": "q", "timeout_s": 1e300},
            "bad_request",
            11,
            "timeout_s",
        ),
        (
            {"type": "submit_goal", "id": 12, "text": "t", "budget": {"deadline": "2030-01-01T00:00:00"}},
            "bad_request",
            12,
            "time zone",
        ),
        ({"type": "hello", "id": True, "version": 1}, "bad_request", None, "id"),
    ]
    for message, code, echoed, said in cases:
        error = p.parse_request(line_of(message))
        assert isinstance(error, p.Error) and (error.code, error.id) == (code, echoed), (message, error)
        assert said in error.message, (said, error.message)


# ---- through a real runner's socket ----


class LineClient:
    """A blocking client for the fuzzing thread: one line out, one reply back."""

    def __init__(self, path: str):
        self.path = path
        self.connect()

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(self.path)
        self.replies = self.sock.makefile("rb")
        welcome = self.exchange(
            line_of({"type": "hello", "id": 0, "version": p.PROTOCOL_VERSION, "client": "fuzz"})
        )
        assert welcome["type"] == "welcome", welcome

    def exchange(self, line: bytes) -> dict[str, Any]:
        try:
            self.sock.sendall(line)
            reply = self.replies.readline()
        except OSError as exc:
            raise AssertionError(f"no reply to {line[:300]!r}: {exc!r}") from None
        assert reply.endswith(b"\n"), f"no reply to {line[:300]!r}"
        return json.loads(reply)

    def overlong(self, size: int) -> dict[str, Any]:
        """A line over the limit: one last error, then the runner hangs up (and we dial again)."""
        with contextlib.suppress(OSError):  # it may hang up before taking all of it
            self.sock.sendall(b" " * (size - 1) + b"\n")
        reply = json.loads(self.replies.readline())
        with contextlib.suppress(ConnectionResetError):  # (the reset comes after what it sent)
            assert self.replies.read() == b""
        self.close()
        self.connect()
        return reply

    def close(self) -> None:
        self.replies.close()
        self.sock.close()


HARMLESS = (
    p.Hello,
    p.Status,
    p.Summary,
    p.GetSeries,
    p.GetLog,
    p.GetArtifact,
    p.Audit,
    p.ReadDiary,
    p.DiskUsage,
    p.SkillLog,
)  # reads only
NAMED_IDS = ("goal_id", "approval_id", "experiment_id")


def harmless(request: p.AnyRequest) -> bool:
    """A valid request the batch may send: a read, or one aimed only at goals, approvals and runs
    that do not exist (a valid `stop` of the real goal would stop it, rightly)."""
    if isinstance(request, HARMLESS):
        return True
    named = [getattr(request, name) for name in NAMED_IDS if getattr(request, name, None) is not None]
    return bool(named) and all(n == MISSING for n in named) and not isinstance(request, p.Subscribe | p.Ack)


@st.composite
def socket_cases(draw, goal: int, approval: int) -> Case | int:
    """Mostly lines as above; one in 200 a line just over MAX_LINE (the size, as an int)."""
    pick = draw(st.integers(0, 199))
    if pick == 0:
        return p.MAX_LINE + draw(st.integers(1, 8))
    if pick < 130:  # most look like requests, so that many reach the handlers
        case = draw(mutated_requests(*((goal, approval) if pick % 2 else (MISSING, MISSING)), MISSING))
    else:
        case = draw(hostile_lines if pick < 170 else random_lines)
    case.line = case.line.rstrip(b"\n").replace(b"\n", b" ") + b"\n"  # one line, as sent
    return case


async def test_fuzzed_lines_through_a_real_runner_change_nothing(start_runner, connect, tmp_path, caplog):
    agent = write_agent(tmp_path, "a.sh", 'goaltender ask "may I?" --timeout 1h\nsleep 300\n')
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal = await submit(client, "fuzz target, max 3 experiments, budget 2h", agent="a")
    approval = (await eventually(lambda: asked(client, goal)))[0].id
    before = await snapshot(runner, client, goal)
    caplog.set_level(logging.WARNING, logger="goaltender")
    sent: list[str] = []

    @fuzz_settings("socket", shrink=False)  # a connection has state: replaying a case may differ
    @given(socket_cases(goal, approval))
    def fuzz(case: Case | int) -> None:
        if isinstance(case, int):
            reply = fuzz_client.overlong(case)
            assert (reply["code"], reply["id"]) == ("line_too_long", None), reply
            sent.append("overlong")
            return
        expected = p.parse_request(case.line)
        assume(isinstance(expected, p.Error) or harmless(expected))
        reply = fuzz_client.exchange(case.line)
        sent.append(reply.get("code") or reply["type"])
        if isinstance(expected, p.Error):
            # A line nested past the JSON decoder's own recursion guard is refused before its id
            # can be read; where the guard trips depends on the caller's stack depth, so the
            # runner may not echo an id this thread could read.
            too_deep = "nested more than" in expected.message and reply["id"] is None
            echoed = None if too_deep else expected.id
            assert (reply["type"], reply["code"], reply["id"]) == ("error", expected.code, echoed), reply
        else:
            assert reply["id"] == expected.id, reply
            assert reply.get("code") in (None, "not_found", "version_mismatch"), reply

    fuzz_client = await asyncio.to_thread(LineClient, str(runner.settings.socket_path))
    started = time.monotonic()
    try:
        await asyncio.to_thread(fuzz)
    finally:
        fuzz_client.close()
    elapsed = time.monotonic() - started

    assert len(sent) >= EXAMPLES["socket"] * 0.8, len(sent)  # most cases reached the socket
    assert "internal" not in sent and "overlong" in sent and "not_found" in sent
    assert await snapshot(runner, client, goal) == before  # nothing stopped, decided, steered or spent
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a request failed inside the runner"
    # The stream is whole: a new subscriber gets every event up to the head.
    head = await client.subscribe(since=0)
    seqs = []
    async for event in client.events():
        seqs.append(event.seq)
        if event.seq == head:
            break
    assert seqs == list(range(1, head + 1))
    print(f"{len(sent)} lines through the socket in {elapsed:.1f}s: {sorted(Counter(sent).items())}")


async def asked(client, goal: int):
    """The goal's pending approvals once it waits for them (its state is written after the
    approval's row: a snapshot between the two saw a goal still running)."""
    status = (await client.request(p.Status(goal_id=goal))).goals[0]
    return status.goal.state == "waiting_for_approval" and status.pending_approvals


async def snapshot(runner, client, goal: int) -> dict[str, Any]:
    status = (await client.request(p.Status())).goals
    inbox = await runner.store.db.fetchall("SELECT id, text, read_at FROM inbox")
    audit = await runner.store.audit_entries(limit=10_000)
    events = await runner.store.head_seq()
    diary = await runner.store.read_diary(goal, last=1000)
    return {
        "goals": [(s.goal.id, s.goal.state, s.goal.budget, s.attempted) for s in status],
        "approvals": [(a.id, a.state) for s in status for a in s.pending_approvals],
        "inbox": [tuple(row) for row in inbox],
        "done": [(e.action, e.goal_id) for e in audit if e.outcome == "done"],
        "events": events,
        "diary": len(diary),
    }


def test_the_costliest_lines_get_their_answer():
    """The worst lines this suite knows (MAX_LINE bytes of the costliest shapes) are each answered:
    a request or an error saying why, never an exception. How fast is benchmarks/bench_wire.py's
    to say (against json.loads of the same bytes), not a timed test's."""
    for name, line in costliest_lines().items():
        assert len(line) <= p.MAX_LINE, name
        answer = p.parse_request(line)
        assert isinstance(answer, p.Error | p.RunExperiment | p.ReportMilestone), name
        if isinstance(answer, p.Error):
            assert answer.code in ("bad_json", "bad_request"), (name, answer)


def costliest_lines() -> dict[str, bytes]:
    room = p.MAX_LINE - 200
    head = (
        b'{"type": "run_experiment", "id": 1, "goal_id": 1, "command": ["x"], "description": "d", "params": '
    )
    return {
        "a list of small ints": head + b'{"a": [' + b",".join([b"7"] * (room // 2)) + b"]}}",
        "nested lists": head + b'{"a": [' + b",".join([b"[[[1]]]"] * (room // 8)) + b"]}}",
        "many keys": head + b"{" + b",".join(b'"k%d": 1' % i for i in range(room // 13)) + b"}}",
        "lone surrogates": b'{"type": "milestone", "id": 1, "title": "' + b"\\ud800" * (room // 6) + b'"}',
        "one huge integer": b'{"id": ' + b"9" * room + b"}",
        "one long float": b'{"id": 1.' + b"9" * room + b"}",
        "open brackets": b"[" * room,
    }
