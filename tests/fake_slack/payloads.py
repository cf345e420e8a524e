"""The JSON Slack sends about the workspace: messages as the Web API returns them, the events the
app receives (message, reaction, message_changed, message_deleted) and file objects."""

from __future__ import annotations

import copy
from typing import Any

from .records import Channel, File, Message


class Payloads:
    """Mixed into FakeSlack (uses its identities, channels and clock)."""

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
