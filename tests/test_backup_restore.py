"""`goaltender backup` while the runner writes, and `goaltender restore` with it stopped: the copy is
one commit's database and does not stop the runner; the restored runner goes on with the same
identity, its goals resume, the bot follows on in the same threads with nothing posted twice, and
no goal id or event seq made after the backup is handed out again. The real CLI in processes of
its own, the real runner and bot, real SQLite files, the fake Slack.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from helpers import blocks_text, eventually, write_agent
from test_bot_databases import open_goal, plans

# Each goal's agent says which goal it is in its thread, then writes its diary as fast as it can
# (a runner busy writing while the backup reads), then waits.
AGENT = (
    'goaltender milestone "Plan of goal $GOALTENDER_GOAL_ID" "first the baseline"\n'
    'for i in $(seq 1 150); do goaltender diary write "note $i" >/dev/null; done\n'
    "sleep 300\n"
)


async def goaltender(runner, bot, *args: str) -> subprocess.CompletedProcess:
    """The CLI on this runner's home and this bot's bot.db, in a process of its own."""
    env = {
        **os.environ,
        "GOALTENDER_HOME": str(runner.settings.home),
        "GOALTENDER_DB": str(bot.settings.db_path),
        "GOALTENDER_SOCKET": str(runner.settings.socket_path),
    }
    command = [sys.executable, "-m", "goaltender.cli", *args]
    return await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=120
    )


def count(db: Path, sql: str) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


async def diary_entries(runner) -> int:
    return int((await runner.store.db.one("SELECT COUNT(*) FROM diary"))[0])


async def test_backup_while_the_runner_writes_then_restore_and_the_bot_goes_on(
    fake, make_bot, start_runner, tmp_path
):
    agent = write_agent(tmp_path, "plans.sh", AGENT)
    runner = await start_runner(agents={"plans": agent}, default_agent="plans")
    bot = await make_bot(runner.settings.socket_path)
    kept = await open_goal(fake, "the goal the backup has", 1)
    await fake.wait_for(lambda: plans(fake, kept, 1) == 1, 20)

    # The backup, while the agent writes its diary.
    await eventually(_at_least(runner, 10), timeout=60)
    before = await diary_entries(runner)
    made = await goaltender(runner, bot, "backup", "--to", str(tmp_path / "backups"))
    assert made.returncode == 0, made.stderr
    (directory,) = (tmp_path / "backups").iterdir()
    lines = made.stdout.splitlines()
    assert lines[0].startswith(f"wrote {directory / 'runner.db'}: ") and runner.store.runner_id in lines[0]
    assert lines[1].startswith(f"wrote {directory / 'bot.db'}: ")
    assert sorted(path.name for path in directory.iterdir()) == ["bot.db", "runner.db"]  # no -wal: whole
    in_backup = count(directory / "runner.db", "SELECT COUNT(*) FROM diary")
    assert before <= in_backup
    await eventually(_at_least(runner, in_backup + 5), timeout=60)  # the runner wrote on, untroubled
    assert runner.lost is None

    lost = await open_goal(fake, "the goal the backup lacks", 2, after=kept.ts)
    await fake.wait_for(lambda: plans(fake, lost, 2) == 1, 20)
    read = await bot.store.cursor("box")

    # Not while the runner runs: said in one line, nothing touched.
    refused = await goaltender(runner, bot, "restore", str(directory), "--only", "runner")
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"goaltender restore: the runner is running on {runner.settings.home}")
    assert runner.lost is None

    await runner.close()
    restored = await goaltender(runner, bot, "restore", str(directory), "--only", "runner")
    assert restored.returncode == 0, restored.stderr
    assert (
        "next: start the runner" in restored.stdout and "New goals are numbered above #2" in restored.stdout
    )
    again = await start_runner(agents={"plans": agent}, default_agent="plans", home=runner.settings.home)
    assert again.store.runner_id == runner.store.runner_id  # the same database, restored

    # The bot follows on: the kept goal's agent starts again and its thread goes on...
    await eventually(lambda: bot.pool["box"].connects == 2 and bot.pool["box"].healthy, timeout=30)
    await fake.wait_for(lambda: plans(fake, kept, 1) == 2, 30)
    # ...a new goal is #3, not a second #2, in a thread of its own, with events above those read.
    new = await open_goal(fake, "the goal after the restore", 3, after=lost.ts)
    await fake.wait_for(lambda: plans(fake, new, 3) == 1, 20)
    assert min(event.seq for event in await again.store.events_since(read)) > read
    # Nothing is posted twice: one card each, each plan once in its own thread.
    await asyncio.wait_for(eventually(bot.outbox.idle), 30)
    cards = [m for m in fake.messages(fake.general) if "Goal #" in blocks_text(m)]
    assert len(cards) == 3, [blocks_text(m)[:60] for m in cards]
    assert (plans(fake, kept, 1), plans(fake, lost, 2), plans(fake, lost, 3), plans(fake, new, 3)) == (
        2,
        1,
        0,
        1,
    )
    assert not await bot.store.failed_writes()


def _at_least(runner, entries: int):
    async def written() -> bool:
        return await diary_entries(runner) >= entries

    return written


async def test_restore_refuses_what_is_no_backup(fake, make_bot, start_runner, tmp_path):
    runner = await start_runner()
    bot = await make_bot(runner.settings.socket_path)
    await runner.close()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    said = await goaltender(runner, bot, "restore", str(junk))
    assert said.returncode == 1
    assert said.stderr.startswith(f"goaltender restore: {junk} is not a usable SQLite database")
    assert count(runner.settings.db_path, "SELECT COUNT(*) FROM identity") == 1  # untouched
    missing = await goaltender(runner, bot, "restore", str(tmp_path / "nowhere"))
    assert missing.stderr.strip() == f"goaltender restore: {tmp_path / 'nowhere'} does not exist"
    newer = tmp_path / "newer.db"  # a backup made by a later release
    source, target = sqlite3.connect(runner.settings.db_path), sqlite3.connect(newer)
    source.backup(target)
    target.execute("PRAGMA user_version = 999")
    source.close()
    target.close()
    said = await goaltender(runner, bot, "restore", str(newer))
    assert said.returncode == 1 and "is from a newer goaltender (schema version 999" in said.stderr
    assert not list(runner.settings.home.glob("*.before-restore-*"))  # nothing was set aside


async def test_bot_db_is_restored_only_with_the_bot_stopped(fake, make_bot, start_runner, tmp_path):
    runner = await start_runner()
    bot = await make_bot(runner.settings.socket_path)
    await bot.store.set_channel_setting(fake.general, "digest_note", "before the backup", by="U1")
    made = await goaltender(runner, bot, "backup", "--to", str(tmp_path / "backups"))
    assert made.returncode == 0, made.stderr
    (directory,) = (tmp_path / "backups").iterdir()
    await bot.store.set_channel_setting(fake.general, "digest_note", "after the backup", by="U1")

    refused = await goaltender(runner, bot, "restore", str(directory), "--only", "bot")
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        f"goaltender restore: the bot has {bot.settings.db_path} open (pid {os.getpid()})"
    )
    await bot.close()
    restored = await goaltender(runner, bot, "restore", str(directory), "--only", "bot")
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.startswith(f"restored {bot.settings.db_path} from {directory / 'bot.db'}")
    assert "next: start the bot" in restored.stdout
    assert (
        count(bot.settings.db_path, "SELECT COUNT(*) FROM channel_settings WHERE value LIKE '%before%'") == 1
    )
    aside = [p.name for p in bot.settings.db_path.parent.iterdir() if ".before-restore-" in p.name]
    assert aside and all(name.startswith("bot.db.before-restore-") for name in aside)
