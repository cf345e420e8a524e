"""`goaltender demo`: the whole loop on a laptop — a local runner, the sweep agent, the star-count
campaign, and the goal's thread printed in the terminal as Slack would show it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

from goaltender.display import plots
from goaltender.display.terminal import ConsoleThread
from goaltender.environments.star_count import space
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner.config import RunnerSettings
from goaltender.runner.daemon import Runner, StartupFailed
from goaltender.storage.records import (
    ApprovalRequested,
    Event,
    Experiment,
    ExperimentFinished,
    ExperimentStarted,
    FinalReport,
    Goal,
    GoalAccepted,
    MetricsLogged,
    utcnow,
)

DEFAULT_GOAL = (
    "Train the star-count model to 98% exact accuracy on the fixed 64-example held-out split, "
    "budget 3m, max 10 experiments"
)
# The brief names star count's workload, knobs and eval command (agents/briefing.py), each agent in
# its own terms: the goal says what a person would.
LLM_GOAL = (
    "Train the star-count CPU model to 95% exact accuracy on the fixed 64-example held-out split, "
    "budget 10m, max 8 experiments"
)
# The demo's cost threshold: runs estimated above twice the baseline's own time ask first (the
# stride, ~2.5 times the baseline's cost), whatever the machine's speed: a threshold in seconds
# stopped asking, or asked for the baseline, as the box or the workload got faster or slower.
APPROVE_ABOVE = "2x"
CURVE_METRIC = "train_loss"
RUNNER_LOG = "runner.log"  # in the runner's home: what it logs as it runs the demo's goal


def run_demo(goal_text: str | None, *, directory: Path, yes: bool, agent: str = "sweep") -> int:
    if agent != "sweep" and (problem := asyncio.run(endpoint_problem(agent))):
        print(f"goaltender demo --agent {agent}: {problem}", file=sys.stderr)
        return 2
    text = goal_text or (DEFAULT_GOAL if agent == "sweep" else LLM_GOAL)
    # The runs' BLAS threads, in the environment their standbys import numpy in (the workload's own
    # default comes after a preloaded numpy has read it): two, but one core left to the runner, the
    # agent and the standbys. OpenBLAS threads spin while they wait for one another, and one that
    # lost its core to another process made training up to three times as slow on a 2-core box.
    threads = str(min(2, max(1, (os.cpu_count() or 1) - 1)))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, threads)
    return asyncio.run(Demo(text, directory.resolve(), yes, agent).run())


def _log_to(path: Path) -> None:
    """The runner's log records (it runs in this process) into its home: the terminal shows the
    goal's thread, and the demo's own lines on stderr (a failed goal's reason once, not also as
    the runner's journal line)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


# How long the endpoint check waits. A server that takes no connection in CONNECT_S is not there; one
# that took it may still be slow to list its models (a model loading, a busy GPU): it is given
# ANSWER_S before the check says so, and it is never called unreachable.
CONNECT_S = 10.0
ANSWER_S = 120.0


async def endpoint_problem(agent: str, *, answer_s: float = ANSWER_S) -> str | None:
    """Why the model endpoint the LLM agent would use cannot serve it, or None if it can: its
    models listed (GET /models), and for Codex its Responses API there (POST /responses)."""
    import openai

    base_url = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    if not os.environ.get("GOALTENDER_MODEL"):
        return (
            "set GOALTENDER_MODEL to the model to use, and OPENAI_BASE_URL / OPENAI_API_KEY for the "
            "endpoint (any OpenAI-compatible server: vLLM, NIM, OpenAI)"
        )
    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
        max_retries=0,
        timeout=openai.Timeout(answer_s, connect=CONNECT_S),
    )
    url = f"{base_url.rstrip('/')}/models"
    try:
        await client.models.list()
        if agent == "codex":
            url = f"{base_url.rstrip('/')}/responses"
            # An empty request: a server with the API refuses it (400, 422) without generating.
            await client.post("/responses", body={}, cast_to=object)
    except openai.APITimeoutError as exc:
        if type(exc.__cause__).__name__ == "ConnectTimeout":
            return f"no model endpoint reachable at {base_url} (no connection within {CONNECT_S:g}s); set OPENAI_BASE_URL"
        return (
            f"the endpoint at {base_url} took the connection but sent no answer to {url} within "
            f"{answer_s:g}s: it is up, but slow or stuck (still loading its model?); try again once it answers"
        )
    except openai.APIConnectionError as exc:
        return f"no model endpoint reachable at {base_url} ({exc}); set OPENAI_BASE_URL"
    except openai.APIStatusError as exc:
        return _refusal(exc.status_code, base_url, url)
    finally:
        await client.close()
    return None


def _refusal(status: int, base_url: str, url: str) -> str | None:
    """What an HTTP error from the endpoint check means, and what to do; None when it is only the
    empty /responses request refused (the API is there)."""
    if status in (401, 403):
        return f"the endpoint at {base_url} refused the key ({status}); set OPENAI_API_KEY"
    if status == 404 and url.endswith("/responses"):
        return (
            f"this endpoint has no Responses API ({url} answered 404), which Codex needs: use "
            "--agent openai (the built-in agent speaks Chat Completions)"
        )
    if status == 404:
        hint = (
            ""
            if base_url.rstrip("/").endswith("/v1")
            else f" (most servers serve it under /v1: {base_url.rstrip('/')}/v1?)"
        )
        return f"{url} answered 404 Not Found: OPENAI_BASE_URL is not the API's base URL{hint}"
    if url.endswith("/responses") and status < 500:
        return None
    if status >= 500:
        return f"{url} answered HTTP {status}: the server is up but failing (still starting?); try again once it answers"
    return f"{url} answered HTTP {status}: is OPENAI_BASE_URL an OpenAI-compatible API?"


class Demo:
    def __init__(self, goal_text: str, directory: Path, yes: bool, agent: str = "sweep"):
        self.goal_text = goal_text
        self.agent = agent
        self.directory = directory
        self.interactive = not yes and sys.stdin.isatty()
        self.auto_note = not yes and not self.interactive
        self.console = ConsoleThread(
            approval_hint="Answer below: y = approve, n = reject; anything after it is your comment."
            if self.interactive
            else "Auto-approved by the demo (--yes)."
        )
        self.goal: Goal | None = None
        self.experiments: dict[int, Experiment] = {}
        self.curves: dict[int, list[tuple[float | None, float]]] = defaultdict(list)
        self.interrupted = False
        self.events_seen = 0
        self.started = time.monotonic()

    def settings(self) -> RunnerSettings:
        sweep = [sys.executable, "-m", "goaltender.agents.sweep", "--approve-above", APPROVE_ABOVE]
        agents = RunnerSettings.model_fields["agents"].get_default(call_default_factory=True) | {
            "sweep": sweep
        }
        return RunnerSettings(
            home=self.directory / "runner",
            name="demo",
            agents=agents,
            default_agent=self.agent,
            experiment_timeout_s=90,
            preload=list(space.PRELOAD),
            approval_timeout_s=600,
            stop_grace_s=3,
        )

    async def run(self) -> int:
        settings = self.settings()
        try:
            runner = await Runner.start(settings)
        except StartupFailed as failed:  # a --dir that is a file, a demo already running there
            print(f"goaltender demo: cannot start its runner: {failed}", file=sys.stderr)
            return 1
        _log_to(settings.home / RUNNER_LOG)
        serving = asyncio.ensure_future(runner.serve_forever())
        print(f"Goaltender demo — runner state, logs and plots in {self.directory}\n")
        if self.auto_note:
            print(
                "(stdin is not a terminal, so approval prompts are approved automatically, as --yes does)\n"
            )
        try:
            async with await RunnerClient.connect_unix(settings.socket_path, client="demo") as client:
                loop = asyncio.get_running_loop()
                reply = await client.request(
                    p.SubmitGoal(text=self.goal_text, owner=os.environ.get("USER", "you"))
                )
                goal_id = reply.status.goal.id
                loop.add_signal_handler(
                    signal.SIGINT, lambda: asyncio.ensure_future(self._interrupt(client, goal_id))
                )
                await client.subscribe(since=0, goal_id=goal_id)
                async for event in client.events():
                    self.events_seen += 1
                    self.console.show(event)
                    await self._react(client, event)
                    if isinstance(event.data, FinalReport):
                        await self._finale(client, goal_id)
                        break
        finally:
            serving.cancel()
            await runner.close()
        return self._exit_code()

    def _exit_code(self) -> int:
        """0 only for a goal that finished; else 1, saying why in one line (a Ctrl-C says so itself)."""
        if self.goal is not None and self.goal.state == "finished" and not self.interrupted:
            return 0
        if self.goal is not None and not self.interrupted:
            goal = self.goal
            # An agent's end reason is a head line and the tail of its stderr: all of it, on one line.
            why = " / ".join(line.strip() for line in (goal.end_reason or "").splitlines() if line.strip())
            said = f"{goal.state}: {why[:1000]}" if why else f"did not end (it is {goal.state})"
            print(f"goaltender demo: goal #{goal.id} {said}", file=sys.stderr)
        return 1

    async def _react(self, client: RunnerClient, event: Event) -> None:
        data = event.data
        if isinstance(data, GoalAccepted):
            self.goal = data.goal
        elif isinstance(data, ExperimentStarted | ExperimentFinished):
            self.experiments[data.experiment.id] = data.experiment
        elif isinstance(data, MetricsLogged) and data.experiment_id is not None:
            self.curves[data.experiment_id] += [
                (pt.step, pt.value) for pt in data.points if pt.name == CURVE_METRIC
            ]
        elif isinstance(data, ApprovalRequested):
            await self._answer(client, data.approval.id)

    async def _answer(self, client: RunnerClient, approval_id: int) -> None:
        if self.interactive:
            line = await asyncio.to_thread(input, f"  approve #{approval_id}? [y/n, optional comment] > ")
            answer, _, comment = line.strip().partition(" ")
            approve = answer.lower() in ("y", "yes", "ok", "approve")
            by = os.environ.get("USER", "you")
        else:
            approve, comment, by = True, "auto-approved (--yes)", "demo"
        try:
            await client.request(
                p.Decide(approval_id=approval_id, approve=approve, by=by, comment=comment or None)
            )
        except p.ProtocolError as exc:  # e.g. it expired while we were typing
            print(f"  ({exc.error.message})")

    async def _plot(self) -> list[Path]:
        """The campaign and curve plots, drawn once the goal has ended: drawn at each milestone, as
        the Slack thread shows them, matplotlib held up the runner that shares this process (a
        tenth of a second or two of a few-second campaign, even from a thread)."""
        finished = sorted(
            (e for e in self.experiments.values() if e.status != "running"), key=lambda e: e.index
        )
        if self.goal is None or not finished:
            return []
        by_label = {  # labelled by the hypothesis: "#3 train_size 2000 → 4000"
            f"#{e.index} {e.description.split(':')[0]}": list(self.curves[e.id])
            for e in finished
            if self.curves.get(e.id)
        }
        return await asyncio.to_thread(self._draw, self.goal, finished, by_label)

    def _draw(self, goal: Goal, finished: list[Experiment], by_label: dict) -> list[Path]:
        metric = finished[0].metric_name or "metric"
        out = self.directory / "plots"
        paths = [
            plots.plot_campaign(
                finished,
                metric,
                out / f"goal-{goal.id}-campaign.png",
                target=goal.target,
                title=f"Goal #{goal.id}: {metric} per experiment (held-out, n=64)",
            )
        ]
        if by_label:
            paths.append(
                plots.plot_curves(
                    by_label,
                    out / f"goal-{goal.id}-{CURVE_METRIC}.png",
                    ylabel=CURVE_METRIC.replace("_", " "),
                    title=f"Goal #{goal.id}: training curves",
                )
            )
        return paths

    async def _finale(self, client: RunnerClient, goal_id: int) -> None:
        plot_paths = await self._plot()
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        self.goal = status.goal
        self.console.write(self.console.render_card(status, now=utcnow()))
        for path in plot_paths:
            print(f"plot: {path}")
        print(f"ledger and logs: {status.goal.workspace}/experiments/")
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"demo: {time.monotonic() - self.started:.1f}s wall, {status.attempted} experiments, "
            f"{self.events_seen} events, peak RSS of this process (runner + console) {peak_mb:.0f} MB"
        )

    async def _interrupt(self, client: RunnerClient, goal_id: int) -> None:
        if self.interrupted:
            return
        self.interrupted = True
        print("\n(interrupted: stopping the goal and writing its final report…)\n")
        with contextlib.suppress(p.ProtocolError):
            await client.request(p.Stop(goal_id=goal_id, by=os.environ.get("USER", "you"), reason="Ctrl-C"))
