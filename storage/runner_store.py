"""runner.db: goals, the event log, the experiment ledger, metrics, approvals, inbox, diary, audit.

Every change that others must hear about appends its event in the same transaction, and
listeners are told only after the commit: nothing is announced that the log does not hold.

A write that finds the disk full raises DiskFull until the runner sets `when_full`; from then on
it awaits `when_full` (where the runner pauses goals and waits for room) and is tried again, so a
row the runner must close (an experiment that ended, its ledger entry) is closed once there is
room, not lost. Meanwhile `full` is set: whoever answers a person or an agent waits for a write
only until then (`done_unless_full`), and a write made under `refuse_when_full()` raises DiskFull
at once instead of waiting: nothing that answers waits on room that may never come.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, get_args

from pydantic import TypeAdapter, ValidationError

from goaltender.storage.db import Database, Tx
from goaltender.storage.high_water import FILE as HIGH_WATER_FILE
from goaltender.storage.high_water import HighWater
from goaltender.storage.records import (
    AGENT_LOG,
    TERMINAL_STATES,
    TOKEN_METRICS,
    Approval,
    ApprovalDecided,
    ApprovalRequested,
    AuditEntry,
    Budget,
    BudgetChanged,
    DiaryEntry,
    Event,
    EventData,
    Experiment,
    ExperimentFinished,
    ExperimentQueued,
    ExperimentStarted,
    FinalReport,
    Goal,
    GoalAccepted,
    GoalState,
    GoalStateChanged,
    HubFetch,
    HubFetched,
    InboxMessage,
    MetricPoint,
    MetricsLogged,
    MilestoneReported,
    PostsFolded,
    StageChanged,
    SteerReceived,
    UnreadableEvent,
    first_problem,
    stored_time,
    tokens_used,
    utcnow,
)
from goaltender.storage.runner_schema import MIGRATIONS
from goaltender.storage.space import DiskFull, is_disk_full, probe_after_failure

_event_data = TypeAdapter(EventData)
_PAUSED_FOR_DISK = "SELECT 1 FROM goals WHERE id = ? AND state = 'paused' AND paused_for_disk"
#: How an event is logged (goal_id, ts, kind, data): with `plain`, whether its stored JSON can be
#: spliced into a replay as it is (its data is JSON, its time needs no escaping in a JSON string).
INSERT_EVENT = (
    "INSERT INTO events (goal_id, ts, kind, data, plain) "
    "VALUES (?1, ?2, ?3, ?4, json_valid(?4) AND json_quote(?2) = '\"' || ?2 || '\"')"
)
#: The same, numbered above ?5 (the home's high-water mark, storage/high_water.py) where the log
#: ends below it: a database restored from an earlier copy never numbers an event twice.
INSERT_EVENT_ABOVE = (
    "INSERT INTO events (seq, goal_id, ts, kind, data, plain) "
    "VALUES (MAX(?5, (SELECT COALESCE(MAX(seq), 0) FROM events)) + 1, "
    "?1, ?2, ?3, ?4, json_valid(?4) AND json_quote(?2) = '\"' || ?2 || '\"')"
)
LOG_LOCATIONS_KEPT = 1024  # experiments whose log locations RunnerStore.log_location keeps
log = logging.getLogger("goaltender.runner")
P = ParamSpec("P")
T = TypeVar("T")
WhenFull = Callable[[DiskFull], Awaitable[None]]
# Set (by RunnerStore.refuse_when_full) around a write someone waits on: it fails rather than waits.
_REFUSE_WHEN_FULL = contextvars.ContextVar("refuse_when_full", default=False)


def _waits_for_space(
    write: Callable[Concatenate[RunnerStore, P], Awaitable[T]],
) -> Callable[Concatenate[RunnerStore, P], Awaitable[T]]:
    """A write (one transaction, so safe to repeat) that finds the disk full raises DiskFull, or,
    once the runner has set `when_full`, waits there (with `full` set) and is tried again."""

    @functools.wraps(write)
    async def writing(store: RunnerStore, *args: P.args, **kwargs: P.kwargs) -> T:
        while True:
            try:
                return await write(store, *args, **kwargs)
            except (sqlite3.Error, OSError) as exc:
                if not is_disk_full(exc):
                    raise
                full = DiskFull(probe_after_failure(store.db.path.parent), exc)
                if store.when_full is None or _REFUSE_WHEN_FULL.get():
                    raise full from exc
                await store.wait_for_room(store.when_full, full)

    return writing


class RunnerStore:
    """Typed access to runner.db. `on_event` is called with each event after its commit."""

    def __init__(self, db: Database, issued: HighWater):
        self.db = db
        self.issued = issued
        self.on_event: Callable[[Event], None] = lambda event: None
        self.when_full: WhenFull | None = None  # None: a write that finds the disk full raises
        self.full = asyncio.Event()  # set while a write waits for room
        self._waiting_for_room = 0
        self._given_up = asyncio.Event()  # stop_waiting_for_room: the runner is shutting down
        self._log_locations: collections.OrderedDict[int, tuple[Path, Path]] = collections.OrderedDict()
        self._seq_floor = 0  # while the log ends below the home's mark: number events above it
        self.runner_id = ""
        """This database's identity (made with it; the welcome carries it)."""

    async def wait_for_room(self, when_full: WhenFull, full: DiskFull) -> None:
        """Await `when_full`, or stop_waiting_for_room, whichever comes first."""
        self._waiting_for_room += 1
        self.full.set()
        waiting = asyncio.ensure_future(when_full(full))
        given_up = asyncio.ensure_future(self._given_up.wait())
        try:
            await asyncio.wait([waiting, given_up], return_when=asyncio.FIRST_COMPLETED)
            if waiting.done():
                waiting.result()
        finally:
            waiting.cancel()
            given_up.cancel()
            self._waiting_for_room -= 1
            if not self._waiting_for_room:
                self.full.clear()

    def stop_waiting_for_room(self) -> None:
        """The runner is shutting down: a write that finds the disk full raises DiskFull from now
        on, those waiting for room included (each is tried once more)."""
        self.when_full = None
        self._given_up.set()

    async def done_unless_full(self, writing: asyncio.Future) -> bool:
        """Wait for `writing` (a task or future that writes) unless the disk is full: True when it is
        done (its exception raised here), False when a write waits for room. It goes on either way."""
        if not writing.done():
            full = asyncio.ensure_future(self.full.wait())
            try:
                await asyncio.wait([writing, full], return_when=asyncio.FIRST_COMPLETED)
            finally:
                full.cancel()
        if not writing.done():
            return False
        writing.result()
        return True

    @staticmethod
    @contextlib.contextmanager
    def refuse_when_full() -> Iterator[None]:
        """Writes made in this block raise DiskFull when the disk is full, rather than wait for room.
        Around a store call only: a task started inside would inherit it."""
        token = _REFUSE_WHEN_FULL.set(True)
        try:
            yield
        finally:
            _REFUSE_WHEN_FULL.reset(token)

    @classmethod
    async def open(cls, path: str | Path) -> RunnerStore:
        """Open runner.db, watching its files (storage/db_files.py), with the home's high-water
        marks beside it."""
        db = await Database.open(path, MIGRATIONS, watch=True)
        store = cls(db, HighWater(db.path.parent / HIGH_WATER_FILE))
        try:
            store.runner_id = (await db.one("SELECT runner_id FROM identity"))[0]
            if (head := await store.head_seq()) < store.issued.marks.seq:
                store._seq_floor = store.issued.marks.seq
                log.info(
                    "%s ends at event %d, below the %d this home has used: it goes on from there",
                    path,
                    head,
                    store._seq_floor,
                )
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        self.issued.close()
        await self.db.close()

    # ---- the event log ----

    async def _append(self, tx: Tx, goal_id: int | None, data: EventData, pending: list[Event]) -> Event:
        ts = utcnow()
        row = (goal_id, ts.isoformat(), data.kind, data.model_dump_json())
        if self._seq_floor:
            seq = await tx.insert(INSERT_EVENT_ABOVE, (*row, self._seq_floor))
        else:
            seq = await tx.insert(INSERT_EVENT, row)
        event = Event(seq=seq, goal_id=goal_id, ts=ts, data=data)
        pending.append(event)
        return event

    def _announce(self, events: list[Event]) -> None:
        """Tell the listeners of committed events, the high-water marks raised first (what anyone
        hears of is never numbered again)."""
        if events:
            approvals = [e.data.approval.id for e in events if isinstance(e.data, ApprovalRequested)]
            self.issued.raise_to(
                goal=max(e.goal_id or 0 for e in events),
                approval=max(approvals, default=0),
                seq=events[-1].seq,
            )
            if events[-1].seq > self._seq_floor:
                self._seq_floor = 0
        for event in events:
            self.on_event(event)

    @_waits_for_space
    async def append_event(self, goal_id: int | None, data: EventData) -> Event:
        pending: list[Event] = []
        async with self.db.write() as tx:
            event = await self._append(tx, goal_id, data, pending)
        self._announce(pending)
        return event

    def number_above_marks(self) -> None:
        """After events were deleted (storage/pruning.py): the next is still numbered above every
        seq this home has handed out, not one above the newest left."""
        self._seq_floor = max(self._seq_floor, self.issued.marks.seq)

    async def events_since(self, seq: int, limit: int = 500, goal_id: int | None = None) -> list[Event]:
        if goal_id is None:
            rows = await self.db.fetchall(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
            )
        else:
            rows = await self.db.fetchall(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE seq > ? AND goal_id = ? ORDER BY seq LIMIT ?",
                (seq, goal_id, limit),
            )
        return [_event(row) for row in rows]

    async def stored_events_since(
        self, seq: int, limit: int = 500, goal_id: int | None = None
    ) -> list[sqlite3.Row]:
        """The events after `seq` as stored, for a subscriber to be sent without reading each one
        into its model: `stored_event_json(row)` makes each row the JSON of its Event."""
        where = "seq > ?" if goal_id is None else "seq > ? AND goal_id = ?"
        params = (seq, limit) if goal_id is None else (seq, goal_id, limit)
        return await self.db.fetchall(
            f"SELECT {_EVENT_COLUMNS}, plain FROM events WHERE {where} ORDER BY seq LIMIT ?", params
        )

    async def head_seq(self, goal_id: int | None = None) -> int:
        if goal_id is None:
            row = await self.db.one("SELECT COALESCE(MAX(seq), 0) FROM events")
        else:
            row = await self.db.one("SELECT COALESCE(MAX(seq), 0) FROM events WHERE goal_id = ?", (goal_id,))
        return int(row[0])

    async def log_head(self, goal_id: int | None = None) -> int:
        """The seq new events come after: the newest one, or, while the log (restored from an
        earlier copy) ends below the home's high-water mark, that mark, which the next event is
        numbered above. A subscriber that had read up to it hears of nothing amiss and misses nothing."""
        head = await self.head_seq(goal_id)
        return head if goal_id is not None else max(head, self._seq_floor)

    async def set_cursor(self, client: str, seq: int) -> None:
        """Keep a client's acked position. One the disk has no room for is dropped: the client acks
        again, and a position left behind only means events sent twice, which clients skip by seq."""
        try:
            await self.db.execute(
                "INSERT INTO cursors (client, acked_seq, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (client) DO UPDATE SET acked_seq = MAX(acked_seq, excluded.acked_seq), "
                "updated_at = excluded.updated_at",
                (client, seq, utcnow().isoformat()),
            )
        except sqlite3.Error as exc:
            if not is_disk_full(exc):
                raise
            log.warning("%s's ack of event %d not kept: the disk is full", client, seq)

    async def cursor(self, client: str) -> int:
        row = await self.db.fetchone("SELECT acked_seq FROM cursors WHERE client = ?", (client,))
        return int(row[0]) if row else 0

    # ---- goals ----

    @_waits_for_space
    async def create_goal(
        self,
        *,
        text: str,
        owner: str,
        agent: str,
        budget: Budget,
        metric: str | None,
        direction: str,
        target: float | None,
        workspace_root: Path,
        executor: str | None = None,
        gpus_per_experiment: int | None = None,
        stages: list[str] | None = None,
        submit_key: str | None = None,
    ) -> Goal:
        """Insert an accepted goal (its stop rule and budgets already explicit) and announce it.
        sqlite3.IntegrityError when a goal was made under `submit_key` already (goal_by_key)."""
        pending: list[Event] = []
        now = utcnow()
        async with self.db.write() as tx:
            goal_id = await self._new_goal_id(tx, workspace_root)
            await tx.insert(
                "INSERT INTO goals (id, text, owner, agent, state, budget, metric, direction, target, "
                "workspace, created_at, accepted_at, executor, gpus_per_experiment, stages, submit_key) "
                "VALUES (?, ?, ?, ?, 'accepted', ?, ?, ?, ?, '', ?, ?, ?, ?, ?, ?)",
                (
                    goal_id,
                    text,
                    owner,
                    agent,
                    budget.model_dump_json(),
                    metric,
                    direction,
                    target,
                    now.isoformat(),
                    now.isoformat(),
                    executor,
                    gpus_per_experiment,
                    json.dumps(stages or []),
                    submit_key,
                ),
            )
            workspace = str(workspace_root / f"goal-{goal_id}")
            await tx.run("UPDATE goals SET workspace = ? WHERE id = ?", (workspace, goal_id))
            goal = await self._goal(tx, goal_id)
            await self._append(tx, goal_id, GoalAccepted(goal=goal), pending)
        self._announce(pending)
        return goal

    async def _new_goal_id(self, tx: Tx, workspace_root: Path) -> int:
        """Above every goal this database and this home have had, and with no goal's workspace yet:
        a workspace left by a goal the database no longer knows (restored from an earlier copy) is
        never handed to a new goal. (A goal's workspace holds its agent's log from its start; a
        directory an operator prepared for the next goal holds none.)"""
        highest = (await tx.one("SELECT COALESCE(MAX(id), 0) FROM goals"))[0]
        goal_id = max(highest, self.issued.marks.goal) + 1
        while (workspace_root / f"goal-{goal_id}" / AGENT_LOG).exists():
            goal_id += 1
        return goal_id

    async def _goal(self, tx: Tx, goal_id: int) -> Goal:
        row = await tx.row("SELECT * FROM goals WHERE id = ?", (goal_id,))
        if row is None:
            raise KeyError(goal_id)
        return _goal(row)

    async def goal_by_key(self, submit_key: str) -> Goal | None:
        row = await self.db.fetchone("SELECT * FROM goals WHERE submit_key = ?", (submit_key,))
        return _goal(row) if row else None

    async def get_goal(self, goal_id: int) -> Goal | None:
        row = await self.db.fetchone("SELECT * FROM goals WHERE id = ?", (goal_id,))
        return _goal(row) if row else None

    async def list_goals(
        self, active_only: bool = False, *, limit: int | None = None, before: int | None = None
    ) -> list[Goal]:
        """Goals, oldest first; with `limit`, the newest `limit` of them (ids under `before`, when
        given). The state is filtered here, in SQL on its index: a long history costs nothing."""
        where, params = _goal_filter(active_only, before)
        if limit is None:
            rows = await self.db.fetchall(f"SELECT * FROM goals {where} ORDER BY id", params)
        else:
            rows = await self.db.fetchall(
                f"SELECT * FROM (SELECT * FROM goals {where} ORDER BY id DESC LIMIT ?) ORDER BY id",
                [*params, limit],
            )
        return [_goal(row) for row in rows]

    async def active_goal_states(self) -> dict[str, int]:
        """How many goals are in each state that is not an end (what monitoring shows)."""
        rows = await self.db.fetchall(f"SELECT state, COUNT(*) FROM goals WHERE {_ACTIVE} GROUP BY state")
        return {row[0]: int(row[1]) for row in rows}

    @_waits_for_space
    async def set_goal_state(
        self, goal_id: int, state: GoalState, reason: str = "", *, only_from: Iterable[str] | None = None
    ) -> Goal | None:
        """Move a goal to `state` and log it. Returns None (and changes nothing) when the goal is
        already in a terminal state, or not in one of `only_from` when that is given. A goal paused
        for a full disk and paused (by a person) stays so: it no longer resumes by itself."""
        pending: list[Event] = []
        async with self.db.write() as tx:
            goal = await self._goal(tx, goal_id)
            allowed = set(only_from) if only_from is not None else None
            if goal.state in TERMINAL_STATES or (allowed is not None and goal.state not in allowed):
                return None
            if goal.state == state and not (state == "paused" and await self._paused_for_disk(tx, goal_id)):
                return goal
            ended = utcnow().isoformat() if state in TERMINAL_STATES else None
            await tx.run(
                "UPDATE goals SET state = ?, ended_at = COALESCE(?, ended_at), paused_for_disk = 0, "
                "end_reason = CASE WHEN ? IS NULL THEN end_reason ELSE ? END WHERE id = ?",
                (state, ended, ended, reason, goal_id),
            )
            await self._append(tx, goal_id, GoalStateChanged(state=state, reason=reason), pending)
            goal = await self._goal(tx, goal_id)
        self._announce(pending)
        return goal

    @_waits_for_space
    async def pause_for_disk(self, goal_id: int, reason: str) -> Goal | None:
        """Pause a running goal because its disk is full (so that it resumes by itself when there
        is room: end_disk_pause). None, changing nothing, unless it was running or waiting."""
        pending: list[Event] = []
        async with self.db.write() as tx:
            goal = await self._goal(tx, goal_id)
            if goal.state not in ("running", "waiting_for_approval"):
                return None
            await tx.run("UPDATE goals SET state = 'paused', paused_for_disk = 1 WHERE id = ?", (goal_id,))
            await self._append(tx, goal_id, GoalStateChanged(state="paused", reason=reason), pending)
            goal = await self._goal(tx, goal_id)
        self._announce(pending)
        return goal

    @_waits_for_space
    async def end_disk_pause(self, goal_id: int, reason: str) -> Goal | None:
        """Resume a goal that pause_for_disk paused (running, or waiting if an approval is
        pending). None, changing nothing, if it is no longer paused for that."""
        pending: list[Event] = []
        async with self.db.write() as tx:
            if not await self._paused_for_disk(tx, goal_id):
                return None
            waiting = await tx.row(
                "SELECT 1 FROM approvals WHERE goal_id = ? AND state = 'pending' LIMIT 1", (goal_id,)
            )
            state: GoalState = "waiting_for_approval" if waiting else "running"
            await tx.run("UPDATE goals SET state = ?, paused_for_disk = 0 WHERE id = ?", (state, goal_id))
            await self._append(tx, goal_id, GoalStateChanged(state=state, reason=reason), pending)
            goal = await self._goal(tx, goal_id)
        self._announce(pending)
        return goal

    async def paused_for_disk(self, goal_id: int) -> bool:
        return await self.db.fetchone(_PAUSED_FOR_DISK, (goal_id,)) is not None

    async def _paused_for_disk(self, tx: Tx, goal_id: int) -> bool:
        return await tx.row(_PAUSED_FOR_DISK, (goal_id,)) is not None

    @_waits_for_space
    async def set_agent_pid(self, goal_id: int, pid: int | None) -> None:
        await self.db.execute("UPDATE goals SET agent_pid = ? WHERE id = ?", (pid, goal_id))

    @_waits_for_space
    async def update_budget(self, goal_id: int, budget: Budget, reason: str) -> Goal:
        pending: list[Event] = []
        async with self.db.write() as tx:
            await tx.run("UPDATE goals SET budget = ? WHERE id = ?", (budget.model_dump_json(), goal_id))
            await self._append(tx, goal_id, BudgetChanged(budget=budget, reason=reason), pending)
            goal = await self._goal(tx, goal_id)
        self._announce(pending)
        return goal

    @_waits_for_space
    async def set_agent_report(self, goal_id: int, text: str) -> None:
        await self.db.execute("UPDATE goals SET agent_report = ? WHERE id = ?", (text, goal_id))

    async def agent_report(self, goal_id: int) -> str | None:
        row = await self.db.fetchone("SELECT agent_report FROM goals WHERE id = ?", (goal_id,))
        return row[0] if row else None

    @_waits_for_space
    async def advance_stage(self, goal_id: int, reason: str) -> Goal:
        """The humans approved the goal's stage: the next one starts (said in its thread)."""
        pending: list[Event] = []
        async with self.db.write() as tx:
            await tx.run("UPDATE goals SET stage = stage + 1 WHERE id = ?", (goal_id,))
            goal = _goal(await tx.one("SELECT * FROM goals WHERE id = ?", (goal_id,)))
            name = goal.stage_name or ""
            await self._append(
                tx,
                goal_id,
                StageChanged(stage=goal.stage, name=name, of=len(goal.stages), reason=reason),
                pending,
            )
        self._announce(pending)
        return goal

    async def block_experiments(self, goal_id: int, why: str | None) -> None:
        """Hold (or, with None, release) every new experiment of the goal, saying why."""
        await self.db.execute("UPDATE goals SET blocked = ? WHERE id = ?", (why, goal_id))

    async def set_goal_metric(self, goal_id: int, metric: str, direction: str) -> None:
        await self.db.execute(
            "UPDATE goals SET metric = ?, direction = ? WHERE id = ? AND metric IS NULL",
            (metric, direction, goal_id),
        )

    # ---- the experiment ledger ----

    @_waits_for_space
    async def start_experiment(
        self,
        goal_id: int,
        *,
        description: str,
        command: list[str],
        params: dict[str, Any],
        metric_name: str | None,
        experiments_dir: Path,
        eval_command: list[str] | None = None,
        waiting: str | None = None,
        executor: str = "local",
        host: str | None = None,
        gpus: int = 0,
        devices: str | None = None,
    ) -> Experiment:
        """Reserve the next attempted index and log the experiment as running, or as queued
        (`waiting`: why, and where it stands) until `experiment_started`."""
        pending: list[Event] = []
        async with self.db.write() as tx:
            index = (
                await tx.one(
                    "SELECT COALESCE(MAX(idx), 0) + 1 FROM experiments WHERE goal_id = ?", (goal_id,)
                )
            )[0]
            log_path = str(experiments_dir / f"{index:03d}" / "run.log")
            experiment_id = await tx.insert(
                "INSERT INTO experiments (goal_id, idx, description, command, params, status, "
                "metric_name, started_at, log_path, eval_command, note, executor, host, gpus, devices) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    goal_id,
                    index,
                    description,
                    json.dumps(command),
                    json.dumps(params),
                    "running" if waiting is None else "queued",
                    metric_name,
                    utcnow().isoformat(),
                    log_path,
                    json.dumps(eval_command) if eval_command else None,
                    waiting,
                    executor,
                    host,
                    gpus,
                    devices,
                ),
            )
            experiment = await self._experiment(tx, experiment_id)
            data = (
                ExperimentStarted(experiment=experiment)
                if waiting is None
                else ExperimentQueued(experiment=experiment, waiting=waiting)
            )
            await self._append(tx, goal_id, data, pending)
        self._announce(pending)
        return experiment

    @_waits_for_space
    async def experiment_waiting(self, experiment_id: int, waiting: str) -> None:
        """A queued experiment's place in the queue changed."""
        pending: list[Event] = []
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE experiments SET note = ? WHERE id = ? AND status = 'queued'", (waiting, experiment_id)
            )
            experiment = await self._experiment(tx, experiment_id)
            if experiment.status == "queued":
                await self._append(
                    tx, experiment.goal_id, ExperimentQueued(experiment=experiment, waiting=waiting), pending
                )
        self._announce(pending)

    @_waits_for_space
    async def experiment_started(
        self, experiment_id: int, *, executor: str, host: str | None, gpus: int, devices: str | None
    ) -> Experiment:
        """A queued experiment got its slot: it runs from now (its wait is kept as queued_seconds)."""
        pending: list[Event] = []
        now = utcnow()
        async with self.db.write() as tx:
            queued = await self._experiment(tx, experiment_id)
            await tx.run(
                "UPDATE experiments SET status = 'running', started_at = ?, queued_seconds = ?, note = NULL, "
                "executor = ?, host = ?, gpus = ?, devices = ? WHERE id = ? AND status = 'queued'",
                (
                    now.isoformat(),
                    (now - queued.started_at).total_seconds(),
                    executor,
                    host,
                    gpus,
                    devices,
                    experiment_id,
                ),
            )
            experiment = await self._experiment(tx, experiment_id)
            await self._append(tx, experiment.goal_id, ExperimentStarted(experiment=experiment), pending)
        self._announce(pending)
        return experiment

    async def _experiment(self, tx: Tx, experiment_id: int) -> Experiment:
        return _experiment(await tx.one("SELECT * FROM experiments WHERE id = ?", (experiment_id,)))

    @_waits_for_space
    async def set_experiment_placement(
        self, experiment_id: int, *, host: str, job_id: str, pid: int | None = None
    ) -> None:
        """Where its process runs: its pid (local), or its job id in Ray or Slurm."""
        await self.db.execute(
            "UPDATE experiments SET host = ?, job_id = ?, pid = ? WHERE id = ?",
            (host, job_id, pid, experiment_id),
        )

    @_waits_for_space
    async def finish_experiment(
        self,
        experiment_id: int,
        *,
        status: str,
        metric_value: float | None,
        metrics: dict[str, float],
        wall_seconds: float | None,
        cpu_seconds: float | None,
        compute_hours: float | None,
        peak_rss_mb: float | None,
        exit_code: int | None,
        note: str | None,
        new_best: bool = False,
        verified: bool = False,
        peak_gpu_memory_mb: float | None = None,
        gpu_utilization: float | None = None,
        interval: tuple[float, float, str] | None = None,
        within_noise: bool = False,
        repeats: int = 1,
    ) -> Experiment:
        pending: list[Event] = []
        low, high, how = interval if interval is not None else (None, None, None)
        async with self.db.write() as tx:
            await tx.run(
                "UPDATE experiments SET status = ?, metric_value = ?, metrics = ?, ended_at = ?, "
                "wall_seconds = ?, cpu_seconds = ?, compute_hours = ?, peak_rss_mb = ?, exit_code = ?, "
                "note = ?, verified = ?, peak_gpu_memory_mb = ?, gpu_utilization = ?, "
                "interval_low = ?, interval_high = ?, interval_how = ?, within_noise = ?, repeats = ? "
                "WHERE id = ? AND status IN ('running', 'queued')",
                (
                    status,
                    metric_value,
                    json.dumps(metrics),
                    utcnow().isoformat(),
                    wall_seconds,
                    cpu_seconds,
                    compute_hours,
                    peak_rss_mb,
                    exit_code,
                    note,
                    verified,
                    peak_gpu_memory_mb,
                    gpu_utilization,
                    low,
                    high,
                    how,
                    within_noise,
                    repeats,
                    experiment_id,
                ),
            )
            experiment = await self._experiment(tx, experiment_id)
            await self._append(
                tx,
                experiment.goal_id,
                ExperimentFinished(experiment=experiment, new_best=new_best),
                pending,
            )
        self._announce(pending)
        return experiment

    async def get_experiment(self, experiment_id: int) -> Experiment | None:
        row = await self.db.fetchone("SELECT * FROM experiments WHERE id = ?", (experiment_id,))
        return _experiment(row) if row else None

    async def log_location(self, experiment_id: int) -> tuple[Path, Path] | None:
        """(its goal's workspace, its log) for an experiment: what a log fetch reads, chunk after
        chunk. Neither ever changes, and no goal or experiment is ever deleted, so a location once
        read is kept (the newest LOG_LOCATIONS_KEPT): a fetch's later chunks cost no query."""
        if (known := self._log_locations.get(experiment_id)) is not None:
            self._log_locations.move_to_end(experiment_id)
            return known
        row = await self.db.fetchone(
            "SELECT goals.workspace, experiments.log_path FROM experiments "
            "JOIN goals ON goals.id = experiments.goal_id WHERE experiments.id = ?",
            (experiment_id,),
        )
        if row is None:
            return None
        location = self._log_locations[experiment_id] = (Path(row[0]), Path(row[1]))
        if len(self._log_locations) > LOG_LOCATIONS_KEPT:
            self._log_locations.popitem(last=False)
        return location

    async def experiments(self, goal_id: int) -> list[Experiment]:
        rows = await self.db.fetchall("SELECT * FROM experiments WHERE goal_id = ? ORDER BY idx", (goal_id,))
        return [_experiment(row) for row in rows]

    async def running_experiments(self) -> list[Experiment]:
        """Running or queued: what a restart finds unfinished."""
        rows = await self.db.fetchall(
            "SELECT * FROM experiments WHERE status IN ('running', 'queued') ORDER BY id"
        )
        return [_experiment(row) for row in rows]

    async def usage(self, goal_id: int) -> tuple[int, float]:
        """(experiments attempted, compute-hours used) for a goal. Interrupted runs (cut short by
        the runner itself) are not counted as attempted; what they used is charged all the same."""
        row = await self.db.one(
            "SELECT COALESCE(SUM(status != 'interrupted'), 0), COALESCE(SUM(compute_hours), 0) "
            "FROM experiments WHERE goal_id = ?",
            (goal_id,),
        )
        return int(row[0]), float(row[1])

    async def ledgers(self, goal_ids: list[int]) -> dict[int, Ledger]:
        """Each goal's ledger in brief (what a status shows), for many goals in four queries: the
        totals grouped per goal, the best and the running experiment, never the whole ledger."""
        ids = json.dumps(goal_ids)  # one parameter, however many goals
        ledgers = {goal_id: Ledger() for goal_id in goal_ids}
        for row in await self.db.fetchall(_LEDGER_TOTALS, (ids,)):
            ledgers[row[0]].attempted, ledgers[row[0]].compute_hours_used = int(row[1]), float(row[2])
        for row in await self.db.fetchall(_BEST_EXPERIMENTS, (ids,)):
            ledgers[row["goal_id"]].best = _experiment(row)
        for row in await self.db.fetchall(_RUNNING_EXPERIMENTS, (ids,)):
            ledgers[row["goal_id"]].running = _experiment(row)
        for row in await self.db.fetchall(_PENDING_APPROVALS_OF, (ids,)):
            ledgers[row["goal_id"]].pending_approvals.append(_approval(row))
        for goal_id, used in (await self.tokens_used(goal_ids)).items():
            ledgers[goal_id].tokens_used = used
        return ledgers

    async def tokens_used(self, goal_ids: list[int]) -> dict[int, int]:
        """Each goal's agent tokens so far, from its metered counters (on the metrics index)."""
        series: dict[int, dict[str, list[float]]] = {}
        rows = await self.db.fetchall(
            f"SELECT goal_id, name, value FROM metrics WHERE {_OF_GOALS} AND name IN (?, ?) ORDER BY id",
            (json.dumps(goal_ids), *TOKEN_METRICS),
        )
        for goal_id, name, value in rows:
            series.setdefault(goal_id, {}).setdefault(name, []).append(value)
        return {goal_id: tokens_used(counters) for goal_id, counters in series.items()}

    # ---- metrics ----

    @_waits_for_space
    async def add_metrics(self, goal_id: int, experiment_id: int | None, points: list[MetricPoint]) -> Event:
        pending: list[Event] = []
        now = utcnow().isoformat()
        async with self.db.write() as tx:
            await tx.run_many(
                "INSERT INTO metrics (goal_id, experiment_id, name, step, value, ts) VALUES (?, ?, ?, ?, ?, ?)",
                [(goal_id, experiment_id, p.name, p.step, p.value, now) for p in points],
            )
            for some in _event_sized(points):
                event = await self._append(
                    tx, goal_id, MetricsLogged(experiment_id=experiment_id, points=some), pending
                )
        self._announce(pending)
        return event

    async def metric_series(
        self, goal_id: int, name: str, experiment_id: int | None = None
    ) -> list[tuple[float | None, float]]:
        sql = "SELECT step, value FROM metrics WHERE goal_id = ? AND name = ?"
        params: list[Any] = [goal_id, name]
        if experiment_id is not None:
            sql += " AND experiment_id = ?"
            params.append(experiment_id)
        rows = await self.db.fetchall(sql + " ORDER BY id", params)
        return [(row[0], row[1]) for row in rows]

    async def loss_curves(self, goal_id: int, experiment_id: int) -> dict[str, tuple[float, float, int]]:
        """A run's training-loss curves (series named *loss, e.g. train_loss, train/loss), in the
        order they began, each as (first value, last value, points). Counted by SQLite: a run may
        log millions of points, and their rows loaded here held the runner for seconds."""
        where = "FROM metrics WHERE goal_id = ? AND experiment_id = ? AND name LIKE '%loss' GROUP BY name"
        # With one min() or max() in a query, SQLite takes `value` from the row that has it.
        firsts = await self.db.fetchall(
            f"SELECT name, value, MIN(id), COUNT(*) {where}", (goal_id, experiment_id)
        )
        lasts = await self.db.fetchall(f"SELECT name, value, MAX(id) {where}", (goal_id, experiment_id))
        last_of = {name: value for name, value, _ in lasts}
        return {
            name: (first, last_of[name], count)
            for name, first, _, count in sorted(firsts, key=lambda row: row[2])
        }

    # ---- approvals ----

    @_waits_for_space
    async def create_approval(
        self, goal_id: int, *, kind: str, question: str, detail: str, expires_at: datetime
    ) -> Approval:
        pending: list[Event] = []
        async with self.db.write() as tx:
            approval_id = await tx.insert(  # numbered above the home's mark, as goals are
                "INSERT INTO approvals (id, goal_id, kind, question, detail, state, requested_at, expires_at) "
                "VALUES (MAX(?, (SELECT COALESCE(MAX(id), 0) FROM approvals)) + 1, ?, ?, ?, ?, 'pending', ?, ?)",
                (
                    self.issued.marks.approval,
                    goal_id,
                    kind,
                    question,
                    detail,
                    utcnow().isoformat(),
                    expires_at.isoformat(),
                ),
            )
            approval = await self._approval(tx, approval_id)
            await self._append(tx, goal_id, ApprovalRequested(approval=approval), pending)
        self._announce(pending)
        return approval

    async def _approval(self, tx: Tx, approval_id: int) -> Approval:
        row = await tx.row("SELECT * FROM approvals WHERE id = ?", (approval_id,))
        if row is None:
            raise KeyError(approval_id)
        return _approval(row)

    async def get_approval(self, approval_id: int) -> Approval | None:
        row = await self.db.fetchone("SELECT * FROM approvals WHERE id = ?", (approval_id,))
        return _approval(row) if row else None

    @_waits_for_space
    async def decide_approval(
        self, approval_id: int, *, state: str, by: str, comment: str | None = None
    ) -> tuple[Approval, bool]:
        """Record a decision if the approval is still pending. Returns (approval, decided_now):
        the first decision wins, a later one changes nothing."""
        pending: list[Event] = []
        async with self.db.write() as tx:
            decided_now = (
                await tx.run(
                    "UPDATE approvals SET state = ?, decided_by = ?, decided_at = ?, comment = ? "
                    "WHERE id = ? AND state = 'pending'",
                    (state, by, utcnow().isoformat(), comment, approval_id),
                )
                == 1
            )
            approval = await self._approval(tx, approval_id)
            if decided_now:
                await self._append(tx, approval.goal_id, ApprovalDecided(approval=approval), pending)
        self._announce(pending)
        return approval, decided_now

    async def pending_approvals(self, goal_id: int | None = None) -> list[Approval]:
        if goal_id is None:
            rows = await self.db.fetchall("SELECT * FROM approvals WHERE state = 'pending' ORDER BY id")
        else:
            rows = await self.db.fetchall(
                "SELECT * FROM approvals WHERE state = 'pending' AND goal_id = ? ORDER BY id", (goal_id,)
            )
        return [_approval(row) for row in rows]

    # ---- inbox (steering) ----

    @_waits_for_space
    async def add_inbox(self, goal_id: int, author: str, text: str) -> InboxMessage:
        pending: list[Event] = []
        async with self.db.write() as tx:
            message_id = await tx.insert(
                "INSERT INTO inbox (goal_id, author, text, created_at) VALUES (?, ?, ?, ?)",
                (goal_id, author, text, utcnow().isoformat()),
            )
            message = _inbox(await tx.one("SELECT * FROM inbox WHERE id = ?", (message_id,)))
            await self._append(tx, goal_id, SteerReceived(message=message), pending)
        self._announce(pending)
        return message

    @_waits_for_space
    async def read_inbox(self, goal_id: int, *, unread_only: bool = True) -> list[InboxMessage]:
        """Messages for the goal, oldest first; unread ones are marked read as they are returned
        (a write only when there are any: an empty inbox is read on a full disk too)."""
        async with self.db.write() as tx:
            where = "goal_id = ? AND read_at IS NULL" if unread_only else "goal_id = ?"
            messages = [
                _inbox(row)
                for row in await tx.rows(f"SELECT * FROM inbox WHERE {where} ORDER BY id", (goal_id,))
            ]
            if any(message.read_at is None for message in messages):
                await tx.run(
                    "UPDATE inbox SET read_at = ? WHERE goal_id = ? AND read_at IS NULL",
                    (utcnow().isoformat(), goal_id),
                )
        return messages

    async def inbox(self, goal_id: int, *, unread_only: bool = True) -> list[InboxMessage]:
        """read_inbox's messages, marking none (a read, which a full disk allows)."""
        where = "goal_id = ? AND read_at IS NULL" if unread_only else "goal_id = ?"
        rows = await self.db.fetchall(f"SELECT * FROM inbox WHERE {where} ORDER BY id", (goal_id,))
        return [_inbox(row) for row in rows]

    # ---- diary (session memory) ----

    @_waits_for_space
    async def write_diary(self, goal_id: int, kind: str, text: str) -> DiaryEntry:
        entry_id = await self.db.execute(
            "INSERT INTO diary (goal_id, ts, kind, text) VALUES (?, ?, ?, ?)",
            (goal_id, utcnow().isoformat(), kind, text),
        )
        return DiaryEntry(**dict(await self.db.one("SELECT * FROM diary WHERE id = ?", (entry_id,))))

    async def read_diary(self, goal_id: int, *, last: int = 20, kind: str | None = None) -> list[DiaryEntry]:
        sql = "SELECT * FROM diary WHERE goal_id = ?"
        params: list[Any] = [goal_id]
        if kind:
            sql += " AND kind = ?"
            params.append(kind)
        rows = await self.db.fetchall(sql + " ORDER BY id DESC LIMIT ?", [*params, last])
        return [DiaryEntry(**dict(row)) for row in reversed(rows)]

    # ---- the audit trail ----

    @_waits_for_space
    async def add_audit(
        self,
        *,
        actor: str,
        action: str,
        goal_id: int | None,
        outcome: str,
        detail: str = "",
        ts: datetime | None = None,
    ) -> AuditEntry:
        """Enter an action, made at `ts` (now, unless it waited for room to be written)."""
        entry_id = await self.db.execute(
            "INSERT INTO audit (ts, actor, action, goal_id, outcome, detail) VALUES (?, ?, ?, ?, ?, ?)",
            ((ts or utcnow()).isoformat(), actor, action, goal_id, outcome, detail),
        )
        return AuditEntry(**dict(await self.db.one("SELECT * FROM audit WHERE id = ?", (entry_id,))))

    async def audit_entries(self, goal_id: int | None = None, limit: int = 200) -> list[AuditEntry]:
        """The newest `limit` entries (of one goal, or all), oldest first."""
        if goal_id is None:
            rows = await self.db.fetchall("SELECT * FROM audit ORDER BY id DESC LIMIT ?", (limit,))
        else:
            rows = await self.db.fetchall(
                "SELECT * FROM audit WHERE goal_id = ? ORDER BY id DESC LIMIT ?", (goal_id, limit)
            )
        return [AuditEntry(**dict(row)) for row in reversed(rows)]

    # ---- models and data fetched from the hub (their events are the record) ----

    async def hub_fetches(self, goal_id: int) -> list[HubFetch]:
        rows = await self.db.fetchall(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE goal_id = ? AND kind = 'hub_fetched' ORDER BY seq",
            (goal_id,),
        )
        return [event.data.fetch for event in map(_event, rows) if isinstance(event.data, HubFetched)]

    # ---- posts folded beyond their goal's rate (runner/folding.py) ----

    async def folded_unshown(self, goal_id: int) -> int:
        """The goal's folded posts that no PostsFolded shows yet."""
        return (await _folded_since_shown(self.db, goal_id))[0]

    @_waits_for_space
    async def show_folded(self, goal_id: int) -> Event | None:
        """Log one PostsFolded for the goal's folded posts after its last one (in one transaction,
        so each folded post is in exactly one); None when there are none."""
        pending: list[Event] = []
        async with self.db.write() as tx:
            count, milestones, first_seq, last_seq, since = await _folded_since_shown(tx, goal_id)
            if not count:
                return None
            where = f"{_FOLDED} AND seq > ?"
            first = await tx.rows(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE {where} ORDER BY seq LIMIT ?",
                (goal_id, since, FOLDED_TITLES_KEPT),
            )
            latest = await tx.rows(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE {where} AND seq > ? ORDER BY seq DESC LIMIT ?",
                (goal_id, since, first[-1]["seq"], FOLDED_TITLES_KEPT),
            )
            shown = PostsFolded(
                milestones=milestones,
                fetches=count - milestones,
                first_seq=first_seq,
                last_seq=last_seq,
                titles=[_folded_title(row) for row in first],
                latest_titles=[_folded_title(row) for row in reversed(latest)],
            )
            event = await self._append(tx, goal_id, shown, pending)
        self._announce(pending)
        return event

    # ---- the final report ----

    async def record_report(
        self, goal_id: int, *, end_reason: str, text: str, best: Experiment | None
    ) -> Event:
        return await self.append_event(goal_id, FinalReport(end_reason=end_reason, text=text, best=best))

    async def has_report(self, goal_id: int) -> bool:
        row = await self.db.fetchone(
            "SELECT 1 FROM events WHERE goal_id = ? AND kind = 'report' LIMIT 1", (goal_id,)
        )
        return row is not None


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
_ACTIVE_STATES = [state for state in get_args(GoalState) if state not in TERMINAL_STATES]
_ACTIVE = "state IN ({})".format(", ".join(f"'{state}'" for state in _ACTIVE_STATES))
_OF_GOALS = "goal_id IN (SELECT value FROM json_each(?))"
_LEDGER_TOTALS = (
    "SELECT goal_id, SUM(status != 'interrupted'), COALESCE(SUM(compute_hours), 0) "
    f"FROM experiments WHERE {_OF_GOALS} GROUP BY goal_id"
)
# The kept experiment with the best headline, the first (lowest idx) of equals, as best_experiment.
_BEST_EXPERIMENTS = f"""
    SELECT * FROM (
        SELECT e.*, ROW_NUMBER() OVER (
            PARTITION BY e.goal_id
            ORDER BY CASE WHEN g.direction = 'maximize' THEN -e.metric_value ELSE e.metric_value END, e.idx
        ) AS rank
        FROM experiments e JOIN goals g ON g.id = e.goal_id
        WHERE e.{_OF_GOALS} AND e.status = 'keep' AND e.metric_value IS NOT NULL
    ) WHERE rank = 1
"""
_RUNNING_EXPERIMENTS = f"""
    SELECT * FROM (
        SELECT *, ROW_NUMBER() OVER (
            PARTITION BY goal_id ORDER BY status = 'running' DESC, CASE status WHEN 'running' THEN -idx ELSE idx END
        ) AS rank
        FROM experiments WHERE {_OF_GOALS} AND status IN ('running', 'queued')
    ) WHERE rank = 1
"""
_PENDING_APPROVALS_OF = f"SELECT * FROM approvals WHERE state = 'pending' AND {_OF_GOALS} ORDER BY id"


def _goal_filter(active_only: bool, before: int | None) -> tuple[str, list[Any]]:
    conditions, params = [], []
    if active_only:
        conditions.append(_ACTIVE)
    if before is not None:
        conditions.append("id < ?")
        params.append(before)
    return ("WHERE " + " AND ".join(conditions) if conditions else ""), params


def _goal(row: sqlite3.Row) -> Goal:
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


def _experiment(row: sqlite3.Row) -> Experiment:
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


def _approval(row: sqlite3.Row) -> Approval:
    return Approval(**dict(row))


def _inbox(row: sqlite3.Row) -> InboxMessage:
    return InboxMessage(**dict(row))


# Text columns come as bytes, decoded here: text that is not UTF-8 (a row written by other means)
# must fail its own row, not the query that reads a whole batch.
FOLDED_TITLES_KEPT = 25  # titles a PostsFolded keeps of the first folded posts, and of the latest
# A post logged folded: `folded` is in its data only when true (records.Folded). The CASE keeps
# json_extract off a row that is no JSON (one not written by this runner), which would fail the query.
_FOLDED = (
    "goal_id = ? AND kind IN ('milestone', 'hub_fetched') "
    "AND CASE WHEN json_valid(data) THEN json_extract(data, '$.folded') END = 1"
)


async def _folded_since_shown(tx: Database | Tx, goal_id: int) -> tuple[int, int, int, int, int]:
    """(folded posts after the goal's last PostsFolded, how many of them milestones, their first
    and last seq, the last PostsFolded's seq or 0)."""
    row = await tx.one(
        "SELECT COALESCE(MAX(seq), 0) FROM events WHERE goal_id = ? AND kind = 'posts_folded'", (goal_id,)
    )
    since = int(row[0])
    row = await tx.one(
        "SELECT COUNT(*), COALESCE(SUM(kind = 'milestone'), 0), COALESCE(MIN(seq), 0), "
        f"COALESCE(MAX(seq), 0) FROM events WHERE {_FOLDED} AND seq > ?",
        (goal_id, since),
    )
    return int(row[0]), int(row[1]), int(row[2]), int(row[3]), since


def _folded_title(row: sqlite3.Row) -> str:
    """A folded post's title, as its PostsFolded names it."""
    match _event(row).data:
        case MilestoneReported(title=title):
            return title
        case HubFetched(fetch=fetch):
            return f"fetched {fetch.repo_type} {fetch.repo} ({fetch.revision})"
    return "(unreadable)"


_EVENT_COLUMNS = (
    "seq, goal_id, CAST(ts AS BLOB) AS ts, CAST(kind AS BLOB) AS kind, CAST(data AS BLOB) AS data"
)


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
        if plain and (goal_id is None or type(goal_id) is int) and ts.isascii() and _utf8(data)
        else _event(row).model_dump_json().encode()
        for row in rows
        for seq, goal_id, ts, _kind, data, plain in (row,)
    ]


def _utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _event(row: sqlite3.Row) -> Event:
    """The logged event; one that no longer reads back becomes an UnreadableEvent with its seq:
    a row every subscriber would fail on must not stall them all, nor leave a gap in seq order."""
    try:
        data = _event_data.validate_json(row["data"])
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


def _event_sized(points: list[MetricPoint]) -> Iterator[list[MetricPoint]]:
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
