"""People's messages: a new goal (a message that @mentions the bot, or any new top-level message
in a goal channel), or a reply in a goal's thread — `stop`, `pause`, `resume`, `status`,
`summary` (or "what happened so far?"), `audit`, `show examples` (bot/gallery.py), `budget +2h`,
`revert skill abc1234` (undo an applied skill edit on the goal's runner: runner/skill_folder.py),
`steer: <message>` or a reply that @mentions the bot, which goes to the agent as steering, or
anything else: the team talking in its thread, which the bot leaves alone. Files attached in the
thread go into the goal's inputs/ (bot/files.py); a 🛑 reaction on the card stops the goal.

Anyone in the channel may ask for `status`, `summary`, `audit` and `show examples` (the bot answers
them; the agent is not disturbed). Everything else changes the goal: only those who control it (its
owner, the approvers, the channel's controllers: bot/roles.py) may; anyone else is told so
privately, nothing changes, and the refusal goes into the audit trail.
A budget change over the channel's limit waits for a second person (bot/budget_guard.py).

The runner hears of people as Persons with their Slack names (bot/people.py), so what it and the
agent write says "Alice", not a user id.

A message that @mentions the bot arrives twice (app_mention + message): it is handled once,
keyed on (channel, ts).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from goaltender.bot import audit, queries, render
from goaltender.bot.approvals import normalise_reaction
from goaltender.bot.budget_guard import BudgetGuard
from goaltender.bot.files import FileRefused, Files
from goaltender.bot.gallery import Gallery, NoAnswer, asks_for_examples
from goaltender.bot.intake import GoalRefused, Intake
from goaltender.bot.keys import CardKey, QueueKey, ReplyKey
from goaltender.bot.links import DatabaseReplaced, RunnerPool, UnknownRunner
from goaltender.bot.outbox import Outbox, in_thread
from goaltender.bot.people import People
from goaltender.bot.roles import Roles
from goaltender.bot.thread import root_at, thread_at
from goaltender.bot.views import Views, asks_for_summary
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.bot_store import BotStore, QueuedGoal, Thread

log = logging.getLogger("goaltender.bot")
CONTROL: dict[str, type[p.Stop] | type[p.Pause] | type[p.Resume]] = {
    "stop": p.Stop,
    "pause": p.Pause,
    "resume": p.Resume,
}
DOING = {
    "stop": "stop",
    "pause": "pause",
    "resume": "resume",
    "budget": "change the budget of",
    "steer": "steer",
    "revert skill": "revert skill edits from",
}
# "+2h", "+30 min", "+5 experiments" — not "+1, agreed", which is talk.
_BUDGET = re.compile(
    r"^\s*(?:budget\b|\+\s*\d+(?:\.\d+)?\s*(?:h(?:ours?)?|m(?:ins?|inutes?)?|d(?:ays?)?|experiments?|gpu)(?![a-z])"
    r"|max\s+\d+\s+experiments?|(?:gpu|cpu|compute)[- ]hours?\b)",
    re.I,
)
_SKILL_REVERT = re.compile(r"^\s*revert\s+skill\s+([0-9a-f]{4,40})\s*[.!]?\s*$", re.I)
_HANDLED_SUBTYPES = (None, "thread_broadcast", "file_share")  # others are edits, joins, bots...
# A reply that steers without @mentioning the bot: `steer: …` (or `steer …`); the prefix is not sent.
_STEER = re.compile(r"^\s*steer\b\s*[:,-]?\s*", re.I)
STOP_REACTION = "octagonal_sign"


def addressed(command: str, text: str, *, mentioned: bool) -> bool:
    """Whether a reply in a goal's thread is meant for the goal (a verb, `steer:`, an @mention of
    the bot), not talk between people, which the bot leaves alone."""
    return (
        mentioned
        or command in CONTROL
        or bool(_STEER.match(text) or _BUDGET.match(text) or _SKILL_REVERT.match(text))
    )


def _doing(command: str, text: str, *, reverts_skill: bool) -> str:
    """What a reply that is no question asks for (DOING's keys)."""
    if command in CONTROL:
        return command
    if reverts_skill:
        return "revert skill"
    return "budget" if _BUDGET.match(text) else "steer"


def _words(doing: str, text: str) -> str:
    """What the runner would be sent: a budget change's words, or the steering message."""
    return text[:200] if doing == "budget" else text[:4000]


class Messages:
    """Routes people's messages to intake or to their goal's runner, and answers in the thread."""

    def __init__(
        self,
        store: BotStore,
        pool: RunnerPool,
        outbox: Outbox,
        intake: Intake,
        goal_channels: list[str],
        *,
        roles: Roles,
        budget: BudgetGuard,
        views: Views,
        gallery: Gallery,
        people: People,
        files: Files,
    ):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.intake = intake
        self.goal_channels = goal_channels
        self.roles = roles
        self.budget = budget
        self.views = views
        self.gallery = gallery
        self.people = people
        self.files = files

    async def on_message(self, event: dict[str, Any], bot_user: str | None, *, mention: bool) -> None:
        if event.get("subtype") not in _HANDLED_SUBTYPES:
            return
        if event.get("bot_id") or not event.get("user") or event.get("user") == bot_user:
            return
        if not event.get("channel") or not event.get("ts"):
            missing = " and ".join(f for f in ("channel", "ts") if not event.get(f))
            log.warning("a Slack %s event without %s was ignored", event.get("type") or "message", missing)
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
            root = await root_at(self.outbox, self.store, channel, thread_ts)
            if root is None:
                return  # not a goal thread
            if await self.store.first_sight(f"msg:{channel}:{ts}"):
                if isinstance(root, QueuedGoal):
                    if addressed(text.strip().lower().rstrip(".!"), text, mentioned=mentioned):
                        await self._on_queued_reply(root, ts, user, text)
                else:
                    await self._on_files(root, ts, user, event.get("files") or [])
                    await self._on_reply(root, ts, user, text, mentioned=mentioned)
            return
        if not (mentioned or channel in self.goal_channels):
            return
        # Decided it is ours; only now mark it, so the twin event (app_mention/message) is dropped.
        if not await self.store.first_sight(f"msg:{channel}:{ts}"):
            return

        async def reply(message: str) -> None:
            await self.outbox.enqueue(channel, "ephemeral", {"user": user, "text": message})

        try:
            request = self.intake.read(text, channel, user)
        except GoalRefused as refusal:
            await reply(str(refusal))
            return
        await self.intake.submit(request, reply)

    async def _on_reply(
        self, thread: Thread, ts: str, user: str, text: str, *, mentioned: bool = False
    ) -> None:
        if not text:
            return
        key = ReplyKey(thread.channel, ts)
        command = text.strip().lower().rstrip(".!")
        if command == "status":
            await self._status(thread, key)
            return
        if asks_for_summary(text):
            await self._summary(thread, key)
            return
        if command == "audit":
            await self._audit(thread, key)
            return
        if asks_for_examples(text):
            await self._examples(thread, user, key)
            return
        if not addressed(command, text, mentioned=mentioned):
            return  # people talking in their thread: not for the agent, and no refusal
        if steer := _STEER.match(text):
            text = text[steer.end() :].strip()
            if not text:
                return
        revert = _SKILL_REVERT.match(text)
        doing = _doing(command, text, reverts_skill=revert is not None)
        if not await self.roles.may_control(thread, user):
            who = await self.roles.who_controls(thread)
            words = "" if command in CONTROL else f"{_words(doing, text)!r}: "
            await audit.record(
                self.store, user, doing, "refused", words + audit.NOT_A_CONTROLLER, thread=thread
            )
            await self._tell(
                thread, user, f"Only {who} can {DOING[doing]} goal #{thread.goal_id}; nothing changed.", key
            )
            return
        try:
            link = self.pool[thread.runner]
        except DatabaseReplaced as exc:
            said = render.escape(str(exc))
            await self._say(thread, f"{said[0].upper()}{said[1:]}; nothing was sent.", key)
            return
        except UnknownRunner:
            await self._say(thread, f"This goal's runner {thread.runner} is no longer configured.", key)
            return
        person = await self.people.person(user)
        try:
            if command in CONTROL:
                await link.request(CONTROL[command](goal_id=thread.goal_id, by=person))
                await self._react(thread, ts, "ok_hand", key)
            elif revert:  # the skills a goal's agent taught this runner: its controllers may undo them
                done = await link.request(p.RevertSkill(commit=revert.group(1).lower(), by=person))
                await self._say(thread, f"Skill edit {render.escape(done.message)}", key)
            elif (held := await self.budget.review(thread, user, _words(doing, text))) is not None:
                if held:
                    await self._say(thread, held, key)
            elif doing == "budget":
                await link.request(p.ChangeBudget(goal_id=thread.goal_id, change=text[:200], by=person))
                await self._react(thread, ts, "ok_hand", key)
            else:
                # Steering: the runner reads budget words in it too ("… budget 10h"), reviewed above.
                await link.request(p.Steer(goal_id=thread.goal_id, text=text[:4000], author=person))
                await self._react(thread, ts, "eyes", key)
        except p.ProtocolError as exc:
            await self._refused(thread, exc, key)
        except RunnerUnavailable as exc:
            await self._say(
                thread,
                f"Runner {thread.runner} is not reachable right now ({render.escape(str(exc))}); "
                "your message was not delivered. Please send it again later.",
                key,
            )

    async def _on_files(self, thread: Thread, ts: str, user: str, files: list[dict[str, Any]]) -> None:
        """Files attached in the thread: into the goal's inputs/ (its agent is told), for those who
        control the goal; each refused one gets a line in the thread saying why."""
        if not files:
            return
        key = ReplyKey(thread.channel, ts)
        if not await self.roles.may_control(thread, user):
            names = ", ".join(str(f.get("name") or "?") for f in files)
            await audit.record(
                self.store,
                user,
                "input file",
                "refused",
                f"{names!r}: {audit.NOT_A_CONTROLLER}",
                thread=thread,
            )
            who = await self.roles.who_controls(thread)
            await self._tell(
                thread, user, f"Only {who} can give goal #{thread.goal_id} files; nothing changed.", key
            )
            return
        person = await self.people.person(user)
        said = []
        for file in files:
            try:
                given = await self.files.give(thread, file, person)
            except FileRefused as refused:
                said.append(f":warning: Not given to goal #{thread.goal_id}: {refused}.")
                continue
            said.append(
                f":paperclip: `{render.escape(given.name)}` is in goal #{thread.goal_id}'s workspace as "
                f"`{render.escape(given.path)}`; the agent was told."
            )
        await self._say(thread, "\n".join(said), key)

    async def on_reaction(self, event: dict[str, Any]) -> None:
        """🛑 on a goal's card stops the goal, for those who may stop it (as the `stop` reply);
        anyone else is told so privately in the thread, and the refusal is audited."""
        if normalise_reaction(event.get("reaction") or "") != STOP_REACTION:
            return
        item = event.get("item") or {}
        thread = await thread_at(self.outbox, self.store, item.get("channel") or "", item.get("ts") or "")
        user = event.get("user") or ""
        if thread is None or not user:
            return
        if not await self.roles.may_control(thread, user):
            who = await self.roles.who_controls(thread)
            why = f"a :{STOP_REACTION}: on the card: {audit.NOT_A_CONTROLLER}"
            await audit.record(self.store, user, "stop", "refused", why, thread=thread)
            await self._tell(thread, user, f"Only {who} can stop goal #{thread.goal_id}; nothing changed.")
            return
        try:
            await self.pool[thread.runner].request(
                p.Stop(goal_id=thread.goal_id, by=await self.people.person(user))
            )
        except p.ProtocolError as exc:
            await self._refused(thread, exc)
        except (RunnerUnavailable, UnknownRunner) as exc:
            await self._say(
                thread,
                f"Runner {thread.runner} is not reachable right now ({render.escape(str(exc))}); the goal was "
                f"not stopped. Take your :{STOP_REACTION}: off the card and add it again later, or reply `stop`.",
            )

    async def _on_queued_reply(self, queued: QueuedGoal, ts: str, user: str, text: str) -> None:
        """A reply to a queued goal's card: `stop` (by those who could stop the goal) means it is
        never submitted; anything else is answered privately, as there is no agent to hear it yet."""
        if not text:
            return
        key = ReplyKey(queued.channel, ts)
        if text.strip().lower().rstrip(".!") != "stop" or queued.state != "queued":
            await self._tell_queued(queued, user, await self._queued_state(queued), key)
            return
        if not await self.roles.may_control(queued, user):
            who = await self.roles.who_controls(queued)
            why = f"queued goal q{queued.id}: {audit.NOT_A_CONTROLLER}"
            await audit.record(self.store, user, "stop", "refused", why, channel=queued.channel)
            await self._tell_queued(
                queued, user, f"Only {who} can stop queued goal q{queued.id}; nothing changed.", key
            )
            return
        now = await self.intake.stop_queued(queued.id, user)
        if now is None or now.state != "failed":  # a runner took it meanwhile
            await self._tell_queued(queued, user, await self._queued_state(now or queued), key)
            return
        await audit.record(
            self.store,
            user,
            "stop",
            "done",
            f"queued goal q{queued.id}: never submitted",
            channel=queued.channel,
        )
        said = f"{render.user_ref(user)} stopped queued goal q{queued.id}: it was never submitted and will not start."
        await self.outbox.enqueue(
            queued.channel, "post", in_thread(QueueKey(queued.id), render.notice(said)), key
        )

    async def _queued_state(self, queued: QueuedGoal) -> str:
        """What a queued goal is now, and what can be done with it, for a reply to its card."""
        if queued.state == "submitted":
            return (
                f"This goal started as goal #{queued.goal_id} on {render.escape(queued.goal_runner or '')}: "
                "reply in the thread of its card to steer or stop it."
            )
        if queued.state == "failed":
            why = render.people(queued.error or "no reason given")
            return f"This queued goal did not start ({why}); run `/goal` again for a new one."
        who = await self.roles.who_controls(queued)
        return (
            f"Goal q{queued.id} is queued, waiting for a runner: no agent hears this yet. `stop` here "
            f"cancels it ({who} may), or reply in its card's thread once it starts."
        )

    async def _tell_queued(self, queued: QueuedGoal, user: str, text: str, key: ReplyKey) -> None:
        payload = in_thread(QueueKey(queued.id), {"user": user, "text": text})
        await self.outbox.enqueue(queued.channel, "ephemeral", payload, key)

    async def _summary(self, thread: Thread, key: ReplyKey) -> None:
        answer = await self.views.summary(thread)
        if answer is None:
            await self._say(thread, f"Runner {thread.runner} did not answer; try again soon.", key)
            return
        await self.outbox.enqueue(
            thread.channel, "post", in_thread(CardKey(thread.runner, thread.goal_id), answer), key
        )

    async def _examples(self, thread: Thread, user: str, key: ReplyKey) -> None:
        """`show examples`: the gallery of hard cases, posted in the thread (or why there is none)."""
        try:
            shown = await self.gallery.find(thread)
        except NoAnswer:
            await self._say(thread, f"Runner {thread.runner} did not answer; try again soon.", key)
            return
        if shown is None:
            text = (
                f"No experiment of goal #{thread.goal_id} has a gallery of hard cases yet "
                "(an evaluation that writes `hard_cases.png` makes one)."
            )
            await self._tell(thread, user, text, key)
            return
        upload = self.gallery.upload(thread, shown)
        await self.outbox.enqueue(
            thread.channel, "upload", in_thread(CardKey(thread.runner, thread.goal_id), upload), key
        )

    async def _audit(self, thread: Thread, key: ReplyKey) -> None:
        answer = await self.views.audit(thread)
        await self.outbox.enqueue(
            thread.channel, "post", in_thread(CardKey(thread.runner, thread.goal_id), answer), key
        )

    async def _status(self, thread: Thread, key: ReplyKey) -> None:
        status = await queries.goal_status(self.pool, thread.runner, thread.goal_id)
        if status is None:
            await self._say(thread, f"Runner {thread.runner} did not answer; try again soon.", key)
            return
        payload = in_thread(
            CardKey(thread.runner, thread.goal_id), render.status_summary(status, thread.runner)
        )
        await self.outbox.enqueue(thread.channel, "post", payload, key)

    async def _refused(self, thread: Thread, exc: p.ProtocolError, key: ReplyKey | None = None) -> None:
        """The runner said no: a goal that has ended says so plainly, anything else as it came."""
        if exc.error.code == "conflict" and (
            status := await queries.goal_status(self.pool, thread.runner, thread.goal_id)
        ):
            goal = status.goal
            if not goal.active:
                why = f" ({render.people(goal.end_reason.splitlines()[0])})" if goal.end_reason else ""
                await self._say(
                    thread,
                    f"Goal #{goal.id} is {goal.state}{why}; it takes no more messages. "
                    "Start a new one with `/goal`.",
                    key,
                )
                return
        await self._say(thread, f"That did not work: {render.escape(exc.error.message)}", key)

    async def _tell(self, thread: Thread, user: str, text: str, key: ReplyKey | None = None) -> None:
        """An answer in the thread that only `user` sees."""
        payload = in_thread(CardKey(thread.runner, thread.goal_id), {"user": user, "text": text})
        await self.outbox.enqueue(thread.channel, "ephemeral", payload, key)

    async def _react(self, thread: Thread, ts: str, emoji: str, key: ReplyKey) -> None:
        await self.outbox.enqueue(thread.channel, "reaction", {"timestamp": ts, "name": emoji}, key)

    async def _say(self, thread: Thread, text: str, key: ReplyKey | None = None) -> None:
        await self.outbox.enqueue(
            thread.channel,
            "post",
            in_thread(CardKey(thread.runner, thread.goal_id), render.notice(text)),
            key,
        )
