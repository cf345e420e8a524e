"""The runner's Unix sockets (mode 0600, in 0700 directories): connections, who is on each, the
hello handshake, the event stream.

Two kinds of socket, and so two kinds of principal (runner/trust.py): the operator socket, where
the peer's uid must be an operator's, and one socket per running goal, the capability of that
goal's agent and experiments, which may use the agent verbs on that goal and nothing else. A
request a connection's principal may not make gets an `error` with code `forbidden`, is written to
the audit trail as refused, and changes nothing; every control request is written there with its
outcome (runner/audit.py).

A connection reads lines capped at MAX_LINE and must open with `hello`. Every line gets exactly one
reply; a line over MAX_LINE gets a last `error` (line_too_long) and the connection is closed.
Three requests belong to the connection itself: `hello`, `subscribe` (stream the event log from a
position, woken by each commit; a stream that fails hangs up, so its client resubscribes) and
`ack` (the client's durable position, kept under its name). Every other request goes
to its handler in the table the runner gives (runner/daemon.py says what each one does), with the
connection's principal; a handler raises Refused to answer with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from goaltender.protocol import messages as p
from goaltender.protocol import versions
from goaltender.protocol.client import SocketStream, unix_address
from goaltender.runner.audit import AuditTrail, is_control
from goaltender.runner.operators import Operators
from goaltender.runner.secrets import Redactor
from goaltender.runner.trust import Principal, agent_refusal, hello_refusal, peer_uid, scoped
from goaltender.storage.db import DatabaseLost
from goaltender.storage.records import Event, UnreadableEvent
from goaltender.storage.runner_rows import stored_events_json
from goaltender.storage.runner_store import RunnerStore

log = logging.getLogger("goaltender.runner")
MISMATCHES_LOGGED = 100  # distinct (client, version) hellos refused and logged; client names are anyone's
STREAM_BATCH = 2000  # events read from the log per query when streaming to a subscriber
ANSWER_AFTER_EOF_S = 30.0  # how long requests in flight when a client stops sending are still answered
RAW_SLICE = 256 * 1024  # bytes of a raw log chunk written at a time (_Connection._send_raw)
# One client's share of the runner: what it may hold open and in flight, so that an agent cannot
# take the descriptors or the memory every other goal and the operators need.
MAX_GOAL_CONNECTIONS = 32  # open on one goal's socket (its agent's and its experiments' clients)
MAX_CONNECTIONS = 1024  # open on all the runner's sockets
MAX_IN_FLIGHT = 8  # requests of one connection being answered: past it, it is not read until one is

# Each handler takes its own request type and who asks; the table is keyed by that type.
Handler = Callable[[Any, Principal], Awaitable[p.Reply]]


class Refused(Exception):
    """A request the runner will not carry out; the client gets an `error` with this code."""

    def __init__(self, code: p.ErrorCode, message: str):
        super().__init__(message)
        self.code = code


class SocketServer:
    def __init__(
        self,
        path: Path,
        runner_name: str,
        store: RunnerStore,
        handlers: Mapping[type[p.Request], Handler],
        redactor: Redactor | None = None,
        operators: Operators | None = None,
    ):
        self.path = path
        self.operators = operators or Operators.parse([])  # default: the runner's own user
        self.audit = AuditTrail(store)
        self._mismatches: set[tuple[str, int]] = set()  # (client, version) hellos refused and logged
        self.redactor = redactor or Redactor()  # token shapes only, unless the runner gives its secrets
        self.runner_name = runner_name
        self.store = store
        self.handlers = handlers
        self.store.on_event = self._wake_subscribers
        self._new_events = asyncio.Event()
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None
        self._agent_servers: dict[int, tuple[asyncio.Server, Path]] = {}  # goal id -> its socket
        #: The status of each of these goals (the runner's reads, set once they exist): what a
        #: `statuses` message carries to a subscriber that asked for it.
        self.statuses_of: Callable[[list[int]], Awaitable[list[p.GoalStatus]]] | None = None

    async def listen(self) -> None:
        """Bind the operator socket; connections wait until start_serving(). Bound before any agent
        starts, so every sandbox is made with the socket in place (and a second runner on the same
        socket stops here, before it touches a goal)."""
        if self.path.exists():
            if await _socket_answers(self.path):
                raise RuntimeError(f"a runner is already serving {self.path}")
            self.path.unlink()
        self._server = await asyncio.start_unix_server(
            self._serve, sock=_bind(self.path), limit=p.MAX_LINE, start_serving=False
        )

    async def start_serving(self) -> None:
        assert self._server is not None, "listen() first"
        await self._server.start_serving()

    async def open_agent_socket(self, goal_id: int, path: Path) -> None:
        """Serve goal `goal_id`'s own socket at `path`: whoever connects there is its agent."""
        self.close_agent_socket(goal_id)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        serve = functools.partial(self._serve, goal_id=goal_id)
        server = await asyncio.start_unix_server(serve, sock=_bind(path), limit=p.MAX_LINE)
        self._agent_servers[goal_id] = (server, path)

    def close_agent_socket(self, goal_id: int) -> None:
        """The goal has ended (or its agent is restarting): its socket goes, and its connections."""
        if (entry := self._agent_servers.pop(goal_id, None)) is None:
            return
        server, path = entry
        server.close()
        for conn in list(self._connections):
            if conn.principal.goal_id == goal_id:
                conn.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    async def serve_forever(self) -> None:
        assert self._server is not None, "listen() first"
        await self._server.serve_forever()

    def close(self) -> None:
        """Stop accepting; hang up on every client (as when the process exits) and drop its work."""
        if self._server is not None:
            self._server.close()
        for goal_id in list(self._agent_servers):
            self.close_agent_socket(goal_id)
        for conn in list(self._connections):
            conn.close()
        for task in self._tasks:
            task.cancel()

    def remove_socket(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _wake_subscribers(self, event: Event) -> None:
        # Each subscriber reads what it has not seen from the log itself.
        waiting, self._new_events = self._new_events, asyncio.Event()
        waiting.set()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, goal_id: int | None = None
    ) -> None:
        conn = _Connection(reader, writer, self.redactor)
        # The principal comes from the socket, never from what the client says.
        conn.principal = (
            Principal(goal_id=goal_id) if goal_id is not None else Principal(uid=peer_uid(writer))
        )
        if refusal := self._crowded(goal_id):
            with contextlib.suppress(ConnectionError):
                await conn.send(p.Error(code="conflict", message=refusal))
            conn.close()
            return
        self._connections.add(conn)
        subscription: asyncio.Task | None = None
        answering: set[asyncio.Task] = set()  # this connection's requests still being answered
        try:
            while True:
                if len(answering) >= MAX_IN_FLIGHT:  # a client not reading its replies is not read
                    await asyncio.wait(answering, return_when=asyncio.FIRST_COMPLETED)
                if (line := await conn.read_line()) is None:
                    break
                if line is _TOO_LONG:
                    await conn.send(p.Error(code="line_too_long", message=_TOO_LONG_MESSAGE))
                    break
                request = p.parse_request(line)
                if isinstance(request, p.Error):
                    await conn.send(request)
                elif isinstance(request, p.Hello):
                    if not await self._hello(request, conn):
                        break  # a foreign uid: hang up
                elif conn.client is None:
                    await conn.send(
                        p.Error(id=request.id, code="handshake_required", message="send hello first")
                    )
                elif refusal := await agent_refusal(conn.principal, request, self.store):
                    await conn.send(p.Error(id=request.id, code="forbidden", message=refusal))
                    await self.audit.refused(conn.principal, request, refusal)
                elif isinstance(request, p.Ack):
                    await self.store.set_cursor(conn.principal.cursor_name(), request.seq)
                    await conn.send(p.Done(id=request.id, message=f"acked {request.seq}"))
                elif isinstance(request, p.Subscribe):
                    request = scoped(conn.principal, request)
                    if subscription is not None:
                        subscription.cancel()
                    subscription = self._spawn(self._stream(conn, request))
                else:
                    answer = self._spawn(self._answer(conn, scoped(conn.principal, request)))
                    answering.add(answer)
                    answer.add_done_callback(answering.discard)
            # The client has finished sending (a half-close: `goaltender runner attach < requests`):
            # what it asked is still answered before the connection closes.
            if answering:
                await asyncio.wait(answering, timeout=ANSWER_AFTER_EOF_S)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if subscription is not None:
                subscription.cancel()
            conn.close()
            self._connections.discard(conn)

    def _crowded(self, goal_id: int | None) -> str | None:
        """Why a new connection (to goal `goal_id`'s socket, or the operators') is turned away, if it is."""
        if len(self._connections) >= MAX_CONNECTIONS:
            return f"the runner has {MAX_CONNECTIONS} connections open, its most; try again when some close"
        if goal_id is not None:
            open_here = sum(conn.principal.goal_id == goal_id for conn in self._connections)
            if open_here >= MAX_GOAL_CONNECTIONS:
                return (
                    f"goal #{goal_id} has {MAX_GOAL_CONNECTIONS} connections to the runner open, its most; "
                    "close some (or finish what they wait for) first"
                )
        return None

    async def _hello(self, hello: p.Hello, conn: _Connection) -> bool:
        """Answer a hello; False when the connection is refused (and is to be closed)."""
        conn.principal = replace(conn.principal, client=hello.client)
        if refusal := hello_refusal(conn.principal, self.operators):
            await conn.send(p.Error(id=hello.id, code="forbidden", message=refusal))
            await self.audit.refused(conn.principal, None, refusal, action="hello")
            return False
        oldest = hello.oldest or hello.version  # a client that names none speaks `version` alone
        version = versions.agreed(hello.version, oldest, p.PROTOCOL_VERSION, versions.OLDEST_PROTOCOL_VERSION)
        if version is None:
            message = versions.mismatch(p.PROTOCOL_VERSION, hello.client, hello.version)
            said = (hello.client, hello.version)
            if said not in self._mismatches and len(self._mismatches) < MISMATCHES_LOGGED:
                self._mismatches.add(said)  # a client retrying every few seconds is said once
                log.warning("refused a hello from %s: %s", hello.client, message)
            await conn.send(p.Error(id=hello.id, code="version_mismatch", message=message))
            return True
        conn.client = hello.client
        runner_id = self.store.runner_id if hello.identity else None
        await conn.send(p.Welcome(id=hello.id, version=version, runner=self.runner_name, runner_id=runner_id))
        return True

    async def _answer(self, conn: _Connection, request: p.Request) -> None:
        try:
            reply = await self.handlers[type(request)](request, conn.principal)
        except DatabaseLost:  # the runner is stopping (runner/daemon.py) and hangs up: no answer
            conn.close()
            return
        except Refused as refused:
            reply = p.Error(id=request.id, code=refused.code, message=str(refused))
        except Exception as exc:  # a bug must not take the daemon down with it
            log.exception("request %s failed", request.type)
            reply = p.Error(id=request.id, code="internal", message=f"{type(exc).__name__}: {exc}")
        reply.id = request.id
        if is_control(request):
            await self.audit.outcome(conn.principal, request, reply)
        with contextlib.suppress(ConnectionError):
            await conn.send(reply)

    async def _stream(self, conn: _Connection, request: p.Subscribe) -> None:
        try:
            await self._stream_events(conn, request)
        except ConnectionError:
            pass
        except Exception:  # a bug: hang up, so the client sees it and resubscribes, never waits forever
            log.exception(
                "subscription of %s since %d failed; closing its connection", conn.client, request.since
            )
            conn.close()

    async def _stream_events(self, conn: _Connection, request: p.Subscribe) -> None:
        await conn.send(p.Subscribed(id=request.id, head=await self.store.log_head(request.goal_id)))
        if request.batch:  # many events a line, from their stored JSON
            await self._stream_batches(conn, request)
            return
        last = request.since
        while True:  # a client that did not ask for batches: one `event` line each
            wake = self._new_events
            events = await self.store.events_since(last, limit=STREAM_BATCH, goal_id=request.goal_id)
            if events:  # a batch goes in one write: a replay is not a drain per event
                changed = [(event.goal_id, event.data.kind) for event in events]
                statuses = await self._statuses(request, events[-1].seq, changed)
                await conn.send_all([*statuses, *(p.EventMessage(event=event) for event in events)])
                last = events[-1].seq
            if len(events) < STREAM_BATCH:  # caught up; `wake` predates the query, so no event is missed
                await wake.wait()

    async def _stream_batches(self, conn: _Connection, request: p.Subscribe) -> None:
        async def read(after: int) -> tuple[asyncio.Event, list]:
            wake = self._new_events  # taken before the query: an event it misses sets `wake`
            return wake, await self.store.stored_events_since(
                after, limit=STREAM_BATCH, goal_id=request.goal_id
            )

        last = request.since
        wake, rows = await read(last)
        while True:
            # A full read has more behind it: the next is read (in SQLite's thread) while this is sent.
            ahead = asyncio.ensure_future(read(rows[-1]["seq"])) if len(rows) == STREAM_BATCH else None
            try:
                if rows:
                    changed = [(row["goal_id"], bytes(row["kind"]).decode(errors="replace")) for row in rows]
                    if statuses := await self._statuses(request, rows[-1]["seq"], changed):
                        await conn.send_all(statuses)
                    await conn.send_events(stored_events_json(rows))
                    last = rows[-1]["seq"]
            except BaseException:
                if ahead is not None:
                    ahead.cancel()
                raise
            if ahead is not None:
                wake, rows = await ahead
            else:  # caught up
                await wake.wait()
                wake, rows = await read(last)

    async def _statuses(
        self, request: p.Subscribe, through: int, changed: Sequence[tuple[int | None, str]]
    ) -> list[p.Statuses]:
        """The `statuses` messages to send before events that change these goals' cards (by
        (goal id, kind)), when the subscriber asked for them: STATUSES_PER_LINE goals a line."""
        if not request.statuses or self.statuses_of is None:
            return []
        goal_ids = sorted(
            {goal_id for goal_id, kind in changed if goal_id is not None and kind in p.CARD_KINDS}
        )
        found = await self.statuses_of(goal_ids) if goal_ids else []
        return [
            p.Statuses(through=through, goals=found[i : i + STATUSES_PER_LINE])
            for i in range(0, len(found), STATUSES_PER_LINE)
        ]


#: Goal statuses in one `statuses` line: each is a few kB at most, so a line stays far under MAX_LINE.
STATUSES_PER_LINE = 50

_TOO_LONG = b"\x00too-long"
_TOO_LONG_MESSAGE = (
    f"line longer than {p.MAX_LINE} bytes (newline included); closing the connection, as the rest "
    "of it cannot be told from the next request. Large data is fetched by request, with offsets"
)


class _Connection:
    """One client: capped line reads, serialised writes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, redactor: Redactor):
        self.reader = reader
        self.writer = writer
        self.redactor = redactor
        self.client: str | None = None  # set by a welcomed hello
        self.principal = Principal()
        self._write_lock = asyncio.Lock()

    async def read_line(self) -> bytes | None:
        """The next line; _TOO_LONG for one over MAX_LINE bytes; None at EOF."""
        try:
            line = await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            line = exc.partial
        except asyncio.LimitOverrunError:
            return _TOO_LONG
        # The reader's limit counts bytes before the newline: one more may slip through.
        return _TOO_LONG if len(line) > p.MAX_LINE else line or None

    def _line(self, message: p.Message) -> bytes:
        if isinstance(message, p.LogReply):  # a chunk of a log may start or end inside a secret
            if message.text:  # a raw reply's text is empty: its chunk is redacted by _raw_log
                message = message.model_copy(update={"text": self.redactor.redact_edges(message.text)})
            if not isinstance(message.id, str):  # its one string is redacted: not scanned twice
                return p.encode(message)
        line = self.redactor.redact_line(p.encode(message))
        if len(line) <= p.MAX_LINE:
            return line
        # No client reads a longer line (it would hang up, and a subscriber stall on the event):
        # an event goes as what it was, a reply as why it did not come.
        if isinstance(message, p.EventMessage):
            event = message.event
            return p.encode(
                p.EventMessage(
                    event=_too_large(event.seq, event.goal_id, event.ts, event.data.kind, len(line))
                )
            )
        what = getattr(message, "type", "")
        return p.encode(
            p.Error(
                id=getattr(message, "id", None),
                code="internal",
                message=f"the {what} reply would be {len(line)} bytes, over the {p.MAX_LINE} a line "
                "may hold: ask for less (one goal, one experiment, a page)",
            )
        )

    def _raw_log(self, reply: p.LogReply) -> tuple[bytes, bytes]:
        """A raw log reply's line and the bytes that follow it: the chunk, redacted as its text
        would be in a line. The reply is this connection's to send, so it is counted in place."""
        chunk = self.redactor.redact_edges_utf8(bytes(reply._chunk))  # bytes already (pread): no copy
        reply.raw_bytes = len(chunk)
        return self._line(reply), chunk

    async def send(self, message: p.Message) -> None:
        """Write one message. Everything that leaves the runner passes here, and is redacted here."""
        if isinstance(message, p.LogReply) and message.raw_bytes is not None:
            await self._send_raw(*self._raw_log(message))
            return
        line = self._line(message)
        async with self._write_lock:
            self.writer.write(line)
            await self.writer.drain()

    async def _send_raw(self, line: bytes, chunk: bytes) -> None:
        """A raw reply's line and its bytes, together, the bytes a slice at a time: the transport's
        buffer then holds at most a slice, not the megabytes a whole chunk would leave in it to
        copy (benchmarks/bench_history.py)."""
        view = memoryview(chunk)
        async with self._write_lock:
            self.writer.write(line)
            for start in range(0, len(view), RAW_SLICE):
                self.writer.write(view[start : start + RAW_SLICE])
                await self.writer.drain()
            await self.writer.drain()  # an empty chunk: the line alone

    async def send_all(self, messages: Sequence[p.Message]) -> None:
        """Write several messages, one line each, with one drain."""
        lines = b"".join(self._line(message) for message in messages)
        async with self._write_lock:
            self.writer.write(lines)
            await self.writer.drain()

    async def send_events(self, events: list[bytes]) -> None:
        """Write events (each its Event's JSON) as `events` lines of up to EVENT_BATCH_BYTES each,
        every line redacted, with one drain."""
        lines: list[bytes] = []
        start, size = 0, 0
        if sum(map(len, events)) + len(events) > p.EVENT_BATCH_BYTES:  # else all go in one line
            for end, event in enumerate(events):
                if size and size + len(event) > p.EVENT_BATCH_BYTES:
                    lines.extend(self._event_lines(events[start:end]))
                    start, size = end, 0
                size += len(event) + 1
        lines.extend(self._event_lines(events[start:]))
        async with self._write_lock:
            self.writer.writelines(lines)
            await self.writer.drain()

    def _event_lines(self, events: list[bytes]) -> list[bytes]:
        line = self.redactor.redact_line(p.EVENT_BATCH_PREFIX + b",".join(events) + b"]}\n")
        if len(line) > p.MAX_LINE and len(events) > 1:  # markers longer than what they replaced
            half = len(events) // 2
            return self._event_lines(events[:half]) + self._event_lines(events[half:])
        if len(line) > p.MAX_LINE:  # one event no client could read: what it was goes in its place
            stored = json.loads(events[0])
            kind = stored["data"].get("kind", "?") if isinstance(stored.get("data"), dict) else "?"
            ts = datetime.fromisoformat(stored["ts"])
            stand_in = _too_large(stored["seq"], stored.get("goal_id"), ts, str(kind), len(line))
            return [p.EVENT_BATCH_PREFIX + stand_in.model_dump_json().encode() + b"]}\n"]
        return [line]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


def _too_large(seq: int, goal_id: int | None, ts: datetime, kind: str, size: int) -> Event:
    """What goes to subscribers in place of an event too large for a line: its seq, goal and time,
    so they move past it; the runner's database keeps the event itself."""
    reason = f"{size} bytes, over the {p.MAX_LINE} a line may hold; the runner's database keeps it"
    return Event(seq=seq, goal_id=goal_id, ts=ts, data=UnreadableEvent(stored_kind=kind, reason=reason))


def _bind(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, born 0600 in a directory made 0700 if missing: only this
    user (and root) may connect; a deep `path` is bound through its directory (client.unix_address)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        with unix_address(path) as address:
            sock.bind(address)
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    return sock


async def _socket_answers(path: Path) -> bool:
    try:
        stream = await asyncio.wait_for(SocketStream.open_unix(path), 2)
    except (OSError, TimeoutError):
        return False
    stream.close()
    return True
