"""Links from the bot to its runners: one supervised, subscribed connection per runner.

A runner is reached in one of three ways (`RunnerTarget`):

- a local Unix socket (`socket=`), when the bot runs on the runner's box;
- SSH, mode "streamlocal" (the default): an OpenSSH `direct-streamlocal` channel to the runner's
  socket on the box, like `ssh -L` does for Unix sockets. sshd must allow it: its
  `AllowStreamLocalForwarding` (default yes), and no `restrict` / `no-port-forwarding` on the key;
- SSH, mode "attach": runs `goaltender runner attach --socket PATH` on the box and speaks the
  protocol over that command's stdin/stdout, for boxes whose sshd forbids forwarding.

SSH is always strict: the box's host key is pinned (`known_hosts` is a file, or the pinned key
line itself), only the configured client key is offered, and `~/.ssh/config` and ssh-agent are
ignored so nothing outside the bot's config can change where or how it connects. Keepalives
detect a silently dead path (after about interval × (count_max + 1) seconds without a reply).

`RunnerLink` keeps one runner subscribed for as long as it runs: connect, `subscribe(since=<the
last seq the bot stored>)`, hand every event to the bot's callback, acknowledge it, and on any
drop reconnect with exponential backoff and jitter. Delivery is **at least once**: an event whose
callback had finished but whose seq the bot had not yet made durable when the link dropped is
delivered again after the reconnect. The callback makes it exactly-once by storing the event and
its seq in one transaction and ignoring a seq it already has; `load_cursor` returns the highest
stored seq. `RunnerPool` holds the links of every configured runner and picks one for a new goal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shlex
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Literal, TypeVar

import asyncssh
from pydantic import BaseModel, ConfigDict, Field, model_validator

from goaltender.runner import protocol as p
from goaltender.runner.client import RunnerClient, RunnerUnavailable
from goaltender.storage.records import Event, utcnow

log = logging.getLogger("goaltender.bot.links")

R = TypeVar("R", bound=p.Reply)
EventCallback = Callable[[str, Event], Awaitable[None]]
CursorLoader = Callable[[str], Awaitable[int]]
ChangeCallback = Callable[[str, bool], Awaitable[None]]  # (runner name, up)

CLOSE_TIMEOUT_S = 5.0  # a graceful SSH close that takes longer is aborted (a black-holed path never drains)
STDERR_TAIL = 4096  # bytes of a remote `attach` command's stderr kept for error messages
# Errors that mean "the link is down", as opposed to a bug; all of them are retried.
LINK_ERRORS = (RunnerUnavailable, OSError, asyncssh.Error, TimeoutError, p.ProtocolError)


class HostKeyRejected(RunnerUnavailable):
    """The box presented an SSH host key other than the pinned one."""


class UnknownRunner(LookupError):
    """No runner of that name is configured."""


class NoRunnerAvailable(RunnerUnavailable):
    """No configured runner is connected right now."""


class RunnerTarget(BaseModel):
    """Where one runner lives: a local socket, or a box reached over SSH."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    """The bot's name for this runner (`/goal ... on <name>`); also its cursor key in bot.db."""
    socket: Path | None = None
    """A local runner's Unix socket. Give this, or the SSH fields below."""

    host: str | None = None
    port: int = Field(default=22, gt=0, lt=65536)
    username: str | None = None
    client_key: Path | None = None
    """The private key the bot logs in with (OpenSSH format, not encrypted)."""
    known_hosts: str | None = None
    """The pinned host key: a known_hosts file's path, or its line(s) as text. A bare key line
    (`ssh-ed25519 AAAA...`, as in /etc/ssh/ssh_host_ed25519_key.pub) applies to host:port."""
    remote_socket: str | None = None
    """The runner's socket path on the box (absolute). In attach mode it may be left out: the box's
    default ($GOALTENDER_SOCKET, else ~/.goaltender/runner.sock) is used."""
    mode: Literal["streamlocal", "attach"] = "streamlocal"
    attach_command: str = "goaltender"
    """attach mode: the `goaltender` executable on the box (a full path if it is not on PATH)."""
    keepalive_interval: float = Field(default=15.0, gt=0)
    keepalive_count_max: int = Field(default=3, ge=1)
    connect_timeout: float = Field(default=15.0, gt=0)
    window: int = Field(default=2 * p.MAX_LINE, ge=16 * 1024)
    """SSH channel receive window (bytes). Lines longer than the window still arrive whole."""

    @model_validator(mode="after")
    def _one_way_in(self) -> RunnerTarget:
        if self.socket is not None:
            if self.host is not None:
                raise ValueError(
                    f"runner {self.name!r}: give `socket` (a local runner) or `host` (SSH), not both"
                )
            return self
        if self.host is None:
            raise ValueError(f"runner {self.name!r}: give `socket` (a local runner) or `host` (SSH)")
        required = ["username", "client_key", "known_hosts"]
        if self.mode == "streamlocal":
            required.append("remote_socket")
        if missing := [field for field in required if getattr(self, field) is None]:
            raise ValueError(f"SSH runner {self.name!r} also needs: {', '.join(missing)}")
        if _known_hosts_is_text(self.known_hosts):
            _pinned_known_hosts(self)  # a mistyped pin fails here, at config load, not at 3 a.m.
        return self

    @property
    def local(self) -> bool:
        return self.socket is not None

    def describe(self) -> str:
        if self.socket is not None:
            return f"{self.name} (local socket {self.socket})"
        where = self.remote_socket or "the default socket"
        via = "attach" if self.mode == "attach" else "streamlocal"
        return f"{self.name} (ssh {self.username}@{self.host}:{self.port} → {where}, {via})"


# ---- opening one client ----


async def open_client(target: RunnerTarget, client_name: str) -> RunnerClient:
    """Connect to the runner, say hello as `client_name`, and return the client.

    Closing the client closes the SSH connection under it. Every failure is a RunnerUnavailable
    (HostKeyRejected for a host key that does not match the pin) naming the runner and the cause.
    """
    if target.socket is not None:
        try:
            return await asyncio.wait_for(
                RunnerClient.connect_unix(target.socket, client=client_name), target.connect_timeout
            )
        except RunnerUnavailable as exc:
            raise RunnerUnavailable(f"runner {target.name}: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            raise RunnerUnavailable(
                f"runner {target.name}: cannot open {target.socket}: {_reason(exc)}"
            ) from exc

    conn = await _ssh_connect(target)
    client: RunnerClient | None = None
    process: asyncssh.SSHClientProcess | None = None
    stderr: _StderrTail | None = None
    try:
        async with asyncio.timeout(target.connect_timeout):
            if target.mode == "streamlocal":
                assert target.remote_socket is not None
                reader, writer = await conn.open_unix_connection(target.remote_socket, window=target.window)
                line_reader = _LineReader(reader)
                client = RunnerClient(line_reader, _ChannelWriter(writer, conn))  # type: ignore[arg-type]
            else:
                process = await conn.create_process(
                    _attach_command(target), encoding=None, window=target.window
                )
                stderr = _StderrTail(process.stderr)
                line_reader = _LineReader(process.stdout)
                client = RunnerClient(
                    line_reader,  # type: ignore[arg-type]
                    _ChannelWriter(process.stdin, conn, stderr),  # type: ignore[arg-type]
                )
            _line_readers[client] = line_reader
            return await client.hello(client_name)
    except BaseException as exc:
        error: RunnerUnavailable | None = None
        if isinstance(exc, asyncssh.ChannelOpenError):
            error = RunnerUnavailable(
                f"runner {target.name}: the SSH server on {target.host} would not open "
                f"{target.remote_socket}: {exc.reason}. Is the runner running there? If that sshd "
                'forbids stream forwarding, use mode = "attach".'
            )
        elif isinstance(exc, TimeoutError):
            error = RunnerUnavailable(
                f"runner {target.name}: logged in to {target.host}, but the runner did not answer "
                f"within {target.connect_timeout:g}s"
            )
        elif process is not None and stderr is not None and isinstance(exc, LINK_ERRORS):
            error = RunnerUnavailable(
                f"runner {target.name}: `{_attach_command(target)}` on {target.host} did not answer: "
                f"{await _exit_story(process, stderr)}"
            )
        elif isinstance(exc, LINK_ERRORS):
            error = RunnerUnavailable(f"runner {target.name}: {_reason(exc)}")
        if client is not None:
            await client.close()
        conn.abort()
        if error is None:
            raise
        raise error from exc


async def _ssh_connect(target: RunnerTarget) -> asyncssh.SSHClientConnection:
    where = f"{target.host}:{target.port}"
    assert target.host is not None and target.client_key is not None
    try:
        key = asyncssh.read_private_key(str(target.client_key.expanduser()))
    except (OSError, asyncssh.KeyImportError) as exc:
        raise RunnerUnavailable(
            f"runner {target.name}: cannot use client key {target.client_key}: {_reason(exc)}"
        ) from exc
    known_hosts = _pinned_known_hosts(target)
    try:
        return await asyncssh.connect(
            target.host,
            target.port,
            username=target.username,
            client_keys=[key],
            known_hosts=known_hosts,
            keepalive_interval=target.keepalive_interval,
            keepalive_count_max=target.keepalive_count_max,
            connect_timeout=target.connect_timeout,
            config=None,  # ~/.ssh/config must not redirect or reconfigure the bot
            agent_path=None,  # nor may whatever ssh-agent the bot's user happens to run
            preferred_auth="publickey",
        )
    except asyncssh.HostKeyNotVerifiable as exc:
        raise HostKeyRejected(
            f"runner {target.name}: {where} presented an SSH host key that does not match the pinned "
            f"key ({exc.reason}); refusing to connect. If the box was reinstalled, verify its new key "
            "out of band (ssh-keyscan on a trusted network) and update known_hosts for this runner."
        ) from exc
    except asyncssh.PermissionDenied as exc:
        raise RunnerUnavailable(
            f"runner {target.name}: {where} refused the login as {target.username} with key "
            f"{target.client_key} ({exc.reason})"
        ) from exc
    except TimeoutError as exc:
        raise RunnerUnavailable(
            f"runner {target.name}: no SSH session with {where} within {target.connect_timeout:g}s"
        ) from exc
    except (OSError, asyncssh.Error) as exc:
        raise RunnerUnavailable(f"runner {target.name}: cannot reach {where}: {_reason(exc)}") from exc


def _attach_command(target: RunnerTarget) -> str:
    argv = [target.attach_command, "runner", "attach"]
    if target.remote_socket:
        argv += ["--socket", target.remote_socket]
    return shlex.join(argv)


def _known_hosts_is_text(value: str | None) -> bool:
    return value is not None and ("\n" in value.strip() or " " in value.strip())


def _is_key_type(token: str) -> bool:
    return token.startswith(("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-", "rsa-sha2-"))


def _pinned_known_hosts(target: RunnerTarget) -> asyncssh.SSHKnownHosts:
    """The host keys this runner's box may present: a known_hosts file, or pinned line(s)."""
    assert target.known_hosts is not None
    if not _known_hosts_is_text(target.known_hosts):
        path = Path(target.known_hosts).expanduser()
        try:
            return asyncssh.read_known_hosts(str(path))
        except OSError as exc:
            raise RunnerUnavailable(
                f"runner {target.name}: cannot read known_hosts file {path}: {_reason(exc)}"
            ) from exc
    # OpenSSH writes a non-default port as `[host]:port`; a bare key gets the right pattern here.
    pattern = target.host if target.port == 22 else f"[{target.host}]:{target.port}"
    lines = []
    for raw in target.known_hosts.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        tokens = line.split()
        if _is_key_type(tokens[0]) and not (len(tokens) > 1 and _is_key_type(tokens[1])):
            line, tokens = f"{pattern} {line}", [pattern, *tokens]
        key_at = 2 if tokens[0].startswith("@") else 1
        try:
            asyncssh.import_public_key(" ".join(tokens[key_at : key_at + 2]))
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise ValueError(
                f"runner {target.name!r}: the pinned host key {raw.strip()!r} is not a key: {exc}"
            ) from None
        lines.append(line)
    if not lines:
        raise ValueError(f"runner {target.name!r}: known_hosts pins no key")
    return asyncssh.import_known_hosts("\n".join(lines) + "\n")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.Error):
        return exc.reason or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class _LineReader:
    """`readline()` over an asyncssh SSHReader that never returns a partial line.

    asyncssh hands back whatever it has buffered when one line outgrows the channel's receive
    window; this keeps reading until the newline (or the protocol's line cap, or EOF). asyncssh's
    own errors become ConnectionErrors, which RunnerClient understands as a lost link."""

    def __init__(self, reader: asyncssh.SSHReader):
        self._reader = reader
        self.error: str | None = None  # why the link was lost, if asyncssh said

    async def readline(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                piece = await self._reader.readline()
            except asyncssh.Error as exc:
                self.error = f"SSH link lost: {_reason(exc)}"
                raise ConnectionResetError(self.error) from exc
            if not piece:
                return b""  # EOF; a half line left by a peer that died mid-write is dropped
            parts.append(piece)
            size += len(piece)
            if piece.endswith(b"\n"):
                return b"".join(parts)
            if size > p.MAX_LINE:
                raise ValueError(f"the runner sent a line longer than {p.MAX_LINE} bytes")


# RunnerClient.events() reports any drop as "the runner closed the connection"; the link looks up
# the SSH-level reason (e.g. "Server not responding to keepalive") here.
_line_readers: weakref.WeakKeyDictionary[RunnerClient, _LineReader] = weakref.WeakKeyDictionary()


def _lost_because(client: RunnerClient) -> str | None:
    reader = _line_readers.get(client)
    return reader.error if reader is not None else None


class _StderrTail:
    """Drain a remote command's stderr (it shares the channel window) and keep the end of it."""

    def __init__(self, reader: asyncssh.SSHReader):
        self.text = b""
        self.task = asyncio.ensure_future(self._drain(reader))

    async def _drain(self, reader: asyncssh.SSHReader) -> None:
        with contextlib.suppress(Exception):
            while chunk := await reader.read(65536):
                self.text = (self.text + chunk)[-STDERR_TAIL:]

    def __str__(self) -> str:
        return self.text.decode(errors="replace").strip()


class _ChannelWriter:
    """The writer half RunnerClient needs, over an SSH channel; closing it closes the connection."""

    def __init__(
        self,
        writer: asyncssh.SSHWriter,
        conn: asyncssh.SSHClientConnection,
        stderr: _StderrTail | None = None,
    ):
        self._writer = writer
        self._conn = conn
        self._stderr = stderr

    def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
        except asyncssh.Error as exc:
            raise ConnectionResetError(f"SSH link lost: {_reason(exc)}") from exc

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except asyncssh.Error as exc:
            raise ConnectionResetError(f"SSH link lost: {_reason(exc)}") from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._writer.can_write_eof():
                self._writer.write_eof()  # attach mode: the bridge on the box sees EOF and exits
        with contextlib.suppress(Exception):
            self._writer.close()
        self._conn.close()

    async def wait_closed(self) -> None:
        try:
            await asyncio.wait_for(self._conn.wait_closed(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            self._conn.abort()
        if self._stderr is not None:
            self._stderr.task.cancel()


async def _exit_story(process: asyncssh.SSHClientProcess, stderr: _StderrTail) -> str:
    """What a remote attach command that went away said, for the error message."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(process.wait_closed(), 2)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.shield(stderr.task), 0.5)
    status = process.exit_status
    story = "the session closed" if status is None else f"it exited with status {status}"
    return f"{story}: {stderr}" if str(stderr) else story


# ---- one supervised link ----


class RunnerLink:
    """Keeps one runner connected and subscribed; reconnects on any drop.

    `on_event(runner_name, event)` stores an event (the bot's job; it must be idempotent on
    (runner_name, event.seq)), and `load_cursor(runner_name)` returns the highest seq stored, which
    is where every (re)subscription resumes. After the callback returns, the link acknowledges the
    seq to the runner (acks are coalesced: one in flight, always the newest seq).
    `on_change(runner_name, up)`, if given, hears when the link comes up or goes down (once per
    change; the first failure to connect counts as going down).
    """

    def __init__(
        self,
        target: RunnerTarget,
        *,
        on_event: EventCallback,
        load_cursor: CursorLoader,
        on_change: ChangeCallback | None = None,
        client_name: str = "goaltender-bot",
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ):
        self.target = target
        self.name = target.name
        self.client_name = client_name
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._on_event = on_event
        self._load_cursor = load_cursor
        self._on_change = on_change
        self._reported: bool | None = None  # the last state told to on_change
        self._change_tasks: set[asyncio.Task] = set()
        self._client: RunnerClient | None = None
        self._up = asyncio.Event()
        self._stop = asyncio.Event()
        self._failures = 0
        self._delivered = 0
        self.last_error: str | None = None
        """Why the link last went down or failed to come up (kept after it recovers)."""
        self.connected_since: datetime | None = None
        """When the current session subscribed; None while the link is down."""
        self.runner_name: str | None = None
        """What the runner calls itself (its Welcome), once connected."""
        self.connects = 0
        """Successful subscriptions so far (1 + the number of reconnects)."""
        self.head: int | None = None
        """The runner's newest seq when the current session subscribed."""

    @property
    def healthy(self) -> bool:
        return self._client is not None

    def __repr__(self) -> str:
        state = "up" if self.healthy else f"down ({self.last_error or 'connecting'})"
        return f"<RunnerLink {self.target.describe()} {state}>"

    async def wait_healthy(self) -> None:
        """Wait until the link is subscribed (wrap it in asyncio.timeout to bound the wait)."""
        await self._up.wait()

    async def call(self, request_type: type[p.Request], expect: type[R] | None = None, /, **fields) -> R:
        """Send one request on the current connection. RunnerUnavailable when the link is down."""
        client = self._client
        if client is None:
            why = f" (last error: {self.last_error})" if self.last_error else " (still connecting)"
            raise RunnerUnavailable(f"runner {self.name} is not connected{why}")
        return await client.call(request_type, expect, **fields)

    def stop(self) -> None:
        """Make `run()` close the connection and return (for good: a stopped link stays stopped)."""
        self._stop.set()

    async def run(self) -> None:
        """Connect, subscribe and deliver events until `stop()`; reconnect after every drop."""
        while not self._stop.is_set():
            session = asyncio.ensure_future(self._session())
            stopping = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait({session, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                if not session.done():
                    session.cancel()
                await asyncio.gather(session, return_exceptions=True)  # (retrieves its exception)
            if self._stop.is_set():
                break
            exc = session.exception() if not session.cancelled() else asyncio.CancelledError()
            self._note_error(exc)
            if exc is not None and not isinstance(exc, LINK_ERRORS):
                log.error("runner %s: link failed", self.name, exc_info=exc)
            self._changed(False)
            delay = min(self.backoff_cap, self.backoff_base * 2**self._failures) * random.uniform(0.5, 1.0)
            self._failures += 1
            log.warning("runner %s: link down (%s); retrying in %.1fs", self.name, self.last_error, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):  # (not wait_for: see Outbox.run)
                    await self._stop.wait()

    async def _session(self) -> None:
        client = await open_client(self.target, self.client_name)
        acker: asyncio.Task | None = None
        try:
            since = await self._load_cursor(self.name)
            self.head = await client.subscribe(since=since)
            if self.head < since:
                log.warning(
                    "runner %s: its event log ends at seq %d but the bot has stored up to %d; "
                    "was the runner's database replaced? Its new events up to seq %d will be skipped.",
                    self.name,
                    self.head,
                    since,
                    since,
                )
            self._client = client
            self.runner_name = client.runner_name
            self.connected_since = utcnow()
            self.connects += 1
            self._failures = 0  # the backoff starts over after every successful subscribe
            self._up.set()
            self._changed(True)
            log.info("runner %s: subscribed since seq %d (head %d)", self.name, since, self.head)
            ack_due = asyncio.Event()
            acker = asyncio.ensure_future(self._ack_loop(client, ack_due))
            try:
                async for event in client.events():
                    await self._on_event(self.name, event)
                    self._delivered = max(self._delivered, event.seq)
                    ack_due.set()
            except RunnerUnavailable as exc:
                if because := _lost_because(client):
                    raise RunnerUnavailable(f"lost the runner: {because}") from exc
                raise
        except Exception as exc:
            self._note_error(exc)  # before `healthy` turns false, so a watcher sees both at once
            raise
        finally:
            self._client = None
            self._up.clear()
            self.connected_since = None
            if acker is not None:
                acker.cancel()
            await client.close()

    def _changed(self, up: bool) -> None:
        if self._on_change is None or self._reported == up:
            return
        self._reported = up
        task = asyncio.ensure_future(self._on_change(self.name, up))
        self._change_tasks.add(task)
        task.add_done_callback(self._change_done)

    def _change_done(self, task: asyncio.Task) -> None:
        self._change_tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("runner %s: the link-change callback failed", self.name, exc_info=exc)

    def _note_error(self, exc: BaseException | None) -> None:
        error = _reason(exc) if exc is not None else "the session ended"
        self.last_error = error.removeprefix(f"runner {self.name}: ")

    async def _ack_loop(self, client: RunnerClient, due: asyncio.Event) -> None:
        acked = 0
        while True:
            await due.wait()
            due.clear()
            seq = self._delivered
            if seq > acked:
                try:
                    await client.call(p.Ack, p.Done, seq=seq)
                except (RunnerUnavailable, p.ProtocolError):
                    return  # the event loop notices the drop and reconnects
                acked = seq


# ---- several runners ----


class RunnerPool:
    """The links to every configured runner, and the choice of runner for a new goal."""

    def __init__(
        self,
        targets: Iterable[RunnerTarget],
        *,
        on_event: EventCallback,
        load_cursor: CursorLoader,
        on_change: ChangeCallback | None = None,
        client_name: str = "goaltender-bot",
        load_ttl: float = 5.0,
        status_timeout: float = 10.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ):
        self.links: dict[str, RunnerLink] = {}
        for target in targets:
            if target.name in self.links:
                raise ValueError(f"two runners are both named {target.name!r}")
            self.links[target.name] = RunnerLink(
                target,
                on_event=on_event,
                load_cursor=load_cursor,
                on_change=on_change,
                client_name=client_name,
                backoff_base=backoff_base,
                backoff_cap=backoff_cap,
            )
        if not self.links:
            raise ValueError("no runners are configured")
        self.load_ttl = load_ttl
        self.status_timeout = status_timeout
        self._loads: dict[str, tuple[float, int]] = {}  # name -> (monotonic time, active goals)

    def __getitem__(self, name: str) -> RunnerLink:
        try:
            return self.links[name]
        except KeyError:
            raise UnknownRunner(
                f"there is no runner called {name!r}; configured: {', '.join(self.links)}"
            ) from None

    def __iter__(self) -> Iterator[RunnerLink]:
        return iter(self.links.values())

    async def run(self) -> None:
        """Run every link until `stop()`."""
        await asyncio.gather(*(link.run() for link in self.links.values()))

    def stop(self) -> None:
        for link in self.links.values():
            link.stop()

    async def load(self, link: RunnerLink) -> int:
        """The runner's number of active (not finished/stopped/failed) goals, cached for load_ttl s."""
        cached = self._loads.get(link.name)
        if cached is not None and time.monotonic() - cached[0] < self.load_ttl:
            return cached[1]
        reply = await asyncio.wait_for(
            link.call(p.Status, p.StatusReply, active_only=True), self.status_timeout
        )
        load = len(reply.goals)
        self._loads[link.name] = (time.monotonic(), load)
        return load

    async def pick(self, name: str | None = None) -> RunnerLink:
        """The named runner (connected or not: the caller queues while it is down), or else the
        connected runner with the fewest active goals (ties: by name)."""
        if name is not None:
            return self[name]
        healthy = [link for link in self.links.values() if link.healthy]
        loads = await asyncio.gather(*(self.load(link) for link in healthy), return_exceptions=True)
        problems = {
            link.name: _reason(load)
            for link, load in zip(healthy, loads, strict=True)
            if isinstance(load, BaseException)
        }
        ranked = sorted(
            (load, link.name) for link, load in zip(healthy, loads, strict=True) if isinstance(load, int)
        )
        if not ranked:
            states = []
            for link in self.links.values():
                why = problems.get(link.name) or link.last_error or "still connecting"
                states.append(f"{link.name} ({why})")
            raise NoRunnerAvailable(f"no runner is available right now: {'; '.join(states)}")
        load, chosen = ranked[0]
        # Count the goal about to be submitted, so a burst of goals spreads over the runners.
        self._loads[chosen] = (self._loads.get(chosen, (time.monotonic(), 0))[0], load + 1)
        return self.links[chosen]
