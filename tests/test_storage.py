"""storage/: migrations keyed on user_version, WAL, BEGIN IMMEDIATE writers, typed records."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from goaltender.storage.db import Database
from goaltender.storage.records import Budget, MetricPoint, MilestoneReported, utcnow
from goaltender.storage.runner_schema import MIGRATIONS
from goaltender.storage.runner_store import RunnerStore


async def test_migrations_move_user_version_and_are_idempotent(tmp_path):
    path = tmp_path / "m.db"
    steps = ["CREATE TABLE a (x INTEGER);", "ALTER TABLE a ADD COLUMN y TEXT;\nCREATE TABLE b (z INTEGER);"]
    db = await Database.open(path, steps[:1])
    assert await db.user_version() == 1
    await db.execute("INSERT INTO a (x) VALUES (?)", (7,))
    await db.close()

    # Re-opening with one more step applies only that step, and keeps the data.
    db = await Database.open(path, steps)
    assert await db.user_version() == 2
    row = await db.fetchone("SELECT x, y FROM a")
    assert (row["x"], row["y"]) == (7, None)
    await db.close()

    db = await Database.open(path, steps)  # nothing left to do
    assert await db.user_version() == 2
    assert (await db.fetchone("PRAGMA journal_mode"))[0] == "wal"
    await db.close()


async def test_an_upgraded_runner_db_marks_which_stored_events_a_replay_may_splice(tmp_path):
    """Migration 9 checks the events an older runner logged once (data that is JSON, a time that
    needs no escaping); events logged from then on are checked as they are written."""
    path = tmp_path / "runner.db"
    db = await Database.open(path, MIGRATIONS[:8])
    now = utcnow().isoformat()
    for ts, data in (
        (now, MilestoneReported(title="old").model_dump_json()),
        (now, "not json"),
        ('a"b', "{}"),
    ):
        await db.execute(
            "INSERT INTO events (goal_id, ts, kind, data) VALUES (NULL, ?, 'milestone', ?)", (ts, data)
        )
    await db.close()

    store = await RunnerStore.open(path)
    await store.append_event(None, MilestoneReported(title="new"))
    rows = await store.db.fetchall("SELECT plain FROM events ORDER BY seq")
    assert [row["plain"] for row in rows] == [1, 0, 0, 1]
    assert [event.data.kind for event in await store.events_since(0)] == [
        "milestone",
        "unreadable",
        "unreadable",
        "milestone",
    ]
    await store.close()


async def test_failed_migration_rolls_back_and_keeps_version(tmp_path):
    path = tmp_path / "m.db"
    db = await Database.open(path, ["CREATE TABLE a (x INTEGER);"])
    await db.close()
    try:
        await Database.open(path, ["CREATE TABLE a (x INTEGER);", "CREATE TABLE b (x); CREATE TABLE a (x);"])
    except sqlite3.OperationalError:
        pass
    else:
        raise AssertionError("a broken migration must raise")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'b'").fetchone() is None
    conn.close()


async def test_runner_store_records_round_trip(tmp_path):
    store = await RunnerStore.open(tmp_path / "runner.db")
    assert await store.db.user_version() == len(MIGRATIONS)
    seen = []
    store.on_event = seen.append
    budget = Budget(deadline=utcnow() + timedelta(hours=1), max_experiments=5)
    goal = await store.create_goal(
        text="t",
        owner="ana",
        agent="sweep",
        budget=budget,
        metric=None,
        direction="maximize",
        target=0.9,
        workspace_root=tmp_path / "ws",
    )
    assert goal.state == "accepted" and goal.workspace.endswith("goal-1")
    assert goal.budget == budget
    e = await store.start_experiment(
        goal.id,
        description="baseline",
        command=["python", "x.py"],
        params={"lr": 0.1},
        metric_name="acc",
        experiments_dir=tmp_path / "ws" / "exp",
    )
    assert e.index == 1 and e.log_path.endswith("001/run.log")
    await store.add_metrics(goal.id, e.id, [MetricPoint(name="loss", value=1.5, step=1)])
    done = await store.finish_experiment(
        e.id,
        status="keep",
        metric_value=0.5,
        metrics={"acc": 0.5},
        wall_seconds=1.0,
        cpu_seconds=0.9,
        compute_hours=0.9 / 3600,
        peak_rss_mb=50.0,
        exit_code=0,
        note=None,
        new_best=True,
    )
    assert done.status == "keep" and done.params == {"lr": 0.1} and done.metrics == {"acc": 0.5}
    assert await store.usage(goal.id) == (1, 0.9 / 3600)
    assert await store.metric_series(goal.id, "loss") == [(1.0, 1.5)]
    events = await store.events_since(0)
    assert [ev.seq for ev in events] == list(range(1, len(events) + 1))
    assert [ev.data.kind for ev in events] == [
        "goal_accepted",
        "experiment_started",
        "metrics",
        "experiment_finished",
    ]
    assert [ev.seq for ev in seen] == [ev.seq for ev in events]  # told only what the log holds, in order
    await store.close()


async def test_first_decision_wins(tmp_path):
    store = await RunnerStore.open(tmp_path / "runner.db")
    goal = await store.create_goal(
        text="t",
        owner="o",
        agent="a",
        budget=Budget(),
        metric=None,
        direction="maximize",
        target=None,
        workspace_root=tmp_path,
    )
    approval = await store.create_approval(
        goal.id, kind="cost", question="q?", detail="", expires_at=utcnow() + timedelta(minutes=5)
    )
    first, won = await store.decide_approval(approval.id, state="approved", by="ana")
    second, won_again = await store.decide_approval(approval.id, state="rejected", by="bob")
    assert won and not won_again
    assert first.state == second.state == "approved" and second.decided_by == "ana"
    await store.close()


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from goaltender.storage.records import MilestoneReported
    from goaltender.storage.runner_store import RunnerStore

    async def main(path, name, n):
        store = await RunnerStore.open(path)
        for i in range(n):
            await store.append_event(None, MilestoneReported(title=f"{name}-{i}"))
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


async def test_two_concurrent_writer_processes(tmp_path):
    """Two processes append to one event log at once: nothing lost, seq stays gap-free."""
    path = tmp_path / "runner.db"
    store = await RunnerStore.open(path)  # also a third writer, in this process
    n = 150
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(n)])
        for name in ("left", "right")
    ]
    for i in range(n):
        await store.append_event(None, MilestoneReported(title=f"here-{i}"))
    assert [await asyncio.to_thread(proc.wait) for proc in procs] == [0, 0]
    events = await store.events_since(0, limit=10_000)
    assert [e.seq for e in events] == list(range(1, 3 * n + 1))
    for name in ("left", "right", "here"):
        titles = [e.data.title for e in events if e.data.title.startswith(name)]
        assert titles == [f"{name}-{i}" for i in range(n)]  # each writer's order is kept
    await store.close()


async def test_database_busy_timeout_and_wal(tmp_path):
    db = await Database.open(Path(tmp_path / "x.db"))
    assert (await db.fetchone("PRAGMA busy_timeout"))[0] >= 5000
    assert (await db.fetchone("PRAGMA foreign_keys"))[0] == 1
    await db.close()


async def test_history_indexes_exist_and_answer_the_status_queries(tmp_path):
    store = await RunnerStore.open(tmp_path / "runner.db")
    names = {row[0] for row in await store.db.fetchall("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"goals_by_state", "approvals_by_state"} <= names
    plan = await store.db.fetchall(
        "EXPLAIN QUERY PLAN SELECT * FROM goals WHERE state IN ('running', 'paused')"
    )
    assert any("goals_by_state" in row[3] for row in plan)
    await store.close()


async def _goal_with_ledger(store: RunnerStore, tmp_path: Path, values: list[float | None]) -> int:
    goal = await store.create_goal(
        text="t",
        owner="ana",
        agent="sweep",
        budget=Budget(),
        metric=None,
        direction="maximize",
        target=None,
        workspace_root=tmp_path / "ws",
    )
    for value in values:
        e = await store.start_experiment(
            goal.id,
            description="d",
            command=["x"],
            params={},
            metric_name="acc",
            experiments_dir=tmp_path / "x",
        )
        if value is not None:  # None: left running
            await store.finish_experiment(
                e.id,
                status="keep",
                metric_value=value,
                metrics={},
                wall_seconds=1.0,
                cpu_seconds=1.0,
                compute_hours=0.25,
                peak_rss_mb=1.0,
                exit_code=0,
                note=None,
                new_best=False,
            )
    return goal.id


async def test_active_goals_and_their_ledgers_among_many_finished(tmp_path):
    store = await RunnerStore.open(tmp_path / "runner.db")
    finished = [await _goal_with_ledger(store, tmp_path, [0.1]) for _ in range(30)]
    for goal_id in finished:
        await store.set_goal_state(goal_id, "finished", "done")
    active = await _goal_with_ledger(store, tmp_path, [0.5, 0.9, 0.9, None])
    await store.create_approval(active, kind="gpu", question="q", detail="", expires_at=utcnow())

    assert [g.id for g in await store.list_goals(active_only=True)] == [active]
    assert len(await store.list_goals()) == 31
    assert [g.id for g in await store.list_goals(limit=3)] == [finished[-2], finished[-1], active]
    assert [g.id for g in await store.list_goals(limit=2, before=finished[-1])] == finished[-3:-1]

    ledger = (await store.ledgers([active]))[active]
    assert (ledger.attempted, ledger.compute_hours_used) == (4, 0.75)
    assert ledger.best is not None and ledger.best.index == 2  # the first of equals, as best_experiment
    assert ledger.running is not None and ledger.running.index == 4
    assert [a.goal_id for a in ledger.pending_approvals] == [active]
    assert (await store.ledgers([finished[0]]))[finished[0]].attempted == 1
    await store.close()


async def test_a_write_cancelled_while_its_commit_waits_raises_the_cancellation(tmp_path):
    """Cancelled while its COMMIT waits for the connection's thread, a write cannot take the COMMIT
    back: it runs all the same. The write raises CancelledError, not the failure of a ROLLBACK
    queued behind it (which a bot shutting down mid-post once logged as an error)."""
    db = await Database.open(tmp_path / "c.db", ["CREATE TABLE t (x INTEGER)"])
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) SELECT count(*) FROM c"
    committing = asyncio.Event()
    busy: list[asyncio.Future] = []

    async def write() -> None:
        async with db.write() as tx:
            await tx.run("INSERT INTO t VALUES (1)")
            busy.append(asyncio.ensure_future(db.fetchall(slow)))  # the thread's next job
            await asyncio.sleep(0)  # it is queued first; the COMMIT waits behind it
            committing.set()

    task = asyncio.ensure_future(write())
    await committing.wait()  # `task` ran on to the await of its COMMIT before this resumed
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await busy[0]
    assert (await db.one("SELECT count(*) FROM t"))[0] == 1  # committed after all
    assert not db.conn.in_transaction
    async with db.write() as tx:  # and the next write goes on as usual
        await tx.run("INSERT INTO t VALUES (2)")
    await db.close()


async def test_a_cancelled_commit_that_checkpointed_is_not_taken_for_a_copy_over_the_file(tmp_path):
    """A watched database (runner.db) takes a change to its file that no commit of its own made
    for another program's. A COMMIT whose await was cancelled runs all the same, and its checkpoint
    writes the file: that change is the connection's own, and the next write goes on."""
    db = await Database.open(tmp_path / "c.db", ["CREATE TABLE t (x INTEGER)"], watch=True)
    await db.conn.execute("PRAGMA wal_autocheckpoint=1")  # every commit checkpoints into the file
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) SELECT count(*) FROM c"
    committing = asyncio.Event()
    busy: list[asyncio.Future] = []

    async def write() -> None:
        async with db.write() as tx:
            await tx.run("INSERT INTO t VALUES (?)", (b"x" * 100_000,))  # pages enough to grow the file
            busy.append(asyncio.ensure_future(db.fetchall(slow)))
            await asyncio.sleep(0)
            committing.set()

    task = asyncio.ensure_future(write())
    await committing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await busy[0]
    async with db.write() as tx:
        await tx.run("INSERT INTO t VALUES (2)")
    assert db.check_files() is None and (await db.one("SELECT count(*) FROM t"))[0] == 2
    await db.close()
