"""protocol/messages.py: every message round-trips; a live daemon answers malformed input with errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import sys

import pytest
from helpers import eventually

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable
from goaltender.storage.records import (
    Budget,
    Event,
    HubFetch,
    MetricPoint,
    MilestoneReported,
    UnreadableEvent,
    utcnow,
)
from goaltender.storage.runner_store import INSERT_EVENT

REQUESTS = [
    p.Hello(id=1, version=p.PROTOCOL_VERSION, client="bot"),
    p.SubmitGoal(
        id=2, text="reach 90%, budget 1h", owner="ana", agent="sweep", budget=Budget(max_experiments=3)
    ),
    p.Steer(id=3, goal_id=1, text="focus on lr", author="ana"),
    p.ChangeBudget(id=4, goal_id=1, change="+2h", by="ana"),
    p.Stop(id=5, goal_id=1, by="ana", reason="enough"),
    p.Pause(id=6, goal_id=1),
    p.Resume(id=7, goal_id=1),
    p.Decide(id=8, approval_id=2, approve=True, by="ana", comment="go"),
    p.Status(id=9),
    p.Summary(id=10, goal_id=1),
    p.Subscribe(id=11, since=42, goal_id=1),
    p.Ack(id=12, seq=42),
    p.GetLog(id=13, experiment_id=1, offset=10),
    p.DiskUsage(id=31, goal_id=1),
    p.StageDone(id=40, goal_id=1, summary="planned", document="# Plan", document_name="plan.md"),
    p.CrossCheck(id=41, goal_id=1, description="toy batch", a=["python", "a.py"], b=["python", "b.py"]),
    p.GetSeries(id=14, goal_id=1, name="loss"),
    p.GetArtifact(id=32, experiment_id=1, name="hard_cases.png"),
    p.ReportMilestone(id=15, goal_id=1, title="baseline done", text="25%"),
    p.LogMetrics(id=16, goal_id=1, points=[MetricPoint(name="loss", value=0.5, step=3)]),
    p.RunExperiment(id=17, goal_id=1, command=["python", "t.py"], description="d", params={"lr": 0.1}),
    p.Ask(id="a-18", goal_id=1, question="ok?", timeout_s=30),
    p.ReadInbox(id=19, goal_id=1),
    p.WriteDiary(id=20, goal_id=1, text="plan", kind="handoff"),
    p.ReadDiary(id=21, goal_id=1, last=3),
    p.SubmitReport(id=22, goal_id=1, text="done"),
    p.Audit(id=23, goal_id=1, limit=5),
    p.Fetch(id=24, goal_id=1, repo="org/tiny", repo_type="dataset", revision="v1", include=["*.json"]),
    p.SkillEdit(id=33, goal_id=1, skill="autoresearch", content="---\nname: autoresearch\n---\n", why="x"),
    p.SkillLog(id=34, limit=5),
    p.RevertSkill(id=35, commit="abc1234", by="ana"),
    p.Prune(id=36, days=30, dry_run=True),
    p.PutInput(
        id=37,
        goal_id=1,
        name="paper.pdf",
        size=5,
        data="JVBERi0=",
        by=p.Person(kind="slack", id="U1", name="Ana"),
    ),
    p.Steer(id=38, goal_id=1, text="try lr 3e-4", author=p.Person(kind="slack", id="U1")),
]


def test_every_request_type_is_covered():
    assert {r.type for r in REQUESTS} == p.REQUEST_TYPES


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: r.type)
def test_request_round_trip(request_):
    line = p.encode(request_)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert p.parse_request(line) == request_


def test_reply_round_trip():
    event = Event(seq=7, goal_id=1, ts=utcnow(), data=MilestoneReported(title="t", text="x"))
    for reply in [
        p.Welcome(id=1, runner="gpu-1"),
        p.Done(id=2, message="ok"),
        p.EventMessage(event=event),
        p.Subscribed(id=3, head=7),
        p.Error(id=4, code="conflict", message="already decided"),
        p.LogReply(id=5, text="abc", offset=0, next_offset=3, eof=True),
        p.ArtifactReply(id=6, name="errors.json", data="e30="),
        p.FetchReply(
            id=7,
            fetch=HubFetch(repo="org/tiny", commit="a" * 40, path="/c/s", files=2, bytes=10),
            message="recorded",
        ),
        p.FetchReply(id=8, failure="no model org/nope on https://huggingface.co"),
    ]:
        assert p.parse_reply(p.encode(reply)) == reply


@pytest.mark.parametrize(
    ("line", "code", "echo_id"),
    [
        (b"{not json", "bad_json", None),
        (b"[1, 2]", "bad_json", None),
        (b'{"type": "launch_missiles", "id": 5}', "unknown_type", 5),
        (b'{"type": "steer", "id": 6, "goal_id": "one", "text": "x"}', "bad_request", 6),
        (b'{"type": "steer", "id": 7, "goal_id": 1}', "bad_request", 7),
        (b'{"type": "steer", "id": 8, "goal_id": 1, "text": "x", "extra": 1}', "bad_request", 8),
    ],
)
def test_malformed_lines_are_described(line, code, echo_id):
    error = p.parse_request(line)
    assert isinstance(error, p.Error)
    assert error.code == code and error.id == echo_id
    assert error.message


@pytest.mark.parametrize("kind", sorted(p.REQUEST_MODELS))
def test_every_requests_problems_are_one_line_one_per_field(kind):
    """Issue 36: what a request lacks or has wrong is said as people read it, for every request:
    one line, the first problem of each field, without pydantic's codes, input echo or URL."""
    line = json.dumps({"type": kind, "id": 9, "unknown_field": [1, 2], "goal_id": -5}).encode()
    error = p.parse_request(line)
    assert isinstance(error, p.Error) and error.code == "bad_request" and error.id == 9
    message = error.message
    assert message.startswith(f"invalid {kind}: ") and "\n" not in message
    for noise in ("pydantic", "http", "type=", "input_value", "Value error", "validation error"):
        assert noise not in message, message
    named = [problem.split(":")[0] for problem in message.removeprefix(f"invalid {kind}: ").split("; ")]
    assert len(named) == len(set(named)), message  # a field once, however many problems it has
    assert "unknown_field" in named or "and" in named[-1]


def test_an_empty_or_blank_field_says_what_it_wants():
    def said(**fields) -> str:
        line = json.dumps({"type": "run_experiment", "id": 1, "goal_id": 1, "command": ["true"], **fields})
        return p.parse_request(line.encode()).message

    assert (
        said(description="")
        == "invalid run_experiment: description: is empty: give the hypothesis this run tests"
    )
    assert (
        said(description=" \n")
        == "invalid run_experiment: description: is blank: give the hypothesis this run tests"
    )
    assert said() == "invalid run_experiment: description: is missing: give the hypothesis this run tests"
    steer = p.parse_request(b'{"type": "steer", "id": 2, "goal_id": 1, "text": "  "}').message
    assert steer == "invalid steer: text: is blank: it must say something"


async def _raw(path):
    reader, writer = await asyncio.open_unix_connection(str(path), limit=4 * p.MAX_LINE)
    return reader, writer


async def _exchange(reader, writer, line: bytes) -> dict:
    writer.write(line)
    await writer.drain()
    return json.loads(await asyncio.wait_for(reader.readline(), 10))


async def test_daemon_survives_malformed_input_and_serves_others(start_runner, connect):
    runner = await start_runner()
    reader, writer = await _raw(runner.settings.socket_path)

    # Before the handshake, a valid request is refused.
    reply = await _exchange(reader, writer, b'{"type": "status", "id": 1}\n')
    assert reply["code"] == "handshake_required" and reply["id"] == 1
    reply = await _exchange(reader, writer, b'{"type": "hello", "id": 2, "version": 999}\n')
    assert reply["code"] == "version_mismatch"
    reply = await _exchange(reader, writer, b'{"type": "hello", "id": 3, "version": 1, "client": "fuzz"}\n')
    assert reply["type"] == "welcome" and reply["runner"] == "test-runner"

    for line, code in [
        (b"\xff\xfe garbage\n", "bad_json"),
        (b'{"type": "nope", "id": 4}\n', "unknown_type"),
        (b'{"type": "summary", "id": 5, "goal_id": [1]}\n', "bad_request"),
        (b'{"type": "summary", "id": 6, "goal_id": 404}\n', "not_found"),
    ]:
        reply = await _exchange(reader, writer, line)
        assert reply["type"] == "error" and reply["code"] == code, reply

    # The same connection still works after all that, and so does a second client.
    reply = await _exchange(reader, writer, b'{"type": "status", "id": 7}\n')
    assert reply["type"] == "status" and reply["id"] == 7
    other = await connect(runner)
    status = await other.request(p.Status())
    assert status.goals == []
    writer.close()


def _padded(request: bytes, size: int) -> bytes:
    """`request` as a line of exactly `size` bytes, newline included (JSON allows the spaces)."""
    return request + b" " * (size - len(request) - 1) + b"\n"


async def test_line_limit_is_exact_and_an_overlong_line_ends_the_connection(start_runner):
    runner = await start_runner()
    reader, writer = await _raw(runner.settings.socket_path)
    await _exchange(reader, writer, b'{"type": "hello", "id": 1, "version": 1, "client": "fuzz"}\n')

    reply = await _exchange(reader, writer, _padded(b'{"type": "status", "id": 2}', p.MAX_LINE))
    assert reply["type"] == "status" and reply["id"] == 2

    writer.write(_padded(b'{"type": "status", "id": 3}', p.MAX_LINE + 1))
    with contextlib.suppress(ConnectionError):  # it may hang up before taking all of the line
        await writer.drain()
    reply = json.loads(await asyncio.wait_for(reader.readline(), 10))
    assert reply["type"] == "error" and reply["code"] == "line_too_long" and reply["id"] is None
    assert str(p.MAX_LINE) in reply["message"] and "closing" in reply["message"]
    with contextlib.suppress(ConnectionError):
        assert await asyncio.wait_for(reader.read(), 10) == b""  # then the connection is closed
    writer.close()


async def test_every_request_has_an_answer(start_runner):
    runner = await start_runner()
    answered_by_the_connection = {p.Hello, p.Subscribe, p.Ack}
    assert set(runner.handlers) | answered_by_the_connection == set(p.Request.__subclasses__())


@pytest.mark.parametrize("written", ["by other means", "as the runner logs events"])
async def test_an_unreadable_stored_event_never_stalls_a_subscription(start_runner, connect, written):
    """Rows that no longer read back (NaN stored as null by an older runner, text that is not
    UTF-8, a kind this runner never heard of, a garbled time) come as `unreadable` events with
    their seq, and everything after them still arrives, in order: rows written by the runner's
    INSERT_EVENT (which marks what a replay may splice as it is) and by anything else alike."""
    runner = await start_runner()
    insert = "INSERT INTO events (goal_id, ts, kind, data) VALUES (?1, ?2, ?3, ?4)"
    if written != "by other means":
        insert = INSERT_EVENT
    insert = insert.replace("?4", "CAST(?4 AS TEXT)")  # (bytes that are no UTF-8 go in as text)
    first = await runner.store.append_event(None, MilestoneReported(title="before"))
    bad_rows = [
        (
            "metrics",
            b'{"kind": "metrics", "experiment_id": null, "points": [{"name": "loss", "value": null}]}',
        ),
        ("milestone", b'{"kind": "milestone", "title": "\xff\xfe"}'),
        ("teleported", b'{"kind": "teleported"}'),
        ("milestone", b"not json at all"),
    ]
    with contextlib.closing(sqlite3.connect(runner.settings.db_path)) as db, db:
        for kind, data in bad_rows:
            db.execute(insert, (None, utcnow().isoformat(), kind, data))
        db.execute(insert, (None, "yesterday-ish", "milestone", '{"kind": "milestone", "title": "t"}'))
    last = await runner.store.append_event(None, MilestoneReported(title="after"))

    client = await connect(runner)
    assert await client.subscribe(since=0) == last.seq
    seen = []
    async for event in client.events():
        seen.append(event)
        if event.seq == last.seq:
            break
    assert [e.seq for e in seen] == list(range(first.seq, last.seq + 1))
    assert seen[0].data == MilestoneReported(title="before") and seen[-1].data == MilestoneReported(
        title="after"
    )
    unreadable = [e.data for e in seen[1:-1]]
    assert all(isinstance(d, UnreadableEvent) for d in unreadable)
    assert [d.stored_kind for d in unreadable] == [
        "metrics",
        "milestone",
        "teleported",
        "milestone",
        "milestone",
    ]
    assert "points.0.value" in unreadable[0].reason and "unicode" in unreadable[1].reason
    assert "ts" in unreadable[4].reason


class _FedStream:
    """A LineStream whose runner side is this test: lines in by feed(), requests out in `sent`."""

    def __init__(self):
        self.lines: asyncio.Queue[bytes] = asyncio.Queue()
        self.sent: list[bytes] = []

    def feed(self, message: dict) -> None:
        self.lines.put_nowait(json.dumps(message).encode() + b"\n")

    async def readline(self) -> bytes:
        return await self.lines.get()

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.lines.put_nowait(b"")

    async def wait_closed(self) -> None:
        pass


async def test_the_client_keeps_the_link_through_lines_it_cannot_read():
    """A newer runner's event kind arrives as `unreadable` with its seq (so the bot acks past it);
    a reply it cannot read fails its own request; neither drops the link."""
    stream = _FedStream()
    client = RunnerClient(stream)
    stream.feed(
        {
            "type": "event",
            "event": {"seq": 5, "goal_id": 2, "ts": "2030-01-01T00:00:00Z", "data": {"kind": "teleported"}},
        }
    )
    event = await anext(client.events())
    assert (event.seq, event.goal_id) == (5, 2) and isinstance(event.data, UnreadableEvent)
    assert event.data.stored_kind == "teleported" and "cannot read" in event.data.reason

    status = asyncio.ensure_future(client.request(p.Status()))
    await eventually(lambda: stream.sent)
    stream.feed({"type": "status", "id": 1, "goals": "not a list"})
    with pytest.raises(p.ProtocolError, match="cannot read"):
        await status
    stream.feed({"type": "hologram"})  # no id, no event: logged and left
    done = asyncio.ensure_future(client.request(p.Ack(seq=5)))
    await eventually(lambda: len(stream.sent) == 2)
    stream.feed({"type": "done", "id": 2, "message": "acked 5"})
    assert (await done).message == "acked 5"
    await client.close()


async def test_a_failing_subscription_hangs_up_rather_than_going_quiet(start_runner, connect, monkeypatch):
    runner = await start_runner()

    async def broken(*args, **kwargs):
        raise RuntimeError("the disk is on fire")

    monkeypatch.setattr(runner.store, "events_since", broken)
    monkeypatch.setattr(runner.store, "stored_events_since", broken)  # (what a batched replay reads)
    client = await connect(runner)
    await client.subscribe(since=0)
    with pytest.raises(RunnerUnavailable):  # the bot reconnects on this, rather than waiting forever
        await asyncio.wait_for(anext(client.events()), 10)


async def test_requests_sent_before_a_half_close_are_still_answered(start_runner, tmp_path):
    """A client that sends its requests and then its EOF (a half-close, as `goaltender runner
    attach < requests.jsonl` does) gets every answer before the runner closes the connection: over
    a bare socket, and through the attach bridge reading a regular file (not a pipe)."""
    runner = await start_runner()
    hello = {"type": "hello", "id": 1, "version": p.PROTOCOL_VERSION, "client": "batch"}
    requests = b"".join(json.dumps(m).encode() + b"\n" for m in (hello, {"type": "status", "id": 2}))

    reader, writer = await asyncio.open_unix_connection(str(runner.settings.socket_path))
    writer.write(requests)
    writer.write_eof()
    replies = [json.loads(line) for line in (await asyncio.wait_for(reader.read(), 30)).splitlines()]
    assert [(r["id"], r["type"]) for r in replies] == [(1, "welcome"), (2, "status")]
    writer.close()

    (tmp_path / "requests.jsonl").write_bytes(requests)
    with open(tmp_path / "requests.jsonl", "rb") as stdin:
        bridge = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "goaltender.runner.attach", "--socket", str(runner.settings.socket_path),
            stdin=stdin, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(bridge.communicate(), 60)
    assert bridge.returncode == 0
    assert [json.loads(line)["type"] for line in out.splitlines()] == ["welcome", "status"]
