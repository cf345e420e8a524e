"""The runner's verbs as the built-in agent's tools: run an experiment (or a NeMo RL training run),
post a milestone, log metrics, ask for approval, read the inbox, keep the diary, hand in the report.

They are what `goaltender <verb>` does for the other agents, called over the runner connection
directly. An experiment's command passes the same command policy as the shell tool; what goes to
the runner is redacted of the environment's secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from goaltender.agents.bootstrap import Goal
from goaltender.agents.tool_output import redact
from goaltender.agents.tool_schemas import (
    AskApproval,
    FetchFromHub,
    LogMetrics,
    Milestone,
    NemoRl,
    ReadDiary,
    ReadInbox,
    RunExperiment,
    SubmitReport,
    Tool,
    WriteDiary,
)
from goaltender.agents.workspace_tools import Ask, decision
from goaltender.protocol import messages as p
from goaltender.storage.records import MetricPoint
from goaltender.training.launch import LaunchError, plan

# (command, what it is for) -> (may run, a note for the tool result)
Gate = Callable[[str, str], Awaitable[tuple[bool, str]]]
PostMilestone = Callable[[str, str], Awaitable[str]]  # -> what the runner said


def steer_text(message: p.InboxMessage) -> str:
    """A person's message as the model sees it."""
    return f"Message from {message.author}: {message.text}"


class RunnerVerbs:
    def __init__(
        self,
        goal: Goal,
        *,
        gate: Gate,
        ask: Ask,
        milestone: PostMilestone,
        secrets: list[str],
        fetch_timeout_s: float = 6 * 3600,
    ):
        self.goal_id = goal.id
        self.fetch_timeout_s = fetch_timeout_s  # a fetch past it is killed: a tool call never hangs
        self.runner = goal.runner
        self.workspace = goal.workspace
        self.gate = gate
        self.ask = ask
        self.milestone = milestone
        self.secrets = secrets
        self.steers: list[str] = []  # every message from people so far, oldest first
        self.report_text = ""  # the model's words for the final report
        self.stop_status = ""  # the runner's latest word on the stop rule (an experiment's, a summary's)

    def tools(self, *, models: bool = True) -> list[Tool[Any]]:
        """The verbs as tools; NeMo RL and the hub only for a goal that trains or fetches models
        (briefing.needs_models: their schemas cost ~700 tokens a request)."""
        return [
            Tool("run_experiment", RunExperiment, self.run_experiment),
            *([Tool("nemo_rl", NemoRl, self.nemo_rl)] if models else []),
            Tool("milestone", Milestone, self.post_milestone),
            Tool("log_metrics", LogMetrics, self.log_metrics),
            Tool("ask_approval", AskApproval, self.ask_approval),
            Tool("read_inbox", ReadInbox, self.read_inbox),
            Tool("write_diary", WriteDiary, self.write_diary),
            Tool("read_diary", ReadDiary, self.read_diary),
            Tool("submit_report", SubmitReport, self.submit_report),
            *([Tool("fetch_from_hub", FetchFromHub, self.fetch_from_hub)] if models else []),
        ]

    async def run_experiment(self, args: RunExperiment) -> str:
        argv, text = _argv(args.command)
        if _WRAPPED.match(text):
            return (
                "error: `command` is the run itself (e.g. `python -m …`), not a `goaltender experiment` "
                "line: this tool is that verb. Put the hypothesis in `description`, the metric in `metric`."
            )
        ok, note = await self.gate(text, "experiment")
        if not ok:
            return note
        return note + await self._experiment(
            command=argv,
            description=args.description,
            params=args.params,
            metric=args.metric or None,
            direction=args.direction,
            timeout_s=args.timeout_s or None,
            eval_command=_argv(args.eval_command)[0] if args.eval_command else None,
        )

    async def nemo_rl(self, args: NemoRl) -> str:
        try:
            run = plan(
                args.recipe,
                args.config,
                args.overrides,
                cwd=self.workspace,
                env=os.environ,
                metric=args.metric or None,
                direction=args.direction,
                eval_command=_argv(args.eval_command)[0] if args.eval_command else None,
                eval_metric=args.eval_metric or None,
            )
        except LaunchError as exc:
            return f"error: {exc}"
        metric, direction = run.headline()
        ok, note = await self.gate(shlex.join(run.command()), "experiment")
        if not ok:
            return note
        return note + await self._experiment(
            command=run.command(),
            description=args.description or run.description(),
            params=run.params(),
            metric=metric,
            direction=direction,
            timeout_s=args.timeout_s or None,
            eval_command=run.eval_command,
        )

    async def _experiment(self, **fields: Any) -> str:
        """Run one experiment through the runner; its ledger row as the model is told it."""
        reply = await self.runner.request(p.RunExperiment(goal_id=self.goal_id, **fields))
        self.stop_status = reply.stop_status
        return experiment_text(reply)

    async def post_milestone(self, args: Milestone) -> str:
        said = await self.milestone(args.title, args.text)
        # Past the goal's rate the runner folds it, and says so: the model should post less often.
        return said if "; folded: " in said else "milestone posted"

    async def log_metrics(self, args: LogMetrics) -> str:
        points = [MetricPoint(name=k, value=v, step=args.step) for k, v in args.metrics.items()]
        if not points:
            return "error: no metrics given"
        reply = await self.runner.request(
            p.LogMetrics(goal_id=self.goal_id, points=points, experiment_id=args.experiment_id)
        )
        return reply.message

    async def ask_approval(self, args: AskApproval) -> str:
        approval = await self.ask(args.question, args.detail, args.kind or "generic")
        return f"The request was {decision(approval)}."

    async def read_inbox(self, args: ReadInbox) -> str:
        reply = await self.runner.request(p.ReadInbox(goal_id=self.goal_id))
        texts = [steer_text(m) for m in reply.messages]
        self.steers += texts
        return "\n".join(texts) or "(no new messages)"

    async def write_diary(self, args: WriteDiary) -> str:
        kind = "handoff" if args.handoff else "note"
        text = redact(args.text, self.secrets)
        reply = await self.runner.request(p.WriteDiary(goal_id=self.goal_id, text=text, kind=kind))
        return reply.message

    async def read_diary(self, args: ReadDiary) -> str:
        reply = await self.runner.request(
            p.ReadDiary(
                goal_id=self.goal_id,
                last=max(1, min(args.last, 100)),
                kind="handoff" if args.handoff_only else None,
            )
        )
        entries = [f"[{e.ts:%Y-%m-%d %H:%M} {e.kind}] {e.text}" for e in reply.entries]
        return "\n\n".join(entries) or "(empty diary)"

    async def submit_report(self, args: SubmitReport) -> str:
        self.report_text = args.text
        reply = await self.runner.request(p.SubmitReport(goal_id=self.goal_id, text=args.text[:50_000]))
        return reply.message

    async def fetch_from_hub(self, args: FetchFromHub) -> str:
        """`goaltender fetch` itself, so that the fetch is the same for every agent: it reads the
        goal from this process's environment and asks the runner, which downloads into the shared
        hub cache (read-only here), posts the milestones and records it."""
        argv = ["goaltender", "fetch", args.repo, "--type", args.repo_type]
        argv += ["--revision", args.revision] if args.revision else []
        argv += ["--include", *args.include] if args.include else []
        ok, note = await self.gate(shlex.join(argv), "fetch")
        if not ok:
            return note
        fetching = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "goaltender.cli",
            *argv[1:],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(fetching.communicate(), self.fetch_timeout_s)
        except TimeoutError:
            return (
                f"{note}timed out after {self.fetch_timeout_s:g}s (GOALTENDER_FETCH_TIMEOUT_S): stopped "
                "waiting; the runner's download goes on until it ends or the goal does. Fetching "
                "again waits for it, then finds the files cached (or resumes)"
            )
        finally:
            if fetching.returncode is None:  # timed out, or the agent is stopping
                fetching.kill()
                await asyncio.shield(fetching.wait())
        said = redact(output.decode(errors="replace").strip(), self.secrets)
        return f"{note}exit code {fetching.returncode}\n{said}"


_WRAPPED = re.compile(r"\s*(?:\S*/)?goaltender\s+(?:experiment|nemo-rl)\b")  # the verb, not the run


def _argv(command: str | list[str]) -> tuple[list[str], str]:
    """(argv, the command as a shell line); a string runs with bash -c."""
    if isinstance(command, str):
        return ["bash", "-c", command], command
    return command, shlex.join(command)


def experiment_text(reply: p.ExperimentReply) -> str:
    """The ledger row as the model is told it: status, metrics, cost, and a crash's last lines."""
    e = reply.experiment
    lines = [
        f"Experiment #{e.index}: {e.status}" + (" (new best)" if reply.new_best else ""),
        f"{e.metric_name}: {e.metric_value}" if e.metric_name else "no headline metric",
    ]
    if e.metrics:
        lines.append("metrics: " + ", ".join(f"{k}={v:g}" for k, v in e.metrics.items()))
    if e.wall_seconds is not None:
        lines.append(f"wall {e.wall_seconds:.1f}s, exit code {e.exit_code}")
    if e.note:
        lines.append(f"note: {e.note}")
    if reply.stop_status:
        lines.append(f"budget: {reply.stop_status}")
    if e.log_path:
        lines.append(f"log: {e.log_path}")
        if e.status == "crash":
            with contextlib.suppress(OSError):
                tail = Path(e.log_path).read_bytes()[-1500:]
                lines.append("last lines of the log:\n" + tail.decode(errors="replace"))
    return "\n".join(lines)
