"""Scripting what users do: post, reply, mention the bot, react, run a slash command, click a button;
each is delivered to the app as Slack would deliver it."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from .blocks import _interactive_elements, _rich_text
from .records import ALICE, Envelope, File, Interaction, Message, _ResponseUrl


class Scripting:
    """Mixed into FakeSlack (uses its workspace model and delivery)."""

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

    async def user_shares_file(
        self,
        channel: str,
        thread_ts: str,
        name: str,
        content: bytes,
        text: str = "",
        user: str = ALICE,
    ) -> Message:
        """A user attaches a file to a reply in a thread: a `file_share` message whose `files`
        hold the file object (url_private_download for the bot to fetch with its token)."""
        ch = self.channel(channel)
        self._ensure_user(user)
        ch.members.add(user)
        fid = f"F{next(self._ids):09d}FAKE"
        ts = self._next_ts()
        f = File(id=fid, name=name, length=len(content), user=user, content=content, completed=True)
        f.created = int(float(ts))
        f.shares[ch.id] = [
            {"ts": ts, "channel_name": ch.name, "team_id": self.team_id, "thread_ts": thread_ts}
        ]
        self.files[fid] = f
        msg = Message(
            channel=ch.id,
            ts=ts,
            text=text,
            user=user,
            blocks=_rich_text(text) if text else None,
            client_msg_id=str(uuid.uuid4()),
            subtype="file_share",
        )
        self._insert(ch, msg, thread_ts)
        msg.files = [self._file_object(f, with_shares=False)]
        env = await self._deliver_event(self._message_event(msg, ch), ch)
        if env is not None:
            msg.envelopes.append(env)
        self._notify()
        return msg

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

    async def user_opens_home(self, user: str = ALICE) -> Envelope | None:
        """A user opens the app's Home tab: app_home_opened (with the view published for them
        before, if any), from the app's DM channel with them."""
        u = self._ensure_user(user)
        dm = f"D0{u.id[1:]}"
        if dm not in self.channels:
            self.add_channel(dm, u.name, members=[u.id])  # an im: its id starts with D
        event: dict[str, Any] = {
            "type": "app_home_opened",
            "user": u.id,
            "channel": dm,
            "tab": "home",
            "event_ts": self._next_ts(),
        }
        if (view := self.home_views.get(u.id)) is not None:
            event["view"] = view
        env = await self._deliver_event(event, self.channels[dm])
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
