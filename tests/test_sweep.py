"""The sweep planner: baseline first, one knob per hypothesis, momentum, steering; and the
sweep process's exits when it cannot work (no runner, no task)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import events_until_report, submit
from toy_task import TASK

from goaltender.agents.sweep import Constraints, Planner
from goaltender.storage.records import Experiment

SWEEP = [sys.executable, "-m", "goaltender.agents.sweep"]


def row(index, params, status, value):
    return Experiment(
        id=index,
        goal_id=1,
        index=index,
        description="",
        command=["x"],
        params=params,
        status=status,
        metric_name="score",
        metric_value=value,
    )


def test_baseline_first_then_one_knob_moves():
    planner = Planner(TASK)
    first = planner.propose([])
    assert first.config == {"x": 1, "y": 1} and first.description.startswith("baseline")
    ledger = [row(1, {"x": 1, "y": 1}, "keep", 0.0)]
    second = planner.propose(ledger)
    assert second.config == {"x": 2, "y": 1} and second.knob == "x" and second.step == 1
    assert second.description == "x 1 → 2: bigger x scores higher so far"


def test_momentum_repeats_the_move_that_helped():
    planner = Planner(TASK)
    ledger = [row(1, {"x": 1, "y": 1}, "keep", 0.0), row(2, {"x": 1, "y": 2}, "keep", 1.0)]
    assert planner.propose(ledger).config == {"x": 1, "y": 3}  # y went up and helped: go on
    ledger.append(row(3, {"x": 1, "y": 3}, "discard", 0.0))
    assert planner.propose(ledger).config == {"x": 2, "y": 2}  # then the other knob, from the best


def test_crashed_and_rejected_configs_are_not_retried():
    planner = Planner(TASK)
    ledger = [row(1, {"x": 1, "y": 1}, "keep", 0.0), row(2, {"x": 2, "y": 1}, "crash", None)]
    planner.rejected.add(planner.key({"x": 1, "y": 2}))
    # x up crashed, y up was declined, and both knobs sit at their lowest value: nothing is left.
    assert planner.propose(ledger) is None
    planner.rejected.clear()
    assert planner.propose(ledger).config == {"x": 1, "y": 2}


def test_exhausted_space_ends_the_search():
    planner = Planner(TASK)
    planner.constraints.frozen = {"x", "y"}
    assert planner.propose([row(1, {"x": 1, "y": 1}, "keep", 0.0)]) is None


def test_steering_words_change_the_space():
    planner = Planner(TASK)
    assert planner.apply_steer("only tune y please") == ["searching only y"]
    assert planner.constraints.frozen == {"x"}
    planner = Planner(TASK)
    assert planner.apply_steer("set ex to 3") == ["pinned x=3"]  # an alias, snapped to a declared value
    ledger = [row(1, {"x": 1, "y": 1}, "keep", 0.0)]
    proposal = planner.propose(ledger)
    assert proposal.config == {"x": 3, "y": 1} and proposal.description.startswith("steered")
    planner = Planner(TASK)
    assert planner.apply_steer("keep x under 3") == ["x <= 3"]
    assert planner.constraints.allows("x", 3) and not planner.constraints.allows("x", 4)
    assert planner.apply_steer("focus on the dense scenes") == []


def test_constraints_survive_a_handoff():
    c = Constraints(frozen={"x"}, pinned={"y": 2}, limits={"x": ("<=", 3.0)})
    assert Constraints.from_json(c.to_json()) == c


def test_without_a_runner_the_sweep_exits_4(tmp_path):
    socket = tmp_path / "nothing-listens.sock"
    env = {**os.environ, "GOALTENDER_GOAL_ID": "1", "GOALTENDER_SOCKET": str(socket)}
    out = subprocess.run(SWEEP, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 4, out.stderr
    assert f"sweep-agent: cannot reach the runner at {socket}: no runner is listening" in out.stderr


async def test_a_task_that_cannot_load_fails_the_goal_clearly(start_runner, connect):
    runner = await start_runner(agents={"sweep": [*SWEEP, "--task", "no_such_module:TASK"]})
    client = await connect(runner)
    goal_id = await submit(client, "sweep nothing, max 1 experiments", agent="sweep")
    events = await events_until_report(client, goal_id, timeout=30)
    [milestone] = [e.data for e in events if e.data.kind == "milestone"]
    assert milestone.title == "The sweep agent is misconfigured"
    assert "--task no_such_module:TASK: ModuleNotFoundError" in milestone.text
    assert "the agent exited with code 2" in events[-1].data.end_reason
