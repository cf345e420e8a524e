"""A stand-in for the held-out eval of the star-count SFT sweep (its `--eval`): it scores the model
`goaltender.agents.sft_sweep.model_to_score` names in $GOALTENDER_EXPERIMENT_DIR, as a real eval
would, but reads the score instead of serving the model: a checkpoint's `fake_quality` (written by
tests/fake_nemo_rl_trainer.py), or BASE for the untrained base model.

Prints the summary lines the runner reads: exact_accuracy, mean_reward, n_heldout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from goaltender.agents.sft_sweep import model_to_score

BASE = 0.25  # the untrained model's held-out exact accuracy


def main() -> int:
    model = model_to_score(Path(os.environ["GOALTENDER_EXPERIMENT_DIR"]))
    checkpoint = Path(model)
    accuracy = float((checkpoint / "fake_quality").read_text()) if checkpoint.is_dir() else BASE
    print(f"scoring {model} on the 64 held-out examples")
    print(f"exact_accuracy: {accuracy}")
    print(f"mean_reward: {round((1 + 2 * accuracy) / 3, 4)}")  # partial credit runs above exact
    print("n_heldout: 64")
    return 0


if __name__ == "__main__":
    sys.exit(main())
