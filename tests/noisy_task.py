"""A SweepTask whose gains all lie within noise: an accuracy on 64 examples that creeps up by a
point or two per knob step (tests put this folder on PYTHONPATH for the sweep agent)."""

import sys

from goaltender.agents.sweep import SweepTask


def command(config):
    accuracy = 0.5 + config["x"] / 100
    code = f"import os; print('accuracy: {accuracy}'); print('n: 64'); print('seed:', os.environ.get('GOALTENDER_SEED'))"
    return [sys.executable, "-c", code]


TASK = SweepTask(
    name="noisy",
    metric="accuracy",
    space={"x": [1, 2, 3, 4, 5, 6]},
    baseline={"x": 1},
    command=command,
    estimate_cost=lambda config: 0.1,
)
AGENT = [
    sys.executable,
    "-m",
    "goaltender.agents.sweep",
    "--task",
    "noisy_task:TASK",
    "--approve-above",
    "100",
]
