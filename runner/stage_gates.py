"""The gates a staged goal passes (runner/stages.py): a stage ended by its agent is passed by a
person's approval, and the next stage starts; a cross-check runs two independent implementations
(in the goal's sandbox, one after the other) and compares what they print, and a disagreement
blocks the goal's experiments until a person lets it pass.
"""

from __future__ import annotations

from pathlib import Path

from goaltender.protocol import messages as p
from goaltender.protocol.budget import experiment_timeout
from goaltender.runner import stages
from goaltender.runner.agent_env import goal_environment
from goaltender.runner.approvals import Approvals
from goaltender.runner.config import RunnerSettings
from goaltender.runner.executors import Executor, Job, Placement
from goaltender.runner.goal_records import GoalRecords
from goaltender.runner.server import Refused
from goaltender.storage.records import Approval, Goal, MetricPoint, MilestoneReported, utcnow
from goaltender.storage.runner_store import RunnerStore


class StageGates:
    """Stage gates and cross-checks, each asked of people through the goal's approvals."""

    def __init__(
        self,
        settings: RunnerSettings,
        store: RunnerStore,
        records: GoalRecords,
        approvals: Approvals,
        local: Executor,
    ):
        self.settings = settings
        self.store = store
        self.records = records
        self.approvals = approvals
        self.local = local  # where a cross-check's two sides run: the goal's sandbox on this box

    async def end_stage(self, req: p.StageDone) -> tuple[Approval, Goal]:
        """Ask the humans to pass the goal's stage; approved, the next stage starts."""
        goal = await self.records.active_goal(req.goal_id)
        if not goal.stages:
            raise Refused(
                "bad_request", f"goal #{goal.id} has no stages (a goal declares them: `stages: plan, …`)"
            )
        if goal.stage + 1 >= len(goal.stages):
            raise Refused(
                "conflict",
                f"'{goal.stage_name}' is goal #{goal.id}'s last stage: it ends with the goal "
                "(`goaltender report`, then exit)",
            )
        detail = stages.gate_detail(req.summary, req.document, req.document_name)
        approval = await self.approvals.ask(
            goal, "stage_gate", stages.gate_question(goal), detail, None, agent_asks=True
        )
        if approval.state == "approved":
            goal = await self.store.advance_stage(goal.id, f"approved by {approval.decided_by}")
        return approval, goal

    async def cross_check(self, req: p.CrossCheck) -> p.CrossCheckReply:
        """Run both implementations (in the goal's sandbox, one after the other) and compare what
        they print. A disagreement blocks the goal's experiments until a person lets it pass."""
        goal = await self.records.active_goal(req.goal_id)
        directory = Path(goal.workspace) / "cross-checks"
        number = sum(1 for _ in directory.glob("[0-9][0-9][0-9]")) + 1 if directory.is_dir() else 1
        env = goal_environment(self.settings, goal) | req.env
        summaries, logs = [], []
        for side, command in (("a", req.a), ("b", req.b)):
            log_path = directory / f"{number:03d}" / f"{side}.log"
            job = Job(
                goal=goal,
                command=command,
                cwd=Path(req.cwd or goal.workspace),
                env=env,
                log_path=log_path,
                name=f"goaltender-g{goal.id}-check{number}{side}",
                gpus=0,
                timeout_s=experiment_timeout(goal.budget, None, utcnow()),
                grace_s=self.settings.stop_grace_s,
            )
            try:
                result = await self.local.run(job, on_points=_no_points, on_start=_ignore)
            except OSError as exc:
                raise Refused(
                    "conflict", f"cross-check not made: {side.upper()} could not start: {exc}"
                ) from None
            if result.timed_out or result.exit_code != 0:
                how = "timed out" if result.timed_out else f"exited with code {result.exit_code}"
                raise Refused("conflict", f"cross-check not made: {side.upper()} {how} (log: {log_path})")
            summaries.append(result.summary)
            logs.append(str(log_path))
        found = stages.compare(summaries[0], summaries[1], req.rtol, req.atol)
        compared = len(found.agreed) + len(found.differing)
        reply = p.CrossCheckReply(
            agreed=found.ok, compared=compared, differing=len(found.differing), table=found.table(), logs=logs
        )
        if found.ok:
            await self.store.block_experiments(goal.id, None)
            agreed = MilestoneReported(
                title=f"Cross-check #{number} agreed: {compared} numbers",
                text=f"{req.description}\n\nA and B agree within rtol {req.rtol:g}, atol {req.atol:g}.",
            )
            await self.records.post(goal.id, agreed, "a cross-check's agreement")
            return reply
        return await self._decide_disagreement(goal, req, number, found, reply)

    async def _decide_disagreement(
        self, goal: Goal, req: p.CrossCheck, number: int, found: stages.Comparison, reply: p.CrossCheckReply
    ) -> p.CrossCheckReply:
        held = f"cross-check #{number} disagrees on {len(found.differing)} number(s)"
        await self.store.block_experiments(goal.id, f"{held}: no experiment starts until a person decides it")
        approval = await self.approvals.ask(
            goal,
            "cross_check",
            f"The two implementations disagree on {len(found.differing)} of {reply.compared} numbers. "
            "Go on to experiments anyway?",
            f"{req.description}\n\nA: `{' '.join(req.a)}`\nB: `{' '.join(req.b)}`\n\n{found.table()}\n\n"
            "Approve to let the campaign go on with this disagreement; reject to keep experiments "
            "blocked until a cross-check agrees.",
            None,
        )
        if approval.state == "approved":
            await self.store.block_experiments(goal.id, None)
        else:
            await self.store.block_experiments(
                goal.id,
                f"{held}, and that was {approval.state}: fix the implementations and cross-check again",
            )
        return reply.model_copy(update={"agreed": approval.state == "approved", "approval": approval})


async def _ignore(placement: Placement) -> None:
    return None


async def _no_points(points: list[MetricPoint]) -> None:
    return None  # a cross-check's numbers are compared, not kept as series
