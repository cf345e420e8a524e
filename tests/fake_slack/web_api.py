"""The Web API over HTTP: reading a request, tokens, injected failures and per-channel rate limits,
then the method handlers (chat.*, reactions.*, conversations.*, users.info, views.publish, files.*);
also the upload URLs of files and the response_urls of slash commands and clicks."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import time
import uuid
from typing import Any

from aiohttp import web

from .arguments import MAX_TEXT, _truthy, _ts_key
from .blocks import MAX_VIEW_BLOCKS, _validate_blocks, _with_block_ids
from .records import Call, File, Injection, Interaction, Message, SlackError


class WebApi:
    """Mixed into FakeSlack (its `_methods` maps method names to the handlers here)."""

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
        if token in self.revoked:  # revoke_token(): Slack's answer to a token it took back
            raise SlackError(self.revoked[token])
        if token not in (self.bot_token, self.app_token):
            raise SlackError("invalid_auth")
        wants_app_token = method == "apps.connections.open"
        if (token == self.app_token) != wants_app_token:
            raise SlackError("not_allowed_token_type")

    def _take_injection(self, method: str, params: dict[str, Any]) -> Injection | None:
        """The scripted failure this call meets, if any (each call uses up one of its `times`)."""
        for inj in self._injections:
            if inj.exhausted or (inj.method is not None and inj.method != method):
                continue
            if inj.channel is not None and params.get("channel", params.get("channel_id")) != inj.channel:
                continue
            inj.hits += 1
            return inj
        return None

    def _dropped(self, request: web.Request, call: Call) -> web.Response:
        """Close the socket instead of answering (the client sees ServerDisconnectedError)."""
        call.dropped = True
        if call.response is None:
            call.status = 0
        if request.transport is not None:
            request.transport.close()
        self._notify()
        return web.Response(status=500)  # written to a closed socket: nobody reads it

    async def _hung(self, call: Call) -> web.Response:
        """Never answer (the client's deadline ends the call); the fake stopping ends the wait."""
        call.hung, call.status = True, 0
        self._notify()
        await self._stopping.wait()
        return web.Response(status=503)  # to a client long gone

    def _injected(self, request: web.Request, call: Call, inj: Injection) -> web.Response:
        """Answer as the injection says, without running the method."""
        if inj.drop is not None:
            return self._dropped(request, call)
        if inj.text is not None:
            call.status, call.response, call.headers = (
                inj.status,
                {"ok": False, "text": inj.text},
                inj.headers,
            )
            self._notify()
            return web.Response(status=inj.status, text=inj.text, headers=inj.headers)
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
        injection: Injection | None = None
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
            injection = self._take_injection(method, params)
            if injection is not None and injection.hang:
                return await self._hung(call)
            if injection is not None and injection.drop != "after":
                return self._injected(request, call, injection)
            self._check_channel_rate(method, params)
            body: dict[str, Any] = {"ok": True, **(await handler(params))}
            status, headers = 200, {}
        except SlackError as e:
            body = {"ok": False, "error": e.error, **e.extra}
            status, headers = e.status, e.headers
        if token == self.bot_token:
            headers["x-oauth-scopes"] = self.scopes
        call.status, call.response, call.headers = status, body, dict(headers)
        if injection is not None and injection.drop == "after":
            return self._dropped(request, call)  # Slack did it; the app never hears so
        self._notify()
        return web.json_response(body, status=status, headers=headers)

    async def _handle_upload(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        data = await request.read()
        call = Call("upload", {"file_id": file_id, "bytes": len(data)}, None, time.monotonic())
        self.api_calls.append(call)
        if (injection := self._take_injection("upload", {})) is not None:
            return self._injected_upload(request, call, injection)
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

    def _injected_upload(self, request: web.Request, call: Call, inj: Injection) -> web.Response:
        """An upload URL answers in text, not Slack's JSON: an injected error is its status and body."""
        if inj.drop is not None:
            return self._dropped(request, call)
        text = inj.text if inj.text is not None else inj.error
        call.status, call.response = inj.status, {"ok": False, "error": inj.error, "text": text}
        self._notify()
        return web.Response(status=inj.status, text=text, headers=inj.headers)

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

    async def _conversations_open(self, p: dict) -> dict:
        """A DM between the bot and one user (`users`): the same channel every time."""
        self._require_scope("im:write")
        users = [u for u in str(p.get("users") or "").split(",") if u]
        if len(users) != 1 or users[0] not in self.users:
            raise SlackError("user_not_found")
        dm = f"D0{users[0][1:]}"
        if dm not in self.channels:
            self.add_channel(dm, self.users[users[0]].name, members=[users[0]])
        return {"channel": {"id": dm}}

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
        """Needs the read scope of the channel's type (channels:read for a public channel, ...);
        a private channel the bot is not in does not exist for it."""
        ch = self._api_channel(p.get("channel"))
        needed = {"channel": "channels:read", "group": "groups:read", "im": "im:read", "mpim": "mpim:read"}
        self._require_scope(needed[ch.channel_type])
        if ch.is_private and self.bot_user_id not in ch.members:
            raise SlackError("channel_not_found")
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

    def _require_scope(self, scope: str) -> None:
        provided = self.scopes.split(",")
        if scope not in provided:
            raise SlackError("missing_scope", needed=scope, provided=self.scopes)

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
                "is_admin": user.is_admin or user.is_owner,
                "is_owner": user.is_owner or user.is_primary_owner,
                "is_primary_owner": user.is_primary_owner,
                "is_restricted": False,
                "is_ultra_restricted": False,
                "is_bot": user.is_bot,
                "is_app_user": False,
                "updated": 1_700_000_000,
            }
        }

    async def _views_publish(self, p: dict) -> dict:
        """A Home tab view for one user: `view` a JSON object of type "home" (up to 100 blocks,
        250 kB); `hash` must match the published view's, when given."""
        user = self.users.get(str(p.get("user_id") or ""))
        if user is None or user.is_bot:
            raise SlackError(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] invalid `user_id`"]}
            )
        raw = p.get("view")
        try:
            view = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            view = None
        if not isinstance(view, dict):
            raise _view_error("must provide an object [json-pointer:/view]")
        if len(json.dumps(view)) > 250_000:
            raise SlackError("view_too_large")
        if view.get("type") != "home":
            raise _view_error("must be a valid enum value [json-pointer:/view/type]")
        if not self.home_tab_enabled:
            raise SlackError("not_enabled")
        blocks = view.get("blocks")
        if not isinstance(blocks, list):
            raise _view_error("missing required field: blocks [json-pointer:/view]")
        errors = _validate_blocks(blocks, self._file_is_shared, MAX_VIEW_BLOCKS)
        for field_name, limit in (("private_metadata", 3000), ("callback_id", 255), ("external_id", 255)):
            if len(str(view.get(field_name) or "")) > limit:
                errors.append(f"must be less than {limit + 1} characters [json-pointer:/view/{field_name}]")
        if errors:
            raise _view_error(
                *(e.replace("[json-pointer:/blocks", "[json-pointer:/view/blocks") for e in errors)
            )
        previous = self.home_views.get(user.id)
        if p.get("hash") and previous is not None and p["hash"] != previous["hash"]:
            raise SlackError("hash_conflict")
        view_id = previous["id"] if previous else f"V{next(self._ids):09d}FAKE"
        published = {
            "id": view_id,
            "team_id": self.team_id,
            "type": "home",
            "close": None,
            "submit": None,
            "blocks": _with_block_ids(blocks),
            "private_metadata": str(view.get("private_metadata") or ""),
            "callback_id": str(view.get("callback_id") or ""),
            "state": {"values": {}},
            "hash": f"{int(time.time())}.{uuid.uuid4().hex[:8]}",
            "clear_on_close": False,
            "notify_on_close": False,
            "root_view_id": view_id,
            "previous_view_id": None,
            "app_id": self.api_app_id,
            "external_id": str(view.get("external_id") or ""),
            "app_installed_team_id": self.team_id,
            "bot_id": self.bot_id,
        }
        self.home_views[user.id] = published
        return {"view": published}

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
        self._require_scope("files:read")
        f = self.files.get(str(p.get("file") or ""))
        if f is None or not f.completed:
            raise SlackError("file_not_found")
        return {
            "file": self._file_object(f, with_shares=True),
            "comments": [],
            "response_metadata": {"next_cursor": ""},
        }


class FileDownloads:
    """url_private / url_private_download, as Slack serves them: the bytes to a request carrying the
    bot token (Authorization: Bearer) of an app with files:read; anyone else is redirected to the
    sign-in page (HTTP 302), as Slack does, rather than refused."""

    async def _handle_file_download(self, request: web.Request) -> web.StreamResponse:
        token = self._token_of(request, {})
        fid = request.match_info["team_file"].rsplit("-", 1)[-1]
        f = self.files.get(fid)
        call = Call("files-pri", {"file": fid}, token, time.monotonic())
        self.api_calls.append(call)
        if token != self.bot_token or "files:read" not in self.scopes.split(","):
            call.status = 302
            raise web.HTTPFound(f"https://{self.team_domain}.slack.com/?redir=%2Ffiles-pri%2F{fid}")
        if f is None or f.content is None:
            call.status = 404
            raise web.HTTPNotFound()
        return web.Response(body=f.content, content_type=f.mimetype)


def _view_error(*messages: str) -> SlackError:
    return SlackError("invalid_arguments", response_metadata={"messages": [f"[ERROR] {m}" for m in messages]})


def _readable(params: dict[str, Any]) -> dict[str, Any]:
    """Call params as a test wants to read them: JSON-encoded form fields decoded."""
    out = dict(params)
    for key in ("blocks", "attachments", "metadata", "files", "view"):
        value = out.get(key)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                out[key] = json.loads(value)
    return out
