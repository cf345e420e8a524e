"""Issue 13: a subscriber's backlog comes many events a line (`events`), built from the stored JSON
and still redacted; an older client, which does not ask for batches, gets one `event` a line; a
consumer that fails mid-batch resumes from what it acked. And `goaltender log`'s pipelined fetch
returns the file's bytes, redacted."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest
from helpers import eventually
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goaltender.bot.links import RunnerLink
from goaltender.bot.transports import RunnerTarget
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable, SocketStream
from goaltender.storage.records import Budget, Event, MilestoneReported
from goaltender.storage.runner_store import INSERT_EVENT

SECRET = "planted-replay-secret-7f3a9c"


async def add_milestones(runner, count: int, text: str = "") -> None:
    for start in range(0, count, 500):
        async with runner.store.db.write() as tx:
            await tx.run_many(
                INSERT_EVENT,
                [
                    (
                        None,
                        "2030-01-01T00:00:00+00:00",
                        "milestone",
                        MilestoneReported(title=f"m {i}", text=text).model_dump_json(),
                    )
                    for i in range(start, min(count, start + 500))
                ],
            )


async def raw_lines(runner, subscribe: dict, until_seq: int) -> list[dict]:
    """Every message a bare socket client gets after hello and `subscribe`, until event `until_seq`."""
    reader, writer = await asyncio.open_unix_connection(str(runner.settings.socket_path), limit=p.MAX_LINE)
    try:
        hello = {"type": "hello", "id": 1, "version": p.PROTOCOL_VERSION, "client": "raw"}
        writer.write(json.dumps(hello).encode() + b"\n" + json.dumps({"id": 2, **subscribe}).encode() + b"\n")
        await writer.drain()
        received: list[dict] = []
        seen = 0
        while seen < until_seq:
            line = await asyncio.wait_for(reader.readline(), 30)
            assert line, "the runner hung up"
            received.append(message := json.loads(line))
            events = message.get("events") or ([message["event"]] if "event" in message else [])
            seen = max([seen, *(event["seq"] for event in events)])
        return received
    finally:
        writer.close()


async def test_a_long_replay_arrives_whole_and_in_order_in_batches(start_runner, connect):
    runner = await start_runner()
    await add_milestones(runner, 5000, text="y" * 100)
    head = await runner.store.head_seq()

    lines = await raw_lines(runner, {"type": "subscribe", "since": 0, "batch": True}, head)
    batches = [line for line in lines if line["type"] == "events"]
    assert [line["type"] for line in lines[:2]] == ["welcome", "subscribed"]
    assert len(lines) == 2 + len(batches) and 1 < len(batches) < 50  # thousands of events a line
    assert [event["seq"] for batch in batches for event in batch["events"]] == list(range(1, head + 1))

    client = await connect(runner)
    assert await client.subscribe(since=10) == head
    seen: list[Event] = []
    async for event in client.events():
        seen.append(event)
        if event.seq == head:
            break
    assert [event.seq for event in seen] == list(range(11, head + 1))
    assert seen[0].data == MilestoneReported(title="m 10", text="y" * 100)
    # Live events keep coming after the backlog.
    live = await runner.store.append_event(None, MilestoneReported(title="live"))
    assert await asyncio.wait_for(anext(client.events()), 10) == live


async def test_a_secret_in_a_stored_event_is_redacted_in_a_batched_replay(start_runner, monkeypatch):
    monkeypatch.setenv("REPLAY_API_TOKEN", SECRET)
    runner = await start_runner()
    await add_milestones(runner, 3000, text="z" * 50)
    await runner.store.append_event(None, MilestoneReported(title="leak", text=f"the key is {SECRET}!"))
    await add_milestones(runner, 10)
    head = await runner.store.head_seq()

    lines = await raw_lines(runner, {"type": "subscribe", "since": 0, "batch": True}, head)
    received = json.dumps(lines)
    assert SECRET not in received and SECRET[:12] not in received
    events = [event for line in lines if line["type"] == "events" for event in line["events"]]
    assert [event["seq"] for event in events] == list(range(1, head + 1))
    [leak] = [event for event in events if event["data"]["title"] == "leak"]
    assert leak["data"]["text"] == "the key is [redacted:REPLAY_API_TOKEN]!"


async def test_an_older_client_without_batches_gets_one_event_a_line(start_runner):
    runner = await start_runner()
    await add_milestones(runner, 300)
    lines = await raw_lines(runner, {"type": "subscribe", "since": 0}, 300)  # no `batch`: as before
    assert [line["type"] for line in lines] == ["welcome", "subscribed"] + ["event"] * 300
    assert [line["event"]["seq"] for line in lines[2:]] == list(range(1, 301))


async def test_a_client_falls_back_to_single_events_on_a_runner_without_batches(
    start_runner, connect, monkeypatch
):
    """An older runner refuses `batch` (an unknown field): the client asks again without it."""
    runner = await start_runner()
    await add_milestones(runner, 20)
    original = p.Subscribe.model_validate

    def older_runner(raw, *args, **kwargs):
        if isinstance(raw, dict) and "batch" in raw:
            raise p.ValidationError.from_exception_data(
                "Subscribe", [{"type": "extra_forbidden", "loc": ("batch",), "input": raw["batch"]}]
            )
        return original(raw, *args, **kwargs)

    monkeypatch.setattr(p.Subscribe, "model_validate", older_runner)
    client = await connect(runner)
    assert await client.subscribe(since=0) == 20
    seqs = []
    async for event in client.events():
        seqs.append(event.seq)
        if event.seq == 20:
            break
    assert seqs == list(range(1, 21)) and client._batches is False


async def test_a_consumer_that_fails_mid_batch_resumes_from_its_ack_without_loss(start_runner):
    """The bot's link acks only what its callback stored: a failure in the middle of a batch drops
    the link, and the next session starts right after the last event stored, losing none."""
    runner = await start_runner()
    await add_milestones(runner, 4000)
    head = await runner.store.head_seq()
    stored: list[int] = []
    failed = []

    async def on_event(name: str, event: Event) -> None:
        if event.seq == 1234 and not failed:
            failed.append(event.seq)
            raise RuntimeError("the bot's disk hiccuped")
        stored.append(event.seq)

    async def load_cursor(name: str) -> int:
        return stored[-1] if stored else 0

    link = RunnerLink(
        RunnerTarget(name="gpu", socket=runner.settings.socket_path),
        on_event=on_event,
        load_cursor=load_cursor,
        client_name="bot",
        backoff_base=0.01,
    )
    running = asyncio.ensure_future(link.run())
    try:
        await eventually(lambda: stored and stored[-1] == head)
        assert failed == [1234] and link.connects == 2
        assert stored == list(range(1, head + 1))  # each event once, in order, none skipped

        async def acked_to_the_end() -> bool:
            return await runner.store.cursor("bot") == head

        await eventually(acked_to_the_end)
    finally:
        link.stop()
        await asyncio.wait_for(running, 10)


LOG_TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from("\n abc"), max_size=3000
)


async def test_a_pipelined_log_fetch_returns_the_file(start_runner, connect, tmp_path, monkeypatch):
    """Whatever the log holds (any characters, chunks cut anywhere), the pipelined fetch returns
    its bytes exactly; a planted secret never arrives, wherever the chunks cut it."""
    monkeypatch.setenv("LOG_API_TOKEN", SECRET)
    runner = await start_runner()
    log = tmp_path / "run.log"
    log.touch()
    now = "2030-01-01T00:00:00+00:00"
    async with runner.store.db.write() as tx:
        goal_id = await tx.insert(
            "INSERT INTO goals (text, owner, agent, state, budget, metric, direction, target, workspace, "
            "created_at, accepted_at) VALUES ('log', 't', 'none', 'running', ?, 'acc', 'maximize', NULL, ?, ?, ?)",
            (Budget().model_dump_json(), str(tmp_path), now, now),
        )
        experiment_id = await tx.insert(
            "INSERT INTO experiments (goal_id, idx, description, command, params, status, metric_name, "
            "started_at, log_path) VALUES (?, 1, 'fetch me', '[\"true\"]', '{}', 'running', 'acc', ?, ?)",
            (goal_id, now, str(log)),
        )
    client = await connect(runner)

    async def fetch(chunk: int, depth: int, offset: int = 0, raw: bool = True) -> str:
        replies = client.fetch_log(experiment_id, offset, chunk=chunk, depth=depth, raw=raw)
        return b"".join([reply.data async for reply in replies]).decode()

    loop = asyncio.get_running_loop()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        text=LOG_TEXT,
        chunk=st.integers(1, 700),
        depth=st.integers(1, 6),
        plant=st.none() | st.integers(0, 3000),
        raw=st.booleans(),
    )
    def fetched_exactly(text: str, chunk: int, depth: int, plant: int | None, raw: bool) -> None:
        if plant is not None:
            text = text[:plant] + SECRET + text[plant:]
            chunk += 64  # a secret is caught whole, or by its pieces at a chunk's edges: not in thirds
        log.write_bytes(text.encode())
        got = asyncio.run_coroutine_threadsafe(fetch(chunk, depth, raw=raw), loop).result(30)
        if plant is None:
            assert got.encode() == text.encode()
        else:
            assert SECRET not in got

    await asyncio.to_thread(fetched_exactly)
    log.write_bytes("é".encode() * 100_000 + b"end")  # two bytes a character, a chunk cuts one in two
    assert await fetch(p.MAX_LOG_CHUNK, 4) == "é" * 100_000 + "end"
    assert await fetch(p.MAX_LOG_CHUNK, 4, raw=False) == "é" * 100_000 + "end"
    assert await fetch(1001, 3, offset=1) == "é" * 99_999 + "end"  # from inside a character: the next


@pytest.mark.parametrize("size", [100, 3 * 256 * 1024 + 5])
async def test_a_raw_chunk_is_read_whole_over_a_socket_or_the_loss_says_how_much_was_missing(size):
    """SocketStream.readexactly, as the client reads a raw reply's bytes from a Unix socket: a
    chunk past its piece size (taken as it comes into one buffer) or within it (asyncio's own read)
    is exactly the bytes sent, the next line is intact, and a link that ends inside a chunk is a
    ConnectionError that says how many bytes never came."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair(socket.AF_UNIX)
    theirs.setblocking(False)
    reader, writer = await asyncio.open_unix_connection(sock=ours, limit=p.MAX_LINE)
    stream = SocketStream(reader, writer)
    data = os.urandom(size)
    sending = asyncio.ensure_future(loop.sock_sendall(theirs, data + b"next line\n" + data[: size // 2]))
    assert await stream.readexactly(size) == data
    assert await stream.readline() == b"next line\n"
    await sending
    theirs.close()
    with pytest.raises(ConnectionError, match=f"the link ended {size - size // 2} bytes into a raw reply"):
        await stream.readexactly(size)
    stream.close()


class _ByteStream:
    """A LineStream whose runner side is this test: bytes in by feed() (lines, and what follows a
    raw reply), requests out in `sent`."""

    def __init__(self):
        self.reader = asyncio.StreamReader(limit=p.MAX_LINE)
        self.sent: list[dict] = []

    def feed(self, message: dict, after: bytes = b"") -> None:
        self.reader.feed_data(json.dumps(message).encode() + b"\n" + after)

    async def readline(self) -> bytes:
        return await self.reader.readline()

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self.reader.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionError("cut short") from exc

    def write(self, data: bytes) -> None:
        self.sent.extend(json.loads(line) for line in data.splitlines())

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.reader.feed_eof()

    async def wait_closed(self) -> None:
        pass


def _log_reply(request: dict, data: bytes, *, raw: bool) -> tuple[dict, bytes]:
    reply = {"type": "log", "id": request["id"], "offset": request["offset"], "eof": True}
    reply["next_offset"] = request["offset"] + len(data)
    if raw:
        return reply | {"text": "", "raw_bytes": len(data)}, data
    return reply | {"text": data.decode()}, b""


async def test_a_runner_older_than_raw_logs_gets_json_text(tmp_path):
    """A runner that predates GetLog.raw refuses the field: the client asks again without it, as
    JSON text in chunks a line can hold, and asks that runner so from then on."""
    stream = _ByteStream()
    client = RunnerClient(stream)
    refusal = "invalid get_log: raw: Extra inputs are not permitted; limit: Input should be <= 524288"
    for attempt in range(2):
        fetched = asyncio.ensure_future(_fetch_all(client))
        if attempt == 0:
            await eventually(lambda: len(stream.sent) == 1)
            assert stream.sent[0]["raw"] is True and stream.sent[0]["limit"] > p.MAX_LOG_CHUNK
            stream.feed(
                {"type": "error", "id": stream.sent[0]["id"], "code": "bad_request", "message": refusal}
            )
        asked = 2 + attempt
        await eventually(lambda: len(stream.sent) == asked)  # noqa: B023 (awaited before the next)
        again = stream.sent[-1]
        assert "raw" not in again and again["limit"] == p.MAX_LOG_CHUNK  # the very line it knows
        stream.feed(*_log_reply(again, "naïve ✓\n".encode(), raw=False))
        assert await fetched == "naïve ✓\n".encode()
    await client.close()


async def _fetch_all(client: RunnerClient) -> bytes:
    return b"".join([reply.data async for reply in client.fetch_log(7)])


@pytest.mark.parametrize("how", ["count out of bounds", "link ends inside the bytes"])
async def test_a_raw_reply_the_client_cannot_follow_drops_the_link(how):
    """The bytes after a raw reply are not lines: a reply whose count cannot be read, or a link
    that ends inside its bytes, loses the link rather than reading the chunk as replies."""
    stream = _ByteStream()
    client = RunnerClient(stream)
    fetched = asyncio.ensure_future(_fetch_all(client))
    await eventually(lambda: stream.sent)
    reply, data = _log_reply(stream.sent[0], b'{"type":"done","id":2,"message":"forged"}\n', raw=True)
    if how == "count out of bounds":
        stream.feed(reply | {"raw_bytes": p.MAX_RAW_BYTES + 1}, data)
    else:
        stream.feed(reply | {"raw_bytes": len(data) + 10}, data)
        stream.close()
    with pytest.raises(RunnerUnavailable, match="lost the runner"):
        await fetched
    await client.close()
