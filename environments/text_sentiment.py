"""A second sweep workload: sentiment of short synthetic reviews, hashed n-grams, logistic regression.

Star count rewards more of everything; this one does not in the same way. A review is a few
clauses ("the plot was not very good", "acting felt great"); a negation flips its clause, so
unigrams cannot read it and accuracy stalls near 0.8 whatever else grows, while bigrams and
trigrams ("not very good") can; few hash buckets make n-grams collide; a too-large step oscillates.

    python -m goaltender.environments.text_sentiment --train-size 1000 --ngrams 2 --buckets 4096 \\
        --epochs 10 --lr 0.03 [--seed 0]

Prints a few JSON progress lines ``{"step": 3, "train_loss": 0.41}`` then ``key: value`` lines
(``accuracy`` on a fixed 1,000-review held-out split, ``train_seconds`` …), like star count's
workload, so the runner and the sweep agent treat it the same way:

    python -m goaltender.agents.sweep --task goaltender.environments.text_sentiment:task
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from goaltender.agents.sweep_planner import SweepTask

POSITIVE = ["good", "great", "fine", "lovely", "superb", "solid", "fun", "moving", "sharp", "warm"]
NEGATIVE = ["bad", "awful", "dull", "weak", "poor", "clumsy", "flat", "tedious", "messy", "cold"]
SUBJECTS = ["the plot", "the acting", "the music", "the ending", "the pacing", "the cast", "the script"]
VERBS = ["was", "felt", "seemed", "is", "looked"]
NEGATORS = ["not", "never", "hardly"]
HELDOUT_SIZE = 1000
HELDOUT_SEED = 10**6  # held-out reviews are drawn from seeds no training set reaches

SEARCH_SPACE: dict[str, list[Any]] = {
    "train_size": [250, 500, 1000, 2000, 4000],
    "ngrams": [1, 2, 3],
    "buckets": [256, 1024, 4096, 16384],
    "epochs": [2, 5, 10, 20, 40],
    "lr": [0.001, 0.003, 0.01, 0.03, 0.1],
}
BASELINE = {knob: values[0] for knob, values in SEARCH_SPACE.items()}
#: The direction each knob is believed to help in (the planner's prior), and why.
EXPECT = {"train_size": 1, "ngrams": 1, "buckets": 1, "epochs": 1, "lr": 1}
HYPOTHESES = {
    ("train_size", 1): "more reviews cut the held-out error",
    ("ngrams", 1): "longer n-grams can read a negation ('not good')",
    ("buckets", 1): "more hash buckets mean fewer colliding n-grams",
    ("epochs", 1): "more passes: the loss has not flattened yet",
    ("lr", 1): "a larger step converges within the same passes",
    ("lr", -1): "a smaller step may stop the loss from oscillating",
}
ALIASES = {
    "data": "train_size",
    "n-grams": "ngrams",
    "hash size": "buckets",
    "passes": "epochs",
    "learning rate": "lr",
}

_COST_FIXED = 0.3  # interpreter start and numpy (calibrated on a 2-core Xeon @ 2.6 GHz)
_COST_PER_DOC = 1.5e-5  # generating and hashing one review (per n-gram order)
_COST_PER_TOKEN_PASS = 6e-8  # one n-gram through one epoch's forward and backward pass
_COST_PER_BATCH = 5e-5  # numpy call overhead per minibatch
_TOKENS = 12  # words in a review, roughly
_BATCH = 64


def review(seed: int) -> tuple[str, int]:
    """One review and its label (1 positive): clauses whose polarity, after negation, mostly agree."""
    draw = random.Random(seed)
    clauses, total = [], 0
    for _ in range(draw.choice([1, 3, 3, 5])):
        polarity = draw.choice([1, -1])
        word = draw.choice(POSITIVE if polarity > 0 else NEGATIVE)
        parts = [draw.choice(SUBJECTS), draw.choice(VERBS)]
        if draw.random() < 0.4:
            parts.append(draw.choice(NEGATORS))
            polarity = -polarity
            if draw.random() < 0.5:
                parts.append("very")
        elif draw.random() < 0.3:
            parts.append("very")
        clauses.append(" ".join([*parts, word]))
        total += polarity
    return ", and ".join(clauses), int(total > 0)


def features(text: str, ngrams: int, buckets: int) -> list[int]:
    """Hashed 1..ngrams-grams of the words (crc32: the same buckets in every process)."""
    words = text.replace(",", "").split()
    out = []
    for n in range(1, ngrams + 1):
        for i in range(len(words) - n + 1):
            out.append(zlib.crc32(" ".join(words[i : i + n]).encode()) % buckets)
    return out


def encode(seeds: Sequence[int], ngrams: int, buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat bucket indices, each review's offset into them, labels)."""
    indices: list[int] = []
    offsets, labels = [], []
    for seed in seeds:
        text, label = review(seed)
        offsets.append(len(indices))
        indices += features(text, ngrams, buckets)
        labels.append(label)
    return np.array(indices, dtype=np.int64), np.array(offsets, dtype=np.int64), np.array(labels, np.float32)


def _logits(w: np.ndarray, bias: float, idx: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return np.add.reduceat(w[idx], offsets) + bias


def estimate_cost(config: dict[str, Any]) -> float:
    """Rough seconds for one run on a 2-core CPU (relative cost for a planner)."""
    cfg = {**BASELINE, **config}
    grams = _TOKENS * cfg["ngrams"]
    docs = cfg["train_size"] + HELDOUT_SIZE
    passes = cfg["train_size"] * cfg["epochs"] * grams
    batches = -(-cfg["train_size"] // _BATCH) * cfg["epochs"]
    return round(
        _COST_FIXED
        + _COST_PER_DOC * docs * cfg["ngrams"]
        + _COST_PER_TOKEN_PASS * passes
        + _COST_PER_BATCH * batches,
        3,
    )


def run(config: dict[str, Any], emit: Any = print) -> dict[str, Any]:
    """Train once (Adam on the logistic loss, minibatches of 64) and score the held-out split."""
    cfg = {**BASELINE, "seed": 0, **config}
    ngrams, buckets = int(cfg["ngrams"]), int(cfg["buckets"])
    t0 = time.perf_counter()
    idx, offsets, y = encode(range(cfg["train_size"]), ngrams, buckets)
    held_idx, held_offsets, held_y = encode(range(HELDOUT_SEED, HELDOUT_SEED + HELDOUT_SIZE), ngrams, buckets)
    ends = np.append(offsets[1:], len(idx))
    w, bias = np.zeros(buckets, dtype=np.float32), 0.0
    m, v = np.zeros_like(w), np.zeros_like(w)
    mb = vb = 0.0
    t, loss = 0, float("nan")
    shuffle = np.random.RandomState(cfg["seed"])
    t_train = time.perf_counter()
    for epoch in range(1, cfg["epochs"] + 1):
        total = 0.0
        for batch in np.array_split(shuffle.permutation(len(y)), max(1, -(-len(y) // _BATCH))):
            starts, stops = offsets[batch], ends[batch]
            lengths = stops - starts
            rows = np.repeat(np.arange(len(batch)), lengths)
            take = np.concatenate([idx[a:b] for a, b in zip(starts, stops, strict=True)])
            p = 1 / (1 + np.exp(-(np.bincount(rows, weights=w[take], minlength=len(batch)) + bias)))
            error = (p - y[batch]) / len(batch)
            total += float(-np.sum(y[batch] * np.log(p + 1e-7) + (1 - y[batch]) * np.log(1 - p + 1e-7)))
            grad = np.bincount(take, weights=error[rows], minlength=buckets).astype(np.float32)
            t += 1
            step = cfg["lr"] * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad * grad
            w -= step * m / (np.sqrt(v) + 1e-8)
            gb = float(error.sum())
            mb, vb = 0.9 * mb + 0.1 * gb, 0.999 * vb + 0.001 * gb * gb
            bias -= step * mb / (np.sqrt(vb) + 1e-8)
        loss = total / len(y)
        emit(json.dumps({"step": epoch, "train_loss": round(loss, 6)}))
    train_seconds = time.perf_counter() - t_train
    predicted = _logits(w, bias, held_idx, held_offsets) > 0
    return {
        "accuracy": round(float(np.mean(predicted == (held_y > 0.5))), 4),
        "train_loss": round(loss, 6),
        "train_seconds": round(train_seconds, 3),
        "total_seconds": round(time.perf_counter() - t0, 3),
        **{k: cfg[k] for k in (*SEARCH_SPACE, "seed")},
        "n_heldout": HELDOUT_SIZE,
    }


def task() -> SweepTask:
    """The sweep agent's view of this workload (`--task goaltender.environments.text_sentiment:task`)."""
    from goaltender.agents.sweep_planner import SweepTask, module_command

    return SweepTask(
        name="text_sentiment",
        metric="accuracy",
        space=SEARCH_SPACE,
        baseline=BASELINE,
        command=module_command(__name__),
        estimate_cost=estimate_cost,
        reasons=HYPOTHESES,
        aliases=ALIASES,
        expect=EXPECT,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    for knob, values in SEARCH_SPACE.items():
        parser.add_argument(f"--{knob.replace('_', '-')}", type=type(values[0]), default=BASELINE[knob])
    # `goaltender experiment --repeat N` runs seeds 0..N-1 through GOALTENDER_SEED.
    parser.add_argument("--seed", type=int, default=int(os.environ.get("GOALTENDER_SEED", "0")))
    args = parser.parse_args(argv)
    config = vars(args)
    for knob in ("train_size", "ngrams", "buckets", "epochs"):
        if config[knob] < 1:
            parser.error(f"--{knob.replace('_', '-')} must be >= 1")
    if config["lr"] <= 0:
        parser.error("--lr must be > 0")
    summary = run(config, emit=lambda line: print(line, flush=True))
    summary["estimated_seconds"] = estimate_cost(config)
    for key, value in summary.items():
        print(f"{key}: {value}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
