"""A token budget for the LLM agent (issue 14): `max 50k tokens` in a goal is parsed, shown on the
card, and enforced by the runner from the agent's own metered counters; a resumed agent's counters
start again from zero without resetting the tally."""

from __future__ import annotations

import pytest
from helpers import events_until_report, submit, write_agent

from goaltender.bot.render import status_card
from goaltender.protocol import messages as p
from goaltender.protocol.budget import GoalTextError, parse_goal_text
from goaltender.storage.records import tokens_used

# An agent metering its tokens the way the built-in ones do: cumulative counters, one point a turn.
METERED = """
for turn in 1 2 3 4 5 6 7 8 9 10; do
  goaltender metrics agent/input_tokens=$((turn * 9000)) agent/output_tokens=$((turn * 1000)) --step $turn
  echo "turn $turn" >> turns.txt
done
sleep 60
"""


def test_token_budgets_are_read_from_the_goal():
    assert parse_goal_text("tune it, max 50k tokens").max_tokens == 50_000
    assert parse_goal_text("tune it, token budget 2M, budget 1h").max_tokens == 2_000_000
    assert parse_goal_text("at most 1200 tokens").max_tokens == 1200
    with pytest.raises(GoalTextError, match="a token budget must be from 1"):
        parse_goal_text("max 0 tokens")


def test_a_resumed_agent_does_not_reset_the_tally():
    # 10k, 20k, then a restart (counters from zero): 5k more, then 8k.
    assert tokens_used({"agent/input_tokens": [10_000, 20_000, 5_000, 8_000]}) == 28_000
    assert tokens_used({"agent/input_tokens": [100, 300], "agent/output_tokens": [50]}) == 350


async def test_the_runner_stops_an_agent_past_its_token_budget(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", METERED)})
    client = await connect(runner)
    goal_id = await submit(client, "spend tokens, max 50k tokens, max 3 experiments", agent="a")
    events = await events_until_report(client, goal_id, timeout=60)

    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    assert status.goal.state == "finished"
    assert status.goal.end_reason == "token budget used: 50,000/50,000 tokens"
    assert status.tokens_used == 50_000
    turns = (runner.settings.workspaces / f"goal-{goal_id}" / "turns.txt").read_text().split()
    assert turns.count("turn") <= 6  # stopped at the fifth turn (or just after), not the tenth
    assert "token budget used" in events[-1].data.text
    card = str(status_card(status, "test-runner"))
    assert "tokens" in card and "50k/50k" in card
    # Ended by its token budget, it says its stop condition was met by it (issue 36), in its
    # status and in its final report alike.
    assert status.stop_status == "stop condition met (tokens): 0/3 attempted, 50k/50k tokens"
    assert f"**Stop status:** {status.stop_status}" in events[-1].data.text
