"""bot.db: what the Slack bot must not forget — where each goal's thread is, how far it has read
each runner's event log, the outbox of Slack writes not yet confirmed, goals waiting for a runner,
digest schedules, each channel's roles as set from Slack, budget increases waiting for a second
person, every goal's milestones, and the audit trail of what was decided in Slack
(storage/bot_audit.py).

The runner's events arrive at least once; storing an event's `seq` together with the outbox rows
it produced, in one transaction, makes the bot's side exactly once. The tables and the rows
handed out are storage/bot_schema.py's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from goaltender.storage.bot_audit import BotAudit
from goaltender.storage.bot_schema import (
    MIGRATIONS,
    RUNNER_TABLES,
    BudgetRequest,
    ChannelSetting,
    Digest,
    Milestone,
    OutboxItem,
    OutboxKind,
    QueuedGoal,
    Thread,
)
from goaltender.storage.db import Database, Tx
from goaltender.storage.records import utcnow


@dataclass(frozen=True)
class KeyMove:
    """How outbox keys go from one runner name to another: bot/keys.py knows their shape."""

    prefix: str
    """The stored text of every key of the runner being moved starts with this."""
    rekey: Callable[[str], str | None]
    """A key's text -> its text under the other name; None for one that stays (another kind)."""


class BotStore:
    def __init__(self, db: Database):
        self.db = db
        self.audit = BotAudit(db)

    @classmethod
    async def open(cls, path: str | Path) -> BotStore:
        return cls(await Database.open(path, MIGRATIONS))

    async def close(self) -> None:
        await self.db.close()

    # ---- runner cursors ----

    async def cursor(self, runner: str) -> int:
        row = await self.db.fetchone("SELECT last_seq FROM cursors WHERE runner = ?", (runner,))
        return int(row[0]) if row else 0

    async def position(self, runner: str) -> tuple[int, datetime | None]:
        """The last seq read from a runner, and while its log is read again after a rewind, the
        time up to which its events were read before (`rewind`)."""
        row = await self.db.fetchone("SELECT last_seq, replay_until FROM cursors WHERE runner = ?", (runner,))
        if row is None:
            return 0, None
        return int(row[0]), datetime.fromisoformat(row[1]) if row[1] else None

    async def record_event(
        self,
        runner: str,
        seq: int,
        writes: list[tuple[str, OutboxKind, dict[str, Any], str | None]],
        ts: datetime | None = None,
    ) -> bool:
        """Store the outbox rows an event produced and advance the runner's cursor (to the event's
        seq and time `ts`), atomically.

        `writes` are (channel, kind, payload, dedupe_key). Returns False (and stores nothing) when
        the event was already recorded — a redelivery after a reconnect."""
        async with self.db.write() as tx:
            row = await tx.row("SELECT last_seq FROM cursors WHERE runner = ?", (runner,))
            if row is not None and row[0] >= seq:
                return False
            for channel, kind, payload, key in writes:
                await _queue_write(tx, channel, kind, payload, key)
            await tx.run(
                "INSERT INTO cursors (runner, last_seq, last_ts) VALUES (?, ?, ?) ON CONFLICT (runner) "
                "DO UPDATE SET last_seq = excluded.last_seq, last_ts = excluded.last_ts",
                (runner, seq, ts.isoformat() if ts else None),
            )
        return True

    # ---- which database each runner runs on ----

    async def runner_id(self, runner: str) -> str | None:
        row = await self.db.fetchone("SELECT runner_id FROM runner_ids WHERE runner = ?", (runner,))
        return row[0] if row else None

    async def switch_database(
        self, runner: str, runner_id: str, retired: Callable[[str], str], move: Callable[[str, str], KeyMove]
    ) -> str | None:
        """Record that `runner` now runs on the database `runner_id`; returns the one it ran on
        before when that was another (None: the same, or the first the bot has seen, which takes
        over what is stored under the name). On a change, in one transaction, what is stored under
        the name goes under `retired(previous id)`, and what was stored for `runner_id` when the
        runner last ran on it comes back under the name: a runner with another database starts
        with no threads and reads its event log from the start. `move(from, to)` says how outbox
        keys are renamed."""
        now = utcnow().isoformat()
        async with self.db.write() as tx:
            row = await tx.row("SELECT runner_id FROM runner_ids WHERE runner = ?", (runner,))
            await tx.run(
                "INSERT INTO runner_ids (runner, runner_id, seen_at) VALUES (?, ?, ?) ON CONFLICT (runner) "
                "DO UPDATE SET runner_id = excluded.runner_id, seen_at = excluded.seen_at",
                (runner, runner_id, now),
            )
            if row is None or row[0] == runner_id:
                return None
            previous = str(row[0])
            await _rename_runner(tx, runner, retired(previous), move(runner, retired(previous)))
            await _rename_runner(tx, retired(runner_id), runner, move(retired(runner_id), runner))
        return previous

    async def rewind(self, runner: str, head: int, set_aside: Callable[[int], tuple[str, KeyMove]]) -> bool:
        """The runner's event log ends at `head`, before the bot's cursor: its database was
        restored from an earlier copy by a runner that numbers events again, and the events that
        log has after the copy's end are new, whatever their seqs. When the time of the last event
        read is known, the log is read again from its start (the cursor goes to 0), its events up
        to that time taken for those read before (`position`, `end_replay`); returns True. Else it
        is read from `head` on, and what the bot kept for the events after it goes aside
        (`set_aside(first new seq)` names where, and how outbox keys move); returns False."""
        async with self.db.write() as tx:
            row = await tx.row("SELECT last_seq, last_ts FROM cursors WHERE runner = ?", (runner,))
            if row is None or row[0] <= head:
                return False
            if row[1] is not None:
                await tx.run(
                    "UPDATE cursors SET last_seq = 0, replay_until = last_ts WHERE runner = ?", (runner,)
                )
                return True
            await tx.run("UPDATE cursors SET last_seq = ? WHERE runner = ?", (head, runner))
            await _set_aside_events(tx, runner, head + 1, *set_aside(head + 1))
        return False

    async def end_replay(self, runner: str, first_new: int, aside: str, move: KeyMove) -> None:
        """The first event newer than those read before a rewind is `first_new`: what the bot kept
        for the events from that seq on goes under `aside` (milestones, and the outbox keys `move`
        renames), so that the new events of those seqs are new here."""
        async with self.db.write() as tx:
            await tx.run("UPDATE cursors SET replay_until = NULL WHERE runner = ?", (runner,))
            await _set_aside_events(tx, runner, first_new, aside, move)

    # ---- goal threads ----

    async def add_thread(
        self,
        runner: str,
        goal_id: int,
        channel: str,
        owner: str,
        *,
        card: tuple[dict[str, Any], str] | None = None,
    ) -> Thread:
        """Record a goal's thread; `card` (payload, dedupe key) queues its root post in the same
        transaction."""
        async with self.db.write() as tx:
            await tx.run(
                "INSERT OR IGNORE INTO threads (runner, goal_id, channel, owner, created_at) VALUES (?, ?, ?, ?, ?)",
                (runner, goal_id, channel, owner, utcnow().isoformat()),
            )
            if card is not None:
                await _queue_write(tx, channel, "post", card[0], card[1])
            row = await tx.row("SELECT * FROM threads WHERE runner = ? AND goal_id = ?", (runner, goal_id))
        return _thread(row)

    async def thread(self, runner: str, goal_id: int) -> Thread | None:
        row = await self.db.fetchone(
            "SELECT * FROM threads WHERE runner = ? AND goal_id = ?", (runner, goal_id)
        )
        return _thread(row) if row else None

    async def threads(self, runner: str | None = None, channel: str | None = None) -> list[Thread]:
        rows = await self.db.fetchall(
            "SELECT * FROM threads WHERE (?1 IS NULL OR runner = ?1) AND (?2 IS NULL OR channel = ?2) "
            "ORDER BY created_at, goal_id",
            (runner, channel),
        )
        return [_thread(row) for row in rows]

    async def set_status(self, runner: str, goal_id: int, status: dict[str, Any]) -> None:
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE threads SET status = ? WHERE runner = ? AND goal_id = ?",
                (json.dumps(status), runner, goal_id),
            )

    async def set_milestone(self, runner: str, goal_id: int, title: str, seq: int | None = None) -> None:
        """The goal's latest milestone (for digests); with the event's `seq`, kept in its list too
        (once per event, however often it is rendered)."""
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE threads SET milestone = ? WHERE runner = ? AND goal_id = ?", (title, runner, goal_id)
            )
            if seq is not None:
                await tx.run(
                    "INSERT OR IGNORE INTO milestones (runner, goal_id, seq, title, at) VALUES (?, ?, ?, ?, ?)",
                    (runner, goal_id, seq, title, utcnow().isoformat()),
                )

    async def milestones(self, runner: str, goal_id: int, last: int = 10) -> list[Milestone]:
        """The goal's latest milestones, oldest first."""
        rows = await self.db.fetchall(
            "SELECT * FROM (SELECT * FROM milestones WHERE runner = ? AND goal_id = ? ORDER BY seq DESC "
            "LIMIT ?) ORDER BY seq",
            (runner, goal_id, last),
        )
        return [Milestone(**dict(row)) for row in rows]

    # ---- channel settings (roles, the budget rule) ----

    async def channel_settings(self, channel: str) -> dict[str, ChannelSetting]:
        rows = await self.db.fetchall("SELECT * FROM channel_settings WHERE channel = ?", (channel,))
        return {row["name"]: _setting(row) for row in rows}

    async def channel_setting(self, channel: str, name: str) -> ChannelSetting | None:
        row = await self.db.fetchone(
            "SELECT * FROM channel_settings WHERE channel = ? AND name = ?", (channel, name)
        )
        return _setting(row) if row else None

    async def set_channel_setting(self, channel: str, name: str, value: Any, by: str) -> None:
        """Set a channel's setting (JSON `value`); None removes it (back to the configuration)."""
        async with self.db.write() as tx:
            if value is None:
                await tx.run("DELETE FROM channel_settings WHERE channel = ? AND name = ?", (channel, name))
                return
            await tx.run(
                "INSERT INTO channel_settings (channel, name, value, set_by, set_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (channel, name) DO UPDATE SET value = excluded.value, set_by = excluded.set_by, "
                "set_at = excluded.set_at",
                (channel, name, json.dumps(value), by, utcnow().isoformat()),
            )

    # ---- budget increases waiting for a second person ----

    async def add_budget_request(
        self,
        thread: Thread,
        change: str,
        why: str,
        by: str,
        prompt: Callable[[int], tuple[dict[str, Any], str]],
    ) -> BudgetRequest:
        """Store a budget request and queue its prompt (`prompt(id)` -> payload, dedupe key) in the
        goal's channel, in one transaction."""
        async with self.db.write() as tx:
            request_id = await tx.insert(
                "INSERT INTO budget_requests (runner, goal_id, channel, change, why, requested_by, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (thread.runner, thread.goal_id, thread.channel, change, why, by, utcnow().isoformat()),
            )
            payload, key = prompt(request_id)
            await _queue_write(tx, thread.channel, "post", payload, key)
            row = await tx.one("SELECT * FROM budget_requests WHERE id = ?", (request_id,))
        return BudgetRequest(**dict(row))

    async def budget_request(self, request_id: int) -> BudgetRequest | None:
        row = await self.db.fetchone("SELECT * FROM budget_requests WHERE id = ?", (request_id,))
        return BudgetRequest(**dict(row)) if row else None

    async def budget_requests(
        self, state: str = "pending", runner: str | None = None, goal_id: int | None = None
    ) -> list[BudgetRequest]:
        rows = await self.db.fetchall(
            "SELECT * FROM budget_requests WHERE state = ?1 AND (?2 IS NULL OR runner = ?2) "
            "AND (?3 IS NULL OR goal_id = ?3) ORDER BY id",
            (state, runner, goal_id),
        )
        return [BudgetRequest(**dict(row)) for row in rows]

    async def decide_budget_request(
        self, request_id: int, state: Literal["approved", "rejected"], by: str
    ) -> tuple[BudgetRequest, bool]:
        """Decide a pending request; (the request, whether this call decided it). The first wins."""
        async with self.db.write() as tx:
            changed = await tx.run(
                "UPDATE budget_requests SET state = ?, decided_by = ?, decided_at = ? "
                "WHERE id = ? AND state = 'pending'",
                (state, by, utcnow().isoformat(), request_id),
            )
            row = await tx.one("SELECT * FROM budget_requests WHERE id = ?", (request_id,))
        return BudgetRequest(**dict(row)), changed == 1

    async def unapply_budget_request(self, request_id: int, error: str | None = None) -> BudgetRequest:
        """An approval the runner did not apply: pending again when it could not be reached
        (`error` None), else failed with the runner's refusal (the goal has ended, ...)."""
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE budget_requests SET state = ?2, error = ?3, decided_by = CASE WHEN ?3 IS NULL "
                "THEN NULL ELSE decided_by END, decided_at = CASE WHEN ?3 IS NULL THEN NULL ELSE decided_at END "
                "WHERE id = ?1",
                (request_id, "pending" if error is None else "failed", error),
            )
            row = await tx.one("SELECT * FROM budget_requests WHERE id = ?", (request_id,))
        return BudgetRequest(**dict(row))

    # ---- goals waiting for a runner ----

    async def queue_goal(
        self, channel: str, owner: str, text: str, runner: str | None, submit_key: str | None = None
    ) -> int:
        async with self.db.write() as tx:
            return await tx.insert(
                "INSERT INTO queued_goals (channel, owner, text, runner, created_at, submit_key) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (channel, owner, text, runner, utcnow().isoformat(), submit_key),
            )

    async def queued_goals(self, state: str = "queued") -> list[QueuedGoal]:
        rows = await self.db.fetchall("SELECT * FROM queued_goals WHERE state = ? ORDER BY id", (state,))
        return [QueuedGoal(**dict(row)) for row in rows]

    async def queued_goal(self, queue_id: int) -> QueuedGoal | None:
        row = await self.db.fetchone("SELECT * FROM queued_goals WHERE id = ?", (queue_id,))
        return QueuedGoal(**dict(row)) if row else None

    async def dequeue_goal(
        self,
        queue_id: int,
        *,
        runner: str | None = None,
        goal_id: int | None = None,
        error: str | None = None,
    ) -> None:
        """Mark a queued goal submitted (as runner's goal_id) or failed (with the runner's error)."""
        state = "failed" if error else "submitted"
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE queued_goals SET state = ?, goal_runner = ?, goal_id = ?, error = ? WHERE id = ?",
                (state, runner, goal_id, error, queue_id),
            )

    # ---- digest schedules ----

    async def set_digest(self, channel: str, spec: str | None, by: str = "unknown") -> None:
        """Schedule a channel's digest (None turns it off). A new schedule counts from now."""
        async with self.db.write() as tx:
            if spec is None:
                await tx.run("DELETE FROM digests WHERE channel = ?", (channel,))
                return
            now = utcnow().isoformat()
            await tx.run(
                "INSERT INTO digests (channel, spec, created_by, created_at, last_sent_at) VALUES (?, ?, ?, ?, NULL) "
                "ON CONFLICT (channel) DO UPDATE SET spec = excluded.spec, created_by = excluded.created_by, "
                "created_at = excluded.created_at",
                (channel, spec, by, now),
            )

    async def digests(self) -> list[Digest]:
        return [
            Digest(**dict(row)) for row in await self.db.fetchall("SELECT * FROM digests ORDER BY channel")
        ]

    async def digest(self, channel: str) -> Digest | None:
        row = await self.db.fetchone("SELECT * FROM digests WHERE channel = ?", (channel,))
        return Digest(**dict(row)) if row else None

    async def digest_enqueued(
        self, channel: str, at: datetime, writes: list[tuple[OutboxKind, dict[str, Any], str | None]]
    ) -> None:
        """Queue a digest's writes and mark it sent as of `at`, atomically (a crash sends it once)."""
        async with self.db.write() as tx:
            for kind, payload, key in writes:
                await _queue_write(tx, channel, kind, payload, key)
            await tx.run("UPDATE digests SET last_sent_at = ? WHERE channel = ?", (at.isoformat(), channel))

    # ---- the outbox ----

    async def enqueue(
        self, channel: str, kind: OutboxKind, payload: dict[str, Any], dedupe_key: str | None = None
    ) -> int | None:
        """Queue one Slack write; returns its id, or None when the dedupe key was queued before."""
        async with self.db.write() as tx:
            return await _queue_write(tx, channel, kind, payload, dedupe_key)

    async def next_pending(self, now: float) -> list[OutboxItem]:
        """The oldest pending item of each channel that may be tried now (per-channel order kept)."""
        rows = await self.db.fetchall(
            "SELECT o.* FROM outbox o JOIN (SELECT channel, MIN(id) AS id FROM outbox "
            "WHERE state = 'pending' GROUP BY channel) head ON o.id = head.id WHERE o.not_before <= ? "
            "ORDER BY o.id",
            (now,),
        )
        return [_outbox(row) for row in rows]

    async def mark_sent(self, item_id: int, result: dict[str, Any]) -> None:
        async with self.db.write() as tx:
            # A post's ts is kept in its own column: replies, reactions and clicks name it.
            await tx.run(
                "UPDATE outbox SET state = 'sent', result = ?, error = NULL, "
                "ts = CASE WHEN kind = 'post' THEN ? END WHERE id = ?",
                (json.dumps(result), result.get("ts"), item_id),
            )

    async def mark_attempt(self, item_id: int) -> None:
        """Count one attempt, before the call: after a crash, an attempted post is looked up in
        Slack before it is sent again."""
        async with self.db.write() as tx:
            await tx.run("UPDATE outbox SET attempts = attempts + 1 WHERE id = ?", (item_id,))

    async def mark_retry(self, item_id: int, not_before: float, error: str, *, counts: bool = True) -> None:
        """The attempt failed for now: try again from `not_before` (epoch seconds). An attempt that
        does not count (`counts=False`: Slack said it took nothing, e.g. a 429) is given back."""
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE outbox SET not_before = ?, error = ?, attempts = attempts - ? WHERE id = ?",
                (not_before, error, 0 if counts else 1, item_id),
            )

    async def mark_failed(self, item_id: int, error: str) -> None:
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE outbox SET state = 'failed', error = ? WHERE id = ?",
                (error, item_id),
            )

    async def outbox_item(self, item_id: int) -> OutboxItem | None:
        row = await self.db.fetchone("SELECT * FROM outbox WHERE id = ?", (item_id,))
        return _outbox(row) if row else None

    async def outbox_by_key(self, dedupe_key: str) -> OutboxItem | None:
        row = await self.db.fetchone("SELECT * FROM outbox WHERE dedupe_key = ?", (dedupe_key,))
        return _outbox(row) if row else None

    async def sent_key_at(self, channel: str, ts: str) -> str | None:
        """The dedupe key of the post sent as (channel, ts), if the bot sent one."""
        row = await self.db.fetchone(
            "SELECT dedupe_key FROM outbox WHERE channel = ? AND ts = ?", (channel, ts)
        )
        return row[0] if row else None

    async def posts_in_flight(self, channel: str) -> bool:
        """Whether a keyed post in this channel is being sent: tried, with no answer recorded yet."""
        row = await self.db.fetchone(
            "SELECT 1 FROM outbox WHERE channel = ? AND kind = 'post' AND state = 'pending' "
            "AND attempts > 0 AND dedupe_key IS NOT NULL LIMIT 1",
            (channel,),
        )
        return row is not None

    async def pending_count(self) -> int:
        row = await self.db.one("SELECT COUNT(*) FROM outbox WHERE state = 'pending'")
        return int(row[0])

    async def pending_writes(self) -> tuple[int, datetime | None]:
        """How many writes wait for Slack, and when the oldest of them was queued (one read)."""
        row = await self.db.one("SELECT COUNT(*), MIN(created_at) FROM outbox WHERE state = 'pending'")
        return int(row[0]), datetime.fromisoformat(row[1]) if row[1] else None

    async def queued_goal_count(self) -> int:
        """Goals waiting for a runner."""
        row = await self.db.one("SELECT COUNT(*) FROM queued_goals WHERE state = 'queued'")
        return int(row[0])

    async def failed_count(self) -> int:
        row = await self.db.one("SELECT COUNT(*) FROM outbox WHERE state = 'failed'")
        return int(row[0])

    async def failed_writes(self, last: int = 5) -> list[OutboxItem]:
        """The writes given up on, newest first."""
        rows = await self.db.fetchall(
            "SELECT * FROM outbox WHERE state = 'failed' ORDER BY id DESC LIMIT ?", (last,)
        )
        return [_outbox(row) for row in rows]

    # ---- Slack event dedupe ----

    async def first_sight(self, event_id: str) -> bool:
        """True the first time an event id is seen (Slack redelivers unacked or slow events)."""
        async with self.db.write() as tx:
            changed = await tx.run(
                "INSERT OR IGNORE INTO slack_events (event_id, received_at) VALUES (?, ?)",
                (event_id, utcnow().isoformat()),
            )
        return changed == 1


async def _queue_write(
    tx: Tx, channel: str, kind: OutboxKind, payload: dict[str, Any], key: str | None
) -> int | None:
    """Insert one outbox row (None when its key was queued before). An edit of a message that
    replaces it whole (`"replaces": True`, e.g. a status card) supersedes the same message's edits
    still waiting: only the newest is sent."""
    if kind == "update" and payload.get("replaces") and (target := payload.get("ts_of")):
        await tx.run(
            "DELETE FROM outbox WHERE state = 'pending' AND attempts = 0 AND kind = 'update' "
            "AND channel = ? AND json_extract(payload, '$.ts_of') = ?",
            (channel, target),
        )
    changed = await tx.run(
        "INSERT OR IGNORE INTO outbox (channel, kind, payload, dedupe_key, created_at) VALUES (?, ?, ?, ?, ?)",
        (channel, kind, json.dumps(payload), key, utcnow().isoformat()),
    )
    if not changed:
        return None
    row = await tx.one("SELECT last_insert_rowid()")
    return int(row[0])


async def _rename_runner(tx: Tx, old: str, new: str, move: KeyMove) -> None:
    """Put what is stored under runner name `old` under `new` (which holds nothing yet)."""
    for table in RUNNER_TABLES:
        await tx.run(f"UPDATE {table} SET runner = ? WHERE runner = ?", (new, old))
    await _rename_keys(tx, move)


async def _set_aside_events(tx: Tx, runner: str, first: int, aside: str, move: KeyMove) -> None:
    await tx.run("UPDATE milestones SET runner = ? WHERE runner = ? AND seq >= ?", (aside, runner, first))
    await _rename_keys(tx, move)


async def _rename_keys(tx: Tx, move: KeyMove) -> None:
    """Rename the outbox keys `move` renames, and the references to them in writes still pending
    (a post in a thread names its card: `thread_of`; an edit its message: `ts_of`)."""
    rows = await tx.rows(
        "SELECT id, dedupe_key, payload FROM outbox WHERE substr(dedupe_key, 1, length(?1)) = ?1 "
        "OR (state = 'pending' AND (substr(json_extract(payload, '$.thread_of'), 1, length(?1)) = ?1 "
        "OR substr(json_extract(payload, '$.ts_of'), 1, length(?1)) = ?1))",
        (move.prefix,),
    )
    for row in rows:
        key = move.rekey(row["dedupe_key"]) if row["dedupe_key"] else None
        payload = json.loads(row["payload"])
        refs = {
            ref: new
            for ref in ("thread_of", "ts_of")
            if (old := payload.get(ref)) and (new := move.rekey(old))
        }
        if key is None and not refs:
            continue
        await tx.run(
            "UPDATE outbox SET dedupe_key = COALESCE(?, dedupe_key), payload = ? WHERE id = ?",
            (key, json.dumps({**payload, **refs}), row["id"]),
        )


def _thread(row) -> Thread:
    data = dict(row)
    data["status"] = json.loads(data["status"]) if data.get("status") else None
    return Thread(**data)


def _setting(row) -> ChannelSetting:
    data = dict(row)
    data["value"] = json.loads(data["value"])
    return ChannelSetting(**data)


def _outbox(row) -> OutboxItem:
    data = dict(row)
    data["payload"] = json.loads(data["payload"])
    data["result"] = json.loads(data["result"]) if data["result"] else None
    return OutboxItem(**data)
