"""Bot configuration: `GOALTENDER_*` environment variables (or a TOML file named by GOALTENDER_CONFIG),
plus Slack's two tokens under their usual names, SLACK_BOT_TOKEN and SLACK_APP_TOKEN.

Lists and runners are JSON in the environment, e.g.
`GOALTENDER_GOAL_CHANNELS='["C0123"]'`, `GOALTENDER_APPROVERS='["U0ANA"]'`,
`GOALTENDER_RUNNERS='[{"name": "gpu1", "host": "gpu1", "username": "ml", ...}]'`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import (
    SettingsConfigDict,
)

from goaltender.bot.transports import RunnerTarget
from goaltender.runner.config import GoaltenderSettings

TOKEN_VARIABLES = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN")
HTTP_VARIABLES = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET")


def _default_home() -> Path:
    return Path.home() / ".goaltender"


class BotSettings(GoaltenderSettings):
    model_config = SettingsConfigDict(env_prefix="GOALTENDER_", extra="ignore", populate_by_name=True)

    home: Path = Field(default_factory=_default_home)
    """Where bot.db lives by default (the same GOALTENDER_HOME the runner uses)."""
    db: Path | None = None
    """bot.db's path; default <home>/bot.db."""
    runners: list[RunnerTarget] = Field(default_factory=list)
    """The runners goals go to; default: one local runner ("local") at the default socket."""
    goal_channels: list[str] = Field(default_factory=list)
    """Channel ids where every new top-level message is a goal."""
    approvers: list[str] = Field(default_factory=list)
    """Slack user ids who may decide any approval (besides each goal's owner)."""
    slack_api_url: str | None = None
    """Slack Web API base URL (tests point it at a fake Slack); default Slack's own."""
    outbox_interval_s: float = Field(default=1.0, ge=0)
    """Minimum time between two writes to one channel (Slack allows about one per second)."""
    slack_bot_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SLACK_BOT_TOKEN", "slack_bot_token")
    )
    slack_app_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SLACK_APP_TOKEN", "slack_app_token")
    )
    slack_mode: Literal["socket", "http"] = "socket"
    """How Slack reaches the bot: Socket Mode (no public URL needed), or HTTP request URLs."""
    http_host: str = "0.0.0.0"
    http_port: int = Field(default=3000, ge=0, le=65535)
    """HTTP mode: where to listen; Slack posts events, commands and clicks to /slack/events."""
    slack_signing_secret: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SLACK_SIGNING_SECRET", "slack_signing_secret")
    )
    """HTTP mode: every request's signature is verified with it (Basic Information -> Signing Secret)."""

    @property
    def db_path(self) -> Path:
        return self.db or self.home / "bot.db"

    def runner_targets(self) -> list[RunnerTarget]:
        if self.runners:
            return list(self.runners)
        socket = os.environ.get("GOALTENDER_SOCKET")
        return [RunnerTarget(name="local", socket=Path(socket) if socket else self.home / "runner.sock")]

    def missing_tokens(self) -> list[str]:
        """The names of the token variables this mode needs that are unset (or empty)."""
        missing = []
        if self.slack_mode == "http":
            needed = zip(HTTP_VARIABLES, (self.slack_bot_token, self.slack_signing_secret), strict=True)
        else:
            needed = zip(TOKEN_VARIABLES, (self.slack_bot_token, self.slack_app_token), strict=True)
        for name, value in needed:
            if value is None or not value.get_secret_value().strip():
                missing.append(name)
        return missing
