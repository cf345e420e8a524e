"""Choosing a runner (`on <runner>`, else the least loaded), goal channels, and the thread commands
pause, resume and `budget +2h`, through the real bot, two real runners and the fake Slack."""

from __future__ import annotations

import asyncio

from fake_slack import ALICE, BOB
from helpers import blocks_text, eventually, write_agent

from goaltender.bot.transports import RunnerTarget
from goaltender.protocol import messages as p

GOALS = "C0GOALS"


async def goal_state(bot, runner: str, goal_id: int) -> p.GoalStatus:
    reply = await bot.pool[runner].request(p.Status(goal_id=goal_id))
    return reply.goals[0]


async def test_runner_choice_goal_channels_and_thread_commands(
    fake, make_bot, start_runner, tmp_path, short_dir
):
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 120\n")
    alpha, beta = [
        await start_runner(
            name=name,
            home=tmp_path / name,
            socket=short_dir / f"{name}.sock",
            agents={"sleepy": agent},
            default_agent="sleepy",
        )
        for name in ("alpha", "beta")
    ]
    fake.add_channel(GOALS, "goals")
    bot = await make_bot(
        RunnerTarget(name="alpha", socket=alpha.settings.socket_path),
        goal_channels=[GOALS],
        runners=[
            RunnerTarget(name="alpha", socket=alpha.settings.socket_path),
            RunnerTarget(name="beta", socket=beta.settings.socket_path),
        ],
    )
    await asyncio.wait_for(bot.pool["beta"].wait_healthy(), 10)
    general = fake.general

    # `on beta` sends it there; the card says so.
    res = await fake.slash_command("/goal", "tune the lr on beta, budget 1h", general, ALICE)
    assert "goal #1 on beta" in (await res.wait_for_ephemeral(timeout=10)).text.lower()
    card = await fake.wait_for_message(general, text="Goal #1")
    assert "runner *beta*" in blocks_text(card)

    # Elsewhere a plain message is just a message; in a goal channel any new top-level message is
    # a goal: it goes to the least-loaded runner.
    lunch = await fake.user_posts(general, "lunch?", user=BOB)
    plain = await fake.user_posts(GOALS, "try a bigger batch", user=BOB)
    second = await fake.wait_for_message(GOALS, text="Goal #1", timeout=10)
    assert "runner *alpha*" in blocks_text(second) and "try a bigger batch" in blocks_text(second)
    assert "goal #1 on alpha" in (await fake.wait_for(lambda: fake.ephemerals(BOB)))[0].text.lower()
    assert (await goal_state(bot, "alpha", 1)).goal.owner == "bob"
    # By the time the later message is a goal with its card out, the lunch question was long read.
    await eventually(bot.outbox.idle)
    assert [m for m in fake.messages(general) if m.bot_id and "Goal #" in m.text] == [card]
    assert lunch.reactions == {} and plain.reactions == {}

    # pause / resume / budget +2h in the thread reach beta's goal #1, each acknowledged with 👌.
    paused = await fake.user_replies(general, card.ts, "pause", user=ALICE)
    await fake.wait_for(lambda: fake.message(general, paused.ts).reacted("ok_hand", fake.bot_user_id), 10)
    await eventually(lambda: _state_is(bot, "beta", 1, "paused"))
    await fake.wait_for(lambda: "paused" in blocks_text(fake.message(general, card.ts)), 10)
    resumed = await fake.user_replies(general, card.ts, "resume", user=ALICE)
    await fake.wait_for(lambda: fake.message(general, resumed.ts).reacted("ok_hand", fake.bot_user_id), 10)
    await eventually(lambda: _state_is(bot, "beta", 1, "running"))

    before = (await goal_state(bot, "beta", 1)).goal.budget.wall_seconds
    await fake.user_replies(general, card.ts, "budget +2h", user=ALICE)
    changed = await fake.wait_for_message(general, thread_ts=card.ts, text="Budget changed", timeout=10)
    after = (await goal_state(bot, "beta", 1)).goal.budget.wall_seconds
    assert before == 3600 and after == 3600 + 7200
    assert "3h00m" in blocks_text(changed)
    # Alpha's goal was never touched by beta's thread.
    assert (await goal_state(bot, "alpha", 1)).goal.state == "running"


async def _state_is(bot, runner: str, goal_id: int, state: str) -> bool:
    return (await goal_state(bot, runner, goal_id)).goal.state == state
