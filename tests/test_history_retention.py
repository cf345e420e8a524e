"""Retention: goals that ended long ago lose their events and their runs' logs (the best run's log
kept), bot.db its delivered posts (cards kept); active goals and recent ones are untouched, and
the files shrink. Real SQLite files, real log files, the real runner and the real CLI.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from helpers import eventually

from goaltender.bot.keys import ApprovalKey, CardKey, EventKey
from goaltender.bot.pruning import prune_bot
from goaltender.protocol import messages as p
from goaltender.storage.bot_store import BotStore
from goaltender.storage.db import Database
from goaltender.storage.pruning import file_size, prune_runner
from goaltender.storage.records import Budget, MilestoneReported, utcnow
from goaltender.storage.runner_store import RunnerStore

LOG_BYTES = 20_000  # each run log
EVENTS = 2_000  # each goal's milestones: ~1 MB of events a goal


async def goal_with_history(store: RunnerStore, root: Path, *, ended_days_ago: float | None) -> int:
    """A goal with three runs (the second the best: kept, highest metric), each with a log and a
    seed's log, EVENTS milestones and a final report; ended that many days ago (None: running)."""
    goal = await store.create_goal(
        text="improve it",
        owner="ana",
        agent="sweep",
        budget=Budget(max_experiments=10),
        metric="acc",
        direction="maximize",
        target=None,
        workspace_root=root,
    )
    await store.set_goal_state(goal.id, "running")
    for value in (0.5, 0.9, 0.7):
        run = await store.start_experiment(
            goal.id,
            description=f"acc {value}",
            command=["true"],
            params={},
            metric_name="acc",
            experiments_dir=Path(goal.workspace) / "experiments",
        )
        log = Path(run.log_path)
        log.parent.mkdir(parents=True, exist_ok=True)
        for name in (log.name, "run-2.log", "eval.log"):
            (log.parent / name).write_bytes(b"x" * LOG_BYTES)
        (log.parent / "model.ckpt").write_bytes(b"w")  # not a log: never pruned
        await store.finish_experiment(
            run.id,
            status="keep",
            metric_value=value,
            metrics={"acc": value},
            wall_seconds=1.0,
            cpu_seconds=1.0,
            compute_hours=None,
            peak_rss_mb=None,
            exit_code=0,
            note=None,
        )
    for n in range(EVENTS):
        await store.append_event(goal.id, MilestoneReported(title=f"step {n}", text="detail " * 60))
    if ended_days_ago is not None:
        await store.record_report(goal.id, end_reason="done", text="the report", best=None)
        await store.set_goal_state(goal.id, "finished", "done")
        ended = (utcnow() - timedelta(days=ended_days_ago)).isoformat()
        await store.db.execute("UPDATE goals SET ended_at = ? WHERE id = ?", (ended, goal.id))
    return goal.id


async def pages(db: Database) -> int:
    """The database's size in bytes as its pages count it (the file once checkpointed)."""
    count, size = (await db.one("PRAGMA page_count"))[0], (await db.one("PRAGMA page_size"))[0]
    return int(count) * int(size)


def logs_of(workspace_root: Path, goal_id: int) -> list[str]:
    return sorted(
        str(path.relative_to(workspace_root)) for path in (workspace_root / f"goal-{goal_id}").rglob("*.log")
    )


def event_kinds(db: Path, goal_id: int) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT kind, COUNT(*) FROM events WHERE goal_id = ? GROUP BY kind", (goal_id,))
        return dict(rows.fetchall())
    finally:
        conn.close()


async def test_old_ended_goals_lose_events_and_logs_but_not_the_best_run_log(tmp_path):
    db, root = tmp_path / "runner.db", tmp_path / "workspaces"
    store = await RunnerStore.open(db)
    old = await goal_with_history(store, root, ended_days_ago=100)
    recent = await goal_with_history(store, root, ended_days_ago=10)
    active = await goal_with_history(store, root, ended_days_ago=None)
    before = {goal: (event_kinds(db, goal), logs_of(root, goal)) for goal in (old, recent, active)}

    dry = await prune_runner(store, 90, dry_run=True)
    assert (dry.goals, dry.events, len(dry.logs), dry.best_logs_kept) == (
        1,
        sum(before[old][0].values()) - 1,
        6,
        1,
    )
    assert {goal: (event_kinds(db, goal), logs_of(root, goal)) for goal in before} == before  # nothing gone
    assert dry.lines("runner.db")[0].startswith("runner.db: would remove")

    size = await pages(store.db)  # the database's own size, whatever its -wal holds yet
    pruned = await prune_runner(store, 90)
    print(
        f"\nrunner.db: {size} -> {file_size(db)} bytes, {pruned.events} events pruned, vacuumed={pruned.vacuumed}"
    )
    assert pruned.events == dry.events and pruned.log_bytes == 6 * LOG_BYTES
    # The old goal keeps its final report (and its ledger rows), and the best run's logs alone.
    assert event_kinds(db, old) == {"report": 1}
    assert logs_of(root, old) == [
        f"goal-{old}/experiments/002/{name}" for name in ("eval.log", "run-2.log", "run.log")
    ]
    assert len(list((root / f"goal-{old}").rglob("model.ckpt"))) == 3
    assert len(await store.experiments(old)) == 3 and (await store.get_goal(old)) is not None
    # Recent and active goals are untouched.
    for goal in (recent, active):
        assert (event_kinds(db, goal), logs_of(root, goal)) == before[goal]
    # A third of the file was the old goal's events: VACUUM gives it back to the disk.
    assert pruned.vacuumed and pruned.size_after < size * 0.75, (size, pruned.size_after)
    assert pruned.size_after == file_size(db)
    # Pruning again finds nothing more.
    again = await prune_runner(store, 90)
    assert (again.goals, again.events, again.logs) == (0, 0, [])  # the pruned goal is not looked at again
    await store.close()


async def test_a_pruned_log_never_numbers_an_event_twice(tmp_path):
    """Deleting the newest events let SQLite number the next event one above the newest left: a
    seq the bot had read already."""
    db = tmp_path / "runner.db"
    store = await RunnerStore.open(db)
    kept = await goal_with_history(store, tmp_path / "ws", ended_days_ago=None)
    old = await goal_with_history(store, tmp_path / "ws", ended_days_ago=100)  # its events are the newest
    newest = await store.head_seq()
    await prune_runner(store, 90)
    assert await store.head_seq() < newest
    assert await store.log_head() == newest  # a subscriber reads on from where it was
    event = await store.append_event(kept, MilestoneReported(title="after the prune"))
    assert event.seq == newest + 1
    await store.close()
    store = await RunnerStore.open(db)  # and after a restart (the home's high-water mark)
    assert (await store.append_event(kept, MilestoneReported(title="restarted"))).seq == newest + 2
    assert event_kinds(db, old) == {"report": 1}
    await store.close()


async def test_a_link_on_the_way_to_a_run_log_is_not_followed(tmp_path):
    """The agent controlled the workspace: an experiment directory swapped for a link to files
    elsewhere does not get those files removed."""
    db, root = tmp_path / "runner.db", tmp_path / "ws"
    store = await RunnerStore.open(db)
    goal = await goal_with_history(store, root, ended_days_ago=100)
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "run.log").write_text("keep me")
    first = root / f"goal-{goal}" / "experiments" / "001"
    for entry in first.iterdir():
        entry.unlink()
    first.rmdir()
    first.symlink_to(elsewhere)
    pruned = await prune_runner(store, 90)
    assert (elsewhere / "run.log").read_text() == "keep me"
    assert len(pruned.logs) == 3  # the third run's alone
    await store.close()


async def test_bot_db_drops_old_delivered_posts_but_keeps_cards_and_live_prompts(tmp_path):
    db = tmp_path / "bot.db"
    store = await BotStore.open(db)
    long_ago = (utcnow() - timedelta(days=100)).isoformat()
    for goal_id, state in ((1, "finished"), (2, "running")):
        await store.add_thread("box", goal_id, "C1", "U1")
        status = {"goal": {"state": state, "ended_at": long_ago if state == "finished" else None}}
        await store.set_status("box", goal_id, status)
    keys = [
        CardKey("box", 1),
        ApprovalKey("box", 1, 1),
        CardKey("box", 2),
        ApprovalKey("box", 2, 2),
        *(EventKey("box", seq, 0) for seq in range(1, 3001)),
    ]
    for key in keys:
        await store.enqueue("C1", "post", {"text": "a post " * 40}, str(key))
    await store.db.execute("UPDATE outbox SET state = 'sent', created_at = ?", (long_ago,))
    await store.enqueue("C1", "post", {"text": "not sent yet"}, str(EventKey("box", 9999, 0)))
    await store.db.execute(
        "INSERT INTO slack_events VALUES ('Ev1', ?), ('Ev2', ?)", (long_ago, utcnow().isoformat())
    )

    size = await pages(store.db)
    pruned = await prune_bot(store, 90)
    print(f"\nbot.db: {size} -> {file_size(db)} bytes, {pruned.rows}")
    left = {row[0] for row in await store.db.fetchall("SELECT dedupe_key FROM outbox")}
    assert left == {
        str(CardKey("box", 1)),
        str(CardKey("box", 2)),
        str(ApprovalKey("box", 2, 2)),
        "box:9999:0",
    }
    assert [row[0] for row in await store.db.fetchall("SELECT event_id FROM slack_events")] == ["Ev2"]
    assert pruned.rows == {"delivered post": 3001, "Slack event id": 1}
    assert pruned.vacuumed and pruned.size_after < size / 2
    await store.close()


async def goaltender(home: Path, *args: str, socket: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in a process of its own (waited for in a thread: the runner answers it meanwhile)."""
    env = {
        **os.environ,
        "GOALTENDER_HOME": str(home),
        "GOALTENDER_SOCKET": str(socket or home / "runner.sock"),
    }
    command = [sys.executable, "-m", "goaltender.cli", *args]
    return await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=120
    )


async def test_prune_verb_on_a_stopped_runner_home_and_through_a_running_runner(
    tmp_path, start_runner, connect
):
    home = tmp_path / "home"
    home.mkdir()
    store = await RunnerStore.open(home / "runner.db")
    old = await goal_with_history(store, home / "workspaces", ended_days_ago=100)
    await store.close()

    dry = await goaltender(home, "prune", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove {EVENTS + 9} events and 6 run logs" in dry.stdout, dry.stdout
    assert event_kinds(home / "runner.db", old).get("milestone") == EVENTS

    runner = await start_runner(home=home)
    done = await goaltender(home, "prune", socket=runner.settings.socket_path)
    assert done.returncode == 0, done.stderr
    assert f"removed {EVENTS + 9} events and 6 run logs" in done.stdout and "after VACUUM" in done.stdout
    assert runner.lost is None  # asked, not written under it
    assert event_kinds(home / "runner.db", old) == {"report": 1}
    client = await connect(runner)
    audit = await client.request(p.Audit())
    assert any(entry.action == "prune" and entry.outcome == "done" for entry in audit.entries)
    # The runner goes on writing, numbering events above those it had handed out.
    status = await client.request(p.Status())
    assert status.goals[0].goal.id == old


async def test_the_runner_prunes_by_itself(tmp_path, start_runner):
    home = tmp_path / "home"
    home.mkdir()
    store = await RunnerStore.open(home / "runner.db")
    old = await goal_with_history(store, home / "workspaces", ended_days_ago=100)
    recent = await goal_with_history(store, home / "workspaces", ended_days_ago=1)
    await store.close()
    await start_runner(home=home, prune_every_s=0.2)
    await eventually(lambda: event_kinds(home / "runner.db", old) == {"report": 1}, timeout=30)
    assert event_kinds(home / "runner.db", recent)["milestone"] == EVENTS
    assert len(logs_of(home / "workspaces", recent)) == 9


async def test_the_bot_prunes_by_itself(fake, make_bot, start_runner):
    runner = await start_runner()
    bot = await make_bot(runner.settings.socket_path, start=False, prune_every_s=0.2)
    long_ago = (utcnow() - timedelta(days=100)).isoformat()
    await bot.store.enqueue("C1", "post", {"text": "delivered long ago"}, str(EventKey("box", 1, 0)))
    await bot.store.enqueue("C1", "post", {"text": "delivered today"}, str(EventKey("box", 2, 0)))
    await bot.store.db.execute("UPDATE outbox SET state = 'sent'")
    await bot.store.db.execute("UPDATE outbox SET created_at = ? WHERE dedupe_key = 'box:1:0'", (long_ago,))
    await bot.start()

    async def only_todays_left() -> bool:
        rows = await bot.store.db.fetchall("SELECT dedupe_key FROM outbox")
        return {row[0] for row in rows} == {"box:2:0"}

    await eventually(only_todays_left, timeout=30)
