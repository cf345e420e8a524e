"""The team's views, through the real bot, a real runner and the fake Slack: `summary` in a thread is
answered by the bot (the agent hears nothing), `/goal list` and `/goal show N` answer only the asker,
the App Home tab shows a person's goals and what waits for them; people always appear as mentions."""

from __future__ import annotations

import json

from fake_slack import ALICE, BOB
from helpers import blocks_text, write_agent

from goaltender.bot import render
from goaltender.bot.views import asks_for_summary, command_words

CAROL = "U0CAROL"

AGENT = """
goaltender milestone "Plan" "baseline first, then ask"
goaltender experiment -d base --metric acc -- python -c 'print("acc: 0.5")'
goaltender diary write --handoff "Next: try lr 3e-4; the baseline is at 50%."
goaltender ask "Run the big one?" --detail "~2 GPU-hours"
sleep 120
"""


def shown(ephemeral) -> str:
    return ephemeral.text + json.dumps(ephemeral.blocks or [])


async def test_summary_list_show_and_the_home_tab(fake, make_bot, start_runner, tmp_path):
    agent = write_agent(tmp_path, "agent.sh", AGENT)
    runner = await start_runner(agents={"agent": agent}, default_agent="agent")
    await make_bot(runner.settings.socket_path, approvers=[CAROL])
    fake.add_user(CAROL, "carol")
    general = fake.general
    await fake.slash_command("/goal", "find a good lr, max 5 experiments", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1")
    await fake.wait_for_message(general, thread_ts=card.ts, text="Run the big one?", timeout=15)

    # Anyone may ask what happened: the bot answers from the ledger, milestones and diary.
    question = await fake.user_replies(general, card.ts, "What happened so far?", user=BOB)
    summary = await fake.wait_for_message(general, thread_ts=card.ts, text="Goal #1 so far", timeout=10)
    text = blocks_text(summary)
    assert "Plan" in text and "Next: try lr 3e-4" in text and "latest handoff" in text
    assert "1 finished (1 keep)" in text and "waiting for approval #1" in text
    assert "owner <@U0ALICE>" in text and "slack:" not in text
    assert await runner.store.read_inbox(1, unread_only=False) == []  # not sent to the agent
    assert fake.message(general, question.ts).reactions == {}

    # /goal list and /goal show answer only the asker.
    listed = await fake.slash_command("/goal", "list", general, BOB)
    answer = shown(await listed.wait_for_ephemeral())
    assert "Active goals in this channel* (1)" in answer and "waiting for approval" in answer
    assert f"/archives/{general}/p{card.ts.replace('.', '')}|Goal #1>" in answer
    assert "owner <@U0ALICE>" in answer and "find a good lr" in answer
    one = await fake.slash_command("/goal", "show 1", general, BOB)
    card_answer = shown(await one.wait_for_ephemeral())
    assert (
        "Goal #1" in card_answer
        and "Open goal #1's thread" in card_answer
        and "owner <@U0ALICE>" in card_answer
    )
    missing = await fake.slash_command("/goal", "show #7", general, BOB)
    assert "There is no goal #7 in this channel" in (await missing.wait_for_ephemeral()).text
    assert [m for m in fake.messages(general) if m.bot_id] == [card]  # nothing posted for them

    # The App Home tab: Alice's goal and its approval (she owns it), Carol's approval (an
    # approver), nothing for Bob.
    for user in (ALICE, BOB, CAROL):
        await fake.user_opens_home(user)
    homes = await fake.wait_for(lambda: len(fake.home_views) == 3 and dict(fake.home_views))
    alice, bob, carol = (json.dumps(homes[u]["blocks"]) for u in (ALICE, BOB, CAROL))
    assert "Your goals* (1)" in alice and "Goal #1" in alice and "Run the big one?" in alice
    assert "Waiting for you* (1)" in alice and "Waiting for you* (1)" in carol
    assert "Your goals* (0)" in bob and "Nothing waits for your decision" in bob

    # Stopped: off the list; the home tab shows it stopped.
    await fake.user_replies(general, card.ts, "stop", user=ALICE)
    await fake.wait_for(lambda: "ended: stopped by <@U0ALICE>" in blocks_text(card), 15)
    after = await fake.slash_command("/goal", "list", general, ALICE)
    assert "No active goals in this channel" in (await after.wait_for_ephemeral()).text
    before = fake.home_views[ALICE]
    await fake.user_opens_home(ALICE)
    home = await fake.wait_for(lambda: fake.home_views[ALICE] is not before and fake.home_views[ALICE])
    assert "*stopped*" in json.dumps(home["blocks"]) and "Waiting for you* (0)" in json.dumps(home["blocks"])


def test_people_are_mentions_whatever_the_runner_wrote():
    for who in ("U0ALICE", "slack:U0ALICE", "slack:U0ALICE via goaltender-bot (uid 0)"):
        assert render.user_ref(who) == "<@U0ALICE>"
    assert render.user_ref("alice via goaltender (uid 1000)") == "alice via goaltender (uid 1000)"
    assert render.user_ref("goaltender") == "goaltender" and render.user_ref(None) == "someone"
    assert (
        render.people("stopped by slack:U0ALICE via goaltender-bot (uid 0): enough <now>")
        == "stopped by <@U0ALICE>: enough &lt;now&gt;"
    )
    assert render.people("paused by U0BOB") == "paused by <@U0BOB>"  # older records
    assert render.people("slack:W0TEAM12: deadline +2h00m") == "<@W0TEAM12>: deadline +2h00m"
    # Words that only look like ids, and CLI operators, stay as they are.
    assert render.people("UPDATED WARNING U2 by alice (uid 1000)") == "UPDATED WARNING U2 by alice (uid 1000)"


def test_what_asks_for_a_view():
    assert command_words("list") == ("list", "") and command_words("show 3") == ("show", "3")
    assert command_words("show #3 on gpu1") == ("show", "#3 on gpu1")
    assert command_words("list the failure cases and fix them") is None
    assert command_words("show me a better model") is None
    for ask in ("summary", "What happened so far?", "what's happened", "recap", "how is it going?"):
        assert asks_for_summary(ask), ask
    for steer in ("summarize the results in your report", "what happened to lr 3e-4? try it again"):
        assert not asks_for_summary(steer), steer


def test_a_slash_commands_escaped_text_reads_as_typed():
    from goaltender.bot.intake import command_text

    escaped = (
        "ask <@U0BOB|bob> in <#C0GENERAL|general> about <https://arxiv.org/abs/1|arxiv.org/abs/1> <!here>"
    )
    assert command_text(escaped) == "ask @bob in #general about https://arxiv.org/abs/1 @here"
    assert command_text("train to 95%, budget 2h") == "train to 95%, budget 2h"
