"""`goaltender nemo-rl sft|grpo --config …`: a NeMo RL run as one supervised experiment.

The experiment's command is the launcher (`python -m goaltender.training.nemo_rl run …`), which
starts the trainer and reports on it. This module turns what the agent asked for into that command
and the ledger's words for it (params, description, headline metric), for the CLI, the built-in
agent's tool and the sweep's SFT mode alike. Paths are made absolute here, where the agent's working directory is known:
the trainer runs in the NeMo RL checkout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goaltender.training.checkpoints import Direction

RECIPES = {
    "sft": "examples/run_sft.py",
    "vlm-sft": "examples/run_vlm_sft.py",
    "grpo": "examples/run_grpo.py",
    "vlm-grpo": "examples/run_vlm_grpo.py",
}
CHECKOUT_VAR = "NEMO_RL_DIR"  # where the box's NeMo RL checkout is
TRAINER_VAR = "GOALTENDER_NEMO_RL_COMMAND"  # another trainer command than `uv run <script>`
LOWER_IS_BETTER = ("loss", "error", "perplexity", "ppl", "kl", "time")


class LaunchError(ValueError):
    """What the agent asked for cannot be run; the message says why and what to do."""


def add_recipe_parsers(cmd: argparse.ArgumentParser, more: Callable[[argparse.ArgumentParser], None]) -> None:
    """`goaltender nemo-rl RECIPE [options] -- overrides`: one parser per recipe, so that what
    follows the recipe can be options and then the overrides, as they are. `more` adds the options
    every agent verb takes (--goal)."""
    recipes = cmd.add_subparsers(dest="recipe", metavar="{" + ",".join(RECIPES) + "}", required=True)
    for recipe, script in RECIPES.items():
        one = recipes.add_parser(
            recipe, help=f"`uv run {script}` in the checkout", description=cmd.description
        )
        one.formatter_class = cmd.formatter_class
        one.add_argument("--config", required=True, help="the NeMo RL config (YAML)")
        one.add_argument("--checkout", help=f"the NeMo RL checkout (default: ${CHECKOUT_VAR})")
        one.add_argument("--script", help=f"another entry point in the checkout than {script}")
        one.add_argument(
            "--metric",
            help=f"headline metric, a TensorBoard tag (default: {default_metric(recipe)}); the best "
            "checkpoint is the best by it",
        )
        better = one.add_mutually_exclusive_group()
        better.add_argument("--minimize", action="store_true", help="lower is better (default for losses)")
        better.add_argument("--maximize", action="store_true", help="higher is better (default otherwise)")
        one.add_argument("-d", "--description", help="the hypothesis (default: recipe, config, overrides)")
        one.add_argument(
            "--eval",
            dest="eval_command",
            help="a command the runner runs after a clean run to score it on the held-out split (it "
            "finds the checkpoints in $GOALTENDER_EXPERIMENT_DIR); the ledger's headline is then "
            "what it prints, and --metric only picks the best checkpoint",
        )
        one.add_argument(
            "--eval-metric",
            help="the metric the --eval command prints, e.g. exact_accuracy (default: the goal's)",
        )
        one.add_argument("--timeout", help="per-run time limit, e.g. 6h (the goal's may be tighter)")
        one.add_argument(
            "--trainer",
            help=f"a command run instead of `uv run {script}` (default: ${TRAINER_VAR}); it gets "
            "--config and the overrides",
        )
        one.add_argument("overrides", nargs=argparse.REMAINDER, help="-- then NeMo RL overrides: key=value")
        more(one)


def default_metric(recipe: str) -> str:
    """What NeMo RL validates with: SFT the validation loss, GRPO the validation accuracy."""
    return "validation/val_loss" if "sft" in recipe else "validation/accuracy"


def default_direction(metric: str) -> Direction:
    last = metric.rsplit("/", 1)[-1].lower()
    return "minimize" if any(word in last for word in LOWER_IS_BETTER) else "maximize"


@dataclass(frozen=True)
class NemoRlRun:
    recipe: str
    config: Path
    overrides: list[str]
    metric: str
    direction: Direction
    checkout: Path | None = None
    script: str | None = None
    trainer: str | None = None
    eval_command: list[str] | None = None  # the runner scores the run with it
    eval_metric: str | None = None  # what the eval prints (None: the goal's metric)

    def headline(self) -> tuple[str | None, Direction | None]:
        """The ledger row's metric and direction. With an eval the runner measures the headline
        itself, in the goal's direction; without one it is the best checkpoint's value."""
        if self.eval_command:
            return self.eval_metric, None
        return self.metric, self.direction

    def command(self) -> list[str]:
        """The experiment's command: the launcher, told everything (it runs in the sandbox, with
        the agent's environment, but not its defaults)."""
        argv = [sys.executable, "-m", "goaltender.training.nemo_rl", "run", self.recipe]
        argv += ["--config", str(self.config), "--metric", self.metric, "--direction", self.direction]
        for flag, value in (
            ("--checkout", self.checkout),
            ("--script", self.script),
            ("--trainer", self.trainer),
        ):
            if value is not None:
                argv += [flag, str(value)]
        return [*argv, "--", *self.overrides]

    def params(self) -> dict[str, Any]:
        """The ledger's config column: the recipe, the config file and every override."""
        params: dict[str, Any] = {"recipe": self.recipe, "config": self.config.name}
        for override in self.overrides:
            key, _, value = override.partition("=")
            params[key.lstrip("+~")] = _param_value(value)
        return params

    def description(self) -> str:
        words = " ".join([f"NeMo RL {self.recipe} {self.config.name}", *self.overrides])
        return words if len(words) <= 2000 else words[:1999] + "…"


def plan(
    recipe: str,
    config: str,
    overrides: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    checkout: str | None = None,
    script: str | None = None,
    trainer: str | None = None,
    metric: str | None = None,
    direction: Direction | None = None,
    eval_command: str | list[str] | None = None,
    eval_metric: str | None = None,
) -> NemoRlRun:
    """The run the agent asked for, its paths absolute; LaunchError when it cannot run."""
    if recipe not in RECIPES:
        raise LaunchError(f"unknown recipe {recipe!r}: use one of {', '.join(RECIPES)}")
    config_path = _existing_file(cwd, config, "--config")
    trainer = trainer or env.get(TRAINER_VAR) or None
    checkout_path = _checkout(cwd, checkout or env.get(CHECKOUT_VAR), script or RECIPES[recipe], trainer)
    if trainer is not None:
        _check_trainer(trainer)
    metric = metric or default_metric(recipe)
    return NemoRlRun(
        recipe=recipe,
        config=config_path,
        overrides=[_absolute_paths(_checked_override(o), cwd) for o in overrides],
        metric=metric,
        direction=direction or default_direction(metric),
        checkout=checkout_path,
        script=script,
        trainer=trainer,
        eval_command=_eval_argv(eval_command),
        eval_metric=eval_metric or None,
    )


def _existing_file(cwd: Path, path: str, what: str) -> Path:
    found = (cwd / path).resolve()
    if not found.is_file():
        raise LaunchError(f"{what}: no such file: {path}")
    return found


def _checkout(cwd: Path, checkout: str | None, script: str, trainer: str | None) -> Path | None:
    """The NeMo RL checkout (needed unless another trainer command is given)."""
    if checkout is None:
        if trainer is None:
            raise LaunchError(
                f"where is NeMo RL? pass --checkout DIR or set {CHECKOUT_VAR} (a clone of "
                "NVIDIA-NeMo/RL set up with `uv venv`)"
            )
        return None
    path = (cwd / checkout).resolve()
    if trainer is None and not (path / script).is_file():
        raise LaunchError(f"{path} is not a NeMo RL checkout: it has no {script}")
    return path


def _check_trainer(trainer: str) -> None:
    try:
        words = shlex.split(trainer)
    except ValueError as exc:
        raise LaunchError(f"--trainer: {exc}") from None
    if not words:
        raise LaunchError("--trainer is empty")


def _eval_argv(command: str | list[str] | None) -> list[str] | None:
    if not command:
        return None
    if isinstance(command, list):
        return command
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise LaunchError(f"--eval: {exc}") from None
    if not words:
        raise LaunchError("--eval is empty")
    return words


def _checked_override(override: str) -> str:
    """NeMo RL's overrides are Hydra's: key=value, +key=value (a new key), ~key (delete one)."""
    key = override.partition("=")[0].lstrip("+~")
    if not key or ("=" not in override and not override.startswith("~")):
        raise LaunchError(f"expected an override key=value after --, got {override[:60]!r}")
    return override


def _absolute_paths(override: str, cwd: Path) -> str:
    """`data.train.data_path=train.jsonl` names a file here, but the trainer runs in the checkout:
    a value that is an existing path relative to the agent's directory is made absolute."""
    key, sep, value = override.partition("=")
    if not sep or not value or os.path.isabs(value) or value.startswith(("$", "{")):
        return override
    path = cwd / value
    return f"{key}={path.resolve()}" if path.exists() else override


def _param_value(text: str) -> Any:
    """A number or boolean as JSON reads it (1e-5, true), anything else as written."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    number = isinstance(value, int | float) and math.isfinite(value)
    return value if isinstance(value, bool) or number else text
