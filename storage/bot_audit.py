"""bot.db's audit table: the control actions decided in Slack, which never reach a runner — a
refused thread reply or approval click, a budget increase held for a second person and its later
decision, a role change by `/goal admin` (or a refused one).

What a runner does is in its own trail (runner.db); a goal's `audit` in Slack shows both, by time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from goaltender.storage.db import Database
from goaltender.storage.records import utcnow

MIGRATION = """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        ts TEXT NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        runner TEXT,
        goal_id INTEGER,
        channel TEXT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX audit_by_goal ON audit (runner, goal_id, id);
    CREATE INDEX audit_by_channel ON audit (channel, id);
"""

Outcome = Literal["done", "refused", "held", "failed"]
DETAIL_CHARS = 500


class SlackAuditEntry(BaseModel):
    """One action decided in Slack, by `actor` (`slack:U123`); `runner` and `goal_id` name the goal
    it was about (None for a channel's roles)."""

    id: int
    ts: datetime
    actor: str
    action: str  # stop, pause, resume, steer, budget, approve, reject, approve budget, role, ...
    runner: str | None
    goal_id: int | None
    channel: str
    outcome: Outcome
    detail: str


class BotAudit:
    def __init__(self, db: Database):
        self.db = db

    async def add(
        self,
        actor: str,
        action: str,
        outcome: Outcome,
        *,
        channel: str,
        runner: str | None = None,
        goal_id: int | None = None,
        detail: str = "",
    ) -> SlackAuditEntry:
        async with self.db.write() as tx:
            entry_id = await tx.insert(
                "INSERT INTO audit (ts, actor, action, runner, goal_id, channel, outcome, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    utcnow().isoformat(),
                    actor,
                    action,
                    runner,
                    goal_id,
                    channel,
                    outcome,
                    detail[:DETAIL_CHARS],
                ),
            )
            row = await tx.one("SELECT * FROM audit WHERE id = ?", (entry_id,))
        return SlackAuditEntry(**dict(row))

    async def of_goal(self, runner: str, goal_id: int, limit: int = 200) -> list[SlackAuditEntry]:
        """The goal's newest `limit` entries, oldest first."""
        return await self._newest(
            "SELECT * FROM audit WHERE runner = ? AND goal_id = ? ORDER BY id DESC LIMIT ?",
            (runner, goal_id, limit),
        )

    async def of_channel(self, channel: str, limit: int = 200) -> list[SlackAuditEntry]:
        """The channel's newest `limit` entries (its goals' and its roles'), oldest first."""
        return await self._newest(
            "SELECT * FROM audit WHERE channel = ? ORDER BY id DESC LIMIT ?", (channel, limit)
        )

    async def _newest(self, sql: str, params: tuple) -> list[SlackAuditEntry]:
        rows = await self.db.fetchall(sql, params)
        return [SlackAuditEntry(**dict(row)) for row in reversed(rows)]
