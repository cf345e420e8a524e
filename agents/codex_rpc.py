"""JSON-RPC plumbing for `codex app-server` on stdio.

One JSON object per line, JSON-RPC 2.0 minus the "jsonrpc" field. The client sends requests
({id, method, params}) and notifications ({method, params}); the server answers with {id, result}
or {id, error}, pushes notifications, and sends requests of its own (approvals) that must be
answered, or the turn waits forever. Every wait here has a timeout, and every server request gets
an answer: the handler's result, or a JSON-RPC error when it has none.

    server = AppServer(["codex", "app-server"], env=env, cwd=workspace, stderr_path=log,
                       on_request=answer, on_notification=observe)
    await server.start()
    await server.request("initialize", {...}, wait_s=30)
    await server.notify("initialized")
    ...
    method, params = await server.next_notification(wait_s=1.0)   # None on timeout
    await server.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from goaltender.runner.supervisor import terminate_group

# JSON-RPC error codes used when answering the server.
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603

READ_LIMIT = 64 * 1024 * 1024  # one line can carry a whole command's output


class RpcError(Exception):
    """The server answered a request with an error (or we answer one of its requests with one)."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data


class AppServerGone(ConnectionError):
    """The app-server process exited or closed its stdout."""


RequestHandler = Callable[[str, dict, Any], Awaitable[Any]]  # (method, params, id) -> result
NotificationObserver = Callable[[str, dict], None]


def _death_signal_setter() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when the agent dies, even by SIGKILL
    (Linux PR_SET_PDEATHSIG). libc is loaded here, before the fork, not in the child."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return set_death_signal


class AppServer:
    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        stderr_path: Path,
        on_request: RequestHandler,
        on_notification: NotificationObserver | None = None,
    ):
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.stderr_path = stderr_path
        self.on_request = on_request
        self.on_notification = on_notification
        self.proc: asyncio.subprocess.Process | None = None
        self.returncode: int | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._notifications: asyncio.Queue[tuple[str, dict] | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task] = set()
        self._reader: asyncio.Task | None = None
        self._write_lock = asyncio.Lock()
        self.gone = asyncio.Event()
        self._command_groups: set[int] = set()  # see interrupt()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        """Spawn the server as the leader of its own process group, stdin a pipe we own (its EOF
        ends the server), stdout for the protocol, stderr appended to a log file."""
        self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with self.stderr_path.open("ab") as stderr:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                cwd=self.cwd,
                env=self.env,
                limit=READ_LIMIT,
                process_group=0,
                preexec_fn=_death_signal_setter(),
            )
        self._reader = asyncio.ensure_future(self._read_loop())

    # ---- client -> server ----

    async def request(self, method: str, params: dict | None = None, *, wait_s: float) -> dict:
        """Send a request and wait (at most `wait_s` s) for its result; RpcError on an error reply."""
        if self.gone.is_set():
            raise AppServerGone(self.describe_exit())
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._send({"id": request_id, "method": method, "params": params or {}})
            message = await asyncio.wait_for(future, wait_s)
        except TimeoutError:
            raise TimeoutError(f"codex app-server did not answer {method} within {wait_s:g}s") from None
        finally:
            self._pending.pop(request_id, None)
        if "error" in message:
            error = message["error"] or {}
            raise RpcError(error.get("code", 0), error.get("message", "unknown error"), error.get("data"))
        return message.get("result") or {}

    async def interrupt(self, thread_id: str | None, turn_id: str | None, *, wait_s: float) -> dict:
        """turn/interrupt. Codex runs each command in a process group of its own, and an
        interrupt can leave one orphaned: the groups running now are remembered for close()."""
        if self.proc is not None:
            self._command_groups |= await asyncio.to_thread(_descendant_groups, self.proc.pid)
        return await self.request("turn/interrupt", {"threadId": thread_id, "turnId": turn_id}, wait_s=wait_s)

    async def notify(self, method: str, params: dict | None = None) -> None:
        message: dict[str, Any] = {"method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    async def next_notification(self, wait_s: float) -> tuple[str, dict] | None:
        """The next notification, or None after `wait_s` s. AppServerGone once the server is
        gone and every notification it sent has been taken."""
        try:
            item = await asyncio.wait_for(self._notifications.get(), wait_s)
        except TimeoutError:
            return None
        if item is None:
            self._notifications.put_nowait(None)  # stay closed for later readers
            raise AppServerGone(self.describe_exit())
        return item

    async def _send(self, message: dict) -> None:
        if self.proc is None or self.proc.stdin is None or self.gone.is_set():
            raise AppServerGone(self.describe_exit())
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        async with self._write_lock:
            try:
                self.proc.stdin.write(data)
                await asyncio.wait_for(self.proc.stdin.drain(), 30)
            except (ConnectionError, OSError, TimeoutError) as exc:
                # Most likely it has just exited: say how, rather than "connection lost".
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.gone.wait(), 2)
                why = (
                    self.describe_exit() if self.gone.is_set() else f"cannot write to codex app-server: {exc}"
                )
                raise AppServerGone(why) from exc

    # ---- server -> client ----

    async def _read_loop(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    continue  # not protocol (should not happen on stdout); ignore
                if not isinstance(message, dict):
                    continue
                method = message.get("method")
                if method is None:  # a response to one of ours
                    future = self._pending.get(message.get("id", -1))
                    if future is not None and not future.done():
                        future.set_result(message)
                elif "id" in message:  # a request from the server: always answered
                    self._spawn(self._answer(message["id"], method, message.get("params") or {}))
                else:
                    params = message.get("params") or {}
                    if self.on_notification is not None:
                        with contextlib.suppress(Exception):
                            self.on_notification(method, params)
                    self._notifications.put_nowait((method, params))
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                self.returncode = await asyncio.wait_for(self.proc.wait(), 5)
            self.gone.set()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(AppServerGone(self.describe_exit()))
            self._notifications.put_nowait(None)

    async def _answer(self, request_id: Any, method: str, params: dict) -> None:
        try:
            result = await self.on_request(method, params, request_id)
            reply: dict[str, Any] = {"id": request_id, "result": result}
        except RpcError as exc:
            reply = {"id": request_id, "error": {"code": exc.code, "message": exc.message}}
        except asyncio.CancelledError:
            reply = {"id": request_id, "error": {"code": INTERNAL_ERROR, "message": "client shutting down"}}
            with contextlib.suppress(Exception):
                await self._send(reply)
            raise
        except Exception as exc:  # a bug on our side must not leave Codex waiting
            reply = {"id": request_id, "error": {"code": INTERNAL_ERROR, "message": f"client error: {exc}"}}
        with contextlib.suppress(AppServerGone):
            await self._send(reply)

    def _spawn(self, coro: Awaitable) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- ending ----

    def describe_exit(self) -> str:
        code = self.returncode
        if code is None and self.proc is not None:
            code = self.proc.returncode
        if code is None:
            how = "closed its output"
        elif code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"codex app-server {how}"

    def stderr_tail(self, limit: int = 1200) -> str:
        try:
            with self.stderr_path.open("rb") as f:
                f.seek(max(0, self.stderr_path.stat().st_size - limit))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""

    async def close(self, grace_s: float = 0.5) -> None:
        """Close stdin (the server exits on EOF and ends its commands); if it lingers past
        `grace_s`, SIGTERM its whole process group and SIGKILL it after another `grace_s`. Anything
        it left in its group (node wrapper children) goes too, and so do the commands it runs in
        groups of their own, should it not have ended them. Waits until the server is reaped."""
        for task in list(self._tasks):
            task.cancel()
        if self.proc is None:
            return
        commands = self._command_groups | await asyncio.to_thread(_descendant_groups, self.proc.pid)
        if self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        exited = asyncio.ensure_future(self.proc.wait())
        await asyncio.wait({exited}, timeout=grace_s)
        await asyncio.gather(
            terminate_group(self.proc.pid, exited, grace_s),
            *(terminate_group(pgid, grace_s=grace_s) for pgid in commands),
        )
        await asyncio.wait({exited}, timeout=2)  # already reaped when its group was gone at once
        self.returncode = self.proc.returncode
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 2)


def _descendant_groups(pid: int) -> set[int]:
    """The process groups of `pid`'s descendants, other than its own and ours."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    groups = set()
    for proc in descendants:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(proc.pid))
    return groups - {pid, os.getpgrp()}
