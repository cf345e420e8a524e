"""A real asyncssh server on 127.0.0.1 standing in for a GPU box's sshd (tests and benchmarks).

It lets the bot's key open direct-streamlocal channels to the runner's socket (and nothing else),
and runs `goaltender runner attach --socket PATH` for exec requests, either as a real subprocess
(`python -m goaltender.runner.attach`) or in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
from pathlib import Path

import asyncssh

from goaltender.bot.transports import RunnerTarget
from goaltender.runner.attach import attach


class _BoxServer(asyncssh.SSHServer):
    def __init__(self, box: SSHBox):
        self.box = box
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.box.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        self.box.connections.discard(self.conn)

    def unix_connection_requested(self, dest_path: str) -> bool:
        return dest_path in self.box.sockets  # True: asyncssh connects the path itself


class SSHBox:
    """An SSH server on 127.0.0.1 standing in for a GPU box's sshd."""

    def __init__(self, keydir: Path, sockets: set[str], attach_in_process: bool = False):
        self.sockets = sockets
        self.attach_in_process = attach_in_process
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = keydir / "bot_ed25519"
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key.write_private_key(str(self.client_key_path))
        self.client_key_path.chmod(0o600)
        self.authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
        self.pinned = self.host_key.export_public_key().decode().strip()  # "ssh-ed25519 AAAA..."
        self.port = 0
        self.server: asyncssh.SSHAcceptor | None = None
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self.processes: list[asyncio.Task] = []

    async def start(self) -> SSHBox:
        self.server = await asyncssh.listen(
            "127.0.0.1",
            self.port,
            server_factory=lambda: _BoxServer(self),
            server_host_keys=[self.host_key],
            authorized_client_keys=self.authorized,
            process_factory=self._exec,
            encoding=None,
            allow_pty=False,
            agent_forwarding=False,
            x11_forwarding=False,
            reuse_address=True,
        )
        self.port = self.server.get_port()
        return self

    def drop(self) -> None:
        """Kill every SSH connection from the server side, as a crashed sshd would."""
        for conn in list(self.connections):
            conn.abort()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        self.drop()

    def target(self, name: str = "gpu", **fields) -> RunnerTarget:
        defaults = {
            "host": "127.0.0.1",
            "port": self.port,
            "username": "bot",
            "client_key": self.client_key_path,
            "known_hosts": self.pinned,
        }
        return RunnerTarget(name=name, **{**defaults, **fields})

    async def _exec(self, process: asyncssh.SSHServerProcess) -> None:
        argv = shlex.split(process.command or "")
        if argv[:3] != ["goaltender", "runner", "attach"]:
            process.stderr.write(b"only `goaltender runner attach` may run here\n")
            process.exit(126)
            return
        if self.attach_in_process:
            socket = argv[argv.index("--socket") + 1]
            status = await attach(socket, reader=process.stdin, writer=process.stdout)
            with contextlib.suppress(Exception):  # the client may have closed the channel already
                process.exit(status)
            return
        bridge = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "goaltender.runner.attach",
            *argv[3:],
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

        async def pump(source, sink, at_eof) -> None:
            with contextlib.suppress(Exception):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            with contextlib.suppress(Exception):
                at_eof()

        pumps = [
            asyncio.ensure_future(pump(process.stdin, bridge.stdin, bridge.stdin.close)),
            asyncio.ensure_future(pump(bridge.stdout, process.stdout, lambda: None)),
            asyncio.ensure_future(pump(bridge.stderr, process.stderr, lambda: None)),
        ]
        try:
            status = await bridge.wait()
            await asyncio.gather(*pumps[1:])
            process.exit(status)
        finally:
            pumps[0].cancel()
            if bridge.returncode is None:
                bridge.kill()
                await bridge.wait()
