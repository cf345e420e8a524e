"""Soak: one goal of 50,000 events through `goaltender runner` and `goaltender bot` (real
subprocesses) over an SSH box, while the SSH link is dropped and both daemons are SIGKILLed again
and again. The Slack thread is then checked against the runner's event log: nothing lost, nothing
twice, in order; and every step the agent logged is in the log exactly once.

Faults are paced by the log's progress, not by the clock: one every FAULT_EVERY events, in the
rotation of FAULTS, so every fault lands mid-campaign on any machine. Run by `make test` on its
own (pytest -m soak), after the main suite; a few minutes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest
from daemons import Daemon
from fake_slack import ALICE
from helpers import eventually
from test_bot_e2e import RUNNER, assert_thread_matches_log, open_goal, wait_for_whole_thread

from goaltender.storage.records import MetricsLogged, MilestoneReported
from goaltender.storage.runner_store import RunnerStore

pytestmark = pytest.mark.soak

TOTAL_STEPS = 50_000  # one event each, plus a milestone every MILESTONE_EVERY: > 50,000 events
MILESTONE_EVERY = 100
FAULT_EVERY = 1_500  # events between faults: 33 faults over the campaign
FAULTS = ("ssh", "ssh", "bot", "ssh", "ssh", "runner")
AGENT = Path(__file__).with_name("soak_agent.py")


def head(db: Path) -> int:
    """The newest seq in runner.db (read-only, beside the running runner: WAL lets it)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
        return con.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]


class StoreView:
    """What test_bot_e2e's thread checks read of a runner (its store), for a runner in a subprocess."""

    def __init__(self, store: RunnerStore):
        self.store = store


async def test_soak(fake, ssh_box, tmp_path, short_dir):
    home, socket = tmp_path / "runner-home", short_dir / "runner.sock"
    runner = Daemon(
        "runner",
        {
            **os.environ,
            "GOALTENDER_HOME": str(home),
            "GOALTENDER_SOCKET": str(socket),
            "GOALTENDER_NAME": "soak-box",
            "GOALTENDER_AGENTS": json.dumps(
                {"soak": [sys.executable, str(AGENT), str(TOTAL_STEPS), str(MILESTONE_EVERY)]}
            ),
            "GOALTENDER_DEFAULT_AGENT": "soak",
            "GOALTENDER_STOP_GRACE_S": "2",
            "GOALTENDER_MIN_FREE_MB": "64",
        },
        tmp_path,
    )
    box = await ssh_box({str(socket)})
    target = box.target(name=RUNNER, remote_socket=str(socket))
    bot_env = {
        **os.environ,
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "GOALTENDER_SLACK_API_URL": fake.api_url,
        "GOALTENDER_HOME": str(tmp_path / "bot-home"),
        "GOALTENDER_RUNNERS": json.dumps([target.model_dump(mode="json")]),
        "GOALTENDER_OUTBOX_INTERVAL_S": "0",
    }
    for env in (runner.env, bot_env):
        env.pop("GOALTENDER_CONFIG", None)
    bot = Daemon("bot", bot_env, tmp_path)
    done = {"ssh": 0, "bot": 0, "runner": 0}
    try:
        await runner.start()
        await runner.logged("listening on", timeout=60)
        await bot.start()
        await fake.wait_connected(1, timeout=60)
        await bot.wait_linked()
        _, ack, card = await open_goal(fake, "soak: fifty thousand events, within 2h", user=ALICE)
        assert "goal #1 on box" in ack.text.lower()

        db = home / "runner.db"
        while True:
            # FAULT_EVERY more events (or the end), then strike.
            await eventually(_progressed(db, head(db) + FAULT_EVERY), 120)
            if _reported(db):
                break
            fault = FAULTS[sum(done.values()) % len(FAULTS)]
            if fault == "ssh":
                box.drop()
            elif fault == "bot":
                bot.kill()
                await bot.killed()
                await bot.start()
            else:
                runner.kill()
                await runner.killed()
                await runner.start()
                await runner.logged("listening on", timeout=60)
            done[fault] += 1

        store = await RunnerStore.open(db)
        try:
            events = await wait_for_whole_thread(fake, StoreView(store), fake.general, card.ts, 1)
            assert_thread_matches_log(fake, events, fake.general, card.ts, 1)
        finally:
            await store.close()
    finally:
        await bot.stop()
        await runner.stop(grace=30)

    assert len(events) >= 50_000 and done["ssh"] >= 20 and done["bot"] >= 5 and done["runner"] >= 5, done
    steps = [int(p.step) for e in events if isinstance(e.data, MetricsLogged) for p in e.data.points]
    assert steps == list(range(TOTAL_STEPS))  # each step once, in order: nothing lost or repeated
    milestones = [e.data for e in events if isinstance(e.data, MilestoneReported)]
    assert len(milestones) >= TOTAL_STEPS // MILESTONE_EVERY
    folded = sum(m.folded for m in milestones)  # past the goal's rate: shown in its folds' posts
    print(f"soak: {len(events)} events, faults {done}, {len(milestones)} milestones ({folded} folded)")


def _progressed(db: Path, seq: int):
    """A check: has the log reached `seq`, or the report?"""
    return lambda: head(db) >= seq or _reported(db)


def _reported(db: Path) -> bool:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
        return con.execute("SELECT 1 FROM events WHERE kind = 'report' LIMIT 1").fetchone() is not None
