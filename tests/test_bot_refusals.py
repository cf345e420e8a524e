"""In Slack, goal words and budget changes that cannot be are refused where they were written,
saying why: `/goal … budget 0h` in the command's answer, `budget +0h` or a steer carrying
`max 0 experiments` in the goal's thread. Nothing is dropped silently; the budget stays as it was."""

from __future__ import annotations

from fake_slack import ALICE
from helpers import blocks_text, write_agent

from goaltender.bot import queries


async def test_limits_that_cannot_be_are_refused_in_slack(fake, make_bot, start_runner, tmp_path):
    runner = await start_runner(
        agents={"sleepy": write_agent(tmp_path, "sleepy.sh", "sleep 120\n")}, default_agent="sleepy"
    )
    # With a second-person rule the budget guard sizes changes first: it lets these through.
    bot = await make_bot(runner.settings.socket_path, budget_second_person="1h")
    general = fake.general

    zero = await fake.slash_command("/goal", "tune the lr, budget 0h", general, ALICE)
    assert "`budget 0h`: a time budget must be at least 1s" in zero.ack_payload["text"]
    over = await fake.slash_command("/goal", "tune the lr to 150%", general, ALICE)
    assert "a percentage target is at most 100%" in over.ack_payload["text"]
    assert fake.messages(general) == []  # no goal, no card

    await fake.slash_command("/goal", "tune the lr, budget 1h", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1")
    for words, says in [
        ("budget +0h", "an extension must be at least 1s"),
        ("budget +99999999h", "at most 365 days"),
        ("steer: please stop early, max 0 experiments", "the message was not delivered"),
    ]:
        await fake.user_replies(general, card.ts, words, user=ALICE)
        answer = await fake.wait_for_message(general, thread_ts=card.ts, text=says, timeout=10)
        assert "That did not work" in blocks_text(answer)

    status = await queries.goal_status(bot.pool, "box", 1)
    assert status is not None and status.goal.budget.wall_seconds == 3600
    assert status.goal.budget.max_experiments is None
    assert await runner.store.read_inbox(1, unread_only=False) == []
