"""The Slack bot end to end: the real AsyncApp + AsyncSocketModeHandler + AsyncWebClient against the
fake Slack, linked to a real runner (local socket) driving a shell-script agent."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys

import pytest
from fake_slack import ALICE, BOB
from helpers import blocks_text, eventually, write_agent

from goaltender.bot import render
from goaltender.bot.approvals import normalise_reaction
from goaltender.bot.transports import RunnerTarget
from goaltender.protocol import messages as p
from goaltender.storage.records import Approval, FinalReport, InboxMessage, MilestoneReported, utcnow

# The agent leaves what it saw in its workspace (a sandboxed agent can write nowhere else).
AGENT = """
goaltender milestone "Plan" "baseline first, then ask"
goaltender experiment -d base --metric acc -- python -c 'print("acc: 0.5")'
goaltender ask "Run the big one?" --detail "~2 GPU-hours"
echo "$?" > "$GOALTENDER_WORKSPACE/ask.rc"
for i in $(seq 1 150); do
    goaltender inbox >> "$GOALTENDER_WORKSPACE/inbox.txt"
    grep -q "focus on lr" "$GOALTENDER_WORKSPACE/inbox.txt" && break
    sleep 0.2
done
sleep 60
"""


async def test_goal_thread_approvals_steering_and_stop(fake, make_bot, start_runner, tmp_path, caplog):
    agent = write_agent(tmp_path, "agent.sh", AGENT)
    runner = await start_runner(agents={"test-agent": agent}, default_agent="test-agent")
    out = runner.settings.workspaces / "goal-1"
    await make_bot(runner.settings.socket_path)
    general = fake.general

    res = await fake.slash_command("/goal", "find a good lr, max 3 experiments", general, ALICE)
    assert res.acked
    queued = await res.wait_for_ephemeral(timeout=10)
    assert "goal #1 on box" in queued.text.lower()

    card = await fake.wait_for_message(general, text="Goal #1")
    assert card.thread_ts in (None, card.ts) and card.metadata["event_payload"]["key"] == "box:1:card"
    assert "find a good lr" in blocks_text(card)

    milestone = await fake.wait_for_message(general, thread_ts=card.ts, text="Plan", timeout=15)
    assert "baseline first" in blocks_text(milestone)
    row = await fake.wait_for_message(general, thread_ts=card.ts, text="#1 keep", timeout=15)
    assert "50.0%" in blocks_text(row) and "reported" in blocks_text(row)

    prompt = await fake.wait_for_message(general, thread_ts=card.ts, text="Run the big one?", timeout=15)
    assert prompt.action_ids() == ["approve", "reject"]
    assert "~2 GPU-hours" in blocks_text(prompt) and ":white_check_mark:" in blocks_text(prompt)
    stale_blocks = copy.deepcopy(prompt.blocks)
    await fake.wait_for(lambda: "waiting for approval" in blocks_text(fake.message(general, card.ts)), 10)

    # Bob is neither the owner nor an approver: his reaction and his click are refused, to him alone.
    caplog.set_level(logging.INFO, logger="goaltender.bot")
    await fake.user_reacts(general, prompt.ts, "white_check_mark", user=BOB)
    click = await fake.click_button(general, prompt.ts, "approve", user=BOB)
    refused = await click.wait_for_ephemeral()
    assert "Only <@U0ALICE>" in refused.text
    await eventually(lambda: f"reaction by {BOB} on approval #1 ignored" in caplog.text)
    await fake.wait_for(lambda: len(fake.ephemerals(BOB)) == 2, 10)
    assert all("Only <@U0ALICE>" in e.text for e in fake.ephemerals(BOB))
    assert not (out / "ask.rc").exists() and prompt.edited is None

    # The owner's 👍 (with a skin tone) approves; the prompt shows who decided.
    await fake.user_reacts(general, prompt.ts, "+1::skin-tone-3", user=ALICE)
    await eventually(lambda: (out / "ask.rc").exists() and (out / "ask.rc").read_text().strip())
    assert (out / "ask.rc").read_text().strip() == "0"
    await fake.wait_for(lambda: "Approved" in blocks_text(prompt) and not prompt.action_ids(), 10)
    assert "<@U0ALICE>" in blocks_text(prompt)

    # A stale client still shows the buttons: a later click gets "already decided".
    prompt.blocks = stale_blocks
    late = await fake.click_button(general, prompt.ts, "reject", user=ALICE)
    answer = await late.wait_for_ephemeral()
    assert "Already decided" in answer.text and "approved by <@U0ALICE>" in answer.text

    # `steer: …` steers: it reaches the agent's inbox and gets 👀.
    steer = await fake.user_replies(general, card.ts, "steer: focus on lr", user=ALICE)
    await eventually(
        lambda: (out / "inbox.txt").exists() and "focus on lr" in (out / "inbox.txt").read_text()
    )
    await fake.wait_for(lambda: fake.message(general, steer.ts).reacted("eyes", fake.bot_user_id), 10)

    # `status` answers in the thread.
    await fake.user_replies(general, card.ts, "status", user=BOB)
    await fake.wait_for_message(general, thread_ts=card.ts, text="Status now", timeout=10)

    # `stop` ends it: the final report in the thread, the card shows stopped.
    await fake.user_replies(general, card.ts, "stop", user=ALICE)
    report = await fake.wait_for_message(general, thread_ts=card.ts, text="Final report", timeout=20)
    # The campaign plot (one per milestone with results, and one with the report) is in the thread.
    await fake.wait_for(lambda: any(m.files for m in fake.thread(general, card.ts)), timeout=15)
    # One line a run, no code-block table: the whole ledger is attached as a CSV file.
    assert "```" not in blocks_text(report) and "#1 keep" in blocks_text(report)
    await fake.wait_for(
        lambda: any(
            f["name"] == "goal-1-ledger.csv" for m in fake.thread(general, card.ts) for f in m.files or []
        ),
        15,
    )
    await fake.wait_for(lambda: "stopped" in blocks_text(fake.message(general, card.ts)), 10)

    # A reply to a finished goal gets a clear answer.
    late_reply = await fake.user_mentions_bot(general, "one more idea?", user=ALICE, thread_ts=card.ts)
    finished = await fake.wait_for_message(
        general, thread_ts=card.ts, text="Start a new one", after=late_reply.ts, timeout=10
    )
    assert "Goal #1 is stopped" in finished.text
    assert not fake.warnings
    assert all(c.ok for c in fake.calls() if c.method.startswith("chat."))


async def test_mention_starts_one_goal(fake, make_bot, start_runner, tmp_path):
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 30\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy")
    bot = await make_bot(runner.settings.socket_path)
    msg = await fake.user_mentions_bot(fake.general, "tune the lr, max 2 experiments")
    await fake.wait_for(lambda: all(e.acked for e in msg.envelopes) and len(msg.envelopes) == 2)
    card = await fake.wait_for_message(fake.general, text="Goal #1")
    eph = await fake.wait_for(lambda: fake.ephemerals(ALICE))
    assert "goal #1" in eph[0].text.lower()
    # Slack retries: same event_id, new envelope. It is dropped before it is acked.
    again = await fake.redeliver(msg.envelopes[0])
    await again.wait_acked()
    # A later mention is a second goal: once its card is out, the first one's twin and its
    # redelivery have long been handled.
    later = await fake.user_mentions_bot(fake.general, "then try a wider model", user=BOB)
    second = await fake.wait_for_message(fake.general, text="Goal #2")
    await fake.wait_for(lambda: all(e.acked for e in later.envelopes) and fake.ephemerals(BOB))
    await eventually(bot.outbox.idle)
    cards = [m for m in fake.messages(fake.general) if m.bot_id and "Goal #" in m.text]
    assert cards == [card, second]
    status = await bot.pool["box"].request(p.Status())
    # The runner hears of each owner by the name Slack shows (users.info), not a user id.
    assert [s.goal.owner for s in status.goals] == ["alice", "bob"]
    assert "tune the lr" in status.goals[0].goal.text and "<@" not in status.goals[0].goal.text


async def test_goal_where_the_bot_is_not_a_member_says_invite(fake, make_bot, start_runner, tmp_path):
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 30\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy")
    bot = await make_bot(runner.settings.socket_path)
    res = await fake.slash_command("/goal", "tune the lr", "#random", ALICE)
    invite = await res.wait_for_ephemeral(timeout=10)
    assert "/invite @goaltender" in invite.text and "tune the lr" in invite.text
    assert (await fake.wait_for_call("conversations.info")).response["channel"]["is_member"] is False
    status = await bot.pool["box"].request(p.Status())
    assert status.goals == []  # nothing started on the runner
    assert fake.messages("#random") == [] and not fake.calls("chat.postMessage")


async def test_goal_in_a_channel_the_bot_left_is_stopped(fake, make_bot, start_runner, tmp_path):
    """Slack could not say whether the bot was a member, so the goal went ahead; the bot is not:
    the card is refused, so the goal is stopped and its owner told."""
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 30\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy")
    bot = await make_bot(runner.settings.socket_path)
    fake.remove_bot(fake.general)
    fake.fail("conversations.info", "internal_error")  # Slack cannot say: the goal goes ahead
    res = await fake.slash_command("/goal", "tune the lr", fake.general, ALICE)
    invite = await res.wait_for_ephemeral(2, timeout=10)
    assert "/invite @goaltender" in invite.text and "goal #1" in invite.text
    assert (await fake.wait_for_call("chat.postMessage")).error == "not_in_channel"
    await eventually(lambda: goal_state(bot, "box", 1, "stopped"))  # not left running, threadless


async def goal_state(bot, runner: str, goal_id: int, state: str) -> bool:
    status = await bot.pool[runner].request(p.Status(goal_id=goal_id))
    return status.goals[0].goal.state == state


@pytest.mark.parametrize("name", ["queue", "card", "lab:gpu"])
async def test_a_runner_named_like_a_key_part_routes_replies_and_failures(
    fake, make_bot, start_runner, tmp_path, name
):
    """Keys name their runner: a runner called `queue` or `card`, or with a `:` in its name, gets
    its replies steered to its goal, and its goal stopped where its card cannot be posted."""
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 30\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy")
    bot = await make_bot(RunnerTarget(name=name, socket=runner.settings.socket_path))

    res = await fake.slash_command("/goal", "tune the lr", fake.general, ALICE)
    assert f"goal #1 on {name}" in (await res.wait_for_ephemeral(timeout=10)).text.lower()
    card = await fake.wait_for_message(fake.general, text="Goal #1")
    steer = await fake.user_replies(fake.general, card.ts, "steer: try lr 3e-4", user=ALICE)
    await fake.wait_for(lambda: fake.message(fake.general, steer.ts).reacted("eyes", fake.bot_user_id), 10)
    assert [m.text for m in await runner.store.read_inbox(1, unread_only=False)] == ["try lr 3e-4"]

    fake.remove_bot(fake.general)
    fake.fail("conversations.info", "internal_error")  # Slack cannot say: the goal goes ahead
    elsewhere = await fake.slash_command("/goal", "tune the lr", fake.general, ALICE)
    invite = await elsewhere.wait_for_ephemeral(2, timeout=10)
    assert "/invite @goaltender" in invite.text and "goal #2" in invite.text
    await eventually(lambda: goal_state(bot, name, 2, "stopped"))


async def test_empty_goal_gets_the_howto(fake, make_bot, short_dir):
    await make_bot(short_dir / "nobody.sock", wait_runner=False)
    res = await fake.slash_command("/goal", "   ", fake.general, ALICE)
    assert res.acked and "/goal" in res.ack_payload["text"]
    too_long = await fake.slash_command("/goal", "x" * 4001, fake.general, ALICE)
    assert "limit is 4000" in too_long.ack_payload["text"]
    unknown = await fake.slash_command("/goal", "train it on runner gpu9", fake.general, ALICE)
    eph = await unknown.wait_for_ephemeral()
    assert "no runner called 'gpu9'" in eph.text and "configured: box" in eph.text
    assert "train it on runner gpu9" in eph.text  # their words, to send again
    assert fake.messages(fake.general) == []


def test_main_without_tokens_exits_2():
    env = {k: v for k, v in os.environ.items() if k not in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN")}
    done = subprocess.run(
        [sys.executable, "-c", "from goaltender.bot.app import main; main()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "SLACK_BOT_TOKEN" in done.stderr and "SLACK_APP_TOKEN" in done.stderr
    assert "manifest.yml" in done.stderr


def test_render_limits_and_reactions():
    assert normalise_reaction("+1::skin-tone-3") == "+1" and normalise_reaction(":x:") == "x"
    table = "\n".join(
        ["| # | status | acc |", "|---|---|---|"] + [f"| {i} | keep | 0.{i} |" for i in range(3000)]
    )
    report = FinalReport(end_reason="stopped by U0ALICE", text="# Report\n**best** run\n\n" + table)
    payload = render.final_report(report, 1)
    blocks = payload["blocks"]
    assert len(blocks) <= 50 and all(len(b["text"]["text"]) <= 3000 for b in blocks if b["type"] == "section")
    assert sum(len(json.dumps(b)) for b in blocks) < 13_000
    assert "truncated" in blocks[-1]["elements"][0]["text"]
    assert [b["type"] for b in blocks].count("header") == 1
    assert blocks[2]["text"]["text"].startswith("*Report*\n*best* run")
    assert all(b["text"]["text"].count("```") % 2 == 0 for b in blocks if b["type"] == "section")
    approval = Approval(id=7, goal_id=1, question="Go <big>?", expires_at=utcnow())
    prompt = render.approval_prompt(approval, "box")
    buttons = prompt["blocks"][-2]["elements"]
    assert [(b["action_id"], b["value"]) for b in buttons] == [("approve", "box:7"), ("reject", "box:7")]
    assert "&lt;big&gt;" in prompt["blocks"][0]["text"]["text"]


def test_notification_text_carries_no_markup_from_agents_or_people():
    """The fallback `text` is what notifications show, and Slack parses it as it does blocks: an
    agent's `<!channel>` there pinged the whole channel, its `<url|label>` made a link."""
    hostile = "done <!channel> <!here> <https://evil.example|docs> R&D slack:U0ALICE1"
    when = utcnow()
    payloads = [
        render.milestone(MilestoneReported(title=hostile)),
        render.approval_prompt(Approval(id=7, goal_id=1, question=hostile, expires_at=when), "box"),
        render.final_report(FinalReport(end_reason=hostile, text="x"), 1),
        render.queued_card(3, hostile, ALICE, None, hostile),
        render.steer_ack(InboxMessage(id=1, goal_id=1, author=f"slack:{BOB}", text=hostile)),
    ]
    for payload in payloads:
        text = payload["text"]
        assert "<!" not in text and "<http" not in text, text
        assert "&lt;!channel&gt;" in text and "R&amp;D" in text, text
    assert "<@" not in payloads[0]["text"]  # an agent naming someone pings nobody
    assert f"<@{BOB}>" in payloads[-1]["text"]
