"""What the runner answers to reads: a goal's status (one SQL path, RunnerStore.ledgers, for one
goal and for a list), its summary, a run's log in chunks, an evaluation's artifact, a metric series,
the goals' disk usage and the audit trail. None of them changes runner.db.

A log and an artifact are read from the agent's workspace without following a link it left there
(runner/supervisor.py's `read_beneath`), and leave through the runner's redactor: a log chunk never
ends inside a secret (Redactor.uncut), an artifact is redacted before base64 hides it.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import datetime
from pathlib import Path

from goaltender.protocol import messages as p
from goaltender.runner.campaign import Campaigns
from goaltender.runner.disk_usage import goal_usage
from goaltender.runner.report import goal_stop_status, summary_text
from goaltender.runner.secrets import Redactor
from goaltender.runner.server import Handler, Refused
from goaltender.runner.supervisor import read_beneath, read_chunk_beneath
from goaltender.runner.trust import Principal
from goaltender.storage.records import Goal, utcnow
from goaltender.storage.runner_rows import Ledger
from goaltender.storage.runner_store import RunnerStore


class Reads:
    """The read requests' handlers, over the store and the goals as their campaigns see them."""

    def __init__(self, store: RunnerStore, campaigns: Campaigns, redactor: Redactor):
        self.store = store
        self.campaigns = campaigns
        self.redactor = redactor

    def handlers(self) -> dict[type[p.Request], Handler]:
        return {
            p.Status: self.on_status,
            p.Summary: self.on_summary,
            p.GetLog: self.on_get_log,
            p.GetArtifact: self.on_get_artifact,
            p.GetSeries: self.on_get_series,
            p.DiskUsage: self.on_disk_usage,
            p.Audit: self.on_audit,
        }

    async def on_status(self, req: p.Status, who: Principal) -> p.Reply:
        if req.goal_id is not None:
            await self.campaigns.records.goal(req.goal_id)
            return p.StatusReply(goals=[await self.status(req.goal_id)])
        # A handful of queries for all the goals together: a long history costs no query per goal.
        goals = await self.store.list_goals(active_only=req.active_only, limit=req.limit, before=req.before)
        ledgers = await self.store.ledgers([goal.id for goal in goals])
        now = utcnow()
        goals = [self.campaigns.records.as_it_stands(goal) for goal in goals]
        return p.StatusReply(goals=[_goal_status(goal, ledgers[goal.id], now) for goal in goals])

    async def on_summary(self, req: p.Summary, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.goal(req.goal_id)
        experiments = await self.store.experiments(goal.id)
        ledger, now = (await self.store.ledgers([goal.id]))[goal.id], utcnow()
        fetches = await self.store.hub_fetches(goal.id)
        text = summary_text(goal, experiments, ledger, now, goal.end_reason, fetches=fetches)
        return p.SummaryReply(status=_goal_status(goal, ledger, now), ledger=experiments, text=text)

    async def on_get_log(self, req: p.GetLog, who: Principal) -> p.Reply:
        if (location := await self.store.log_location(req.experiment_id)) is None:
            raise Refused("not_found", f"no experiment #{req.experiment_id}")
        workspace, log_path = location
        reach = self.redactor.reach + _UTF8_TAIL
        try:  # the log is in the agent's workspace: never read through a link it left there
            # Around the chunk: what a secret cut by its edges may span (and 1 byte more after it,
            # to tell the end of the file).
            before, data, after = read_chunk_beneath(
                workspace, log_path, req.offset, req.limit, reach + 1, behind=reach
            )
        except OSError as exc:
            raise Refused(
                "not_found", f"experiment #{req.experiment_id}'s log cannot be read: {exc}"
            ) from exc
        # A chunk starts and ends on a character (the first byte at or after its offset, and its
        # end, that does not continue a UTF-8 character), and never inside a secret (the end of
        # the one there: Redactor.uncut). Chunks asked for at any offsets and sizes thus tile the
        # file with nothing cut in two, so requests may be pipelined (RunnerClient.fetch_log), and
        # no piece of a secret leaves on its own.
        pieces = (before, data, after)
        start = self._uncut(pieces, _char_start(_span(pieces, 0, _UTF8_TAIL), 0) if req.offset else 0)
        end = max(start, self._uncut(pieces, len(data) + _char_start(after, 0)))
        eof = len(after) <= end - len(data)  # nothing after the chunk's end
        if (start, end) != (0, len(data)):
            data = _span(pieces, start, end)
        reply = p.LogReply(
            text="" if req.raw else data.decode(errors="replace"),
            offset=req.offset + start,
            next_offset=req.offset + start + len(data),
            eof=eof,
            raw_bytes=0 if req.raw else None,  # the connection counts them once they are redacted
        )
        if req.raw:
            reply._chunk = data
        return reply

    def _uncut(self, pieces: tuple[bytes, bytes, bytes], at: int) -> int:
        """Where a chunk's edge at `at` (of pieces[1], the chunk read) goes: Redactor.uncut."""
        reach = self.redactor.reach
        low = max(at - reach, -len(pieces[0]))
        return low + self.redactor.uncut(_span(pieces, low, at + reach), at - low)

    async def on_get_artifact(self, req: p.GetArtifact, who: Principal) -> p.Reply:
        experiment = await self.store.get_experiment(req.experiment_id)
        if experiment is None:
            raise Refused("not_found", f"no experiment #{req.experiment_id}")
        goal = await self.campaigns.records.goal(experiment.goal_id)
        path = Path(experiment.log_path).parent / req.name
        try:  # in the agent's workspace: never read through a link it left there
            data = read_beneath(Path(goal.workspace), path, 0, p.MAX_ARTIFACT_BYTES + 1)
        except (OSError, ValueError) as exc:  # ValueError: a log path outside the workspace
            raise Refused(
                "not_found", f"experiment #{experiment.id}'s {req.name} cannot be read: {exc}"
            ) from exc
        if not data:
            raise Refused("not_found", f"experiment #{experiment.id} has no {req.name}")
        if len(data) > p.MAX_ARTIFACT_BYTES:
            raise Refused(
                "bad_request",
                f"experiment #{experiment.id}'s {req.name} is over {p.MAX_ARTIFACT_BYTES} bytes",
            )
        # Base64 hides the file from the redaction every line gets on its way out: redacted here.
        data = self.redactor.redact_file(data)
        return p.ArtifactReply(name=req.name, data=base64.b64encode(data).decode())

    async def on_get_series(self, req: p.GetSeries, who: Principal) -> p.Reply:
        points = await self.store.metric_series(req.goal_id, req.name, req.experiment_id)
        if len(points) > p.MAX_SERIES_POINTS:
            last = len(points) - 1
            points = [points[i * last // (p.MAX_SERIES_POINTS - 1)] for i in range(p.MAX_SERIES_POINTS)]
        return p.SeriesReply(name=req.name, points=points)

    async def on_disk_usage(self, req: p.DiskUsage, who: Principal) -> p.Reply:
        goals = (
            [await self.campaigns.records.goal(req.goal_id)]
            if req.goal_id
            else [
                self.campaigns.records.as_it_stands(goal) for goal in await self.store.list_goals(limit=200)
            ]
        )

        def measure() -> list[p.GoalDisk]:
            found = []
            for goal in goals:
                usage = goal_usage(Path(goal.workspace))
                found.append(
                    p.GoalDisk(goal_id=goal.id, state=goal.state, total=usage.total, lines=usage.lines())
                )
            return sorted(found, key=lambda g: -g.total)

        return p.DiskUsageReply(
            free=self.campaigns.disk.free_space().free_bytes, goals=await asyncio.to_thread(measure)
        )

    async def on_audit(self, req: p.Audit, who: Principal) -> p.Reply:
        entries = await self.store.audit_entries(req.goal_id, req.limit)
        if not entries and req.goal_id is not None:
            await self.campaigns.records.goal(
                req.goal_id
            )  # a goal id mistyped is said so, not "(no entries)"
        return p.AuditReply(entries=entries)

    async def statuses(self, goal_ids: list[int]) -> list[p.GoalStatus]:
        """The status of each of these goals that is still on record (what a `statuses` message
        carries): the same SQL as a list's."""
        goals = [goal for goal_id in goal_ids if (goal := await self.store.get_goal(goal_id)) is not None]
        ledgers, now = await self.store.ledgers([goal.id for goal in goals]), utcnow()
        return [
            _goal_status(self.campaigns.records.as_it_stands(goal), ledgers[goal.id], now) for goal in goals
        ]

    async def status(self, goal_id: int) -> p.GoalStatus:
        """The goal's status, by the same SQL as a list's (RunnerStore.ledgers): one path."""
        goal = await self.campaigns.records.goal(goal_id)
        ledgers = await self.store.ledgers([goal_id])
        return _goal_status(goal, ledgers[goal_id], utcnow())


def _goal_status(goal: Goal, ledger: Ledger, now: datetime) -> p.GoalStatus:
    return p.GoalStatus(
        goal=goal,
        attempted=ledger.attempted,
        compute_hours_used=ledger.compute_hours_used,
        tokens_used=ledger.tokens_used,
        best=ledger.best,
        running=ledger.running,
        pending_approvals=ledger.pending_approvals,
        stop_status=goal_stop_status(
            goal,
            ledger.attempted,
            ledger.compute_hours_used,
            ledger.best,
            now,
            tokens_used=ledger.tokens_used,
        ),
    )


_UTF8_TAIL = 3  # continuation bytes a UTF-8 character may have


def _span(pieces: tuple[bytes, bytes, bytes], start: int, end: int) -> bytes:
    """Bytes [start, end) of what was read around a chunk (before it, it, after it), counted from
    the chunk's first byte."""
    out = b""
    base = -len(pieces[0])
    for piece in pieces:
        low, high = max(start - base, 0), min(end - base, len(piece))
        if low < high:
            out += piece[low:high]
        base += len(piece)
    return out


def _char_start(data: bytes, at: int) -> int:
    """The first index at or after `at` that is not a UTF-8 continuation byte (at most 3 on: bytes
    that are no UTF-8 stay bytes); len(data) when the data ends first."""
    for index in range(at, min(at + _UTF8_TAIL, len(data))):
        if data[index] & 0xC0 != 0x80:
            return index
    return min(at + _UTF8_TAIL, len(data))
