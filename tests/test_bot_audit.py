"""The audit trail in Slack, through the real bot, a real runner and the fake Slack: what is decided
in Slack (a refused stop or approval click, a budget increase held and its decision, role changes)
is kept in bot.db; `audit` in a goal's thread shows it with the runner's own trail, by time, people
as mentions; `/goal audit` shows the channel's part; the bot's rows outlive a restart."""

from __future__ import annotations

import re

from fake_slack import ALICE, BOB
from helpers import blocks_text, eventually, write_agent

from goaltender.bot.render_views import goal_audit
from goaltender.storage.bot_audit import SlackAuditEntry
from goaltender.storage.records import AuditEntry, utcnow

CAROL = "U0CAROL"
DAN = "U0DAN"  # a configured admin
AGENT = 'goaltender ask "Run the big one?" --detail "~2 GPU-hours"\nsleep 120\n'
# `✅ `05 Mar 10:02:03` <@U0ALICE> *stop* done _in Slack_ — …` -> (who, action, outcome, in Slack)
_LINE = re.compile(r"`[^`]+` (<@\w+>) \*([^*]+)\* (\w+)( _in Slack_)?")


def shown(blocks) -> str:
    return "\n".join(b["text"]["text"] for b in blocks or [] if b["type"] == "section")


def trail(message) -> list[tuple[str, str, str, bool]]:
    return [(m[1], m[2], m[3], bool(m[4])) for m in _LINE.finditer(shown(message.blocks))]


async def recorded(bot, outcome: str) -> bool:
    return any(e.outcome == outcome for e in await bot.store.audit.of_goal("box", 1))


def raw_ids(text: str) -> list[str]:
    """Slack user ids shown other than as mentions (`<@U0BOB>`)."""
    return re.findall(r"(?<!<@)\bU0[A-Z]+\b", text) + re.findall(r"slack:", text)


async def test_audit_shows_the_runners_trail_and_what_was_decided_in_slack(
    fake, make_bot, start_runner, tmp_path, short_dir
):
    agent = write_agent(tmp_path, "asker.sh", AGENT)
    runner = await start_runner(agents={"asker": agent}, default_agent="asker")
    settings = {"admins": [DAN], "budget_second_person": "1h"}
    bot = await make_bot(runner.settings.socket_path, **settings)
    fake.add_user(CAROL, "carol")
    fake.add_user(DAN, "dan")
    general = fake.general
    await fake.slash_command("/goal", "tune the lr, budget 1h", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1")

    # Bob controls nothing here: his stop and his click on the approval prompt are refused.
    await fake.user_replies(general, card.ts, "stop", user=BOB)
    await fake.wait_for(
        lambda: [e for e in fake.ephemerals(BOB) if e.thread_ts == card.ts and "can stop goal #1" in e.text],
        10,
    )
    prompt = await fake.wait_for_message(general, thread_ts=card.ts, text="Run the big one?", timeout=15)
    click = await fake.click_button(general, prompt.ts, "approve", user=BOB)
    assert "Only <@U0ALICE>" in (await click.wait_for_ephemeral()).text

    # Bob may not change roles; Dan, an admin, makes Carol a controller.
    refused = await fake.slash_command("/goal", f"admin approvers add {fake.mention(BOB)}", general, BOB)
    assert "Only a workspace admin" in (await refused.wait_for_ephemeral()).text
    made = await fake.slash_command("/goal", f"admin controllers add {fake.mention(CAROL)}", general, DAN)
    await made.wait_for_ephemeral()

    # Alice approves; her `budget +2h` waits for a second person, whom Carol is; Alice stops the goal.
    await fake.click_button(general, prompt.ts, "approve", user=ALICE)
    await fake.wait_for(lambda: "Approved" in blocks_text(prompt), 10)
    await fake.user_replies(general, card.ts, "budget +2h", user=ALICE)
    held = await fake.wait_for_message(general, thread_ts=card.ts, text="needs a second person", timeout=10)
    await eventually(lambda: recorded(bot, "held"))  # its prompt may be posted first
    await fake.click_button(general, held.ts, "budget_approve", user=CAROL)
    await fake.wait_for(lambda: "Approved* by <@U0CAROL>" in blocks_text(held), 10)
    stop = await fake.user_replies(general, card.ts, "stop", user=ALICE)
    await fake.wait_for(lambda: fake.message(general, stop.ts).reacted("ok_hand", fake.bot_user_id), 10)

    # Anyone may ask who did what: the runner's trail and the bot's, by time; the agent hears nothing.
    asked = await fake.user_replies(general, card.ts, "audit", user=BOB)
    first = await fake.wait_for_message(general, thread_ts=card.ts, text="Audit trail of goal #1", timeout=10)
    alice, bob, carol = "<@U0ALICE>", "<@U0BOB>", "<@U0CAROL>"
    assert trail(first) == [
        (alice, "submit", "done", False),
        (bob, "stop", "refused", True),
        (bob, "approve", "refused", True),
        (alice, "approve", "done", False),
        (alice, "budget", "held", True),
        (carol, "budget", "done", False),
        (carol, "approve budget", "done", True),
        (alice, "stop", "done", False),
    ]
    text = shown(first.blocks)
    assert "stop* refused _in Slack_ — not the owner, an approver or a controller" in text
    assert "approval #1: not the owner or an approver" in text
    assert "&#x27;budget +2h&#x27;" not in text and "'budget +2h': adds 2h00m of time" in text
    assert f"request #1 by {alice} ('budget +2h'): approved" in text
    assert "did not answer" not in text and raw_ids(text) == []
    assert await runner.store.read_inbox(1, unread_only=False) == []
    assert fake.message(general, asked.ts).reactions == {}

    # `/goal audit`: the channel's part, role changes and refused attempts included, to the asker.
    listed = await fake.slash_command("/goal", "audit", general, BOB)
    channel_text = shown((await listed.wait_for_ephemeral()).blocks)
    assert f"{bob} *role* refused — approvers add {bob}: not an admin here" in channel_text
    assert f"<@U0DAN> *role* done — controllers add {carol}: now {carol}" in channel_text
    assert f"{bob} *stop* goal #1 refused" in channel_text and raw_ids(channel_text) == []

    # The bot restarts (same bot.db) and its runner does not answer: the bot's part is still there,
    # and the thread is told the runner's part is missing.
    await bot.close()
    bot = await make_bot(short_dir / "nobody.sock", wait_runner=False, **settings)
    await fake.wait_connected(2)
    await fake.user_replies(general, card.ts, "audit", user=ALICE)
    again = await fake.wait_for_message(
        general, thread_ts=card.ts, text="Audit trail of goal #1", after=first.ts, timeout=20
    )
    assert trail(again) == [
        (bob, "stop", "refused", True),
        (bob, "approve", "refused", True),
        (alice, "budget", "held", True),
        (carol, "approve budget", "done", True),
    ]
    assert "Runner *box* did not answer" in shown(again.blocks)
    kept = await bot.store.audit.of_channel(general)
    assert [(e.actor, e.action, e.outcome) for e in kept if e.goal_id is None] == [
        (f"slack:{BOB}", "role", "refused"),
        (f"slack:{DAN}", "role", "done"),
    ]


def test_the_audit_view_merges_by_time_and_escapes():
    now = utcnow()
    ours = SlackAuditEntry(
        id=1,
        ts=now,
        actor="slack:U0BOB",
        action="steer",
        runner="box",
        goal_id=3,
        channel="C1",
        outcome="refused",
        detail="'ping <@U0ALICE|alice> & <!channel>': not the owner, an approver or a controller",
    )
    theirs = [
        AuditEntry(id=7, ts=now.replace(year=now.year - 1), actor="uid 1000 (ana)", action="submit", outcome="done"),
        AuditEntry(id=8, ts=now.replace(year=now.year + 1), actor="slack:U0ALICE via goaltender-bot (uid 0)",
                   action="stop", outcome="done", detail="stopped by slack:U0ALICE via goaltender-bot (uid 0)"),
    ]  # fmt: skip
    answer = goal_audit(3, "box", [ours], theirs, last=2)
    text = shown(answer["blocks"])
    # The last two by time: the oldest (ana's submit) is left out.
    assert "ana" not in text and text.index("*steer*") < text.index("*stop*")
    assert "ping <@U0ALICE> &amp; &lt;!channel&gt;" in text and "stopped by <@U0ALICE>" in text
    assert raw_ids(text) == []
    assert "did not answer" not in text
    alone = shown(goal_audit(3, "box", [ours], None)["blocks"])
    assert "Runner *box* did not answer" in alone and "*steer*" in alone
