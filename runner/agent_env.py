"""What agents and experiments find in their environment: their goal's own caches, the shared hub
cache, the GOALTENDER_* variables that lead them back to the runner (to their goal's socket), and
a PATH that finds the runner's own `python` and `goaltender` first. Which GPUs an experiment gets
is the box's fair queue's word (runner/slots.py).

Every cache variable points into the goal's own cache directory, whatever the box or the agent
says: what one goal leaves in a cache another would load and run (a pickle, a wheel, a kernel).
The hub cache (models, data sets) is the exception, being large: shared, read-only to goals, and
written only by `goaltender fetch`, which the runner runs for them. What a request's environment
says never changes where anything is mounted (runner/sandbox.py decides that from the goal alone).
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from pathlib import Path

from goaltender.runner.config import RunnerSettings
from goaltender.runner.secrets import agent_safe
from goaltender.storage.records import Experiment, Goal

# Each cache variable's directory inside the goal's cache (RunnerSettings.goal_cache).
CACHE_DIRS = {
    "XDG_CACHE_HOME": "xdg",
    "HF_HOME": "huggingface",  # its hub part is HF_HUB_CACHE, the shared one
    "TORCH_HOME": "torch",
    "TRITON_CACHE_DIR": "triton",
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "RAY_TMPDIR": "ray",
    "MPLCONFIGDIR": "matplotlib",
    "CUDA_CACHE_PATH": "cuda",  # else ~/.nv, read-only in the sandbox
    "GOALTENDER_CACHE_DIR": "goaltender",
}


def cache_routing(settings: RunnerSettings, goal_id: int) -> dict[str, Path]:
    """Where each cache variable points for a goal: into its own cache; HF_HUB_CACHE at the shared
    hub cache. Nothing is created (`goaltender doctor` reads it too)."""
    own = settings.goal_cache(goal_id)
    return {var: own / sub for var, sub in CACHE_DIRS.items()} | {"HF_HUB_CACHE": settings.hub_cache}


SANDBOX_SOCKET = Path("/run/goaltender/runner.sock")  # the goal's socket, as its sandbox shows it


def goal_socket(settings: RunnerSettings, goal_id: int) -> Path:
    """GOALTENDER_SOCKET for the goal's agent and experiments: the goal's own socket (never the
    operator socket), where they see it."""
    return SANDBOX_SOCKET if settings.sandbox == "bwrap" else settings.agent_socket(goal_id)


@functools.cache
def runner_bin_directories() -> tuple[str, ...]:
    """Where the runner's own `python` and `goaltender` are: the directory of its interpreter as it
    was invoked (not resolved: a venv's bin/python links to the base interpreter, beside which
    there is no goaltender) and the install's scripts directory (the console script's: a venv's
    bin, pipx's or uv tool's venv, the one a service's ExecStart names)."""
    found = [os.path.dirname(os.path.abspath(sys.executable))] if sys.executable else []
    found.append(sysconfig.get_path("scripts"))
    return tuple(dict.fromkeys(found))


def runner_first_path(path: str | None) -> str:
    """`path` (a PATH; None: unset) with the runner's own directories first, each once. A runner
    started without its venv activated (`.venv/bin/goaltender`, a service) still gives its agents
    and runs the `python` that imports goaltender and the `goaltender` verbs."""
    path = os.defpath if path is None else path
    rest = path.split(os.pathsep) if path else []  # "" would be the working directory
    return os.pathsep.join(dict.fromkeys([*runner_bin_directories(), *rest]))


def goal_environment(settings: RunnerSettings, goal: Goal) -> dict[str, str]:
    """The runner's own environment without its secrets (runner/secrets.py: all but the granted
    ones), its own interpreter's directories first on PATH, plus the goal's caches and its
    GOALTENDER_* variables."""
    env = agent_safe(os.environ, settings)
    env["PATH"] = runner_first_path(env.get("PATH"))
    for var, path in cache_routing(settings, goal.id).items():
        if var != "HF_HUB_CACHE":  # the box's, made by whoever fetches first
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        env[var] = str(path)
    env.update(
        GOALTENDER_SOCKET=str(goal_socket(settings, goal.id)),
        GOALTENDER_GOAL_ID=str(goal.id),
        GOALTENDER_WORKSPACE=goal.workspace,
        GOALTENDER_HOME=str(settings.home),
        PYTHONUNBUFFERED="1",
    )
    return env


def agent_environment(settings: RunnerSettings, goal: Goal, *, resumed: bool) -> dict[str, str]:
    """A goal's agent; GOALTENDER_RESUMED=1 tells it to pick up from the ledger and diary."""
    env = goal_environment(settings, goal)
    if resumed:
        env["GOALTENDER_RESUMED"] = "1"
    return env


def experiment_environment(
    settings: RunnerSettings, goal: Goal, experiment: Experiment, requested: dict[str, str]
) -> dict[str, str]:
    """An experiment (and its eval command): what the agent asked for, then where the run lives.
    What it asks for sets variables only: its sandbox is the goal's whatever they say."""
    return (
        goal_environment(settings, goal)
        | requested
        | {
            "GOALTENDER_EXPERIMENT_ID": str(experiment.id),
            "GOALTENDER_EXPERIMENT_DIR": str(Path(experiment.log_path).parent),
        }
    )
