"""How the bot reaches one runner: where it lives (`RunnerTarget`) and a connected client to it.

A runner is reached in one of three ways:

- a local Unix socket (`socket=`), when the bot runs on the runner's box;
- SSH, mode "streamlocal" (the default): an OpenSSH `direct-streamlocal` channel to the runner's
  socket on the box, like `ssh -L` does for Unix sockets. sshd must allow it: its
  `AllowStreamLocalForwarding` (default yes), and no `restrict` / `no-port-forwarding` on the key;
- SSH, mode "attach": runs `goaltender runner attach --socket PATH` on the box and speaks the
  protocol over that command's stdin/stdout, for boxes whose sshd forbids forwarding.

Each is a `LineStream` (goaltender.protocol.client) under the same RunnerClient; `open_client`
opens one and says hello.

SSH is always strict: the box's host key is pinned (`known_hosts` is a file, or the pinned key
line itself), only the configured client key is offered, and `~/.ssh/config` and ssh-agent are
ignored so nothing outside the bot's config can change where or how it connects. Keepalives
detect a silently dead path (after about interval × (count_max + 1) seconds without a reply).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import warnings
from pathlib import Path
from typing import Literal

from cryptography.utils import CryptographyDeprecationWarning

# asyncssh names cryptography's DSA classes in its annotations, and each name warns once at import
# that DSA is deprecated: five warnings at every start about what nobody here uses or can change.
# Only those are silenced, only while asyncssh is imported; a DSA key used later still warns.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=CryptographyDeprecationWarning, module=r"asyncssh\.")
    import asyncssh
from pydantic import BaseModel, ConfigDict, Field, model_validator

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable

CLOSE_TIMEOUT_S = 5.0  # a graceful SSH close that takes longer is aborted (a black-holed path never drains)
STDERR_TAIL = 4096  # bytes of a remote `attach` command's stderr kept for error messages
# Errors that mean "the link is down", as opposed to a bug; all of them are retried.
LINK_ERRORS = (RunnerUnavailable, OSError, asyncssh.Error, TimeoutError, p.ProtocolError)


class HostKeyRejected(RunnerUnavailable):
    """The box presented an SSH host key other than the pinned one."""


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
    request_timeout: float = Field(default=30.0, gt=0)
    """Seconds the runner has to answer a request on the link. Past it the runner counts as hung
    (keepalives only prove sshd is alive): the link goes down and connects again."""
    stop_timeout: float = Field(default=120.0, gt=0)
    """The same for `stop`, which the runner answers once the goal's processes have ended (their
    grace periods, cluster jobs cancelled)."""
    probe_interval: float = Field(default=15.0, gt=0)
    """A link that has heard nothing from the runner for this long asks it for a status, so a hung
    runner is noticed even when nobody asks anything."""
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

    def describe(self) -> str:
        if self.socket is not None:
            return f"{self.name} (local socket {self.socket})"
        where = self.remote_socket or "the default socket"
        via = "attach" if self.mode == "attach" else "streamlocal"
        return f"{self.name} (ssh {self.username}@{self.host}:{self.port} → {where}, {via})"


def error_reason(exc: BaseException) -> str:
    """A short human reason for a link error (asyncssh's own reason, the OS's strerror, ...)."""
    if isinstance(exc, p.ProtocolError) and exc.code == "version_mismatch":
        return exc.message  # the line naming what to upgrade (protocol/versions.py), as it is
    if isinstance(exc, asyncssh.Error):
        return exc.reason or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


async def open_client(target: RunnerTarget, client_name: str) -> RunnerClient:
    """Connect to the runner, say hello as `client_name`, and return the client.

    Closing the client closes the SSH connection under it. Every failure is a RunnerUnavailable
    (HostKeyRejected for a host key that does not match the pin) naming the runner and the cause.
    """
    if target.socket is not None:
        return await _open_local(target, target.socket, client_name)
    return await _open_ssh(target, client_name)


async def _open_local(target: RunnerTarget, socket: Path, client_name: str) -> RunnerClient:
    try:
        return await asyncio.wait_for(
            RunnerClient.connect_unix(socket, client=client_name), target.connect_timeout
        )
    except RunnerUnavailable as exc:
        raise RunnerUnavailable(f"runner {target.name}: {exc}") from exc
    except (OSError, TimeoutError) as exc:
        raise RunnerUnavailable(f"runner {target.name}: cannot open {socket}: {error_reason(exc)}") from exc


async def _open_ssh(target: RunnerTarget, client_name: str) -> RunnerClient:
    conn = await _ssh_connect(target)
    client: RunnerClient | None = None
    command: _RemoteCommand | None = None
    try:
        async with asyncio.timeout(target.connect_timeout):
            if target.mode == "streamlocal":
                assert target.remote_socket is not None  # RunnerTarget requires it for streamlocal
                reader, writer = await conn.open_unix_connection(target.remote_socket, window=target.window)
                client = RunnerClient(_ChannelStream(conn, reader, writer))
            else:
                process = await conn.create_process(
                    _attach_command(target), encoding=None, window=target.window
                )
                command = _RemoteCommand(process)
                client = RunnerClient(_ChannelStream(conn, process.stdout, process.stdin, command))
            return await client.hello(client_name)
    except BaseException as exc:
        error = await _explain_ssh_failure(target, exc, command)
        if client is not None:
            await client.close()
        conn.abort()
        if error is None:
            raise
        raise error from exc


async def _explain_ssh_failure(
    target: RunnerTarget, exc: BaseException, command: _RemoteCommand | None
) -> RunnerUnavailable | None:
    """The RunnerUnavailable that says why a logged-in session did not reach the runner, or None
    for an exception that is not a link failure (a bug, a cancellation): it propagates as it is."""
    if isinstance(exc, asyncssh.ChannelOpenError):
        return RunnerUnavailable(
            f"runner {target.name}: the SSH server on {target.host} would not open "
            f"{target.remote_socket}: {exc.reason}. Is the runner running there, with "
            f"{target.username} among its operators (GOALTENDER_OPERATORS)? If that sshd forbids "
            'stream forwarding, or the key is restricted to a forced command, use mode = "attach".'
        )
    if isinstance(exc, TimeoutError):
        return RunnerUnavailable(
            f"runner {target.name}: logged in to {target.host}, but the runner did not answer "
            f"within {target.connect_timeout:g}s"
        )
    if not isinstance(exc, LINK_ERRORS):
        return None
    if command is not None:
        return RunnerUnavailable(
            f"runner {target.name}: `{_attach_command(target)}` on {target.host} did not answer: "
            f"{await command.exit_story()}"
        )
    return RunnerUnavailable(f"runner {target.name}: {error_reason(exc)}")


async def _ssh_connect(target: RunnerTarget) -> asyncssh.SSHClientConnection:
    where = f"{target.host}:{target.port}"
    assert target.host is not None and target.client_key is not None  # RunnerTarget requires both
    try:
        key = asyncssh.read_private_key(str(target.client_key.expanduser()))
    except (OSError, asyncssh.KeyImportError) as exc:
        raise RunnerUnavailable(
            f"runner {target.name}: cannot use client key {target.client_key}: {error_reason(exc)}"
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
        raise RunnerUnavailable(f"runner {target.name}: cannot reach {where}: {error_reason(exc)}") from exc


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
    assert target.host is not None and target.known_hosts is not None  # RunnerTarget requires both
    if not _known_hosts_is_text(target.known_hosts):
        path = Path(target.known_hosts).expanduser()
        try:
            return asyncssh.read_known_hosts(str(path))
        except OSError as exc:
            raise RunnerUnavailable(
                f"runner {target.name}: cannot read known_hosts file {path}: {error_reason(exc)}"
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


class _RemoteCommand:
    """The `goaltender runner attach` process on the box. Its stderr is drained (it shares the
    channel window) and the end of it kept, to say why the command went away."""

    def __init__(self, process: asyncssh.SSHClientProcess[bytes]):
        self.process = process
        self.stderr_tail = b""
        self.drainer = asyncio.ensure_future(self._drain(process.stderr))

    async def _drain(self, stderr: asyncssh.SSHReader[bytes]) -> None:
        with contextlib.suppress(Exception):
            while chunk := await stderr.read(65536):
                self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL:]

    async def exit_story(self) -> str:
        """What the command said as it went away, for an error message."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.process.wait_closed(), 2)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self.drainer), 0.5)
        status = self.process.exit_status
        story = "the session closed" if status is None else f"it exited with status {status}"
        stderr = self.stderr_tail.decode(errors="replace").strip()
        return f"{story}: {stderr}" if stderr else story


class _ChannelStream:
    """A LineStream over one SSH channel: a direct-streamlocal socket, or `command`'s stdio.

    asyncssh's readline hands back whatever it has buffered when one line outgrows the channel's
    receive window; `readline()` here keeps reading until the newline (or the protocol's line cap,
    or EOF). asyncssh's errors become ConnectionErrors, which RunnerClient reports as a lost link,
    with asyncssh's reason (e.g. "Server not responding to keepalive"). Closing the stream closes
    the SSH connection under it."""

    def __init__(
        self,
        conn: asyncssh.SSHClientConnection,
        reader: asyncssh.SSHReader[bytes],
        writer: asyncssh.SSHWriter[bytes],
        command: _RemoteCommand | None = None,
    ):
        self._conn = conn
        self._reader = reader
        self._writer = writer
        self._command = command

    async def readline(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                piece = await self._reader.readline()
            except asyncssh.Error as exc:
                raise _link_lost(exc) from exc
            if not piece:
                return b""  # EOF; a half line left by a peer that died mid-write is dropped
            parts.append(piece)
            size += len(piece)
            if piece.endswith(b"\n"):
                return b"".join(parts)
            if size > p.MAX_LINE:
                raise ValueError(f"the runner sent a line longer than {p.MAX_LINE} bytes")

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionError(f"the link ended {n - len(exc.partial)} bytes into a raw reply") from exc
        except asyncssh.Error as exc:
            raise _link_lost(exc) from exc

    def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
        except asyncssh.Error as exc:
            raise _link_lost(exc) from exc

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except asyncssh.Error as exc:
            raise _link_lost(exc) from exc

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
        if self._command is not None:
            self._command.drainer.cancel()


def _link_lost(exc: asyncssh.Error) -> ConnectionResetError:
    return ConnectionResetError(f"SSH link lost: {error_reason(exc)}")
