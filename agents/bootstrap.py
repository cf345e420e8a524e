"""One bootstrap for every agent process the runner starts (the sweep, the built-in agent, Codex).

    def main() -> None:
        run_agent("sweep", "sweep agent", lambda runner, goal: SweepAgent(runner, goal, ...))

It reads the goal from the environment the runner sets (GOALTENDER_GOAL_ID, GOALTENDER_WORKSPACE,
GOALTENDER_RESUMED), connects to the runner (GOALTENDER_SOCKET), runs the agent, and turns what
happens into the exit code the runner reads:

- 0: the agent is done, or was stopped: SIGTERM or SIGINT cancels it, and it hands in a short
  report (Agent.stop) within the runner's grace period;
- 1: the goal fails: the agent raised one of its `failures`, and told people why (Agent.fail);
- 2: misconfigured: no goal id, or a ConfigError, reported as a milestone;
- 4: the runner cannot be reached, or went away.

Agents log through `logging` under goaltender.agents; the bootstrap sends those lines to stderr,
which the runner keeps as the goal's agent.log.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from goaltender.agents.settings import ConfigError
from goaltender.runner import protocol as p
from goaltender.runner.client import RunnerClient, RunnerUnavailable, socket_from_env

log = logging.getLogger(__name__)

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_MISCONFIGURED = 2
EXIT_NO_RUNNER = 4
FAIL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Goal:
    """The goal an agent process was started for."""

    id: int
    workspace: Path
    resumed: bool  # started again after a runner restart


class Agent(abc.ABC):
    failures: tuple[type[Exception], ...] = ()  # what fails the goal (exit 1, after fail())
    stop_timeout_s = 2.5  # stop() must be done within the runner's grace period

    @abc.abstractmethod
    async def run(self) -> int:
        """Pursue the goal; the exit code."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stopped by the runner (or Ctrl-C): hand in a short report, fast."""

    async def fail(self, reason: Exception) -> None:  # noqa: B027 -- agents without failures need none
        """The goal fails because of `reason`: tell people why (a milestone, the report)."""

    async def close(self) -> None:  # noqa: B027 -- agents that hold nothing need none
        """Release what the agent holds (processes, connections); called however it ended."""


MakeAgent = Callable[[RunnerClient, Goal], Agent]  # may raise ConfigError


def run_agent(kind: str, label: str, make: MakeAgent) -> NoReturn:
    """Run the agent `make` builds for the goal in the environment; exit with its code. `kind`
    names it to the runner (client `agent:<kind>:<goal>`) and in its log lines; `label` in the
    milestone about a bad configuration ("The <label> is misconfigured")."""
    _log_to_stderr(f"{kind}-agent")
    goal_id = os.environ.get("GOALTENDER_GOAL_ID", "").strip()
    if not goal_id:
        log.error("GOALTENDER_GOAL_ID is not set; the runner starts this agent for a goal")
        sys.exit(EXIT_MISCONFIGURED)
    goal = Goal(
        id=int(goal_id),
        workspace=Path(os.environ.get("GOALTENDER_WORKSPACE") or os.getcwd()),
        resumed=bool(os.environ.get("GOALTENDER_RESUMED")),
    )
    sys.exit(asyncio.run(_serve(kind, label, make, goal)))


async def _serve(kind: str, label: str, make: MakeAgent, goal: Goal) -> int:
    main = asyncio.current_task()
    assert main is not None  # asyncio.run runs us in a task
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, main.cancel)
    runner: RunnerClient | None = None
    agent: Agent | None = None
    try:
        runner = await RunnerClient.connect_unix(socket_from_env(), client=f"agent:{kind}:{goal.id}")
        try:
            agent = make(runner, goal)
        except ConfigError as exc:
            log.error("misconfigured: %s", exc)
            await runner.call(
                p.ReportMilestone,
                p.Done,
                goal_id=goal.id,
                title=f"The {label} is misconfigured",
                text=str(exc),
            )
            return EXIT_MISCONFIGURED
        return await agent.run()
    except asyncio.CancelledError:
        log.info("stopped: handing in the report")
        if agent is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(agent.stop(), agent.stop_timeout_s)
        return EXIT_DONE
    except RunnerUnavailable as exc:
        log.error("%s: %s", "lost the runner" if runner is not None else "cannot reach the runner", exc)
        return EXIT_NO_RUNNER
    except Exception as exc:
        if agent is None or not isinstance(exc, agent.failures):
            raise
        log.error("failed: %s", exc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(agent.fail(exc), FAIL_TIMEOUT_S)
        return EXIT_FAILED
    finally:
        if agent is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(agent.close())
        if runner is not None:
            await runner.close()


def _log_to_stderr(name: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {name}: %(message)s", "%H:%M:%S"))
    # `python -m goaltender.agents.x` runs the agent's own module as __main__.
    for logger in (logging.getLogger("goaltender.agents"), logging.getLogger("__main__")):
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
