"""A stand-in for `uv run examples/run_sft.py` / `run_grpo.py` that leaves NeMo RL's real layouts.

Called as NeMo RL's entry points are (`--config FILE key=value …`), it trains nothing, quickly, but
writes what the real one writes where it writes it:
- TensorBoard event files under <logger.log_dir>/exp_001/tensorboard/ (tensorboard's own
  EventFileWriter, scalars as torch's SummaryWriter.add_scalar writes them: simple_value), with
  NeMo RL's tag names (train/loss, timing/train/*, validation/*, ray/* GPU telemetry), and an
  hparams file in a subfolder as add_hparams leaves one;
- the per-step stdout blocks of nemo_rl/algorithms/sft.py and grpo.py;
- checkpoints as nemo_rl/utils/checkpoint.py does: tmp_step_N/ with training_info.json (the save
  state and `checkpointing.metric_name`'s value), config.yaml and policy/ files, renamed to step_N/
  when complete, the ones outside keep_top_k deleted.

Validation is best at `fake.best_step` (val_loss lowest for SFT, accuracy 0.969 for GRPO).
Each checkpoint also holds `fake_quality`: the held-out exact accuracy a fake eval reads back
(tests/fake_star_count_eval.py), from the steps so far, the learning rate, the training rows and
LoRA (`quality()`); `fake.quality` pins it.
`fake.hold_at=N fake.release_file=PATH` waits after step N until PATH exists (a test looks at the
series meanwhile); `fake.exit_code` ends it with that code; `fake.leave_behind=PATH` leaves a
process behind that holds its stdout (as a dataloader worker or a Ray daemon may), its pid in PATH.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter

HOLD_LIMIT_S = 120.0  # a test that never releases the hold fails instead of hanging


def load_config() -> tuple[str, dict[str, Any]]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args, overrides = parser.parse_known_args()
    config = yaml.safe_load(Path(args.config).read_text()) or {}
    print(f"Loaded configuration from: {args.config}")
    print(f"Overrides: {overrides}")
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return args.config, config


class Logger:
    """NeMo RL's Logger with only TensorBoard on: <log_dir>/exp_NNN/tensorboard/."""

    def __init__(self, config: dict[str, Any]):
        base = Path(config["logger"]["log_dir"])
        self.log_dir = base / "exp_001"
        print(f"📊 Using log directory: {self.log_dir}")
        self.writer = None
        if config["logger"].get("tensorboard_enabled"):
            self.writer = EventFileWriter(
                str(self.log_dir / "tensorboard"), max_queue_size=10, flush_secs=120
            )
            self._hparams(config)

    def _hparams(self, config: dict[str, Any]) -> None:
        # torch's add_hparams writes to a new subfolder: no scalars there, only the hparams plugin.
        writer = EventFileWriter(str(self.log_dir / "tensorboard" / f"{time.time():.6f}"))
        metadata = SummaryMetadata(
            plugin_data=SummaryMetadata.PluginData(plugin_name="hparams", content=b"\x10\x01")
        )
        value = Summary.Value(tag="_hparams_/experiment", metadata=metadata)
        writer.add_event(Event(wall_time=time.time(), summary=Summary(value=[value])))
        writer.close()

    def log_metrics(self, metrics: dict[str, float], step: int, prefix: str) -> None:
        if self.writer is None:
            return
        values = [
            Summary.Value(tag=f"{prefix}/{name}", simple_value=value) for name, value in metrics.items()
        ]
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()


class Checkpointer:
    """nemo_rl/utils/checkpoint.py's layout and keep_top_k."""

    def __init__(self, config: dict[str, Any]):
        self.cfg = config["checkpointing"]
        self.dir = Path(self.cfg["checkpoint_dir"])
        print(f"📊 Using checkpoint directory: {self.dir}")

    def save(self, step: int, info: dict[str, Any], config: dict[str, Any]) -> None:
        print(f"Saving checkpoint for step {step}...")
        tmp = self.dir / f"tmp_step_{step}"
        (tmp / "policy" / "weights").mkdir(parents=True)
        (tmp / "policy" / "tokenizer").mkdir(parents=True)
        (tmp / "training_info.json").write_text(json.dumps(info))
        (tmp / "fake_quality").write_text(f"{quality(config, step)}\n")
        (tmp / "config.yaml").write_text(yaml.safe_dump(config))
        (tmp / "policy" / "weights" / "model.safetensors").write_bytes(b"\0" * 64)
        (tmp / "train_dataloader.pt").write_bytes(b"\0" * 16)
        os.rename(tmp, self.dir / f"step_{step}")
        self._keep_top_k()

    def _keep_top_k(self) -> None:
        top_k, metric = self.cfg.get("keep_top_k"), self.cfg.get("metric_name")
        if top_k is None:
            return
        history = []
        for path in self.dir.glob("step_*"):
            info = json.loads((path / "training_info.json").read_text())
            history.append((int(path.name[5:]), path, info))
        latest = max(step for step, _, _ in history)
        if metric is None:
            history.sort(key=lambda c: c[0], reverse=True)
        elif self.cfg.get("higher_is_better"):
            history.sort(key=lambda c: (c[2].get(metric, -math.inf), c[0]), reverse=True)
        else:
            history.sort(key=lambda c: (c[2].get(metric, math.inf), -c[0]))
        for step, path, _ in history[top_k:]:
            if step != latest:
                print(f"Removing checkpoint {path} due to being outside top-{top_k}")
                shutil.rmtree(path)


def quality(config: dict[str, Any], step: int) -> float:
    """The checkpoint's held-out exact accuracy, as a fake eval reports it: 0.25 untrained, rising
    with steps x learning rate, a little faster with more rows, a little slower with LoRA."""
    if "quality" in config.get("fake", {}):
        return float(config["fake"]["quality"])
    lr = float(config.get("policy", {}).get("optimizer", {}).get("kwargs", {}).get("lr", 2e-5))
    rows = train_rows(config)
    lora = config.get("policy", {}).get("dtensor_cfg", {}).get("lora_cfg", {}).get("enabled")
    progress = step * lr / 2e-3 * math.sqrt(rows / 2048) * (0.8 if lora else 1.0)
    return round(0.25 + 0.74 * (1 - math.exp(-progress)), 4)


def train_rows(config: dict[str, Any]) -> int:
    path = Path(str(config.get("data", {}).get("train", {}).get("data_path", "")))
    if not path.is_file():
        return 2048
    with path.open("rb") as rows:
        return sum(1 for _ in rows)


def curves(algorithm: str, step: int, best: int, val_period: int) -> tuple[dict, dict]:
    """(train metrics, validation metrics) at `step`: validation best at `best`."""
    distance = abs(step - best) / val_period
    if algorithm == "sft":
        train = {"loss": round(2.0 * 0.95**step + 0.1, 4), "grad_norm": 1.5, "lr": 5e-6}
        validation = {"val_loss": round(0.3 + 0.01 * distance**2, 4)}
    else:
        train = {"loss": round(0.05 * 0.97**step, 4), "reward": round(0.5 + 0.4 * (1 - 0.95**step), 4)}
        train["gen_kl_error"] = 0.001
        validation = {"accuracy": round(0.969 - 0.004 * distance, 4), "avg_length": 187.2}
    return train, validation


def print_training(algorithm: str, train: dict[str, float], timing: dict[str, float]) -> None:
    print("\n📊 Training Results:")
    print(f"  • Loss: {train['loss']:.4f}")
    if algorithm == "grpo":
        print(f"  • Generation KL Error: {train['gen_kl_error']:.4f}")
        print(f"  • Avg Reward: {train['reward']:.4f}")
    print("\n⏱️  Timing:")
    print(f"  • Total step time: {timing['total_step_time']:.2f}s")
    for name, seconds in timing.items():
        if name != "total_step_time":
            print(f"  • {name}: {seconds:.2f}s ({100 * seconds / timing['total_step_time']:.1f}%)")


def print_validation(algorithm: str, validation: dict[str, float]) -> None:
    print("\n📊 Validation Results:")
    if algorithm == "sft":
        print(f"    • Validation loss: {validation['val_loss']:.4f}")
    else:
        print(f"    • Accuracy: {validation['accuracy']:.4f}")
        print(f"    • Average response length: {validation['avg_length']:.1f} tokens")
    print("\n  ⏱️  Validation Timing:")
    print("    • Total validation time: 1.50s")


def save_state(algorithm: str, step: int, metric: str | None, val: dict, train: dict) -> dict:
    if algorithm == "sft":
        info: dict[str, Any] = {"epoch": 0, "step": step, "total_steps": step}
        info |= {"consumed_samples": step * 32, "total_valid_tokens": step * 4096}
    else:
        info = {"consumed_samples": step * 32, "current_step": step, "current_epoch": 0}
        info |= {"total_steps": step, "total_valid_tokens": step * 4096, "val_reward": val.get("accuracy")}
    if metric is not None:
        source, name = metric.split(":", 1)
        values = train if source == "train" else val
        if name in values:  # no validation at this step: NeMo RL leaves the metric out
            info[metric] = values[name]
    return info


def hold(fake: dict[str, Any]) -> None:
    release = Path(fake["release_file"])
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not release.exists():
        if time.monotonic() > deadline:
            sys.exit(f"fake trainer: {release} never appeared")
        time.sleep(0.05)


def main() -> int:
    _, config = load_config()
    algorithm = "grpo" if "grpo" in config else "sft"
    cfg, fake = config[algorithm], config.get("fake", {})
    steps, val_period = cfg["max_num_steps"], cfg["val_period"]
    best = fake.get("best_step", steps // 2)
    logger, checkpointer = Logger(config), Checkpointer(config)
    ckpt = config["checkpointing"]
    if cfg.get("val_at_start"):
        print("\n🔍 Running initial validation...")
        _, validation = curves(algorithm, 0, best, val_period)
        print_validation(algorithm, validation)
        logger.log_metrics(validation, 0, "validation")
    print(f"\n{'=' * 25} Epoch 1/1 {'=' * 25}")
    for step in range(1, steps + 1):
        print(f"\n{'=' * 25} Step {step}/{steps} {'=' * 25}")
        print("▶ Preparing batch...\n▶ Taking a training step...")
        train, validation = curves(algorithm, step, best, val_period)
        timing = {"total_step_time": 3.21, "policy_training": 2.9, "data_processing": 0.2}
        validated = step % val_period == 0
        if validated:
            print(f"▶ Starting validation at step {step}...")
            print_validation(algorithm, validation)
            logger.log_metrics(validation, step, "validation")
            logger.log_metrics({"total_validation_time": 1.5}, step, "timing/validation")
        if ckpt.get("enabled") and (step % ckpt["save_period"] == 0 or step == steps):
            metric = ckpt.get("metric_name")
            validated_now = validation if validated else {}
            checkpointer.save(step, save_state(algorithm, step, metric, validated_now, train), config)
        print_training(algorithm, train, timing)
        logger.log_metrics(train, step, "train")
        logger.log_metrics(timing, step, "timing/train")
        logger.log_metrics({"node.0.gpu.0.util": 97.0}, step, "ray")
        logger.flush()
        sys.stdout.flush()
        if step == fake.get("hold_at"):
            hold(fake)
        time.sleep(fake.get("step_seconds", 0))
    print("Max number of steps has been reached, stopping training early", flush=True)
    if leave_behind := fake.get("leave_behind"):
        left = subprocess.Popen(["sleep", "600"], stdout=sys.stdout, stderr=subprocess.DEVNULL)
        Path(leave_behind).write_text(str(left.pid))
    return int(fake.get("exit_code", 0))


if __name__ == "__main__":
    sys.exit(main())
