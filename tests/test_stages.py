"""Staged goals and cross-checks (runner/stages.py), through the real runner, sandbox and CLI: a
goal with `stages: plan, implement, campaign` waits at each gate for a person, with the stage's
summary and document in the prompt, and runs no experiment before its campaign stage; a
cross-check that disagrees blocks experiments until a person decides, one that agrees clears it."""

from __future__ import annotations

from pathlib import Path

from helpers import events_until_report, eventually, pending_approval, submit, write_agent
from hypothesis import given
from hypothesis import strategies as st

from goaltender.protocol import messages as p
from goaltender.runner.stages import compare, parse_stages
from goaltender.storage.records import MilestoneReported, PostsFolded

STAGED = """
echo "# Plan\nTry lr 1e-3, then 3e-3." > plan.md
goaltender experiment -d early --metric score -- python -c 'print("score: 1")' 2> early.err
echo "early rc=$?" >> said.txt
goaltender stage-done "planned two runs" --attach plan.md
echo "plan rc=$?" >> said.txt
goaltender stage-done "implemented it"
echo "implement rc=$?" >> said.txt
goaltender stage-done "implemented it, with tests this time"
echo "implement again rc=$?" >> said.txt
goaltender experiment -d run --metric score -- python -c 'print("score: 1")'
echo "campaign rc=$?" >> said.txt
sleep 60
"""

# A and B print the same numbers, or not (B's `grad` may differ).
CROSS = """
echo "print('loss: 0.6931'); print('grad: {grad_a}')" > a.py
echo "print('loss: 0.6931'); print('grad: {grad_b}')" > b.py
goaltender cross-check -d "softmax loss on a toy batch" --a "python a.py" --b "python b.py"
echo "check rc=$?" >> said.txt
goaltender experiment -d after --metric score -- python -c 'print("score: 1")' 2> after.err
echo "after rc=$?" >> said.txt
sleep 60
"""


def test_stages_are_read_from_the_goal():
    assert parse_stages("port OAPL, stages: plan, implement, campaign; budget 5h") == [
        "plan",
        "implement",
        "campaign",
    ]
    assert parse_stages("stages: paper-to-code") == ["read", "plan", "implement", "cross-check", "campaign"]
    assert parse_stages("stage: plan -> campaign") == ["plan", "campaign"]
    assert parse_stages("no stages here") == []


@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(-1e6, 1e6), max_size=6))
def test_a_comparison_with_itself_agrees(numbers):
    found = compare(numbers, dict(numbers))
    assert found.differing == [] and sorted(found.agreed) == sorted(numbers)


def test_what_disagrees():
    found = compare({"loss": 0.6931, "grad": 1.0}, {"loss": 0.6941, "extra": 2.0}, rtol=1e-5)
    assert [d[0] for d in found.differing] == ["extra", "grad", "loss"] and not found.ok
    assert "| loss | 0.6931 | 0.6941 | 0.001 |" in found.table()


def said(runner, goal_id: int) -> str:
    path = runner.settings.workspaces / f"goal-{goal_id}" / "said.txt"
    return path.read_text() if path.exists() else ""


async def decide(client, approval_id: int, approve: bool, comment: str = "") -> None:
    await client.request(p.Decide(approval_id=approval_id, approve=approve, by="ana", comment=comment))


async def test_a_staged_goal_waits_at_each_gate(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", STAGED)})
    client = await connect(runner)
    goal_id = await submit(client, "stages: plan, implement, campaign; max 3 experiments", agent="a")
    workspace = Path((await client.request(p.Status(goal_id=goal_id))).goals[0].goal.workspace)

    plan = await eventually(lambda: pending_approval(client, goal_id))
    # No experiment before the campaign stage.
    assert said(runner, goal_id) == "early rc=4\n"
    assert "experiments start in stage 'campaign'" in (workspace / "early.err").read_text()
    assert plan.kind == "stage_gate" and plan.question == "Stage 1/3 'plan' is done. Start 'implement'?"
    assert "planned two runs" in plan.detail and "**plan.md**" in plan.detail and "Try lr 1e-3" in plan.detail
    await decide(client, plan.id, True)

    implement = await eventually(lambda: pending_approval(client, goal_id))
    assert implement.question == "Stage 2/3 'implement' is done. Start 'campaign'?"
    await decide(client, implement.id, False, "add tests first")
    again = await eventually(lambda: _newer(pending_approval(client, goal_id), implement.id))
    await decide(client, again.id, True)

    await eventually(lambda: "campaign rc=" in said(runner, goal_id), timeout=30)
    assert said(runner, goal_id).splitlines() == [
        "early rc=4",
        "plan rc=0",
        "implement rc=1",
        "implement again rc=0",
        "campaign rc=0",
    ]
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    assert status.goal.stage_name == "campaign" and status.attempted == 1
    await client.request(p.Stop(goal_id=goal_id))


async def _newer(approval_coro, than: int):
    approval = await approval_coro
    return approval if approval is not None and approval.id > than else None


async def test_a_disagreeing_cross_check_blocks_the_campaign(start_runner, connect, tmp_path):
    script = CROSS.format(grad_a=1.5, grad_b=1.6)
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)})
    client = await connect(runner)
    goal_id = await submit(client, "port the loss, max 3 experiments", agent="a")

    prompt = await eventually(lambda: pending_approval(client, goal_id), timeout=30)
    assert prompt.kind == "cross_check"
    assert (
        prompt.question == "The two implementations disagree on 1 of 2 numbers. Go on to experiments anyway?"
    )
    assert "| grad | 1.5 | 1.6 | 0.1 |" in prompt.detail
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    assert status.goal.blocked.startswith("cross-check #1 disagrees on 1 number(s)")
    await decide(client, prompt.id, False, "B drops the bias term")

    await eventually(lambda: "after rc=" in said(runner, goal_id), timeout=30)
    assert said(runner, goal_id).splitlines() == ["check rc=1", "after rc=4"]
    workspace = runner.settings.workspaces / f"goal-{goal_id}"
    assert (
        "was rejected: fix the implementations and cross-check again" in (workspace / "after.err").read_text()
    )
    assert (workspace / "cross-checks" / "001" / "b.log").read_text() == "loss: 0.6931\ngrad: 1.6\n"
    await client.request(p.Stop(goal_id=goal_id))


async def test_an_agreeing_cross_check_lets_the_campaign_go(start_runner, connect, tmp_path):
    script = CROSS.format(grad_a=1.5, grad_b=1.5)
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)})
    client = await connect(runner)
    goal_id = await submit(client, "port the loss, max 3 experiments", agent="a")
    await eventually(lambda: "after rc=" in said(runner, goal_id), timeout=30)
    assert said(runner, goal_id).splitlines() == ["check rc=0", "after rc=0"]
    await client.request(p.Stop(goal_id=goal_id))


async def test_agreeing_cross_checks_past_the_goals_rate_are_folded(start_runner, connect, tmp_path):
    """A cross-check's agreement is a post the agent's request makes: past the goal's rate
    (runner/folding.py) it is folded like a milestone, and shown before the goal's end."""
    check = 'goaltender cross-check -d "same loss" --a "python a.py" --b "python a.py"\n'
    script = "echo \"print('loss: 0.6931')\" > a.py\n" + check * 3 + "echo done >> said.txt\nsleep 60\n"
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)}, milestone_burst=1)
    client = await connect(runner)
    goal_id = await submit(client, "port the loss, max 3 experiments", agent="a")
    await eventually(lambda: "done" in said(runner, goal_id), timeout=60)
    await client.request(p.Stop(goal_id=goal_id))
    events = await events_until_report(client, goal_id)

    agreed = [e.data for e in events if isinstance(e.data, MilestoneReported) and "agreed" in e.data.title]
    assert [m.folded for m in agreed] == [False, True, True]
    [fold] = [e.data for e in events if isinstance(e.data, PostsFolded)]
    assert fold.titles == ["Cross-check #2 agreed: 1 numbers", "Cross-check #3 agreed: 1 numbers"]
