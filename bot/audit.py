"""The bot's part of the audit trail: what is decided in Slack and so never reaches a runner — a
thread reply or an approval click refused for who sent it, a budget increase held for a second
person and its decision, a channel's roles changed (or refused) with `/goal admin`. Stored in
bot.db (storage/bot_audit.py) with the person as the runner records them (`slack:U123`).

What the runners did (submit, stop, steer, approve, ...) they record themselves in runner.db; a
goal's `audit` in its thread shows both, by time (bot/views.py).
"""

from __future__ import annotations

import logging

from goaltender.bot.roles import actor
from goaltender.storage.bot_audit import Outcome
from goaltender.storage.bot_store import BotStore, Thread

log = logging.getLogger("goaltender.bot")

NOT_A_CONTROLLER = "not the owner, an approver or a controller"
NOT_AN_APPROVER = "not the owner or an approver"


async def record(
    store: BotStore,
    user: str,
    action: str,
    outcome: Outcome,
    detail: str,
    *,
    thread: Thread | None = None,
    channel: str | None = None,
) -> None:
    """Record one decision about `thread`'s goal (or, without one, about `channel`). A failed write
    is logged: the person still gets their answer."""
    where = channel or (thread.channel if thread else "")
    try:
        await store.audit.add(
            actor(user),
            action,
            outcome,
            channel=where,
            runner=thread.runner if thread else None,
            goal_id=thread.goal_id if thread else None,
            detail=detail,
        )
    except Exception:
        log.exception("audit: could not record %s %s by %s (%s)", action, outcome, user, detail)
