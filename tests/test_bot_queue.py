"""Goals asked for while no runner can take them queue visibly and start when one is back; a
runner that goes down shows on its goals' cards; HTTP mode verifies Slack's request signatures."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlencode

import aiohttp
from fake_slack import ALICE, BOB
from helpers import blocks_text, eventually, write_agent

from goaltender.bot.app import GoaltenderBot
from goaltender.bot.config import BotSettings
from goaltender.bot.transports import RunnerTarget
from goaltender.protocol import messages as p


async def test_a_goal_queues_while_no_runner_is_up_and_starts_when_one_is(
    fake, make_bot, start_runner, short_dir, tmp_path
):
    socket = short_dir / "runner.sock"
    bot = await make_bot(socket, wait_runner=False, outbox_interval_s=0.05)
    res = await fake.slash_command("/goal", "tune the lr, max 2 experiments", fake.general, ALICE)
    told = await res.wait_for_ephemeral(timeout=10)
    assert "queued (q1)" in told.text and "Nothing is lost" in told.text
    queued = await fake.wait_for_message(fake.general, text="Queued goal")
    assert "tune the lr" in blocks_text(queued) and "Waiting for a runner" in blocks_text(queued)
    assert [q.text for q in await bot.store.queued_goals()] == ["tune the lr, max 2 experiments"]

    # The runner comes up on that socket: the queued goal is submitted, once, with its owner.
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 60\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy", socket=socket)
    card = await fake.wait_for_message(fake.general, text="Goal #1", timeout=30)
    assert "tune the lr" in blocks_text(card)
    await fake.wait_for(lambda: "Started as *goal #1*" in blocks_text(queued), 10)
    status = await bot.pool["box"].request(p.Status())
    assert [(s.goal.id, s.goal.owner) for s in status.goals] == [(1, "alice")]
    assert await bot.store.queued_goals() == []
    [done] = await bot.store.queued_goals("submitted")
    assert (done.goal_runner, done.goal_id) == ("box", 1)
    # Its thread works like any other: `steer: …` steers the goal.
    await fake.user_replies(fake.general, card.ts, "steer: try lr 3e-4 first", user=ALICE)
    inbox = await eventually(lambda: runner.store.read_inbox(1, unread_only=False))
    assert [m.text for m in inbox] == ["try lr 3e-4 first"]


async def test_a_queued_goal_stopped_in_its_thread_never_starts(
    fake, make_bot, start_runner, short_dir, tmp_path
):
    socket = short_dir / "runner.sock"
    bot = await make_bot(socket, wait_runner=False)
    general = fake.general
    await fake.slash_command("/goal", "tune the lr, max 2 experiments", general, ALICE)
    queued = await fake.wait_for_message(general, text="Queued goal")

    # Bob may not stop it; what is meant for the goal but no `stop` is answered (nobody hears it
    # yet); both only to them. Talk between people is left alone.
    await fake.user_replies(general, queued.ts, "stop", user=BOB)
    refused = await fake.wait_for(lambda: [e for e in fake.ephemerals(BOB) if e.thread_ts == queued.ts], 10)
    assert "Only <@U0ALICE> (the owner) or an approver can stop queued goal q1" in refused[0].text
    talk = await fake.user_replies(general, queued.ts, "shall we wait for the runner?", user=BOB)
    await fake.user_replies(general, queued.ts, "steer: try lr 3e-4 first", user=ALICE)
    told = await fake.wait_for(lambda: [e for e in fake.ephemerals(ALICE) if e.thread_ts == queued.ts], 10)
    assert "queued, waiting for a runner" in told[0].text and "`stop` here cancels it" in told[0].text
    await eventually(bot.outbox.idle)
    assert len([e for e in fake.ephemerals(BOB) if e.thread_ts == queued.ts]) == 1  # the refused stop only
    assert fake.message(general, talk.ts).reactions == {}

    # Alice stops it: said in its thread, and on its card.
    await fake.user_replies(general, queued.ts, "stop.", user=ALICE)
    await fake.wait_for_message(general, thread_ts=queued.ts, text="stopped queued goal q1", timeout=10)
    await fake.wait_for(lambda: "Stopped by <@U0ALICE> before it started" in blocks_text(queued), 10)
    kept = await bot.store.audit.of_channel(general)
    assert [(e.actor, e.action, e.outcome) for e in kept] == [
        (f"slack:{BOB}", "stop", "refused"),
        (f"slack:{ALICE}", "stop", "done"),
    ]

    # The runner comes up: only the goal queued after it starts (as goal #1); the stopped one never does.
    await fake.slash_command("/goal", "a second goal, max 2 experiments", general, ALICE)
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 60\n")
    await start_runner(agents={"sleepy": agent}, default_agent="sleepy", socket=socket)
    card = await fake.wait_for_message(general, text="Goal #1", timeout=30)
    assert "a second goal" in blocks_text(card)
    status = await bot.pool["box"].request(p.Status())
    assert [s.goal.text for s in status.goals] == ["a second goal, max 2 experiments"]
    assert "Stopped by" in blocks_text(queued) and await bot.store.queued_goals() == []
    # A reply to the stopped goal's card says it did not start.
    await fake.user_replies(general, queued.ts, "stop", user=ALICE)
    late = await fake.wait_for(lambda: [e for e in fake.ephemerals(ALICE) if "did not start" in e.text], 10)
    assert "stopped by <@U0ALICE> before it started" in late[0].text


async def test_cards_say_when_their_runner_is_down_and_recover(fake, make_bot, start_runner, tmp_path):
    agent = write_agent(tmp_path, "sleepy.sh", 'goaltender milestone "Warming up"\nsleep 60\n')
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy")
    bot = await make_bot(runner.settings.socket_path)
    await fake.slash_command("/goal", "tune the lr", fake.general, ALICE)
    card = await fake.wait_for_message(fake.general, text="Goal #1")
    await fake.wait_for_message(fake.general, thread_ts=card.ts, text="Warming up", timeout=15)

    await runner.close()  # the box goes away
    await fake.wait_for(lambda: "unreachable" in blocks_text(card), 15)
    assert "Warming up" not in blocks_text(card) and "Goal #1" in blocks_text(card)
    # New goals meanwhile queue for it, visibly.
    res = await fake.slash_command("/goal", "second idea", fake.general, ALICE)
    assert "queued (q1)" in (await res.wait_for_ephemeral(timeout=10)).text

    await start_runner(agents={"sleepy": agent}, default_agent="sleepy")  # same home and socket
    await fake.wait_for(lambda: "unreachable" not in blocks_text(card), 30)
    second = await fake.wait_for_message(fake.general, text="Goal #2", timeout=30)
    assert "second idea" in blocks_text(second)
    assert bot.pool["box"].healthy


async def test_http_mode_verifies_signatures(fake, start_runner, tmp_path):
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 60\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy")
    settings = BotSettings(
        home=tmp_path / "bot",
        runners=[RunnerTarget(name="box", socket=runner.settings.socket_path)],
        slack_api_url=fake.api_url,
        slack_bot_token=fake.bot_token,
        slack_mode="http",
        http_host="127.0.0.1",
        http_port=0,
        slack_signing_secret="s3cret",
        outbox_interval_s=0.05,
    )
    assert settings.missing_tokens() == []
    bot = await GoaltenderBot.open(settings)
    try:
        await bot.start()
        await asyncio.wait_for(bot.pool["box"].wait_healthy(), 10)
        url = f"http://127.0.0.1:{bot.http_port}/slack/events"
        fake.deliver_over_http(url, "s3cret")

        res = await fake.slash_command("/goal", "tune the lr over http", fake.general, ALICE)
        assert res.acked and res.envelope.http_status == 200
        assert "goal #1" in (await res.wait_for_ephemeral(timeout=10)).text.lower()
        card = await fake.wait_for_message(fake.general, text="Goal #1")
        reply = await fake.user_replies(fake.general, card.ts, "status", user=ALICE)
        await fake.wait_for_message(
            fake.general, thread_ts=card.ts, text="Status now", after=reply.ts, timeout=10
        )

        # A request signed with another secret, or replayed after five minutes, is refused.
        form = {"command": "/goal", "text": "forged goal", "channel_id": fake.general, "user_id": ALICE}
        body = urlencode(form).encode()
        async with aiohttp.ClientSession() as session:
            for headers in (
                fake.sign(body, secret="wrong"),
                fake.sign(body, timestamp=int(time.time()) - 600),
            ):
                headers["Content-Type"] = "application/x-www-form-urlencoded"
                async with session.post(url, data=body, headers=headers) as response:
                    assert response.status == 401
            event = json.dumps({"type": "url_verification", "challenge": "abc"}).encode()
            async with session.post(url, data=event, headers=fake.sign(event)) as response:
                assert response.status == 200 and (await response.json())["challenge"] == "abc"
        status = await bot.pool["box"].request(p.Status())
        assert [s.goal.text for s in status.goals] == ["tune the lr over http"]
    finally:
        await bot.close()


def test_http_mode_names_the_signing_secret():
    settings = BotSettings(slack_mode="http", slack_bot_token="xoxb-1")
    assert settings.missing_tokens() == ["SLACK_SIGNING_SECRET"]
