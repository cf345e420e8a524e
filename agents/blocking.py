"""How an agent without asyncio or pydantic starts and ends: the sweep, whose start-up is part of
every campaign it runs (issue 13: importing them was ~0.2 s of the demo's ~2 s).

It keeps the contract of agents/bootstrap.py, which the other agents use: the same environment
(GOALTENDER_GOAL_ID, GOALTENDER_SOCKET, GOALTENDER_WORKSPACE, GOALTENDER_RESUMED) and exit codes,
the same ends (a stop's short report, a failure's milestone, a misconfiguration's). It talks to the
runner through a blocking quick_client.Session, in plain dicts shaped as protocol/messages.py's
models encode them; the runner validates every request.

SIGTERM (the runner's stop) and SIGINT raise Stopped wherever the agent is: it hands in its report
within `stop_within_s` and exits 0. A second signal while it does ends it at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from goaltender.agents.tool_output import one_line
from goaltender.protocol.quick_client import RunnerRefused, RunnerUnavailable, Session, socket_from_env

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from typing import Any, ClassVar, Literal, NoReturn, overload

    from goaltender.protocol.quick_client import (
        DecisionView,
        DiaryView,
        DoneView,
        ExperimentView,
        InboxView,
        SummaryView,
    )

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_MISCONFIGURED = 2
EXIT_NO_RUNNER = 4


class Misconfigured(ValueError):
    """Settings the agent cannot run with; the message says which and what is wrong."""


class AgentFailure(Exception):
    """The agent cannot go on: `title` (and `detail`) go into a milestone, the process exits 1."""

    def __init__(self, title: str, detail: str = ""):
        super().__init__(title)
        self.title = title
        self.detail = detail


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived (a BaseException: no `except Exception` swallows it)."""


def agent_log(name: str) -> logging.Logger:
    """The agent's lines in agent.log (the runner keeps an agent's stderr there)."""
    return logging.getLogger(f"{name}-agent")


@dataclass(frozen=True)
class PlainGoal:
    """The goal a blocking agent process was started for, and its link to the runner."""

    id: int
    workspace: Path
    resumed: bool
    runner: Session


class BlockingAgent:
    """What every blocking agent has: its goal and runner, a way to report, and its ends."""

    stop_within_s: ClassVar[float] = 2.5  # its report must reach the runner inside the grace period

    def __init__(self, goal: PlainGoal):
        self.goal = goal
        self.goal_id = goal.id
        self.runner = goal.runner
        self.workspace = goal.workspace

    if TYPE_CHECKING:  # the reply's view by the reply type asked for, as Session.call has them

        @overload
        def call(self, kind: str, expect: Literal["done"] = "done", /, **fields: Any) -> DoneView: ...
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

    def call(self, kind: str, expect: str = "done", /, **fields: Any) -> Any:
        """A request about this goal (`goal_id` is filled in) and its reply."""
        return self.runner.call(kind, expect, goal_id=self.goal_id, **fields)

    def run(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Stopped by a signal: hand in a short report, fast."""

    def fail(self, failure: AgentFailure) -> None:
        self.milestone(failure.title, failure.detail)

    def milestone(self, title: str, text: str = "") -> None:
        self.call("milestone", title=one_line(title, 300), text=text[:20_000])

    def submit_report(self, text: str) -> None:
        self.call("submit_report", text=text[:50_000])


def process_goal(name: str) -> tuple[logging.Logger, int]:
    """Every agent process's start: its log lines go to stderr (agent.log) as `<name>-agent`, and
    its goal is GOALTENDER_GOAL_ID; without one it exits EXIT_MISCONFIGURED."""
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    log = agent_log(name)
    log.setLevel(logging.INFO)
    raw_goal = os.environ.get("GOALTENDER_GOAL_ID", "")
    if not raw_goal.isdigit():
        log.error("GOALTENDER_GOAL_ID is not set (to a goal number); the runner starts this agent for a goal")
        sys.exit(EXIT_MISCONFIGURED)
    return log, int(raw_goal)


def process_exit(code: int) -> NoReturn:
    """Every agent process's end. Nothing is left to do but the interpreter's own teardown
    (finalising every module and object), which was ~0.1 s of each goal's end: the logs are
    flushed, and the agent has closed what it opened (sessions, files, child processes)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_blocking_agent(name: str, label: str, build: Callable[[PlainGoal], BlockingAgent]) -> NoReturn:
    """The entry point of a blocking agent process; as bootstrap.run_agent, with `build` a plain
    function (it may call the runner through the goal, and raise Misconfigured)."""
    log, goal_id = process_goal(name)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_stopped)
    runner = Session(socket_from_env(), client=f"agent:{name}:{goal_id}")
    try:
        code = _serve(runner, build, label, log, goal_id)
    except Stopped:  # a second signal while stopping, or one while starting
        code = EXIT_DONE
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    runner.close()
    process_exit(code)


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def _serve(
    runner: Session,
    build: Callable[[PlainGoal], BlockingAgent],
    label: str,
    log: logging.Logger,
    goal_id: int,
) -> int:
    try:
        runner.open()
    # RunnerUnavailable, a socket path that cannot work, a refused hello
    except (OSError, RunnerRefused) as exc:
        log.error("cannot reach the runner at %s: %s", runner.path, exc)
        return EXIT_NO_RUNNER
    workspace = Path(os.environ.get("GOALTENDER_WORKSPACE") or os.getcwd())
    goal = PlainGoal(goal_id, workspace, resumed=bool(os.environ.get("GOALTENDER_RESUMED")), runner=runner)
    try:
        return _run(build, goal, label, log)
    except RunnerUnavailable as exc:
        log.error("lost the runner: %s", exc)
        return EXIT_NO_RUNNER


def _run(
    build: Callable[[PlainGoal], BlockingAgent], goal: PlainGoal, label: str, log: logging.Logger
) -> int:
    try:
        agent = build(goal)
    except Misconfigured as exc:
        log.error("misconfigured: %s", exc)
        goal.runner.call(
            "milestone", "done", goal_id=goal.id, title=f"{label} is misconfigured", text=str(exc)
        )
        return EXIT_MISCONFIGURED
    try:
        agent.run()
        return EXIT_DONE
    except Stopped:
        log.info("stopped by a signal: handing in the report")
        _within(goal.runner, agent.stop_within_s, agent.stop)
        return EXIT_DONE
    except AgentFailure as failure:
        log.error("%s%s", failure.title, f" ({failure.detail})" if failure.detail else "")
        _within(goal.runner, 10, agent.fail, failure)
        return EXIT_FAILED


def _within(runner: Session, seconds: float, step: Callable[..., None], *args: Any) -> None:
    """`step`, its calls to the runner answered within `seconds` or cut short; whatever it raises
    but a signal is dropped (the agent is ending anyway)."""
    runner.deadline = time.monotonic() + seconds
    with contextlib.suppress(Exception):
        step(*args)
