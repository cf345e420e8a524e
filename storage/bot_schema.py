"""bot.db's tables and rows: the migrations that build them (storage/db.py applies them in order)
and the rows storage/bot_store.py hands out.

Append a migration for every change; never edit one that has shipped: a bot's database is at the
version of the last migration it applied.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from goaltender.storage.bot_audit import MIGRATION as AUDIT_MIGRATION

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
    # v2: each sent post's ts in its outbox row (how a reply, reaction or click finds its goal
    # thread or approval prompt; threads.root_ts of v1 is no longer read), goals queued while no
    # runner could take them, digest schedules, and each goal's last status (its card can say
    # "runner down" without asking the runner).
    """
    ALTER TABLE outbox ADD COLUMN ts TEXT;
    CREATE INDEX outbox_by_ts ON outbox (channel, ts);
    CREATE TABLE queued_goals (
        id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        owner TEXT NOT NULL,
        text TEXT NOT NULL,
        runner TEXT,
        state TEXT NOT NULL DEFAULT 'queued',
        goal_runner TEXT,
        goal_id INTEGER,
        error TEXT,
        created_at TEXT NOT NULL
    );
    CREATE TABLE digests (
        channel TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        created_by TEXT NOT NULL,
        created_at TEXT NOT NULL,
        last_sent_at TEXT
    );
    ALTER TABLE threads ADD COLUMN status TEXT;
    ALTER TABLE threads ADD COLUMN milestone TEXT;
    """,
    # v3: a channel's roles and budget rule as set from Slack (`/goal admin`), budget increases
    # waiting for a second person, and every goal's milestones (for `summary` in a thread).
    """
    CREATE TABLE channel_settings (
        channel TEXT NOT NULL,
        name TEXT NOT NULL,
        value TEXT NOT NULL,
        set_by TEXT NOT NULL,
        set_at TEXT NOT NULL,
        PRIMARY KEY (channel, name)
    );
    CREATE TABLE budget_requests (
        id INTEGER PRIMARY KEY,
        runner TEXT NOT NULL,
        goal_id INTEGER NOT NULL,
        channel TEXT NOT NULL,
        change TEXT NOT NULL,
        why TEXT NOT NULL,
        requested_by TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        decided_by TEXT,
        decided_at TEXT,
        error TEXT,
        created_at TEXT NOT NULL
    );
    CREATE INDEX budget_requests_by_goal ON budget_requests (runner, goal_id, state);
    CREATE TABLE milestones (
        runner TEXT NOT NULL,
        goal_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        title TEXT NOT NULL,
        at TEXT NOT NULL,
        PRIMARY KEY (runner, seq)
    );
    CREATE INDEX milestones_by_goal ON milestones (runner, goal_id, seq);
    """,
    # v4: the audit trail of actions decided in Slack (refusals, held budget increases, roles).
    AUDIT_MIGRATION,
    # v5: a queued goal's name for its submission (SubmitGoal.key): one whose first try reached the
    # runner but not its reply is the goal that try made, not a second one.
    """
    ALTER TABLE queued_goals ADD COLUMN submit_key TEXT;
    """,
    # v6: the database each runner runs on (its identity, from its welcome): what is stored under a
    # runner's name (threads, cursor, keys) is that database's goals and events.
    # Also the time of the last event read (cursors.last_ts), and, while a runner's event log is read
    # again after it was found to end before the cursor, the time up to which its events are ones
    # the bot had read (cursors.replay_until).
    """
    CREATE TABLE runner_ids (
        runner TEXT PRIMARY KEY,
        runner_id TEXT NOT NULL,
        seen_at TEXT NOT NULL
    );
    ALTER TABLE cursors ADD COLUMN last_ts TEXT;
    ALTER TABLE cursors ADD COLUMN replay_until TEXT;
    """,
]

#: The tables whose rows belong to one runner's goals or events, by its name in `runner`.
RUNNER_TABLES = ("threads", "cursors", "milestones", "budget_requests", "audit")

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
    owner: str
    created_at: datetime
    status: dict[str, Any] | None = None
    """The goal's last GoalStatus seen (JSON), for its card while the runner is unreachable."""
    milestone: str | None = None
    """The title of the goal's latest milestone (for digests)."""


class QueuedGoal(BaseModel):
    """A goal asked for while no runner could take it; submitted when one comes back."""

    id: int
    channel: str
    owner: str
    text: str
    runner: str | None
    state: Literal["queued", "submitted", "failed"]
    goal_runner: str | None
    goal_id: int | None
    error: str | None
    created_at: datetime
    submit_key: str | None = None


class Digest(BaseModel):
    """A channel's digest schedule, e.g. `daily 09:00 Europe/Berlin` or `every 4h`."""

    channel: str
    spec: str
    created_by: str
    created_at: datetime
    last_sent_at: datetime | None


class ChannelSetting(BaseModel):
    """A channel's role or rule as set from Slack (`/goal admin`); it overrides the configuration."""

    channel: str
    name: str
    value: Any
    set_by: str
    set_at: datetime


class BudgetRequest(BaseModel):
    """A budget increase over the channel's limit, waiting for a second person to decide it."""

    id: int
    runner: str
    goal_id: int
    channel: str
    change: str
    """The words asked for (`budget +5h`), sent to the runner as they are once approved."""
    why: str
    """Why it needs a second person, e.g. "adds 5h00m of time (the limit is 1h)"."""
    requested_by: str
    state: Literal["pending", "approved", "rejected", "failed"]
    decided_by: str | None
    decided_at: datetime | None
    error: str | None
    created_at: datetime


class Milestone(BaseModel):
    runner: str
    goal_id: int
    seq: int
    title: str
    at: datetime
