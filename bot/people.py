"""People as the runner and agents hear of them: a Slack user id turned into a protocol Person
(kind "slack", the id, the name Slack shows), so that text written for people and agents says
"Alice" rather than "slack:U0ALICE", while the runner's audit trail keeps the exact id.

Slack itself still shows people as mentions: each name looked up is remembered (mrkdwn.KNOWN_NAMES),
and the runner's text that names someone by it ("stopped by Alice") is rendered with `<@U…>`.

Names come from users.info (the profile's display name, else the real name, else the user name),
looked up once per user and kept for `ttl_s`; a user Slack cannot describe travels without a name
(the runner then says "a Slack user"), and the bot looks again next time.
"""

from __future__ import annotations

import logging
import time

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot import mrkdwn
from goaltender.protocol import messages as p

log = logging.getLogger("goaltender.bot")

NAME_TTL_S = 3600.0  # a renamed person is shown by their new name within the hour


class People:
    """Slack users as protocol Persons, their names looked up with users.info and cached."""

    def __init__(self, client: AsyncWebClient, ttl_s: float = NAME_TTL_S):
        self.client = client
        self.ttl_s = ttl_s
        self._names: dict[str, tuple[str, float]] = {}

    async def person(self, user: str) -> p.Person:
        """The Slack user `user` as the runner should hear of them."""
        return p.Person(kind="slack", id=user, name=await self.name(user))

    async def name(self, user: str) -> str | None:
        """The name Slack shows for `user` (None when Slack cannot say)."""
        known = self._names.get(user)
        if known is not None and time.monotonic() - known[1] < self.ttl_s:
            return known[0]
        try:
            info = (await self.client.users_info(user=user)).get("user") or {}
        except SlackApiError as exc:
            log.warning("users.info for %s failed: %s", user, exc.response.get("error"))
            return None
        except Exception as exc:  # Slack unreachable: the person travels without a name this time
            log.warning("users.info for %s failed: %s", user, exc)
            return None
        name = shown_name(info)
        if name:
            self._names[user] = (name, time.monotonic())
            mrkdwn.learn_name(name, user)  # so that Slack shows it as a mention again
        return name

    async def learn(self, users: list[str]) -> None:
        """Look up these users' names (the owners of goals in bot.db, at start): what the runner
        wrote about them before a restart is shown in Slack with mentions again."""
        for user in dict.fromkeys(users):
            await self.name(user)


def shown_name(info: dict) -> str | None:
    """The name Slack shows for a users.info `user` object."""
    profile = info.get("profile") or {}
    for name in (
        profile.get("display_name"),
        profile.get("real_name"),
        info.get("real_name"),
        info.get("name"),
    ):
        if isinstance(name, str) and name.strip():
            return name.strip()[:200]
    return None
