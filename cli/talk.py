"""How commands reach the runner, and the checks made before they do.

Two ways: the hot agent verbs send plain JSON through protocol/quick_client.py (the standard library
alone: no pydantic, no asyncio, issue 13); the others open a RunnerClient (asyncio, the protocol's
models), imported by run() when it runs. Either way bad input is found here first, as the
protocol's models would find it, and said as a usage error (exit 2) whether or not a runner is up."""

from __future__ import annotations

import json

from goaltender.cli.common import UsageError
from goaltender.protocol.quick_client import (
    RunnerRefused,
    RunnerUnavailable,
    encode,
    exchange,
    socket_from_env,
)
from goaltender.protocol.wire import MAX_LINE

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable, Callable
    from pathlib import Path
    from typing import Any, TypeVar

    from goaltender.protocol import messages as p
    from goaltender.protocol.client import RunnerClient

    Q = TypeVar("Q", bound=p.Request)


def socket(args: argparse.Namespace) -> str | Path:
    return args.socket or socket_from_env()


def client(args: argparse.Namespace) -> str:
    """How the runner's records name this client: cli:<the command>."""
    return f"cli:{args.verb}"


def run(args: argparse.Namespace, body: Callable[[RunnerClient], Awaitable[int | None]]) -> int:
    """`body` with a RunnerClient connected as this command; its exit code (None: ok)."""
    import asyncio

    from goaltender.protocol.client import RunnerClient

    async def go() -> int | None:
        async with await RunnerClient.connect_unix(socket(args), client=client(args)) as runner:
            return await body(runner)

    return asyncio.run(go()) or 0


def send(args: argparse.Namespace, requests: list[str]) -> list[dict[str, Any]]:
    """The `done` replies to `requests` (quick_client.encode() of what the protocol's models would
    send, without id), sent at once by the blocking client.

    Input the runner could not take is only looked into when it refuses (or is not there): then the
    models say why, as checked() does for the other verbs, so it is still a usage error (exit 2)."""
    try:
        return exchange(socket(args), client(args), requests)
    except RunnerUnavailable:
        _check_requests(requests)
        raise
    except RunnerRefused as refused:
        if refused.code in ("bad_json", "bad_request", "line_too_long"):
            _check_requests(requests)
        raise


def say_done(args: argparse.Namespace, request: dict[str, Any]) -> int:
    """Send one request answered by `done` (through send()), and print what the runner says."""
    print(send(args, [encode(request)])[0]["message"])
    return 0


def _check_requests(requests: list[str]) -> None:
    from goaltender.protocol import messages as p

    for request in requests:
        fields = json.loads(request)
        checked(p.REQUEST_MODELS[fields.pop("type")], **fields)


def checked(kind: type[Q], /, **fields: Any) -> Q:
    """The `kind` request `fields` make, once the runner could take it (the client numbers it when
    it is sent); UsageError saying why not.

    Checked here, before connecting, so bad input never reaches the runner or prints a traceback."""
    from pydantic import ValidationError
    from pydantic_core import PydanticSerializationError

    from goaltender.protocol import messages as p

    try:
        request = kind(id=0, **fields)
        size = len(p.encode(request))
    except ValidationError as exc:
        raise UsageError(p.problems(exc, kind)) from None
    except PydanticSerializationError as exc:
        raise UsageError(f"cannot send this to the runner: {exc}") from None
    if size > MAX_LINE:
        raise UsageError(f"too much to send: {size:,} bytes, over the runner's limit of {MAX_LINE:,}")
    return request


# ---- words the runner would refuse (read on this side with the runner's own parser) ----


def require_sound_interpreter() -> None:
    """Refuse, in one line, to read budget words on a Python that misreads them (selftest.py)."""
    from goaltender.selftest import interpreter_problem

    if problem := interpreter_problem():
        raise UsageError(problem)


def check_goal_words(text: str) -> None:
    """The runner would refuse these goal words (budget 0h, max 0 experiments): say so now."""
    from goaltender.protocol.budget import GoalTextError, parse_goal_text

    require_sound_interpreter()
    try:
        parse_goal_text(text)
    except GoalTextError as exc:
        raise UsageError(str(exc)) from None


def check_budget_words(change: str) -> None:
    """Budget words that cannot be whatever the goal's budget (+0h, budget 0h), in a change or a
    steer (the runner applies those too): say so now."""
    from goaltender.protocol.budget import GoalTextError, apply_budget_change
    from goaltender.storage.records import Budget, utcnow

    require_sound_interpreter()
    try:
        apply_budget_change(Budget(), change, utcnow())
    except GoalTextError as exc:
        raise UsageError(str(exc)) from None


def duration(text: str | None) -> float | None:
    """`10m`, `2h`, `90` (seconds): from 1s to 365 days."""
    if text is None:
        return None
    from goaltender.protocol.budget import GoalTextError, check_duration, parse_duration

    require_sound_interpreter()
    seconds = parse_duration(text)
    if seconds is None:
        try:
            seconds = float(text)
        except ValueError:
            raise UsageError(f"not a duration: {text[:40]!r} (try 90s, 10m, 2h)") from None
    try:
        return check_duration(seconds, text, "a timeout", "`90s`, `10m` or `2h`")
    except GoalTextError as exc:
        raise UsageError(str(exc)) from None
