"""A SweepTask whose gains all lie within noise: an accuracy on 64 examples that creeps up by a
point or two per knob step (tests put this folder on PYTHONPATH for the sweep agent)."""

import sys

from goaltender.agents.sweep_planner import SweepTask

#: Runs of x above ASKED_AFTER_X wait for the file ANSWERED in their working directory (the goal's
#: workspace): the low-signal prompt comes after the run of x = 3, and a test that answers it makes
#: the file once the answer is in the agent's inbox, so that the agent reads it before its budget
#: runs out (without, five quick runs could all end before the answer came).
ANSWERED = "answered"
ASKED_AFTER_X = 3


def command(config):
    accuracy = 0.5 + config["x"] / 100
    code = "import os, time\n"
    if config["x"] > ASKED_AFTER_X:
        code += f"while not os.path.exists({ANSWERED!r}): time.sleep(0.01)\n"
    code += (
        f"print('accuracy: {accuracy}'); print('n: 64'); print('seed:', os.environ.get('GOALTENDER_SEED'))"
    )
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
