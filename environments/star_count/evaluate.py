"""Score a trained star-count model on the fixed 64-example held-out split, independently of the
run that trained it. The runner runs this itself after an experiment (its `eval_command`), so the
headline number is one the runner measured, not one the experiment reported.

    python -m goaltender.environments.star_count.evaluate [--model PATH]

Prints `exact_accuracy: …`, `mean_reward: …`, `n_heldout: 64`.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

import numpy as np

from .generate import DEFAULT_CONFIG, HELDOUT_SIZE, heldout_split
from .verify import score
from .workload import MODEL_FILE, _features, load_split, predictions_to_answers


def evaluate(model_path: Path) -> dict[str, float]:
    with model_path.open("rb") as f:
        saved = pickle.load(f)
    if saved.get("config") != DEFAULT_CONFIG.fingerprint():
        raise SystemExit(f"{model_path} was trained on another task config; refusing to score it")
    X_held, _ = load_split("heldout", HELDOUT_SIZE, saved["resolution"], DEFAULT_CONFIG, True)
    pred = np.nan_to_num(saved["model"].predict(_features(X_held)), nan=0.0, posinf=0.0, neginf=0.0)
    scores = score(heldout_split(DEFAULT_CONFIG), predictions_to_answers(pred, DEFAULT_CONFIG))
    return {
        "exact_accuracy": round(scores["exact_accuracy"], 4),
        "mean_reward": round(scores["mean_reward"], 4),
        "n_heldout": scores["n"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Path(os.environ.get("GOALTENDER_EXPERIMENT_DIR", ".")) / MODEL_FILE
    parser.add_argument("--model", type=Path, default=default, help=f"pickled model (default: {default})")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        parser.error(f"no model at {args.model}; run the workload with --save-model first")
    for key, value in evaluate(args.model).items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
