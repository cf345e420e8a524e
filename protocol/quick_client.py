"""A blocking client for the runner's Unix socket, on the standard library alone, for the agent
verbs that send a request or a few and exit (`goaltender milestone`, `metrics`, `diary`, ...).

Every agent verb is a process of its own: importing pydantic and asyncio for RunnerClient cost
several times a bare Python's start-up on every milestone and metric (issue 13). Here a request is
the JSON of a plain dict shaped as protocol/messages.py's model encodes it; the runner validates it.

    [reply] = exchange(socket_from_env(), "cli:milestone", [encode({"type": "milestone", ...})])

An agent that talks to the runner all campaign long without asyncio (the sweep) keeps a Session:

    runner = Session(socket_from_env(), "agent:sweep:3")
    summary = runner.call("summary", "summary", goal_id=3)

Also here, for both clients: where the socket is, how a long path is reached, and the errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence

from goaltender.protocol.wire import MAX_LINE, PROTOCOL_VERSION

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from typing import Any, Literal, TypeAlias, TypedDict, overload

    # A path as str or pathlib.Path: pathlib's import is a tenth of a quick verb's start-up.
    SocketPath: TypeAlias = str | os.PathLike[str]

    # The replies as this client hands them back: plain dicts, as protocol/messages.py's models
    # encode them (named after them), typed for mypy alone; what they hold further in is as the
    # models say (a Goal, an Experiment, an Approval), read as dicts.
    class DoneView(TypedDict):
        id: int
        type: Literal["done"]
        message: str

    class WelcomeView(TypedDict):
        id: int
        type: Literal["welcome"]
        version: int
        runner: str

    class SummaryView(TypedDict):
        id: int
        type: Literal["summary"]
        status: dict[str, Any]  # a GoalStatus
        ledger: list[dict[str, Any]]  # Experiments
        text: str

    class ExperimentView(TypedDict):
        id: int
        type: Literal["experiment"]
        experiment: dict[str, Any]
        new_best: bool
        stop_status: str

    class DecisionView(TypedDict):
        id: int
        type: Literal["decision"]
        approval: dict[str, Any]

    class InboxView(TypedDict):
        id: int
        type: Literal["inbox"]
        messages: list[dict[str, Any]]  # InboxMessages

    class DiaryView(TypedDict):
        id: int
        type: Literal["diary"]
        entries: list[dict[str, Any]]  # DiaryEntries


class RunnerUnavailable(ConnectionError):
    """The runner cannot be reached, or the link dropped."""


class RunnerRefused(Exception):
    """The runner answered a request with an `error` reply: its `code` and `message`."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def socket_from_env() -> str:
    """The runner socket an agent should use: GOALTENDER_SOCKET, else <GOALTENDER_HOME>/runner.sock."""
    if path := os.environ.get("GOALTENDER_SOCKET"):
        return path
    from goaltender.runner.config import RunnerSettings  # the home may come from GOALTENDER_CONFIG

    return str(RunnerSettings().socket_path)


@contextlib.contextmanager
def unix_address(path: SocketPath) -> Iterator[str]:
    """`path` as bind() and connect() take it: a path longer than a socket address may be (~107
    bytes; a runner home on a deep directory) is reached through /proc/self/fd/<its directory>."""
    path = os.fspath(path)
    if len(os.fsencode(path)) < 100:
        yield path
        return
    parent, name = os.path.split(path)
    directory = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{name}"
    finally:
        os.close(directory)


def unreachable(path: SocketPath, exc: OSError) -> RunnerUnavailable:
    """What to say when connecting to `path` failed with `exc`."""
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return RunnerUnavailable(
            f"no runner is listening on {path} ({exc.strerror}); start one with `goaltender runner`"
        )
    if isinstance(exc, PermissionError):
        return RunnerUnavailable(not_an_operator(path))
    return RunnerUnavailable(f"cannot reach the runner on {path}: {exc}")


def not_an_operator(path: SocketPath) -> str:
    """One line for an account the kernel keeps from the runner socket: who it is, and the fix."""
    problem, fix = operator_problem(path)
    return f"{problem}. {fix[0].upper()}{fix[1:]}"


def operator_problem(path: SocketPath) -> tuple[str, str]:
    """(what is wrong, the fix) for this process's account, which may not open the socket `path`."""
    import grp  # only on this path: a quick verb's start-up stays small
    import pwd

    uid = os.getuid()
    try:
        account = pwd.getpwuid(uid)
        name = account.pw_name
        groups = sorted(grp.getgrgid(gid).gr_name for gid in os.getgrouplist(name, account.pw_gid))
    except KeyError:
        name, groups = str(uid), []
    in_groups = f" (or one of its groups: {', '.join('@' + g for g in groups)})" if groups else ""
    return (
        f"user {name} (uid {uid}) may not open the runner socket {path} (Permission denied): "
        "it is not one of the runner's operators",
        f"on the runner, add {name}{in_groups} to GOALTENDER_OPERATORS and restart it, "
        "or run this as the runner's user",
    )


def encode(request: dict[str, Any]) -> str:
    """`request` (its type first, no id) as one compact JSON object, as exchange() takes it."""
    return json.dumps(request, separators=(",", ":"))


def exchange(
    path: SocketPath, client: str, requests: Sequence[str], expect: str = "done"
) -> list[dict[str, Any]]:
    """Say hello as `client`, send `requests` (JSON objects from encode()) and return their `expect`
    replies in order: everything in one write, one round trip. The hello's error, else the first
    request's, raises RunnerRefused; a lost link raises RunnerUnavailable."""
    lines = [f'{{"id":{n},{request[1:]}' for n, request in enumerate([encode(_hello(client)), *requests])]
    with _connect(path) as sock:
        with contextlib.suppress(OSError):  # the runner hung up (a refused hello): its reply says why
            sock.sendall("\n".join(lines).encode() + b"\n")
        replies = _replies(sock, len(lines))
    for number in range(len(lines)):
        if (reply := replies.get(number)) is None:
            raise RunnerUnavailable("the runner closed the connection")
        _answer(reply, expect if number else "welcome")
    return [replies[number] for number in range(1, len(lines))]


def _hello(client: str) -> dict[str, Any]:
    return {"type": "hello", "version": PROTOCOL_VERSION, "client": client}


def _answer(reply: dict[str, Any], expect: str) -> dict[str, Any]:
    """`reply` if it is the `expect` reply; an `error` raises RunnerRefused with its words."""
    if reply.get("type") == "error":
        raise RunnerRefused(str(reply.get("code")), str(reply.get("message")))
    if reply.get("type") != expect:
        raise RunnerRefused("internal", f"expected {expect}, got {reply.get('type')}")
    return reply


class Session:
    """One connection for many requests, each waited for in turn. A call that is interrupted (a
    signal's exception, a timeout) leaves the stream mid-line, so the connection is dropped and the
    next call opens another: the runner answers what the old one asked all the same."""

    def __init__(self, path: SocketPath, client: str):
        self.path = path
        self.client = client
        self.deadline: float | None = None  # time.monotonic() by which every call must be answered
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._ids = 0

    if TYPE_CHECKING:  # the reply's view, by the reply type asked for; start-up pays nothing

        @overload
        def call(self, kind: str, expect: Literal["done"], /, **fields: Any) -> DoneView: ...
        @overload
        def call(self, kind: str, expect: Literal["summary"], /, **fields: Any) -> SummaryView: ...
        @overload
        def call(self, kind: str, expect: Literal["experiment"], /, **fields: Any) -> ExperimentView: ...
        @overload
        def call(self, kind: str, expect: Literal["decision"], /, **fields: Any) -> DecisionView: ...
        @overload
        def call(self, kind: str, expect: Literal["inbox"], /, **fields: Any) -> InboxView: ...
        @overload
        def call(self, kind: str, expect: Literal["diary"], /, **fields: Any) -> DiaryView: ...
        @overload
        def call(self, kind: str, expect: str, /, **fields: Any) -> dict[str, Any]: ...

    def call(self, kind: str, expect: str, /, **fields: Any) -> Any:
        """Send a `kind` request with `fields` and return its `expect` reply (a dict as the runner
        sent it). An `error` reply raises RunnerRefused; a lost link RunnerUnavailable; a reply
        after the `deadline` TimeoutError."""
        try:
            self.open()
            return self._exchange({"type": kind, **fields}, expect)
        except BaseException:
            self.close()
            raise

    def open(self) -> None:
        """Connect and say hello, unless connected."""
        if self._sock is None:
            self._sock = _connect_socket(self.path)
            self._buffer = b""
            try:
                self._exchange(_hello(self.client), "welcome")
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _exchange(self, request: dict[str, Any], expect: str) -> dict[str, Any]:
        assert self._sock is not None
        self._ids += 1
        self._wait()
        try:
            self._sock.sendall(encode({"id": self._ids, **request}).encode() + b"\n")
        except TimeoutError:
            raise
        except OSError as exc:
            raise RunnerUnavailable(f"lost the runner: {exc}") from exc
        while True:
            reply = self._next_reply()
            if reply.get("id") == self._ids or (reply.get("type") == "error" and "id" not in reply):
                break  # else an answer to a call interrupted on an earlier connection: not ours
        return _answer(reply, expect)

    def _next_reply(self) -> dict[str, Any]:
        assert self._sock is not None
        while b"\n" not in self._buffer:
            self._wait()
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                raise
            except OSError as exc:
                raise RunnerUnavailable(f"lost the runner: {exc}") from exc
            if not chunk:
                raise RunnerUnavailable("the runner closed the connection")
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE and b"\n" not in self._buffer:
                raise RunnerUnavailable(f"the runner sent a line over {MAX_LINE} bytes")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise RunnerUnavailable(f"the runner sent a line that is not JSON: {exc}") from exc
        return reply if isinstance(reply, dict) else {}

    def _wait(self) -> None:
        """Give the socket's next send or receive what is left before the deadline."""
        assert self._sock is not None
        if self.deadline is None:
            self._sock.settimeout(None)
        elif (left := self.deadline - time.monotonic()) > 0:
            self._sock.settimeout(left)
        else:
            raise TimeoutError("the runner did not answer in time")


def _connect_socket(path: SocketPath) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with unix_address(path) as address:
            sock.connect(address)
    except OSError as exc:
        sock.close()
        raise unreachable(path, exc) from exc
    return sock


@contextlib.contextmanager
def _connect(path: SocketPath) -> Iterator[socket.socket]:
    with _connect_socket(path) as sock:
        yield sock


def _replies(sock: socket.socket, count: int) -> dict[int, dict[str, Any]]:
    """The replies to requests 0..count-1 by id, as many as came before the runner hung up (it
    answers each as it finishes, in any order). An error that answers no id (a line it could not
    read) stands for every reply missing."""
    replies: dict[int, dict[str, Any]] = {}
    try:
        with sock.makefile("rb") as stream:
            while len(replies) < count and (line := stream.readline()):
                reply = json.loads(line)
                if isinstance(reply, dict) and isinstance(number := reply.get("id"), int):
                    replies[number] = reply
                elif isinstance(reply, dict) and reply.get("type") == "error":
                    replies = {n: replies.get(n, reply) for n in range(count)}
    except (OSError, ValueError) as exc:
        raise RunnerUnavailable(f"lost the runner: {exc}") from exc
    return replies
