"""Digests: a channel's goals summed up on a schedule — `/goal digest daily 09:00 Europe/Berlin`,
`/goal digest every 4h`, `/goal digest off`, `/goal digest now`.

A digest lists the channel's active goals (with budget, best result and its trend, last
milestone), the approvals waiting (linked to their prompts), the goals finished since the last
digest, and one plot of every goal's best result so far.

Schedules live in bot.db (the `digests` table); APScheduler 3.x only holds them in memory and is
rebuilt from the table at every start. A digest missed while the bot was down is sent once when it
comes back: the job's first run is the first fire time after the last digest sent, and APScheduler
coalesces every missed run into one (no misfire limit, so a long outage still gets its catch-up).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from goaltender.bot import queries, render
from goaltender.bot.keys import ApprovalKey, CardKey, DigestKey
from goaltender.bot.links import RunnerPool
from goaltender.bot.outbox import Outbox
from goaltender.display import plots
from goaltender.display.facts import budget_line, format_duration, format_metric
from goaltender.protocol import messages as p
from goaltender.storage.bot_store import BotStore, Digest, OutboxKind, Thread
from goaltender.storage.direction import best_of, better
from goaltender.storage.records import Experiment, utcnow

log = logging.getLogger("goaltender.bot.digest")

MIN_INTERVAL = timedelta(minutes=15)  # more often than this is noise, not a digest
MAX_INTERVAL = timedelta(days=30)  # rarer is no digest (and past a date's range, no schedule)
HOWTO = (
    "Digest schedules for this channel: `/goal digest daily 09:00 Europe/Berlin`, "
    "`/goal digest weekdays 08:30 UTC`, `/goal digest every 4h`, `/goal digest off`, "
    "`/goal digest` (show it), `/goal digest now` (send one now)."
)
_COMMAND = re.compile(r"^\s*(daily|weekdays|every|off|stop|none|now|show|status)\b", re.I)
_DAILY = re.compile(r"^(daily|weekdays)\s+(\d{1,2}):(\d{2})(?:\s+(\S+))?$", re.I)
_EVERY = re.compile(r"^every\s+((?:\d{1,7}\s*[hm]\s*)+)$", re.I)
_PART = re.compile(r"(\d+)\s*([hm])", re.I)


@dataclass(frozen=True)
class DigestCommand:
    action: Literal["show", "off", "now", "set"]
    spec: str | None = None  # normalised, for "set": `daily 09:00 Europe/Berlin` or `every 4h`


def command_words(text: str) -> str | None:
    """The words after `digest` when a /goal's text is a digest command, else None (a goal may
    well start with the word: "digest the OAPL paper and implement it")."""
    first, _, rest = text.partition(" ")
    if first.lower() == "digest" and (not rest.strip() or _COMMAND.match(rest)):
        return rest
    return None


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
        minutes = sum(
            int(n) * (60 if unit.lower() == "h" else 1) for n, unit in _PART.findall(match.group(1))
        )
        if minutes < MIN_INTERVAL.total_seconds() // 60:
            raise ValueError(f"A digest at most every {_span(MIN_INTERVAL)}, please. {HOWTO}")
        if minutes > MAX_INTERVAL.total_seconds() // 60:
            raise ValueError(f"A digest at least every {_span(MAX_INTERVAL)}, please. {HOWTO}")
        return DigestCommand("set", f"every {_span(timedelta(minutes=minutes))}")
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
            try:
                self.schedule(digest)
            except (ValueError, OverflowError) as exc:  # one bad row must not keep the bot from starting
                log.error("digest of %s (%r) not scheduled: %s", digest.channel, digest.spec, exc)
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


# ---- what a digest says ----

Series = list[tuple[float | None, float]]


@dataclass
class _Sections:
    """A digest's parts, filled goal by goal."""

    active: list[str] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    series: dict[str, Series] = field(default_factory=dict)  # per goal: best result so far
    metrics: set[str] = field(default_factory=set)


class Digests:
    """Each channel's digest: its schedule, set from Slack, and the digest itself."""

    def __init__(self, store: BotStore, pool: RunnerPool, outbox: Outbox, plots_dir: Path):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.plots_dir = plots_dir
        self.schedules = DigestScheduler(self.send)

    async def command(
        self, words: str, channel: str, user: str, reply: Callable[[str], Awaitable[None]]
    ) -> None:
        """`/goal digest ...`: show, set, turn off, or send now this channel's digest."""
        try:
            command = parse_command(words)
        except ValueError as exc:
            await reply(str(exc))
            return
        current = await self.store.digest(channel)
        if command.action == "show":
            if current is None:
                await reply(f"No digest is scheduled in this channel. {HOWTO}")
            else:
                when = describe(current, self.schedules.next_run(channel))
                await reply(f"This channel's digest: {when} (set by {render.user_ref(current.created_by)}).")
        elif command.action == "off":
            await self.store.set_digest(channel, None)
            self.schedules.cancel(channel)
            if current is None:
                await reply("No digest was scheduled in this channel.")
            else:
                await self._notice(channel, f"{render.user_ref(user)} turned this channel's digest off.")
                await reply("Digest turned off.")
        elif command.action == "now":
            await self.send(channel)
            await reply("Digest on its way.")
        else:
            assert command.spec is not None
            await self.store.set_digest(channel, command.spec, user)
            scheduled = await self.store.digest(channel)
            assert scheduled is not None
            when = describe(scheduled, self.schedules.schedule(scheduled))
            await self._notice(channel, f"{render.user_ref(user)} scheduled a digest here: {when}.")
            await reply(f"Digest scheduled: {when}.")

    async def _notice(self, channel: str, text: str) -> None:
        await self.outbox.enqueue(channel, "post", render.notice(text))

    async def send(self, channel: str) -> None:
        """Queue one digest of the channel's goals: active ones, pending approvals (linked), the
        ones finished since the last digest (the last day if none was sent), and one combined plot."""
        schedule = await self.store.digest(channel)
        now = utcnow()
        since = (schedule.last_sent_at or schedule.created_at) if schedule else now - timedelta(days=1)
        threads = await self.store.threads(channel=channel)
        runners = {t.runner for t in threads}
        active_now = {runner: await queries.active_goals(self.pool, runner) for runner in runners}
        sections = _Sections()
        for thread in threads:
            await self._add_goal(sections, thread, active_now[thread.runner], since, now)
        key = DigestKey(channel, now)
        title = f"Digest · {now:%a %d %b %H:%M} UTC"
        footer = f"Since {since:%a %d %b %H:%M} UTC · `/goal digest` shows the schedule, `/goal digest off` stops it"
        payload = render.digest(title, sections.active, sections.approvals, sections.finished, footer)
        writes: list[tuple[OutboxKind, dict, str | None]] = [("post", payload, str(key))]
        if sections.series:
            plot = await self._plot(sections, channel, now)
            writes.append(("upload", plot, str(DigestKey(channel, now, plot=True))))
        if schedule is not None:
            await self.store.digest_enqueued(channel, now, writes)
        else:
            for kind, write, write_key in writes:
                await self.store.enqueue(channel, kind, write, write_key)
        self.outbox.notify()

    async def _add_goal(
        self,
        sections: _Sections,
        thread: Thread,
        live: dict[int, p.GoalStatus] | None,
        since: datetime,
        now: datetime,
    ) -> None:
        """One goal's lines: `live` is its runner's active goals now (None: the runner is down)."""
        status = await self._status(thread, live, since)
        if status is None:
            return
        goal = status.goal
        if not goal.active and not (goal.ended_at and goal.ended_at > since):
            return
        link = await self.outbox.permalink(thread.channel, CardKey(thread.runner, thread.goal_id))
        name = f"<{link}|Goal #{goal.id}>" if link else f"Goal #{goal.id}"
        ledger = await queries.ledger(self.pool, thread.runner, goal.id) if live is not None else []
        best = _best_line(status, ledger, since)
        if goal.active:
            down = f" (runner *{thread.runner}* unreachable; last known)" if live is None else ""
            last = f" · last milestone: _{render.escape(thread.milestone[:200])}_" if thread.milestone else ""
            budget = budget_line(
                goal, attempted=status.attempted, compute_hours_used=status.compute_hours_used, now=now
            )
            sections.active.append(
                f"• {name} on {render.escape(thread.runner)}: *{goal.state.replace('_', ' ')}*{down} — "
                f"{render.escape(goal.text[:120])}\n    {budget} · {best}{last}"
            )
        else:
            why = f" ({render.people(goal.end_reason.splitlines()[0][:200])})" if goal.end_reason else ""
            sections.finished.append(f"• {name}: *{goal.state}*{why} — {best}")
        for approval in status.pending_approvals:
            plink = await self.outbox.permalink(
                thread.channel, ApprovalKey(thread.runner, goal.id, approval.id)
            )
            question = render.escape(approval.question[:200])
            asked = format_duration((now - approval.requested_at).total_seconds())
            label = f"<{plink}|#{approval.id}: {question}>" if plink else f"#{approval.id}: {question}"
            sections.approvals.append(f"• {label} (goal #{goal.id}, waiting {asked})")
        if goal.metric and (points := _best_so_far(ledger, goal.direction)):
            label = goal.text if len(goal.text) <= 32 else goal.text[:31].rsplit(" ", 1)[0] + "…"
            sections.series[f"#{goal.id} {label}"] = points
            sections.metrics.add(goal.metric)

    async def _status(
        self, thread: Thread, live: dict[int, p.GoalStatus] | None, since: datetime
    ) -> p.GoalStatus | None:
        """The goal's status for the digest: live, or asked for when it may have ended since the
        last digest, or the last one seen when its runner is down."""
        last = p.GoalStatus.model_validate(thread.status) if thread.status else None
        if live is None:
            return last
        status = live.get(thread.goal_id)
        if status is None and _may_have_ended_since(last, since):
            status = await queries.goal_status(self.pool, thread.runner, thread.goal_id)  # how, and when?
        return status

    async def _plot(self, sections: _Sections, channel: str, now: datetime) -> dict:
        """One plot of every goal's best result so far, ready to upload."""
        path = self.plots_dir / f"digest-{channel}-{now:%Y%m%dT%H%M%S}.png"
        ylabel = sections.metrics.pop() if len(sections.metrics) == 1 else "headline metric"
        await asyncio.to_thread(
            plots.plot_curves,
            sections.series,
            path,
            ylabel=ylabel,
            xlabel="experiment",
            title="Best result so far, per goal",
        )
        return {"file": str(path), "filename": path.name, "title": f"Campaigns in this channel — {ylabel}"}


def _best_line(status: p.GoalStatus, ledger: list[Experiment], since: datetime) -> str:
    """`best acc 85.9% (up from 62.5% at the last digest)`: the best result and its trend."""
    best = status.best
    if best is None or best.metric_value is None:
        return "no result yet"
    metric = best.metric_name or status.goal.metric
    text = (
        f"best #{best.index} {render.escape(metric or 'metric')} *{format_metric(metric, best.metric_value)}*"
    )
    earlier = [
        e.metric_value for e in ledger if e.ended_at and e.ended_at <= since and e.metric_value is not None
    ]
    if not ledger:
        return text
    if not earlier:
        return text + " (new since the last digest)"
    before = best_of(earlier, float, status.goal.direction)
    if before is None or before == best.metric_value:
        return text + " (unchanged since the last digest)"
    arrow = "↑" if best.metric_value > before else "↓"
    return text + f" ({arrow} from {format_metric(metric, before)} at the last digest)"


def _may_have_ended_since(last: p.GoalStatus | None, since: datetime) -> bool:
    """Whether a goal that is no longer active may have ended after `since` (worth asking about)."""
    if last is None or last.goal.active:
        return True
    return last.goal.ended_at is None or last.goal.ended_at > since


def _best_so_far(ledger: list[Experiment], direction: str) -> Series:
    """(experiment index, best metric so far) for a goal's finished experiments."""
    points: Series = []
    best: float | None = None
    for e in sorted(ledger, key=lambda e: e.index):
        if not e.finished or e.metric_value is None:
            continue
        if best is None or better(e.metric_value, best, direction):
            best = e.metric_value
        points.append((float(e.index), best))
    return points
