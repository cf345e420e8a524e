"""bot.db: what the Slack bot must not forget — where each goal's thread is, how far it has read
each runner's event log, and the outbox of Slack writes not yet confirmed.

The runner's events arrive at least once; storing an event's `seq` together with the outbox rows
it produced, in one transaction, makes the bot's side exactly once.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from goaltender.storage.db import Database
from goaltender.storage.records import utcnow

MIGRATIONS = [
    """
    CREATE TABLE cursors (
        runner TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL
    );
    CREATE TABLE threads (
        runner TEXT NOT NULL,
        goal_id INTEGER NOT NULL,
        channel TEXT NOT NULL,
        root_ts TEXT,
        owner TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (runner, goal_id)
    );
    CREATE INDEX threads_by_root ON threads (channel, root_ts);
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        dedupe_key TEXT UNIQUE,
        state TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        not_before REAL NOT NULL DEFAULT 0,
        result TEXT,
        error TEXT,
        created_at TEXT NOT NULL
    );
    CREATE INDEX outbox_pending ON outbox (state, channel, id);
    CREATE TABLE slack_events (
        event_id TEXT PRIMARY KEY,
        received_at TEXT NOT NULL
    );
    """,
]

OutboxKind = Literal["post", "update", "ephemeral", "reaction", "upload"]


class OutboxItem(BaseModel):
    id: int
    channel: str
    kind: OutboxKind
    payload: dict[str, Any]
    dedupe_key: str | None
    state: Literal["pending", "sent", "failed"]
    attempts: int
    not_before: float
    result: dict[str, Any] | None
    error: str | None
    created_at: datetime


class Thread(BaseModel):
    runner: str
    goal_id: int
    channel: str
    root_ts: str | None
    owner: str
    created_at: datetime


class BotStore:
    def __init__(self, db: Database):
        self.db = db

    @classmethod
    async def open(cls, path: str | Path) -> BotStore:
        return cls(await Database.open(path, MIGRATIONS))

    async def close(self) -> None:
        await self.db.close()

    # ---- runner cursors ----

    async def cursor(self, runner: str) -> int:
        row = await self.db.fetchone("SELECT last_seq FROM cursors WHERE runner = ?", (runner,))
        return int(row[0]) if row else 0

    async def record_event(
        self, runner: str, seq: int, writes: list[tuple[str, OutboxKind, dict[str, Any], str | None]]
    ) -> bool:
        """Store the outbox rows an event produced and advance the runner's cursor, atomically.

        `writes` are (channel, kind, payload, dedupe_key). Returns False (and stores nothing) when
        the event was already recorded — a redelivery after a reconnect."""
        async with self.db.write() as tx:
            row = await tx.row("SELECT last_seq FROM cursors WHERE runner = ?", (runner,))
            if row is not None and row[0] >= seq:
                return False
            for channel, kind, payload, key in writes:
                await tx.run(
                    "INSERT OR IGNORE INTO outbox (channel, kind, payload, dedupe_key, created_at) VALUES (?, ?, ?, ?, ?)",
                    (channel, kind, json.dumps(payload), key, utcnow().isoformat()),
                )
            await tx.run(
                "INSERT INTO cursors (runner, last_seq) VALUES (?, ?) "
                "ON CONFLICT (runner) DO UPDATE SET last_seq = excluded.last_seq",
                (runner, seq),
            )
        return True

    # ---- goal threads ----

    async def add_thread(self, runner: str, goal_id: int, channel: str, owner: str) -> Thread:
        async with self.db.write() as tx:
            await tx.run(
                "INSERT OR IGNORE INTO threads (runner, goal_id, channel, owner, created_at) VALUES (?, ?, ?, ?, ?)",
                (runner, goal_id, channel, owner, utcnow().isoformat()),
            )
            row = await tx.row("SELECT * FROM threads WHERE runner = ? AND goal_id = ?", (runner, goal_id))
        return Thread(**dict(row))

    async def set_root(self, runner: str, goal_id: int, root_ts: str) -> None:
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE threads SET root_ts = ? WHERE runner = ? AND goal_id = ?", (root_ts, runner, goal_id)
            )

    async def thread(self, runner: str, goal_id: int) -> Thread | None:
        row = await self.db.fetchone(
            "SELECT * FROM threads WHERE runner = ? AND goal_id = ?", (runner, goal_id)
        )
        return Thread(**dict(row)) if row else None

    async def thread_at(self, channel: str, root_ts: str) -> Thread | None:
        row = await self.db.fetchone(
            "SELECT * FROM threads WHERE channel = ? AND root_ts = ?", (channel, root_ts)
        )
        return Thread(**dict(row)) if row else None

    # ---- the outbox ----

    async def enqueue(
        self, channel: str, kind: OutboxKind, payload: dict[str, Any], dedupe_key: str | None = None
    ) -> int | None:
        """Queue one Slack write; returns its id, or None when the dedupe key was queued before."""
        async with self.db.write() as tx:
            changed = await tx.run(
                "INSERT OR IGNORE INTO outbox (channel, kind, payload, dedupe_key, created_at) VALUES (?, ?, ?, ?, ?)",
                (channel, kind, json.dumps(payload), dedupe_key, utcnow().isoformat()),
            )
            if not changed:
                return None
            row = await tx.row("SELECT last_insert_rowid()")
        return int(row[0])

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
            await tx.run(
                "UPDATE outbox SET state = 'sent', result = ?, error = NULL WHERE id = ?",
                (json.dumps(result), item_id),
            )

    async def mark_retry(self, item_id: int, not_before: float, error: str) -> None:
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE outbox SET attempts = attempts + 1, not_before = ?, error = ? WHERE id = ?",
                (not_before, error, item_id),
            )

    async def mark_failed(self, item_id: int, error: str) -> None:
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE outbox SET state = 'failed', attempts = attempts + 1, error = ? WHERE id = ?",
                (error, item_id),
            )

    async def outbox_item(self, item_id: int) -> OutboxItem | None:
        row = await self.db.fetchone("SELECT * FROM outbox WHERE id = ?", (item_id,))
        return _outbox(row) if row else None

    async def outbox_by_key(self, dedupe_key: str) -> OutboxItem | None:
        row = await self.db.fetchone("SELECT * FROM outbox WHERE dedupe_key = ?", (dedupe_key,))
        return _outbox(row) if row else None

    async def sent_posts(self, *key_patterns: str) -> list[tuple[str, str, str | None]]:
        """(dedupe key, channel, ts) of sent posts whose key matches a LIKE pattern ('%:card')."""
        where = " OR ".join("dedupe_key LIKE ?" for _ in key_patterns) or "1"
        rows = await self.db.fetchall(
            f"SELECT dedupe_key, channel, result FROM outbox WHERE state = 'sent' AND kind = 'post' AND ({where})",
            key_patterns,
        )
        return [(row[0], row[1], (json.loads(row[2]) if row[2] else {}).get("ts")) for row in rows]

    async def pending_count(self) -> int:
        row = await self.db.fetchone("SELECT COUNT(*) FROM outbox WHERE state = 'pending'")
        return int(row[0])

    # ---- Slack event dedupe ----

    async def first_sight(self, event_id: str) -> bool:
        """True the first time an event id is seen (Slack redelivers unacked or slow events)."""
        async with self.db.write() as tx:
            changed = await tx.run(
                "INSERT OR IGNORE INTO slack_events (event_id, received_at) VALUES (?, ?)",
                (event_id, utcnow().isoformat()),
            )
        return changed == 1


def _outbox(row) -> OutboxItem:
    data = dict(row)
    data["payload"] = json.loads(data["payload"])
    data["result"] = json.loads(data["result"]) if data["result"] else None
    return OutboxItem(**data)
