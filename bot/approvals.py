"""Approvals decided from Slack: a button on the prompt, or a reaction on it (✅ 👍 approve,
❌ 👎 reject), by the goal's owner or a configured approver. A click by anyone else is answered
(only the owner or the approvers can decide); a reaction by anyone else is ignored.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from goaltender.bot import render
from goaltender.bot.keys import ApprovalKey
from goaltender.bot.links import RunnerPool, UnknownRunner
from goaltender.bot.outbox import Outbox
from goaltender.bot.thread import thread_at
from goaltender.runner import protocol as p
from goaltender.runner.client import RunnerUnavailable
from goaltender.storage.bot_store import BotStore, Thread

log = logging.getLogger("goaltender.bot")

_USER_ID = re.compile(r"\b([UW][A-Z0-9]{5,})\b")


def normalise_reaction(name: str) -> str:
    """`+1::skin-tone-3` -> `+1`."""
    return name.strip(":").split("::")[0]


def _mentions(text: str) -> str:
    return _USER_ID.sub(r"<@\1>", text)


class Approvals:
    def __init__(self, store: BotStore, pool: RunnerPool, outbox: Outbox, approvers: list[str]):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.approvers = approvers

    def may_decide(self, user: str, thread: Thread) -> bool:
        return user == thread.owner or user in self.approvers

    async def on_button(self, body: dict[str, Any], respond: Callable[..., Awaitable[Any]]) -> None:
        action = body["actions"][0]
        approve = action["action_id"] == "approve"
        user = body["user"]["id"]
        container = body.get("container") or {}
        channel = container.get("channel_id") or (body.get("channel") or {}).get("id") or ""
        _, _, approval = (action.get("value") or "").rpartition(":")

        async def tell(text: str) -> None:
            await respond(text=text, response_type="ephemeral", replace_original=False)

        key = await self.outbox.posted_at(channel, container.get("message_ts") or "")
        thread = None
        if isinstance(key, ApprovalKey):
            approval_id = key.approval_id
            thread = await self.store.thread(key.runner, key.goal_id)
        elif container.get("thread_ts") and approval.isdigit():
            # The prompt's post is not known: the button itself names the approval.
            approval_id = int(approval)
            thread = await thread_at(self.outbox, self.store, channel, container["thread_ts"])
        if thread is None:
            await tell("I can't find the goal this approval belongs to.")
            return
        if not self.may_decide(user, thread):
            await tell(f"Only {render.user_ref(thread.owner)} or the configured approvers can decide this.")
            return
        if problem := await self._decide(thread.runner, approval_id, approve, user):
            await tell(problem)

    async def on_reaction(self, event: dict[str, Any]) -> None:
        name = normalise_reaction(event.get("reaction") or "")
        if name in render.APPROVE_REACTIONS:
            approve = True
        elif name in render.REJECT_REACTIONS:
            approve = False
        else:
            return
        item = event.get("item") or {}
        key = await self.outbox.posted_at(item.get("channel") or "", item.get("ts") or "")
        if not isinstance(key, ApprovalKey):
            return
        thread = await self.store.thread(key.runner, key.goal_id)
        user = event.get("user") or ""
        if thread is None or not self.may_decide(user, thread):
            log.info("reaction by %s on approval #%s ignored: they may not decide it", user, key.approval_id)
            return
        if problem := await self._decide(key.runner, key.approval_id, approve, user):
            log.info("reaction by %s on approval #%s: %s", user, key.approval_id, problem)

    async def _decide(self, runner: str, approval_id: int, approve: bool, user: str) -> str | None:
        """Ask the runner to decide; None on success, else what went wrong (for the person)."""
        try:
            await self.pool[runner].call(
                p.Decide, p.DecisionReply, approval_id=approval_id, approve=approve, by=user
            )
        except p.ProtocolError as exc:
            if exc.error.code == "conflict":
                return f"Already decided: {_mentions(render.escape(exc.error.message))}."
            return f"The runner refused: {render.escape(exc.error.message)}"
        except (RunnerUnavailable, UnknownRunner) as exc:
            return f"Runner {runner} is not reachable right now ({render.escape(str(exc))}); try again soon."
        return None
