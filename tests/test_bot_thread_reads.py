"""A goal's thread as the people in the channel read it: the real bot against the fake Slack and a
real runner, driving the real sweep agent on the star-count task (or a short shell agent where a
person has to stop something mid-way). Read as a person would: posts per experiment, the final
report's layout (one header, no code-block table, the whole ledger attached as a file), plain words
for a run and a prompt a person's stop made moot, dates each reader sees in their own zone, no
server paths in the channel, no plot uploaded twice, and the same private answer to a click and a
reaction from someone who may not decide."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import sys

import pytest
from fake_slack import ALICE, BOB
from helpers import blocks_text, write_agent

from goaltender.storage.records import utcnow

NEVER_ASK_S = 10_000.0  # no run costs that much: the sweep runs to its stop rule unattended
DATE_TOKEN = re.compile(r"<!date\^(\d+)\^\{date_short_pretty\} \{time\}\|[^>]+ UTC>")


@pytest.fixture(autouse=True)
def _shared_star_cache(tmp_path_factory, monkeypatch):
    # The workload caches rendered canvases; one cache for the session keeps every campaign quick.
    cache = tmp_path_factory.getbasetemp() / "star-count-cache"
    cache.mkdir(exist_ok=True)
    monkeypatch.setenv("GOALTENDER_CACHE_DIR", str(cache))


def bot_posts(fake, channel: str, card_ts: str) -> list:
    return [m for m in fake.thread(channel, card_ts) if m.bot_id]


def row_number(msg) -> int | None:
    """The experiment a ledger row reports (`#3 keep exact_accuracy 45.3%`), else None."""
    match = re.match(r"#(\d+) ", msg.text or "")
    return int(match.group(1)) if match and not msg.files else None


def posts_per_experiment(posts: list, report_ts: str) -> dict[int, int]:
    """Each post from an experiment's row up to the next row (or the report) is that experiment's."""
    counts: dict[int, int] = {}
    current = None
    for msg in posts:
        if msg.ts >= report_ts:
            break
        if (n := row_number(msg)) is not None:
            current = n
        if current is not None:
            counts[current] = counts.get(current, 0) + 1
    return counts


async def test_a_sweep_thread_reads_like_a_colleague_wrote_it(fake, make_bot, start_runner):
    sweep = [sys.executable, "-m", "goaltender.agents.sweep", "--approve-above", str(NEVER_ASK_S)]
    runner = await start_runner(agents={"sweep": sweep}, default_agent="sweep", stop_grace_s=3.0)
    await make_bot(runner.settings.socket_path)
    general = fake.general
    goal = "Train the star-count model to 99.9% exact accuracy, max 4 experiments, budget 1h"
    res = await fake.slash_command("/goal", goal, general, ALICE)
    ack = await res.wait_for_ephemeral(timeout=30)
    assert ack.text.startswith("Started goal #1 on box")  # it started at once: not "Queued"

    card = await fake.wait_for_message(general, text="Goal #1", timeout=30)
    card_text = blocks_text(card)
    assert "target 99.9%" in card_text  # as its rows show the metric, from the first card on
    deadline = DATE_TOKEN.search(card_text)  # "budget 1h": each reader sees the deadline in their zone
    assert deadline and abs(int(deadline.group(1)) - (utcnow().timestamp() + 3600)) < 120

    report = await fake.wait_for_message(general, thread_ts=card.ts, text="Final report", timeout=180)
    upload = await fake.wait_for_message(
        general, thread_ts=card.ts, where=lambda m: m.files, after=report.ts, timeout=30
    )

    await fake.wait_for(lambda: "ended:" in blocks_text(fake.message(general, card.ts)), 15)
    # The report: one header, the facts as fields, one line a run, no code block, no repeated head.
    kinds = [b["type"] for b in report.blocks]
    assert kinds.count("header") == 1 and kinds[0] == "header"
    assert any("fields" in b for b in report.blocks)
    text = json.dumps(report.blocks)
    assert "```" not in text and "# Goal #1" not in text and "*Goal #1 —" not in text
    assert "not yet met" not in text
    assert "99.9%" in text and "0.999" not in text
    ledger_lines = [
        line
        for b in report.blocks
        if b["type"] == "section" and "text" in b
        for line in b["text"]["text"].splitlines()
        if re.match(r"^\S+ #\d+ (keep|discard|crash|stopped)", line)
    ]
    assert 3 <= len(ledger_lines) <= 10 and all(len(line) <= 200 for line in ledger_lines)

    # The whole ledger is attached as a CSV file, one row a run.
    names = [f["name"] for f in upload.files]
    assert "goal-1-ledger.csv" in names
    ledger = next(f for f in fake.files.values() if f.name == "goal-1-ledger.csv")
    rows = list(csv.DictReader(io.StringIO(ledger.content.decode())))
    assert len(rows) == len(ledger_lines) and rows[0]["#"] == "1" and rows[0]["metric"] == "exact_accuracy"

    posts = bot_posts(fake, general, card.ts)
    counts = posts_per_experiment(posts, report.ts)
    print("posts per experiment:", counts)
    assert counts and max(counts.values()) <= 2, fake.transcript(general)

    # A plot only when it shows something new: between two plots there is always a new row.
    seen_rows = 0
    last_plot_rows = None
    for msg in posts:
        if row_number(msg) is not None:
            seen_rows += 1
        if any(f["name"].endswith(".png") for f in msg.files or []):
            assert last_plot_rows != seen_rows, "a plot was uploaded again with no new run"
            last_plot_rows = seen_rows
    assert last_plot_rows is not None  # (there is a plot)

    # `summary` shows the agent's latest handoff as text, not as the JSON it wrote.
    asked = await fake.user_replies(general, card.ts, "summary", user=BOB)
    summary = await fake.wait_for_message(
        general, thread_ts=card.ts, text="so far", after=asked.ts, timeout=15
    )
    [handoff] = [
        b["text"]["text"] for b in summary.blocks if "latest handoff" in b.get("text", {}).get("text", "")
    ]
    assert '{"' not in handoff and "\n• best: " in handoff, handoff
    assert not fake.warnings


STOPPED_AGENT = """
goaltender experiment -d "long run" --metric acc -- sleep 120 &
goaltender ask "Run the big one?" --detail "~2 GPU-hours"
sleep 120
"""


async def test_a_stopped_goal_says_so_in_plain_words(fake, make_bot, start_runner, tmp_path, caplog):
    agent = write_agent(tmp_path, "agent.sh", STOPPED_AGENT)
    runner = await start_runner(agents={"test-agent": agent}, default_agent="test-agent")
    await make_bot(runner.settings.socket_path)
    general = fake.general
    await fake.slash_command("/goal", "find a good lr, max 3 experiments", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1", timeout=15)
    prompt = await fake.wait_for_message(general, thread_ts=card.ts, text="Run the big one?", timeout=15)
    await fake.wait_for(lambda: "running #1" in blocks_text(fake.message(general, card.ts)), 15)

    # Bob may not decide: his reaction is answered as his click is, to him alone.
    caplog.set_level(logging.INFO, logger="goaltender.bot")
    await fake.user_reacts(general, prompt.ts, "white_check_mark", user=BOB)
    told = await fake.wait_for(lambda: fake.ephemerals(BOB), 10)
    assert "Only <@U0ALICE>" in told[0].text and "decided nothing" in told[0].text
    click = await fake.click_button(general, prompt.ts, "approve", user=BOB)
    assert "Only <@U0ALICE>" in (await click.wait_for_ephemeral()).text

    # A later budget change: the new deadline shows as a date each reader sees in their own zone.
    await fake.user_replies(general, card.ts, "budget +2h", user=ALICE)
    changed = await fake.wait_for_message(general, thread_ts=card.ts, text="Budget changed", timeout=15)
    assert DATE_TOKEN.search(blocks_text(changed)) and not re.search(
        r"deadline \d\d:\d\d:\d\d", blocks_text(changed)
    )

    await fake.user_replies(general, card.ts, "stop", user=ALICE)
    report = await fake.wait_for_message(general, thread_ts=card.ts, text="Final report", timeout=30)
    row = await fake.wait_for_message(general, thread_ts=card.ts, text="#1 ", timeout=15)
    assert row.text.startswith("#1 stopped") and "<@U0ALICE>" in blocks_text(row)
    assert "crash" not in blocks_text(row) and "no metric" not in blocks_text(row)
    await fake.wait_for(lambda: "Not needed: the goal was stopped" in blocks_text(prompt), 15)
    assert "Expired" not in blocks_text(prompt) and not prompt.action_ids()
    text = blocks_text(report)
    assert "stopped by a person" in text and "not yet met" not in text and "crash" not in text
    assert fake.ephemerals(ALICE) == [] or all(
        "decided nothing" not in e.text for e in fake.ephemerals(ALICE)
    )


async def test_a_queued_card_shows_no_server_path(fake, make_bot, short_dir):
    await make_bot(short_dir / "nobody.sock", wait_runner=False)
    await fake.slash_command("/goal", "tune the lr", fake.general, ALICE)
    card = await fake.wait_for_message(fake.general, text="Queued goal", timeout=15)
    shown = blocks_text(card)
    assert "Waiting for" in shown and ".sock" not in shown and str(short_dir) not in shown


async def test_an_event_without_ts_or_channel_is_one_log_line(fake, make_bot, short_dir, caplog):
    await make_bot(short_dir / "nobody.sock", wait_runner=False)
    caplog.set_level(logging.INFO)
    env = await fake._deliver_event(
        {"type": "message", "user": ALICE, "text": "hello"}, fake.channel(fake.general)
    )
    assert env is not None
    await env.wait_acked()
    await fake.wait_for(lambda: "without channel and ts was ignored" in caplog.text, 10)
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)
