"""Slack's tokens, checked before the bot serves anyone: a token Slack refuses stops the bot with a
message naming its variable, rather than a bot that acks `/goal` and is never heard from.

The bot token is checked with auth.test (which also says who the bot is); the app-level token of
Socket Mode with apps.connections.open (slack_sdk's Socket Mode client would otherwise retry a
refused token forever). A Slack that cannot be reached is not a refusal: the caller decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot.slack_errors import TOKEN_ERRORS, api_error

WHERE = {
    "SLACK_BOT_TOKEN": "the Bot User OAuth Token (xoxb-…) under OAuth & Permissions",
    "SLACK_APP_TOKEN": "an App-Level Token (xapp-…, scope connections:write) under Basic Information",
}


UNINSTALLED = ("app_uninstalled", "tokens_revoked")  # the events (and error) of an app taken out


class TokenRefused(Exception):
    """Slack refused a token: which variable holds it, and what Slack said."""

    def __init__(self, variable: str, error: str):
        super().__init__(variable, error)
        self.variable = variable
        self.error = error

    def __str__(self) -> str:
        if self.error in UNINSTALLED:
            return (
                f"the app was uninstalled from the workspace or its tokens revoked ({self.error}), so "
                f"{self.variable} no longer works. Reinstall the app (api.slack.com/apps) and set "
                f"{self.variable} to {WHERE[self.variable]}."
            )
        return (
            f"Slack refused the token in {self.variable} ({self.error}). Set {self.variable} to "
            f"{WHERE[self.variable]} of the app installed in your workspace (api.slack.com/apps)."
        )


@dataclass(frozen=True)
class SlackIdentity:
    """Who the bot token says the bot is (auth.test)."""

    user_id: str
    name: str
    team: str

    def describe(self) -> str:
        return f"@{self.name} ({self.user_id}) in {self.team}"


async def check_bot_token(client: AsyncWebClient) -> SlackIdentity:
    """auth.test with the bot token. TokenRefused when Slack refuses it; other failures (the
    network, a 5xx) pass through."""
    try:
        answer = await client.auth_test()
    except SlackApiError as exc:
        raise _refusal_or(exc, "SLACK_BOT_TOKEN") from exc
    return SlackIdentity(
        user_id=str(answer.get("user_id") or ""),
        name=str(answer.get("user") or "goaltender"),
        team=str(answer.get("team") or answer.get("team_id") or "?"),
    )


async def check_app_token(client: AsyncWebClient, app_token: str) -> None:
    """apps.connections.open with the app-level token (it hands out a WebSocket URL, left unused to
    expire). TokenRefused when Slack refuses the token; other failures pass through."""
    try:
        await client.apps_connections_open(app_token=app_token)
    except SlackApiError as exc:
        raise _refusal_or(exc, "SLACK_APP_TOKEN") from exc


def _refusal_or(exc: SlackApiError, variable: str) -> Exception:
    error = api_error(exc)
    return TokenRefused(variable, error) if error in TOKEN_ERRORS else exc
