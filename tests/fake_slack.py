"""A fake Slack workspace for tests: the Web API, file uploads, response_urls and Socket Mode.

It speaks the wire protocol, so the real `slack_bolt` AsyncApp + AsyncSocketModeHandler and the real
`slack_sdk` AsyncWebClient run against it unmodified:

    async with FakeSlack() as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
        app = AsyncApp(client=client)
        handler = AsyncSocketModeHandler(app, app_token=fake.app_token, web_client=client)
        await handler.connect_async()        # apps.connections.open -> ws://.../link -> hello
        msg = await fake.user_posts(fake.general, "hello")
        reply = await fake.wait_for_message(fake.general, thread_ts=msg.ts)
        await handler.close_async()           # before the fake stops, or the client keeps reconnecting

The workspace is an in-memory model: channels (members, archived) -> messages (ts, thread_ts,
user/bot_id, text, blocks, metadata, reactions, files). Timestamps come from a fake clock and
increase monotonically ("1700000000.000100", "1700000000.000200", ...).

What it enforces, as Slack does (errors are HTTP 200 + {"ok": false, "error": ...} unless noted):
- tokens: no token -> not_authed; unknown -> invalid_auth; the app token (xapp-) only for
  apps.connections.open and the bot token for everything else -> not_allowed_token_type.
- channels: unknown -> channel_not_found; the bot not a member -> not_in_channel (posting,
  reacting, reading history, sharing files); archived -> is_archived.
- content: nothing to post -> no_text; text over 40,000 chars -> msg_too_long; blocks not a JSON
  array -> invalid_blocks_format; more than 50 blocks, a section text over 3,000 chars, fields over
  10 x 2,000, a header over 150, a button text over 75 / value over 2,000, unknown block types,
  missing required fields, duplicate block_ids, an image block pointing at a file that was never
  shared -> invalid_blocks (with Slack's "errors" list and json-pointers); bad metadata ->
  invalid_metadata_format; a malformed thread_ts -> invalid_thread_ts (a well-formed ts of a
  message that does not exist is accepted, as Slack does, and noted in `fake.warnings`).
- messages: chat.update/chat.delete of a missing message -> message_not_found, of someone
  else's -> cant_update_message / cant_delete_message; reactions.add twice -> already_reacted.
- rate limits: `rate_limit()` injects HTTP 429 {"error": "ratelimited"} + `Retry-After: <int>`;
  `limit_channel_rate()` turns on Slack's "about one message per second per channel" for
  chat.postMessage. `fail()` injects any other error.
- Socket Mode: envelopes must be acked by envelope_id within `ack_timeout` (3 s). An unacked
  events_api envelope is redelivered with retry_attempt+1 and retry_reason "timeout" (up to
  `max_retries` times, after `retry_delays`); an unacked slash command shows the user
  '/goal failed with the error "operation_timeout"'. Events arrive only for subscribed event
  types (`bot_events`, default: the ones in manifest.yml) in channels the bot is a member of.
  The bot's own posts, edits and reactions come back as events too (`echo_bot_events`), so
  Bolt's IgnoringSelfEvents is exercised.

Scripting (async methods; users default to alice U0ALICE, channels accept id, name or #name):
    msg = await fake.user_posts(ch, text, user)                  # message event (+ app_mention if <@U0BOT>)
    msg = await fake.user_replies(ch, thread_ts, text, user)     # thread reply
    msg = await fake.user_mentions_bot(ch, text, user)           # app_mention AND message, one message
    env = await fake.user_reacts(ch, ts, "+1::skin-tone-3", user)
    res = await fake.slash_command("/goal", text, ch, user)     # waits for the ack; res.responses,
    res = await fake.click_button(ch, ts, "approve", None, user) #   res.ephemerals, res.wait_for_response()
    again = await fake.redeliver(env); await fake.disconnect()
    await fake.wait_for(lambda: ...); await fake.wait_for_message(ch, thread_ts=..., text=...)
    fake.messages(ch, thread_ts=None); fake.thread(ch, ts); fake.ephemerals(user); fake.calls(method)
    fake.add_message(...) seeds history without events; fake.invite_bot(ch); fake.transcript(ch)

response_url (slash commands, clicks): up to 5 posts in 30 min; ephemeral unless
response_type "in_channel"; on a clicked message replace_original: true edits it and
delete_original: true deletes it. An ack() payload with text shows to the user as an ephemeral.

Everything the app did is recorded: `calls()`, `envelopes`, `acks`, `ephemerals()`, `files`,
`warnings`. `wait_for(predicate)` awaits any condition on that state; on timeout the error
includes `describe()` (recent calls, envelopes and channel transcripts).

HTTP mode instead of Socket Mode: `fake.deliver_over_http(request_url, signing_secret)` POSTs every
request, signed as Slack signs them; the 200 answer is the ack.

Close the Socket Mode handler before stopping the fake, or its client keeps trying to reconnect.
slack_sdk sends requests through HTTP(S)_PROXY even for 127.0.0.1 (it ignores NO_PROXY): unset them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import hmac
import inspect
import itertools
import json
import math
import mimetypes
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import WSMsgType, web

ALICE = "U0ALICE"
BOB = "U0BOB"

# Mirrors settings.event_subscriptions.bot_events in manifest.yml.
DEFAULT_BOT_EVENTS = ("app_mention", "message.channels", "message.groups", "reaction_added")
DEFAULT_SCOPES = (
    "app_mentions:read,channels:history,groups:history,chat:write,commands,files:write,"
    "reactions:read,reactions:write,users:read"
)

MAX_TEXT = 40_000
MAX_BLOCKS = 50
_TS_RE = re.compile(r"^\d+\.\d+$")
_MENTION_RE = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
_TEXT_TYPES = ("plain_text", "mrkdwn")
_BLOCK_TYPES = {
    "section",
    "header",
    "divider",
    "actions",
    "context",
    "image",
    "markdown",
    "rich_text",
    "input",
    "file",
    "video",
    "table",
    "call",
    "context_actions",
    "plan",
    "task_card",
}
_ELEMENT_TYPES = {
    "button",
    "image",
    "overflow",
    "datepicker",
    "timepicker",
    "datetimepicker",
    "checkboxes",
    "radio_buttons",
    "plain_text_input",
    "email_text_input",
    "url_text_input",
    "number_input",
    "rich_text_input",
    "file_input",
    "static_select",
    "external_select",
    "users_select",
    "conversations_select",
    "channels_select",
    "multi_static_select",
    "multi_external_select",
    "multi_users_select",
    "multi_conversations_select",
    "multi_channels_select",
    "workflow_button",
    "feedback_buttons",
    "icon_button",
}


# --------------------------------------------------------------------------- records


@dataclass(eq=False)
class Message:
    """A message in the workspace model (live: edits and reactions show up here)."""

    channel: str
    ts: str
    text: str = ""
    user: str | None = None
    bot_id: str | None = None
    thread_ts: str | None = None  # the root's ts for replies; == ts on a root that has replies
    blocks: list[dict] | None = None
    metadata: dict | None = None  # {"event_type": str, "event_payload": dict}
    subtype: str | None = None
    files: list[dict] = field(default_factory=list)
    reactions: dict[str, list[str]] = field(default_factory=dict)  # name -> users, in order
    edited: dict | None = None
    client_msg_id: str | None = None
    # The envelopes this message was delivered in (user messages: message and/or app_mention).
    envelopes: list[Envelope] = field(default_factory=list, repr=False)

    @property
    def is_reply(self) -> bool:
        return self.thread_ts is not None and self.thread_ts != self.ts

    @property
    def is_bot(self) -> bool:
        return self.bot_id is not None

    @property
    def reaction_names(self) -> list[str]:
        return list(self.reactions)

    def reacted(self, name: str, user: str | None = None) -> bool:
        users = self.reactions.get(name.strip(":"), [])
        return bool(users) if user is None else user in users

    def action_ids(self) -> list[str]:
        return [el["action_id"] for _, el in _interactive_elements(self.blocks or []) if "action_id" in el]


@dataclass(eq=False)
class Channel:
    id: str
    name: str
    is_private: bool = False
    is_im: bool = False
    is_mpim: bool = False
    is_archived: bool = False
    members: set[str] = field(default_factory=set)
    messages: list[Message] = field(default_factory=list, repr=False)

    @property
    def channel_type(self) -> str:
        if self.is_im:
            return "im"
        if self.is_mpim:
            return "mpim"
        return "group" if self.is_private else "channel"

    def find(self, ts: str | None) -> Message | None:
        if not ts:
            return None
        for message in self.messages:
            if message.ts == ts:
                return message
        return None


@dataclass
class User:
    id: str
    name: str
    real_name: str = ""
    is_bot: bool = False
    tz: str = "Europe/Amsterdam"
    tz_offset: int = 3600


@dataclass(eq=False)
class File:
    id: str
    name: str
    length: int
    title: str = ""
    alt_txt: str | None = None
    snippet_type: str | None = None
    user: str = ""
    content: bytes | None = None  # None until the bytes reach the upload URL
    created: int = 0
    completed: bool = False
    shares: dict[str, list[dict]] = field(default_factory=dict)  # channel -> [{ts, thread_ts?}]

    @property
    def mimetype(self) -> str:
        return mimetypes.guess_type(self.name)[0] or "application/octet-stream"

    @property
    def filetype(self) -> str:
        return self.name.rsplit(".", 1)[-1].lower() if "." in self.name else "binary"


@dataclass
class Call:
    """One request the fake received: a Web API method, an upload or a response_url post."""

    method: str
    params: dict[str, Any]
    token: str | None
    time: float  # time.monotonic()
    status: int = 200
    response: dict | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.response and self.response.get("ok"))

    @property
    def error(self) -> str | None:
        return None if self.response is None else self.response.get("error")


@dataclass
class Ephemeral:
    """An ephemeral message only `user` sees (chat.postEphemeral, response_url, ack, or Slack itself)."""

    channel: str
    user: str
    text: str
    blocks: list[dict] | None
    thread_ts: str | None
    source: str  # "chat.postEphemeral" | "response_url" | "ack" | "slack"
    message_ts: str
    time: float


@dataclass
class Ack:
    envelope_id: str
    payload: dict | None
    time: float
    connection: int


@dataclass(eq=False)
class Envelope:
    """One Socket Mode frame carrying a request; a redelivery is a new Envelope."""

    envelope_id: str
    type: str  # "events_api" | "slash_commands" | "interactive"
    payload: dict
    accepts_response_payload: bool = False
    retry_attempt: int = 0
    retry_reason: str = ""
    original: Envelope | None = field(default=None, repr=False)  # the first delivery
    redelivered_as: Envelope | None = field(default=None, repr=False)
    created_at: float = field(default_factory=time.monotonic)
    sent_at: float | None = None
    connection: int | None = None
    acked_at: float | None = None
    ack_payload: dict | None = None
    http_status: int | None = None  # HTTP delivery: the app's answer
    timed_out: bool = False
    _acked: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def acked(self) -> bool:
        return self._acked.is_set()

    @property
    def ack_latency(self) -> float | None:
        if self.acked_at is None or self.sent_at is None:
            return None
        return self.acked_at - self.sent_at

    @property
    def event(self) -> dict | None:
        return self.payload.get("event") if self.type == "events_api" else None

    @property
    def event_id(self) -> str | None:
        return self.payload.get("event_id") if self.type == "events_api" else None

    @property
    def event_type(self) -> str | None:
        event = self.event
        return None if event is None else event.get("type")

    def frame(self) -> dict:
        frame: dict[str, Any] = {
            "envelope_id": self.envelope_id,
            "payload": self.payload,
            "type": self.type,
            "accepts_response_payload": self.accepts_response_payload,
        }
        if self.type == "events_api":
            frame["retry_attempt"] = self.retry_attempt
            frame["retry_reason"] = self.retry_reason
        return frame

    async def wait_acked(self, timeout: float = 3.0) -> Envelope:
        try:
            await asyncio.wait_for(self._acked.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"envelope {self.envelope_id} ({self.type}) not acked in {timeout}s") from None
        return self


@dataclass(eq=False)
class Connection:
    id: int
    ws: web.WebSocketResponse = field(repr=False)
    request: web.Request = field(repr=False)
    opened_at: float
    closed_at: float | None = None
    draining: bool = False  # sent a disconnect frame; no new deliveries
    frames: list[dict] = field(default_factory=list, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def live(self) -> bool:
        return self.closed_at is None and not self.ws.closed

    async def send(self, frame: dict) -> None:
        async with self._lock:
            await self.ws.send_str(json.dumps(frame))
        self.frames.append(frame)


@dataclass(eq=False)
class Injection:
    """A scripted failure: the next `times` matching calls answer with `error` (and `status`)."""

    method: str | None  # None: any method
    error: str
    times: int
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    channel: str | None = None
    hits: int = 0

    @property
    def exhausted(self) -> bool:
        return self.hits >= self.times


@dataclass(eq=False)
class Interaction:
    """A slash command or a button click, and what came back to the user."""

    kind: str  # "slash_command" | "block_actions"
    envelope: Envelope
    user: str
    channel: str
    response_url: str
    started: float
    fake: FakeSlack = field(repr=False)
    message_ts: str | None = None  # block_actions: the clicked message
    responses: list[dict] = field(default_factory=list)  # JSON bodies POSTed to response_url

    @property
    def acked(self) -> bool:
        return self.envelope.acked

    @property
    def ack_payload(self) -> dict | None:
        return self.envelope.ack_payload

    @property
    def timed_out(self) -> bool:
        return self.envelope.timed_out

    @property
    def ephemerals(self) -> list[Ephemeral]:
        """Everything shown only to this user since the interaction started (ack text included)."""
        return [e for e in self.fake._ephemerals if e.user == self.user and e.time >= self.started]

    async def wait_for_response(self, count: int = 1, timeout: float = 5.0) -> dict:
        await self.fake.wait_for(
            lambda: len(self.responses) >= count, timeout, what=f"{count} response_url post(s)"
        )
        return self.responses[count - 1]

    async def wait_for_ephemeral(self, count: int = 1, timeout: float = 5.0) -> Ephemeral:
        await self.fake.wait_for(lambda: len(self.ephemerals) >= count, timeout, what=f"{count} ephemeral(s)")
        return self.ephemerals[count - 1]


@dataclass(eq=False)
class _ResponseUrl:
    id: str
    interaction: Interaction
    uses: int = 0
    created: float = field(default_factory=time.monotonic)


class SlackError(Exception):
    def __init__(
        self, error: str, *, status: int = 200, headers: Mapping[str, str] | None = None, **extra: Any
    ):
        super().__init__(error)
        self.error = error
        self.status = status
        self.headers = dict(headers or {})
        self.extra = extra


# --------------------------------------------------------------------------- the fake


class FakeSlack:
    def __init__(
        self,
        *,
        channels: Mapping[str, str] | None = None,
        users: Mapping[str, str] | None = None,
        team_id: str = "T0FAKE",
        team_domain: str = "fake-workspace",
        api_app_id: str = "A0FAKE",
        bot_user_id: str = "U0BOT",
        bot_id: str = "B0BOT",
        bot_name: str = "goaltender",
        bot_token: str = "xoxb-fake-bot-token",
        app_token: str = "xapp-1-A0FAKE-fake-app-token",
        bot_events: Iterable[str] = DEFAULT_BOT_EVENTS,
        scopes: str = DEFAULT_SCOPES,
        echo_bot_events: bool = True,
        ack_timeout: float | None = 3.0,
        max_retries: int = 3,
        retry_delays: tuple[float, ...] = (0.0, 60.0, 300.0),
        channel_rate: float | None = None,
        start_ts: int = 1_700_000_000,
    ):
        """`channels`: id -> name, the bot a member of each (default #general C0GENERAL, plus
        #random C0RANDOM without the bot; add more with add_channel()). `users`: id -> name
        (default alice U0ALICE, bob U0BOB, members of the default channels; unknown users are
        added when they act). `channel_rate`: see limit_channel_rate()."""
        self.team_id = team_id
        self.team_domain = team_domain
        self.api_app_id = api_app_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.bot_name = bot_name
        self.bot_token = bot_token
        self.app_token = app_token
        self.bot_events = set(bot_events)
        self.scopes = scopes
        self.echo_bot_events = echo_bot_events
        self.ack_timeout = ack_timeout  # seconds; None disables ack deadlines (no redelivery)
        self.max_retries = max_retries  # events_api redeliveries after the first attempt
        self.retry_delays = retry_delays  # extra wait before retry 1, 2, 3 (Slack: now, ~1 min, ~5 min)
        self.latency = 0.0  # seconds added before every Web API answer
        self.disconnect_grace = 2.0  # a draining connection is closed this long after the frame
        self.verification_token = "fake-verification-token"
        self.request_url: str | None = None  # set by deliver_over_http(): HTTP mode instead of Socket Mode
        self.signing_secret: str | None = None

        self.channels: dict[str, Channel] = {}
        self.users: dict[str, User] = {}
        self.files: dict[str, File] = {}
        self.api_calls: list[Call] = []
        self.envelopes: list[Envelope] = []
        self.acks: list[Ack] = []
        self.connections: list[Connection] = []
        self.warnings: list[str] = []  # things Slack accepts silently but that are probably bugs
        self._ephemerals: list[Ephemeral] = []
        self._injections: list[Injection] = []
        self._channel_rate: tuple[float, int, tuple[str, ...]] | None = None
        self._buckets: dict[str, tuple[float, float]] = {}  # channel -> (tokens, at)
        if channel_rate is not None:
            self.limit_channel_rate(channel_rate)
        self._outbox: deque[Envelope] = deque()
        self._by_envelope_id: dict[str, Envelope] = {}
        self._response_urls: dict[str, _ResponseUrl] = {}
        self._tickets: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._changed = asyncio.Event()
        self._clock_us = start_ts * 1_000_000
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

        self._add_user(User(bot_user_id, bot_name, real_name=bot_name, is_bot=True))
        for uid, name in (users if users is not None else {ALICE: "alice", BOB: "bob"}).items():
            self._add_user(User(uid, name, real_name=name.title()))
        if channels is None:
            self.add_channel("C0GENERAL", "general")
            self.add_channel("C0RANDOM", "random", bot_member=False)
        else:
            for cid, name in channels.items():
                self.add_channel(cid, name)

        self._methods: dict[str, Callable[[dict], Awaitable[dict]]] = {
            "api.test": self._api_test,
            "auth.test": self._auth_test,
            "apps.connections.open": self._apps_connections_open,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.delete": self._chat_delete,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "chat.getPermalink": self._chat_get_permalink,
            "reactions.add": self._reactions_add,
            "reactions.remove": self._reactions_remove,
            "conversations.history": self._conversations_history,
            "conversations.replies": self._conversations_replies,
            "conversations.info": self._conversations_info,
            "users.info": self._users_info,
            "files.getUploadURLExternal": self._files_get_upload_url,
            "files.completeUploadExternal": self._files_complete_upload,
            "files.info": self._files_info,
        }

    # ------------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> FakeSlack:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_post("/upload/v1/{file_id}", self._handle_upload)
        app.router.add_post("/response/{rid}", self._handle_response_url)
        app.router.add_get("/link", self._handle_ws)
        app.router.add_get("/link/", self._handle_ws)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for conn in self.connections:
            if conn.live:
                try:
                    await asyncio.wait_for(conn.ws.close(code=1001, message=b"server stopping"), 2)
                except (TimeoutError, ConnectionError, RuntimeError):
                    if conn.request.transport is not None:
                        conn.request.transport.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    @property
    def general(self) -> str:
        """The id of the first channel (the default #general)."""
        return next(iter(self.channels))

    def client(self, *, rate_limit_retries: int = 0, **kwargs: Any):
        """A real AsyncWebClient with the bot token, pointed at the fake."""
        from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
        from slack_sdk.web.async_client import AsyncWebClient

        client = AsyncWebClient(token=kwargs.pop("token", self.bot_token), base_url=self.api_url, **kwargs)
        if rate_limit_retries:
            client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries))
        return client

    # ------------------------------------------------------------------ workspace setup

    def add_channel(
        self,
        id: str,
        name: str | None = None,
        *,
        bot_member: bool = True,
        private: bool = False,
        archived: bool = False,
        members: Iterable[str] | None = None,
    ) -> Channel:
        """`members` defaults to every (non-bot) user known so far; the bot joins if bot_member."""
        ch = Channel(id=id, name=name or id.lower(), is_private=private, is_archived=archived)
        ch.is_im = id.startswith("D")
        if members is None:
            members = [u.id for u in self.users.values() if not u.is_bot]
        ch.members.update(members)
        if bot_member:
            ch.members.add(self.bot_user_id)
        self.channels[id] = ch
        return ch

    def add_user(
        self, id: str, name: str | None = None, *, real_name: str = "", is_bot: bool = False
    ) -> User:
        return self._add_user(
            User(id, name or id.lower(), real_name=real_name or (name or id), is_bot=is_bot)
        )

    def channel(self, channel: str) -> Channel:
        """A channel by id, name or #name."""
        if channel in self.channels:
            return self.channels[channel]
        name = channel.lstrip("#")
        for ch in self.channels.values():
            if ch.name == name:
                return ch
        raise KeyError(f"no channel {channel!r} in the fake workspace (known: {sorted(self.channels)})")

    async def invite_bot(self, channel: str, *, by: str = ALICE) -> Message:
        """`/invite @bot`: the bot joins; Slack posts a channel_join message (and member_joined_channel)."""
        ch = self.channel(channel)
        ch.members.update({self.bot_user_id, by})
        msg = Message(
            channel=ch.id,
            ts=self._next_ts(),
            text=f"<@{self.bot_user_id}> has joined the channel",
            user=self.bot_user_id,
            subtype="channel_join",
        )
        ch.messages.append(msg)
        joined = {
            "type": "member_joined_channel",
            "user": self.bot_user_id,
            "channel": ch.id,
            "channel_type": "C" if ch.channel_type == "channel" else "G",
            "team": self.team_id,
            "inviter": by,
            "event_ts": msg.ts,
        }
        for event in (joined, self._message_event(msg, ch)):
            env = await self._deliver_event(event, ch)
            if env is not None:
                msg.envelopes.append(env)
        self._notify()
        return msg

    def remove_bot(self, channel: str) -> None:
        self.channel(channel).members.discard(self.bot_user_id)

    def add_message(
        self,
        channel: str,
        text: str = "",
        *,
        user: str = ALICE,
        bot: bool = False,
        thread_ts: str | None = None,
        blocks: list[dict] | None = None,
        metadata: dict | None = None,
    ) -> Message:
        """Put a message into history without delivering any event (e.g. posts from before a crash)."""
        ch = self.channel(channel)
        msg = Message(
            channel=ch.id,
            ts=self._next_ts(),
            text=text,
            user=self.bot_user_id if bot else user,
            bot_id=self.bot_id if bot else None,
            blocks=_with_block_ids(blocks) if blocks else (None if bot else _rich_text(text)),
            metadata=metadata,
        )
        self._insert(ch, msg, thread_ts)
        self._notify()
        return msg

    # ------------------------------------------------------------------ failure injection

    def rate_limit(
        self,
        method: str | None = "chat.postMessage",
        *,
        times: int = 1,
        retry_after: float = 1,
        channel: str | None = None,
    ) -> Injection:
        """The next `times` calls of `method` get HTTP 429 {"error": "ratelimited"} + Retry-After.

        The header is an integer string, as Slack sends it (slack_sdk sleeps int(value) + random()).
        """
        header = str(max(1, math.ceil(retry_after)))
        return self.fail(
            method, "ratelimited", times=times, status=429, headers={"Retry-After": header}, channel=channel
        )

    def fail(
        self,
        method: str | None,
        error: str,
        *,
        times: int = 1,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        channel: str | None = None,
        **extra: Any,
    ) -> Injection:
        """The next `times` calls of `method` (None: any) answer {"ok": false, "error": error}."""
        injection = Injection(method, error, times, status, dict(headers or {}), extra, channel)
        self._injections.append(injection)
        return injection

    def limit_channel_rate(
        self, interval: float | None = 1.0, *, burst: int = 1, methods: Iterable[str] = ("chat.postMessage",)
    ) -> None:
        """Enforce about one post per `interval` seconds per channel (short bursts of `burst`);
        over the limit -> 429 ratelimited with Retry-After. `interval=None` switches it off."""
        self._channel_rate = None if interval is None else (float(interval), burst, tuple(methods))
        self._buckets.clear()

    # ------------------------------------------------------------------ scripting: users act

    async def user_posts(
        self,
        channel: str,
        text: str,
        user: str = ALICE,
        *,
        thread_ts: str | None = None,
        broadcast: bool = False,
    ) -> Message:
        """A user posts a message (a thread reply if thread_ts). If it @mentions the bot, an
        app_mention is delivered too. Nothing is delivered if the bot is not in the channel."""
        return await self._user_message(channel, text, user=user, thread_ts=thread_ts, broadcast=broadcast)

    async def user_replies(
        self, channel: str, thread_ts: str, text: str, user: str = ALICE, *, broadcast: bool = False
    ) -> Message:
        return await self._user_message(channel, text, user=user, thread_ts=thread_ts, broadcast=broadcast)

    async def user_mentions_bot(
        self,
        channel: str,
        text: str,
        user: str = ALICE,
        *,
        thread_ts: str | None = None,
        mention_first: bool = True,
    ) -> Message:
        """One message that @mentions the bot: Slack delivers BOTH app_mention and message, with
        different event_ids (order not guaranteed; `mention_first` picks it)."""
        token = f"<@{self.bot_user_id}>"
        if token not in text:
            text = f"{token} {text}"
        return await self._user_message(
            channel, text, user=user, thread_ts=thread_ts, mention_first=mention_first
        )

    async def bot_posts(
        self,
        channel: str,
        text: str,
        *,
        bot_id: str = "B0OTHER",
        user: str = "U0OTHERBOT",
        thread_ts: str | None = None,
    ) -> Message:
        """Another app (e.g. a runner with its own token) posts: arrives with its bot_id, which
        Bolt's IgnoringSelfEvents does not drop."""
        self._ensure_user(user, is_bot=True)
        return await self._user_message(channel, text, user=user, thread_ts=thread_ts, bot_id=bot_id)

    async def user_reacts(self, channel: str, ts: str, name: str, user: str = ALICE) -> Envelope | None:
        """reaction_added (names like "+1::skin-tone-3" pass through as Slack sends them)."""
        ch, msg = self._existing(channel, ts)
        name = name.strip(":")
        users = msg.reactions.setdefault(name, [])
        if user in users:
            return None
        users.append(user)
        self._ensure_user(user)
        env = await self._deliver_event(self._reaction_event("reaction_added", ch, msg, name, user), ch)
        self._notify()
        return env

    async def user_unreacts(self, channel: str, ts: str, name: str, user: str = ALICE) -> Envelope | None:
        ch, msg = self._existing(channel, ts)
        name = name.strip(":")
        if user not in msg.reactions.get(name, []):
            return None
        msg.reactions[name].remove(user)
        if not msg.reactions[name]:
            del msg.reactions[name]
        env = await self._deliver_event(self._reaction_event("reaction_removed", ch, msg, name, user), ch)
        self._notify()
        return env

    async def slash_command(
        self,
        command: str,
        text: str = "",
        channel: str | None = None,
        user: str = ALICE,
        *,
        wait_ack: bool = True,
    ) -> Interaction:
        """A user runs `/command text` in a channel (slash commands can't run inside threads).
        Delivered even if the bot is not in the channel, as Slack does. Waits for the ack (up
        to ack_timeout); the returned Interaction collects response_url posts and ephemerals."""
        ch = self.channel(channel or self.general)
        u = self._ensure_user(user)
        started = time.monotonic()
        rid = uuid.uuid4().hex
        payload = {
            "token": self.verification_token,
            "team_id": self.team_id,
            "team_domain": self.team_domain,
            "channel_id": ch.id,
            "channel_name": ch.name,
            "user_id": u.id,
            "user_name": u.name,
            "command": command,
            "text": text,
            "api_app_id": self.api_app_id,
            "is_enterprise_install": "false",
            "response_url": f"{self.url}/response/{rid}",
            "trigger_id": self._trigger_id(),
        }
        env = self._envelope("slash_commands", payload, accepts_response_payload=True)
        interaction = Interaction(
            "slash_command", env, u.id, ch.id, payload["response_url"], started, fake=self, message_ts=None
        )
        self._response_urls[rid] = _ResponseUrl(rid, interaction)
        await self._enqueue(env)
        if wait_ack:
            await self._wait_ack_quietly(env)
        return interaction

    async def click_button(
        self,
        channel: str,
        ts: str,
        action_id: str,
        value: str | None = None,
        user: str = ALICE,
        *,
        wait_ack: bool = True,
    ) -> Interaction:
        """A user clicks the button `action_id` on message `ts`: a block_actions payload with the
        message, container, response_url and trigger_id. `value` defaults to the button's."""
        ch, msg = self._existing(channel, ts)
        found = [
            (block, el)
            for block, el in _interactive_elements(msg.blocks or [])
            if el.get("action_id") == action_id
        ]
        if not found:
            raise ValueError(
                f"message {ts} has no element with action_id {action_id!r} (has {msg.action_ids()})"
            )
        block, element = found[0]
        u = self._ensure_user(user)
        started = time.monotonic()
        rid = uuid.uuid4().hex
        action: dict[str, Any] = {
            "action_id": action_id,
            "block_id": block.get("block_id"),
            "type": element.get("type", "button"),
            "action_ts": f"{time.time():.6f}",
        }
        if "text" in element:
            action["text"] = element["text"]
        if value is not None or "value" in element:
            action["value"] = value if value is not None else element["value"]
        if "style" in element:
            action["style"] = element["style"]
        container: dict[str, Any] = {
            "type": "message",
            "message_ts": msg.ts,
            "channel_id": ch.id,
            "is_ephemeral": False,
        }
        if msg.thread_ts:
            container["thread_ts"] = msg.thread_ts
        payload = {
            "type": "block_actions",
            "user": {"id": u.id, "username": u.name, "name": u.name, "team_id": self.team_id},
            "api_app_id": self.api_app_id,
            "token": self.verification_token,
            "container": container,
            "trigger_id": self._trigger_id(),
            "team": {"id": self.team_id, "domain": self.team_domain},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": ch.id, "name": ch.name},
            "message": self._api_message(msg, include_metadata=False),
            "state": {"values": {}},
            "response_url": f"{self.url}/response/{rid}",
            "actions": [action],
        }
        env = self._envelope("interactive", payload)
        interaction = Interaction(
            "block_actions", env, u.id, ch.id, payload["response_url"], started, fake=self, message_ts=msg.ts
        )
        self._response_urls[rid] = _ResponseUrl(rid, interaction)
        await self._enqueue(env)
        if wait_ack:
            await self._wait_ack_quietly(env)
        return interaction

    async def redeliver(self, envelope: Envelope, *, reason: str = "timeout") -> Envelope:
        """Deliver the same payload again (same event_id) in a new envelope, retry_attempt + 1."""
        again = Envelope(
            envelope_id=str(uuid.uuid4()),
            type=envelope.type,
            payload=copy.deepcopy(envelope.payload),
            accepts_response_payload=envelope.accepts_response_payload,
            retry_attempt=envelope.retry_attempt + 1,
            retry_reason=reason,
            original=envelope.original or envelope,
        )
        envelope.redelivered_as = again
        await self._enqueue(again)
        return again

    async def disconnect(self, reason: str = "refresh_requested", *, drop: bool = False) -> int:
        """Ask every live Socket Mode connection to go away. By default Slack's way: a
        {"type": "disconnect"} frame, then the socket is closed after `disconnect_grace`; the
        client reconnects through apps.connections.open. drop=True cuts the TCP connection with
        no frame at all (a network failure; the client notices via its ping monitor). Events sent
        meanwhile wait for the next connection. Returns how many connections were affected."""
        live = [c for c in self.connections if c.live]
        for conn in live:
            if drop:
                conn.draining = True
                if conn.request.transport is not None:
                    conn.request.transport.close()
                continue
            conn.draining = True
            frame = {
                "type": "disconnect",
                "reason": reason,
                "debug_info": {"host": f"fake-applink-{conn.id}"},
            }
            try:
                await conn.send(frame)
            except (ConnectionError, RuntimeError):
                continue
            self._spawn(self._close_later(conn, self.disconnect_grace))
        self._notify()
        return len(live)

    # ------------------------------------------------------------------ scripting: looking

    def messages(self, channel: str, thread_ts: str | None = None) -> list[Message]:
        """Top-level messages (and thread broadcasts), oldest first; with thread_ts, the replies
        in that thread (without the root)."""
        ch = self.channel(channel)
        if thread_ts is None:
            return [m for m in ch.messages if not m.is_reply or m.subtype == "thread_broadcast"]
        root = self._root_ts(ch, thread_ts)
        return [m for m in ch.messages if m.thread_ts == root and m.ts != root]

    def thread(self, channel: str, ts: str) -> list[Message]:
        """The root message and its replies, oldest first."""
        ch = self.channel(channel)
        root_ts = self._root_ts(ch, ts)
        root = ch.find(root_ts)
        return ([root] if root else []) + self.messages(ch.id, root_ts)

    def message(self, channel: str, ts: str) -> Message | None:
        return self.channel(channel).find(ts)

    def ephemerals(self, user: str | None = None, channel: str | None = None) -> list[Ephemeral]:
        cid = None if channel is None else self.channel(channel).id
        return [
            e
            for e in self._ephemerals
            if (user is None or e.user == user) and (cid is None or e.channel == cid)
        ]

    def calls(self, method: str | None = None) -> list[Call]:
        return [c for c in self.api_calls if method is None or c.method == method]

    def events(self, type: str | None = None) -> list[dict]:
        """Event payloads delivered (first deliveries only), oldest first."""
        return [
            e.event
            for e in self.envelopes
            if e.event is not None and e.retry_attempt == 0 and (type is None or e.event_type == type)
        ]

    @property
    def live_connections(self) -> list[Connection]:
        return [c for c in self.connections if c.live]

    def transcript(self, channel: str) -> str:
        """A readable dump of a channel: threads indented, bots marked, reactions and files noted."""
        ch = self.channel(channel)
        lines = [f"#{ch.name} ({ch.id})"]
        for msg in self.messages(ch.id):
            lines.append(self._line(msg, "  "))
            if msg.thread_ts == msg.ts:
                lines.extend(self._line(reply, "      ") for reply in self.messages(ch.id, msg.ts))
        return "\n".join(lines)

    async def wait_for(
        self, predicate: Callable[[], Any], timeout: float = 5.0, *, what: str | None = None
    ) -> Any:
        """Await until predicate() (sync or async) is truthy; return its value. Rechecks on every
        change to the fake's state and every 50 ms."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"timed out after {timeout}s waiting for {what or predicate}\n{self.describe()}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 0.05))

    async def wait_for_message(
        self,
        channel: str,
        *,
        thread_ts: str | None = None,
        text: str | None = None,
        bot: bool | None = True,
        where: Callable[[Message], bool] | None = None,
        after: str | None = None,
        timeout: float = 5.0,
    ) -> Message:
        """The first message (by default: from our bot) in the channel or thread that contains
        `text` (in text or blocks), matches `where`, and is newer than ts `after`."""

        def match() -> Message | None:
            for msg in self.messages(channel, thread_ts):
                if bot is not None and (msg.bot_id == self.bot_id) != bot:
                    continue
                if after is not None and _ts_key(msg.ts) <= _ts_key(after):
                    continue
                if text is not None and text not in msg.text and text not in json.dumps(msg.blocks or []):
                    continue
                if where is not None and not where(msg):
                    continue
                return msg
            return None

        where_desc = f"{channel}" + (f" thread {thread_ts}" if thread_ts else "")
        return await self.wait_for(match, timeout, what=f"a message in {where_desc} matching text={text!r}")

    async def wait_for_call(
        self, method: str, count: int = 1, *, ok: bool | None = None, timeout: float = 5.0
    ) -> Call:
        def calls() -> list[Call]:
            return [c for c in self.calls(method) if ok is None or c.ok == ok]

        await self.wait_for(lambda: len(calls()) >= count, timeout, what=f"{count} {method} call(s)")
        return calls()[count - 1]

    async def wait_connected(self, count: int = 1, timeout: float = 5.0) -> Connection:
        """Until `count` connections have been opened in total and one is live (hello sent)."""
        await self.wait_for(
            lambda: len(self.connections) >= count and self._live_connection() is not None,
            timeout,
            what=f"socket mode connection #{count}",
        )
        conn = self._live_connection()
        assert conn is not None
        return conn

    def describe(self) -> str:
        calls = ", ".join(f"{c.method}{'' if c.ok else '!' + str(c.error)}" for c in self.api_calls[-15:])
        envs = ", ".join(
            f"{e.event_type or e.type}#{e.retry_attempt}{'+' if e.acked else '-'}"
            for e in self.envelopes[-15:]
        )
        channels = "\n".join(self.transcript(cid) for cid, ch in self.channels.items() if ch.messages)
        return (
            f"recent calls: {calls or '-'}\nrecent envelopes (+acked): {envs or '-'}\n"
            f"live connections: {len(self.live_connections)}\n{channels}"
        )

    # ------------------------------------------------------------------ internals: model

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _next_ts(self) -> str:
        self._clock_us += 100
        return f"{self._clock_us // 1_000_000}.{self._clock_us % 1_000_000:06d}"

    def _trigger_id(self) -> str:
        return f"{next(self._ids)}.{self.team_id[1:]}.{uuid.uuid4().hex}"

    def _add_user(self, user: User) -> User:
        self.users[user.id] = user
        return user

    def _ensure_user(self, user_id: str, *, is_bot: bool = False) -> User:
        if user_id not in self.users:
            self._add_user(User(user_id, user_id.lower(), real_name=user_id, is_bot=is_bot))
        return self.users[user_id]

    def _existing(self, channel: str, ts: str) -> tuple[Channel, Message]:
        ch = self.channel(channel)
        msg = ch.find(ts)
        if msg is None:
            raise KeyError(f"no message {ts} in {ch.id}")
        return ch, msg

    def _root_ts(self, ch: Channel, ts: str) -> str:
        msg = ch.find(ts)
        return msg.thread_ts if msg is not None and msg.thread_ts else ts

    def _insert(self, ch: Channel, msg: Message, thread_ts: str | None) -> None:
        if thread_ts:
            parent = ch.find(thread_ts)
            if parent is None:
                msg.thread_ts = thread_ts
                self.warnings.append(
                    f"{ch.id}: message {msg.ts} posted into thread {thread_ts}, which does not exist"
                )
            else:
                root_ts = parent.thread_ts or parent.ts
                root = ch.find(root_ts)
                if root is not None:
                    root.thread_ts = root.ts
                msg.thread_ts = root_ts
        ch.messages.append(msg)

    async def _user_message(
        self,
        channel: str,
        text: str,
        *,
        user: str,
        thread_ts: str | None = None,
        broadcast: bool = False,
        mention_first: bool = True,
        bot_id: str | None = None,
    ) -> Message:
        ch = self.channel(channel)
        self._ensure_user(user)
        ch.members.add(user)
        if thread_ts is not None and ch.find(thread_ts) is None:
            raise KeyError(f"no message {thread_ts} in {ch.id} to reply to")
        msg = Message(
            channel=ch.id,
            ts=self._next_ts(),
            text=text,
            user=user,
            bot_id=bot_id,
            blocks=_rich_text(text),
            client_msg_id=None if bot_id else str(uuid.uuid4()),
            subtype="thread_broadcast" if broadcast and thread_ts else None,
        )
        self._insert(ch, msg, thread_ts)
        events = [self._message_event(msg, ch)]
        if bot_id is None and re.search(rf"<@{re.escape(self.bot_user_id)}(\|[^>]*)?>", text):
            mention = self._message_event(msg, ch)
            mention["type"] = "app_mention"
            mention.pop("channel_type", None)
            mention.pop("subtype", None)
            events.insert(0 if mention_first else 1, mention)
        for event in events:
            env = await self._deliver_event(event, ch)
            if env is not None:
                msg.envelopes.append(env)
        self._notify()
        return msg

    def _line(self, msg: Message, indent: str) -> str:
        who = f"{self.users[msg.user].name}" if msg.user in self.users else (msg.user or "?")
        if msg.bot_id:
            who += f" [bot {msg.bot_id}]"
        body = msg.text or (f"<{len(msg.blocks or [])} blocks>" if msg.blocks else "")
        extras = []
        if msg.files:
            extras.append("files: " + ", ".join(f["name"] for f in msg.files))
        if msg.reactions:
            extras.append("reactions: " + ", ".join(f":{n}: x{len(u)}" for n, u in msg.reactions.items()))
        if msg.metadata:
            extras.append(f"metadata: {msg.metadata.get('event_type')}")
        if msg.edited:
            extras.append("edited")
        suffix = f"  ({'; '.join(extras)})" if extras else ""
        return f"{indent}[{msg.ts}] {who}: {body}{suffix}"

    # ------------------------------------------------------------------ internals: payload shapes

    def _bot_profile(self) -> dict:
        return {
            "id": self.bot_id,
            "app_id": self.api_app_id,
            "name": self.bot_name,
            "deleted": False,
            "team_id": self.team_id,
            "updated": 1_700_000_000,
            "icons": {"image_36": "https://fake.slack.test/bot_36.png"},
        }

    def _api_message(self, msg: Message, *, include_metadata: bool) -> dict:
        out: dict[str, Any] = {"type": "message", "ts": msg.ts, "text": msg.text}
        if msg.subtype:
            out["subtype"] = msg.subtype
        if msg.user:
            out["user"] = msg.user
        if msg.bot_id:
            out["bot_id"] = msg.bot_id
            if msg.bot_id == self.bot_id:
                out["app_id"] = self.api_app_id
                out["bot_profile"] = self._bot_profile()
        if msg.client_msg_id:
            out["client_msg_id"] = msg.client_msg_id
        out["team"] = self.team_id
        if msg.blocks:
            out["blocks"] = copy.deepcopy(msg.blocks)
        if msg.thread_ts:
            out["thread_ts"] = msg.thread_ts
            if msg.is_reply:
                ch = self.channels.get(msg.channel)
                root = ch.find(msg.thread_ts) if ch else None
                if root is not None and root.user:
                    out["parent_user_id"] = root.user
            else:
                replies = self.messages(msg.channel, msg.ts)
                reply_users = list(dict.fromkeys(r.user for r in replies if r.user))
                out["reply_count"] = len(replies)
                out["reply_users_count"] = len(reply_users)
                out["reply_users"] = reply_users
                out["latest_reply"] = replies[-1].ts if replies else msg.ts
        if msg.files:
            out["files"] = copy.deepcopy(msg.files)
            out["upload"] = True
        if msg.edited:
            out["edited"] = dict(msg.edited)
        if msg.reactions:
            out["reactions"] = [
                {"name": n, "users": list(u), "count": len(u)} for n, u in msg.reactions.items()
            ]
        if include_metadata and msg.metadata:
            out["metadata"] = copy.deepcopy(msg.metadata)
        return out

    def _message_event(self, msg: Message, ch: Channel) -> dict:
        event = self._api_message(msg, include_metadata=False)
        for key in ("reply_count", "reply_users_count", "reply_users", "latest_reply", "reactions"):
            event.pop(key, None)
        event["channel"] = ch.id
        event["event_ts"] = msg.ts
        event["channel_type"] = ch.channel_type
        return event

    def _reaction_event(self, type: str, ch: Channel, msg: Message, name: str, user: str) -> dict:
        event: dict[str, Any] = {
            "type": type,
            "user": user,
            "reaction": name,
            "item": {"type": "message", "channel": ch.id, "ts": msg.ts},
            "event_ts": self._next_ts(),
        }
        if msg.user:
            event["item_user"] = msg.user
        return event

    def _file_object(self, f: File, *, with_shares: bool) -> dict:
        out: dict[str, Any] = {
            "id": f.id,
            "created": f.created,
            "timestamp": f.created,
            "name": f.name,
            "title": f.title or f.name,
            "mimetype": f.mimetype,
            "filetype": f.filetype,
            "pretty_type": f.filetype.upper(),
            "user": f.user,
            "size": len(f.content or b""),
            "mode": "hosted",
            "is_external": False,
            "is_public": any(not self.channels[c].is_private for c in f.shares if c in self.channels),
            "url_private": f"{self.url}/files-pri/{self.team_id}-{f.id}/{f.name}",
            "url_private_download": f"{self.url}/files-pri/{self.team_id}-{f.id}/download/{f.name}",
            "permalink": f"https://{self.team_domain}.slack.com/files/{f.user}/{f.id}/{f.name}",
        }
        if f.alt_txt:
            out["alt_txt"] = f.alt_txt
        if with_shares:
            public = {
                c: s for c, s in f.shares.items() if c in self.channels and not self.channels[c].is_private
            }
            private = {
                c: s for c, s in f.shares.items() if c in self.channels and self.channels[c].is_private
            }
            out["shares"] = {k: v for k, v in (("public", public), ("private", private)) if v}
            out["channels"] = list(public)
            out["groups"] = list(private)
        return out

    # ------------------------------------------------------------------ internals: socket mode

    def _envelope(self, type: str, payload: dict, *, accepts_response_payload: bool = False) -> Envelope:
        return Envelope(
            envelope_id=str(uuid.uuid4()),
            type=type,
            payload=payload,
            accepts_response_payload=accepts_response_payload,
        )

    def _subscribed(self, event: dict, ch: Channel) -> bool:
        kind = event["type"]
        if kind == "message":
            plural = {"channel": "channels", "group": "groups", "im": "im", "mpim": "mpim"}[ch.channel_type]
            kind = f"message.{plural}"
        return kind in self.bot_events

    async def _deliver_event(self, event: dict, ch: Channel) -> Envelope | None:
        if self.bot_user_id not in ch.members or not self._subscribed(event, ch):
            return None
        payload = {
            "token": self.verification_token,
            "team_id": self.team_id,
            "context_team_id": self.team_id,
            "context_enterprise_id": None,
            "api_app_id": self.api_app_id,
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{next(self._ids):09d}FAKE",
            "event_time": int(float(event.get("event_ts") or self._next_ts())),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.team_id,
                    "user_id": self.bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-{base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip('=')}",
        }
        env = self._envelope("events_api", payload)
        await self._enqueue(env)
        return env

    async def _echo(self, event: dict, ch: Channel) -> None:
        if self.echo_bot_events:
            await self._deliver_event(event, ch)

    async def _enqueue(self, env: Envelope) -> None:
        self.envelopes.append(env)
        self._by_envelope_id[env.envelope_id] = env
        await self._send_or_queue(env)
        self._notify()

    def _live_connection(self) -> Connection | None:
        for conn in reversed(self.connections):
            if conn.live and not conn.draining:
                return conn
        return None

    def deliver_over_http(self, request_url: str, signing_secret: str) -> None:
        """Deliver envelopes as Slack does to an app with Request URLs: an HTTP POST per request,
        signed with the app's signing secret (X-Slack-Signature / X-Slack-Request-Timestamp); a 200
        within `ack_timeout` is the ack, its JSON body the ack payload. Events API bodies are JSON,
        slash commands a form, interactions a form with one `payload` field."""
        self.request_url = request_url
        self.signing_secret = signing_secret

    def sign(self, body: bytes, timestamp: int | None = None, secret: str | None = None) -> dict[str, str]:
        """The headers Slack signs a request with (the signature is v0=HMAC-SHA256 of v0:ts:body)."""
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        key = (secret or self.signing_secret or "").encode()
        digest = hmac.new(key, b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}

    async def _post_envelope(self, env: Envelope) -> None:
        if env.type == "events_api":
            body, content_type = json.dumps(env.payload).encode(), "application/json"
        elif env.type == "slash_commands":
            body, content_type = urlencode(env.payload).encode(), "application/x-www-form-urlencoded"
        else:
            body = urlencode({"payload": json.dumps(env.payload)}).encode()
            content_type = "application/x-www-form-urlencoded"
        headers = {"Content-Type": content_type, **self.sign(body)}
        if env.retry_attempt:
            headers |= {"X-Slack-Retry-Num": str(env.retry_attempt), "X-Slack-Retry-Reason": env.retry_reason}
        env.sent_at = time.monotonic()
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(self.request_url, data=body, headers=headers) as response,
            ):
                env.http_status = response.status
                text = await response.text()
        except aiohttp.ClientError as exc:
            self.warnings.append(f"request URL unreachable: {exc}")
            return
        if env.http_status == 200 and not env.acked:
            await self._ack(env, json.loads(text) if text.strip().startswith("{") else None)
        self._notify()

    async def _send_or_queue(self, env: Envelope) -> None:
        if self.request_url is not None:
            self._spawn(self._post_envelope(env))
            if self.ack_timeout is not None:
                self._spawn(self._watch_ack(env, self.ack_timeout))
            return
        conn = self._live_connection()
        if conn is None:
            self._outbox.append(env)
            return
        try:
            await conn.send(env.frame())
        except (ConnectionError, RuntimeError):
            self._outbox.append(env)
            return
        env.sent_at = time.monotonic()
        env.connection = conn.id
        if self.ack_timeout is not None:
            self._spawn(self._watch_ack(env, self.ack_timeout))

    async def _flush_outbox(self) -> None:
        while self._outbox and self._live_connection() is not None:
            await self._send_or_queue(self._outbox.popleft())

    async def _watch_ack(self, env: Envelope, timeout: float) -> None:
        try:
            await asyncio.wait_for(env._acked.wait(), timeout)
            return
        except TimeoutError:
            pass
        env.timed_out = True
        self._notify()
        if env.type == "events_api":
            if env.retry_attempt < self.max_retries:
                delays = self.retry_delays or (0.0,)
                delay = delays[min(env.retry_attempt, len(delays) - 1)]
                if delay:
                    await asyncio.sleep(delay)
                await self.redeliver(env, reason="timeout")
        elif env.type == "slash_commands":
            p = env.payload
            self._add_ephemeral(
                p["channel_id"],
                p["user_id"],
                f'{p["command"]} failed with the error "operation_timeout"',
                None,
                None,
                "slack",
            )

    async def _wait_ack_quietly(self, env: Envelope) -> None:
        timeout = self.ack_timeout if self.ack_timeout is not None else 3.0
        with contextlib.suppress(TimeoutError):
            await env.wait_acked(timeout + 0.05)

    async def _close_later(self, conn: Connection, delay: float) -> None:
        await asyncio.sleep(delay)
        if conn.live:
            with contextlib.suppress(TimeoutError, ConnectionError, RuntimeError):
                await asyncio.wait_for(conn.ws.close(code=1001, message=b"disconnected"), 2)

    async def _handle_ws(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket")
        if ticket not in self._tickets:
            return web.json_response({"ok": False, "error": "invalid_ticket"}, status=401)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        conn = Connection(id=len(self.connections) + 1, ws=ws, request=request, opened_at=time.monotonic())
        self.connections.append(conn)
        await conn.send(
            {
                "type": "hello",
                "num_connections": len(self.live_connections),
                "debug_info": {
                    "host": f"fake-applink-{conn.id}",
                    "build_number": 1,
                    "approximate_connection_time": 18060,
                },
                "connection_info": {"app_id": self.api_app_id},
            }
        )
        self._notify()
        await self._flush_outbox()
        try:
            async for frame in ws:
                if frame.type == WSMsgType.TEXT:
                    await self._on_client_frame(conn, frame.data)
        finally:
            conn.closed_at = time.monotonic()
            self._notify()
        return ws

    async def _on_client_frame(self, conn: Connection, data: str) -> None:
        try:
            frame = json.loads(data)
        except ValueError:
            self.warnings.append(f"connection {conn.id}: non-JSON frame {data[:100]!r}")
            return
        envelope_id = frame.get("envelope_id")
        if not envelope_id:
            self.warnings.append(f"connection {conn.id}: frame without envelope_id {frame!r}")
            return
        payload = frame.get("payload")
        self.acks.append(Ack(envelope_id, payload, time.monotonic(), conn.id))
        env = self._by_envelope_id.get(envelope_id)
        if env is None:
            self.warnings.append(f"ack for unknown envelope {envelope_id}")
        elif not env.acked:
            await self._ack(env, payload)
        self._notify()

    async def _ack(self, env: Envelope, payload: dict | None) -> None:
        """The app acked an envelope (Socket Mode frame or HTTP 200); a slash command's ack text
        shows to its user."""
        env.acked_at = time.monotonic()
        env.ack_payload = payload
        env._acked.set()
        if env.type == "slash_commands" and payload and not env.timed_out:
            await self._show_response(env.payload["channel_id"], env.payload["user_id"], payload, "ack")

    async def _show_response(self, channel: str, user: str, body: dict, source: str) -> None:
        """A slash-command style response: ephemeral by default, in_channel posts as the app."""
        text = body.get("text") or ""
        blocks = body.get("blocks")
        if not text and not blocks:
            return
        ch = self.channels[channel]
        if body.get("response_type") == "in_channel":
            msg = Message(
                channel=ch.id,
                ts=self._next_ts(),
                text=text,
                user=self.bot_user_id,
                bot_id=self.bot_id,
                blocks=_with_block_ids(blocks) if blocks else None,
            )
            self._insert(ch, msg, body.get("thread_ts"))
            await self._echo(self._message_event(msg, ch), ch)
        else:
            self._add_ephemeral(ch.id, user, text, blocks, body.get("thread_ts"), source)

    def _add_ephemeral(
        self, channel: str, user: str, text: str, blocks: list | None, thread_ts: str | None, source: str
    ) -> Ephemeral:
        eph = Ephemeral(channel, user, text, blocks, thread_ts, source, self._next_ts(), time.monotonic())
        self._ephemerals.append(eph)
        self._notify()
        return eph

    # ------------------------------------------------------------------ internals: HTTP

    async def _read_params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if not request.body_exists:
            return params
        if request.content_type == "application/json":
            try:
                body = await request.json()
            except ValueError:
                raise SlackError("invalid_json") from None
            if isinstance(body, dict):
                params.update({k: v for k, v in body.items() if v is not None})
        elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
            form = await request.post()
            for key, value in form.items():
                params[key] = value if isinstance(value, str) else value.file.read()
        return params

    @staticmethod
    def _token_of(request: web.Request, params: dict[str, Any]) -> str | None:
        token = params.pop("token", None)
        auth = request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        return token or None

    def _authorize(self, method: str, token: str | None) -> None:
        if method == "api.test":
            return
        if token is None:
            raise SlackError("not_authed")
        if token not in (self.bot_token, self.app_token):
            raise SlackError("invalid_auth")
        wants_app_token = method == "apps.connections.open"
        if (token == self.app_token) != wants_app_token:
            raise SlackError("not_allowed_token_type")

    def _check_injections(self, method: str, params: dict[str, Any]) -> None:
        for inj in self._injections:
            if inj.exhausted or (inj.method is not None and inj.method != method):
                continue
            if inj.channel is not None and params.get("channel", params.get("channel_id")) != inj.channel:
                continue
            inj.hits += 1
            raise SlackError(inj.error, status=inj.status, headers=inj.headers, **inj.extra)

    def _check_channel_rate(self, method: str, params: dict[str, Any]) -> None:
        if self._channel_rate is None:
            return
        interval, burst, methods = self._channel_rate
        if method not in methods:
            return
        try:
            cid = self._api_channel(params.get("channel") or params.get("channel_id")).id
        except SlackError:
            return
        now = time.monotonic()
        tokens, at = self._buckets.get(cid, (float(burst), now))
        tokens = min(float(burst), tokens + (now - at) / interval)
        if tokens < 1:
            wait = (1 - tokens) * interval
            self._buckets[cid] = (tokens, now)
            raise SlackError("ratelimited", status=429, headers={"Retry-After": str(max(1, math.ceil(wait)))})
        self._buckets[cid] = (tokens - 1, now)

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        token = None
        params: dict[str, Any] = {}
        call = Call(method, params, None, time.monotonic())
        self.api_calls.append(call)
        try:
            params = await self._read_params(request)
            token = self._token_of(request, params)
            call.params, call.token = _readable(params), token
            if self.latency:
                await asyncio.sleep(self.latency)
            self._authorize(method, token)
            handler = self._methods.get(method)
            if handler is None:
                raise SlackError("unknown_method")
            self._check_injections(method, params)
            self._check_channel_rate(method, params)
            body: dict[str, Any] = {"ok": True, **(await handler(params))}
            status, headers = 200, {}
        except SlackError as e:
            body = {"ok": False, "error": e.error, **e.extra}
            status, headers = e.status, e.headers
        if token == self.bot_token:
            headers["x-oauth-scopes"] = self.scopes
        call.status, call.response, call.headers = status, body, dict(headers)
        self._notify()
        return web.json_response(body, status=status, headers=headers)

    async def _handle_upload(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        data = await request.read()
        call = Call("upload", {"file_id": file_id, "bytes": len(data)}, None, time.monotonic())
        self.api_calls.append(call)
        f = self.files.get(file_id)
        if f is None or f.completed:
            call.status, call.response = 404, {"ok": False, "error": "file_not_found"}
            self._notify()
            return web.Response(status=404, text="file not found")
        if len(data) != f.length:
            self.warnings.append(f"upload {file_id}: declared length {f.length}, received {len(data)} bytes")
        f.content = data
        call.response = {"ok": True}
        self._notify()
        return web.Response(text=f"OK - {len(data)}")

    async def _handle_response_url(self, request: web.Request) -> web.Response:
        rid = request.match_info["rid"]
        try:
            body = await request.json()
        except ValueError:
            body = {}
        call = Call("response_url", body, None, time.monotonic())
        self.api_calls.append(call)
        ru = self._response_urls.get(rid)
        if ru is None or ru.uses >= 5 or time.monotonic() - ru.created > 30 * 60:
            error = "used_url" if ru else "no_such_url"
            call.status, call.response = 404, {"ok": False, "error": error}
            self._notify()
            return web.Response(status=404, text=error)
        ru.uses += 1
        interaction = ru.interaction
        interaction.responses.append(body)
        try:
            await self._apply_response_url(interaction, body)
        except SlackError as e:
            call.status = 400
            call.response = {"ok": False, "error": e.error, **e.extra}
            self._notify()
            return web.Response(status=400, text=e.error)
        call.response = {"ok": True}
        self._notify()
        return web.Response(text="ok")

    async def _apply_response_url(self, interaction: Interaction, body: dict) -> None:
        ch = self.channels[interaction.channel]
        text = body.get("text") or ""
        blocks = body.get("blocks")
        if blocks is not None:
            blocks = self._parse_blocks(blocks)
        if text and len(text) > MAX_TEXT:
            raise SlackError("msg_too_long")
        original = ch.find(interaction.message_ts) if interaction.message_ts else None
        if original is not None and _truthy(body.get("delete_original")):
            ch.messages.remove(original)
            await self._echo(self._deleted_event(ch, original), ch)
            return
        # Replaced only on an explicit replace_original: true. (Legacy attachment buttons replaced by
        # default; for Block Kit the fake is strict, so code that means "replace" must say so.)
        if original is not None and _truthy(body.get("replace_original")) and original.bot_id == self.bot_id:
            if not text and not blocks:
                raise SlackError("no_text")
            previous = self._api_message(original, include_metadata=False)
            original.text = text
            original.blocks = _with_block_ids(blocks) if blocks else None
            original.edited = {"user": self.bot_user_id, "ts": self._next_ts()}
            await self._echo(self._changed_event(ch, original, previous), ch)
            return
        await self._show_response(ch.id, interaction.user, body, "response_url")

    # ------------------------------------------------------------------ internals: validation

    def _api_channel(self, value: Any) -> Channel:
        if not value or not isinstance(value, str):
            raise SlackError("channel_not_found")
        try:
            return self.channel(value)
        except KeyError:
            raise SlackError("channel_not_found") from None

    def _writable_channel(self, value: Any) -> Channel:
        ch = self._api_channel(value)
        if ch.is_archived:
            raise SlackError("is_archived")
        if self.bot_user_id not in ch.members:
            raise SlackError("not_in_channel")
        return ch

    def _readable_channel(self, value: Any) -> Channel:
        ch = self._api_channel(value)
        if self.bot_user_id not in ch.members:
            raise SlackError("not_in_channel")
        return ch

    def _parse_blocks(self, raw: Any) -> list[dict]:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raise SlackError("invalid_blocks_format") from None
        if not isinstance(raw, list):
            raise SlackError("invalid_blocks_format")
        errors = _validate_blocks(raw, self._file_is_shared)
        if errors:
            raise SlackError(
                "invalid_blocks",
                errors=errors,
                response_metadata={"messages": [f"[ERROR] {e}" for e in errors]},
            )
        return raw

    def _file_is_shared(self, slack_file: dict) -> bool:
        fid = slack_file.get("id")
        url = slack_file.get("url")
        for f in self.files.values():
            obj = self._file_object(f, with_shares=False)
            if fid == f.id or url in (obj["url_private"], obj["permalink"]):
                return bool(f.shares)
        return False

    def _content(self, p: dict[str, Any], *, required: bool = True) -> tuple[str, list[dict] | None]:
        text = p.get("text")
        text = "" if text is None else str(text)
        markdown_text = p.get("markdown_text")
        blocks = self._parse_blocks(p["blocks"]) if p.get("blocks") not in (None, "") else None
        attachments = p.get("attachments")
        if markdown_text:
            if text or blocks:
                raise SlackError("markdown_text_conflict")
            if len(markdown_text) > 12_000:
                raise SlackError("msg_too_long")
            text = str(markdown_text)
        if required and not text and not blocks and not attachments:
            raise SlackError("no_text")
        if len(text) > MAX_TEXT:
            raise SlackError("msg_too_long")
        if blocks and not text:
            self.warnings.append("blocks sent without a text fallback (notifications will be empty)")
        return text, (_with_block_ids(blocks) if blocks else blocks)

    @staticmethod
    def _metadata(raw: Any) -> dict | None:
        if raw in (None, ""):
            return None
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raise SlackError("invalid_metadata_format") from None
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("event_type"), str)
            or not raw["event_type"]
            or not isinstance(raw.get("event_payload", {}), dict)
        ):
            raise SlackError("invalid_metadata_format")
        return {"event_type": raw["event_type"], "event_payload": raw.get("event_payload", {})}

    @staticmethod
    def _thread_ts(raw: Any) -> str | None:
        if raw is None:
            return None
        value = str(raw)
        if not _TS_RE.match(value) or float(value) <= 0:
            raise SlackError(
                "invalid_thread_ts",
                response_metadata={"messages": [f"[ERROR] {value} is not a valid thread_ts"]},
            )
        return value

    def _own_message(self, ch: Channel, ts: Any, error: str) -> Message:
        msg = ch.find(str(ts)) if ts else None
        if msg is None:
            raise SlackError("message_not_found")
        if msg.bot_id != self.bot_id:
            raise SlackError(error)
        return msg

    def _changed_event(self, ch: Channel, msg: Message, previous: dict) -> dict:
        ts = self._next_ts()
        return {
            "type": "message",
            "subtype": "message_changed",
            "hidden": True,
            "channel": ch.id,
            "ts": ts,
            "event_ts": ts,
            "channel_type": ch.channel_type,
            "message": self._api_message(msg, include_metadata=False),
            "previous_message": previous,
        }

    def _deleted_event(self, ch: Channel, msg: Message) -> dict:
        ts = self._next_ts()
        return {
            "type": "message",
            "subtype": "message_deleted",
            "hidden": True,
            "channel": ch.id,
            "ts": ts,
            "deleted_ts": msg.ts,
            "event_ts": ts,
            "channel_type": ch.channel_type,
            "previous_message": self._api_message(msg, include_metadata=False),
        }

    # ------------------------------------------------------------------ Web API methods

    async def _api_test(self, p: dict) -> dict:
        return {"args": {k: v for k, v in p.items() if isinstance(v, str)}}

    async def _auth_test(self, p: dict) -> dict:
        return {
            "url": f"https://{self.team_domain}.slack.com/",
            "team": "Fake Workspace",
            "user": self.bot_name,
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    async def _apps_connections_open(self, p: dict) -> dict:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        return {"url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}&app_id={self.api_app_id}"}

    async def _chat_post_message(self, p: dict) -> dict:
        ch = self._writable_channel(p.get("channel"))
        text, blocks = self._content(p)
        metadata = self._metadata(p.get("metadata"))
        thread_ts = self._thread_ts(p.get("thread_ts"))
        broadcast = thread_ts is not None and _truthy(p.get("reply_broadcast"))
        msg = Message(
            channel=ch.id,
            ts=self._next_ts(),
            text=text,
            user=self.bot_user_id,
            bot_id=self.bot_id,
            blocks=blocks,
            metadata=metadata,
            subtype="thread_broadcast" if broadcast else None,
        )
        self._insert(ch, msg, thread_ts)
        await self._echo(self._message_event(msg, ch), ch)
        return {"channel": ch.id, "ts": msg.ts, "message": self._api_message(msg, include_metadata=True)}

    async def _chat_update(self, p: dict) -> dict:
        ch = self._writable_channel(p.get("channel"))
        msg = self._own_message(ch, p.get("ts"), "cant_update_message")
        has_blocks = p.get("blocks") not in (None, "")
        if not any(
            p.get(k) not in (None, "") for k in ("text", "blocks", "markdown_text", "metadata", "attachments")
        ):
            raise SlackError("no_text")
        text, blocks = self._content(p, required="text" in p or has_blocks)
        metadata = self._metadata(p.get("metadata"))
        previous = self._api_message(msg, include_metadata=False)
        if "text" in p or p.get("markdown_text"):
            msg.text = text
        if "blocks" in p:
            msg.blocks = blocks or None  # blocks=[] clears them; omitted keeps them (as Slack does)
        if metadata is not None:
            msg.metadata = metadata
        msg.edited = {"user": self.bot_user_id, "ts": self._next_ts()}
        await self._echo(self._changed_event(ch, msg, previous), ch)
        return {
            "channel": ch.id,
            "ts": msg.ts,
            "text": msg.text,
            "message": self._api_message(msg, include_metadata=True),
        }

    async def _chat_delete(self, p: dict) -> dict:
        ch = self._writable_channel(p.get("channel"))
        msg = self._own_message(ch, p.get("ts"), "cant_delete_message")
        ch.messages.remove(msg)
        await self._echo(self._deleted_event(ch, msg), ch)
        return {"channel": ch.id, "ts": msg.ts}

    async def _chat_post_ephemeral(self, p: dict) -> dict:
        ch = self._writable_channel(p.get("channel"))
        user = p.get("user")
        if not user or user not in self.users:
            raise SlackError("user_not_found")
        if user not in ch.members:
            raise SlackError("user_not_in_channel")
        text, blocks = self._content(p)
        thread_ts = self._thread_ts(p.get("thread_ts"))
        eph = self._add_ephemeral(ch.id, user, text, blocks, thread_ts, "chat.postEphemeral")
        return {"message_ts": eph.message_ts}

    async def _chat_get_permalink(self, p: dict) -> dict:
        ch = self._api_channel(p.get("channel"))
        ts = str(p.get("message_ts") or "")
        if ch.find(ts) is None:
            raise SlackError("message_not_found")
        return {
            "channel": ch.id,
            "permalink": f"https://{self.team_domain}.slack.com/archives/{ch.id}/p{ts.replace('.', '')}",
        }

    async def _reactions_add(self, p: dict) -> dict:
        ch = self._writable_channel(p.get("channel"))
        msg = ch.find(str(p.get("timestamp") or ""))
        if msg is None:
            raise SlackError("message_not_found")
        name = str(p.get("name") or "").strip(":")
        if not name or " " in name:
            raise SlackError("invalid_name")
        users = msg.reactions.setdefault(name, [])
        if self.bot_user_id in users:
            raise SlackError("already_reacted")
        users.append(self.bot_user_id)
        await self._echo(self._reaction_event("reaction_added", ch, msg, name, self.bot_user_id), ch)
        return {}

    async def _reactions_remove(self, p: dict) -> dict:
        ch = self._writable_channel(p.get("channel"))
        msg = ch.find(str(p.get("timestamp") or ""))
        if msg is None:
            raise SlackError("message_not_found")
        name = str(p.get("name") or "").strip(":")
        if self.bot_user_id not in msg.reactions.get(name, []):
            raise SlackError("no_reaction")
        msg.reactions[name].remove(self.bot_user_id)
        if not msg.reactions[name]:
            del msg.reactions[name]
        await self._echo(self._reaction_event("reaction_removed", ch, msg, name, self.bot_user_id), ch)
        return {}

    def _page(self, messages: list[Message], p: dict, *, newest_first: bool) -> dict:
        oldest, latest = p.get("oldest"), p.get("latest")
        inclusive = _truthy(p.get("inclusive"))
        picked = []
        for msg in messages:
            key = _ts_key(msg.ts)
            if oldest and (key < _ts_key(str(oldest)) or (key == _ts_key(str(oldest)) and not inclusive)):
                continue
            if latest and (key > _ts_key(str(latest)) or (key == _ts_key(str(latest)) and not inclusive)):
                continue
            picked.append(msg)
        if newest_first:
            picked.reverse()
        limit = max(1, min(int(p.get("limit") or (100 if newest_first else 1000)), 1000))
        offset = 0
        if p.get("cursor"):
            try:
                offset = int(base64.b64decode(str(p["cursor"])).decode().split(":", 1)[1])
            except (ValueError, IndexError):
                raise SlackError("invalid_cursor") from None
        page = picked[offset : offset + limit]
        more = offset + limit < len(picked)
        include_metadata = _truthy(p.get("include_all_metadata"))
        out: dict[str, Any] = {
            "messages": [self._api_message(m, include_metadata=include_metadata) for m in page],
            "has_more": more,
        }
        next_cursor = base64.b64encode(f"next_ts:{offset + limit}".encode()).decode() if more else ""
        out["response_metadata"] = {"next_cursor": next_cursor}
        return out

    async def _conversations_history(self, p: dict) -> dict:
        ch = self._readable_channel(p.get("channel"))
        top = [m for m in ch.messages if not m.is_reply or m.subtype == "thread_broadcast"]
        return {**self._page(top, p, newest_first=True), "pin_count": 0, "channel_actions_count": 0}

    async def _conversations_replies(self, p: dict) -> dict:
        ch = self._readable_channel(p.get("channel"))
        ts = str(p.get("ts") or "")
        msg = ch.find(ts)
        if msg is None:
            raise SlackError("thread_not_found")
        root_ts = msg.thread_ts or msg.ts
        root = ch.find(root_ts)
        thread = ([root] if root else []) + [
            m for m in ch.messages if m.thread_ts == root_ts and m.ts != root_ts
        ]
        return self._page(thread, p, newest_first=False)

    async def _conversations_info(self, p: dict) -> dict:
        ch = self._api_channel(p.get("channel"))
        return {
            "channel": {
                "id": ch.id,
                "name": ch.name,
                "is_channel": ch.channel_type == "channel",
                "is_group": ch.channel_type == "group",
                "is_im": ch.is_im,
                "is_mpim": ch.is_mpim,
                "is_private": ch.is_private,
                "is_archived": ch.is_archived,
                "is_member": self.bot_user_id in ch.members,
                "num_members": len(ch.members),
                "context_team_id": self.team_id,
            }
        }

    async def _users_info(self, p: dict) -> dict:
        user = self.users.get(str(p.get("user") or ""))
        if user is None:
            raise SlackError("user_not_found")
        profile: dict[str, Any] = {
            "real_name": user.real_name,
            "display_name": user.name,
            "real_name_normalized": user.real_name,
            "display_name_normalized": user.name,
            "team": self.team_id,
        }
        if user.id == self.bot_user_id:
            profile["bot_id"] = self.bot_id
            profile["api_app_id"] = self.api_app_id
        return {
            "user": {
                "id": user.id,
                "team_id": self.team_id,
                "name": user.name,
                "deleted": False,
                "real_name": user.real_name,
                "tz": user.tz,
                "tz_label": "Central European Time",
                "tz_offset": user.tz_offset,
                "profile": profile,
                "is_admin": False,
                "is_owner": False,
                "is_bot": user.is_bot,
                "is_app_user": False,
                "updated": 1_700_000_000,
            }
        }

    async def _files_get_upload_url(self, p: dict) -> dict:
        filename = p.get("filename")
        try:
            length = int(p["length"])
        except (KeyError, TypeError, ValueError):
            raise SlackError(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] missing length"]}
            ) from None
        if not filename:
            raise SlackError(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] missing filename"]}
            )
        if length <= 0:
            raise SlackError("invalid_length")
        fid = f"F{next(self._ids):09d}FAKE"
        self.files[fid] = File(
            id=fid,
            name=str(filename),
            length=length,
            alt_txt=p.get("alt_txt"),
            snippet_type=p.get("snippet_type"),
            user=self.bot_user_id,
            created=int(float(self._next_ts())),
        )
        return {"upload_url": f"{self.url}/upload/v1/{fid}", "file_id": fid}

    async def _files_complete_upload(self, p: dict) -> dict:
        raw = p.get("files")
        try:
            items = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise SlackError("invalid_arguments") from None
        if (
            not isinstance(items, list)
            or not items
            or not all(isinstance(i, dict) and i.get("id") for i in items)
        ):
            raise SlackError("invalid_arguments")
        files = []
        for item in items:
            f = self.files.get(item["id"])
            if f is None or f.content is None or f.completed:
                raise SlackError("file_not_found")
            files.append((f, item))
        targets: list[str] = []
        if p.get("channel_id"):
            targets.append(str(p["channel_id"]))
        if p.get("channels"):
            targets.extend(c.strip() for c in str(p["channels"]).split(",") if c.strip())
        channels = [self._writable_channel(c) for c in dict.fromkeys(targets)]
        thread_ts = self._thread_ts(p.get("thread_ts"))
        if thread_ts and not channels:
            raise SlackError(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] thread_ts needs a channel"]}
            )
        comment = str(p.get("initial_comment") or "")
        if len(comment) > MAX_TEXT:
            raise SlackError("msg_too_long")
        for f, item in files:
            f.completed = True
            f.title = item.get("title") or f.name
        for ch in channels:
            msg = Message(
                channel=ch.id,
                ts=self._next_ts(),
                text=comment,
                user=self.bot_user_id,
                bot_id=self.bot_id,
                subtype=None,
            )
            self._insert(ch, msg, thread_ts)
            for f, _ in files:
                share = {"ts": msg.ts, "channel_name": ch.name, "team_id": self.team_id}
                if msg.is_reply:
                    share["thread_ts"] = msg.thread_ts
                f.shares.setdefault(ch.id, []).append(share)
            msg.files = [self._file_object(f, with_shares=False) for f, _ in files]
            event = self._message_event(msg, ch)
            event["subtype"] = "file_share"
            await self._echo(event, ch)
        # Like Slack: the answer names the files but not the message ts (see files.info shares).
        return {"files": [{"id": f.id, "title": f.title} for f, _ in files]}

    async def _files_info(self, p: dict) -> dict:
        f = self.files.get(str(p.get("file") or ""))
        if f is None or not f.completed:
            raise SlackError("file_not_found")
        return {
            "file": self._file_object(f, with_shares=True),
            "comments": [],
            "response_metadata": {"next_cursor": ""},
        }


# --------------------------------------------------------------------------- helpers


def _ts_key(ts: str) -> tuple[int, int]:
    sec, _, frac = ts.partition(".")
    return int(sec or 0), int((frac + "000000")[:6])


def _truthy(value: Any) -> bool:
    return value is True or value == 1 or (isinstance(value, str) and value.lower() in ("1", "true"))


def _readable(params: dict[str, Any]) -> dict[str, Any]:
    """Call params as a test wants to read them: JSON-encoded form fields decoded."""
    out = dict(params)
    for key in ("blocks", "attachments", "metadata", "files"):
        value = out.get(key)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                out[key] = json.loads(value)
    return out


def _rich_text(text: str) -> list[dict]:
    """How Slack's clients encode a typed message: one rich_text block, mentions as user elements."""
    elements: list[dict] = []
    pos = 0
    for m in _MENTION_RE.finditer(text):
        if m.start() > pos:
            elements.append({"type": "text", "text": text[pos : m.start()]})
        elements.append({"type": "user", "user_id": m.group(1)})
        pos = m.end()
    if pos < len(text):
        elements.append({"type": "text", "text": text[pos:]})
    block_id = base64.b32encode(uuid.uuid4().bytes).decode()[:5]
    return [
        {
            "type": "rich_text",
            "block_id": block_id,
            "elements": [{"type": "rich_text_section", "elements": elements}],
        }
    ]


def _with_block_ids(blocks: list[dict]) -> list[dict]:
    """Slack assigns a block_id to every block that has none."""
    out = copy.deepcopy(blocks)
    for block in out:
        if isinstance(block, dict) and "block_id" not in block:
            block["block_id"] = base64.b32encode(uuid.uuid4().bytes).decode()[:5]
    return out


def _interactive_elements(blocks: list[dict]) -> list[tuple[dict, dict]]:
    found = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        elements = list(block.get("elements") or []) if block.get("type") == "actions" else []
        if isinstance(block.get("accessory"), dict):
            elements.append(block["accessory"])
        found.extend((block, el) for el in elements if isinstance(el, dict))
    return found


def _check_text(
    obj: Any, ptr: str, errors: list[str], *, max_len: int, plain_only: bool = False, required: bool = True
) -> None:
    if obj is None:
        if required:
            errors.append(f"missing required field: {ptr.rsplit('/', 1)[-1]} [json-pointer:{ptr}]")
        return
    if not isinstance(obj, dict) or obj.get("type") not in _TEXT_TYPES:
        errors.append(f"must provide an object with type plain_text or mrkdwn [json-pointer:{ptr}]")
        return
    if plain_only and obj["type"] != "plain_text":
        errors.append(f"must be a valid enum value [json-pointer:{ptr}/type]")
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        errors.append(f"must be more than 0 characters [json-pointer:{ptr}/text]")
    elif len(text) > max_len:
        errors.append(f"must be less than {max_len + 1} characters [json-pointer:{ptr}/text]")


def _check_len(value: Any, max_len: int, ptr: str, errors: list[str]) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        errors.append(f"must be a string [json-pointer:{ptr}]")
    elif len(value) > max_len:
        errors.append(f"must be less than {max_len + 1} characters [json-pointer:{ptr}]")


def _check_image(obj: dict, ptr: str, errors: list[str], file_is_shared: Callable[[dict], bool]) -> None:
    url, slack_file = obj.get("image_url"), obj.get("slack_file")
    if (url is None) == (slack_file is None):
        errors.append(f"must provide exactly one of image_url or slack_file [json-pointer:{ptr}]")
    _check_len(url, 3000, f"{ptr}/image_url", errors)
    if slack_file is not None:
        if not isinstance(slack_file, dict) or ("id" in slack_file) == ("url" in slack_file):
            errors.append(f"slack_file must have exactly one of id or url [json-pointer:{ptr}/slack_file]")
        elif not file_is_shared(slack_file):
            errors.append(f"invalid slack file [json-pointer:{ptr}/slack_file]")
    if not obj.get("alt_text"):
        errors.append(f"missing required field: alt_text [json-pointer:{ptr}]")
    _check_len(obj.get("alt_text"), 2000, f"{ptr}/alt_text", errors)


def _check_element(
    el: Any, ptr: str, errors: list[str], action_ids: set[str], file_is_shared: Callable[[dict], bool]
) -> None:
    if not isinstance(el, dict) or not isinstance(el.get("type"), str):
        errors.append(f"missing required field: type [json-pointer:{ptr}]")
        return
    kind = el["type"]
    if kind not in _ELEMENT_TYPES:
        errors.append(f"unsupported type: {kind} [json-pointer:{ptr}/type]")
        return
    action_id = el.get("action_id")
    if action_id is not None:
        _check_len(action_id, 255, f"{ptr}/action_id", errors)
        if action_id in action_ids:
            errors.append(f"action_id already exists: {action_id} [json-pointer:{ptr}/action_id]")
        action_ids.add(action_id)
    if kind == "button":
        _check_text(el.get("text"), f"{ptr}/text", errors, max_len=75, plain_only=True)
        _check_len(el.get("value"), 2000, f"{ptr}/value", errors)
        _check_len(el.get("url"), 3000, f"{ptr}/url", errors)
        if el.get("style") not in (None, "primary", "danger"):
            errors.append(f"must be a valid enum value [json-pointer:{ptr}/style]")
        confirm = el.get("confirm")
        if confirm is not None:
            if not isinstance(confirm, dict):
                errors.append(f"must be an object [json-pointer:{ptr}/confirm]")
            else:
                _check_text(
                    confirm.get("title"), f"{ptr}/confirm/title", errors, max_len=100, plain_only=True
                )
                _check_text(confirm.get("text"), f"{ptr}/confirm/text", errors, max_len=300)
                _check_text(
                    confirm.get("confirm"), f"{ptr}/confirm/confirm", errors, max_len=30, plain_only=True
                )
                _check_text(confirm.get("deny"), f"{ptr}/confirm/deny", errors, max_len=30, plain_only=True)
    elif kind == "image":
        _check_image(el, ptr, errors, file_is_shared)


def _validate_blocks(blocks: list[Any], file_is_shared: Callable[[dict], bool]) -> list[str]:
    errors: list[str] = []
    if len(blocks) > MAX_BLOCKS:
        errors.append(f"no more than {MAX_BLOCKS} items allowed [json-pointer:/blocks]")
    block_ids: set[str] = set()
    for i, block in enumerate(blocks):
        ptr = f"/blocks/{i}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            errors.append(f"missing required field: type [json-pointer:{ptr}]")
            continue
        kind = block["type"]
        if kind not in _BLOCK_TYPES:
            errors.append(f"unsupported type: {kind} [json-pointer:{ptr}/type]")
            continue
        block_id = block.get("block_id")
        if block_id is not None:
            _check_len(block_id, 255, f"{ptr}/block_id", errors)
            if block_id in block_ids:
                errors.append(f"duplicate block_id: {block_id} [json-pointer:{ptr}/block_id]")
            block_ids.add(block_id)
        action_ids: set[str] = set()
        if kind == "section":
            text, fields = block.get("text"), block.get("fields")
            if text is None and not fields:
                errors.append(f"must provide either text or fields [json-pointer:{ptr}]")
            _check_text(text, f"{ptr}/text", errors, max_len=3000, required=False)
            if fields is not None:
                if not isinstance(fields, list) or len(fields) > 10:
                    errors.append(f"no more than 10 items allowed [json-pointer:{ptr}/fields]")
                else:
                    for j, f in enumerate(fields):
                        _check_text(f, f"{ptr}/fields/{j}", errors, max_len=2000)
            if block.get("accessory") is not None:
                _check_element(block["accessory"], f"{ptr}/accessory", errors, action_ids, file_is_shared)
        elif kind == "header":
            _check_text(block.get("text"), f"{ptr}/text", errors, max_len=150, plain_only=True)
        elif kind == "actions":
            elements = block.get("elements")
            if not isinstance(elements, list) or not elements:
                errors.append(f"must provide at least 1 element [json-pointer:{ptr}/elements]")
            elif len(elements) > 25:
                errors.append(f"no more than 25 items allowed [json-pointer:{ptr}/elements]")
            else:
                for j, el in enumerate(elements):
                    _check_element(el, f"{ptr}/elements/{j}", errors, action_ids, file_is_shared)
        elif kind == "context":
            elements = block.get("elements")
            if not isinstance(elements, list) or not elements:
                errors.append(f"must provide at least 1 element [json-pointer:{ptr}/elements]")
            elif len(elements) > 10:
                errors.append(f"no more than 10 items allowed [json-pointer:{ptr}/elements]")
            else:
                for j, el in enumerate(elements):
                    if isinstance(el, dict) and el.get("type") == "image":
                        _check_image(el, f"{ptr}/elements/{j}", errors, file_is_shared)
                    else:
                        _check_text(el, f"{ptr}/elements/{j}", errors, max_len=3000)
        elif kind == "image":
            _check_image(block, ptr, errors, file_is_shared)
            if block.get("title") is not None:
                _check_text(block["title"], f"{ptr}/title", errors, max_len=2000, plain_only=True)
        elif kind == "markdown":
            if not isinstance(block.get("text"), str) or not block["text"]:
                errors.append(f"missing required field: text [json-pointer:{ptr}]")
            else:
                _check_len(block["text"], 12_000, f"{ptr}/text", errors)
        elif kind == "rich_text":
            if not isinstance(block.get("elements"), list):
                errors.append(f"missing required field: elements [json-pointer:{ptr}]")
        elif kind == "input":
            _check_text(block.get("label"), f"{ptr}/label", errors, max_len=2000, plain_only=True)
            if block.get("element") is None:
                errors.append(f"missing required field: element [json-pointer:{ptr}]")
    return errors
