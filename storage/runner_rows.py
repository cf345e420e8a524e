"""runner.db's rows read into records (storage/records.py), and the SQL that reads a goal's ledger
in brief (`Ledger`: what its status shows) for many goals at once. storage/runner_store.py writes
and queries with these; nothing here opens a connection.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, get_args

from pydantic import TypeAdapter, ValidationError

from goaltender.storage.records import (
    TERMINAL_STATES,
    Approval,
    Budget,
    Event,
    EventData,
    Experiment,
    Goal,
    GoalState,
    HubFetched,
    InboxMessage,
    MetricPoint,
    MilestoneReported,
    UnreadableEvent,
    first_problem,
    stored_time,
)

EVENT_DATA = TypeAdapter(EventData)
log = logging.getLogger("goaltender.runner")


@dataclass
class Ledger:
    """A goal's ledger in brief: what its status shows."""

    attempted: int = 0  # interrupted runs are not counted as attempted (Experiment.counted)
    compute_hours_used: float = 0.0
    best: Experiment | None = None  # runner/report.py's best_experiment, chosen in SQL
    running: Experiment | None = None  # the newest running one, else the first queued
    pending_approvals: list[Approval] = field(default_factory=list)
    tokens_used: int = 0  # the agent's tokens (protocol/budget.py tokens_used)


# Named states (not NOT IN the terminal ones), so that the goals_by_state index answers it.
ACTIVE_STATES = [state for state in get_args(GoalState) if state not in TERMINAL_STATES]
ACTIVE = "state IN ({})".format(", ".join(f"'{state}'" for state in ACTIVE_STATES))
OF_GOALS = "goal_id IN (SELECT value FROM json_each(?))"
LEDGER_TOTALS = (
    "SELECT goal_id, SUM(status != 'interrupted'), COALESCE(SUM(compute_hours), 0) "
    f"FROM experiments WHERE {OF_GOALS} GROUP BY goal_id"
)
# The kept experiment with the best headline, the first (lowest idx) of equals, as best_experiment.
BEST_EXPERIMENTS = f"""
    SELECT * FROM (
        SELECT e.*, ROW_NUMBER() OVER (
            PARTITION BY e.goal_id
            ORDER BY CASE WHEN g.direction = 'maximize' THEN -e.metric_value ELSE e.metric_value END, e.idx
        ) AS rank
        FROM experiments e JOIN goals g ON g.id = e.goal_id
        WHERE e.{OF_GOALS} AND e.status = 'keep' AND e.metric_value IS NOT NULL
    ) WHERE rank = 1
"""
RUNNING_EXPERIMENTS = f"""
    SELECT * FROM (
        SELECT *, ROW_NUMBER() OVER (
            PARTITION BY goal_id ORDER BY status = 'running' DESC, CASE status WHEN 'running' THEN -idx ELSE idx END
        ) AS rank
        FROM experiments WHERE {OF_GOALS} AND status IN ('running', 'queued')
    ) WHERE rank = 1
"""
PENDING_APPROVALS_OF = f"SELECT * FROM approvals WHERE state = 'pending' AND {OF_GOALS} ORDER BY id"


def goal_filter(active_only: bool, before: int | None) -> tuple[str, list[Any]]:
    conditions, params = [], []
    if active_only:
        conditions.append(ACTIVE)
    if before is not None:
        conditions.append("id < ?")
        params.append(before)
    return ("WHERE " + " AND ".join(conditions) if conditions else ""), params


def goal_of(row: sqlite3.Row) -> Goal:
    """A goal's row as its model. A budget that does not read back (a row edited by hand, say)
    leaves it blocked, not the runner unable to start: no experiment starts until an operator
    sets its budget again (`goaltender budget N …`), which writes it anew."""
    data = dict(row)
    data.pop("agent_report")
    data.pop("paused_for_disk")
    data.pop("submit_key")
    try:
        data["budget"] = Budget.model_validate_json(data["budget"])
    except ValidationError as exc:
        data["budget"] = Budget()
        problem = exc.errors()[0]
        data["blocked"] = (
            f"its budget in runner.db does not read back ({'.'.join(map(str, problem['loc']))}: "
            f"{problem['msg']}): set it again with `goaltender budget {data['id']} …`"
        )
    data["stages"] = json.loads(data["stages"])
    return Goal(**data)


def experiment_of(row: sqlite3.Row) -> Experiment:
    data = dict(row)
    data.pop("rank", None)  # a window query's own column
    data["index"] = data.pop("idx")
    data["command"] = json.loads(data["command"])
    data["params"] = json.loads(data["params"])
    data["metrics"] = json.loads(data["metrics"])
    data["verified"] = bool(data["verified"])
    data["within_noise"] = bool(data["within_noise"])
    data["eval_command"] = json.loads(data["eval_command"]) if data["eval_command"] else None
    return Experiment(**data)


def approval_of(row: sqlite3.Row) -> Approval:
    return Approval(**dict(row))


def inbox_message_of(row: sqlite3.Row) -> InboxMessage:
    return InboxMessage(**dict(row))


def folded_title(row: sqlite3.Row) -> str:
    """A folded post's title, as its PostsFolded names it."""
    match event_of(row).data:
        case MilestoneReported(title=title):
            return title
        case HubFetched(fetch=fetch):
            return f"fetched {fetch.repo_type} {fetch.repo} ({fetch.revision})"
    return "(unreadable)"


# Text columns come as bytes, decoded here: text that is not UTF-8 (a row written by other means)
# must fail its own row, not the query that reads a whole batch.
EVENT_COLUMNS = "seq, goal_id, CAST(ts AS BLOB) AS ts, CAST(kind AS BLOB) AS kind, CAST(data AS BLOB) AS data"


def stored_events_json(rows: list[sqlite3.Row]) -> list[bytes]:
    """Rows of stored_events_since as their Events' JSON. The stored data is spliced in as it is
    (it was an EventData's JSON when logged); a row not known to be plain (INSERT_EVENT checks its
    data is JSON and its time needs no escaping; a row written any other way is not known to be),
    or not UTF-8, is read into its model instead, and so becomes an UnreadableEvent with its
    reason. Data that is JSON but no longer reads into its model is left for the client to find
    (goaltender.protocol.messages.batch_events), which makes the same UnreadableEvent of it."""
    return [
        b'{"seq":%d,"goal_id":%s,"ts":"%s","data":%s}'
        % (seq, b"null" if goal_id is None else b"%d" % goal_id, ts, data)
        if plain and (goal_id is None or type(goal_id) is int) and ts.isascii() and is_utf8(data)
        else event_of(row).model_dump_json().encode()
        for row in rows
        for seq, goal_id, ts, _kind, data, plain in (row,)
    ]


def is_utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def event_of(row: sqlite3.Row) -> Event:
    """The logged event; one that no longer reads back becomes an UnreadableEvent with its seq:
    a row every subscriber would fail on must not stall them all, nor leave a gap in seq order."""
    try:
        data = EVENT_DATA.validate_json(row["data"])
        return Event(seq=row["seq"], goal_id=row["goal_id"], ts=row["ts"].decode(), data=data)
    except (ValidationError, UnicodeDecodeError) as exc:
        reason = first_problem(exc)
        kind = row["kind"].decode(errors="replace")
        log.warning("event %s (%s) cannot be read, delivered as unreadable: %s", row["seq"], kind, reason)
        return Event(
            seq=row["seq"],
            goal_id=row["goal_id"] if isinstance(row["goal_id"], int) else None,
            ts=stored_time(row["ts"]),
            data=UnreadableEvent(stored_kind=kind, reason=reason),
        )


EVENT_POINTS_BYTES = 128 * 1024  # about what one metrics event's points take as JSON, at most


def event_sized(points: list[MetricPoint]) -> Iterator[list[MetricPoint]]:
    """`points` in runs small enough for one event each: a run's log tailed in one go (tens of
    thousands of lines) made one event over the line a client reads, and stalled every subscriber."""
    start, size = 0, 0
    for end, point in enumerate(points):
        cost = len(point.name) + 64  # its JSON: name, value, step and punctuation
        if size and size + cost > EVENT_POINTS_BYTES:
            yield points[start:end]
            start, size = end, 0
        size += cost
    yield points[start:]
