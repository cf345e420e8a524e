"""The records of the fake workspace: what it holds (channels, messages, users, files) and what it
saw (calls, envelopes, acks, connections, interactions, ephemerals), plus the error a Web API method
raises."""

from __future__ import annotations

import asyncio
import json
import mimetypes
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web

from .blocks import _interactive_elements

if TYPE_CHECKING:
    from .workspace import FakeSlack

ALICE = "U0ALICE"
BOB = "U0BOB"


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
    is_admin: bool = False  # a workspace admin (users.info); owners are admins too, as in Slack
    is_owner: bool = False
    is_primary_owner: bool = False


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
    status: int = 200  # 0: no answer at all (the connection was dropped before the method ran)
    response: dict | None = None
    headers: dict[str, str] = field(default_factory=dict)
    dropped: bool = False  # the socket was closed instead of answering (see FakeSlack.drop_connection)
    hung: bool = False  # taken and never answered (see FakeSlack.hang)

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
    """A scripted failure: the next `times` matching calls answer with `error` (and `status`) as
    Slack's JSON, or with `text` as a text/plain body, or get no answer at all (`drop`)."""

    method: str | None  # None: any method; "upload": the upload URLs files.getUploadURLExternal gives
    error: str
    times: int
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    channel: str | None = None
    hits: int = 0
    text: str | None = None  # answer this body as text/plain instead of Slack's JSON
    drop: Literal["before", "after"] | None = None
    """Close the socket without answering: before the method runs (nothing happened), or after
    (Slack acted on the request, the app never hears so)."""
    hang: bool = False
    """Take the request and never answer it (until the fake stops): only the client's deadline ends it."""

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
