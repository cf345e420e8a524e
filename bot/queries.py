"""What the bot asks a runner on its own account — a goal's status, the active goals, a ledger —
for cards, digests and answers in threads: an answer, or None when the runner cannot give one now
(down, unknown, refusing or too slow), which the caller shows as such.
"""

from __future__ import annotations

import asyncio
import logging

from goaltender.bot.links import RunnerPool, UnknownRunner
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.records import Experiment

log = logging.getLogger("goaltender.bot")

STATUS_TIMEOUT_S = 10.0
NO_ANSWER = (RunnerUnavailable, p.ProtocolError, TimeoutError, UnknownRunner)


async def goal_status(pool: RunnerPool, runner: str, goal_id: int) -> p.GoalStatus | None:
    try:
        reply = await asyncio.wait_for(pool[runner].request(p.Status(goal_id=goal_id)), STATUS_TIMEOUT_S)
    except NO_ANSWER as exc:
        log.warning("runner %s: no status for goal #%s: %s", runner, goal_id, exc)
        return None
    return reply.goals[0] if reply.goals else None


async def active_goals(pool: RunnerPool, runner: str) -> dict[int, p.GoalStatus] | None:
    """The runner's active goals by id; None when it does not answer."""
    try:
        reply = await asyncio.wait_for(pool[runner].request(p.Status(active_only=True)), STATUS_TIMEOUT_S)
    except NO_ANSWER:
        return None
    return {status.goal.id: status for status in reply.goals}


async def ledger(pool: RunnerPool, runner: str, goal_id: int) -> list[Experiment]:
    """The goal's experiments; empty when the runner does not answer."""
    try:
        summary = await pool[runner].request(p.Summary(goal_id=goal_id))
    except (RunnerUnavailable, p.ProtocolError, UnknownRunner):
        return []
    return summary.ledger
