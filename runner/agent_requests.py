"""What the runner does for a goal's agent: its verbs (`goaltender milestone`, `experiment`,
`ask`, …, and the built-in agents' tools), each a handler of one request type.

The server has already made sure the request comes from the goal's own agent (runner/trust.py);
each handler still looks the goal up as active or known (GoalRecords) before it acts. On a full
disk what an agent hands in (a milestone, metrics, a diary entry, its report, a fetch record) is
taken and written in its goal's order when there is room; the reply says so.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from goaltender.protocol import messages as p
from goaltender.protocol.fetch_spec import FetchFailed, FetchSpec, spec_problem
from goaltender.runner.campaign import Campaigns
from goaltender.runner.config import RunnerSettings
from goaltender.runner.server import Handler, Refused
from goaltender.runner.skill_folder import ProposedEdit, SkillEditError, SkillFolder, diff_for_people
from goaltender.runner.trust import Principal
from goaltender.storage.records import TOKEN_METRICS, HubFetched, MilestoneReported
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import DiskFull

_TAKEN = "the disk is full; it is written in order when there is room"


class AgentRequests:
    """The agent verbs' handlers, over the runner's store and its goals' campaigns."""

    def __init__(
        self,
        settings: RunnerSettings,
        store: RunnerStore,
        campaigns: Campaigns,
        skills: SkillFolder,
        skills_lock: asyncio.Lock,
        status: Callable[[int], Awaitable[p.GoalStatus]],
    ):
        self.settings = settings
        self.store = store
        self.campaigns = campaigns
        self.skills = skills
        self.skills_lock = skills_lock  # one change of the skill folder at a time (the runner's revert too)
        self.status = status
        # goal id -> the last inbox message its agent was given unmarked, on a full disk
        self._given_unread: dict[int, int] = {}

    def handlers(self) -> dict[type[p.Request], Handler]:
        return {
            p.ReportMilestone: self.on_milestone,
            p.LogMetrics: self.on_log_metrics,
            p.ReadInbox: self.on_read_inbox,
            p.WriteDiary: self.on_write_diary,
            p.ReadDiary: self.on_read_diary,
            p.SubmitReport: self.on_submit_report,
            p.Fetch: self.on_fetch,
            p.Ask: self.on_ask,
            p.StageDone: self.on_stage_done,
            p.CrossCheck: self.on_cross_check,
            p.SkillEdit: self.on_skill_edit,
            p.RunExperiment: self.on_run_experiment,
        }

    async def on_milestone(self, req: p.ReportMilestone, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.reporting_goal(req.goal_id)
        milestone = MilestoneReported(title=req.title, text=req.text, curves=req.curves)
        _, event, folded = await self.campaigns.records.post(goal.id, milestone, "a milestone")
        # On a full disk it is written in its turn when there is room.
        said = f"milestone taken: {_TAKEN}" if event is None else f"milestone logged (event {event.seq})"
        return p.Done(message=said + (self._folded(goal.id) if folded else ""))

    def _folded(self, goal_id: int) -> str:
        """What an agent is told of a post of its folded past its goal's rate (runner/folding.py)."""
        burst, per_minute = self.settings.milestone_burst, self.settings.milestones_per_minute
        return (
            f"; folded: goal #{goal_id} posts {burst} at once, then {per_minute:g} a minute, and is past "
            "that: its thread shows this one with the others folded, in one post, when the rate allows"
        )

    async def on_log_metrics(self, req: p.LogMetrics, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.reporting_goal(req.goal_id)
        if req.experiment_id is not None:
            experiment = await self.store.get_experiment(req.experiment_id)
            if experiment is None or experiment.goal_id != goal.id:  # not a way into another goal's run
                raise Refused("not_found", f"goal #{goal.id} has no experiment #{req.experiment_id}")
        write = functools.partial(self.store.add_metrics, goal.id, req.experiment_id, req.points)
        written, _ = await self.campaigns.records.write_in_turn(goal.id, write, "metric points")
        if not written:
            return p.Done(message=f"{len(req.points)} metric point(s) taken: {_TAKEN}")
        limit = goal.budget.max_tokens
        if limit is not None and any(point.name in TOKEN_METRICS for point in req.points):
            used = (await self.store.tokens_used([goal.id])).get(goal.id, 0)
            if used >= limit:
                # After this reply: ending the goal stops the agent, which waits for it.
                self.campaigns.end_soon(goal.id, "finished", f"token budget used: {used:,}/{limit:,} tokens")
        return p.Done(message=f"{len(req.points)} metric point(s) logged")

    async def on_read_inbox(self, req: p.ReadInbox, who: Principal) -> p.Reply:
        """Unread messages are marked read as they are given. On a full disk they are given
        unmarked, and not given again: the first read when there is room marks them."""
        goal_id = (await self.campaigns.records.goal(req.goal_id)).id
        given = self._given_unread.get(goal_id, 0)
        try:
            with self.store.refuse_when_full():
                messages = await self.store.read_inbox(goal_id, unread_only=not req.all)
            self._given_unread.pop(goal_id, None)
        except DiskFull:
            messages = await self.store.inbox(goal_id, unread_only=not req.all)
            if unread := [m.id for m in messages if m.read_at is None]:
                self._given_unread[goal_id] = max(given, unread[-1])
        if not req.all:
            messages = [m for m in messages if m.id > given]
        return p.InboxReply(messages=messages)

    async def on_write_diary(self, req: p.WriteDiary, who: Principal) -> p.Reply:
        await self.campaigns.records.goal(req.goal_id)
        write = functools.partial(self.store.write_diary, req.goal_id, req.kind, req.text)
        _, entry = await self.campaigns.records.write_in_turn(req.goal_id, write, "a diary entry")
        if entry is None:
            return p.Done(message=f"diary entry taken ({req.kind}): {_TAKEN}")
        return p.Done(message=f"diary entry {entry.id} written ({entry.kind})")

    async def on_read_diary(self, req: p.ReadDiary, who: Principal) -> p.Reply:
        await self.campaigns.records.goal(req.goal_id)
        return p.DiaryReply(entries=await self.store.read_diary(req.goal_id, last=req.last, kind=req.kind))

    async def on_submit_report(self, req: p.SubmitReport, who: Principal) -> p.Reply:
        await self.campaigns.records.goal(req.goal_id)
        write = functools.partial(self.store.set_agent_report, req.goal_id, req.text)
        written, _ = await self.campaigns.records.write_in_turn(req.goal_id, write, "the report")
        if not written:
            return p.Done(message=f"report text taken: {_TAKEN}; it goes into the final report")
        return p.Done(message="report text stored; it goes into the final report")

    async def on_fetch(self, req: p.Fetch, who: Principal) -> p.Reply:
        """Download into the shared hub cache, outside the sandbox (runner/fetches.py); the
        milestones and the record go to the goal."""
        goal = await self.campaigns.records.active_goal(req.goal_id)
        spec = FetchSpec(req.repo, req.repo_type, req.revision, tuple(req.include))
        if problem := await asyncio.to_thread(spec_problem, spec):
            raise Refused("bad_request", problem)

        async def milestone(title: str, text: str) -> None:
            await self.campaigns.records.post(
                goal.id, MilestoneReported(title=title, text=text), "a fetch milestone"
            )

        try:
            fetched = await self.campaigns.fetches.fetch(goal.id, spec, milestone)
        except FetchFailed as failed:
            return p.FetchReply(failure=str(failed))
        _, event, folded = await self.campaigns.records.post(
            goal.id, HubFetched(fetch=fetched), "a fetch record"
        )
        if event is None:
            said = f"fetch taken for goal #{goal.id}'s ledger: {_TAKEN}"
        else:
            said = f"recorded in goal #{goal.id}'s ledger (event {event.seq})"
        return p.FetchReply(fetch=fetched, message=said + (self._folded(goal.id) if folded else ""))

    async def on_ask(self, req: p.Ask, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.active_goal(req.goal_id)
        approval = await self.campaigns.approvals.ask(
            goal, req.kind, req.question, req.detail, req.timeout_s, agent_asks=True
        )
        return p.DecisionReply(approval=approval)

    async def on_stage_done(self, req: p.StageDone, who: Principal) -> p.Reply:
        approval, goal = await self.campaigns.gates.end_stage(req)
        return p.StageReply(approval=approval, goal=goal)

    async def on_cross_check(self, req: p.CrossCheck, who: Principal) -> p.Reply:
        return await self.campaigns.gates.cross_check(req)

    async def on_skill_edit(self, req: p.SkillEdit, who: Principal) -> p.Reply:
        """Show the humans the diff, and on their approval apply and commit it."""
        goal = await self.campaigns.records.active_goal(req.goal_id)
        try:
            edit = await asyncio.to_thread(self.skills.propose, req.skill, req.path, req.content)
        except SkillEditError as exc:
            raise Refused("bad_request", str(exc)) from None
        question = f"Goal #{goal.id}'s agent proposes a skill edit to `{edit.where}`. Apply it?"
        detail = (f"Why: {req.why}\n\n" if req.why else "") + diff_for_people(edit.diff)
        approval = await self.campaigns.approvals.ask(
            goal, "skill_edit", question, detail, req.timeout_s, agent_asks=True
        )
        if approval.state != "approved":
            said = f"skill edit {approval.state}: nothing written"
            return p.SkillEditReply(approval=approval, message=said)
        message = f"{edit.where}: edit from goal #{goal.id}, approved by {approval.decided_by}"
        message += f"\n\n{req.why}" if req.why else ""
        try:
            commit = await self._apply_skill_edit(edit, message)
        except SkillEditError as exc:
            return p.SkillEditReply(approval=approval, message=f"approved, but not applied: {exc}")
        await self.store.append_event(
            goal.id,
            MilestoneReported(
                title=f"Skill edit applied: {edit.skill} (commit {commit})",
                text=f"`{edit.where}`, approved by {approval.decided_by}; "
                f"revert with `goaltender skills revert {commit}`",
            ),
        )
        return p.SkillEditReply(approval=approval, commit=commit, message=f"applied as commit {commit}")

    async def _apply_skill_edit(self, edit: ProposedEdit, message: str) -> str:
        async with self.skills_lock:
            return await asyncio.to_thread(self.skills.apply, edit, message)

    async def on_run_experiment(self, req: p.RunExperiment, who: Principal) -> p.Reply:
        finished, new_best = await self.campaigns.experiments.run(req)
        status = await self.status(req.goal_id)
        return p.ExperimentReply(experiment=finished, new_best=new_best, stop_status=status.stop_status)
