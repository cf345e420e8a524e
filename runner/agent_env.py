"""What agents and experiments find in their environment: caches routed under the runner's home,
and the GOALTENDER_* variables that lead them back to the runner (to their goal's socket). Which GPUs
an experiment gets is the box's fair queue's word (runner/slots.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from goaltender.runner.config import RunnerSettings
from goaltender.runner.secrets import agent_safe
from goaltender.storage.records import Experiment, Goal

# Caches and temp files go under the runner's home (the big disk), unless the box already says where.
CACHE_DIRS = {
    "XDG_CACHE_HOME": "xdg",
    "HF_HOME": "huggingface",
    "TORCH_HOME": "torch",
    "TRITON_CACHE_DIR": "triton",
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "RAY_TMPDIR": "ray",
    "MPLCONFIGDIR": "matplotlib",
    "CUDA_CACHE_PATH": "cuda",  # else ~/.nv, read-only in the sandbox
    "GOALTENDER_CACHE_DIR": "goaltender",
}


def cache_routing(settings: RunnerSettings, env: Mapping[str, str]) -> dict[str, Path]:
    """Where each cache variable points for a goal: where the box (`env`) says, else under the
    runner's cache directory. Nothing is created (`goaltender doctor` reads it too)."""
    return {
        var: Path(env[var]) if var in env else settings.cache_dir / sub for var, sub in CACHE_DIRS.items()
    }


SANDBOX_SOCKET = Path("/run/goaltender/runner.sock")  # the goal's socket, as its sandbox shows it


def goal_socket(settings: RunnerSettings, goal_id: int) -> Path:
    """GOALTENDER_SOCKET for the goal's agent and experiments: the goal's own socket (never the
    operator socket), where they see it."""
    return SANDBOX_SOCKET if settings.sandbox == "bwrap" else settings.agent_socket(goal_id)


def goal_environment(settings: RunnerSettings, goal: Goal) -> dict[str, str]:
    """The runner's own environment without its secrets (runner/secrets.py: all but the granted
    ones), plus cache routing and the goal's GOALTENDER_* variables."""
    env = agent_safe(os.environ, settings)
    for var, path in cache_routing(settings, env).items():
        if var not in env:
            path.mkdir(parents=True, exist_ok=True)
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
    """An experiment (and its eval command): what the agent asked for, then where the run lives."""
    return (
        goal_environment(settings, goal)
        | requested
        | {
            "GOALTENDER_EXPERIMENT_ID": str(experiment.id),
            "GOALTENDER_EXPERIMENT_DIR": str(Path(experiment.log_path).parent),
        }
    )
