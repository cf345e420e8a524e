"""`goaltender runner attach`: bridge this process's stdin/stdout to the runner's Unix socket.

The bot's "attach" mode runs this command over SSH (`ssh box goaltender runner attach --socket
PATH`) and speaks the runner protocol over the command's stdio. It is also what a least-privilege
key runs: `command="/path/to/goaltender runner attach --socket PATH",restrict` before the bot's key
in authorized_keys makes sshd run this and nothing else, whatever the bot asks for, with no
forwarding, no pty, no agent (docs/deploy.md, "Accounts and SSH").

Bytes are copied as they come, each piece written through as soon as it is read: stdin to the
socket, the socket to stdout. Not line by line: a raw log reply's bytes follow its line, and a
chunk that ends inside a line of the log must not wait in the bridge for a newline. When stdin
ends, the socket is half-closed and the runner's last answers are still copied out; when the runner closes the connection first, the bridge exits with status 1.

    python -m goaltender.runner.attach [--socket PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Protocol

from goaltender.protocol import messages as p
from goaltender.protocol.client import LineWriter, socket_from_env
from goaltender.protocol.quick_client import unreachable

EXIT_OK = 0  # the client (stdin) ended first
EXIT_CLOSED = 1  # the runner closed the connection first
EXIT_UNREACHABLE = 4  # as the CLI: the runner could not be reached
COPY_CHUNK = 256 * 1024  # the most bytes copied in one piece
DRAIN_AFTER_EOF_S = 30.0  # after stdin ends, how long the runner may take to finish answering


class _Reader(Protocol):
    """What the bridge copies from: asyncio and asyncssh streams, or a file read in a thread."""

    async def read(self, n: int) -> bytes: ...


async def attach(
    socket_path: str | Path, reader: _Reader | None = None, writer: LineWriter | None = None
) -> int:
    """Bridge `reader` (default: stdin) to the runner socket and the socket to `writer` (default:
    stdout) until either side closes; returns the exit status. Any object with
    `read(n)` / `write()` + `drain()` will do (asyncio streams, asyncssh process streams)."""
    try:
        sock_reader, sock_writer = await asyncio.open_unix_connection(str(socket_path), limit=p.MAX_LINE)
    except OSError as exc:  # said on stderr, which the bot shows in its error (bot/transports.py)
        print(f"goaltender runner attach: {unreachable(socket_path, exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if reader is None or writer is None:
        stdin, stdout = await _stdio()
        reader = reader or stdin
        writer = writer or stdout

    upstream = asyncio.ensure_future(_copy(reader, sock_writer))
    downstream = asyncio.ensure_future(_copy(sock_reader, writer))
    try:
        await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        if upstream.done() and upstream.exception() is None:
            # The client is done sending: let the runner see EOF, and pass on what it still says.
            with contextlib.suppress(OSError):
                sock_writer.write_eof()
            with contextlib.suppress(TimeoutError, _WriteFailed):
                await asyncio.wait_for(asyncio.shield(downstream), DRAIN_AFTER_EOF_S)
            return EXIT_OK
        if downstream.done() and downstream.exception() is not None:
            return EXIT_OK  # stdout is gone: the client hung up
        print("goaltender runner attach: the runner closed the connection", file=sys.stderr)
        return EXIT_CLOSED
    finally:
        for task in (upstream, downstream):
            task.cancel()
        await asyncio.gather(upstream, downstream, return_exceptions=True)
        sock_writer.close()
        with contextlib.suppress(Exception):
            await sock_writer.wait_closed()


class _WriteFailed(Exception):
    """The far side of a copy went away."""


async def _copy(source: _Reader, sink: LineWriter) -> None:
    """Copy what arrives, as it arrives, until EOF."""
    while True:
        try:
            chunk = await source.read(COPY_CHUNK)
        except (ConnectionError, OSError):
            return
        if not chunk:
            return
        try:
            sink.write(chunk)
            await sink.drain()
        except (ConnectionError, OSError) as exc:
            raise _WriteFailed(str(exc)) from exc


async def _stdio() -> tuple[_Reader, LineWriter]:
    """This process's stdin and stdout as asyncio streams (threads for regular files)."""
    loop = asyncio.get_running_loop()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    reader: _Reader
    writer: LineWriter
    if _pollable(stdin.fileno()):
        stream = asyncio.StreamReader(limit=p.MAX_LINE)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), stdin)
        reader = stream
    else:
        reader = _FileReader(stdin)
    if _pollable(stdout.fileno()):
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, stdout)
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
    else:
        writer = _FileWriter(stdout)
    return reader, writer


def _pollable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


class _FileReader:
    """stdin redirected from a regular file (which asyncio cannot poll): read in a thread."""

    def __init__(self, file):
        self._file = file

    async def read(self, n: int) -> bytes:
        return await asyncio.to_thread(self._file.read1, n)


class _FileWriter:
    def __init__(self, file):
        self._file = file
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._pending.append(data)

    async def drain(self) -> None:
        data, self._pending = b"".join(self._pending), []

        def write() -> None:
            self._file.write(data)
            self._file.flush()

        await asyncio.to_thread(write)


def run(socket_path: str | Path | None = None) -> int:
    """Run the bridge to `socket_path` (default: $GOALTENDER_SOCKET, else the runner's default
    socket) and return the exit status. This is what `goaltender runner attach` calls."""
    if socket_path is None:
        socket_path = socket_from_env()
    return asyncio.run(attach(socket_path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="goaltender runner attach",
        description="Bridge stdin/stdout to the runner's socket (for SSH hosts without stream forwarding).",
    )
    parser.add_argument(
        "--socket", type=Path, help="runner socket (default: $GOALTENDER_SOCKET or ~/.goaltender)"
    )
    args = parser.parse_args(argv)
    return run(args.socket)


if __name__ == "__main__":
    sys.exit(main())
