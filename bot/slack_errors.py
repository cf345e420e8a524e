"""What a failed Slack call means: Slack's error code read safely whatever came back (JSON, a
text/plain 503 page from a proxy, nothing at all), and whether trying again can help.

Slack answers most errors as HTTP 200 + `{"ok": false, "error": "..."}`; a 429 carries Retry-After;
a load balancer or proxy in front of Slack may answer 5xx (or a 404, a 408, an empty 200) with a
text body or none, which is no refusal of Slack's and is tried again; the network may drop the
connection (aiohttp's ServerDisconnectedError, which is no OSError); `files_upload_v2` raises
SlackRequestError when an upload URL answers other than 200.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError

# Slack's "not now" errors (their HTTP status may be 200): tried again with backoff.
TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
# Slack's answers to a token it does not accept.
TOKEN_ERRORS = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "not_allowed_token_type",
    }
)
NETWORK_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)


@dataclass(frozen=True)
class Failure:
    """Why one Slack call failed, and whether trying it again can help."""

    reason: str
    """For logs, bot.db and notes: Slack's error, the HTTP status and body, or the exception."""
    permanent: bool
    error: str | None = None
    """Slack's error code, when it gave one (e.g. not_in_channel)."""
    retry_after: float | None = None
    """A 429's Retry-After, in seconds."""
    unexpected: bool = False
    """An exception nobody foresaw (logged with its traceback; tried again like a transient one)."""

    @property
    def rate_limited(self) -> bool:
        return self.retry_after is not None


def failure_of(exc: BaseException) -> Failure:
    """Classify an exception raised by a Slack call."""
    if isinstance(exc, SlackApiError):
        return _api_failure(exc)
    if isinstance(exc, SlackRequestError):
        # files_upload_v2: an upload URL answered other than 200; the next try gets a new URL.
        return Failure(str(exc), permanent=False)
    if isinstance(exc, TimeoutError):  # the session's deadline (bot/slack_client.py)
        return Failure("no answer from Slack in time (GOALTENDER_SLACK_TIMEOUT_S)", permanent=False)
    if isinstance(exc, NETWORK_ERRORS):
        return Failure(_exception_text(exc), permanent=False)
    return Failure(_exception_text(exc), permanent=False, unexpected=True)


def api_error(exc: SlackApiError) -> str | None:
    """Slack's error code in a failed answer (None when the body was not Slack's JSON)."""
    data = exc.response.data
    return data.get("error") if isinstance(data, dict) else None


def _api_failure(exc: SlackApiError) -> Failure:
    status = exc.response.status_code
    error = api_error(exc)
    if status == 429 or error == "ratelimited":
        retry_after = retry_after_of(exc.response.headers)
        return Failure(
            f"rate limited (HTTP 429, Retry-After {retry_after:g}s)",
            permanent=False,
            error="ratelimited",
            retry_after=retry_after,
        )
    said = error or _body_snippet(exc.response.data)
    reason = said if status == 200 else f"HTTP {status}: {said}"
    # Only Slack's own refusal is for good. An answer with no error code in it (an empty 200, a
    # proxy's 404 or 408 page) says nothing about the write: tried again, as a 5xx is.
    permanent = error is not None and status < 500 and error not in TRANSIENT_ERRORS
    return Failure(reason, permanent=permanent, error=error)


def retry_after_of(headers: Mapping[str, Any] | None) -> float:
    """Seconds to wait, from a Retry-After header (1 when it is missing or unreadable)."""
    for name, value in (headers or {}).items():
        if name.lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except (TypeError, ValueError):
                return 1.0
    return 1.0


def _body_snippet(data: Any) -> str:
    if isinstance(data, bytes):
        return f"{len(data)} bytes"
    text = data if isinstance(data, str) else json.dumps(data)
    text = " ".join(text.split())
    return (text[:120] + "…" if len(text) > 120 else text) or "no body"


def _exception_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
