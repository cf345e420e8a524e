"""The Slack bot: intake (/goal, @mentions, goal channels), thread replies, approvals, and the
runner events rendered into each goal's thread.

Every listener acks first (events are acked by Bolt before the listener runs), every subscribed
event type has a listener so Socket Mode acks it, and every Slack event is deduplicated by its
event_id (bot.db). A message that @mentions the bot arrives twice (app_mention + message): it is
handled once, keyed on (channel, ts). Every write to Slack goes through the outbox; runner events
are stored with their outbox rows and the runner's seq in one transaction (exactly once).

Entry point: `goaltender.bot.app:main`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot import digest, render
from goaltender.bot.config import BotSettings
from goaltender.bot.links import RunnerLink, RunnerPool, UnknownRunner
from goaltender.bot.outbox import Outbox
from goaltender.display import plots
from goaltender.display.facts import budget_line, format_duration, format_metric
from goaltender.runner import protocol as p
from goaltender.runner.budget import parse_goal_text
from goaltender.runner.client import RunnerUnavailable
from goaltender.storage.bot_store import BotStore, OutboxItem, QueuedGoal, Thread
from goaltender.storage.records import (
    ApprovalDecided,
    ApprovalRequested,
    BudgetChanged,
    Event,
    Experiment,
    ExperimentFinished,
    ExperimentStarted,
    FinalReport,
    GoalAccepted,
    GoalStateChanged,
    MilestoneReported,
    SteerReceived,
    utcnow,
)

log = logging.getLogger("goaltender.bot")

MAX_GOAL_TEXT = 4000
STATUS_TIMEOUT_S = 10.0
POST_IN_FLIGHT_POLLS = 100  # x 50 ms
HOWTO = (
    "Start a goal with `/goal <what to achieve>`, e.g. "
    "`/goal train the star-count model to 95% accuracy, budget 2h, max 20 experiments`. "
    "Optional: `gpu-hours 8`, `30m each`, `with <agent>`, `on <runner>`. "
    "Then steer it from the goal's thread: `stop`, `pause`, `resume`, `status`, `budget +2h`, "
    "or any message for the agent."
)
CARD_EVENTS = (
    GoalAccepted,
    GoalStateChanged,
    ExperimentStarted,
    ExperimentFinished,
    ApprovalRequested,
    ApprovalDecided,
    BudgetChanged,
    FinalReport,
)
CONTROL = {"stop": p.Stop, "pause": p.Pause, "resume": p.Resume}
_BUDGET = re.compile(
    r"^\s*(?:budget\b|\+\s*\d|max\s+\d+\s+experiments?|(?:gpu|cpu|compute)[- ]hours?\b)", re.I
)
_DIGEST = re.compile(r"^\s*(daily|weekdays|every|off|stop|none|now|show|status)\b", re.I)
_USER_ID = re.compile(r"\b([UW][A-Z0-9]{5,})\b")

Reply = Callable[[str], Awaitable[None]]


def card_key(runner: str, goal_id: int) -> str:
    return f"{runner}:{goal_id}:card"


def parse_key(key: str) -> tuple[str, int, int | None] | None:
    """A card key -> (runner, goal id, None); an approval prompt's -> (runner, goal id, approval id)."""
    if key.endswith(":card"):
        runner, goal_id, _ = key.rsplit(":", 2)
        return runner, int(goal_id), None
    if ":approval:" in key:
        head, approval_id = key.rsplit(":approval:", 1)
        runner, goal_id = head.rsplit(":", 1)
        return runner, int(goal_id), int(approval_id)
    return None


def replacing(key: str, payload: dict[str, Any]) -> dict[str, Any]:
    """An edit of the message posted under `key` that replaces it whole: the outbox sends only
    the newest of such edits still waiting (a card changes often; Slack allows ~1 write/s)."""
    return {**payload, "ts_of": key, "replaces": True}


def _card(thread: Thread) -> str:
    return card_key(thread.runner, thread.goal_id)


def queue_key(queue_id: int) -> str:
    return f"queue:{queue_id}"


def approval_key(runner: str, goal_id: int, approval_id: int) -> str:
    return f"{runner}:{goal_id}:approval:{approval_id}"


def normalise_reaction(name: str) -> str:
    """`+1::skin-tone-3` -> `+1`."""
    return name.strip(":").split("::")[0]


def _mentions(text: str) -> str:
    return _USER_ID.sub(r"<@\1>", text)


class GoaltenderBot:
    """The bot: an AsyncApp (Socket Mode), bot.db, the outbox and the links to the runners."""

    def __init__(self, settings: BotSettings, store: BotStore, client: AsyncWebClient):
        self.settings = settings
        self.store = store
        self.client = client
        secret = settings.slack_signing_secret
        # HTTP mode: Bolt verifies every request's signature (and age) with the signing secret.
        self.app = AsyncApp(client=client, signing_secret=secret.get_secret_value() if secret else None)
        self.outbox = Outbox(store, client, per_channel_interval_s=settings.outbox_interval_s)
        self.outbox.on_failed = self._on_outbox_failed
        self.pool = RunnerPool(
            settings.runner_targets(),
            on_event=self.on_runner_event,
            load_cursor=store.cursor,
            on_change=self.on_link_change,
        )
        self.digests = digest.DigestScheduler(self.send_digest)
        self._draining = asyncio.Lock()  # one pass over the queued goals at a time
        self._submitting: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._responders: dict[str, Reply] = {}  # card key -> the /goal response_url, for errors
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self.handler: AsyncSocketModeHandler | None = None
        self.http: web.AppRunner | None = None
        self.http_port: int | None = None
        """HTTP mode: the port the bot listens on (useful when configured as 0)."""
        self._register()

    @classmethod
    async def open(cls, settings: BotSettings) -> GoaltenderBot:
        token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
        # One HTTP session for every Web API call: connections (and TLS) are reused, not one per call.
        kwargs: dict[str, Any] = {"token": token, "session": aiohttp.ClientSession()}
        if settings.slack_api_url:
            kwargs["base_url"] = settings.slack_api_url
        client = AsyncWebClient(**kwargs)
        settings.db_path.parent.mkdir(parents=True, exist_ok=True)
        store = await BotStore.open(settings.db_path)
        return cls(settings, store, client)

    async def start(self) -> None:
        """Start the outbox, the runner links, the digest schedules and the Socket Mode connection."""
        self._tasks.append(asyncio.ensure_future(self.outbox.run()))
        self._tasks.append(asyncio.ensure_future(self.pool.run()))
        self.digests.start(await self.store.digests())
        if self.settings.slack_mode == "http":
            server = self.app.server(port=self.settings.http_port, host=self.settings.http_host)
            self.http = web.AppRunner(server.web_app)
            await self.http.setup()
            site = web.TCPSite(self.http, self.settings.http_host, self.settings.http_port)
            await site.start()
            self.http_port = self.http.addresses[0][1]
            log.info(
                "listening for Slack on http://%s:%d/slack/events", self.settings.http_host, self.http_port
            )
        elif self.settings.slack_app_token is not None:
            self.handler = AsyncSocketModeHandler(
                self.app, app_token=self.settings.slack_app_token.get_secret_value(), web_client=self.client
            )
            await self.handler.connect_async()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.handler is not None:
            with contextlib.suppress(Exception):
                await self.handler.close_async()
        if self.http is not None:
            await self.http.cleanup()
        self.digests.shutdown()
        self.pool.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.store.close()
        if self.client.session is not None:
            await self.client.session.close()

    async def run_forever(self) -> None:
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.close()

    # ---- bookkeeping ----

    async def _posted_at(self, channel: str, ts: str) -> tuple[str, int, int | None] | None:
        """(runner, goal id, approval id or None) of the goal card or approval prompt the bot
        posted at (channel, ts), from its outbox row. Slack shows a post to people before its API
        answer reaches the bot, so a very quick reply or reaction may name a post still in
        flight: then wait (briefly) for the cards and prompts in flight in that channel."""
        for _ in range(POST_IN_FLIGHT_POLLS):
            key = await self.store.sent_key_at(channel, ts)
            if key is not None:
                return parse_key(key)
            if not await self.store.posts_in_flight(channel):
                return None
            await asyncio.sleep(0.05)
        return None

    async def _thread_at(self, channel: str, root_ts: str) -> Thread | None:
        """The goal thread whose card is at (channel, ts)."""
        found = await self._posted_at(channel, root_ts)
        if found is None or found[2] is not None:
            return None
        return await self.store.thread(found[0], found[1])

    async def _approval_at(self, channel: str, ts: str) -> tuple[str, int, int] | None:
        """(runner, goal id, approval id) of the approval prompt at (channel, ts)."""
        found = await self._posted_at(channel, ts)
        if found is None or found[2] is None:
            return None
        return found[0], found[1], found[2]

    async def _sent_ts(self, key: str) -> str | None:
        item = await self.store.outbox_by_key(key)
        return item.result.get("ts") if item is not None and item.state == "sent" and item.result else None

    async def _fresh(self, body: dict) -> bool:
        event_id = body.get("event_id")
        return True if not event_id else await self.store.first_sight(event_id)

    async def _enqueue(self, channel: str, kind: Any, payload: dict, key: str | None = None) -> None:
        await self.store.enqueue(channel, kind, payload, key)
        self.outbox.notify()

    async def _status(self, runner: str, goal_id: int) -> p.GoalStatus | None:
        try:
            reply = await asyncio.wait_for(
                self.pool[runner].call(p.Status, p.StatusReply, goal_id=goal_id), STATUS_TIMEOUT_S
            )
        except (RunnerUnavailable, p.ProtocolError, TimeoutError, UnknownRunner) as exc:
            log.warning("runner %s: no status for goal #%s: %s", runner, goal_id, exc)
            return None
        return reply.goals[0] if reply.goals else None

    def may_decide(self, user: str, thread: Thread) -> bool:
        return user == thread.owner or user in self.settings.approvers

    # ---- listeners ----

    def _register(self) -> None:
        app = self.app

        @app.command("/goal")
        async def goal_command(ack, command, respond):
            text = (command.get("text") or "").strip()
            if not text:
                await ack(text=HOWTO)
                return
            if len(text) > MAX_GOAL_TEXT:
                await ack(
                    text=f"That goal is {len(text)} characters long; the limit is {MAX_GOAL_TEXT}. {HOWTO}"
                )
                return
            await ack()
            trigger = command.get("trigger_id")
            if trigger and not await self.store.first_sight(f"command:{trigger}"):
                return  # the same invocation delivered again (same trigger_id): acted on once

            async def reply(message: str) -> None:
                await respond(text=message, response_type="ephemeral")

            channel, user = command["channel_id"], command["user_id"]
            first, _, rest = text.partition(" ")
            if first.lower() == "digest" and (not rest.strip() or _DIGEST.match(rest)):
                await self._guard(self.digest_command(rest, channel, user, reply))
                return
            await self._guard(self.intake(text, channel, user, reply, respond=reply))

        @app.event("app_mention")
        async def app_mention(body, event, context):
            if await self._fresh(body):
                await self._guard(self._on_message(event, context.get("bot_user_id"), mention=True))

        @app.event("message")
        async def message(body, event, context):
            if await self._fresh(body):
                await self._guard(self._on_message(event, context.get("bot_user_id"), mention=False))

        @app.event("reaction_added")
        async def reaction_added(body, event):
            if await self._fresh(body):
                await self._guard(self._on_reaction(event))

        @app.action("approve")
        @app.action("reject")
        async def decide_button(ack, body, respond):
            await ack()
            await self._guard(self._on_button(body, respond))

        @app.event(re.compile(".*"))
        async def everything_else(body):
            """Subscribed events nobody handles (reaction_removed, member_joined_channel, ...):
            acked all the same, so Slack does not redeliver them."""

    async def _guard(self, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception:
            log.exception("a Slack listener failed")

    # ---- intake ----

    async def intake(
        self, text: str, channel: str, user: str, reply: Reply, *, respond: Reply | None = None
    ) -> int | None:
        """Submit a goal and open its thread; returns the goal id (None when refused or queued).

        When no runner can take it (all down, or the one asked for is down), the goal is queued in
        bot.db with a visible card, and submitted as soon as a runner is back."""
        text = text.strip()
        if not text:
            await reply(HOWTO)
            return None
        if len(text) > MAX_GOAL_TEXT:
            await reply(f"That goal is {len(text)} characters long; the limit is {MAX_GOAL_TEXT}. {HOWTO}")
            return None
        spec = parse_goal_text(text)
        if not spec.text:
            await reply(f"I could not read a goal in that. {HOWTO}")
            return None
        name = self._runner_named(text, spec.runner)
        try:
            link = await self.pool.pick(name)
        except UnknownRunner as exc:
            await reply(f"{exc}. Your goal was not submitted: `{render.escape(text[:500])}`")
            return None
        except RunnerUnavailable as exc:
            await self._queue(text, channel, user, name, str(exc), reply, respond)
            return None
        try:
            goal_id = await self._submit(link, text, channel, user, respond)
        except p.ProtocolError as exc:
            await reply(f"The runner {link.name} refused the goal: {exc.error.message}")
            return None
        except RunnerUnavailable as exc:
            await self._queue(text, channel, user, name, str(exc), reply, respond)
            return None
        await reply(
            f"Queued as goal #{goal_id} on {link.name}. Its thread is the status card in this channel: "
            "reply there to steer it (`stop`, `pause`, `resume`, `status`, `budget +2h`)."
        )
        return goal_id

    def _runner_named(self, text: str, parsed: str | None) -> str | None:
        """The runner a goal asks for: `on runner X` (any X: unknown ones get an answer), or
        `on X` anywhere in the text for a configured runner X."""
        if parsed in self.pool.links:
            return parsed
        if parsed and re.search(r"\bon\s+runner\s+", text, re.I):
            return parsed
        names = "|".join(re.escape(name) for name in self.pool.links)
        match = re.search(rf"\bon\s+({names})(?![\w.-])", text, re.I)
        return next((n for n in self.pool.links if match and n.lower() == match.group(1).lower()), None)

    async def _submit(
        self, link: RunnerLink, text: str, channel: str, user: str, respond: Reply | None = None
    ) -> int:
        """SubmitGoal, then queue the goal's status card; ProtocolError / RunnerUnavailable pass through."""
        async with self._submitting[link.name]:
            spec = parse_goal_text(text)
            submitted = await link.call(p.SubmitGoal, p.GoalReply, text=text, owner=user, agent=spec.agent)
            status = submitted.status
            goal_id = status.goal.id
            key = card_key(link.name, goal_id)
            if respond is not None:
                self._responders[key] = respond
            # The thread and its card in one transaction: an event that finds the thread finds its
            # card, and the card's ts (recorded when it is sent) always finds its thread.
            card = render.status_card(status, link.name)
            await self.store.add_thread(link.name, goal_id, channel, user, card=(card, key))
            await self.store.set_status(link.name, goal_id, status.model_dump(mode="json"))
        self.outbox.notify()
        return goal_id

    async def _queue(
        self,
        text: str,
        channel: str,
        user: str,
        runner: str | None,
        why: str,
        reply: Reply,
        respond: Reply | None,
    ) -> None:
        queue_id = await self.store.queue_goal(channel, user, text, runner)
        key = queue_key(queue_id)
        if respond is not None:
            self._responders[key] = respond
        await self._enqueue(channel, "post", render.queued_card(queue_id, text, user, runner, why), key)
        where = f"runner {runner}" if runner else "a runner"
        await reply(
            f"No runner can take your goal right now ({why}). It is queued (q{queue_id}) with a card in "
            f"this channel, and starts as soon as {where} is back. Nothing is lost."
        )

    async def drain_queue(self) -> int:
        """Submit the queued goals whose runner is up, oldest first; returns how many started."""
        started = 0
        async with self._draining:
            for queued in await self.store.queued_goals():
                link = await self._link_for(queued)
                if link is None:
                    continue
                try:
                    goal_id = await self._submit(link, queued.text, queued.channel, queued.owner)
                except RunnerUnavailable:
                    continue  # it went down again; the next link-up tries again
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
        await self._enqueue(queued.channel, "update", replacing(queue_key(queued.id), card))

    async def on_link_change(self, runner: str, up: bool) -> None:
        """A runner came back: start its queued goals, refresh its cards. It went down: say so on
        the cards of its active goals (from the last status seen; nothing is lost meanwhile)."""
        if up:
            await self.drain_queue()
        why = self.pool[runner].last_error or "not connected"
        for thread in await self.store.threads(runner=runner):
            last = p.GoalStatus.model_validate(thread.status) if thread.status else None
            if last is not None and not last.goal.active:
                continue
            if up:
                status = await self._status(runner, thread.goal_id)
                if status is None:
                    continue
                await self.store.set_status(runner, thread.goal_id, status.model_dump(mode="json"))
                card = render.status_card(status, runner)
            elif last is not None:
                card = render.status_card(last, runner, runner_down=why)
            else:
                continue
            await self._enqueue(thread.channel, "update", replacing(card_key(runner, thread.goal_id), card))

    async def _on_message(self, event: dict, bot_user: str | None, *, mention: bool) -> None:
        subtype = event.get("subtype")
        if subtype not in (None, "thread_broadcast", "file_share"):
            return
        if event.get("bot_id") or not event.get("user") or event.get("user") == bot_user:
            return
        channel, ts, user = event["channel"], event["ts"], event["user"]
        text = event.get("text") or ""
        token = f"<@{bot_user}>" if bot_user else None
        mentioned = mention or bool(token and token in text)
        if token:
            text = text.replace(token, " ")
        text = text.strip()
        thread_ts = event.get("thread_ts")
        if thread_ts and thread_ts != ts:
            thread = await self._thread_at(channel, thread_ts)
            if thread is None:
                return  # not a goal thread
            if await self.store.first_sight(f"msg:{channel}:{ts}"):
                await self._on_reply(thread, ts, user, text)
            return
        if not (mentioned or channel in self.settings.goal_channels):
            return
        # Decided it is ours; only now mark it, so the twin event (app_mention/message) is dropped.
        if not await self.store.first_sight(f"msg:{channel}:{ts}"):
            return

        async def reply(message: str) -> None:
            await self._enqueue(channel, "ephemeral", {"user": user, "text": message})

        await self.intake(text, channel, user, reply)

    # ---- thread replies ----

    async def _thread_post(self, thread: Thread, text: str, key: str | None = None) -> None:
        await self._enqueue(thread.channel, "post", {**render.notice(text), "thread_of": _card(thread)}, key)

    async def _on_reply(self, thread: Thread, ts: str, user: str, text: str) -> None:
        if not text:
            return
        key = f"reply:{thread.channel}:{ts}"
        command = text.strip().lower().rstrip(".!")
        try:
            link = self.pool[thread.runner]
        except UnknownRunner:
            await self._thread_post(
                thread, f"This goal's runner {thread.runner} is no longer configured.", key
            )
            return
        try:
            if command in CONTROL:
                await link.call(CONTROL[command], p.Done, goal_id=thread.goal_id, by=user)
                await self._enqueue(thread.channel, "reaction", {"timestamp": ts, "name": "ok_hand"}, key)
            elif command == "status":
                status = await self._status(thread.runner, thread.goal_id)
                if status is None:
                    await self._thread_post(
                        thread, f"Runner {thread.runner} did not answer; try again soon.", key
                    )
                else:
                    payload = render.status_summary(status, thread.runner)
                    await self._enqueue(thread.channel, "post", {**payload, "thread_of": _card(thread)}, key)
            elif _BUDGET.match(text):
                await link.call(p.ChangeBudget, p.Done, goal_id=thread.goal_id, change=text[:200], by=user)
                await self._enqueue(thread.channel, "reaction", {"timestamp": ts, "name": "ok_hand"}, key)
            else:
                await link.call(p.Steer, p.Done, goal_id=thread.goal_id, text=text[:4000], author=user)
                await self._enqueue(thread.channel, "reaction", {"timestamp": ts, "name": "eyes"}, key)
        except p.ProtocolError as exc:
            if exc.error.code == "conflict" and (status := await self._status(thread.runner, thread.goal_id)):
                goal = status.goal
                if not goal.active:
                    why = f" ({goal.end_reason.splitlines()[0]})" if goal.end_reason else ""
                    await self._thread_post(
                        thread,
                        f"Goal #{goal.id} is {goal.state}{render.escape(why)}; it takes no more messages. "
                        "Start a new one with `/goal`.",
                        key,
                    )
                    return
            await self._thread_post(thread, f"That did not work: {render.escape(exc.error.message)}", key)
        except RunnerUnavailable as exc:
            await self._thread_post(
                thread,
                f"Runner {thread.runner} is not reachable right now ({render.escape(str(exc))}); "
                "your message was not delivered. Please send it again later.",
                key,
            )

    # ---- approvals ----

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

    async def _on_button(self, body: dict, respond: Any) -> None:
        action = body["actions"][0]
        approve = action["action_id"] == "approve"
        user = body["user"]["id"]
        container = body.get("container") or {}
        channel = container.get("channel_id") or (body.get("channel") or {}).get("id")
        runner, _, approval = (action.get("value") or "").rpartition(":")

        async def tell(text: str) -> None:
            await respond(text=text, response_type="ephemeral", replace_original=False)

        found = await self._approval_at(channel, container.get("message_ts") or "")
        thread = None
        if found is not None:
            runner, goal_id, approval_id = found
            thread = await self.store.thread(runner, goal_id)
        elif container.get("thread_ts") and approval.isdigit():
            approval_id = int(approval)
            thread = await self._thread_at(channel, container["thread_ts"])
        if thread is None:
            await tell("I can't find the goal this approval belongs to.")
            return
        if not self.may_decide(user, thread):
            await tell(f"Only {render.user_ref(thread.owner)} or the configured approvers can decide this.")
            return
        if problem := await self._decide(thread.runner, approval_id, approve, user):
            await tell(problem)

    async def _on_reaction(self, event: dict) -> None:
        name = normalise_reaction(event.get("reaction") or "")
        if name in render.APPROVE_REACTIONS:
            approve = True
        elif name in render.REJECT_REACTIONS:
            approve = False
        else:
            return
        item = event.get("item") or {}
        found = await self._approval_at(item.get("channel") or "", item.get("ts") or "")
        if found is None:
            return
        runner, goal_id, approval_id = found
        thread = await self.store.thread(runner, goal_id)
        user = event.get("user") or ""
        if thread is None or not self.may_decide(user, thread):
            return  # reactions from people who may not decide are ignored
        if problem := await self._decide(runner, approval_id, approve, user):
            log.info("reaction by %s on approval #%s: %s", user, approval_id, problem)

    # ---- digests ----

    async def digest_command(self, words: str, channel: str, user: str, reply: Reply) -> None:
        """`/goal digest ...`: show, set, turn off, or send now this channel's digest."""
        try:
            command = digest.parse_command(words)
        except ValueError as exc:
            await reply(str(exc))
            return
        current = await self.store.digest(channel)
        if command.action == "show":
            if current is None:
                await reply(f"No digest is scheduled in this channel. {digest.HOWTO}")
            else:
                when = digest.describe(current, self.digests.next_run(channel))
                await reply(f"This channel's digest: {when} (set by {render.user_ref(current.created_by)}).")
        elif command.action == "off":
            await self.store.set_digest(channel, None)
            self.digests.cancel(channel)
            if current is None:
                await reply("No digest was scheduled in this channel.")
            else:
                await self._enqueue(
                    channel,
                    "post",
                    render.notice(f"{render.user_ref(user)} turned this channel's digest off."),
                )
                await reply("Digest turned off.")
        elif command.action == "now":
            await self.send_digest(channel)
            await reply("Digest on its way.")
        else:
            assert command.spec is not None
            await self.store.set_digest(channel, command.spec, user)
            scheduled = await self.store.digest(channel)
            assert scheduled is not None
            when = digest.describe(scheduled, self.digests.schedule(scheduled))
            await self._enqueue(
                channel, "post", render.notice(f"{render.user_ref(user)} scheduled a digest here: {when}.")
            )
            await reply(f"Digest scheduled: {when}.")

    async def send_digest(self, channel: str) -> None:
        """Queue one digest of the channel's goals: active ones, pending approvals (linked), the
        ones finished since the last digest (the last day if none was sent), and one combined plot."""
        schedule = await self.store.digest(channel)
        now = utcnow()
        since = (schedule.last_sent_at or schedule.created_at) if schedule else now - timedelta(days=1)
        threads = await self.store.threads(channel=channel)
        active_now: dict[str, dict[int, p.GoalStatus] | None] = {}  # None: the runner is down
        for runner in {t.runner for t in threads}:
            try:
                reply = await asyncio.wait_for(
                    self.pool[runner].call(p.Status, p.StatusReply, active_only=True), STATUS_TIMEOUT_S
                )
                active_now[runner] = {s.goal.id: s for s in reply.goals}
            except (RunnerUnavailable, p.ProtocolError, TimeoutError, UnknownRunner):
                active_now[runner] = None
        active: list[str] = []
        approvals: list[str] = []
        finished: list[str] = []
        series: dict[str, list[tuple[float | None, float]]] = {}
        metrics: set[str] = set()
        for thread in threads:
            live = active_now[thread.runner]
            last = p.GoalStatus.model_validate(thread.status) if thread.status else None
            status = (live or {}).get(thread.goal_id)
            if status is None and live is not None and _may_have_ended_since(last, since):
                status = await self._status(thread.runner, thread.goal_id)  # ended: how, and when?
            if status is None and live is None:
                status = last  # the runner is down: the last status seen
            if status is None:
                continue
            goal = status.goal
            if not goal.active and not (goal.ended_at and goal.ended_at > since):
                continue
            link = await self._permalink(channel, await self._sent_ts(_card(thread)))
            name = f"<{link}|Goal #{goal.id}>" if link else f"Goal #{goal.id}"
            ledger = await self._ledger(thread.runner, goal.id) if live is not None else []
            best = self._best_line(status, ledger, since)
            if goal.active:
                down = f" (runner *{thread.runner}* unreachable; last known)" if live is None else ""
                last = (
                    f" · last milestone: _{render.escape(thread.milestone[:200])}_"
                    if thread.milestone
                    else ""
                )
                active.append(
                    f"• {name} on {render.escape(thread.runner)}: *{goal.state.replace('_', ' ')}*{down} — "
                    f"{render.escape(goal.text[:120])}\n    {budget_line(status.goal, attempted=status.attempted, compute_hours_used=status.compute_hours_used, now=now)} · {best}{last}"
                )
            else:
                why = f" ({render.escape(goal.end_reason.splitlines()[0][:200])})" if goal.end_reason else ""
                finished.append(f"• {name}: *{goal.state}*{why} — {best}")
            for approval in status.pending_approvals:
                prompt = await self._sent_ts(approval_key(thread.runner, goal.id, approval.id))
                plink = await self._permalink(channel, prompt)
                question = render.escape(approval.question[:200])
                asked = format_duration((now - approval.requested_at).total_seconds())
                label = f"<{plink}|#{approval.id}: {question}>" if plink else f"#{approval.id}: {question}"
                approvals.append(f"• {label} (goal #{goal.id}, waiting {asked})")
            if goal.metric and (points := _best_so_far(ledger, goal.direction)):
                label = goal.text if len(goal.text) <= 32 else goal.text[:31].rsplit(" ", 1)[0] + "…"
                series[f"#{goal.id} {label}"] = points
                metrics.add(goal.metric)
        title = f"Digest · {now:%a %d %b %H:%M} UTC"
        footer = f"Since {since:%a %d %b %H:%M} UTC · `/goal digest` shows the schedule, `/goal digest off` stops it"
        key = f"digest:{channel}:{now.isoformat()}"
        writes: list[tuple[Any, dict[str, Any], str | None]] = [
            ("post", render.digest(title, active, approvals, finished, footer), key)
        ]
        if series:
            path = self.settings.home / "plots" / f"digest-{channel}-{now:%Y%m%dT%H%M%S}.png"
            ylabel = metrics.pop() if len(metrics) == 1 else "headline metric"
            await asyncio.to_thread(
                plots.plot_curves,
                series,
                path,
                ylabel=ylabel,
                xlabel="experiment",
                title="Best result so far, per goal",
            )
            upload = {
                "file": str(path),
                "filename": path.name,
                "title": f"Campaigns in this channel — {ylabel}",
            }
            writes.append(("upload", upload, f"{key}:plot"))
        if schedule is not None:
            await self.store.digest_enqueued(channel, now, writes)
        else:
            for kind, payload, write_key in writes:
                await self.store.enqueue(channel, kind, payload, write_key)
        self.outbox.notify()

    async def _permalink(self, channel: str, ts: str | None) -> str | None:
        if not ts:
            return None
        try:
            response = await self.client.chat_getPermalink(channel=channel, message_ts=ts)
        except (SlackApiError, OSError, TimeoutError) as exc:
            log.info("no permalink for %s/%s: %s", channel, ts, exc)
            return None
        return response.get("permalink")

    async def _ledger(self, runner: str, goal_id: int) -> list[Experiment]:
        try:
            summary = await self.pool[runner].call(p.Summary, p.SummaryReply, goal_id=goal_id)
        except (RunnerUnavailable, p.ProtocolError, UnknownRunner):
            return []
        return summary.ledger

    @staticmethod
    def _best_line(status: p.GoalStatus, ledger: list[Experiment], since: datetime) -> str:
        """`best acc 85.9% (up from 62.5% at the last digest)`: the best result and its trend."""
        best = status.best
        if best is None or best.metric_value is None:
            return "no result yet"
        metric = best.metric_name or status.goal.metric
        text = f"best #{best.index} {render.escape(metric or 'metric')} *{format_metric(metric, best.metric_value)}*"
        earlier = [e for e in ledger if e.ended_at and e.ended_at <= since and e.metric_value is not None]
        if not ledger:
            return text
        if not earlier:
            return text + " (new since the last digest)"
        pick = max if status.goal.direction == "maximize" else min
        before = pick(e.metric_value for e in earlier)
        if before == best.metric_value:
            return text + " (unchanged since the last digest)"
        arrow = "↑" if best.metric_value > before else "↓"
        return text + f" ({arrow} from {format_metric(metric, before)} at the last digest)"

    # ---- runner events -> Slack ----

    async def on_runner_event(self, runner: str, event: Event) -> None:
        """Render one runner event into outbox rows and store them with its seq (exactly once)."""
        if event.seq <= await self.store.cursor(runner):
            return  # a redelivery after a reconnect: already rendered (record_event rechecks atomically)
        writes: list[tuple[str, Any, dict[str, Any], str | None]] = []
        goal_id = event.goal_id
        thread = await self.store.thread(runner, goal_id) if goal_id is not None else None
        if goal_id is not None and thread is None:
            async with self._submitting[runner]:  # a goal being submitted right now gets its thread
                thread = await self.store.thread(runner, goal_id)
        card = card_key(runner, goal_id) if goal_id is not None else ""
        posted_card = await self.store.outbox_by_key(card) if thread is not None else None
        if thread is not None and posted_card is not None and posted_card.state != "failed":
            writes = await self._writes(runner, event, thread, card)
        if await self.store.record_event(runner, event.seq, writes) and writes:
            self.outbox.notify()

    async def _writes(
        self, runner: str, event: Event, thread: Thread, card: str
    ) -> list[tuple[str, Any, dict[str, Any], str | None]]:
        data = event.data
        channel = thread.channel
        goal_id = thread.goal_id
        writes: list[tuple[str, Any, dict[str, Any], str | None]] = []

        def post(payload: dict[str, Any] | None, key: str | None = None) -> None:
            if payload is not None:
                writes.append(
                    (
                        channel,
                        "post",
                        {**payload, "thread_of": card},
                        key or f"{runner}:{event.seq}:{len(writes)}",
                    )
                )

        if isinstance(data, MilestoneReported):
            post(render.milestone(data))
        elif isinstance(data, ExperimentFinished):
            post(render.experiment_finished(data))
        elif isinstance(data, ApprovalRequested):
            post(
                render.approval_prompt(data.approval, runner), approval_key(runner, goal_id, data.approval.id)
            )
        elif isinstance(data, ApprovalDecided):
            prompt = approval_key(runner, goal_id, data.approval.id)
            if await self.store.outbox_by_key(prompt) is not None:
                writes.append(
                    (
                        channel,
                        "update",
                        {**render.approval_decided(data.approval), "ts_of": prompt},
                        f"{runner}:{event.seq}:{len(writes)}",
                    )
                )
        elif isinstance(data, SteerReceived):
            post(render.steer_ack(data.message))
        elif isinstance(data, BudgetChanged):
            post(render.budget_changed(data))
        elif isinstance(data, GoalStateChanged):
            post(render.state_changed(goal_id, data))
        elif isinstance(data, FinalReport):
            post(render.final_report(data, goal_id))
        if isinstance(data, MilestoneReported | FinalReport) and (
            plot := await self._plot(runner, goal_id, event.seq)
        ):
            # Plots are coalesced: one per milestone and one with the report, not one per metric.
            writes.append((channel, "upload", {**plot, "thread_of": card}, f"{runner}:{event.seq}:plot"))
        if isinstance(data, MilestoneReported):
            await self.store.set_milestone(runner, goal_id, data.title)
        if isinstance(data, CARD_EVENTS) and (status := await self._status(runner, goal_id)) is not None:
            await self.store.set_status(runner, goal_id, status.model_dump(mode="json"))
            writes.append(
                (
                    channel,
                    "update",
                    replacing(card, render.status_card(status, runner)),
                    # Not "<runner>:<seq>:card": that is goal <seq>'s card post (card_key), which
                    # INSERT OR IGNORE would then drop, sending that goal's thread into this one.
                    f"{runner}:{event.seq}:card-update",
                )
            )
        return writes

    async def _plot(self, runner: str, goal_id: int, seq: int) -> dict[str, Any] | None:
        """The goal's headline metric per experiment as a PNG (best marked), ready to upload."""
        try:
            summary = await self.pool[runner].call(p.Summary, p.SummaryReply, goal_id=goal_id)
        except (p.ProtocolError, UnknownRunner):
            return None
        # RunnerUnavailable passes: the link dropped mid-render, so the event is not recorded and
        # comes again after the reconnect (recording it now would lose its plot for good).
        finished = [e for e in summary.ledger if e.status != "running"]
        metric = summary.status.goal.metric
        if not finished or metric is None:
            return None
        goal = summary.status.goal
        path = self.settings.home / "plots" / f"{runner}-goal-{goal_id}-{seq}.png"
        await asyncio.to_thread(
            plots.plot_campaign,
            finished,
            metric,
            path,
            direction=goal.direction,
            target=goal.target,
            title=f"Goal #{goal_id}: {metric} per experiment",
        )
        best = summary.status.best
        comment = f"best so far: #{best.index} {metric} {best.metric_value:.4g}" if best else ""
        return {
            "file": str(path),
            "filename": path.name,
            "title": f"Goal #{goal_id} — {metric}",
            "initial_comment": comment,
        }

    async def _on_outbox_failed(self, item: OutboxItem, error: str) -> None:
        key = item.dedupe_key or ""
        if error != "not_in_channel":
            return
        if key.startswith("queue:"):
            queued = await self.store.queued_goal(int(key.removeprefix("queue:")))
            if queued is not None and queued.state == "queued":
                await self.store.dequeue_goal(queued.id, error="the bot is not in the channel")
            if (respond := self._responders.pop(key, None)) is not None:
                await respond(
                    "I'm not in this channel, so I can't keep your queued goal here (I dropped it). "
                    "Invite me with `/invite @goaltender`, then run `/goal` again."
                )
            return
        if not key.endswith(":card"):
            return
        runner, goal_id, _ = key.rsplit(":", 2)
        with contextlib.suppress(RunnerUnavailable, p.ProtocolError, UnknownRunner):
            await self.pool[runner].call(
                p.Stop, p.Done, goal_id=int(goal_id), by="goaltender", reason="the bot is not in the channel"
            )
        if (respond := self._responders.pop(key, None)) is not None:
            await respond(
                f"I'm not in this channel, so I can't open goal #{goal_id}'s thread here (I stopped it). "
                "Invite me with `/invite @goaltender`, then run `/goal` again."
            )


def _may_have_ended_since(last: p.GoalStatus | None, since: datetime) -> bool:
    """Whether a goal that is no longer active may have ended after `since` (worth asking about)."""
    if last is None or last.goal.active:
        return True
    return last.goal.ended_at is None or last.goal.ended_at > since


def _best_so_far(ledger: list[Experiment], direction: str) -> list[tuple[float | None, float]]:
    """(experiment index, best metric so far) for a goal's finished experiments."""
    points: list[tuple[float | None, float]] = []
    best: float | None = None
    for e in sorted(ledger, key=lambda e: e.index):
        if e.status == "running" or e.metric_value is None:
            continue
        if best is None or (e.metric_value > best if direction == "maximize" else e.metric_value < best):
            best = e.metric_value
        points.append((float(e.index), best))
    return points


# ---- entry point ----


def missing_tokens_message(missing: list[str]) -> str:
    lines = [
        f"goaltender bot: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set.",
        "Create the Slack app from manifest.yml (api.slack.com/apps -> Create New App -> From a manifest),",
        "install it to your workspace, then put its tokens in the environment:",
        "  export SLACK_BOT_TOKEN=xoxb-...   # OAuth & Permissions -> Bot User OAuth Token",
    ]
    if "SLACK_SIGNING_SECRET" in missing:
        lines.append(
            "  export SLACK_SIGNING_SECRET=...   # Basic Information -> App Credentials -> Signing Secret"
        )
    else:
        lines.append(
            "  export SLACK_APP_TOKEN=xapp-...   # Basic Information -> App-Level Tokens (scope connections:write)"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """`goaltender bot`: run the Slack bot (Socket Mode, or HTTP with GOALTENDER_SLACK_MODE=http)
    until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = BotSettings()
    if missing := settings.missing_tokens():
        print(missing_tokens_message(missing), file=sys.stderr, end="")
        raise SystemExit(2)

    async def run() -> None:
        bot = await GoaltenderBot.open(settings)
        await bot.run_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
