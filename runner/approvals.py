"""The questions a goal waits on people for (approvals): asked, woken by a person's decision, or
expired (no decision in time, the goal's end, a runner restart). While one waits, the goal shows
`waiting_for_approval`.

An agent asking without bound would flood its channel (approval prompts are never folded:
runner/folding.py), so an agent's questions are refused past WAITING_QUESTIONS waiting, and when
the disk has no room to ask them.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from goaltender.runner.config import RunnerSettings
from goaltender.runner.server import Refused
from goaltender.storage.records import Approval, Goal, utcnow
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import DiskFull

WAITING_QUESTIONS = 5  # an agent's questions waiting for people at once, per goal


class Approvals:
    """Every goal's questions to people, and whoever waits for their answers."""

    def __init__(self, settings: RunnerSettings, store: RunnerStore):
        self.settings = settings
        self.store = store
        self._waiters: dict[int, asyncio.Future[Approval]] = {}
        self._asking: dict[int, asyncio.Lock] = {}  # goal id -> its agent's questions, one at a time

    async def ask(
        self,
        goal: Goal,
        kind: str,
        question: str,
        detail: str,
        timeout_s: float | None,
        *,
        agent_asks: bool = False,
    ) -> Approval:
        """Ask the humans and wait for the decision; no decision in time expires the approval. A
        question its agent asks is refused (disk_full) when the disk has no room to ask it, and
        (conflict) when WAITING_QUESTIONS of its goal wait already."""
        timeout = timeout_s or self.settings.approval_timeout_s
        try:
            async with self._asking.setdefault(goal.id, asyncio.Lock()):  # counted, then asked
                if (
                    agent_asks
                    and len(waiting := await self.store.pending_approvals(goal.id)) >= WAITING_QUESTIONS
                ):
                    raise Refused(
                        "conflict",
                        f"not asked: goal #{goal.id} has {len(waiting)} questions waiting for people "
                        f"already (#{', #'.join(str(a.id) for a in waiting)}); wait for their answers",
                    )
                with self.store.refuse_when_full() if agent_asks else contextlib.nullcontext():
                    approval = await self.store.create_approval(
                        goal.id,
                        kind=kind,
                        question=question,
                        detail=detail,
                        expires_at=utcnow() + timedelta(seconds=timeout),
                    )
        except DiskFull as full:
            raise Refused(
                "disk_full", f"{full}: the question was not asked; try again when there is room"
            ) from None
        waiter: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._waiters[approval.id] = waiter
        await self.store.set_goal_state(goal.id, "waiting_for_approval", question, only_from={"running"})
        try:
            approval = await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            approval, _ = await self.store.decide_approval(
                approval.id, state="expired", by="runner", comment=f"no decision within {timeout:.0f}s"
            )
        finally:
            self._waiters.pop(approval.id, None)
        if not await self.store.pending_approvals(goal.id):
            await self.store.set_goal_state(
                goal.id, "running", "approval answered", only_from={"waiting_for_approval"}
            )
        return approval

    def deliver(self, approval: Approval) -> None:
        """Wake whoever waits in `ask` for this approval."""
        if (waiter := self._waiters.get(approval.id)) and not waiter.done():
            waiter.set_result(approval)

    async def expire_pending(self, goal_id: int | None, comment: str) -> None:
        """Expire the questions still waiting (of one goal, or all: a restart), waking their askers."""
        for approval in await self.store.pending_approvals(goal_id):
            approval, _ = await self.store.decide_approval(
                approval.id, state="expired", by="runner", comment=comment
            )
            self.deliver(approval)
