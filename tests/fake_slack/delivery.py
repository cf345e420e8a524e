"""Delivering requests to the app: envelopes over Socket Mode (websockets: hello, frames, acks,
disconnects) or, after deliver_over_http(), as signed HTTP POSTs; ack deadlines, redelivery of
unacked events, and what a user sees of an ack or a response."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import hmac
import json
import time
import uuid
from urllib.parse import urlencode

import aiohttp
from aiohttp import WSMsgType, web

from .blocks import _with_block_ids
from .records import Ack, Channel, Connection, Envelope, Ephemeral, Message


class Delivery:
    """Mixed into FakeSlack (uses its connections, envelopes, acks and ephemerals)."""

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
        return await self._deliver_team_event(event)

    async def _deliver_team_event(self, event: dict) -> Envelope | None:
        """An event as Slack wraps it; on its own: one about the app (app_uninstalled), in no channel."""
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
