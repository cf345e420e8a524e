"""The bot's Slack Web API client: a deadline on every call, and access lost noticed on any call.

A deadline: the bot hands slack_sdk one aiohttp session for all its calls (connections reused), and
slack_sdk then applies none of its own timeout; aiohttp's default is 300 s. So the session carries
the deadline (GOALTENDER_SLACK_TIMEOUT_S, 30 s like slack_sdk's): a call Slack (or a proxy) takes
and never answers ends as a TimeoutError, which the outbox tries again like a dropped connection.

Access lost: Slack answers every call with invalid_auth / token_revoked / account_inactive /
app_uninstalled (...) once the token is revoked or the app uninstalled. Whichever call hears it
first — a write, a listener's lookup, Socket Mode's apps.connections.open — records it in the
client's `AuthWatch`; the bot then stops, with one line naming the variable, rather than dropping
every write with an error line each while Socket Mode reconnects forever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from goaltender.bot.slack_errors import TOKEN_ERRORS, api_error
from goaltender.bot.tokens import TokenRefused

log = logging.getLogger("goaltender.bot")

# Slack's answers once the bot's access is gone: the token is refused, or the app is not installed.
ACCESS_LOST_ERRORS = TOKEN_ERRORS | {"app_uninstalled"}
APP_TOKEN_METHOD = "apps.connections.open"  # the one call made with SLACK_APP_TOKEN


def slack_session(timeout_s: float) -> aiohttp.ClientSession:
    """The HTTP session of every Web API call the bot makes: each call ends within `timeout_s`."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))


class AuthWatch:
    """Whether Slack took the bot's access away while it runs, and which token."""

    def __init__(self) -> None:
        self.lost: TokenRefused | None = None
        self._lost = asyncio.Event()

    def lose(self, variable: str, error: str) -> None:
        """Slack refused `variable`'s token (or the app is gone): the bot is to stop. Said once."""
        if self.lost is not None:
            return
        self.lost = TokenRefused(variable, error)
        # (Info: the line that names the variable is the one the bot ends with.)
        log.info("Slack said %s: the bot stops", error)
        self._lost.set()

    async def wait(self) -> TokenRefused:
        """Until access is lost; returns what was lost (raise it to stop the bot)."""
        await self._lost.wait()
        assert self.lost is not None
        return self.lost


class WatchedWebClient(AsyncWebClient):
    """An AsyncWebClient that reports a refused token (on any call) to its AuthWatch. Clients made
    for other uses (the outbox's, without retries) share the watch of the client they copy."""

    def __init__(self, *args: Any, auth: AuthWatch | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.auth = auth if auth is not None else AuthWatch()

    async def api_call(self, api_method: str, **kwargs: Any) -> AsyncSlackResponse:
        try:
            return await super().api_call(api_method, **kwargs)
        except SlackApiError as exc:
            if (error := api_error(exc)) in ACCESS_LOST_ERRORS:
                variable = "SLACK_APP_TOKEN" if api_method == APP_TOKEN_METHOD else "SLACK_BOT_TOKEN"
                self.auth.lose(variable, str(error))
            raise
