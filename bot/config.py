"""Bot configuration: `GOALTENDER_*` environment variables (or a TOML file named by GOALTENDER_CONFIG),
plus Slack's two tokens under their usual names, SLACK_BOT_TOKEN and SLACK_APP_TOKEN.

Lists and runners are JSON in the environment, e.g.
`GOALTENDER_GOAL_CHANNELS='["C0123"]'`, `GOALTENDER_APPROVERS='["U0ANA"]'`,
`GOALTENDER_RUNNERS='[{"name": "gpu1", "host": "gpu1", "username": "ml", ...}]'`,
`GOALTENDER_ROLES='{"C0123": {"starters": ["U0ANA", "U0BEN"], "controllers": ["everyone"]}}'`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator
from pydantic_settings import (
    SettingsConfigDict,
)

from goaltender.bot.budget_size import Threshold
from goaltender.bot.transports import RunnerTarget
from goaltender.runner.config import GoaltenderSettings

TOKEN_VARIABLES = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN")
HTTP_VARIABLES = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET")


def _default_home() -> Path:
    return Path.home() / ".goaltender"


class ChannelRoles(BaseModel):
    """One channel's roles (`GOALTENDER_ROLES`: channel id, or "*" for every channel, -> these).
    Each list holds Slack user ids, or "everyone"; a role left out keeps its default."""

    model_config = {"extra": "forbid"}

    starters: list[str] | None = None
    """Who may start goals here (default: everyone)."""
    approvers: list[str] | None = None
    """Who decides approvals and controls every goal here (default: GOALTENDER_APPROVERS)."""
    controllers: list[str] | None = None
    """Who else may stop, pause, resume, steer and change the budget of any goal here (default: nobody)."""
    admins: list[str] | None = None
    """Who may change this channel's roles with `/goal admin` (besides workspace admins and GOALTENDER_ADMINS)."""
    budget_second_person: str | None = None
    """Budget increases above this size need a second person here (default: GOALTENDER_BUDGET_SECOND_PERSON)."""

    @field_validator("budget_second_person")
    @classmethod
    def _threshold(cls, value: str | None) -> str | None:
        if value is not None:
            Threshold.parse(value)  # ValueError says how to write one
        return value


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
    """Slack user ids who decide approvals and control goals in every channel (besides each goal's
    owner), unless a channel's roles say otherwise."""
    admins: list[str] = Field(default_factory=list)
    """Slack user ids who may run `/goal admin` in every channel (workspace admins and owners always may)."""
    roles: dict[str, ChannelRoles] = Field(default_factory=dict)
    """Per channel id (or "*" for every channel): who starts, approves, controls, administers."""
    budget_second_person: str | None = None
    """A budget increase above this size needs a second person: `1h` (time or compute-hours added),
    `50%` (of a limit), `0` (every increase), or unset / `off` (none)."""
    max_file_mb: float = Field(default=25.0, gt=0)
    """The largest file (MB) the bot takes from a goal's thread into the goal's inputs/ (a paper
    attached there); larger ones get a note in the thread. The runner has its own cap
    (GOALTENDER_MAX_INPUT_MB), checked again there."""
    slack_api_url: str | None = None
    """Slack Web API base URL (tests point it at a fake Slack); default Slack's own."""
    slack_timeout_s: float = Field(default=30.0, gt=0)
    """The deadline of every Slack Web API call: one Slack takes and never answers ends after this
    (a write is then tried again), and holds up only its own channel."""
    outbox_interval_s: float = Field(default=1.0, ge=0)
    """Minimum time between two writes to one channel (Slack allows about one per second)."""
    outbox_max_attempts: int = Field(default=8, ge=1)
    """A write that fails this many times (5xx, dropped connections, ...; 429s do not count) is
    parked, with a note in its goal's thread saying what was not delivered and why."""
    outbox_backoff_s: float = Field(default=0.5, gt=0)
    """The first wait before a failed write is tried again; it doubles with every try (plus jitter)..."""
    outbox_backoff_cap_s: float = Field(default=60.0, gt=0)
    """... up to this."""
    retention_days: int = Field(default=90, ge=0, le=100_000)
    """Delivered posts of goals that ended this many days ago are dropped from bot.db (each goal's
    card is kept, so a reply in its thread still finds it; bot/pruning.py); 0 keeps all."""
    prune_every_s: float = Field(default=86_400.0, gt=0)
    """How often the bot prunes (the first time a minute after it starts)."""
    health_log_interval_s: float = Field(default=300.0, gt=0)
    """The bot logs its health this often, and whenever it changes."""
    bot_metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve Prometheus metrics on this port (bot/monitoring.py; 0: any free port, logged); unset:
    no endpoint. Its own variable, so a bot and a runner on one box can share an environment."""
    bot_metrics_address: str = "127.0.0.1"
    """Where the metrics endpoint listens: this machine alone by default; 0.0.0.0 for every interface."""
    log_format: Literal["text", "json"] = "text"
    """The bot's log on stderr: lines of text, or one JSON object a line (runner/logs.py)."""
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

    @field_validator("budget_second_person")
    @classmethod
    def _threshold(cls, value: str | None) -> str | None:
        if value is not None:
            Threshold.parse(value)
        return value

    @field_validator("runners")
    @classmethod
    def _distinct_names(cls, runners: list[RunnerTarget]) -> list[RunnerTarget]:
        # A runner's name keys its goals and its cursor in bot.db: two alike would mix them up.
        names = [runner.name for runner in runners]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(
                f"two runners are both named {', '.join(map(repr, twice))}; give each its own name"
            )
        return runners

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
