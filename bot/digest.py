"""Digest schedules: `/goal digest daily 09:00 Europe/Berlin`, `/goal digest every 4h`, `/goal digest off`.

Schedules live in bot.db (the `digests` table); APScheduler 3.x only holds them in memory and is
rebuilt from the table at every start. A digest missed while the bot was down is sent once when it
comes back: the job's first run is the first fire time after the last digest sent, and APScheduler
coalesces every missed run into one (no misfire limit, so a long outage still gets its catch-up).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from goaltender.storage.bot_store import Digest

log = logging.getLogger("goaltender.bot.digest")

MIN_INTERVAL = timedelta(minutes=15)  # more often than this is noise, not a digest
HOWTO = (
    "Digest schedules for this channel: `/goal digest daily 09:00 Europe/Berlin`, "
    "`/goal digest weekdays 08:30 UTC`, `/goal digest every 4h`, `/goal digest off`, "
    "`/goal digest` (show it), `/goal digest now` (send one now)."
)
_DAILY = re.compile(r"^(daily|weekdays)\s+(\d{1,2}):(\d{2})(?:\s+(\S+))?$", re.I)
_EVERY = re.compile(r"^every\s+((?:\d+\s*[hm]\s*)+)$", re.I)
_PART = re.compile(r"(\d+)\s*([hm])", re.I)


@dataclass(frozen=True)
class DigestCommand:
    action: Literal["show", "off", "now", "set"]
    spec: str | None = None  # normalised, for "set": `daily 09:00 Europe/Berlin` or `every 4h`


def parse_command(text: str) -> DigestCommand:
    """The words after `/goal digest`; ValueError with how to fix it when they make no schedule."""
    words = " ".join(text.split())
    if words.lower() in ("", "show", "status"):
        return DigestCommand("show")
    if words.lower() in ("off", "stop", "none"):
        return DigestCommand("off")
    if words.lower() == "now":
        return DigestCommand("now")
    if match := _DAILY.match(words):
        kind, hour, minute, zone = (
            match.group(1).lower(),
            int(match.group(2)),
            int(match.group(3)),
            match.group(4),
        )
        if hour > 23 or minute > 59:
            raise ValueError(f"`{hour}:{minute:02d}` is not a time of day. {HOWTO}")
        zone = zone or "UTC"
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"I don't know the time zone `{zone}`; use an IANA name like Europe/Berlin or UTC. {HOWTO}"
            ) from None
        return DigestCommand("set", f"{kind} {hour:02d}:{minute:02d} {zone}")
    if match := _EVERY.match(words):
        total = timedelta()
        for amount, unit in _PART.findall(match.group(1)):
            total += timedelta(hours=int(amount)) if unit.lower() == "h" else timedelta(minutes=int(amount))
        if total < MIN_INTERVAL:
            raise ValueError(f"A digest at most every {_span(MIN_INTERVAL)}, please. {HOWTO}")
        return DigestCommand("set", f"every {_span(total)}")
    raise ValueError(f"I could not read a digest schedule in `{words}`. {HOWTO}")


def _span(delta: timedelta) -> str:
    hours, rest = divmod(int(delta.total_seconds()) // 60, 60)
    return (f"{hours}h" if hours else "") + (f"{rest}m" if rest or not hours else "")


def trigger_for(spec: str, anchor: datetime) -> BaseTrigger:
    """The APScheduler trigger for a normalised spec; interval schedules count from `anchor`."""
    kind, _, rest = spec.partition(" ")
    if kind == "every":
        seconds = sum(int(amount) * (3600 if unit == "h" else 60) for amount, unit in _PART.findall(rest))
        return IntervalTrigger(
            seconds=seconds, start_date=anchor + timedelta(seconds=seconds), timezone="UTC"
        )
    at, zone = rest.split(" ")
    hour, minute = (int(part) for part in at.split(":"))
    days = "mon-fri" if kind == "weekdays" else "*"
    return CronTrigger(day_of_week=days, hour=hour, minute=minute, timezone=ZoneInfo(zone))


def describe(digest: Digest, next_run: datetime | None) -> str:
    when = f"; next one {next_run:%a %d %b %H:%M %Z}" if next_run else ""
    return f"`{digest.spec}`{when}"


class DigestScheduler:
    """One APScheduler job per channel with a digest, rebuilt from bot.db rows."""

    def __init__(self, send: Callable[[str], Awaitable[None]]):
        self._send = send
        self.scheduler = AsyncIOScheduler(timezone="UTC")

    def start(self, digests: list[Digest]) -> None:
        """Must run inside the event loop (APScheduler binds to the running loop)."""
        for digest in digests:
            self.schedule(digest)
        self.scheduler.start()

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def schedule(self, digest: Digest) -> datetime | None:
        """(Re)schedule a channel's digest; returns its next run time (in the past: due now)."""
        since = digest.last_sent_at or digest.created_at
        trigger = trigger_for(digest.spec, digest.created_at)
        first = trigger.get_next_fire_time(None, since)
        job = self.scheduler.add_job(
            self._run,
            trigger,
            args=[digest.channel],
            id=_job_id(digest.channel),
            replace_existing=True,
            coalesce=True,  # several missed runs are one digest
            misfire_grace_time=None,  # and it is sent however late the bot came back
            max_instances=1,
            next_run_time=first,
        )
        return job.next_run_time

    def cancel(self, channel: str) -> None:
        if self.scheduler.get_job(_job_id(channel)) is not None:
            self.scheduler.remove_job(_job_id(channel))

    def next_run(self, channel: str) -> datetime | None:
        job = self.scheduler.get_job(_job_id(channel))
        return job.next_run_time if job is not None else None

    async def _run(self, channel: str) -> None:
        try:
            await self._send(channel)
        except Exception:
            log.exception("the digest for %s failed", channel)


def _job_id(channel: str) -> str:
    return f"digest:{channel}"
