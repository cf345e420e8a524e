"""Intake: a goal asked for in Slack, read once, then submitted to a runner — or, while no runner
can take it, queued in bot.db with a visible card and submitted as soon as one is back.

A goal's words are read once, into a `GoalRequest` (its text, who asked where, what the words ask
for, and the runner they name), which every later step is handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field, replace

from goaltender.bot import audit, render
from goaltender.bot.keys import CardKey, OutboxKey, QueueKey, parse
from goaltender.bot.links import RunnerLink, RunnerPool, UnknownRunner
from goaltender.bot.membership import Membership
from goaltender.bot.outbox import Outbox, replacing
from goaltender.bot.roles import Roles, actor
from goaltender.bot.tokens import TokenRefused
from goaltender.protocol import messages as p
from goaltender.protocol.budget import GoalSpec, GoalTextError, parse_goal_text
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.bot_store import BotStore, OutboxItem, QueuedGoal

log = logging.getLogger("goaltender.bot")

MAX_GOAL_TEXT = 4000
HOWTO = (
    "Start a goal with `/goal <what to achieve>`, e.g. "
    "`/goal train the star-count model to 95% accuracy, budget 2h, max 20 experiments`. "
    "Optional: `gpu-hours 8`, `30m each`, `with <agent>`, `on <runner>`. "
    "Then steer it from the goal's thread: `stop`, `pause`, `resume`, `status`, `summary`, "
    "`budget +2h`, `steer: <message for the agent>` (or @mention me), a file to give it, or :octagonal_sign: "
    "on its card to stop it; other replies are the team's talk. Also: `/goal list`, `/goal show <n>`, "
    "`/goal digest …`, `/goal admin show`, `/goal health`."
)

Reply = Callable[[str], Awaitable[None]]
# What `/goal` text looks like with users, channels and links escaped (should_escape: true).
_ESCAPED = re.compile(r"<([@#!]?)([^<>|]+)(?:\|([^<>]*))?>")


def command_text(text: str) -> str:
    """A slash command's text as typed: Slack's `<@U1|ana>` back to `@ana`, `<#C1|general>` to
    `#general`, `<https://x|x>` to `https://x` (the command escapes them so that `/goal admin`
    gets user ids)."""

    def typed(match: re.Match[str]) -> str:
        sigil, target, label = match.groups()
        if sigil in ("@", "#"):
            return sigil + (label or target)
        if sigil == "!":
            return "@" + (label or target).split("^")[0]
        return target

    return _ESCAPED.sub(typed, text)


class GoalRefused(ValueError):
    """The words make no goal (empty, too long, or asking for a limit that cannot be, such as
    `budget 0h`); the message says why and how."""


@dataclass(frozen=True)
class GoalRequest:
    """A goal as asked for: its words, who asked where, and what the words ask for."""

    text: str
    channel: str
    owner: str
    spec: GoalSpec
    """What the words ask for: budgets, stop rules, the agent (parsed once, here)."""
    runner: str | None
    """The runner asked for (an unknown one too, to say so); None: whichever can take it."""
    key: str = field(default_factory=lambda: f"slack-goal-{uuid.uuid4().hex}")
    """Its name for the runner (SubmitGoal.key), the same at every try: a try whose reply was lost
    with the link made a goal, and the next gets that goal back instead of starting another."""

    @classmethod
    def read(cls, text: str, channel: str, owner: str, runners: Collection[str]) -> GoalRequest:
        """Read a goal's words; GoalRefused when they make none. `runners`: the configured names."""
        text = text.strip()
        if not text:
            raise GoalRefused(HOWTO)
        if len(text) > MAX_GOAL_TEXT:
            raise GoalRefused(
                f"That goal is {len(text)} characters long; the limit is {MAX_GOAL_TEXT}. {HOWTO}"
            )
        try:
            spec = parse_goal_text(text)
        except GoalTextError as exc:
            raise GoalRefused(f"Your goal was not submitted: {exc}.") from None
        return cls(text, channel, owner, spec, _runner_named(text, spec.runner, runners))

    @classmethod
    def queued(cls, goal: QueuedGoal) -> GoalRequest:
        """A goal read when it was queued, with the runner it was queued for."""
        request = replace(cls.read(goal.text, goal.channel, goal.owner, runners=()), runner=goal.runner)
        return replace(request, key=goal.submit_key) if goal.submit_key else request


def _runner_named(text: str, parsed: str | None, runners: Collection[str]) -> str | None:
    """The runner a goal asks for: `on runner X` (any X: unknown ones get an answer), or `on X`
    anywhere in the text for a configured runner X."""
    if parsed in runners:
        return parsed
    if parsed and re.search(r"\bon\s+runner\s+", text, re.I):
        return parsed
    names = "|".join(re.escape(name) for name in runners)
    match = re.search(rf"\bon\s+({names})(?![\w.-])", text, re.I)
    return next((n for n in runners if match and n.lower() == match.group(1).lower()), None)


class Intake:
    """Submits goals to runners, and keeps the ones no runner can take yet until one can."""

    def __init__(
        self, store: BotStore, pool: RunnerPool, outbox: Outbox, roles: Roles, membership: Membership
    ):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.roles = roles
        self.membership = membership
        self._draining = asyncio.Lock()  # one pass over the queued goals at a time
        self._submitting: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._responders: dict[OutboxKey, Reply] = {}  # a card -> the /goal response_url, for errors

    def read(self, text: str, channel: str, owner: str) -> GoalRequest:
        return GoalRequest.read(text, channel, owner, self.pool.links)

    def submitting(self, runner: str) -> asyncio.Lock:
        """Held while a goal is submitted to `runner` and its thread recorded: an event of a goal
        just submitted waits for it, and then finds the goal's thread."""
        return self._submitting[runner]

    async def submit(self, request: GoalRequest, reply: Reply, *, respond: Reply | None = None) -> int | None:
        """Submit a goal and open its thread; returns the goal id (None when refused or queued).

        When no runner can take it (all down, or the one asked for is down), the goal is queued
        with a visible card. `respond` (a /goal's response_url) hears if its card cannot be posted.
        Where the bot is not a member, or for someone who may not start goals in the channel, the
        asker is told so, and nothing starts."""
        try:
            member = await self.membership.is_member(request.channel)
        except TokenRefused as refused:
            log.warning("goal not started (Slack refused the bot's token): %r", request.text[:200])
            await reply(
                f"Slack refused my token ({refused.error}), so I can't post your goal's thread; nothing "
                f"was started: `{render.escape(request.text[:500])}`"
            )
            return None
        if member is False:
            await reply(self.membership.invite_first(request.text))
            return None
        if not await self.roles.may_start(request.channel, request.owner):
            starters = await self.roles.members(request.channel, "starters")
            await audit.record(
                self.store,
                request.owner,
                "submit",
                "refused",
                f"{request.text[:200]!r}: not a starter here",
                channel=request.channel,
            )
            await reply(
                f"Only {starters.describe()} can start goals in this channel; your goal was not "
                f"submitted (`/goal admin show` lists the roles): `{render.escape(request.text[:500])}`"
            )
            return None
        try:
            link = await self.pool.pick(request.runner)
        except UnknownRunner as exc:
            await reply(f"{exc}. Your goal was not submitted: `{render.escape(request.text[:500])}`")
            return None
        except RunnerUnavailable as exc:
            await self._queue(request, str(exc), reply, respond)
            return None
        try:
            goal_id = await self._start(link, request, respond)
        except p.ProtocolError as exc:
            await reply(f"The runner {link.name} refused the goal: {exc.error.message}")
            return None
        except RunnerUnavailable as exc:
            await self._queue(request, str(exc), reply, respond)
            return None
        await reply(
            f"Started goal #{goal_id} on {link.name}. Its thread is the status card in this channel: "
            "reply there to steer it (`steer: …` or @mention me; `stop`, `pause`, `resume`, `status`, `budget +2h`)."
        )
        return goal_id

    async def _start(self, link: RunnerLink, request: GoalRequest, respond: Reply | None = None) -> int:
        """SubmitGoal, then queue the goal's status card; ProtocolError / RunnerUnavailable pass through."""
        async with self._submitting[link.name]:
            submitted = await link.request(
                p.SubmitGoal(
                    text=request.text,
                    owner=await self.roles.people.person(request.owner),
                    agent=request.spec.agent,
                    key=request.key,
                )
            )
            status = submitted.status
            card = CardKey(link.name, status.goal.id)
            if respond is not None:
                self._responders[card] = respond
            # The thread and its card in one transaction: an event that finds the thread finds its
            # card, and the card's ts (recorded when it is sent) always finds its thread.
            payload = render.status_card(status, link.name)
            await self.store.add_thread(
                link.name, card.goal_id, request.channel, request.owner, card=(payload, str(card))
            )
            await self.store.set_status(link.name, card.goal_id, status.model_dump(mode="json"))
        self.outbox.notify()
        return card.goal_id

    async def _queue(self, request: GoalRequest, why: str, reply: Reply, respond: Reply | None) -> None:
        queue_id = await self.store.queue_goal(
            request.channel, request.owner, request.text, request.runner, request.key
        )
        key = QueueKey(queue_id)
        if respond is not None:
            self._responders[key] = respond
        card = render.queued_card(queue_id, request.text, request.owner, request.runner, why)
        await self.outbox.enqueue(request.channel, "post", card, key)
        where = f"runner {request.runner}" if request.runner else "a runner"
        await reply(
            f"No runner can take your goal right now ({render.no_paths(why)}). It is queued (q{queue_id}) with a card in "
            f"this channel, and starts as soon as {where} is back. Nothing is lost."
        )

    async def stop_queued(self, queue_id: int, user: str) -> QueuedGoal | None:
        """Stop a goal still queued, so that it is never submitted; its card says so. Returns the
        queued goal as it now is: state "queued" before, "failed" (with why) after; a goal that
        a runner took meanwhile ("submitted") is left alone. None when there is no such goal."""
        async with self._draining:  # not while a pass may be submitting it
            queued = await self.store.queued_goal(queue_id)
            if queued is None or queued.state != "queued":
                return queued
            await self.store.dequeue_goal(queue_id, error=f"stopped by {actor(user)} before it started")
            card = render.queued_stopped(queue_id, queued.text, queued.owner, actor(user))
            await self.outbox.enqueue(queued.channel, "update", replacing(QueueKey(queue_id), card))
        return await self.store.queued_goal(queue_id)

    async def drain_queue(self) -> int:
        """Submit the queued goals whose runner is up, oldest first; returns how many started."""
        started = 0
        if self.membership.auth.lost is not None:
            return 0  # their cards could not be posted; the bot is stopping, and they stay queued
        async with self._draining:
            for queued in await self.store.queued_goals():
                link = await self._link_for(queued)
                if link is None:
                    continue
                try:
                    goal_id = await self._start(link, GoalRequest.queued(queued))
                except RunnerUnavailable:
                    continue  # it went down again; the next link-up tries again
                except GoalRefused as exc:  # queued before its words were refused
                    await self._dequeue(queued, link.name, error=str(exc))
                    continue
                except p.ProtocolError as exc:
                    await self._dequeue(queued, link.name, error=exc.error.message)
                    continue
                await self._dequeue(queued, link.name, goal_id=goal_id)
                started += 1
        return started

    async def _link_for(self, queued: QueuedGoal) -> RunnerLink | None:
        if queued.runner is None:
            with contextlib.suppress(RunnerUnavailable):
                return await self.pool.pick()
            return None
        link = self.pool.links.get(queued.runner)
        if link is None:
            await self._dequeue(queued, queued.runner, error="that runner is no longer configured")
            return None
        return link if link.healthy else None

    async def _dequeue(
        self, queued: QueuedGoal, runner: str, *, goal_id: int | None = None, error: str | None = None
    ) -> None:
        await self.store.dequeue_goal(queued.id, runner=runner, goal_id=goal_id, error=error)
        if error is not None:
            card = render.queued_refused(queued.id, queued.text, queued.owner, runner, error)
        else:
            assert goal_id is not None
            card = render.queued_started(queued.id, queued.text, queued.owner, runner, goal_id)
        await self.outbox.enqueue(queued.channel, "update", replacing(QueueKey(queued.id), card))

    async def on_outbox_failed(self, item: OutboxItem, error: str) -> None:
        """A goal's card could not be posted because the bot is not in the channel (it was removed
        after `/goal` checked, or Slack could not say): drop the queued goal, or stop the goal (it
        would have no thread), and tell whoever asked."""
        if error != "not_in_channel" or item.dedupe_key is None:
            return
        match parse(item.dedupe_key):
            case QueueKey(queue_id) as key:
                queued = await self.store.queued_goal(queue_id)
                if queued is not None and queued.state == "queued":
                    await self.store.dequeue_goal(queued.id, error="the bot is not in the channel")
                what = "I can't keep your queued goal here (I dropped it)"
            case CardKey(runner, goal_id) as key:
                with contextlib.suppress(RunnerUnavailable, p.ProtocolError, UnknownRunner):
                    await self.pool[runner].request(
                        p.Stop(
                            goal_id=goal_id,
                            by="goaltender",  # the bot itself, not a person
                            reason="the bot is not in the channel",
                        )
                    )
                what = f"I can't open goal #{goal_id}'s thread here (I stopped it)"
            case _:
                return
        if (respond := self._responders.pop(key, None)) is not None:
            await respond(
                f"I'm not in this channel, so {what}. Invite me with `/invite @goaltender`, then run `/goal` again."
            )
