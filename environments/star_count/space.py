"""The star-count workload's knobs: their values, the baseline, the planner's priors, the words
people use for them and a cost estimate. Standard library only: a planner (the sweep agent) reads
them without importing numpy and Pillow, a tenth of a second of its start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .generate import DEFAULT_CONFIG, HELDOUT_SIZE

#: Every knob with its candidate values. The FIRST value of each list is the naive starting
#: point (``BASELINE``); the remaining values follow in ascending order. Measured effects are in
#: the README: more data / iterations / a larger lr (up to 0.01) help, lr 0.03 diverges, and
#: resolution 8 hurts an under-trained model while 24-32 mostly just cost more.
SEARCH_SPACE: dict[str, list[Any]] = {
    "train_size": [1000, 2000, 4000, 8000],
    "hidden": [32, 64, 128, 256],
    "iters": [40, 80, 160, 320],
    "lr": [0.001, 0.003, 0.01, 0.03],
    "resolution": [16, 8, 24, 32],
}
BASELINE: dict[str, Any] = {knob: values[0] for knob, values in SEARCH_SPACE.items()}

#: Why a one-step move of a knob (up: +1, down: -1) might help: the hypothesis a planner states.
HYPOTHESES: dict[tuple[str, int], str] = {
    ("train_size", 1): "more canvases should cut the held-out error of an under-fed model",
    ("train_size", -1): "less data trains faster; check the metric holds",
    ("hidden", 1): "more hidden units give the model capacity to separate colours and counts",
    ("hidden", -1): "a smaller network may generalise better",
    ("iters", 1): "more epochs: the loss curve has not flattened yet",
    ("iters", -1): "fewer epochs may avoid overfitting",
    ("lr", 1): "a larger step size should converge within the same epochs",
    ("lr", -1): "a smaller step size may stabilise training",
    ("resolution", 1): "finer input keeps small stars apart",
    ("resolution", -1): "coarser input is cheaper and averages colour mass",
}

#: The way each knob is believed to raise accuracy: the planner's prior (HYPOTHESES says why).
EXPECT: dict[str, int] = {"train_size": 1, "hidden": 1, "iters": 1, "lr": 1, "resolution": 1}

#: What a run and its evaluation import before their own code does anything, in the order a run
#: needs them (a run that takes a standby still warming stops its imports): a box that runs star
#: count may have its standby interpreters import these while they wait (GOALTENDER_PRELOAD,
#: runner/standby.py; the demo does). None reads the environment on import but numpy, which takes
#: its BLAS threads from it: set OPENBLAS_NUM_THREADS in the runner's environment then, as the
#: workload's own default (set before it imports numpy) comes too late for a preloaded numpy.
PRELOAD = (
    # What a run and an evaluation import of the standard library besides numpy's: half of what
    # they have left to import with numpy warm (~15 ms of each).
    "argparse",
    "tempfile",
    "zipfile",  # numpy's .npz: the cached canvases, the saved model
    "numpy",
    *(
        f"goaltender.environments.star_count.{name}"
        for name in ("generate", "mlp", "prompt", "verify", "errors", "space")
    ),
    "numpy.random",  # a run's weights start random; the evaluation's never do
    "PIL.Image",  # the evaluation's gallery; a run renders only canvases its cache lacks
    "PIL.ImageDraw",
    "PIL.ImageFont",
    "PIL.PngImagePlugin",
)

#: Words people use in steering messages, mapped to knobs.
ALIASES: dict[str, str] = {
    "data": "train_size",
    "training set": "train_size",
    "train size": "train_size",
    "capacity": "hidden",
    "width": "hidden",
    "hidden size": "hidden",
    "epochs": "iters",
    "iterations": "iters",
    "learning rate": "lr",
    "res": "resolution",
}

# estimate_cost() calibration: measured on a 2-core Xeon @ 2.6 GHz (see the README table).
_COST_FIXED = 0.8  # two start-ups (the run and the runner's evaluation), held-out split, scoring
_COST_PER_RENDER = 3.6e-4  # render + downsample + cache one image (cold cache only)
_COST_PER_MAC = 3.0e-11  # one multiply-accumulate of training (forward + backward)
_COST_PER_BATCH = 3.0e-4  # Python/Adam overhead per minibatch
BATCH_SIZE = 200


@dataclass(frozen=True)
class WorkloadConfig:
    train_size: int = BASELINE["train_size"]
    hidden: int = BASELINE["hidden"]
    iters: int = BASELINE["iters"]
    lr: float = BASELINE["lr"]
    resolution: int = BASELINE["resolution"]
    seed: int = 0


def as_config(config: WorkloadConfig | dict[str, Any] | None) -> WorkloadConfig:
    if config is None:
        return WorkloadConfig()
    if isinstance(config, WorkloadConfig):
        return config
    known = {k: v for k, v in config.items() if k in WorkloadConfig.__dataclass_fields__}
    return WorkloadConfig(**{**BASELINE, **known})


def estimate_cost(config: WorkloadConfig | dict[str, Any], cached: bool = False) -> float:
    """Rough wall-clock seconds for one run on a 2-core CPU (relative cost for a planner).

    One hidden layer over ``resolution**2 * 3`` inputs: an epoch costs about
    ``3 * train_size * hidden * (resolution**2 * 3 + colours)`` multiply-accumulates (forward +
    backward), plus a per-minibatch overhead. ``cached=False`` (the default, conservative) adds
    rendering every image, as on a cold cache.
    """
    cfg = as_config(config)
    n_colours = len(DEFAULT_CONFIG.colours)
    macs = 3 * cfg.train_size * cfg.iters * cfg.hidden * (cfg.resolution**2 * 3 + n_colours)
    batches = -(-cfg.train_size // BATCH_SIZE) * cfg.iters
    render_s = 0.0 if cached else _COST_PER_RENDER * (cfg.train_size + HELDOUT_SIZE)
    return round(_COST_FIXED + render_s + _COST_PER_MAC * macs + _COST_PER_BATCH * batches, 2)
