"""FakeSlack: a fake Slack workspace (see the package docstring for how to use it). This module holds
its state and lifecycle, workspace setup, failure injection, looking and waiting; the Web API,
delivery, scripting, argument checks and payload shapes are mixins from the sibling modules."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal

from aiohttp import web

from .arguments import Arguments, _ts_key
from .blocks import _rich_text, _with_block_ids
from .delivery import Delivery
from .payloads import Payloads
from .records import (
    ALICE,
    BOB,
    Ack,
    Call,
    Channel,
    Connection,
    Envelope,
    Ephemeral,
    File,
    Injection,
    Message,
    User,
    _ResponseUrl,
)
from .scripting import Scripting
from .web_api import FileDownloads, WebApi

# Mirrors settings.event_subscriptions.bot_events in manifest.yml.
DEFAULT_BOT_EVENTS = (
    "app_home_opened",
    "app_mention",
    "message.channels",
    "message.groups",
    "reaction_added",
    "app_uninstalled",
    "tokens_revoked",
)
DEFAULT_SCOPES = (
    "app_mentions:read,channels:history,channels:read,groups:history,groups:read,chat:write,commands,"
    "files:read,files:write,im:write,reactions:read,reactions:write,users:read"
)


class FakeSlack(Scripting, Delivery, WebApi, FileDownloads, Arguments, Payloads):
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
        self.home_tab_enabled = True  # manifest.yml's features.app_home.home_tab_enabled
        self.home_views: dict[str, dict] = {}  # user -> the Home tab view published for them

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
        self.revoked: dict[str, str] = {}  # token -> the error every call with it now gets
        self._stopping = asyncio.Event()  # set by stop(): hung calls may end
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
            "conversations.open": self._conversations_open,
            "users.info": self._users_info,
            "views.publish": self._views_publish,
            "files.getUploadURLExternal": self._files_get_upload_url,
            "files.completeUploadExternal": self._files_complete_upload,
            "files.info": self._files_info,
        }

    # ------------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> FakeSlack:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_post("/upload/v1/{file_id}", self._handle_upload)
        app.router.add_get("/files-pri/{team_file}/{name}", self._handle_file_download)
        app.router.add_get("/files-pri/{team_file}/download/{name}", self._handle_file_download)
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
        self._stopping.set()
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
        self,
        id: str,
        name: str | None = None,
        *,
        real_name: str = "",
        is_bot: bool = False,
        is_admin: bool = False,
        is_owner: bool = False,
    ) -> User:
        """`is_admin` / `is_owner`: a workspace admin or owner, as users.info says."""
        return self._add_user(
            User(
                id,
                name or id.lower(),
                real_name=real_name or (name or id),
                is_bot=is_bot,
                is_admin=is_admin,
                is_owner=is_owner,
            )
        )

    def mention(self, user: str) -> str:
        """A user picked from the @-menu, as a slash command with escaping sends it: `<@U0BOB|bob>`."""
        return f"<@{user}|{self._ensure_user(user).name}>"

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
        """The next `times` calls of `method` (None: any) answer {"ok": false, "error": error}
        (HTTP `status`; "upload" for the upload URLs, which answer the error as text)."""
        injection = Injection(method, error, times, status, dict(headers or {}), extra, channel)
        self._injections.append(injection)
        return injection

    def fail_text(
        self,
        method: str | None,
        body: str = "upstream connect error or disconnect/reset before headers",
        *,
        status: int = 503,
        times: int = 1,
        channel: str | None = None,
    ) -> Injection:
        """The next `times` calls of `method` answer HTTP `status` with a text/plain `body`, not
        Slack's JSON (what a load balancer in front of Slack sends when Slack is unwell).
        `method` "upload": the upload URLs of files.getUploadURLExternal."""
        injection = Injection(method, f"http_{status}", times, status, {}, {}, channel, text=body)
        self._injections.append(injection)
        return injection

    def drop_connection(
        self, method: str | None, *, times: int = 1, after: bool = False, channel: str | None = None
    ) -> Injection:
        """The next `times` calls of `method` get no answer: the server closes the socket mid-request
        (the client sees aiohttp's ServerDisconnectedError). By default before the method runs, so
        nothing happened; `after=True`: Slack did it, and the app never hears so."""
        drop: Literal["before", "after"] = "after" if after else "before"
        injection = Injection(method, "connection_dropped", times, 0, {}, {}, channel, drop=drop)
        self._injections.append(injection)
        return injection

    def hang(self, method: str | None, *, times: int = 1, channel: str | None = None) -> Injection:
        """The next `times` calls of `method` are taken and never answered (a Slack, or a proxy in
        front of it, that hangs): only the client's own deadline ends them. Calls record `hung`."""
        injection = Injection(method, "hung", times, 0, {}, {}, channel, hang=True)
        self._injections.append(injection)
        return injection

    def revoke_token(self, token: str | None = None, error: str = "token_revoked") -> None:
        """Slack takes a token back (the bot token by default): every call with it now answers
        `error` (token_revoked, invalid_auth, account_inactive, ...)."""
        self.revoked[token or self.bot_token] = error

    def delete_channel(self, channel: str) -> None:
        """The channel is deleted: every call naming it answers channel_not_found."""
        del self.channels[self.channel(channel).id]

    def archive_channel(self, channel: str) -> None:
        """The channel is archived: writes to it answer is_archived."""
        self.channel(channel).is_archived = True

    async def uninstall_app(self) -> Envelope | None:
        """Someone uninstalls the app: Slack revokes both tokens and sends `app_uninstalled` (and
        `tokens_revoked`) before the Socket Mode connection goes (the events reach the app first)."""
        envelope = None
        for event in (
            {"type": "app_uninstalled", "event_ts": self._next_ts()},
            {"type": "tokens_revoked", "tokens": {"bot": [self.bot_user_id]}, "event_ts": self._next_ts()},
        ):
            if event["type"] in self.bot_events:  # (subscribed, as manifest.yml does)
                delivered = await self._deliver_team_event(event)
                envelope = envelope or delivered
        self.revoke_token(self.bot_token, "token_revoked")
        self.revoke_token(self.app_token, "token_revoked")
        return envelope

    def limit_channel_rate(
        self, interval: float | None = 1.0, *, burst: int = 1, methods: Iterable[str] = ("chat.postMessage",)
    ) -> None:
        """Enforce about one post per `interval` seconds per channel (short bursts of `burst`);
        over the limit -> 429 ratelimited with Retry-After. `interval=None` switches it off."""
        self._channel_rate = None if interval is None else (float(interval), burst, tuple(methods))
        self._buckets.clear()

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
