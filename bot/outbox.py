"""The outbox: every Slack write goes through a durable per-channel queue in bot.db.

At most one write per second per channel, in order; 429s wait for their Retry-After, 5xx and
dropped connections are retried with backoff, and a restart neither loses nor duplicates a post:
a post is marked as attempted before it is sent and carries its key in Slack message metadata, so
after a crash the bot looks for that key in the channel before posting again.

Payloads may refer to earlier posts by key instead of by ts (`in_thread`, `editing`, `replacing`),
so a status-card update or a thread reply can be queued before the root message exists; and a
post's key, found from its (channel, ts), says which goal card or approval prompt a person
replied to, reacted on or clicked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot.keys import OutboxKey, parse
from goaltender.storage.bot_store import BotStore, OutboxItem, OutboxKind

log = logging.getLogger("goaltender.bot.outbox")

POLL_S = 0.2  # the longest the outbox sleeps without being notified
POST_IN_FLIGHT_POLLS = 100  # x 50 ms: how long `posted_at` waits for a post Slack has not answered
METADATA_EVENT = "goaltender_write"  # Slack message metadata event_type carrying the outbox key
PERMANENT = {
    "invalid_blocks",
    "msg_too_long",
    "channel_not_found",
    "not_in_channel",
    "invalid_auth",
    "is_archived",
    "no_text",
    "message_not_found",
    "cant_update_message",
    "already_reacted",
}

Payload = dict[str, Any]
FailureCallback = Callable[[OutboxItem, str], Awaitable[None]]


def in_thread(root: OutboxKey, payload: Payload) -> Payload:
    """A post in the thread of the post queued under `root`."""
    return {**payload, "thread_of": str(root)}


def editing(key: OutboxKey, payload: Payload) -> Payload:
    """An edit of the post queued under `key`."""
    return {**payload, "ts_of": str(key)}


def replacing(key: OutboxKey, payload: Payload) -> Payload:
    """An edit of the post queued under `key` that replaces it whole: the outbox sends only the
    newest of such edits still waiting (a card changes often; Slack allows ~1 write/s)."""
    return {**editing(key, payload), "replaces": True}


class Outbox:
    def __init__(
        self,
        store: BotStore,
        client: AsyncWebClient,
        *,
        per_channel_interval_s: float = 1.0,
        max_attempts: int = 10,
    ):
        self.store = store
        self.client = client
        self.interval = per_channel_interval_s
        self.max_attempts = max_attempts
        self._last_write: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._next_pass = POLL_S
        self.on_failed: FailureCallback | None = None
        """Called when a write fails for good, e.g. to tell the goal's owner."""

    def notify(self) -> None:
        """Something was queued: look now rather than at the next poll."""
        self._wake.set()

    async def enqueue(
        self, channel: str, kind: OutboxKind, payload: Payload, key: OutboxKey | None = None
    ) -> None:
        """Queue one write (once per key) and send it as soon as its channel allows."""
        await self.store.enqueue(channel, kind, payload, str(key) if key is not None else None)
        self.notify()

    async def idle(self) -> bool:
        """Whether every queued write has been sent (or has failed for good)."""
        return await self.store.pending_count() == 0

    async def sent_ts(self, key: OutboxKey) -> str | None:
        """The ts of the post queued under `key`, once Slack has it."""
        item = await self.store.outbox_by_key(str(key))
        return item.result.get("ts") if item is not None and item.state == "sent" and item.result else None

    async def permalink(self, channel: str, key: OutboxKey) -> str | None:
        """A link to the post queued under `key`, once Slack has it (None when it cannot say)."""
        ts = await self.sent_ts(key)
        if not ts:
            return None
        try:
            response = await self.client.chat_getPermalink(channel=channel, message_ts=ts)
        except (SlackApiError, OSError, TimeoutError) as exc:
            log.info("no permalink for %s/%s: %s", channel, ts, exc)
            return None
        return response.get("permalink")

    async def posted_at(self, channel: str, ts: str) -> OutboxKey | None:
        """The key of the post the bot made at (channel, ts). Slack shows a post to people before
        its API answer reaches the bot, so a very quick reply or reaction may name a post still
        in flight: then wait (briefly) for the posts in flight in that channel."""
        for _ in range(POST_IN_FLIGHT_POLLS):
            key = await self.store.sent_key_at(channel, ts)
            if key is not None:
                return parse(key)
            if not await self.store.posts_in_flight(channel):
                return None
            await asyncio.sleep(0.05)
        return None

    async def run(self) -> None:
        while True:
            self._wake.clear()  # before the pass: a notify() during it makes the next pass immediate
            await self.drain_once()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that lands as
            # its timeout fires, and close() would wait for this task forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_pass):
                    await self._wake.wait()

    async def drain_once(self) -> int:
        """Send what may be sent now; returns how many writes went out. Sets when the next pass is
        worth making: when the soonest channel may write again (items waiting for a Retry-After or
        a backoff are looked at every POLL_S)."""
        sent = 0
        self._next_pass = POLL_S
        now = time.time()
        for item in await self.store.next_pending(now):
            wait = self._last_write.get(item.channel, 0) + self.interval - time.monotonic()
            if wait > 0:
                self._next_pass = min(self._next_pass, wait)  # this channel wrote too recently
                continue
            if await self._deliver(item):
                sent += 1
                self._next_pass = min(self._next_pass, self.interval)  # its channel may have more
        return sent

    async def _deliver(self, item: OutboxItem) -> bool:
        # A 429 is not a failure: Slack said when to come back, so a rate-limited write is never
        # given up; other errors are, after max_attempts tries.
        if item.attempts >= self.max_attempts and item.error != "ratelimited":
            await self._fail(item, f"gave up after {item.attempts} attempts: {item.error}")
            return False
        try:
            if item.attempts and item.kind == "post" and (found := await self._already_posted(item)):
                await self.store.mark_sent(item.id, found)  # the crash came after Slack took it
                return False
            await self.store.mark_attempt(item.id)
            self._last_write[item.channel] = time.monotonic()
            result = await self._call(item)
        except SlackApiError as exc:
            error = exc.response.get("error", "unknown_error")
            status = exc.response.status_code
            if status == 429 or error == "ratelimited":
                retry_after = float(
                    exc.response.headers.get("Retry-After", exc.response.headers.get("retry-after", 1))
                )
                await self.store.mark_retry(item.id, time.time() + retry_after, "ratelimited")
            elif status >= 500:
                await self.store.mark_retry(item.id, time.time() + self._backoff(item), f"{status} {error}")
            elif error in PERMANENT or status < 500:
                await self._fail(item, error)
            return False
        except (OSError, TimeoutError, _Unresolved) as exc:
            await self.store.mark_retry(
                item.id, time.time() + self._backoff(item), str(exc) or type(exc).__name__
            )
            return False
        await self.store.mark_sent(item.id, result)
        return True

    async def _fail(self, item: OutboxItem, error: str) -> None:
        log.warning("slack write %s (%s to %s) failed: %s", item.id, item.kind, item.channel, error)
        await self.store.mark_failed(item.id, error)
        if self.on_failed is not None:
            await self.on_failed(item, error)

    def _backoff(self, item: OutboxItem) -> float:
        return min(60.0, 0.5 * 2**item.attempts) * random.uniform(0.8, 1.2)

    async def _resolve(self, payload: dict[str, Any], ref: str, field: str) -> None:
        if (key := payload.pop(ref, None)) is None:
            return
        earlier = await self.store.outbox_by_key(key)
        if earlier is None or earlier.state != "sent" or not earlier.result:
            raise _Unresolved(f"waiting for {key!r} to be posted")
        payload[field] = earlier.result["ts"]

    async def _call(self, item: OutboxItem) -> dict[str, Any]:
        payload = dict(item.payload)
        payload.pop("replaces", None)
        await self._resolve(payload, "thread_of", "thread_ts")
        await self._resolve(payload, "ts_of", "ts")
        if item.kind == "post":
            if item.dedupe_key:
                payload["metadata"] = {
                    "event_type": METADATA_EVENT,
                    "event_payload": {"key": item.dedupe_key},
                }
            response = await self.client.chat_postMessage(channel=item.channel, **payload)
            return {"ts": response["ts"]}
        if item.kind == "update":
            response = await self.client.chat_update(channel=item.channel, **payload)
            return {"ts": response["ts"]}
        if item.kind == "ephemeral":
            response = await self.client.chat_postEphemeral(channel=item.channel, **payload)
            return {"ts": response.get("message_ts")}
        if item.kind == "reaction":
            await self.client.reactions_add(channel=item.channel, **payload)
            return {"ts": payload.get("timestamp")}
        if item.kind == "upload":
            response = await self.client.files_upload_v2(channel=item.channel, **payload)
            return {"file": (response.get("file") or {}).get("id")}
        raise ValueError(f"unknown outbox kind {item.kind}")

    async def _already_posted(self, item: OutboxItem) -> dict[str, Any] | None:
        """Find a message carrying this item's key (posted before a crash) among recent ones."""
        payload = dict(item.payload)
        with contextlib.suppress(_Unresolved):
            await self._resolve(payload, "thread_of", "thread_ts")
        if thread_ts := payload.get("thread_ts"):
            response = await self.client.conversations_replies(
                channel=item.channel, ts=thread_ts, include_all_metadata=True, limit=200
            )
        else:
            response = await self.client.conversations_history(
                channel=item.channel, include_all_metadata=True, limit=200
            )
        messages: list[dict[str, Any]] = response.get("messages", [])
        for message in messages:
            metadata = message.get("metadata") or {}
            if (
                metadata.get("event_type") == METADATA_EVENT
                and (metadata.get("event_payload") or {}).get("key") == item.dedupe_key
            ):
                return {"ts": message["ts"]}
        return None


class _Unresolved(Exception):
    """A payload refers to a post that has not gone out yet."""
