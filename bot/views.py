"""The team's views of goals, answered by the bot from the runners and bot.db:

- `/goal list`: this channel's active goals (state, budget used, best), shown only to the asker;
- `/goal show N` (or `show N on gpu1`): one goal's card, shown only to the asker, linked to its thread;
- `summary` (or "what happened so far?") in a goal's thread: its story so far from the ledger,
  its milestones and the agent's latest handoff in its diary — posted in the thread, never sent
  to the agent;
- `audit` in a goal's thread: who did what to it, from its runner's trail (runner.db) and the bot's
  (bot.db: what was decided in Slack), by time; `/goal audit`: the bot's part for the channel
  (role changes, refusals, held budget increases), shown only to the asker;
- the App Home tab (`app_home_opened` -> views.publish): the user's goals and their state, and the
  approvals and budget increases waiting for the user to decide.

Only goals of the channel asked in are listed or shown; the Home tab shows a person's own goals and
what they may decide.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot import queries, render, render_views
from goaltender.bot.keys import ApprovalKey, BudgetKey, CardKey
from goaltender.bot.links import RunnerPool
from goaltender.bot.outbox import Outbox, Payload
from goaltender.bot.render_views import GoalLine, Waiting
from goaltender.bot.roles import Roles
from goaltender.protocol import messages as p
from goaltender.storage.bot_store import BotStore, Thread
from goaltender.storage.records import AuditEntry, DiaryEntry

log = logging.getLogger("goaltender.bot")

AUDIT_LINES = 20  # a thread's `audit`: the last actions
CHANNEL_AUDIT_LINES = 30  # `/goal audit`

_SHOW = re.compile(r"^show\s+#?(\d+)(?:\s+on\s+(\S+))?\s*$", re.I)
_SUMMARY = re.compile(
    r"^(?:summary|summari[sz]e(?: (?:it|this|the goal))?|recap|progress(?: so far)?"
    r"|what(?:'s| has)? happened(?: so far)?|what (?:has|did) (?:it|the agent) (?:done|do)(?: so far)?"
    r"|where are we(?: at)?(?: so far)?|how(?:'s| is) it going(?: so far)?)$"
)


def command_words(text: str) -> tuple[str, str] | None:
    """("list", ""), ("audit", "") or ("show", "3 on gpu1") when a /goal's text asks for a view,
    else None."""
    words = " ".join(text.split())
    if words.lower() in ("list", "audit"):
        return words.lower(), ""
    if _SHOW.match(words):
        return "show", words.partition(" ")[2]
    return None


def asks_for_summary(text: str) -> bool:
    """Whether a thread reply asks what happened so far (`summary`, "what happened so far?")."""
    words = " ".join(text.lower().replace("’", "'").split()).strip(" ?!.")
    return bool(_SUMMARY.match(words))


class Views:
    def __init__(
        self, store: BotStore, pool: RunnerPool, outbox: Outbox, roles: Roles, client: AsyncWebClient
    ):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.roles = roles
        self.client = client

    async def command(
        self, kind: str, words: str, channel: str, respond: Callable[[Payload], Awaitable[None]]
    ) -> None:
        """`/goal list`, `/goal audit` or `/goal show N`, answered to the asker alone."""
        if kind == "list":
            await respond(render_views.goal_list(await self._active_lines(channel)))
            return
        if kind == "audit":
            entries = await self.store.audit.of_channel(channel, CHANNEL_AUDIT_LINES)
            await respond(render_views.channel_audit(entries))
            return
        match = _SHOW.match(f"show {words}")
        assert match is not None
        goal_id, runner = int(match.group(1)), match.group(2)
        threads = [
            t
            for t in await self.store.threads(channel=channel)
            if t.goal_id == goal_id and (runner is None or t.runner.lower() == runner.lower())
        ]
        if len(threads) != 1:
            if threads:
                runners = ", ".join(t.runner for t in threads)
                text = f"Several goals #{goal_id} in this channel (runners {runners}): `/goal show {goal_id} on <runner>`."
            else:
                text = f"There is no goal #{goal_id} in this channel. `/goal list` lists its active goals."
            await respond(render.notice(text))
            return
        line = await self._line(
            threads[0], live=await queries.goal_status(self.pool, threads[0].runner, goal_id)
        )
        if line is None:
            await respond(render.notice(f"Runner {threads[0].runner} did not answer; try again soon."))
            return
        await respond(render_views.goal_shown(line))

    async def summary(self, thread: Thread) -> Payload | None:
        """What happened so far in a goal (None when its runner does not answer)."""
        try:
            reply = await asyncio.wait_for(
                self.pool[thread.runner].request(p.Summary(goal_id=thread.goal_id)),
                queries.STATUS_TIMEOUT_S,
            )
        except queries.NO_ANSWER as exc:
            log.warning("runner %s: no summary of goal #%s: %s", thread.runner, thread.goal_id, exc)
            return None
        milestones = [
            (m.title, m.at) for m in await self.store.milestones(thread.runner, thread.goal_id, last=5)
        ]
        diary = await self._latest_diary(thread)
        return render_views.goal_summary(reply.status, reply.ledger, milestones, diary)

    async def audit(self, thread: Thread, last: int = AUDIT_LINES) -> Payload:
        """A goal's audit trail: its runner's part and the bot's, by time (the bot's alone, saying
        so, when the runner does not answer)."""
        ours = await self.store.audit.of_goal(thread.runner, thread.goal_id, last)
        theirs = await self._runner_audit(thread, last)
        return render_views.goal_audit(thread.goal_id, thread.runner, ours, theirs, last)

    async def _runner_audit(self, thread: Thread, last: int) -> list[AuditEntry] | None:
        try:
            reply = await asyncio.wait_for(
                self.pool[thread.runner].request(p.Audit(goal_id=thread.goal_id, limit=last)),
                queries.STATUS_TIMEOUT_S,
            )
        except queries.NO_ANSWER as exc:
            log.warning("runner %s: no audit trail of goal #%s: %s", thread.runner, thread.goal_id, exc)
            return None
        return reply.entries

    async def _latest_diary(self, thread: Thread) -> DiaryEntry | None:
        """The agent's latest handoff (else its latest note), when the runner will say."""
        try:
            reply = await asyncio.wait_for(
                self.pool[thread.runner].request(p.ReadDiary(goal_id=thread.goal_id, last=50)),
                queries.STATUS_TIMEOUT_S,
            )
        except queries.NO_ANSWER as exc:
            log.info("runner %s: no diary of goal #%s: %s", thread.runner, thread.goal_id, exc)
            return None
        handoffs = [e for e in reply.entries if e.kind == "handoff"]
        latest = handoffs or reply.entries
        return latest[-1] if latest else None

    async def publish_home(self, user: str) -> None:
        """The user's App Home tab, as of now."""
        view = render_views.home(user, await self._my_goals(user), await self._waiting_for(user))
        try:
            await self.client.views_publish(user_id=user, view=view)
        except SlackApiError as exc:
            log.warning("views.publish for %s failed: %s", user, exc.response.get("error"))

    # ---- goals and their status ----

    async def _live(self, threads: list[Thread]) -> dict[str, dict[int, p.GoalStatus] | None]:
        """Each runner's active goals now (None: the runner does not answer)."""
        runners = sorted({t.runner for t in threads})
        answers = await asyncio.gather(*(queries.active_goals(self.pool, r) for r in runners))
        return dict(zip(runners, answers, strict=True))

    async def _line(self, thread: Thread, live: p.GoalStatus | None, down: bool = True) -> GoalLine | None:
        """A goal as listed: its live status, else the last one seen (marked stale when its runner is down)."""
        last = p.GoalStatus.model_validate(thread.status) if thread.status else None
        status = live or last
        if status is None:
            return None
        link = await self.outbox.permalink(thread.channel, CardKey(thread.runner, thread.goal_id))
        return GoalLine(thread.runner, status, link, stale=live is None and down and status.goal.active)

    async def _active_lines(self, channel: str) -> list[GoalLine]:
        threads = await self.store.threads(channel=channel)
        live = await self._live(threads)
        lines = []
        for thread in threads:
            active = live[thread.runner]
            if active is not None and thread.goal_id not in active:
                continue  # ended (the runner lists every goal still active)
            line = await self._line(thread, active.get(thread.goal_id) if active is not None else None)
            if line is not None and line.status.goal.active:
                lines.append(line)
        return lines

    async def _my_goals(self, user: str) -> list[GoalLine]:
        """The user's goals, active ones first, then the latest ended."""
        threads = [t for t in await self.store.threads() if t.owner == user]
        live = await self._live(threads)
        lines = []
        for thread in reversed(threads):
            active = live[thread.runner]
            status = active.get(thread.goal_id) if active is not None else None
            line = await self._line(thread, status, down=active is None)
            if line is not None:
                lines.append(line)
        return sorted(lines, key=lambda line: not line.status.goal.active)

    async def _waiting_for(self, user: str) -> list[Waiting]:
        """Approvals the user may decide in active goals, and budget increases others asked for."""
        threads = await self.store.threads()
        live = await self._live(threads)
        waiting: list[Waiting] = []
        for thread in threads:
            status = (live[thread.runner] or {}).get(thread.goal_id)
            if status is None or not await self.roles.may_decide(thread, user):
                continue
            for approval in status.pending_approvals:
                question = render.escape(approval.question[:200])
                link = await self.outbox.permalink(
                    thread.channel, ApprovalKey(thread.runner, thread.goal_id, approval.id)
                )
                waiting.append(Waiting(thread.goal_id, question, approval.requested_at, link))
        for request in await self.store.budget_requests("pending"):
            asked_in = await self.store.thread(request.runner, request.goal_id)
            active = (live.get(request.runner) or {}).get(request.goal_id)
            if asked_in is None or active is None or request.requested_by == user:
                continue
            if await self.roles.may_control(asked_in, user):
                question = (
                    f"budget increase asked by {render.user_ref(request.requested_by)}: "
                    f"`{render.escape(request.change)}`"
                )
                link = await self.outbox.permalink(
                    asked_in.channel, BudgetKey(request.runner, request.goal_id, request.id)
                )
                waiting.append(Waiting(request.goal_id, question, request.created_at, link))
        return sorted(waiting, key=lambda item: item.since)
