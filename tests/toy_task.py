"""A tiny SweepTask for tests: each run sleeps a little and prints a score computed from its knobs."""

import sys

from goaltender.agents.sweep_planner import SweepTask

SLEEP_S = 1.0


def score(config):
    return round(10 - (config["x"] - 4) ** 2 - (config["y"] - 2) ** 2, 3)


def command(config):
    code = f"import time; time.sleep({SLEEP_S}); print('score: {score(config)}')"
    return [sys.executable, "-c", code]


TASK = SweepTask(
    name="toy",
    metric="score",
    space={"x": [1, 2, 3, 4, 5], "y": [1, 2, 3]},
    baseline={"x": 1, "y": 1},
    command=command,
    estimate_cost=lambda config: SLEEP_S * config["x"],
    reasons={("x", 1): "bigger x scores higher so far"},
    aliases={"ex": "x"},
)


# The sweep agent driving this task (tests put this folder on PYTHONPATH for it).
AGENT = [sys.executable, "-m", "goaltender.agents.sweep", "--task", "toy_task:TASK", "--approve-above", "100"]
