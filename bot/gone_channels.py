"""A goal channel that is gone: deleted (channel_not_found), archived (is_archived), or the bot
removed from it (not_in_channel). Its goals' writes can no longer arrive and no note can be left
there, so a goal would run on unseen: each of its goals still going is paused on its runner, and
its owner told by direct message (conversations.open + chat.postMessage, through the outbox: once
per goal and channel, however many writes were parked). `resume` in a thread the bot can write to
again, or `goaltender resume` on the runner, starts it again.

A goal's card refused because the bot is not in the channel is Intake's (the goal is stopped: it
never had a thread); everything else parked with these errors comes here.
"""

from __future__ import annotations

import logging

from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot.keys import CardKey, QueueKey, parse
from goaltender.bot.links import RunnerPool, UnknownRunner
from goaltender.bot.outbox import Outbox
from goaltender.bot.slack_errors import failure_of
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.bot_store import BotStore, OutboxItem, Thread
from goaltender.storage.records import TERMINAL_STATES

log = logging.getLogger("goaltender.bot")

GONE_ERRORS = frozenset({"channel_not_found", "is_archived", "not_in_channel"})
WHY = {
    "channel_not_found": "its channel was deleted (or I can no longer see it)",
    "is_archived": "its channel was archived",
    "not_in_channel": "I was removed from its channel",
}
BY = "goaltender"  # the bot itself pauses, not a person


class GoneChannels:
    def __init__(self, store: BotStore, pool: RunnerPool, outbox: Outbox, client: AsyncWebClient):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.client = client

    async def on_write_parked(self, item: OutboxItem, error: str) -> None:
        """A write was parked: when its channel is gone, pause the goals there and tell their owners."""
        if error not in GONE_ERRORS or self._intakes(item, error):
            return
        threads = [t for t in await self.store.threads(channel=item.channel) if _going(t)]
        if not threads:
            return  # no goal going there (the parked write's own log line says what was lost)
        log.error(
            "slack: %s is gone for me (%s): pausing its %d goal(s) and telling their owners",
            item.channel,
            error,
            len(threads),
        )
        for thread in threads:
            await self._pause(thread, error)

    @staticmethod
    def _intakes(item: OutboxItem, error: str) -> bool:
        """A goal's first card refused for want of membership: Intake stops that goal."""
        return error == "not_in_channel" and isinstance(parse(item.dedupe_key or ""), CardKey | QueueKey)

    async def _pause(self, thread: Thread, error: str) -> None:
        paused = True
        try:
            await self.pool[thread.runner].request(p.Pause(goal_id=thread.goal_id, by=BY))
        except p.ProtocolError as exc:  # (it ended, or was paused, meanwhile)
            log.info("goal #%d on %s not paused: %s", thread.goal_id, thread.runner, exc.error.message)
            paused = False
        except (RunnerUnavailable, UnknownRunner) as exc:
            log.error("goal #%d on %s could not be paused: %s", thread.goal_id, thread.runner, exc)
            paused = False
        await self._tell_owner(thread, error, paused)

    async def _tell_owner(self, thread: Thread, error: str, paused: bool) -> None:
        done = "I paused it" if paused else "I could not pause it (see the bot's log)"
        text = (
            f":warning: Goal #{thread.goal_id} on {thread.runner}: {WHY[error]} (<#{thread.channel}>), "
            f"so its updates cannot be posted there ({error}). {done}. To go on, reply `resume` in "
            f"its thread once I can post there again, or run `goaltender resume {thread.goal_id}` "
            "on the runner; `goaltender status` there shows it meanwhile."
        )
        try:
            opened = await self.client.conversations_open(users=thread.owner)
            dm = opened["channel"]["id"]
        except Exception as exc:  # no DM possible: the log line is the note
            log.error(
                "goal #%d's owner %s could not be told by DM (%s): %s",
                thread.goal_id,
                thread.owner,
                failure_of(exc).reason,
                text,
            )
            return
        # Once per goal and channel, however many of its writes were parked (a key no post of a
        # goal's thread has: `gone:` names no runner key).
        key = f"gone:{thread.runner}:{thread.goal_id}:{thread.channel}"
        await self.store.enqueue(dm, "post", {"text": text}, key)
        self.outbox.notify()


def _going(thread: Thread) -> bool:
    """Whether the goal was, as last seen, neither over nor paused."""
    state = ((thread.status or {}).get("goal") or {}).get("state")
    return state not in TERMINAL_STATES and state != "paused"
