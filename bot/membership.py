"""Whether the bot is in a channel, asked before a goal starts there: a goal whose card cannot be
posted would have no thread, so `/goal` where the bot is not a member says "invite me first" and
starts nothing.

Slack's conversations.info says it (`is_member`; a private channel the bot is not in is
channel_not_found to it); needs channels:read / groups:read. It is asked at every goal (nothing
remembered): the answer also proves the bot's token still works, so a goal asked for right after
`/invite` goes ahead, and none starts after the token was revoked. When Slack cannot say (no
scope, not reachable), the goal goes ahead: should its card then be refused, the goal is stopped
and its owner told (Intake.on_outbox_failed). But when Slack refuses the bot's token (revoked, the
app uninstalled), or already did, that is no "cannot tell": TokenRefused, and nothing starts.
"""

from __future__ import annotations

import logging

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot import render
from goaltender.bot.slack_client import ACCESS_LOST_ERRORS, AuthWatch
from goaltender.bot.slack_errors import NETWORK_ERRORS, api_error, failure_of
from goaltender.bot.tokens import TokenRefused

log = logging.getLogger("goaltender.bot.membership")


class Membership:
    def __init__(self, client: AsyncWebClient, auth: AuthWatch):
        self.client = client
        self.auth = auth
        self.name = "goaltender"
        """The bot's name in Slack, for "/invite @name" (set from auth.test when the bot starts)."""
        self._scope_missing_said = False

    async def is_member(self, channel: str) -> bool | None:
        """Whether the bot is in `channel`; None when Slack cannot say. TokenRefused when Slack
        refuses the bot's token (the bot is stopping)."""
        if self.auth.lost is not None:
            raise self.auth.lost
        try:
            answer = await self.client.conversations_info(channel=channel)
        except SlackApiError as exc:
            return self._unknown_or_not(channel, exc)
        except NETWORK_ERRORS as exc:
            log.warning("cannot tell whether I am in %s: %s", channel, failure_of(exc).reason)
            return None
        return bool((answer.get("channel") or {}).get("is_member"))

    def invite_first(self, text: str) -> str:
        """The answer to a goal asked for where the bot is not a member."""
        return (
            f"I'm not in this channel, so your goal's thread would have nowhere to go. Invite me with "
            f"`/invite @{self.name}` first, then run `/goal` again. Nothing was started: `{render.escape(text[:500])}`"
        )

    def _unknown_or_not(self, channel: str, exc: SlackApiError) -> bool | None:
        error = api_error(exc)
        if error in ACCESS_LOST_ERRORS:
            raise TokenRefused("SLACK_BOT_TOKEN", str(error)) from exc
        if error == "channel_not_found":  # a private channel (or a DM) the bot is not in
            return False
        if error == "missing_scope":
            if not self._scope_missing_said:
                self._scope_missing_said = True
                log.warning(
                    "the app lacks the %s scope, so /goal cannot check that I am in a channel before "
                    "starting a goal; add it (manifest.yml) and reinstall the app",
                    exc.response.get("needed") or "channels:read / groups:read",
                )
            return None
        log.warning("cannot tell whether I am in %s: %s", channel, failure_of(exc).reason)
        return None
