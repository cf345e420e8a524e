"""Clicks the bot did not make: a forged block_actions payload (any button, any value, on any
message) decides nothing it should not, and the clicker is always told why nothing happened.
Rights are checked against the goal the decided approval belongs to, never another one."""

from __future__ import annotations

from fake_slack import ALICE, BOB
from helpers import blocks_text, write_agent
from hypothesis import given
from hypothesis import strategies as st

from goaltender.bot.keys import ROW_ID_MAX, row_id

ASKER = 'goaltender ask "Launch the 8-GPU run?" --detail "~6 GPU-hours"\nsleep 120\n'
ODD = ["²", "٣", "0", "-1", "+1", " 1", "1 ", "01", "", "1.0", str(ROW_ID_MAX + 1), "9" * 24, "1" * 2000]


def forged_buttons(fake, channel: str, thread_ts: str, user: str, action_id: str, value: str):
    """A message in a thread, not the bot's, carrying a button with `value`."""
    button = {"type": "button", "action_id": action_id, "text": {"type": "plain_text", "text": "A"}}
    blocks = [{"type": "actions", "elements": [{**button, "value": value}]}]
    return fake.add_message(channel, "x", user=user, thread_ts=thread_ts, blocks=blocks)


async def test_a_forged_value_cannot_decide_another_goals_approval(fake, make_bot, start_runner, tmp_path):
    agents = {
        "asker": write_agent(tmp_path, "asker.sh", ASKER),
        "sleepy": write_agent(tmp_path, "sleepy.sh", "sleep 120\n"),
    }
    runner = await start_runner(agents=agents, default_agent="asker")
    await make_bot(runner.settings.socket_path)
    general = fake.general
    await fake.slash_command("/goal", "alice's goal, budget 1h", general, ALICE)
    alices = await fake.wait_for_message(general, text="Goal #1")
    prompt = await fake.wait_for_message(general, thread_ts=alices.ts, text="Approval needed", timeout=20)
    await fake.slash_command("/goal", "bob's goal with sleepy, budget 1h", general, BOB)
    bobs = await fake.wait_for_message(general, text="Goal #2")

    # In his own goal's thread Bob may decide, but a button there naming Alice's approval #1
    # (on this runner, or a runner named otherwise) decides nothing.
    for value in ("box:1", "1", "other:1", "box:box:1"):
        forged = forged_buttons(fake, general, bobs.ts, BOB, "approve", value)
        click = await fake.click_button(general, forged.ts, "approve", user=BOB)
        assert "can't find this approval" in (await click.wait_for_ephemeral()).text
    assert (await runner.store.get_approval(1)).state == "pending"
    assert prompt.action_ids() == ["approve", "reject"]

    # A button naming it in its own goal's thread, clicked by its owner, still decides it.
    forged = forged_buttons(fake, general, alices.ts, ALICE, "approve", "box:1")
    await fake.click_button(general, forged.ts, "approve", user=ALICE)
    await fake.wait_for(lambda: "Approved* by <@U0ALICE>" in blocks_text(prompt), 15)


async def test_odd_button_values_are_answered(fake, make_bot, start_runner, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", "sleep 120\n")}, default_agent="a")
    await make_bot(runner.settings.socket_path, approvers=["U0CAROL"], budget_second_person="1h")
    fake.add_user("U0CAROL", "carol")
    general = fake.general
    await fake.slash_command("/goal", "tune, budget 1h", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1")
    await fake.user_replies(general, card.ts, "budget +2h", user=ALICE)
    held = await fake.wait_for_message(general, thread_ts=card.ts, text="needs a second person", timeout=10)
    for value in ODD:
        click = await fake.click_button(general, held.ts, "budget_approve", value=value, user="U0CAROL")
        assert "can't find this budget request" in (await click.wait_for_ephemeral()).text, value
        forged = forged_buttons(fake, general, card.ts, ALICE, "approve", f"box:{value}")
        click = await fake.click_button(general, forged.ts, "approve", user=ALICE)
        assert "can't find this approval" in (await click.wait_for_ephemeral()).text, value
    assert (await runner.store.get_goal(1)).budget.wall_seconds == 3600  # nothing decided


@given(st.text())
def test_only_plain_row_ids_are_read(value):
    parsed = row_id(value)
    canonical = value.isascii() and value.isdigit() and not value.startswith("0")
    if canonical and int(value) <= ROW_ID_MAX:
        assert parsed == int(value)
    else:
        assert parsed is None


@given(st.integers())
def test_every_row_id_reads_back(number):
    assert row_id(str(number)) == (number if 1 <= number <= ROW_ID_MAX else None)
