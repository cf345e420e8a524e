"""When Slack fails the bot, not one write: `goaltender bot` (a real subprocess, linked to a real
runner) against a fake Slack that hangs a call, revokes the bot's token mid-run, uninstalls the
app, or deletes or archives a goal's channel. What each must do is in docs/slack-app.md, "When
Slack fails": a hung call holds up only its channel and is tried again after the deadline; lost
access stops the bot with one line naming the variable and starts no goal; a gone channel pauses
its goal and tells the owner by DM.
"""

from __future__ import annotations

import asyncio

import pytest
import test_bot_faults
from fake_slack import ALICE
from helpers import blocks_text, bot_check, eventually
from test_bot_faults import Goal, _runner_status

from goaltender.runner.daemon import Runner
from goaltender.storage.bot_store import BotStore

DEADLINE_S = 10.0  # GOALTENDER_SLACK_TIMEOUT_S in these tests: well above any honest answer here
OTHER = "C0TWO"

# The gated runner and the bot as a subprocess linked to it are the fault tests' fixtures.
gated = test_bot_faults.gated
start_bot = test_bot_faults.start_bot


async def test_a_hung_call_holds_up_only_its_channel_and_is_tried_again_after_the_deadline(
    fake, gated, start_bot
):
    fake.add_channel(OTHER, "two")
    bot = await start_bot(GOALTENDER_SLACK_TIMEOUT_S=str(DEADLINE_S))
    goal = await Goal.open(fake, gated)
    fake.hang("chat.postMessage", channel=fake.general)  # the next post to #general: no answer, ever
    goal.step("first")
    hung = await fake.wait_for(
        lambda: next((c for c in fake.calls("chat.postMessage") if c.hung), None), 30, what="the hung post"
    )

    res = await fake.slash_command("/goal", "another goal, max 1 experiments", OTHER, ALICE)
    assert "goal #2 on box" in (await res.wait_for_ephemeral(timeout=30)).text.lower()
    card = await fake.wait_for_message(OTHER, text="Goal #2", timeout=60)
    [card_call] = [c for c in fake.calls("chat.postMessage") if c.ok and c.response["ts"] == card.ts]
    assert card_call.time - hung.time < DEADLINE_S  # it did not wait for #general's hung call

    first = await goal.milestone("first", timeout=60)  # tried again once the deadline ended the call
    [retry] = [c for c in fake.calls("chat.postMessage") if c.ok and c.response["ts"] == first.ts]
    assert retry.time - hung.time >= DEADLINE_S - 0.5
    assert sum("Step first" in text for text in goal.texts()) == 1
    await bot.logged("failed (try 1 of", "no answer from Slack in time")


async def test_bot_check_is_bounded_when_slack_never_answers(fake, gated, tmp_path):
    fake.hang("auth.test")
    code, text = await bot_check(  # (it waited 300 s before)
        fake, gated.settings.socket_path, tmp_path / "check-home", GOALTENDER_SLACK_TIMEOUT_S="2"
    )
    assert code == 1, text
    assert "PROBLEM: Slack could not be reached" in text and "no answer from Slack in time" in text, text
    assert "runner box: reachable" in text


async def _exit_code(bot) -> int:
    return await asyncio.wait_for(bot.proc.wait(), 60)


def _said_once(bot, words: str) -> None:
    lines = [line for line in bot.lines() if words in line]
    assert len(lines) == 1, "\n".join(bot.lines()[-40:])


async def _writes_parked(bot_home) -> int:
    store = await BotStore.open(bot_home / "bot.db")
    try:
        return await store.failed_count()
    finally:
        await store.close()


async def test_a_token_revoked_mid_run_stops_the_bot_and_starts_no_goal(fake, gated, start_bot, tmp_path):
    bot = await start_bot()
    await Goal.open(fake, gated)  # (the bot was found in #general a moment ago: no reason to assume it)
    fake.revoke_token(error="token_revoked")

    res = await fake.slash_command("/goal", "one more goal", fake.general, ALICE)
    answer = await res.wait_for_ephemeral(timeout=30)
    assert "Slack refused my token (token_revoked)" in answer.text and "nothing was started" in answer.text
    assert await _exit_code(bot) == 2
    _said_once(bot, "Slack refused the token in SLACK_BOT_TOKEN (token_revoked)")
    assert [s.goal.id for s in (await _runner_status(gated)).goals] == [1]  # no goal #2
    assert not [line for line in bot.lines() if "parked" in line]  # nothing given up on: kept
    assert await _writes_parked(tmp_path / "bot-home") == 0


async def test_an_app_token_revoked_stops_the_bot_when_socket_mode_reconnects(fake, gated, start_bot):
    bot = await start_bot()
    fake.revoke_token(fake.app_token, "token_revoked")
    assert await fake.disconnect() == 1  # Slack's refresh: the client reconnects with the app token
    assert await _exit_code(bot) == 2
    _said_once(bot, "Slack refused the token in SLACK_APP_TOKEN (token_revoked)")


async def test_the_app_uninstalled_stops_the_bot_naming_the_token(fake, gated, start_bot):
    bot = await start_bot()
    assert await fake.uninstall_app() is not None
    assert await _exit_code(bot) == 2
    _said_once(bot, "the app was uninstalled from the workspace or its tokens revoked (app_uninstalled)")
    assert "SLACK_BOT_TOKEN" in bot.lines()[-1]


async def _state(runner: Runner, goal_id: int) -> str:
    status = await _runner_status(runner)
    return next(s.goal.state for s in status.goals if s.goal.id == goal_id)


@pytest.mark.parametrize("gone", ["deleted", "archived"])
async def test_a_gone_channel_pauses_its_goal_and_tells_the_owner(fake, gated, start_bot, gone):
    bot = await start_bot()
    goal = await Goal.open(fake, gated)
    error = {"deleted": "channel_not_found", "archived": "is_archived"}[gone]
    if gone == "deleted":
        fake.delete_channel(fake.general)
    else:
        fake.archive_channel(fake.general)
    goal.step("first")  # its milestone cannot be posted: the channel is gone

    async def paused() -> bool:
        return await _state(gated, 1) == "paused"

    await eventually(paused, 60)
    await fake.wait_for_call("conversations.open", timeout=30)
    [alice_dm] = [ch.id for ch in fake.channels.values() if ch.is_im and ALICE in ch.members]
    dm = await fake.wait_for_message(alice_dm, text="Goal #1 on box", timeout=30)
    told = blocks_text(dm)
    assert "I paused it" in told and error in told and "resume" in told, told
    await bot.logged("is gone for me", error, "pausing its 1 goal(s)")
    await bot.logged("slack write", "parked", error)
