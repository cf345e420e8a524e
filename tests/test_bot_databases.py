"""The bot never puts one database's goal into another goal's thread: a runner on a fresh
runner.db (a new identity) gets new threads for its goal #1; a runner.db restored from an earlier
copy gets new threads for its new goals, and a restored runner that numbers its events again is
followed from where its log ends. The real bot against the fake Slack, real runners, real files.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import sqlite3
from pathlib import Path

from fake_slack import ALICE, FakeSlack
from helpers import blocks_text, eventually, write_agent

from goaltender.protocol import messages as p
from goaltender.storage.high_water import FILE as HIGH_WATER

# Every goal's agent says which goal it is in its thread, then waits.
AGENT = 'goaltender milestone "Plan of goal $GOALTENDER_GOAL_ID" "first the baseline"\nsleep 300\n'


async def open_goal(fake: FakeSlack, text: str, number: int, after: str | None = None):
    """`/goal text`: the ack names goal #number, and its card is a new message (after `after`)."""
    res = await fake.slash_command("/goal", text, fake.general, ALICE)
    ack = await res.wait_for_ephemeral(timeout=30)
    assert f"goal #{number} on box" in ack.text.lower(), ack.text
    return await fake.wait_for_message(fake.general, text=f"Goal #{number}*", after=after, timeout=30)


def plans(fake: FakeSlack, card, number: int) -> int:
    """How many of goal #number's milestones are in `card`'s thread."""
    return sum(f"Plan of goal {number}" in blocks_text(m) for m in fake.thread(fake.general, card.ts))


def back_up(runner) -> Path:
    """A consistent copy of the running runner's database, as `sqlite3 runner.db .backup` makes one."""
    backup = runner.settings.home.parent / "backup.db"
    source, target = sqlite3.connect(runner.settings.db_path), sqlite3.connect(backup)
    source.backup(target)
    source.close()
    target.close()
    return backup


async def restart(
    start_runner, runner, agent, *, home: Path | None = None, restore: Path | None = None, whole: bool = False
):
    """Stop `runner` and start one on `home` (its own by default), its runner.db first put back
    from the copy `restore` (the stopped runner's -wal and -shm removed, as they belong to the other).
    `whole`: the home restored whole, its high-water mark with it (storage/high_water.py)."""
    await runner.close()
    home = home or runner.settings.home
    if whole:
        (home / HIGH_WATER).unlink()
    if restore is not None:
        db = home / "runner.db"
        for sidecar in ("-wal", "-shm"):
            Path(f"{db}{sidecar}").unlink(missing_ok=True)
        shutil.copyfile(restore, db)
    return await start_runner(agents={"plans": agent}, default_agent="plans", home=home)


async def test_a_runner_on_a_fresh_database_gets_new_threads(fake, make_bot, start_runner, tmp_path):
    """Keyed by (runner name, goal id), a fresh runner.db's goal #1 went into the old goal #1's
    thread: its card was never posted (its key was taken) and its posts joined the old thread."""
    agent = write_agent(tmp_path, "plans.sh", AGENT)
    runner = await start_runner(agents={"plans": agent}, default_agent="plans")
    bot = await make_bot(runner.settings.socket_path)
    old = await open_goal(fake, "the first database's goal", 1)
    await fake.wait_for(lambda: plans(fake, old, 1) == 1, 20)

    fresh = await restart(start_runner, runner, agent, home=tmp_path / "fresh-home")
    assert fresh.store.runner_id != runner.store.runner_id
    await eventually(lambda: bot.pool["box"].connects == 2 and bot.pool["box"].healthy, timeout=30)
    assert bot.pool["box"].runner_id == fresh.store.runner_id
    new = await open_goal(fake, "the fresh database's goal", 1, after=old.ts)
    assert new.ts != old.ts and "fresh database" in blocks_text(new)
    await fake.wait_for(lambda: plans(fake, new, 1) == 1, 20)
    assert plans(fake, old, 1) == 1  # nothing of the new goal #1 in the old thread
    # The old goal's card says its runner no longer has it; a reply there reaches no goal.
    await fake.wait_for(
        lambda: "no longer on runner box" in blocks_text(fake.message(fake.general, old.ts)), 10
    )
    await fake.user_replies(fake.general, old.ts, "stop", user=ALICE)
    said = await fake.wait_for_message(fake.general, thread_ts=old.ts, text="nothing was sent", timeout=10)
    assert "Runner box no longer runs on the database this goal was on" in said.text
    status = await bot.pool["box"].request(p.Status(goal_id=1))
    assert status.goals[0].goal.state == "running"  # the fresh database's goal #1 was not stopped


async def test_a_restored_database_gets_new_threads_for_new_goals(fake, make_bot, start_runner, tmp_path):
    """A runner.db restored from a backup gave its next goal the id of one made after the backup
    (its thread: the card never posted, the posts in the old thread), and numbered events the bot
    had read already, which it skipped."""
    agent = write_agent(tmp_path, "plans.sh", AGENT)
    runner = await start_runner(agents={"plans": agent}, default_agent="plans")
    bot = await make_bot(runner.settings.socket_path)
    kept = await open_goal(fake, "the goal the backup has", 1)
    await fake.wait_for(lambda: plans(fake, kept, 1) == 1, 20)
    backup = back_up(runner)
    lost = await open_goal(fake, "the goal the backup lacks", 2, after=kept.ts)
    await fake.wait_for(lambda: plans(fake, lost, 2) == 1, 20)

    restored = await restart(start_runner, runner, agent, restore=backup)
    assert restored.store.runner_id == runner.store.runner_id  # the same database, restored
    await eventually(lambda: bot.pool["box"].connects == 2 and bot.pool["box"].healthy, timeout=30)
    new = await open_goal(fake, "the goal after the restore", 3, after=lost.ts)
    await fake.wait_for(lambda: plans(fake, new, 3) == 1, 20)
    # The kept goal's agent started again with the runner: its thread goes on.
    await fake.wait_for(lambda: plans(fake, kept, 1) == 2, 20)
    assert plans(fake, lost, 2) == 1 and plans(fake, lost, 3) == 0


async def test_a_runner_that_numbers_its_events_again_is_followed_from_where_its_log_ends(
    fake, make_bot, start_runner, tmp_path, caplog
):
    """The bot subscribed after the seq it had read; a restored runner whose log ended before
    that (and numbered new events from there again) had every new event skipped, in silence."""
    caplog.set_level(logging.WARNING, logger="goaltender.bot.links")
    agent = write_agent(tmp_path, "plans.sh", AGENT)
    runner = await start_runner(agents={"plans": agent}, default_agent="plans")
    bot = await make_bot(runner.settings.socket_path)
    kept = await open_goal(fake, "the goal the backup has", 1)
    await fake.wait_for(lambda: plans(fake, kept, 1) == 1, 20)
    backup = back_up(runner)
    lost = await open_goal(fake, "the goal the backup lacks", 2, after=kept.ts)
    await fake.wait_for(lambda: plans(fake, lost, 2) == 1, 20)
    read = await bot.store.cursor("box")

    # The home restored whole (its high-water mark with it), or an older runner: seqs come again.
    await restart(start_runner, runner, agent, restore=backup, whole=True)
    said = await eventually(
        lambda: re.search(r"its event log ends at seq (\d+), before the (\d+)", caplog.text), 30
    )
    assert int(said[1]) < read == int(said[2])
    # Its new events, numbered as events the bot had read, are posted: the restarted goal's...
    await fake.wait_for(lambda: plans(fake, kept, 1) == 2, 20)
    # ...and a new goal's (whose id the workspaces left by goal #2 keep new).
    new = await open_goal(fake, "the goal after the restore", 3, after=lost.ts)
    await fake.wait_for(lambda: plans(fake, new, 3) == 1, 20)
    assert plans(fake, lost, 2) == 1 and plans(fake, lost, 3) == 0
    await asyncio.wait_for(eventually(bot.outbox.idle), 20)
    assert not [item for item in await bot.store.failed_writes()]
