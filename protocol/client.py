"""A small asyncio client for the runner protocol, over any line stream.

    async with await RunnerClient.connect_unix(path, client="bot") as runner:
        reply = await runner.request(p.Status(goal_id=3))
        head = await runner.subscribe(since=0)
        async for event in runner.events():
            ...

The transport is a `LineStream`: a local Unix socket here (`SocketStream`), an SSH channel for a
remote runner (goaltender.bot.transports).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from pydantic import ValidationError

from goaltender.protocol import messages as p
from goaltender.protocol import versions, wire
from goaltender.protocol.quick_client import RunnerUnavailable as RunnerUnavailable
from goaltender.protocol.quick_client import socket_from_env as socket_from_env
from goaltender.protocol.quick_client import unix_address as unix_address
from goaltender.protocol.quick_client import unreachable
from goaltender.storage.records import Event, MetricPoint, UnreadableEvent, utcnow

R = TypeVar("R", bound=p.Reply)
# A raw log fetch's chunk: big enough that a request's own cost is small beside its bytes, small
# enough that the buffers it passes through are reused rather than paged in afresh each time.
RAW_LOG_CHUNK = 2 * 1024 * 1024
_READ_PIECE = 256 * 1024  # bytes: SocketStream.readexactly of more takes them as they come
log = logging.getLogger("goaltender.client")


class LineWriter(Protocol):
    """Where protocol lines go: `write()` buffers bytes, `drain()` waits until they are sent."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class LineStream(LineWriter, Protocol):
    """A two-way line stream to the runner, all RunnerClient needs of its transport.

    `readline()` returns one whole line, newline included, or b"" at EOF; it raises ConnectionError
    or OSError when the link is lost and ValueError for a line longer than protocol.MAX_LINE.
    `readexactly(n)` returns the next n bytes (those a raw log reply says follow its line), or
    raises ConnectionError when the link ends first. `close()` starts closing the stream (and
    whatever carries it); `wait_closed()` finishes."""

    async def readline(self) -> bytes: ...

    async def readexactly(self, n: int) -> bytes | bytearray: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


class SocketStream:
    """A LineStream over asyncio's (StreamReader, StreamWriter) pair, e.g. a local Unix socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open_unix(cls, path: str | Path) -> SocketStream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            with unix_address(Path(path)) as address:
                await asyncio.get_running_loop().sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=p.MAX_LINE)
        return cls(reader, writer)

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes | bytearray:
        """The next n bytes, taken as they come into one buffer: asyncio's readexactly would first
        gather all n in the reader's buffer (megabytes for a log chunk) and then copy them out."""
        if n <= _READ_PIECE:
            try:
                return await self._reader.readexactly(n)
            except asyncio.IncompleteReadError as exc:
                got = len(exc.partial)
        else:
            received = bytearray(n)
            view, got = memoryview(received), 0
            while got < n and (piece := await self._reader.read(min(n - got, _READ_PIECE))):
                view[got : got + len(piece)] = piece
                got += len(piece)
            if got == n:
                return received  # not copied again into bytes
        raise ConnectionError(f"the link ended {n - got} bytes into a raw reply")

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()

    async def wait_closed(self) -> None:
        await self._writer.wait_closed()


class RunnerClient:
    """One connection to a runner: requests with their replies, and the events it pushes."""

    def __init__(self, stream: LineStream):
        self._stream = stream
        self._ids = itertools.count(1)
        self._pending: dict[p.RequestId, asyncio.Future[p.AnyReply]] = {}
        # An `events` line waits here as it came, and is read into models as events() reaches it.
        self._events: asyncio.Queue[p.EventMessage | p.EventBatch | bytes | Exception] = asyncio.Queue()
        self._batch: collections.deque[Event] = collections.deque()  # the rest of the batch being read
        self._batches: bool | None = None  # does the runner send batches? None: not asked yet
        self._raw_logs: bool | None = None  # does it send raw log chunks? None: not asked yet
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._reader_task = asyncio.ensure_future(self._read_loop())
        self.runner_name: str | None = None
        self.runner_id: str | None = None  # the runner's identity (None from a runner that predates it)
        self.protocol_version: int | None = None  # the version this connection speaks, once welcomed
        self._statuses: bool | None = None  # does the runner push statuses? None: not asked yet
        #: goal id -> (the last seq its status covers, the status): what `statuses` messages pushed.
        self.pushed: dict[int, tuple[int, p.GoalStatus]] = {}

    @classmethod
    async def connect_unix(cls, path: str | Path, client: str = "cli") -> RunnerClient:
        try:
            stream = await SocketStream.open_unix(path)
        except (FileNotFoundError, ConnectionRefusedError, PermissionError) as exc:
            raise unreachable(path, exc) from exc
        runner = cls(stream)
        try:
            return await runner.hello(client)
        except BaseException:
            await runner.close()
            raise

    async def hello(self, client: str) -> RunnerClient:
        """Say hello: at the newest protocol version both speak (protocol/versions.py), asking for
        the runner's identity. A runner that predates a field of the hello (`identity`, `oldest`)
        refuses it, and is asked again without; one sharing no version raises ProtocolError
        (`version_mismatch`) with the line naming what to upgrade."""
        oldest = versions.OLDEST_PROTOCOL_VERSION
        fields: dict[str, Any] = {"version": p.PROTOCOL_VERSION, "client": client, "identity": True}
        if oldest < p.PROTOCOL_VERSION:
            fields["oldest"] = oldest
        while True:
            try:
                welcome = await self.request(p.Hello(**fields))
                break
            except p.ProtocolError as exc:
                fields = _hello_again(fields, exc, client)
        if not versions.OLDEST_PROTOCOL_VERSION <= welcome.version <= p.PROTOCOL_VERSION:
            raise _mismatch(welcome.version, client, p.PROTOCOL_VERSION)
        self.protocol_version = welcome.version
        self.runner_name = welcome.runner
        self.runner_id = welcome.runner_id
        return self

    async def __aenter__(self) -> RunnerClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        self._reader_task.cancel()
        with contextlib.suppress(Exception):
            self._stream.close()
            await self._stream.wait_closed()

    async def request(self, request: p.Request[R], expect: type[R] | None = None) -> R:
        """Send one request (numbered here, when built without an id) and wait for its reply, the request's `reply_type`
        (mypy knows it: `await runner.request(p.Stop(goal_id=3))` is a p.Done). An `error` reply,
        or a reply of another type, raises ProtocolError."""
        request = self._numbered(request)
        future: asyncio.Future[p.AnyReply] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = future
        try:
            await self._send(request)
            reply = await future
        finally:
            self._pending.pop(request.id, None)
        return _expected(reply, expect or _reply_type(request))

    async def request_many(self, requests: Sequence[p.Request[R]]) -> list[R]:
        """Send every request without waiting between them, then return their replies in order:
        one round trip for all. The first `error` reply raises ProtocolError (the runner still
        answered the rest; each was handled on its own)."""
        requests = [self._numbered(request) for request in requests]
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[p.AnyReply]] = []
        for request in requests:
            futures.append(future := loop.create_future())
            self._pending[request.id] = future
        try:
            await self._send_lines(b"".join(p.encode(request) for request in requests))
            replies = await asyncio.gather(*futures)
        finally:
            for request in requests:
                self._pending.pop(request.id, None)
        return [
            _expected(reply, _reply_type(request)) for reply, request in zip(replies, requests, strict=True)
        ]

    def _numbered(self, request: p.Request[R]) -> p.Request[R]:
        """A request built to be sent (id 0, Request.__init__) gets the next id; one with an id of
        its own (call(), a test's hand-made line) keeps it."""
        return request.model_copy(update={"id": next(self._ids)}) if request.id == 0 else request

    async def subscribe(
        self, since: int = 0, goal_id: int | None = None, *, batch: bool = True, statuses: bool = False
    ) -> int:
        """Ask for events with seq > since (of one goal, or all); returns the newest seq right now.
        Then iterate `events()`: the backlog first, oldest first, then live events. With `batch`
        the runner sends many events a line; with `statuses`, the status of each goal whose card
        the events change comes before them (`pushed_status`). A runner too old for either
        field is asked again without it."""
        asked = {
            "batch": batch and self._batches is not False,
            "statuses": statuses and self._statuses is not False,
        }
        while True:
            try:
                reply = await self.request(p.Subscribe(since=since, goal_id=goal_id, **asked))
                break
            except p.ProtocolError as exc:  # an older runner: a field it does not know
                unknown = next((name for name, on in asked.items() if on and name in exc.error.message), None)
                if exc.error.code != "bad_request" or unknown is None:
                    raise
                asked[unknown] = False
                if unknown == "batch":
                    self._batches = False
                else:
                    self._statuses = False
        if asked["batch"]:
            self._batches = True
        if asked["statuses"]:
            self._statuses = True
        return reply.head

    def pushed_status(self, goal_id: int, seq: int) -> p.GoalStatus | None:
        """The goal's status as the runner pushed it, when it covers event `seq`; else None."""
        through, status = self.pushed.get(goal_id, (-1, None))
        return status if through >= seq else None

    async def events(self) -> AsyncIterator[Event]:
        """Subscribed events, one at a time, until the link drops (then RunnerUnavailable). An event
        is taken as it is yielded: leaving the loop and calling events() again goes on from the next."""
        while True:
            while self._batch:
                yield self._batch.popleft()
            message = await self._events.get()
            if isinstance(message, Exception):
                self._events.put_nowait(message)  # stay closed for any later reader
                raise message
            if isinstance(message, bytes):
                self._batch.extend(p.batch_events(message))
            elif isinstance(message, p.EventBatch):
                self._batch.extend(message.events)
            else:
                yield message.event

    async def fetch_log(
        self,
        experiment_id: int,
        offset: int = 0,
        *,
        chunk: int | None = None,
        depth: int = 2,
        raw: bool = True,
    ) -> AsyncIterator[p.LogReply]:
        """An experiment's log from `offset`, chunk by chunk, in order, to its end: `depth` requests
        in flight at once (the runner tiles the file into chunks that start and end on a character,
        whatever offsets are asked for, so the next chunk is asked for before this one arrives). The
        first chunk is asked for alone: a refusal (not_found, forbidden) is then one request, not
        `depth`. With `raw` the chunks come as bytes after their reply lines (GetLog.raw),
        RAW_LOG_CHUNK each by default, unless the runner is too old for that: then as JSON text, up
        to MAX_LOG_CHUNK."""
        if raw and self._raw_logs is not False:
            try:
                async for reply in self._fetch_log(
                    experiment_id, offset, chunk or RAW_LOG_CHUNK, depth, True
                ):
                    self._raw_logs = True
                    yield reply
                return
            except p.ProtocolError as exc:  # an older runner: `raw` is a field it does not know
                if self._raw_logs or exc.error.code != "bad_request" or "raw" not in exc.error.message:
                    raise
                self._raw_logs = False
        size = min(chunk or p.MAX_LOG_CHUNK, p.MAX_LOG_CHUNK)
        async for reply in self._fetch_log(experiment_id, offset, size, depth, False):
            yield reply

    async def _fetch_log(
        self, experiment_id: int, offset: int, size: int, depth: int, raw: bool
    ) -> AsyncIterator[p.LogReply]:
        loop = asyncio.get_running_loop()
        inflight: collections.deque[tuple[p.RequestId, asyncio.Future[p.AnyReply]]] = collections.deque()
        ask, answered = offset, False
        try:
            while True:
                requests: list[p.GetLog] = []
                while len(inflight) + len(requests) < (depth if answered else 1):
                    requests.append(
                        p.GetLog(
                            id=next(self._ids), experiment_id=experiment_id, offset=ask, limit=size, raw=raw
                        )
                    )
                    ask += size
                for request in requests:
                    inflight.append((request.id, future := loop.create_future()))
                    self._pending[request.id] = future
                if requests:
                    await self._send_lines(b"".join(p.encode(request) for request in requests))
                request_id, future = inflight.popleft()
                try:
                    reply = _expected(await future, p.LogReply)
                finally:
                    self._pending.pop(request_id, None)
                answered = True
                yield reply
                if reply.eof:
                    return
        finally:
            for request_id, future in inflight:  # asked for past the end: their replies are dropped
                self._pending.pop(request_id, None)
                future.cancel()

    async def _send(self, message: p.Message) -> None:
        await self._send_lines(p.encode(message))

    async def _send_lines(self, data: bytes) -> None:
        if self._closed or self._reader_task.done():
            raise RunnerUnavailable("the connection to the runner is closed")
        async with self._write_lock:
            try:
                self._stream.write(data)
                await self._stream.drain()
            except (ConnectionError, OSError) as exc:
                raise RunnerUnavailable(f"lost the runner: {exc}") from exc

    async def _read_loop(self) -> None:
        error: Exception = RunnerUnavailable("the runner closed the connection")
        said: p.Error | None = None  # an error that answered no id, last thing before a hang-up: why
        try:
            while line := await self._stream.readline():
                if line.startswith(p.EVENT_BATCH_PREFIX):  # read when events() comes to it
                    self._events.put_nowait(line)
                    continue
                try:
                    reply = p.parse_reply(line)
                except ValidationError as exc:
                    if _raw_log_reply(line):  # bytes follow it, how many this client cannot tell
                        raise ValueError(f"a raw log reply this client cannot read: {exc}") from exc
                    if (salvaged := _salvage(line, exc)) is None:
                        log.warning("ignored a line from the runner this client cannot read: %s", exc)
                        continue
                    reply = salvaged
                if isinstance(reply, p.EventMessage | p.EventBatch):
                    self._events.put_nowait(reply)
                    continue
                if isinstance(reply, p.Statuses):  # before the events it covers: kept for them
                    self.pushed.update((status.goal.id, (reply.through, status)) for status in reply.goals)
                    continue
                if isinstance(reply, p.LogReply) and reply.raw_bytes is not None:  # its chunk follows
                    reply._chunk = await self._stream.readexactly(reply.raw_bytes)
                # An error about a line that was no request (bad JSON, say) answers no id; so does
                # a connection turned away (too many open), as the runner hangs up.
                said = reply if isinstance(reply, p.Error) and reply.id is None else None
                future = self._pending.get(reply.id) if reply.id is not None else None
                if future is not None and not future.done():
                    future.set_result(reply)
        except (ConnectionError, OSError, ValueError) as exc:
            error = RunnerUnavailable(f"lost the runner: {exc}")
        finally:
            for future in self._pending.values():
                if future.done():
                    continue
                if said is not None:
                    future.set_result(said)  # the caller's ProtocolError, in the runner's words
                else:
                    future.set_exception(error)
            self._events.put_nowait(error)  # why the link dropped reaches events() readers too


def _reply_type(request: p.Request[R]) -> type[R]:
    return cast("type[R]", type(request).reply_type)  # what Request[R] says, kept by the class


def _expected(reply: p.AnyReply, expect: type[R]) -> R:
    """`reply` when it is an `expect`; an `error` reply (or any other) raises ProtocolError."""
    if isinstance(reply, p.Error):
        raise p.ProtocolError(reply)
    if not isinstance(reply, expect):
        raise p.ProtocolError(
            p.Error(code="internal", message=f"expected {expect.__name__}, got {reply.type}")
        )
    return reply


class MetricBuffer:
    """Metric points for one goal, sent in batches: when MAX_POINTS have gathered, when the oldest
    has waited `max_delay` seconds (checked as points are added), and on flush() or exit.

        async with MetricBuffer(runner, goal_id) as metrics:
            for step in ...:
                await metrics.add("loss", loss, step)

    A step-by-step logger sends one request per batch instead of one per point (issue 13)."""

    def __init__(
        self,
        runner: RunnerClient,
        goal_id: int,
        *,
        experiment_id: int | None = None,
        max_points: int = p.MAX_POINTS,
        max_delay: float = 1.0,
    ):
        self.runner = runner
        self.goal_id = goal_id
        self.experiment_id = experiment_id
        self.max_points = min(max_points, p.MAX_POINTS)
        self.max_delay = max_delay
        self._points: list[MetricPoint] = []
        self._oldest = 0.0

    async def add(self, name: str, value: float, step: float | None = None) -> None:
        if not self._points:
            self._oldest = time.monotonic()
        self._points.append(MetricPoint(name=name, value=value, step=step))
        if len(self._points) >= self.max_points or time.monotonic() - self._oldest >= self.max_delay:
            await self.flush()

    async def flush(self) -> None:
        points, self._points = self._points, []
        if points:
            await self.runner.request(
                p.LogMetrics(goal_id=self.goal_id, points=points, experiment_id=self.experiment_id)
            )

    async def __aenter__(self) -> MetricBuffer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush()


def _raw_log_reply(line: bytes) -> bool:
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and raw.get("type") == "log" and "raw_bytes" in raw


def _salvage(line: bytes, exc: ValidationError) -> p.EventMessage | p.Error | None:
    """What can be kept of a line this client cannot read (a newer runner's event kind, say): an
    event becomes an UnreadableEvent with its seq, so a subscriber acks past it instead of
    reconnecting to fail on it again; a reply becomes an error for the request it answers."""
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    reason = f"this client cannot read it: {exc.errors(include_url=False)[0]['msg']}"
    if raw.get("type") == "event" and isinstance(event := raw.get("event"), dict):
        return _unreadable_event(event, reason)
    if (request_id := wire.safe_id(raw.get("id"))) is not None:
        return p.Error(id=request_id, code="internal", message=f"a {raw.get('type')!r} reply: {reason}")
    return None


def _unreadable_event(event: dict, reason: str) -> p.EventMessage | None:
    seq, goal_id, data = event.get("seq"), event.get("goal_id"), event.get("data")
    if not isinstance(seq, int) or isinstance(seq, bool):
        return None
    kind = data.get("kind") if isinstance(data, dict) else None
    try:
        ts = datetime.fromisoformat(event["ts"])
    except (KeyError, TypeError, ValueError):
        ts = utcnow()
    return p.EventMessage(
        event=Event(
            seq=seq,
            goal_id=goal_id if isinstance(goal_id, int) and not isinstance(goal_id, bool) else None,
            ts=ts,
            data=UnreadableEvent(stored_kind=str(kind), reason=reason),
        )
    )


def _hello_again(fields: dict[str, Any], refused: p.ProtocolError, client: str) -> dict[str, Any]:
    """The hello to send after `refused`, or raise: a field an older runner does not know is left
    off (`oldest`: then the version asked is the oldest this client speaks), and a runner from
    before versions were negotiated is asked at the version it speaks, if this client speaks it."""
    error = refused.error
    if error.code == "bad_request":
        for field in ("oldest", "identity"):
            if field in fields and field in error.message:
                again = {name: value for name, value in fields.items() if name != field}
                if field == "oldest":
                    again["version"] = fields["oldest"]
                return again
    if (
        error.code == "version_mismatch"
        and (theirs := versions.older_runner_version(error.message)) is not None
    ):
        ours = (p.PROTOCOL_VERSION, versions.OLDEST_PROTOCOL_VERSION)
        if theirs != fields["version"] and versions.agreed(theirs, theirs, *ours) is not None:
            return {name: value for name, value in fields.items() if name != "oldest"} | {"version": theirs}
        raise _mismatch(theirs, client, p.PROTOCOL_VERSION) from None
    raise refused


def _mismatch(runner_version: int, client: str, client_version: int) -> p.ProtocolError:
    message = versions.mismatch(runner_version, client, client_version)
    return p.ProtocolError(p.Error(code="version_mismatch", message=message))
