"""How an asyncio agent process starts and ends: the built-in agent and the Codex agent (the
sweep keeps the same contract without asyncio or pydantic: agents/blocking.py).

The runner starts an agent in the goal's workspace with GOALTENDER_GOAL_ID, GOALTENDER_SOCKET,
GOALTENDER_WORKSPACE and, after a runner restart, GOALTENDER_RESUMED. `run_agent` connects to the
runner, builds the agent and runs it; the exit code tells the runner how it went:

- 0: the campaign ended, or it was stopped: SIGTERM (the runner's stop) or SIGINT cancels the run
  and the agent's `stop()` hands in a short report, well inside the runner's grace period;
- 1: the agent failed (it raised AgentFailure): `fail()` says why in a milestone and the report;
- 2: misconfigured (Misconfigured, e.g. a bad environment variable): a milestone says what to fix;
- 4: the runner cannot be reached, or the link to it dropped.

Agent settings come from the environment through pydantic-settings (`read_settings`), with
messages that name the variable and what is wrong with its value.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

from pydantic import ValidationError

from goaltender.agents.blocking import EXIT_DONE as EXIT_DONE
from goaltender.agents.blocking import EXIT_FAILED as EXIT_FAILED
from goaltender.agents.blocking import EXIT_MISCONFIGURED as EXIT_MISCONFIGURED
from goaltender.agents.blocking import EXIT_NO_RUNNER as EXIT_NO_RUNNER
from goaltender.agents.blocking import AgentFailure as AgentFailure
from goaltender.agents.blocking import Misconfigured as Misconfigured
from goaltender.agents.blocking import agent_log as agent_log
from goaltender.agents.blocking import process_exit, process_goal
from goaltender.agents.tool_output import one_line
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable, socket_from_env

if TYPE_CHECKING:  # only the agents that read settings import pydantic-settings (~0.1 s)
    from pydantic_settings import BaseSettings

S = TypeVar("S", bound="BaseSettings")


@dataclass(frozen=True)
class Goal:
    """The goal an agent process was started for, and its link to the runner."""

    id: int
    workspace: Path
    resumed: bool
    runner: RunnerClient


class GoalAgent:
    """What every agent has: its goal and runner, a way to report, and the ends of its life."""

    # How long stop() may take: its report must reach the runner before the grace period ends.
    stop_within_s: ClassVar[float] = 2.5

    def __init__(self, goal: Goal):
        self.goal = goal
        self.goal_id = goal.id
        self.runner = goal.runner
        self.workspace = goal.workspace

    async def run(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """Stopped by a signal: hand in a short report, fast."""

    async def fail(self, failure: AgentFailure) -> None:
        await self.milestone(failure.title, failure.detail)

    async def close(self) -> None:
        """Whatever the ending: release what the agent holds (child processes, clients)."""

    async def milestone(self, title: str, text: str = "") -> str:
        """What the runner said: logged, or folded past the goal's rate (runner/folding.py)."""
        reply = await self.runner.request(
            p.ReportMilestone(goal_id=self.goal_id, title=one_line(title, 300), text=text[:20_000])
        )
        return reply.message

    async def submit_report(self, text: str) -> None:
        await self.runner.request(p.SubmitReport(goal_id=self.goal_id, text=text[:50_000]))


def read_settings(settings: type[S]) -> S:
    """`settings` from the environment; Misconfigured says which variable is wrong and how."""
    try:
        return settings()
    except ValidationError as exc:
        raise Misconfigured("; ".join(_problem(settings, error) for error in exc.errors())) from None


def _problem(settings: type[BaseSettings], error: Any) -> str:
    where = str(error["loc"][0]) if error["loc"] else ""
    field = settings.model_fields.get(where)
    if field is not None:  # not an alias: the variable is the prefix and the field's name
        where = f"{settings.model_config.get('env_prefix', '')}{where}".upper()
    kind, value = error["type"], error.get("input")
    if kind == "missing":
        hint = field.description if field is not None else None
        return f"{where} is not set" + (f": {hint}" if hint else "")
    if kind.endswith("_parsing"):
        return f"{where}={value!r} is not a {kind.removesuffix('_parsing')}"
    if kind == "greater_than_equal":
        return f"{where}={value!r} must be at least {error['ctx']['ge']}"
    if kind == "greater_than":
        return f"{where}={value!r} must be more than {error['ctx']['gt']}"
    return f"{where}={value!r}: {error['msg']}"


Build = Callable[[Goal], GoalAgent | Awaitable[GoalAgent]]


def run_agent(name: str, label: str, build: Build) -> NoReturn:
    """The entry point of an agent process. `name` is how the runner and agent.log know it
    ("openai" -> client `agent:openai:<goal>`, lines `openai-agent: ...`), `label` how people do
    ("The built-in agent"); `build` makes the agent once the runner is connected (a coroutine when
    it must ask the runner first, e.g. for the goal's words), and may raise Misconfigured."""
    _, goal_id = process_goal(name)
    process_exit(asyncio.run(_serve(name, label, build, goal_id)))


async def _serve(name: str, label: str, build: Build, goal_id: int) -> int:
    log = agent_log(name)
    main = asyncio.current_task()
    assert main is not None  # asyncio.run runs us in a task
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, main.cancel)
    path = socket_from_env()
    try:
        runner = await RunnerClient.connect_unix(path, client=f"agent:{name}:{goal_id}")
    except asyncio.CancelledError:
        return EXIT_DONE
    except OSError as exc:  # RunnerUnavailable, or a socket path that cannot work
        log.error("cannot reach the runner at %s: %s", path, exc)
        return EXIT_NO_RUNNER
    workspace = Path(os.environ.get("GOALTENDER_WORKSPACE") or os.getcwd())
    goal = Goal(goal_id, workspace, resumed=bool(os.environ.get("GOALTENDER_RESUMED")), runner=runner)
    try:
        return await _run(build, goal, label, log)
    except asyncio.CancelledError:  # a second signal while stopping, or one while misconfigured
        return EXIT_DONE
    except RunnerUnavailable as exc:
        log.error("lost the runner: %s", exc)
        return EXIT_NO_RUNNER
    finally:
        await runner.close()


async def _run(build: Build, goal: Goal, label: str, log: logging.Logger) -> int:
    try:
        made = build(goal)
        agent = made if isinstance(made, GoalAgent) else await made
    except Misconfigured as exc:
        log.error("misconfigured: %s", exc)
        title = f"{label} is misconfigured"
        await goal.runner.request(p.ReportMilestone(goal_id=goal.id, title=title, text=str(exc)))
        return EXIT_MISCONFIGURED
    try:
        await agent.run()
        return EXIT_DONE
    except asyncio.CancelledError:
        log.info("stopped by a signal: handing in the report")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(agent.stop(), agent.stop_within_s)
        return EXIT_DONE
    except AgentFailure as failure:
        log.error("%s%s", failure.title, f" ({failure.detail})" if failure.detail else "")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(agent.fail(failure), 10)
        return EXIT_FAILED
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(agent.close())
