"""What agents write (milestones, approval questions and details, their report) reaches Slack as
text only: id-like words in it (a model named UNET3, `W2V1024`, even `slack:U0DAN` or `<@U0CAROL>`)
ping nobody. Only the people the runner records as acting (who stopped, who decided) are mentions."""

from __future__ import annotations

import re

import pytest
from fake_slack import ALICE
from helpers import blocks_text, write_agent

from goaltender.bot import mrkdwn, render
from goaltender.storage.records import Approval, FinalReport, MilestoneReported, utcnow

ID_WORDS = "UNET3 and U2NET beat W2V1024; cc U0CAROL slack:U0DAN <@U0CAROL> <@W0TEAM1|team>"
AGENT = f"""
printf '%s\\n' 'Ours wins.' '{ID_WORDS}' > report.md
goaltender report --file report.md
goaltender milestone '{ID_WORDS}' 'details: {ID_WORDS}'
goaltender ask 'Train UNET3? {ID_WORDS}' --detail 'needs {ID_WORDS}' || true
sleep 120
"""


def mentions(text: str) -> set[str]:
    return set(re.findall(r"<@([UW][A-Z0-9]+)", text))


async def test_agent_words_ping_nobody_and_actors_still_do(fake, make_bot, start_runner, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", AGENT)}, default_agent="a")
    await make_bot(runner.settings.socket_path)
    general = fake.general
    await fake.slash_command("/goal", "tune the lr, budget 1h", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1")
    milestone = await fake.wait_for_message(general, thread_ts=card.ts, text="Milestone", timeout=20)
    prompt = await fake.wait_for_message(general, thread_ts=card.ts, text="Approval needed", timeout=20)
    assert "UNET3 and U2NET" in blocks_text(milestone) and "needs UNET3" in blocks_text(prompt)
    assert mentions(blocks_text(milestone)) == mentions(blocks_text(prompt)) == set()

    # Alice approves, then stops it: she is named as a mention, the agent's words still are not.
    await fake.click_button(general, prompt.ts, "approve", user=ALICE)
    await fake.wait_for(lambda: "Approved* by <@U0ALICE>" in blocks_text(prompt), 15)
    assert mentions(blocks_text(prompt)) == {ALICE}
    await fake.user_replies(general, card.ts, "stop", user=ALICE)
    report = await fake.wait_for_message(general, thread_ts=card.ts, text="Final report", timeout=60)
    assert "stopped by <@U0ALICE>" in report.text and "UNET3 and U2NET" in blocks_text(report)
    assert mentions(blocks_text(report)) == {ALICE} and "slack:U0ALICE" not in blocks_text(report)
    assert mentions(" ".join(blocks_text(m) for m in fake.messages(general, card.ts))) == {ALICE}


def test_render_makes_mentions_only_of_recorded_actors():
    when = utcnow()
    payloads = [
        render.milestone(MilestoneReported(title=ID_WORDS, text=ID_WORDS)),
        render.approval_prompt(Approval(id=7, goal_id=1, question=ID_WORDS, detail=ID_WORDS, expires_at=when), "b"),
        render.approval_decided(
            Approval(id=7, goal_id=1, question=ID_WORDS, expires_at=when, state="approved", decided_by="slack:U0BOB")
        ),
        render.final_report(
            FinalReport(end_reason=f"stopped by slack:U0BOB via goaltender-bot (uid 0): {ID_WORDS}", text=ID_WORDS)
        ),
    ]  # fmt: skip
    said = [p["text"] + str(p["blocks"]) for p in payloads]
    assert [mentions(s) for s in said] == [set(), set(), {"U0BOB"}, {"U0BOB"}]
    assert all("&lt;@U0CAROL&gt;" in s for s in said)  # an agent's own mention markup is shown, inert
    # Runner-written text: the actor it records at the start is a mention, nothing after it.
    assert render.people(f"paused by U0BOB: {ID_WORDS}").count("<@") == 1
    assert render.people("the goal ended: stopped by slack:U0BOB via goaltender-bot (uid 0)") == (
        "the goal ended: stopped by <@U0BOB>"
    )
    assert render.people(f"the agent exited with code 1:\nslack:U0DAN {ID_WORDS}").count("<@") == 0
    # What only people and the bot wrote (an audit detail) keeps the people named in it, no guesses.
    typed = render.people(f"'{ID_WORDS}': refused", typed=True)
    assert mentions(typed) == {"U0CAROL", "W0TEAM1", "U0DAN"} and "UNET3" in typed


LONG_ASK = """
for i in $(seq 1 300); do echo "- step $i: widen layer $i from 64 to 128 & re-run <eval>"; done > plan.md
goaltender ask "Apply this plan?" --detail "$(cat plan.md)"
echo "$?" > ask.rc
sleep 120
"""


async def test_a_long_detail_is_cut_and_the_buttons_stay(fake, make_bot, start_runner, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", LONG_ASK)}, default_agent="a")
    await make_bot(runner.settings.socket_path)
    await fake.slash_command("/goal", "tune, budget 1h", fake.general, ALICE)
    card = await fake.wait_for_message(fake.general, text="Goal #1")
    prompt = await fake.wait_for_message(fake.general, thread_ts=card.ts, text="Approval needed", timeout=20)
    shown = blocks_text(prompt)
    assert prompt.action_ids() == ["approve", "reject"] and "Apply this plan?" in shown
    assert "step 1: widen" in shown and "detail truncated here" in shown and "step 300" not in shown
    assert "react on this message" in shown  # the reaction hint too
    await fake.click_button(fake.general, prompt.ts, "approve", user=ALICE)
    rc = runner.settings.workspaces / "goal-1" / "ask.rc"
    await fake.wait_for(lambda: rc.exists() and rc.read_text().strip() == "0", 20)


@pytest.mark.parametrize(
    ("question", "detail"),
    [
        ("<" * 3000, "&" * 20_000),
        ("q", "x" * 20_000),
        ("q", "line\n" * 4000),
        ("q" * 3000, "| a | b |\n" * 2000),
    ],
)
def test_an_approval_prompt_always_keeps_its_buttons(question, detail):
    approval = Approval(id=7, goal_id=1, question=question, detail=detail, expires_at=utcnow())
    blocks = render.approval_prompt(approval, "box")["blocks"]
    assert [b["type"] for b in blocks[-2:]] == ["actions", "context"] and render.APPROVAL_HINT in str(
        blocks[-1]
    )
    assert len(blocks) <= mrkdwn.MAX_BLOCKS and sum(map(mrkdwn.block_chars, blocks)) <= mrkdwn.MAX_TOTAL
    assert "detail truncated here" in str(blocks)
    shown = blocks[0]["text"]["text"]
    assert shown.endswith(render.escape(question)) or (shown.endswith("…") and len(question) > 2000)
