"""The sweep agent in a real campaign: steering narrows its search, and it reports what it did."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import events_until_report, submit
from toy_task import AGENT as TOY_AGENT

from goaltender.protocol import messages as p
from goaltender.storage.records import ExperimentFinished

TESTS = str(Path(__file__).parent)


async def test_steer_narrows_the_search(start_runner, connect, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    agent = TOY_AGENT
    runner = await start_runner(agents={"toy": agent})
    client = await connect(runner)
    goal_id = await submit(client, "toy sweep, max 5 experiments", agent="toy")
    # Delivered before the agent's first look at its inbox: search only y from the start.
    await client.request(p.Steer(goal_id=goal_id, text="only tune y", author="ana"))
    events = await events_until_report(client, goal_id, timeout=60)

    milestones = [e.data for e in events if e.data.kind == "milestone"]
    applied = next(m for m in milestones if m.title.startswith("Steer from ana"))
    assert "Applied: searching only y" in applied.text and "x (frozen)" in applied.text
    rows = [e.data.experiment for e in events if isinstance(e.data, ExperimentFinished)]
    assert rows[0].description.startswith("baseline")
    assert all(row.params["x"] == 1 for row in rows)  # x never moved
    assert {row.params["y"] for row in rows} == {1, 2, 3}
    report = events[-1].data
    assert "search space is exhausted" in report.text and "## From the agent" in report.text


async def test_a_change_of_course_on_noisy_gains_confirms_the_best_with_seeds(
    start_runner, connect, monkeypatch
):
    from helpers import eventually, pending_approval
    from noisy_task import AGENT as NOISY_AGENT
    from noisy_task import ANSWERED

    from goaltender.storage.records import SteerReceived

    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runner = await start_runner(agents={"noisy": NOISY_AGENT}, noise_ask_after=2)
    client = await connect(runner)
    goal_id = await submit(client, "noisy sweep, max 5 experiments", agent="noisy")

    asked = await eventually(lambda: pending_approval(client, goal_id, "low_signal"), timeout=60)
    await client.request(p.Decide(approval_id=asked.id, approve=False, by="ana", comment="check the seeds"))

    async def answer_in_inbox() -> bool:
        events = await runner.store.events_since(0, goal_id=goal_id)
        return any(isinstance(e.data, SteerReceived) for e in events)

    await eventually(answer_in_inbox)
    goal = await runner.store.get_goal(goal_id)
    assert goal is not None
    (Path(goal.workspace) / ANSWERED).touch()  # the run waiting for it ends; the agent reads its inbox next
    events = await events_until_report(client, goal_id, timeout=60)
    rows = [e.data.experiment for e in events if isinstance(e.data, ExperimentFinished)]
    confirm = next(row for row in rows if row.description.startswith("confirm #"))
    assert confirm.repeats == 3 and confirm.interval_how == "mean ± sd of 3 seeds"
    assert [confirm.metrics[f"accuracy/seed_{i}"] for i in range(3)] == [confirm.metric_value] * 3
    log = Path(confirm.log_path).parent
    assert [
        (log / name).read_text().split("seed: ")[1].strip() for name in ("run.log", "run-2.log", "run-3.log")
    ] == [
        "0",
        "1",
        "2",
    ]
