"""Results a team can trust (runner/noise.py), through the real runner and CLI: a headline measured
on n examples gets its Wilson interval, a new best inside its predecessor's noise is kept but
flagged *within noise*, two in a row ask the humans how to go on (their answer reaches the agent),
and `--repeat 3` runs seeds and records mean ± sd."""

from __future__ import annotations

import pytest
from helpers import events_until_report, eventually, pending_approval, submit, write_agent
from hypothesis import given
from hypothesis import strategies as st

from goaltender.protocol import messages as p
from goaltender.runner import noise

# An experiment printing an accuracy measured on 64 examples.
SCORED = "goaltender experiment -d 'acc {acc}' --metric accuracy -- python -c \"print('accuracy: {acc}'); print('n: 64')\"\n"


def test_wilson_matches_the_textbook():
    low, high = noise.wilson(16, 64)  # 25% on 64 examples
    assert (round(low, 3), round(high, 3)) == (0.16, 0.368)
    assert noise.wilson(0, 10)[0] == 0.0 and noise.wilson(10, 10)[1] == 1.0


@given(st.integers(1, 5000), st.data())
def test_a_wilson_interval_holds_its_proportion(n, data):
    k = data.draw(st.integers(0, n))
    low, high = noise.wilson(k, n)
    assert 0.0 <= low <= k / n <= high <= 1.0


def test_what_counts_as_within_noise():
    found = noise.interval("accuracy", 0.27, {"accuracy": 0.27, "n_heldout": 64})
    assert found is not None and found.how == "Wilson 95%, n=64"
    assert noise.within_noise(found, 0.25, "maximize")
    assert not noise.within_noise(noise.interval("accuracy", 0.9, {"n": 64}), 0.25, "maximize")
    assert noise.interval("loss", 3.2, {"n": 64}) is None  # not a proportion, one seed: unknown
    seeds = noise.interval("loss", 2.0, {}, [1.9, 2.0, 2.1])
    assert seeds is not None and seeds.how == "mean ± sd of 3 seeds"
    assert noise.within_noise(seeds, 2.05, "minimize") and not noise.within_noise(seeds, 2.5, "minimize")


async def test_gains_within_noise_are_flagged_and_the_humans_asked(start_runner, connect, tmp_path):
    script = "".join(SCORED.format(acc=acc) for acc in (0.25, 0.27, 0.29)) + (
        "until goaltender inbox | grep -q 'low-signal'; do sleep 0.2; done\n"
        "goaltender inbox --all > heard.txt\n" + SCORED.format(acc=0.9)
    )
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)})
    client = await connect(runner)
    goal_id = await submit(client, "reach 90% accuracy, max 4 experiments", agent="a")

    asked = await eventually(lambda: pending_approval(client, goal_id), timeout=60)
    assert asked.kind == "low_signal"
    assert asked.question.startswith("The last 2 gains are within noise (#2 0.27 (Wilson 95%, n=64:")
    assert "--repeat 3" in asked.detail
    await client.request(p.Decide(approval_id=asked.id, approve=False, by="ana", comment="try 3 seeds"))
    await events_until_report(client, goal_id)

    ledger = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert [(e.status, e.within_noise) for e in ledger] == [
        ("keep", False),  # the first has nothing to be within the noise of
        ("keep", True),
        ("keep", True),
        ("keep", False),  # 0.9 is well clear of 0.29's noise
    ]
    first = ledger[0]
    assert (round(first.interval_low, 3), round(first.interval_high, 3)) == (0.16, 0.368)
    heard = (runner.settings.workspaces / f"goal-{goal_id}" / "heard.txt").read_text()
    assert "the humans said: change course: try 3 seeds" in heard
    report = (await client.request(p.Summary(goal_id=goal_id))).text
    assert "**within noise**" in report and "Wilson 95%, n=64" in report


async def test_repeat_runs_seeds_and_records_mean_and_sd(start_runner, connect, tmp_path):
    script = (
        "goaltender experiment -d seeds --repeat 3 --metric loss --minimize -- python -c "
        "\"import os; s = int(os.environ['GOALTENDER_SEED']); print(f'loss: {2.0 + s / 10}')\"\n"
    )
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)})
    client = await connect(runner)
    goal_id = await submit(client, "seeds, max 1 experiments", agent="a")
    await events_until_report(client, goal_id)
    [row] = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert row.status == "keep" and row.repeats == 3
    assert row.metric_value == pytest.approx(2.1)
    assert row.metrics["loss/sd"] == pytest.approx(0.1)
    assert [row.metrics[f"loss/seed_{i}"] for i in range(3)] == pytest.approx([2.0, 2.1, 2.2])
    assert row.interval_how == "mean ± sd of 3 seeds"
    assert (row.interval_low, row.interval_high) == pytest.approx((2.0, 2.2))
    run_dir = runner.settings.workspaces / f"goal-{goal_id}" / "experiments" / "001"
    assert sorted(path.name for path in run_dir.glob("run*.log")) == ["run-2.log", "run-3.log", "run.log"]
    assert "loss: 2.2" in (run_dir / "run-3.log").read_text()


async def test_a_training_curve_that_has_not_moved_asks_the_humans(start_runner, connect, tmp_path):
    flat = (
        'goaltender experiment -d flat --metric accuracy -- python -c "import json\n'
        "for step in range(8): print(json.dumps({'step': step, 'train_loss': 0.6931}))\n"
        "print('accuracy: 0.5')\"\nsleep 60\n"
    )
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", flat)})
    client = await connect(runner)
    goal_id = await submit(client, "learn something, max 2 experiments", agent="a")

    asked = await eventually(lambda: pending_approval(client, goal_id), timeout=60)
    assert asked.kind == "low_signal"
    assert asked.question == (
        "The training curve of #1 has not moved (train_loss 0.6931 → 0.6931 over 8 points). Go on as planned?"
    )
    await client.request(p.Stop(goal_id=goal_id))
