"""The runner's verbs as the built-in agent's tools: run_experiment, milestone, log_metrics,
ask_approval, read_inbox, write_diary, read_diary and submit_report (the brief's `goaltender <verb>`
commands). Each calls the runner over its socket and returns the text the model sees; what the
model writes for people has the environment's secrets redacted."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from goaltender.agents.output import one_line, redact
from goaltender.agents.tool_specs import (
    AskApproval,
    Command,
    LogMetrics,
    Milestone,
    ReadDiary,
    ReadInbox,
    RunExperiment,
    SubmitReport,
    WriteDiary,
)
from goaltender.runner import protocol as p
from goaltender.runner.client import RunnerClient
from goaltender.storage.records import MetricPoint

Handler = Callable[[Any], Awaitable[str]]  # a tool: its validated arguments -> the model's text
AskPerson = Callable[[str, str], Awaitable[p.Approval]]  # (question, detail) -> the decision
GateCommand = Callable[[str, str], Awaitable[tuple[bool, str]]]  # (command, what) -> (may run, note)

MAX_REPORT_CHARS = 50_000


def decision_text(approval: p.Approval) -> str:
    """'approved by ana: go ahead', 'rejected by bob', 'expired by nobody'."""
    who = approval.decided_by or "nobody"
    return f"{approval.state} by {who}" + (f": {approval.comment}" if approval.comment else "")


async def ask_person(
    runner: RunnerClient, goal_id: int, question: str, detail: str, kind: str = "command"
) -> p.Approval:
    """A runner approval prompt; returns once people decided (or it expired)."""
    reply = await runner.call(
        p.Ask, p.DecisionReply, goal_id=goal_id, question=question[:3000], detail=detail[:20_000], kind=kind
    )
    return reply.approval


def steer_text(message: p.InboxMessage) -> str:
    return f"Message from {message.author}: {message.text}"


def _argv(command: Command) -> tuple[list[str], str]:
    """(argv, the command as one line): a string runs with bash -c."""
    if isinstance(command, str):
        return ["bash", "-c", command], command
    return [str(a) for a in command], shlex.join(str(a) for a in command)


class RunnerTools:
    def __init__(self, runner: RunnerClient, goal_id: int, secrets: list[str], gate_command: GateCommand):
        self.runner = runner
        self.goal_id = goal_id
        self.secrets = secrets
        self.gate_command = gate_command
        self.report_text = ""  # the model's words for the final report (submit_report)
        self.steers: list[str] = []  # every message from people seen so far, oldest first

    def handlers(self) -> dict[str, Handler]:
        return {
            "run_experiment": self.run_experiment,
            "milestone": self.milestone,
            "log_metrics": self.log_metrics,
            "ask_approval": self.ask_approval,
            "read_inbox": self.read_inbox,
            "write_diary": self.write_diary,
            "read_diary": self.read_diary,
            "submit_report": self.submit_report,
        }

    # ---- used by the loop too ----

    async def post_milestone(self, title: str, text: str = "") -> None:
        await self.runner.call(
            p.ReportMilestone,
            p.Done,
            goal_id=self.goal_id,
            title=one_line(redact(title, self.secrets), 300),
            text=redact(text, self.secrets)[:20_000],
        )

    async def new_messages(self) -> list[str]:
        """Messages from people not seen yet, as the model is shown them."""
        reply = await self.runner.call(p.ReadInbox, p.InboxReply, goal_id=self.goal_id)
        texts = [steer_text(m) for m in reply.messages]
        self.steers += texts
        return texts

    async def hand_in(self, text: str) -> str:
        """The agent's part of the final report (handing it in again replaces it)."""
        reply = await self.runner.call(
            p.SubmitReport, p.Done, goal_id=self.goal_id, text=text[:MAX_REPORT_CHARS]
        )
        return reply.message

    # ---- the tools ----

    async def run_experiment(self, args: RunExperiment) -> str:
        argv, text = _argv(args.command)
        ok, note = await self.gate_command(text, "experiment")
        if not ok:
            return note
        reply = await self.runner.call(
            p.RunExperiment,
            p.ExperimentReply,
            goal_id=self.goal_id,
            command=argv,
            description=args.description,
            params=args.params or {},
            metric=args.metric or None,
            direction=args.direction or None,
            timeout_s=args.timeout_s or None,
            eval_command=_argv(args.eval_command)[0] if args.eval_command else None,
        )
        return note + _experiment_text(reply)

    async def milestone(self, args: Milestone) -> str:
        await self.post_milestone(args.title, args.text or "")
        return "milestone posted"

    async def log_metrics(self, args: LogMetrics) -> str:
        points = [MetricPoint(name=k, value=v, step=args.step) for k, v in args.metrics.items()]
        if not points:
            return "error: no metrics given"
        reply = await self.runner.call(
            p.LogMetrics, p.Done, goal_id=self.goal_id, points=points, experiment_id=args.experiment_id
        )
        return reply.message

    async def ask_approval(self, args: AskApproval) -> str:
        approval = await ask_person(
            self.runner, self.goal_id, args.question, args.detail or "", args.kind or "generic"
        )
        return f"The request was {decision_text(approval)}."

    async def read_inbox(self, args: ReadInbox) -> str:
        return "\n".join(await self.new_messages()) or "(no new messages)"

    async def write_diary(self, args: WriteDiary) -> str:
        reply = await self.runner.call(
            p.WriteDiary,
            p.Done,
            goal_id=self.goal_id,
            text=redact(args.text, self.secrets),
            kind="handoff" if args.handoff else "note",
        )
        return reply.message

    async def read_diary(self, args: ReadDiary) -> str:
        reply = await self.runner.call(
            p.ReadDiary,
            p.DiaryReply,
            goal_id=self.goal_id,
            last=max(1, min(5 if args.last is None else args.last, 100)),
            kind="handoff" if args.handoff_only else None,
        )
        entries = (f"[{e.ts:%Y-%m-%d %H:%M} {e.kind}] {e.text}" for e in reply.entries)
        return "\n\n".join(entries) or "(empty diary)"

    async def submit_report(self, args: SubmitReport) -> str:
        self.report_text = args.text
        return await self.hand_in(args.text)


def _experiment_text(reply: p.ExperimentReply) -> str:
    """The ledger row as the model reads it, with the log's tail when the run crashed."""
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
                log = Path(e.log_path).read_bytes()
                lines.append("last lines of the log:\n" + log[-1500:].decode(errors="replace"))
    return "\n".join(lines)
