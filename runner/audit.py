"""The audit trail: every control action with its authenticated actor, time and outcome, and every
refused attempt (an agent's forbidden request, a foreign uid's hello), in runner.db.

Control actions are submit, approve, reject, steer, budget, stop, pause, resume, skill revert and
prune; reads and the agent verbs are not recorded unless refused for who asked.

Entries are written one at a time, in the order they were made. A reply waits for its entry only
while the disk has room: on a full disk the entry waits in memory (up to UNWRITTEN_MOST of them,
its time kept) and is written when there is room, and the reply goes at once. What the runner
still holds when it shuts down on a full disk, and what did not fit in memory, is written to its
log instead, one line an entry.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from datetime import datetime

from goaltender.protocol import messages as p
from goaltender.runner.trust import Principal, goal_named
from goaltender.storage.records import utcnow
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import DiskFull

log = logging.getLogger("goaltender.runner")
UNWRITTEN_MOST = 10_000  # entries kept in memory while the disk is full (each ~1 kB at most)

# Derived from each request's contract (protocol/messages.py: Request.audited); a decision is
# recorded as "approve" or "reject" (Decide.audit_action).
CONTROL_ACTIONS: dict[type[p.Request], str] = {m: m.audited for m in p.REQUEST_MODELS.values() if m.audited}
DETAIL_CHARS = 500


def is_control(request: p.Request) -> bool:
    return type(request) in CONTROL_ACTIONS


def action_of(request: p.Request) -> str:
    return request.audit_action()


def claimed_name(request: p.Request) -> p.Actor | None:
    """Whom the client says the request is from (only an operator's claim is ever recorded)."""
    for field in ("by", "author", "owner"):
        if isinstance(value := getattr(request, field, None), p.Person) or (isinstance(value, str) and value):
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
    if isinstance(reply, p.PruneReply):
        detail = "; ".join(reply.lines)
    if isinstance(request, p.ChangeBudget):
        detail = f"{request.change!r}: {detail}"
    elif isinstance(request, p.Steer):
        detail = f"{request.text!r}: {detail}"
    return detail


@dataclasses.dataclass
class _Entry:
    actor: str
    action: str
    goal_id: int | None
    outcome: str
    detail: str
    ts: datetime = dataclasses.field(default_factory=utcnow)
    written: asyncio.Future[None] = dataclasses.field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def __str__(self) -> str:
        goal = f" goal #{self.goal_id}" if self.goal_id is not None else ""
        return f"{self.ts.isoformat()} {self.action}{goal} {self.outcome} by {self.actor}: {self.detail}"


class AuditTrail:
    def __init__(self, store: RunnerStore):
        self.store = store
        self._unwritten: collections.deque[_Entry] = collections.deque()
        self._writer: asyncio.Task | None = None

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
        """Enter it after those before it; back once it is written, or at once on a full disk."""
        entry = _Entry(actor, action, goal_id, outcome, detail[:DETAIL_CHARS])
        if len(self._unwritten) >= UNWRITTEN_MOST:
            log.error(
                "audit: not recorded (%d entries wait for room on the disk already): %s",
                UNWRITTEN_MOST,
                entry,
            )
            return
        self._unwritten.append(entry)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_in_order())
        await self.store.done_unless_full(entry.written)

    async def _write_in_order(self) -> None:
        while self._unwritten:
            entry = self._unwritten[0]
            try:
                await self.store.add_audit(
                    actor=entry.actor,
                    action=entry.action,
                    goal_id=entry.goal_id,
                    outcome=entry.outcome,
                    detail=entry.detail,
                    ts=entry.ts,
                )
            except DiskFull:  # the runner is shutting down, and the disk is still full
                self._lose(f"not recorded: {self.store.db.path.name} had no room when the runner stopped")
                return
            except Exception:  # the answer went out all the same; the log says what the trail missed
                log.exception("audit: could not record %s", entry)
            self._unwritten.popleft()
            entry.written.set_result(None)

    def _lose(self, why: str) -> None:
        while self._unwritten:
            entry = self._unwritten.popleft()
            log.error("audit: %s: %s", why, entry)
            entry.written.set_result(None)

    async def close(self) -> None:
        """Let the entries still waiting be written (the store fails, rather than waits, on a full
        disk by now: those are logged)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        self._lose("not recorded: the runner stopped before it was written")
