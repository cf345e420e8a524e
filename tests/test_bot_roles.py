"""Roles in Slack, through the real bot, a real runner and the fake Slack: only those who control a
goal (its owner, the approvers, the channel's controllers) stop, pause, resume, steer or change its
budget — anyone else is told so privately and the owner's work goes on; a budget increase over the
channel's limit waits for a second person (and survives a bot restart); `/goal admin` shows the
roles to anyone and lets admins change them."""

from __future__ import annotations

import logging

import pytest
from fake_slack import ALICE, BOB
from helpers import blocks_text, eventually, write_agent

from goaltender.bot.admin import AdminCommand, command_words, parse_command
from goaltender.bot.budget_size import Threshold
from goaltender.protocol import messages as p

CAROL = "U0CAROL"  # an approver (configured), or a workspace admin
DAN = "U0DAN"


async def goal(bot, goal_id: int = 1) -> p.GoalStatus:
    return (await bot.pool["box"].request(p.Status(goal_id=goal_id))).goals[0]


async def told_in_thread(fake, user: str, thread_ts: str, text: str, count: int = 1):
    """Wait until `user` has seen `count` ephemerals in the thread containing `text`; return them."""
    return await fake.wait_for(
        lambda: (
            found
            if len(found := [e for e in fake.ephemerals(user) if e.thread_ts == thread_ts and text in e.text])
            >= count
            else None
        ),
        10,
    )


async def start_goal(fake, make_bot, start_runner, tmp_path, text="tune the lr, budget 1h", **settings):
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 120\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy")
    bot = await make_bot(runner.settings.socket_path, **settings)
    fake.add_user(CAROL, "carol")
    fake.add_user(DAN, "dan")
    await fake.slash_command("/goal", text, fake.general, ALICE)
    card = await fake.wait_for_message(fake.general, text="Goal #1")
    return runner, bot, card


async def test_a_non_owner_is_refused_and_the_owners_work_goes_on(fake, make_bot, start_runner, tmp_path):
    runner, bot, card = await start_goal(fake, make_bot, start_runner, tmp_path, approvers=[CAROL])
    general = fake.general
    before = (await goal(bot)).goal.budget

    # Bob is neither the owner nor an approver: stop, pause, a budget change and steering are
    # each refused with a message only he sees, in the thread.
    replies = [
        await fake.user_replies(general, card.ts, text, user=BOB)
        for text in ("stop", "pause", "budget +2h", "steer: try a bigger lr")
    ]
    refusals = await told_in_thread(fake, BOB, card.ts, "Only <@U0ALICE> (the owner) or an approver can", 4)
    # (Slack delivers the four replies at once; the bot answers each as it is handled.)
    doing = sorted(e.text.split(" can ")[1].split(" goal #1")[0] for e in refusals)
    assert doing == ["change the budget of", "pause", "steer", "stop"]
    assert all("nothing changed" in e.text and e.source == "chat.postEphemeral" for e in refusals)
    # Nothing changed: still running, same budget, nothing in the agent's inbox, no 👌 or 👀.
    status = await goal(bot)
    assert status.goal.state == "running" and status.goal.budget == before
    assert await runner.store.read_inbox(1, unread_only=False) == []
    assert all(fake.message(general, r.ts).reactions == {} for r in replies)
    # Anyone may ask how it goes: the bot answers, the agent is not disturbed.
    await fake.user_replies(general, card.ts, "status", user=BOB)
    await fake.wait_for_message(general, thread_ts=card.ts, text="Status now", timeout=10)

    # The owner steers; an approver pauses and resumes it.
    steer = await fake.user_replies(general, card.ts, "steer: try a bigger lr", user=ALICE)
    await fake.wait_for(lambda: fake.message(general, steer.ts).reacted("eyes", fake.bot_user_id), 10)
    assert [m.text for m in await runner.store.read_inbox(1, unread_only=False)] == ["try a bigger lr"]
    # The runner (and so the agent) hears of who acted by name, not by Slack id.
    [message] = await runner.store.read_inbox(1, unread_only=False)
    assert message.author == "alice"
    await fake.user_replies(general, card.ts, "pause", user=CAROL)
    paused = await fake.wait_for_message(general, thread_ts=card.ts, text="is now *paused*", timeout=10)
    assert "paused by <@U0CAROL>" in blocks_text(paused) and "slack:" not in blocks_text(paused)
    # The card names people as mentions, never as ids.
    await fake.user_replies(general, card.ts, "stop", user=ALICE)
    await fake.wait_for(lambda: "ended: stopped by <@U0ALICE>" in blocks_text(card), 15)
    assert "slack:" not in blocks_text(card)
    report = await fake.wait_for_message(general, thread_ts=card.ts, text="Final report", timeout=15)
    assert "stopped by <@U0ALICE>" in blocks_text(report) and "slack:" not in blocks_text(report)


async def test_a_big_budget_increase_waits_for_a_second_person(
    fake, make_bot, start_runner, tmp_path, caplog
):
    runner, bot, card = await start_goal(
        fake, make_bot, start_runner, tmp_path, approvers=[CAROL], budget_second_person="1h"
    )
    general = fake.general

    # Under the limit: applied at once.
    small = await fake.user_replies(general, card.ts, "budget +30m", user=ALICE)
    await fake.wait_for(lambda: fake.message(general, small.ts).reacted("ok_hand", fake.bot_user_id), 10)
    assert (await goal(bot)).goal.budget.wall_seconds == 3600 + 1800

    # Over it: a prompt in the thread, and the budget stays as it is.
    await fake.user_replies(general, card.ts, "budget +2h", user=ALICE)
    prompt = await fake.wait_for_message(general, thread_ts=card.ts, text="needs a second person", timeout=10)
    assert prompt.action_ids() == ["budget_approve", "budget_reject"]
    assert "adds 2h00m of time" in blocks_text(prompt) and "<@U0ALICE>" in blocks_text(prompt)
    assert (await goal(bot)).goal.budget.wall_seconds == 5400

    # The requester cannot decide it, nor can someone who does not control the goal.
    mine = await fake.click_button(general, prompt.ts, "budget_approve", user=ALICE)
    assert "someone else who controls the goal" in (await mine.wait_for_ephemeral()).text
    theirs = await fake.click_button(general, prompt.ts, "budget_approve", user=BOB)
    assert "Only <@U0ALICE> (the owner) or an approver" in (await theirs.wait_for_ephemeral()).text
    caplog.set_level(logging.INFO, logger="goaltender.bot")
    await fake.user_reacts(general, prompt.ts, "+1", user=ALICE)
    await eventually(lambda: "on budget request #1 ignored" in caplog.text)
    told = await eventually(lambda: [e for e in fake.ephemerals(ALICE) if "decided nothing" in e.text])
    assert told[0].text.startswith("Your :+1: on budget request #1 decided nothing. ")  # not only logged
    assert (await goal(bot)).goal.budget.wall_seconds == 5400 and prompt.edited is None

    # It waits for Carol on her App Home too.
    await fake.user_opens_home(CAROL)
    home = await fake.wait_for(lambda: fake.home_views.get(CAROL))
    assert "budget increase asked by <@U0ALICE>" in str(home["blocks"])

    # The bot restarts: the request is still there, and Carol's ✅ applies it, as hers.
    await bot.close()
    bot = await make_bot(runner.settings.socket_path, approvers=[CAROL], budget_second_person="1h")
    await fake.wait_connected(2)
    await fake.user_reacts(general, prompt.ts, "white_check_mark", user=CAROL)
    changed = await fake.wait_for_message(
        general,
        thread_ts=card.ts,
        text="Budget changed",
        where=lambda m: "U0CAROL" in blocks_text(m),
        timeout=10,
    )
    assert "<@U0CAROL>" in blocks_text(changed) and "slack:" not in blocks_text(changed)
    assert (await goal(bot)).goal.budget.wall_seconds == 5400 + 7200
    await fake.wait_for(
        lambda: "Approved* by <@U0CAROL>" in blocks_text(prompt) and not prompt.action_ids(), 10
    )

    # Steering whose words the runner would read as a budget change is held the same way; a
    # rejection drops it, and the agent never hears of it.
    await fake.user_replies(general, card.ts, "steer: keep going, budget 10h", user=ALICE)
    second = await fake.wait_for_message(
        general, thread_ts=card.ts, text="budget 10h", where=lambda m: bool(m.action_ids()), timeout=10
    )
    no = await fake.click_button(general, second.ts, "budget_reject", user=CAROL)
    await fake.wait_for(lambda: "Rejected* by <@U0CAROL>" in blocks_text(second), 10)
    assert no.ephemerals == []
    assert (await goal(bot)).goal.budget.wall_seconds == 5400 + 7200
    assert await runner.store.read_inbox(1, unread_only=False) == []
    assert [r.state for r in await bot.store.budget_requests("approved")] == ["approved"]
    assert [r.decided_by for r in await bot.store.budget_requests("rejected")] == [CAROL]


async def test_admins_change_roles_and_everyone_sees_them(fake, make_bot, start_runner, tmp_path):
    _, bot, card = await start_goal(fake, make_bot, start_runner, tmp_path, admins=[DAN])
    general = fake.general
    fake.users[CAROL].is_admin = True  # a workspace admin (users.info)

    shown = await fake.slash_command("/goal", "admin show", general, BOB)
    text = (await shown.wait_for_ephemeral()).text
    assert "*starters* (may start goals): everyone _(default)_" in text
    assert "*approvers* (decide approvals and control every goal): nobody _(default)_" in text
    assert "*admins*" in text and "<@U0DAN> _(configuration)_" in text

    # Bob is no admin: refused, nothing changes.
    refused = await fake.slash_command("/goal", f"admin controllers add {fake.mention(BOB)}", general, BOB)
    assert "Only a workspace admin" in (await refused.wait_for_ephemeral()).text
    await fake.user_replies(general, card.ts, "pause", user=BOB)
    await told_in_thread(fake, BOB, card.ts, "can pause goal #1")

    # Carol (a workspace admin) makes Bob a controller: said in the channel; his pause now works.
    made = await fake.slash_command("/goal", f"admin controllers add {fake.mention(BOB)}", general, CAROL)
    assert "*controllers* here: <@U0BOB>" in (await made.wait_for_ephemeral()).text
    await fake.wait_for_message(general, text="changed this channel's *controllers*")
    paused = await fake.user_replies(general, card.ts, "pause", user=BOB)
    await fake.wait_for(lambda: fake.message(general, paused.ts).reacted("ok_hand", fake.bot_user_id), 10)
    assert (await goal(bot)).goal.state == "paused"

    # Dan (a configured admin) lets only Alice start goals, and resets the controllers.
    only = await fake.slash_command("/goal", f"admin starters only {fake.mention(ALICE)}", general, DAN)
    await only.wait_for_ephemeral()
    reset = await fake.slash_command("/goal", "admin controllers reset", general, DAN)
    assert "nobody (default)" in (await reset.wait_for_ephemeral()).text
    attempt = await fake.slash_command("/goal", "train a bigger model", general, BOB)
    assert "Only <@U0ALICE> can start goals in this channel" in (await attempt.wait_for_ephemeral()).text
    refused = [e for e in await bot.store.audit.of_channel(general) if e.action == "submit"]
    assert [(e.actor, e.outcome) for e in refused] == [(f"slack:{BOB}", "refused")]
    assert "train a bigger model" in refused[0].detail
    await fake.user_replies(general, card.ts, "resume", user=BOB)
    await told_in_thread(fake, BOB, card.ts, "can resume goal #1")
    assert (await bot.pool["box"].request(p.Status())).goals[-1].goal.id == 1  # no goal #2

    # The budget rule, and words the grammar cannot read.
    rule = await fake.slash_command("/goal", "admin budget 30m", general, DAN)
    assert "increases over 30m00s need a second person" in (await rule.wait_for_ephemeral()).text
    again = await fake.slash_command("/goal", "admin show", general, BOB)
    assert "_(set here by <@U0DAN>)_" in (await again.wait_for_ephemeral()).text
    vague = await fake.slash_command("/goal", "admin approvers add ana", general, DAN)
    assert "I can't tell who `ana` is" in (await vague.wait_for_ephemeral()).text


async def test_subcommands_are_never_read_as_goals(fake, make_bot, start_runner, tmp_path):
    """`admin budget 0h` is no goal (whose `budget 0h` would be refused): the admin command runs."""
    _, bot, _ = await start_goal(fake, make_bot, start_runner, tmp_path, admins=[DAN])
    general = fake.general
    for size in ("0h", "0s"):
        zero = await fake.slash_command("/goal", f"admin budget {size}", general, DAN)
        said = (await zero.wait_for_ephemeral()).text
        assert "not submitted" not in said and "every increase needs a second person" in said, said
        rule, source = await bot.roles.budget_rule(general)
        assert rule == Threshold.parse("0") and "set here" in source
    # Longer than any goal may be: still the admin's command, answered as one.
    long = await fake.slash_command("/goal", "admin approvers add " + "ana " * 1200, general, DAN)
    assert "I can't tell who `ana` is" in (await long.wait_for_ephemeral()).text
    assert not (long.ack_payload or {}).get("text")
    assert (await bot.pool["box"].request(p.Status())).goals[-1].goal.id == 1  # no goal #2


def test_the_admin_grammar():
    assert command_words("admin") == "" and command_words("admin show") == "show"
    assert command_words("admin approvers add <@U1|a>") == "approvers add <@U1|a>"
    assert command_words("admin the cluster's GPUs better") is None  # a goal, not a command
    assert command_words("administer it") is None
    assert parse_command("") == AdminCommand("show")
    assert parse_command("approver add <@U0ANA|ana> U0BEN") == AdminCommand(
        "role", "approvers", "add", ("U0ANA", "U0BEN")
    )
    assert parse_command("starters set <@U0ANA>") == AdminCommand("role", "starters", "only", ("U0ANA",))
    assert parse_command("controllers everyone") == AdminCommand("role", "controllers", "everyone")
    assert parse_command("budget 50%") == AdminCommand("budget", size="50%")
    assert parse_command("budget reset") == AdminCommand("budget", verb="reset")
    for bad, says in [
        ("approvers add", "Name the people"),
        ("controllers everyone <@U1>", "takes nobody's name"),
        ("approvers promote <@U1>", "could not read"),
        ("budget lots", "not a budget size"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_command(bad)


def test_budget_sizes():
    from datetime import timedelta

    from goaltender.storage.records import Budget, utcnow

    now = utcnow()
    hour = Budget(
        deadline=now + timedelta(hours=1), wall_seconds=3600, max_experiments=10, experiment_timeout_s=600
    )
    plus = lambda **change: hour.model_copy(update=change)  # noqa: E731
    one_hour, half = Threshold.parse("1h"), Threshold.parse("50%")
    assert one_hour is not None and half is not None and Threshold.parse("off") is None
    assert one_hour.over(hour, plus(deadline=now + timedelta(minutes=90)), now) is None
    assert "adds 2h00m of time" in (one_hour.over(hour, plus(deadline=now + timedelta(hours=3)), now) or "")
    assert half.over(hour, plus(deadline=now + timedelta(minutes=80)), now) is None
    assert "(+100%)" in (half.over(hour, plus(deadline=now + timedelta(hours=2)), now) or "")
    # 6 more experiments of 10 minutes: 1h of time, not over 1h; 7 are.
    assert one_hour.over(hour, plus(max_experiments=16), now) is None
    assert "adds 7 experiments" in (one_hour.over(hour, plus(max_experiments=17), now) or "")
    # A longer per-experiment timeout counts for every experiment allowed.
    assert "timeout" in (one_hour.over(hour, plus(experiment_timeout_s=1200), now) or "")
    # Setting a limit where there was none, or lowering one, is no increase.
    assert one_hour.over(hour, plus(compute_hours=100), now) is None
    assert one_hour.over(hour, plus(max_experiments=2), now) is None
    every = Threshold.parse("0")
    assert every is not None and every.over(hour, plus(max_experiments=11), now)
