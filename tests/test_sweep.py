"""The sweep planner: baseline first, one knob per hypothesis, momentum, steering; and the
sweep process's exits when it cannot work (no runner, no task)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from helpers import events_until_report, submit
from hypothesis import given
from hypothesis import strategies as st
from toy_task import TASK

from goaltender.agents.sweep import CostThreshold
from goaltender.agents.sweep_planner import Constraints, Planner, Row, SweepTask

SWEEP = [sys.executable, "-m", "goaltender.agents.sweep"]


def row(index, params, status, value):
    return Row(index=index, params=params, status=status, metric_value=value)


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


# ---- priors: a bold opening stride, then believed moves cheapest first ----

PRIORS = SweepTask(
    name="priors",
    metric="score",
    space={"data": [1, 2, 4, 8], "epochs": [1, 2, 4], "lr": [0.1, 0.01, 0.001], "width": [1, 2]},
    baseline={"data": 1, "epochs": 1, "lr": 0.1, "width": 1},
    command=lambda config: ["true"],
    estimate_cost=lambda c: 2 * c["data"] + c["epochs"] + c["width"],
    expect={"data": 1, "epochs": 1, "lr": 1},  # lr's values run from large to small: +1 is smaller
)


def test_priors_open_with_a_stride_of_every_believed_knob_and_stride_while_it_pays():
    planner = Planner(PRIORS)
    ledger = [row(1, PRIORS.baseline, "keep", 0.1)]
    stride = planner.propose(ledger)
    assert stride.config == {"data": 2, "epochs": 2, "lr": 0.01, "width": 1}  # width has no prior
    assert stride.description == (
        "together, each a step its believed way: data 1 → 2, epochs 1 → 2, lr 0.1 → 0.01"
    )
    ledger.append(row(2, stride.config, "keep", 0.5))
    assert planner.propose(ledger).config == {"data": 4, "epochs": 4, "lr": 0.001, "width": 1}
    # A stride that did not pay ends the striding: one-knob moves from the best, the believed
    # ones first and the cheapest of those first (lr costs nothing, then epochs before data), then
    # the others, cheapest first.
    ledger.append(row(3, {"data": 4, "epochs": 4, "lr": 0.001, "width": 1}, "discard", 0.4))
    order = []
    while (proposal := planner.propose(ledger)) is not None and len(order) < 4:
        order.append((proposal.knob, proposal.step))
        ledger.append(row(len(ledger) + 1, proposal.config, "discard", 0.0))
    assert order == [("lr", 1), ("epochs", 1), ("data", 1), ("data", -1)]


def test_a_stride_respects_frozen_pinned_and_limited_knobs():
    planner = Planner(PRIORS)
    planner.apply_steer("freeze epochs")
    planner.apply_steer("data under 1.5")
    ledger = [row(1, PRIORS.baseline, "keep", 0.1)]
    # Only lr can move its believed way: one knob is not a stride, it is an ordinary move.
    proposal = planner.propose(ledger)
    assert proposal.knob == "lr" and proposal.config == {**PRIORS.baseline, "lr": 0.01}


def test_the_star_count_sweep_starts_without_the_workloads_libraries():
    # Issue 13: numpy and Pillow (the workload's), pydantic, asyncio and the SFT module were most
    # of the agent's start-up, before its first milestone; the runs import the workload's.
    script = (
        "import argparse, sys\n"
        "from pathlib import Path\n"
        "from goaltender.agents import sweep\n"
        "args = argparse.Namespace(task=None, nemo_rl=None, eval=None)\n"
        "task = sweep.choose_task(args, 'Train the star-count model to 98%, budget 3m', Path('.'))\n"
        "print(task.name, task.estimate_cost(task.baseline) > 0)\n"
        "heavy = ['numpy', 'PIL', 'pydantic', 'asyncio', 'goaltender.agents.sft_sweep']\n"
        "print(' '.join(m for m in heavy if m in sys.modules) or 'none')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["star_count True", "none"]


def test_the_star_count_task_is_the_workloads_own_knobs():
    from goaltender.agents.sweep_planner import star_count_task
    from goaltender.environments.star_count import workload

    task = star_count_task()
    assert task.baseline == workload.BASELINE
    assert task.space == {knob: sorted(values) for knob, values in workload.SEARCH_SPACE.items()}
    assert task.estimate_cost(task.baseline) == workload.estimate_cost(workload.BASELINE)


def test_a_cost_threshold_is_seconds_or_a_multiple_of_the_baseline():
    assert CostThreshold.parse("60") == CostThreshold(seconds=60)
    assert CostThreshold.parse(" 2X ") == CostThreshold(times=2)
    for bad in ("", "x", "-1", "0", "0x", "nan", "infx", "2xx", "1e999", "two"):
        with pytest.raises(ValueError):
            CostThreshold.parse(bad)
    relative = CostThreshold(times=2)
    assert relative.limit(None) is None  # no baseline yet: the baseline itself is never asked about
    assert relative.limit(0.5) == 1.0
    assert relative.covering(1.5, 0.5) == CostThreshold(times=3.75)  # 1.25 times what was approved
    assert CostThreshold(seconds=60).covering(100, 0.5) == CostThreshold(seconds=125)
    assert (str(relative), relative.said(), CostThreshold(seconds=60).said()) == (
        "2×",
        "2× the baseline's time",
        "60s",
    )


@given(st.text(max_size=12))
def test_any_cost_threshold_text_is_a_positive_threshold_or_a_value_error(text):
    try:
        threshold = CostThreshold.parse(text)
    except ValueError:
        return
    value = threshold.seconds if threshold.times is None else threshold.times
    assert value is not None and math.isfinite(value) and value > 0
