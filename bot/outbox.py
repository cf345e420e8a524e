"""The outbox: every Slack write goes through a durable per-channel queue in bot.db.

At most one write per second per channel, in order; and a restart neither loses nor duplicates a
post: a post is marked as attempted before it is sent and carries its key in Slack message
metadata, so after a crash (or an answer lost with its connection) the bot looks for that key in
the channel before posting again.

Nothing ends it and nothing fails silently. Every failed write is logged with its cause (what Slack
or the network said, the channel, the write's kind and key) and tried again: after a 429's
Retry-After, or with exponential backoff (capped) after a 5xx, a dropped connection, a timeout or a
failed upload. Each channel's writes go in a lane of their own (a task, one write in flight per
channel): a channel waiting to try again, or whose call hangs until the session's deadline
(bot/slack_client.py), does not hold up the others. A write Slack refuses for good
(invalid_arguments, ...) or that fails `max_attempts` times is parked (bot.db state 'failed') with
a note in its goal's thread, or its channel, saying what was not delivered and why (a channel that
is gone takes no note: `on_failed` pauses its goals and tells their owners, bot/gone_channels.py);
a write refused because the bot's token is no longer good (revoked, the app uninstalled) is kept
for the next start; a layout Slack refuses (invalid_blocks, msg_too_long) is sent again as plain text. The send
loop itself is supervised: should a pass fail (bot.db, a bug), it is logged with its traceback and
the loop starts again after a pause; a lane that fails so holds its channel for that pause.

Payloads may refer to earlier posts by key instead of by ts (`in_thread`, `editing`, `replacing`),
so a status-card update or a thread reply can be queued before the root message exists; and a
post's key, found from its (channel, ts), says which goal card or approval prompt a person
replied to, reacted on or clicked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot import render
from goaltender.bot.keys import OutboxKey, parse
from goaltender.bot.slack_client import ACCESS_LOST_ERRORS
from goaltender.bot.slack_errors import TOKEN_ERRORS, Failure, api_error, failure_of
from goaltender.storage.bot_store import BotStore, OutboxItem, OutboxKind
from goaltender.storage.records import utcnow

log = logging.getLogger("goaltender.bot.outbox")

POLL_S = 0.2  # the longest the outbox sleeps without being notified
POST_IN_FLIGHT_POLLS = 100  # x 50 ms: how long `posted_at` waits for a post Slack has not answered
METADATA_EVENT = "goaltender_write"  # Slack message metadata event_type carrying the outbox key
RESTART_PAUSE_S = 5.0  # after the send loop itself failed: long enough not to spin on a broken bot.db
# A layout Slack refuses is sent again as its plain text (cut to fit when it is too long).
LAYOUT_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_too_long"})
MAX_PLAIN_TEXT = 39_000  # Slack refuses text over 40,000 characters
# A parked write leaves a note where it was going, unless the channel itself refuses writes (the
# note would fail the same way) or the post it belongs to was parked (that one has the note).
NOTE_PREFIX = "note:"  # the dedupe key of the note about parked write N is "note:N"
NOTED_KINDS = ("post", "update", "upload")
THREAD_NOT_DELIVERED = "thread_not_delivered"
UNNOTED_ERRORS = TOKEN_ERRORS | {"channel_not_found", "not_in_channel", "is_archived", THREAD_NOT_DELIVERED}

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
        max_attempts: int = 8,
        backoff_s: float = 0.5,
        backoff_cap_s: float = 60.0,
    ):
        """`client` should not retry writes itself: a post whose answer was lost must be looked
        for before it is sent again, which only the outbox does (see GoaltenderBot.open)."""
        self.store = store
        self.client = client
        self.interval = per_channel_interval_s
        self.max_attempts = max_attempts
        self.backoff = BackoffRetryIntervalCalculator(backoff_factor=backoff_s)  # 2**n, plus jitter
        self.backoff_cap = backoff_cap_s
        self.restart_pause_s = RESTART_PAUSE_S
        self._last_write: dict[str, float] = {}
        # A 429's Retry-After holds the whole channel, not only the write that got it: a newer card
        # edit replacing that one must not go out before Slack said it may.
        self._rate_limited_until: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._lanes: dict[str, asyncio.Task[bool]] = {}  # channel -> its write in flight
        self._next_pass = POLL_S
        self.last_sent_at: datetime | None = None
        """When Slack last took a write (this process)."""
        self.on_failed: FailureCallback | None = None
        """Called when a write is parked, with Slack's error (e.g. to tell the goal's owner)."""

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
        """Whether every queued write has been sent (or parked)."""
        return await self.store.pending_count() == 0

    async def queued(self, key: OutboxKey) -> bool:
        """Whether a write was ever queued under `key` (sent, waiting or parked)."""
        return await self.store.outbox_by_key(str(key)) is not None

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
        except Exception as exc:
            log.info("no permalink for %s/%s: %s", channel, ts, failure_of(exc).reason)
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

    # ---- the send loop ----

    async def run(self) -> None:
        """Send what is queued for as long as the bot runs. Supervised: a failed pass is logged
        with its traceback and the loop starts again after a pause; only a cancel ends it (and
        the writes in flight with it: each was marked attempted, so none is lost or doubled)."""
        try:
            while True:
                try:
                    await self._send_forever()
                except Exception:
                    log.exception(
                        "outbox: the send loop failed; starting it again in %gs", self.restart_pause_s
                    )
                    await asyncio.sleep(self.restart_pause_s)
        finally:
            lanes = list(self._lanes.values())
            for lane in lanes:
                lane.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)

    async def _send_forever(self) -> None:
        while True:
            self._wake.clear()  # before the pass: a notify() during it makes the next pass immediate
            await self._start_writes()  # (a lane that ends notifies: its channel's next write goes)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that lands as
            # its timeout fires, and close() would wait for this task forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_pass):
                    await self._wake.wait()

    async def drain_once(self) -> int:
        """Send what may be sent now, and wait for those writes; returns how many went out."""
        return sum(await asyncio.gather(*await self._start_writes()))

    async def _start_writes(self) -> list[asyncio.Task[bool]]:
        """Start, in its channel's lane, each channel's next write that may go now: one write in
        flight per channel (in order), channels side by side, so a channel whose call hangs (until
        the session's deadline) or waits for a Retry-After holds up only itself. Sets when the next
        pass is worth making: when the soonest channel may write again (items waiting for a
        Retry-After or a backoff are looked at every POLL_S)."""
        started: list[asyncio.Task[bool]] = []
        self._next_pass = POLL_S
        now = time.time()
        for item in await self.store.next_pending(now):
            if item.channel in self._lanes:
                continue  # its channel's write in flight: this one follows it
            wait = (
                max(
                    self._last_write.get(item.channel, 0) + self.interval,
                    self._rate_limited_until.get(item.channel, 0),
                )
                - time.monotonic()
            )
            if wait > 0:
                self._next_pass = min(self._next_pass, wait)  # this channel wrote too recently
                continue
            lane = asyncio.create_task(self._deliver(item))
            self._lanes[item.channel] = lane
            lane.add_done_callback(functools.partial(self._lane_ended, item.channel))
            started.append(lane)
        return started

    def _lane_ended(self, channel: str, lane: asyncio.Task[bool]) -> None:
        self._lanes.pop(channel, None)
        if not lane.cancelled() and (exc := lane.exception()) is not None:
            # Not Slack (that is handled in _deliver): bot.db, or a bug. The channel waits a while
            # rather than spin on it; the write is still pending, and goes out once it can.
            log.error(
                "outbox: a write to %s failed; its channel waits %gs",
                channel,
                self.restart_pause_s,
                exc_info=exc,
            )
            self._rate_limited_until[channel] = time.monotonic() + self.restart_pause_s
        self.notify()

    async def _deliver(self, item: OutboxItem) -> bool:
        """One try at one write; True when Slack took it. Any failure is classified, logged, and
        tried again later or parked: one odd answer from Slack never stops the outbox."""
        self._last_write[item.channel] = time.monotonic()
        try:
            await self.store.mark_attempt(item.id)  # before the call: see _already_posted
            result = await self._attempt(item)
        except Exception as exc:
            await self._attempt_failed(item, _failure(exc), exc)
            return False
        await self.store.mark_sent(item.id, result)
        self.last_sent_at = utcnow()
        return True

    async def _attempt(self, item: OutboxItem) -> dict[str, Any]:
        if item.attempts and item.kind == "post" and (found := await self._already_posted(item)):
            log.info("slack write %s: found in Slack already (an earlier try got there)", _named(item))
            return found
        return await self._send(item)

    async def _attempt_failed(self, item: OutboxItem, failure: Failure, exc: Exception) -> None:
        # A 429 is not a failure: Slack said when to come back, and the try is given back.
        if failure.error in ACCESS_LOST_ERRORS:
            # Not this write's fault: the bot stops (bot/slack_client.py), and the write waits in
            # bot.db for a bot with a working token.
            log.warning("slack write %s held: Slack refused the token (%s)", _named(item), failure.reason)
            await self.store.mark_retry(item.id, time.time() + self.backoff_cap, failure.reason, counts=False)
            return
        tries = item.attempts + (0 if failure.rate_limited else 1)
        trace = exc if failure.unexpected else None
        if failure.permanent or (tries >= self.max_attempts and not failure.rate_limited):
            why = failure.reason if failure.permanent else f"{failure.reason} (gave up after {tries} tries)"
            log.error("slack write %s parked: %s", _named(item), why, exc_info=trace)
            await self._park(item, failure, why)
            return
        delay = failure.retry_after if failure.rate_limited else self._backoff(tries)
        if failure.rate_limited:
            self._rate_limited_until[item.channel] = time.monotonic() + (delay or 0.0)
        counted = "" if failure.rate_limited else f" (try {tries} of {self.max_attempts})"
        log.log(
            logging.INFO if failure.rate_limited else logging.WARNING,
            "slack write %s failed%s: %s; trying again in %.1fs",
            _named(item),
            counted,
            failure.reason,
            delay,
            exc_info=trace,
        )
        await self.store.mark_retry(
            item.id, time.time() + (delay or 0.0), failure.reason, counts=not failure.rate_limited
        )

    def _backoff(self, tries: int) -> float:
        return min(self.backoff_cap, self.backoff.calculate_sleep_duration(tries - 1))

    async def _park(self, item: OutboxItem, failure: Failure, why: str) -> None:
        await self.store.mark_failed(item.id, why)
        await self._leave_note(item, failure, why)
        if self.on_failed is not None:
            await self.on_failed(item, failure.error if failure.permanent and failure.error else why)

    async def _leave_note(self, item: OutboxItem, failure: Failure, why: str) -> None:
        """Say, in the thread the write was for (or its channel), what was not delivered and why."""
        if item.kind not in NOTED_KINDS or is_note(item) or failure.error in UNNOTED_ERRORS:
            return
        payload: Payload = {"text": note_text(item, why)}
        if thread := item.payload.get("thread_of") or item.payload.get("ts_of"):
            payload["thread_of"] = thread
        await self.store.enqueue(item.channel, "post", payload, f"{NOTE_PREFIX}{item.id}")
        self.notify()

    # ---- one write ----

    async def _send(self, item: OutboxItem) -> dict[str, Any]:
        payload = await self._resolved(item.payload)
        if item.kind == "post":
            if item.dedupe_key:
                payload["metadata"] = {
                    "event_type": METADATA_EVENT,
                    "event_payload": {"key": item.dedupe_key},
                }
            response = await self._with_plain_fallback(item, self.client.chat_postMessage, payload)
            return {"ts": response["ts"]}
        if item.kind == "update":
            response = await self._with_plain_fallback(item, self.client.chat_update, payload)
            return {"ts": response["ts"]}
        if item.kind == "ephemeral":
            response = await self.client.chat_postEphemeral(channel=item.channel, **payload)
            return {"ts": response.get("message_ts")}
        if item.kind == "reaction":
            try:
                await self.client.reactions_add(channel=item.channel, **payload)
            except SlackApiError as exc:
                if api_error(exc) != "already_reacted":  # (an earlier try got there: it is done)
                    raise
            return {"ts": payload.get("timestamp")}
        if item.kind == "upload":
            response = await self.client.files_upload_v2(channel=item.channel, **payload)
            return {"file": (response.get("file") or {}).get("id")}
        raise ValueError(f"unknown outbox kind {item.kind}")

    async def _with_plain_fallback(
        self, item: OutboxItem, method: Callable[..., Awaitable[Any]], payload: Payload
    ) -> Any:
        """Post or edit; should Slack refuse the layout, send the text alone (the words get there)."""
        try:
            return await method(channel=item.channel, **payload)
        except SlackApiError as exc:
            plain = plain_version(payload, api_error(exc))
            if plain is None:
                raise
            log.warning(
                "slack write %s: Slack refused it (%s); sending its text alone", _named(item), api_error(exc)
            )
            return await method(channel=item.channel, **plain)

    async def _resolved(self, stored: Payload) -> Payload:
        """The payload as Slack takes it: references to earlier posts by key replaced by their ts."""
        payload = dict(stored)
        payload.pop("replaces", None)
        for ref, field in (("thread_of", "thread_ts"), ("ts_of", "ts")):
            if (key := payload.pop(ref, None)) is not None:
                payload[field] = await self._ts_of(key)
        return payload

    async def _ts_of(self, key: str) -> str:
        earlier = await self.store.outbox_by_key(key)
        if earlier is not None and earlier.state == "failed":
            raise _NeverPosted(f"the message it belongs to ({key}) was not delivered")
        if earlier is None or earlier.state != "sent" or not earlier.result:
            raise _Unresolved(f"waiting for {key!r} to be posted")
        return earlier.result["ts"]

    async def _already_posted(self, item: OutboxItem) -> dict[str, Any] | None:
        """Find a message carrying this item's key (posted before a crash): in its thread, every
        page of replies (the soak's 500-post thread once lost a post past the first 200 and posted
        it twice); in a channel, the recent ones."""
        thread_ts = None
        if thread_of := item.payload.get("thread_of"):
            with contextlib.suppress(_Unresolved):
                thread_ts = await self._ts_of(thread_of)
        cursor = None
        while True:
            if thread_ts:  # oldest first: a long thread's latest replies are pages in
                response = await self.client.conversations_replies(
                    channel=item.channel, ts=thread_ts, include_all_metadata=True, limit=200, cursor=cursor
                )
            else:  # newest first: the recent messages are the first page
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
            cursor = (response.get("response_metadata") or {}).get("next_cursor")
            if not (thread_ts and cursor):
                return None


def _failure(exc: Exception) -> Failure:
    if isinstance(exc, _NeverPosted):
        return Failure(str(exc), permanent=True, error=THREAD_NOT_DELIVERED)
    if isinstance(exc, _Unresolved):
        return Failure(str(exc), permanent=False)
    return failure_of(exc)


def is_note(item: OutboxItem) -> bool:
    return (item.dedupe_key or "").startswith(NOTE_PREFIX)


def note_text(item: OutboxItem, why: str) -> str:
    """What a parked write's note says: what it was (and its words), and why it did not get here."""
    what = {
        "post": "a message",
        "update": "an update of the message above",
        "upload": f"the file {item.payload.get('filename') or ''}".rstrip(),
    }.get(item.kind, "a write")
    words = item.payload.get("text") or item.payload.get("initial_comment") or ""
    quote = f"\n>{render.escape(_shorten(words, 300))}" if words else ""
    return f":warning: I could not deliver {what} to Slack: {render.escape(why)}.{quote}"


def plain_version(payload: Payload, error: str | None) -> Payload | None:
    """The payload as text alone, for a layout Slack refused; None when there is nothing to fall
    back to (or the error is not about the layout)."""
    text = payload.get("text")
    if error not in LAYOUT_ERRORS or not text:
        return None
    plain = {k: v for k, v in payload.items() if k not in ("blocks", "attachments")}
    plain["text"] = _shorten(text, MAX_PLAIN_TEXT) + f"\n_(plain text: Slack refused the layout: {error})_"
    return plain


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split()) if limit < 1000 else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _named(item: OutboxItem) -> str:
    """A write as logs name it: id, kind, key, channel."""
    return f"#{item.id} ({item.kind} {item.dedupe_key or 'unkeyed'} to {item.channel})"


class _Unresolved(Exception):
    """A payload refers to a post that has not gone out yet."""


class _NeverPosted(_Unresolved):
    """A payload refers to a post that was parked: it never will go out."""
