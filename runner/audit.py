"""The audit trail: every control action with its authenticated actor, time and outcome, and every
refused attempt (an agent's forbidden request, a foreign uid's hello), in runner.db.

Control actions are submit, approve, reject, steer, budget, stop, pause, resume and skill revert;
reads and the agent verbs are not recorded unless refused for who asked.
"""

from __future__ import annotations

import logging

from goaltender.runner import protocol as p
from goaltender.runner.trust import Principal, goal_named
from goaltender.storage.runner_store import RunnerStore

log = logging.getLogger("goaltender.runner")

CONTROL_ACTIONS: dict[type[p.Request], str] = {
    p.SubmitGoal: "submit",
    p.Steer: "steer",
    p.ChangeBudget: "budget",
    p.Stop: "stop",
    p.Pause: "pause",
    p.Resume: "resume",
    p.RevertSkill: "skill revert",
}
DETAIL_CHARS = 500


def is_control(request: p.Request) -> bool:
    return isinstance(request, p.Decide) or type(request) in CONTROL_ACTIONS


def action_of(request: p.Request) -> str:
    if isinstance(request, p.Decide):
        return "approve" if request.approve else "reject"
    return CONTROL_ACTIONS.get(type(request), request.type)


def claimed_name(request: p.Request) -> str | None:
    """Whom the client says the request is from (only an operator's claim is ever recorded)."""
    for field in ("by", "author", "owner"):
        if isinstance(value := getattr(request, field, None), str) and value:
            return value
    return None


def _done_detail(request: p.Request, reply: p.Reply) -> str:
    if isinstance(reply, p.DecisionReply):
        approval = reply.approval
        said = f": {approval.comment}" if approval.comment else ""
        return f"approval #{approval.id} ({approval.question}){said}"
    if isinstance(reply, p.GoalReply):
        return reply.status.goal.text
    detail = reply.message if isinstance(reply, p.Done) else ""
    if isinstance(request, p.ChangeBudget):
        detail = f"{request.change!r}: {detail}"
    elif isinstance(request, p.Steer):
        detail = f"{request.text!r}: {detail}"
    return detail


class AuditTrail:
    def __init__(self, store: RunnerStore):
        self.store = store

    async def outcome(self, who: Principal, request: p.Request, reply: p.Reply) -> None:
        """A control request answered: done, or refused with the error's message."""
        if isinstance(reply, p.Error):
            await self.refused(who, request, f"{reply.code}: {reply.message}")
            return
        goal_id = (
            reply.status.goal.id if isinstance(reply, p.GoalReply) else await goal_named(request, self.store)
        )
        await self._write(
            who.actor(claimed_name(request)),
            action_of(request),
            goal_id,
            "done",
            _done_detail(request, reply),
        )

    async def refused(self, who: Principal, request: p.Request | None, why: str, action: str = "") -> None:
        """Any request refused, `action` naming it when there is no request (a hello)."""
        goal_id = await goal_named(request, self.store) if request is not None else None
        name = action or (action_of(request) if request is not None else "request")
        await self._write(
            who.actor(claimed_name(request) if request else None), name, goal_id, "refused", why
        )

    async def _write(self, actor: str, action: str, goal_id: int | None, outcome: str, detail: str) -> None:
        try:
            await self.store.add_audit(
                actor=actor, action=action, goal_id=goal_id, outcome=outcome, detail=detail[:DETAIL_CHARS]
            )
        except Exception:  # the answer still goes out; the log says what the trail missed
            log.exception("audit: could not record %s %s by %s (%s)", action, outcome, actor, detail)
