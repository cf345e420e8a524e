"""Budget increases that need a second person: a controller's `budget +5h` (or steering whose
words the runner would read as a budget change) that grows the goal's budget by more than the
channel's limit is not sent; it becomes a prompt in the goal's thread — Approve / Reject buttons,
or ✅ 👍 / ❌ 👎 reactions — that someone else who controls the goal decides. Approved, it goes to
the runner as `ChangeBudget` by the approver; rejected, it is dropped. The requester cannot decide
it. Requests live in bot.db, so a bot restart loses none; so does the audit trail of each held
increase, each decision (as `approve budget` / `reject budget`) and each refused attempt to decide.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from goaltender.bot import audit, queries, render
from goaltender.bot.keys import BudgetKey, CardKey, row_id
from goaltender.bot.links import RunnerPool, UnknownRunner
from goaltender.bot.outbox import Outbox, editing, in_thread
from goaltender.bot.roles import Roles, actor
from goaltender.protocol import messages as p
from goaltender.protocol.budget import GoalTextError, apply_budget_change
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.bot_audit import Outcome
from goaltender.storage.bot_store import BotStore, BudgetRequest, Thread
from goaltender.storage.records import utcnow

log = logging.getLogger("goaltender.bot")

MAX_CHANGE = 200  # ChangeBudget's limit on its words


class BudgetGuard:
    def __init__(self, store: BotStore, pool: RunnerPool, outbox: Outbox, roles: Roles):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.roles = roles

    async def review(self, thread: Thread, user: str, words: str) -> str | None:
        """None when `words` (a budget change, or steering the runner would read as one) may go to
        the runner now: no limit in this channel, or within it. Otherwise they may not, and this is
        what to say in the thread: "" when the request's prompt (posted here) is the answer."""
        rule, _ = await self.roles.budget_rule(thread.channel)
        if rule is None:
            return None
        status = await queries.goal_status(self.pool, thread.runner, thread.goal_id)
        if status is None:
            return (
                f"Runner {render.escape(thread.runner)} did not answer, so I could not check how big this "
                "budget change is; nothing changed. Please send it again soon."
            )
        if not status.goal.active:
            return None  # the runner says the goal has ended
        now = utcnow()
        try:
            changed = apply_budget_change(status.goal.budget, words, now)
        except GoalTextError:
            return None  # one that cannot be: the runner refuses it, saying why
        if changed is None or (why := rule.over(status.goal.budget, changed[0], now)) is None:
            return None
        change = words.strip()
        if len(change) > MAX_CHANGE:
            change = change[: MAX_CHANGE - 1] + "…"
        request = await self.store.add_budget_request(
            thread,
            change,
            why,
            user,
            lambda request_id: (
                in_thread(
                    CardKey(thread.runner, thread.goal_id),
                    render.budget_prompt(request_id, thread.goal_id, change, user, why),
                ),
                str(BudgetKey(thread.runner, thread.goal_id, request_id)),
            ),
        )
        self.outbox.notify()
        held = f"{change!r}: {why}; request #{request.id} waits for a second person"
        await audit.record(self.store, user, "budget", "held", held, thread=thread)
        return ""

    async def on_button(self, body: dict[str, Any], respond: Callable[..., Awaitable[Any]]) -> None:
        action = body["actions"][0]
        request_id = row_id(str(action.get("value") or ""))
        problem = (
            await self.decide(request_id, action["action_id"] == "budget_approve", body["user"]["id"])
            if request_id is not None
            else "I can't find this budget request."
        )
        if problem:
            await respond(text=problem, response_type="ephemeral", replace_original=False)

    async def on_reaction(
        self, key: BudgetKey, approve: bool, user: str, name: str = "white_check_mark"
    ) -> None:
        if problem := await self.decide(key.request_id, approve, user):
            log.info("reaction by %s on budget request #%s ignored: %s", user, key.request_id, problem)
            # Told, not only logged: the reaction stays on the prompt and looks like it counted.
            if (thread := await self.store.thread(key.runner, key.goal_id)) is not None:
                told = f"Your :{name}: on budget request #{key.request_id} decided nothing. {problem}"
                payload = in_thread(CardKey(key.runner, key.goal_id), {"user": user, "text": told})
                await self.outbox.enqueue(thread.channel, "ephemeral", payload)

    async def decide(self, request_id: int, approve: bool, user: str) -> str | None:
        """Decide a request; None when decided, else what the person is told (nothing changed)."""
        request = await self.store.budget_request(request_id)
        thread = await self.store.thread(request.runner, request.goal_id) if request else None
        if request is None or thread is None:
            return "I can't find this budget request."
        if refusal := await self._refusal(request, thread, user):
            told, why = refusal
            await self._audit(thread, request, user, approve, "refused", why)
            return told
        request, decided_now = await self.store.decide_budget_request(
            request_id, "approved" if approve else "rejected", user
        )
        if not decided_now:
            by = actor(request.decided_by) if request.decided_by else "someone"
            await self._audit(thread, request, user, approve, "refused", f"already {request.state} by {by}")
            return f"Already decided: {request.state} by {render.user_ref(request.decided_by)}."
        if approve:
            try:
                await self.pool[request.runner].request(
                    p.ChangeBudget(
                        goal_id=request.goal_id,
                        change=request.change,
                        by=await self.roles.people.person(user),
                    )
                )
            except (RunnerUnavailable, UnknownRunner) as exc:
                await self.store.unapply_budget_request(request_id)
                await self._audit(thread, request, user, approve, "failed", f"runner not reachable: {exc}")
                return (
                    f"Runner {request.runner} is not reachable right now ({render.escape(str(exc))}); "
                    "the increase is still waiting. Try again soon."
                )
            except p.ProtocolError as exc:
                request = await self.store.unapply_budget_request(request_id, exc.error.message)
        outcome: Outcome = "failed" if request.state == "failed" else "done"
        await self._audit(thread, request, user, approve, outcome, request.error or request.state)
        await self._show(thread, request)
        return None

    async def _refusal(self, request: BudgetRequest, thread: Thread, user: str) -> tuple[str, str] | None:
        """Why `user` may not decide this request: (what they are told, what the trail says)."""
        if user == request.requested_by:
            return (
                "You asked for this budget increase: someone else who controls the goal must decide it.",
                "they asked for it; someone else must decide",
            )
        if not await self.roles.may_control(thread, user):
            told = f"Only {await self.roles.who_controls(thread)} can decide this budget increase."
            return told, audit.NOT_A_CONTROLLER
        return None

    async def _audit(
        self, thread: Thread, request: BudgetRequest, user: str, approve: bool, outcome: Outcome, why: str
    ) -> None:
        action = "approve budget" if approve else "reject budget"
        asked = f"request #{request.id} by {actor(request.requested_by)} ({request.change!r})"
        await audit.record(self.store, user, action, outcome, f"{asked}: {why}", thread=thread)

    async def _show(self, thread: Thread, request: BudgetRequest) -> None:
        payload = render.budget_decided(
            request.id,
            request.goal_id,
            request.change,
            request.requested_by,
            request.state,
            request.decided_by,
            request.error,
        )
        key = BudgetKey(request.runner, request.goal_id, request.id)
        await self.outbox.enqueue(thread.channel, "update", editing(key, payload))
