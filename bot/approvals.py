"""Approvals decided from Slack: a button on the prompt, or a reaction on it (✅ 👍 approve,
❌ 👎 reject), by the goal's owner or an approver of its channel (bot/roles.py). A click by anyone
else is answered, to them alone, the same way whether they clicked or reacted (only the owner or an
approver can decide). Either refusal goes into the audit trail (the runner records the decisions it makes). A reaction
that decides nothing (the runner is down, or it was decided already) is answered in the thread, to
the person alone, as a click is. A reaction on a budget increase's prompt goes to the budget guard,
which decides those.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from goaltender.bot import audit, render
from goaltender.bot.budget_guard import BudgetGuard
from goaltender.bot.keys import ApprovalKey, BudgetKey, CardKey, row_id
from goaltender.bot.links import DatabaseReplaced, RunnerPool, UnknownRunner
from goaltender.bot.outbox import Outbox, in_thread
from goaltender.bot.roles import Roles
from goaltender.bot.thread import thread_at
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.bot_store import BotStore, Thread

log = logging.getLogger("goaltender.bot")


def normalise_reaction(name: str) -> str:
    """`+1::skin-tone-3` -> `+1`."""
    return name.strip(":").split("::")[0]


class Approvals:
    def __init__(self, store: BotStore, pool: RunnerPool, outbox: Outbox, roles: Roles, budget: BudgetGuard):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.roles = roles
        self.budget = budget

    async def on_button(self, body: dict[str, Any], respond: Callable[..., Awaitable[Any]]) -> None:
        action = body["actions"][0]
        approve = action["action_id"] == "approve"
        user = body["user"]["id"]
        container = body.get("container") or {}
        channel = container.get("channel_id") or (body.get("channel") or {}).get("id") or ""

        async def tell(text: str) -> None:
            await respond(text=text, response_type="ephemeral", replace_original=False)

        key = await self.outbox.posted_at(channel, container.get("message_ts") or "")
        if not isinstance(key, ApprovalKey):
            key = await self._named_by_button(channel, container, str(action.get("value") or ""))
        thread = await self.store.thread(key.runner, key.goal_id) if key else None
        if key is None or thread is None:
            await tell("I can't find this approval in this goal's thread; nothing was decided.")
            return
        approval_id = key.approval_id
        if not await self.roles.may_decide(thread, user):
            await self._refused(thread, user, approve, f"approval #{approval_id}: {audit.NOT_AN_APPROVER}")
            await tell(self._who_decides(thread))
            return
        if problem := await self._decide(thread.runner, approval_id, approve, user):
            await tell(problem)

    async def _named_by_button(self, channel: str, container: dict, value: str) -> ApprovalKey | None:
        """The prompt's post is not known: the button's value ("<runner>:<approval id>") names the
        approval. Only one of the clicked thread's own goal counts (a prompt for it was queued
        there): rights are checked against that goal, so a forged value naming another goal's
        approval must not reach it."""
        runner, _, approval = value.rpartition(":")
        approval_id = row_id(approval)
        thread = await thread_at(self.outbox, self.store, channel, container.get("thread_ts") or "")
        if thread is None or approval_id is None or runner != thread.runner:
            return None
        key = ApprovalKey(thread.runner, thread.goal_id, approval_id)
        return key if await self.outbox.queued(key) else None

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
        user = event.get("user") or ""
        if isinstance(key, BudgetKey):
            await self.budget.on_reaction(key, approve, user, name)
            return
        if not isinstance(key, ApprovalKey):
            return
        thread = await self.store.thread(key.runner, key.goal_id)
        if thread is None or not await self.roles.may_decide(thread, user):
            log.info("reaction by %s on approval #%s ignored: they may not decide it", user, key.approval_id)
            if thread is not None:
                why = f"approval #{key.approval_id} (a :{name}: reaction): {audit.NOT_AN_APPROVER}"
                await self._refused(thread, user, approve, why)
                # Answered as a click is: a silent reaction looks like it counted.
                await self._tell(thread, user, f"Your :{name}: decided nothing. {self._who_decides(thread)}")
            return
        again = f"once it is back, take your :{name}: off the prompt and add it again (or use its buttons)"
        if problem := await self._decide(key.runner, key.approval_id, approve, user, again=again):
            log.info("reaction by %s on approval #%s: %s", user, key.approval_id, problem)
            # Told, not only logged: the reaction stays on the prompt and looks like it counted.
            await self._tell(
                thread, user, f"Your :{name}: on approval #{key.approval_id} decided nothing. {problem}"
            )

    @staticmethod
    def _who_decides(thread: Thread) -> str:
        return f"Only {render.user_ref(thread.owner)} (the owner) or an approver can decide this."

    async def _tell(self, thread: Thread, user: str, text: str) -> None:
        """An answer in the goal's thread that only `user` sees."""
        payload = in_thread(CardKey(thread.runner, thread.goal_id), {"user": user, "text": text})
        await self.outbox.enqueue(thread.channel, "ephemeral", payload)

    async def _refused(self, thread: Thread, user: str, approve: bool, why: str) -> None:
        await audit.record(
            self.store, user, "approve" if approve else "reject", "refused", why, thread=thread
        )

    async def _decide(
        self, runner: str, approval_id: int, approve: bool, user: str, *, again: str = "try again soon"
    ) -> str | None:
        """Ask the runner to decide; None on success, else what went wrong (for the person; `again`
        says how to try again when the runner is not reachable)."""
        try:
            await self.pool[runner].request(
                p.Decide(approval_id=approval_id, approve=approve, by=await self.roles.people.person(user))
            )
        except p.ProtocolError as exc:
            if exc.error.code == "conflict":
                # "approval #3 was already approved by slack:U1 via …": who decided, as a mention
                said = re.sub(r"^approval #\d+ was already ", "", exc.error.message)
                return f"Already decided: {render.people(said)}."
            return f"The runner refused: {render.escape(exc.error.message)}"
        except DatabaseReplaced as exc:  # the goal is not on the runner any more: no trying again
            return f"Nothing was decided: {render.escape(str(exc))}."
        except (RunnerUnavailable, UnknownRunner) as exc:
            return f"Runner {runner} is not reachable right now ({render.escape(str(exc))}); {again}."
        return None
