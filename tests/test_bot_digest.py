"""Digests: schedules set from Slack and kept in bot.db, APScheduler jobs rebuilt at start, a digest
missed while the bot was down sent once, and what a digest says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from fake_slack import ALICE, BOB
from helpers import blocks_text, eventually, write_agent

from goaltender.bot import digest
from goaltender.storage.bot_store import BotStore, Digest
from goaltender.storage.records import utcnow


def test_schedule_commands_parse_or_say_how():
    assert digest.parse_command("daily 09:00 Europe/Berlin").spec == "daily 09:00 Europe/Berlin"
    assert digest.parse_command("daily 9:05").spec == "daily 09:05 UTC"
    assert digest.parse_command("weekdays 08:30 America/New_York").spec == "weekdays 08:30 America/New_York"
    assert digest.parse_command("every 4h").spec == "every 4h"
    assert digest.parse_command("every 1h 30m").spec == "every 1h30m"
    assert digest.parse_command("every 90m").spec == "every 1h30m"
    assert [digest.parse_command(w).action for w in ("", "show", "off", "now")] == [
        "show",
        "show",
        "off",
        "now",
    ]
    for bad, says in (
        ("every 5m", "at most every 15m"),
        ("daily 25:00", "not a time of day"),
        ("daily 09:00 Mars/Olympus", "don't know the time zone"),
        ("sometimes", "could not read"),
        ("every 721h", "at least every 720h"),  # "every 99999999h" was stored, then broke every start
        ("every 9999999h", "at least every 720h"),
        ("every 999999999999h", "could not read"),  # it overflowed the parser itself
    ):
        with pytest.raises(ValueError, match=says) as caught:
            digest.parse_command(bad)
        assert "/goal digest every 4h" in str(caught.value)  # and how to write one


def test_triggers_follow_the_time_zone_and_the_anchor():
    berlin = digest.trigger_for("daily 09:00 Europe/Berlin", utcnow())
    winter = berlin.get_next_fire_time(None, datetime(2026, 12, 2, 12, 0, tzinfo=UTC))
    assert winter.astimezone(UTC) == datetime(2026, 12, 3, 8, 0, tzinfo=UTC)  # CET is UTC+1
    weekdays = digest.trigger_for("weekdays 09:00 UTC", utcnow())
    friday = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    assert weekdays.get_next_fire_time(None, friday).weekday() == 0  # Monday, not Saturday
    anchor = datetime(2026, 12, 2, 0, 0, tzinfo=UTC)
    every = digest.trigger_for("every 4h", anchor)
    assert every.get_next_fire_time(None, anchor) == anchor + timedelta(hours=4)  # not at once


async def test_a_stored_schedule_that_cannot_be_kept_does_not_stop_the_others():
    """A row no trigger can be made of (stored by an older bot that let it through) is logged and
    left out; the bot starts and the other channels' digests are kept."""
    scheduler = digest.DigestScheduler(lambda channel: None)  # type: ignore[arg-type,return-value]
    now = utcnow()
    rows = [
        Digest(channel="C1", spec="every 99999999h", created_by=ALICE, created_at=now, last_sent_at=None),
        Digest(channel="C2", spec="every 4h", created_by=ALICE, created_at=now, last_sent_at=None),
    ]
    scheduler.start(rows)
    try:
        assert scheduler.next_run("C1") is None and scheduler.next_run("C2") == now + timedelta(hours=4)
    finally:
        scheduler.shutdown()


async def test_missed_runs_coalesce_into_one():
    sent: list[str] = []

    async def send(channel: str) -> None:
        sent.append(channel)

    scheduler = digest.DigestScheduler(send)
    created = utcnow() - timedelta(hours=13)  # every 4h: due at +4h, +8h and +12h, all missed
    first = scheduler.schedule(
        Digest(channel="C1", spec="every 4h", created_by=ALICE, created_at=created, last_sent_at=None)
    )
    assert first == created + timedelta(hours=4)
    ran: list[JobExecutionEvent] = []  # the executor reports a job's runs once they are all done
    scheduler.scheduler.add_listener(ran.append, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
    scheduler.start([])
    try:
        await eventually(lambda: ran)
        assert sent == ["C1"] and len(ran) == 1  # once, not three times
        assert scheduler.next_run("C1") == created + timedelta(hours=16)
    finally:
        scheduler.shutdown()


async def test_digest_commands_set_show_and_stop(fake, make_bot, short_dir):
    bot = await make_bot(short_dir / "nobody.sock", wait_runner=False)
    general = fake.general
    res = await fake.slash_command("/goal", "digest daily 09:00 Europe/Berlin", general, ALICE)
    told = await res.wait_for_ephemeral(timeout=10)
    assert "Digest scheduled: `daily 09:00 Europe/Berlin`; next one" in told.text
    notice = await fake.wait_for_message(general, text="scheduled a digest here")
    assert "<@U0ALICE>" in blocks_text(notice)
    next_run = bot.digests.schedules.next_run(general)
    assert next_run is not None and next_run > utcnow()
    assert (next_run.hour, next_run.minute) == (9, 0) and str(next_run.tzinfo) == "Europe/Berlin"
    assert (await bot.store.digest(general)).spec == "daily 09:00 Europe/Berlin"

    shown = await fake.slash_command("/goal", "digest", general, BOB)
    assert "This channel's digest: `daily 09:00 Europe/Berlin`" in (await shown.wait_for_ephemeral()).text
    bad = await fake.slash_command("/goal", "digest every 5m", general, ALICE)
    assert "at most every 15m" in (await bad.wait_for_ephemeral()).text
    again = await fake.slash_command("/goal", "digest every 4h", general, ALICE)
    assert "`every 4h`" in (await again.wait_for_ephemeral()).text
    assert (await bot.store.digest(general)).spec == "every 4h"
    off = await fake.slash_command("/goal", "digest off", general, ALICE)
    assert "turned off" in (await off.wait_for_ephemeral()).text
    assert await bot.store.digest(general) is None and bot.digests.schedules.next_run(general) is None
    # "digest" that is not a schedule word starts a goal like any other text.
    goal = await fake.slash_command("/goal", "digest the OAPL paper and implement it", general, ALICE)
    assert "queued (q1)" in (await goal.wait_for_ephemeral(timeout=10)).text


AGENT = """
goaltender milestone "Baseline" "first numbers"
goaltender experiment -d base --metric acc -- python -c 'print("acc: 0.5")'
goaltender experiment -d wider --metric acc -- python -c 'print("acc: 0.75")'
goaltender ask "Run the 4096-example job?" --detail "~2 GPU-hours"
sleep 60
"""

QUICK = """
goaltender experiment -d only --metric acc -- python -c 'print("acc: 0.6")'
goaltender report "done: acc 0.6"
"""


async def test_a_digest_lists_goals_approvals_finished_and_a_plot(fake, make_bot, start_runner, tmp_path):
    agents = {
        "long": write_agent(tmp_path, "long.sh", AGENT),
        "quick-agent": write_agent(tmp_path, "quick.sh", QUICK),
    }
    runner = await start_runner(agents=agents, default_agent="long")
    await make_bot(runner.settings.socket_path)
    general = fake.general
    await fake.slash_command("/goal", "make acc go up", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1")
    prompt = await fake.wait_for_message(
        general, thread_ts=card.ts, text="Run the 4096-example job?", timeout=20
    )
    await fake.slash_command("/goal", "a quick check, with quick-agent", general, BOB)
    second = await fake.wait_for_message(general, text="Goal #2")
    await fake.wait_for_message(general, thread_ts=second.ts, text="Final report", timeout=20)

    await fake.slash_command("/goal", "digest now", general, ALICE)
    sent = await fake.wait_for_message(general, text="Digest", timeout=15)
    text = blocks_text(sent)
    active, _, rest = text.partition("Waiting for approval")
    waiting, _, finished = rest.partition("Finished since the last digest")
    assert "Goal #1" in active and "make acc go up" in active and "Baseline" in active
    assert "best #2 acc *75.0%*" in active and "2/4 experiments" in active
    assert f"p{prompt.ts.replace('.', '')}" in waiting and "#1: Run the 4096-example job?" in waiting
    assert "Goal #2" in finished and "finished" in finished and "60.0%" in finished
    assert f"p{card.ts.replace('.', '')}" in active  # goals link to their threads
    plot = await fake.wait_for(lambda: [m for m in fake.messages(general) if m.files and not m.thread_ts], 15)
    assert plot[0].files[0]["name"].endswith(".png")


async def test_a_digest_due_while_the_bot_was_down_is_sent_once(fake, make_bot, short_dir, tmp_path):
    home = tmp_path / "bot"
    home.mkdir()
    store = await BotStore.open(home / "bot.db")
    due = (utcnow() - timedelta(hours=1)).strftime("%H:%M")
    await store.set_digest(fake.general, f"daily {due} UTC", ALICE)
    three_days_ago = (utcnow() - timedelta(days=3)).isoformat()
    await store.db.execute("UPDATE digests SET created_at = ?", (three_days_ago,))  # down since then
    await store.close()

    def digests():
        return [m for m in fake.messages(fake.general) if m.text.startswith("Digest")]

    bot = await make_bot(short_dir / "nobody.sock", home=home, start=False)
    ran: list[JobExecutionEvent] = []
    bot.digests.schedules.scheduler.add_listener(ran.append, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
    await bot.start()
    await eventually(lambda: ran, 15)
    await eventually(bot.outbox.idle)
    assert len(ran) == 1 and len(digests()) == 1  # three missed days, one digest
    tomorrow = bot.digests.schedules.next_run(fake.general)
    assert timedelta(hours=22) < tomorrow - utcnow() < timedelta(hours=24)
    sent_at = (await bot.store.digest(fake.general)).last_sent_at
    assert sent_at is not None
    await bot.close()

    again = await make_bot(short_dir / "nobody.sock", wait_runner=False, home=home)  # a restart
    # Nothing was missed this time: the next digest is tomorrow's, none is due now.
    assert again.digests.schedules.next_run(fake.general) == tomorrow
    assert (await again.store.digest(fake.general)).last_sent_at == sent_at
    assert len(digests()) == 1
