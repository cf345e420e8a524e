"""The bot's health: who it is in Slack and when a write last got through, its links to the
runners, and its outbox (writes waiting, writes parked). As data and as text: logged every
`health_log_interval_s` and whenever it changes (a runner link goes up or down, a write is parked,
the outbox gets stuck or unstuck), shown by `/goal health`, and checked from outside, without
the bot running, by `check()` (`goaltender bot --check`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot import render
from goaltender.bot.config import BotSettings
from goaltender.bot.links import RunnerPool
from goaltender.bot.outbox import Outbox
from goaltender.bot.slack_client import slack_session
from goaltender.bot.slack_errors import failure_of
from goaltender.bot.tokens import SlackIdentity, TokenRefused, check_app_token, check_bot_token
from goaltender.bot.transports import LINK_ERRORS, error_reason, open_client
from goaltender.storage.bot_store import BotStore, OutboxItem
from goaltender.storage.records import utcnow

log = logging.getLogger("goaltender.bot.health")

STUCK_AFTER_S = 60.0  # writes waiting, and none delivered for this long: the outbox is stuck
LOOK_EVERY_S = 5.0  # how often the watcher looks for a change
RUNNER_CHECK_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class RunnerHealth:
    name: str
    up: bool
    why_down: str | None = None
    connected_since: datetime | None = None

    def describe(self) -> str:
        if self.up:
            since = f" since {self.connected_since:%Y-%m-%d %H:%M} UTC" if self.connected_since else ""
            return f"{self.name} up{since}"
        return f"{self.name} down ({self.why_down or 'connecting'})"


@dataclass(frozen=True)
class Health:
    slack: str
    """Who the bot is in Slack (from auth.test)."""
    runners: list[RunnerHealth]
    waiting: int
    """Writes queued for Slack, not yet delivered."""
    parked: int
    """Writes given up on (each left a note where it was going)."""
    last_delivered_at: datetime | None
    """When Slack last took a write from this process."""
    recent_parked: list[str] = field(default_factory=list)

    @property
    def stuck(self) -> bool:
        """Writes are waiting and none has got through for a while."""
        if not self.waiting:
            return False
        return self.last_delivered_at is None or self._age(self.last_delivered_at) > STUCK_AFTER_S

    def state(self) -> tuple[Any, ...]:
        """What a change of is worth a log line."""
        return (tuple((r.name, r.up) for r in self.runners), self.parked, self.stuck)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stuck"] = self.stuck
        return data

    def summary(self) -> str:
        """One line, for the log."""
        runners = ", ".join(r.describe() for r in self.runners)
        return (
            f"runners: {runners}; outbox: {self.waiting} waiting, {self.parked} parked"
            f"{' (stuck)' if self.stuck else ''}; last write delivered {self._when(self.last_delivered_at)}"
        )

    def text(self) -> str:
        """For `/goal health` (mrkdwn)."""
        lines = [
            "*Goaltender health*",
            f"Slack: {self.slack}; last write delivered {self._when(self.last_delivered_at)}",
            "Runners: " + " · ".join(r.describe() for r in self.runners),
            f"Outbox: {self.waiting} waiting, {self.parked} parked"
            + (" — stuck: nothing delivered for over a minute" if self.stuck else ""),
        ]
        lines += [f"  parked: {line}" for line in self.recent_parked]
        return render.escape("\n".join(lines))

    def _when(self, at: datetime | None) -> str:
        return "never (since start)" if at is None else f"{self._age(at):.0f}s ago"

    @staticmethod
    def _age(at: datetime) -> float:
        return (utcnow() - at).total_seconds()


def describe_parked(item: OutboxItem) -> str:
    return f"#{item.id} {item.kind} {item.dedupe_key or 'unkeyed'} to {item.channel}: {item.error}"


class HealthMonitor:
    """The running bot's health, and a watcher that logs it."""

    def __init__(self, store: BotStore, pool: RunnerPool, outbox: Outbox, *, log_every_s: float = 300.0):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.log_every = log_every_s
        self.identity: SlackIdentity | None = None
        """Who the bot is in Slack, once its token was checked."""

    async def report(self) -> Health:
        return Health(
            slack=self.identity.describe() if self.identity else "token not checked yet",
            runners=[
                RunnerHealth(link.name, link.healthy, link.last_error, link.connected_since)
                for link in self.pool
            ],
            waiting=await self.store.pending_count(),
            parked=await self.store.failed_count(),
            last_delivered_at=self.outbox.last_sent_at,
            recent_parked=[describe_parked(item) for item in await self.store.failed_writes(3)],
        )

    async def watch(self) -> None:
        """Log the health now, every `log_every` seconds, and whenever it changes; a failure to
        look is logged and looked at again (the watcher lasts as long as the bot)."""
        last_state: tuple[Any, ...] | None = None
        last_logged = 0.0
        while True:
            await asyncio.sleep(min(LOOK_EVERY_S, self.log_every))  # (first: let the links connect)
            try:
                health = await self.report()
            except Exception:
                log.exception("health: could not look")
            else:
                changed = health.state() != last_state
                if changed or time.monotonic() - last_logged >= self.log_every:
                    level = (
                        logging.WARNING
                        if health.stuck or not all(r.up for r in health.runners)
                        else logging.INFO
                    )
                    log.log(
                        level, "health%s: %s", " changed" if changed and last_state else "", health.summary()
                    )
                    last_state, last_logged = health.state(), time.monotonic()


# ---- `goaltender bot --check` ----


@dataclass
class CheckResult:
    exit_code: int
    """0: everything answered; 1: a token was refused, Slack or a runner could not be reached."""
    text: str
    problems: list[str] = field(default_factory=list)


async def check(settings: BotSettings) -> CheckResult:
    """Check, from outside the bot: Slack's tokens (auth.test, and apps.connections.open in Socket
    Mode), every runner (connect and say hello), and bot.db's outbox (writes waiting and parked).
    Parked writes are listed but are no failure (each left a note where it was going)."""
    lines: list[str] = []
    problems: list[str] = []
    if missing := settings.missing_tokens():
        problems.append(f"{' and '.join(missing)} not set")
    else:
        await _check_slack(settings, lines, problems)
    for target in settings.runner_targets():
        try:
            client = await asyncio.wait_for(open_client(target, "goaltender-check"), RUNNER_CHECK_TIMEOUT_S)
        except LINK_ERRORS as exc:
            problems.append(f"runner {target.name} ({target.describe()}) unreachable: {error_reason(exc)}")
            continue
        lines.append(
            f"runner {target.name}: reachable ({target.describe()}, calls itself {client.runner_name}"
            + (f", database {client.runner_id})" if client.runner_id else ")")
        )
        await client.close()
    await _check_outbox(settings, lines)
    lines += [f"PROBLEM: {problem}" for problem in problems]
    lines.append("bot check: " + ("OK" if not problems else f"{len(problems)} problem(s)"))
    return CheckResult(1 if problems else 0, "\n".join(lines) + "\n", problems)


async def _check_slack(settings: BotSettings, lines: list[str], problems: list[str]) -> None:
    assert settings.slack_bot_token is not None  # (missing_tokens said so)
    kwargs: dict[str, Any] = {"token": settings.slack_bot_token.get_secret_value()}
    if settings.slack_api_url:
        kwargs["base_url"] = settings.slack_api_url
    async with slack_session(settings.slack_timeout_s) as session:  # bounded: Slack may hang
        client = AsyncWebClient(session=session, **kwargs)
        try:
            identity = await check_bot_token(client)
            lines.append(f"Slack: SLACK_BOT_TOKEN accepted: {identity.describe()}")
            if settings.slack_mode == "socket" and settings.slack_app_token is not None:
                await check_app_token(client, settings.slack_app_token.get_secret_value())
                lines.append("Slack: SLACK_APP_TOKEN accepted (Socket Mode)")
        except TokenRefused as refused:
            problems.append(str(refused))
        except Exception as exc:
            problems.append(f"Slack could not be reached at {client.base_url}: {failure_of(exc).reason}")


async def _check_outbox(settings: BotSettings, lines: list[str]) -> None:
    if not settings.db_path.exists():
        lines.append(f"bot.db: none yet at {settings.db_path}")
        return
    store = await BotStore.open(settings.db_path)
    try:
        waiting, parked = await store.pending_count(), await store.failed_count()
        lines.append(f"bot.db: {waiting} write(s) waiting for Slack, {parked} parked")
        lines += [f"  parked: {describe_parked(item)}" for item in await store.failed_writes(5)]
    finally:
        await store.close()
