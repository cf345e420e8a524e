"""The sweep agent's SFT mode: Qwen3-VL-2B learns star count with NeMo RL (the reference campaign).

The baseline is the base model, untrained, scored on the fixed 64-example held-out split. Then
SFT runs, each what `goaltender nemo-rl vlm-sft --config <overlay> -- overrides` runs (the same
request, built by training/launch.py), one knob moved per experiment from the best trained config:

    steps       160, 320            sft.max_num_steps
    lr          1e-5, 2e-5, 5e-5    policy.optimizer.kwargs.lr
    train_size  2048, 4096          the exported shape 2048/256 or 4096/512 (data.*.data_path)
    lora_rank   0 (full), 16, 64    policy.dtensor_cfg.lora_cfg.enabled / .dim (DTensor v2 LoRA,
                                    in NeMo RL v0.7.0's sft.yaml; alpha stays at its 32)

The headline is held-out exact accuracy, measured by the runner after every run with the eval
command the sweep is given (`--eval CMD` or GOALTENDER_SFT_EVAL). That command scores the model
`python -m goaltender.agents.sft_sweep model-to-score` names in $GOALTENDER_EXPERIMENT_DIR: the
base model for the baseline, else the run's best checkpoint (by validation loss, as the launcher
names it), and prints `exact_accuracy: …` (and `mean_reward: …`). Data is exported into the
workspace when a run first needs its shape, and checked with the token preflight first.

    python -m goaltender.agents.sft_sweep base-model MODEL     # the baseline's run: trains nothing
    python -m goaltender.agents.sft_sweep model-to-score [DIR]  # for eval commands
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from goaltender.agents.bootstrap import AgentFailure, Misconfigured
from goaltender.agents.sweep import asks_for_sft as asks_for_sft
from goaltender.agents.sweep_planner import SweepTask
from goaltender.environments import preflight
from goaltender.environments.star_count import export
from goaltender.training import launch
from goaltender.training.checkpoints import best_checkpoint, finished_checkpoints

MODEL = "Qwen/Qwen3-VL-2B-Instruct"
OVERLAY = Path(export.__file__).with_name("configs") / "sft_qwen3_vl_2b.yaml"
EVAL_VAR = "GOALTENDER_SFT_EVAL"
BASE_MODEL_FILE = "base_model"  # what the baseline's run leaves for the eval to score
CHECKPOINT_METRIC = "validation/val_loss"  # the overlay ranks checkpoints by val:val_loss

# Steps first: at 16 rows a step, 160 steps see 2,560 rows, barely more than one epoch of 2048, so
# more data pays only once the steps can reach it; LoRA last, a different kind of change.
SPACE: dict[str, list[Any]] = {
    "steps": [160, 320],
    "lr": [1e-5, 2e-5, 5e-5],
    "train_size": [2048, 4096],
    "lora_rank": [0, 16, 64],
}
FIRST_SFT = {"steps": 160, "lr": 2e-5, "train_size": 2048, "lora_rank": 0}
UNTRAINED = {"model": MODEL, "steps": 0}
VALIDATION_SIZE = dict(export.REFERENCE_SHAPES)  # train rows -> validation rows
SPLITS = export.SPLITS  # train, validation, heldout: one file each
REASONS = {
    ("steps", +1): "twice the steps, more epochs over the data; val loss still falling?",
    ("steps", -1): "half the steps: less overfitting if held-out accuracy fell with more",
    ("lr", +1): "a higher learning rate learns more within the same steps",
    ("lr", -1): "a lower learning rate: steadier, less forgetting of the base model",
    ("train_size", +1): "more distinct images to generalise from (validation 512)",
    ("train_size", -1): "the smaller shape, for comparison at these settings",
    ("lora_rank", +1): "LoRA instead of full fine-tuning, or a wider adapter: is a low-rank update enough?",
    ("lora_rank", -1): "a narrower adapter, or full fine-tuning again",
}
ALIASES = {
    "learning rate": "lr",
    "max steps": "steps",
    "data": "train_size",
    "rank": "lora_rank",
    "lora": "lora_rank",
}
# Rough guesses for a 2B VLM on one GPU, only for the approval threshold; the sweep scales them by
# how long the finished runs took.
STARTUP_S, STEP_S, EVAL_S = 300.0, 2.0, 600.0


def star_count_sft_task(
    workspace: Path, eval_command: str | None, checkout: str | None, env: Mapping[str, str]
) -> SweepTask:
    """The SFT sweep for this goal's workspace; Misconfigured when it cannot run here."""
    evaluate = _eval_argv(eval_command or env.get(EVAL_VAR))
    config = workspace_config(workspace, checkout or env.get(launch.CHECKOUT_VAR))

    def command(params: dict[str, Any]) -> list[str]:
        if params == UNTRAINED:
            return [sys.executable, "-m", "goaltender.agents.sft_sweep", "base-model", MODEL]
        return plan_run(workspace, config, params, checkout, env).command()

    plan_run(workspace, config, FIRST_SFT, checkout, env)  # a checkout or trainer that cannot run: now
    return SweepTask(
        name="star_count_sft",
        metric="exact_accuracy",
        space=SPACE,
        baseline=FIRST_SFT,
        command=command,
        estimate_cost=estimate_cost,
        reasons=REASONS,
        aliases=ALIASES,
        eval_command=evaluate,
        untrained=UNTRAINED,
        untrained_description=f"baseline: the base model ({MODEL}), untrained, on the held-out split",
        baseline_description="first SFT run: " + " ".join(f"{k}={v}" for k, v in FIRST_SFT.items()),
        plan_text=(
            "Baseline first: the base model, untrained. Then SFT with NeMo RL (vlm-sft, the "
            "Qwen3-VL-2B overlay), one knob at a time from the best trained config; every run "
            "scored on the 64 held-out examples by the runner."
        ),
        prepare=lambda params: prepare_data(workspace, params),
        approve_above_s=3600.0,
    )


def _eval_argv(command: str | None) -> list[str]:
    if not command:
        raise Misconfigured(
            f"the SFT sweep needs an eval command (--eval CMD or {EVAL_VAR}) that scores the model "
            "`python -m goaltender.agents.sft_sweep model-to-score` names on the held-out split and "
            "prints `exact_accuracy: <value>`"
        )
    try:
        return shlex.split(command)
    except ValueError as exc:
        raise Misconfigured(f"--eval: {exc}") from None


def workspace_config(workspace: Path, checkout: str | None) -> Path:
    """The overlay, copied into the workspace. NeMo RL resolves `defaults:` beside the config file,
    and the checkout is read-only in the sandbox: the copy names the checkout's sft_vlm_3B.yaml."""
    text = OVERLAY.read_text()
    if checkout:
        parent = Path(checkout).resolve() / "examples" / "configs" / "sft_vlm_3B.yaml"
        text = re.sub(r"(?m)^defaults: .*$", f"defaults: {parent}", text)
    path = workspace / OVERLAY.name
    path.write_text(text)
    return path


def plan_run(
    workspace: Path, config: Path, params: dict[str, Any], checkout: str | None, env: Mapping[str, str]
) -> launch.NemoRlRun:
    try:
        return launch.plan(
            "vlm-sft",
            str(config),
            overrides(workspace, params),
            cwd=workspace,
            env=env,
            checkout=checkout,
            metric=CHECKPOINT_METRIC,
        )
    except launch.LaunchError as exc:
        raise Misconfigured(f"NeMo RL cannot run: {exc}") from None


def data_dir(workspace: Path, train_size: int) -> Path:
    return workspace / f"star_count_sft_{train_size}"


def overrides(workspace: Path, params: dict[str, Any]) -> list[str]:
    """NeMo RL's words for one point of the search space."""
    data = data_dir(workspace, params["train_size"])
    rank = params["lora_rank"]
    lora = ["policy.dtensor_cfg.lora_cfg.enabled=false"]
    if rank:
        lora = ["policy.dtensor_cfg.lora_cfg.enabled=true", f"policy.dtensor_cfg.lora_cfg.dim={rank}"]
    return [
        f"sft.max_num_steps={params['steps']}",
        f"policy.optimizer.kwargs.lr={params['lr']:g}",
        f"data.train.data_path={data / 'train.jsonl'}",
        f"data.validation.data_path={data / 'validation.jsonl'}",
        *lora,
    ]


def estimate_cost(params: dict[str, Any]) -> float:
    if params.get("steps", 0) == 0:
        return EVAL_S
    return STARTUP_S + STEP_S * params["steps"] + EVAL_S


def prepare_data(workspace: Path, params: dict[str, Any]) -> tuple[str, str] | None:
    """Export the run's data shape once (train, validation and the fixed held-out 64), and refuse
    it when an example would reach the overlay's sequence limit (NeMo RL would mask it silently).
    Returns a milestone (title, text) when something was exported."""
    if "train_size" not in params:
        return None
    train = params["train_size"]
    directory = data_dir(workspace, train)
    if all((directory / f"{split}.jsonl").is_file() for split in SPLITS):
        return None  # each file is written whole (renamed into place), so these are complete
    written = export.export_splits(directory, train, VALIDATION_SIZE[train], fmt="sft")
    limit = sequence_limit()
    counter, note = preflight.make_counter(MODEL)
    lines = []
    for split in SPLITS:
        report = preflight.check_file(directory / f"{split}.jsonl", limit, counter)
        if report.over:
            raise AgentFailure(
                f"Preflight refused {split}.jsonl: {len(report.over)} examples reach {limit} tokens",
                f"NeMo RL would train on them with zero loss. Worst: {report.worst()}.",
            )
        lines.append(report.summary())
    sizes = "/".join(str(written[split]) for split in SPLITS)
    how = f"\n(counted with the estimate: {note})" if note else ""
    return f"Data: star-count SFT {sizes} in {directory.name}/", "Preflight:\n" + "\n".join(lines) + how


def sequence_limit() -> int:
    """The overlay's policy.max_total_sequence_length."""
    return int(yaml.safe_load(OVERLAY.read_text())["policy"]["max_total_sequence_length"])


# ---- what an eval command scores ----


def model_to_score(experiment_dir: Path) -> str:
    """The base model the baseline's run named, else the run's best checkpoint (by validation
    loss, as the launcher names it). ValueError when the run left neither."""
    base = experiment_dir / BASE_MODEL_FILE
    if base.is_file():
        return base.read_text().strip()
    best = best_checkpoint(
        finished_checkpoints(experiment_dir / "checkpoints"), CHECKPOINT_METRIC, "minimize", {}
    )
    if best is None:
        raise ValueError(f"{experiment_dir} holds no base-model note and no ranked checkpoint")
    return str(best.checkpoint.path)


def _experiment_dir(given: str | None) -> Path:
    return Path(given or os.environ.get("GOALTENDER_EXPERIMENT_DIR") or ".")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m goaltender.agents.sft_sweep")
    actions = parser.add_subparsers(dest="action", required=True)
    base = actions.add_parser("base-model", help="the baseline's run: note the model to score, train nothing")
    base.add_argument("model")
    base.add_argument("--dir", help="default: $GOALTENDER_EXPERIMENT_DIR")
    score = actions.add_parser("model-to-score", help="print the model an experiment's eval should score")
    score.add_argument("dir", nargs="?", help="default: $GOALTENDER_EXPERIMENT_DIR")
    args = parser.parse_args(argv)
    if args.action == "base-model":
        (_experiment_dir(args.dir) / BASE_MODEL_FILE).write_text(args.model + "\n")
        print(f"base model: {args.model} (no training; the eval scores it as it is)")
        return 0
    try:
        print(model_to_score(_experiment_dir(args.dir)))
    except ValueError as exc:
        print(f"model-to-score: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
