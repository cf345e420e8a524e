"""Small CPU model workload for the star-count task (numpy and Pillow only).

Run as::

    python -m goaltender.environments.star_count.workload \\
        --train-size 2000 --hidden 64 --iters 60 --lr 0.003 --resolution 16 [--seed 0]

It renders (or loads from a cache) the training images and the fixed 64-example held-out split,
downsamples each image to ``resolution x resolution`` RGB with area averaging, and fits one
numpy MLP (``mlp.py``: one hidden ReLU layer of ``hidden`` units, Adam, ``lr``, ``iters`` epochs) that
maps RAW PIXELS to the count of every colour. No hand-made features: the network sees the
flattened pixels scaled to [0, 1], nothing else. Predictions are rounded and clipped to whole
counts, written out as answer text (``\\boxed{red: 3, green: 0, blue: 1}``) and scored by the
task verifier.

Stdout protocol (parsed by the runner): a handful of JSON progress lines
``{"step": 10, "train_loss": 0.123}``, then ``key: value`` summary lines, one per line
(``exact_accuracy``, ``mean_reward``, ``train_loss``, ``train_seconds``, ``train_size``,
``n_heldout`` and a few more).
"""

from __future__ import annotations

import os

# Keep BLAS from oversubscribing a small box; must run before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from .generate import (  # noqa: E402
    DEFAULT_CONFIG,
    HELDOUT_SIZE,
    Example,
    StarCountConfig,
    heldout_seeds,
    make_example,
    render,
    train_seeds,
)
from .mlp import MLP  # noqa: E402
from .prompt import format_answer  # noqa: E402

# The knobs live in space.py (no numpy: the planner reads them); callers know them from here too.
from .space import (  # noqa: E402, F401
    ALIASES,
    BASELINE,
    BATCH_SIZE,
    EXPECT,
    HYPOTHESES,
    SEARCH_SPACE,
    WorkloadConfig,
    as_config,
    estimate_cost,
)
from .verify import score  # noqa: E402

MODEL_FILE = "model.npz"

#: Bump when rendering or array layout changes, so stale caches are not reused.
CACHE_VERSION = 1

# ----------------------------------------------------------------------------- data + cache


def cache_dir() -> Path:
    """``$GOALTENDER_CACHE_DIR``, else ``$XDG_CACHE_HOME/goaltender``, else ``~/.cache/goaltender``."""
    if explicit := os.environ.get("GOALTENDER_CACHE_DIR"):
        return Path(explicit)
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "goaltender"
    return Path.home() / ".cache" / "goaltender"


def _prefix(kind: str, resolution: int, cfg: StarCountConfig) -> str:
    return f"star_count_v{CACHE_VERSION}_{cfg.fingerprint()}_{kind}_r{resolution}"


def images_to_arrays(
    examples: Sequence[Example], resolution: int, cfg: StarCountConfig = DEFAULT_CONFIG
) -> tuple[np.ndarray, np.ndarray]:
    """Render, downsample (area averaging) -> ``X`` uint8 ``[n, R, R, 3]``, ``Y`` int16 ``[n, colours]``."""
    from PIL import Image  # here, not at the top: a run on a warm cache renders nothing

    X = np.empty((len(examples), resolution, resolution, 3), dtype=np.uint8)
    for i, ex in enumerate(examples):
        img = render(ex)
        if img.size != (resolution, resolution):
            img = img.resize((resolution, resolution), Image.Resampling.BOX)
        X[i] = np.asarray(img, dtype=np.uint8)
    Y = np.array([[ex.counts[c] for c in cfg.colours] for ex in examples], dtype=np.int16)
    return X, Y.reshape(len(examples), len(cfg.colours))


def _atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, allow_pickle=False, **arrays)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _try_load(path: Path, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        with np.load(path) as data:
            X, Y = data["X"], data["Y"]
    except (OSError, KeyError, ValueError, EOFError):
        return None
    if len(X) < n or len(Y) < n:
        return None
    return X[:n], Y[:n]


def load_split(
    kind: str,
    n: int,
    resolution: int,
    cfg: StarCountConfig = DEFAULT_CONFIG,
    use_cache: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Arrays for ``kind`` = ``"train"`` (seeds ``0..n-1``) or ``"heldout"`` (the fixed split).

    Cached as npz under :func:`cache_dir`, keyed by config fingerprint, resolution and n. A cached
    training set with more examples is sliced (its first n seeds are the same examples).
    """
    if kind == "heldout":
        n = HELDOUT_SIZE
        seeds = heldout_seeds()
    elif kind == "train":
        seeds = train_seeds(n)
    else:
        raise ValueError(f"unknown split {kind!r}")
    directory = cache_dir()
    prefix = _prefix(kind, resolution, cfg)
    head: tuple[np.ndarray, np.ndarray] | None = None
    if use_cache and directory.is_dir():
        cached: list[tuple[int, Path]] = []
        for p in directory.glob(prefix + "_n*.npz"):
            try:
                cached.append((int(p.stem.rsplit("_n", 1)[1]), p))
            except ValueError:
                continue
        # Smallest cached set that covers n: slice it (its first n seeds are our examples).
        for size, p in sorted(cached):
            if size >= n and (loaded := _try_load(p, n)) is not None:
                return loaded
        # Otherwise extend the largest smaller cached set instead of rendering from scratch.
        for size, p in sorted(cached, reverse=True):
            if size < n and (loaded := _try_load(p, size)) is not None:
                head = loaded
                break
    done = 0 if head is None else len(head[0])
    X, Y = images_to_arrays([make_example(s, cfg) for s in seeds[done:]], resolution, cfg)
    if head is not None:
        X, Y = np.concatenate([head[0], X]), np.concatenate([head[1], Y])
    if use_cache:
        try:
            _atomic_savez(directory / f"{prefix}_n{n}.npz", X=X, Y=Y)
        except OSError as exc:  # a read-only cache must not kill the run
            print(f"warning: could not write cache: {exc}", file=sys.stderr)
    return X, Y


# ----------------------------------------------------------------------------- model


def _features(X: np.ndarray) -> np.ndarray:
    """Raw pixels, flattened and scaled to [0, 1]."""
    return X.reshape(len(X), -1).astype(np.float32) / np.float32(255.0)


def _progress_steps(iters: int, how_many: int = 8) -> set[int]:
    return {max(1, round(iters * k / how_many)) for k in range(1, how_many + 1)}


def predictions_to_answers(pred: np.ndarray, cfg: StarCountConfig = DEFAULT_CONFIG) -> list[str]:
    lo, hi = cfg.count_range
    counts = np.clip(np.rint(pred), lo, hi).astype(int)
    names = cfg.colour_names
    return [format_answer(dict(zip(names, row.tolist(), strict=True)), names) for row in counts]


def run(
    config: WorkloadConfig | dict[str, Any] | None = None,
    cfg: StarCountConfig = DEFAULT_CONFIG,
    use_cache: bool = True,
    emit=print,
    save_model: Path | None = None,
) -> dict[str, Any]:
    """Train and evaluate once; ``emit`` receives progress lines. Returns the summary dict."""
    wc = as_config(config)
    t_start = time.perf_counter()
    X_train, Y_train = load_split("train", wc.train_size, wc.resolution, cfg, use_cache)
    X_held, _ = load_split("heldout", HELDOUT_SIZE, wc.resolution, cfg, use_cache)
    heldout_examples = [make_example(s, cfg) for s in heldout_seeds()]
    data_seconds = time.perf_counter() - t_start

    Xtr = _features(X_train)
    Ytr = Y_train.astype(np.float32)
    model = MLP(Xtr.shape[1], wc.hidden, Ytr.shape[1], lr=wc.lr, seed=wc.seed)
    steps = _progress_steps(wc.iters)
    t_train = time.perf_counter()
    loss = float("nan")
    with np.errstate(all="ignore"):  # a diverging lr overflows; the loss says so below
        for epoch in range(1, wc.iters + 1):
            loss = model.fit_epoch(Xtr, Ytr, min(BATCH_SIZE, wc.train_size))
            if not np.isfinite(loss):
                emit(json.dumps({"step": epoch, "train_loss": None, "diverged": True}))
                break
            if epoch in steps:
                emit(json.dumps({"step": epoch, "train_loss": round(loss, 6)}))
        train_seconds = time.perf_counter() - t_train
        pred = model.predict(_features(X_held))
    pred = np.nan_to_num(pred, nan=0.0, posinf=0.0, neginf=0.0)
    answers = predictions_to_answers(pred, cfg)
    scores = score(heldout_examples, answers)
    if save_model is not None:  # for an evaluation the runner runs itself (evaluate.py)
        save_model.parent.mkdir(parents=True, exist_ok=True)
        model.save(save_model, resolution=wc.resolution, config=cfg.fingerprint())
    return {
        "exact_accuracy": round(scores["exact_accuracy"], 4),
        "mean_reward": round(scores["mean_reward"], 4),
        "train_loss": round(loss, 6) if np.isfinite(loss) else float("nan"),
        "train_seconds": round(train_seconds, 3),
        "data_seconds": round(data_seconds, 3),
        "total_seconds": round(time.perf_counter() - t_start, 3),
        "train_size": wc.train_size,
        "hidden": wc.hidden,
        "iters": wc.iters,
        "lr": wc.lr,
        "resolution": wc.resolution,
        "seed": wc.seed,
        "n_heldout": scores["n"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-size", type=int, default=BASELINE["train_size"])
    parser.add_argument("--hidden", type=int, default=BASELINE["hidden"])
    parser.add_argument("--iters", type=int, default=BASELINE["iters"])
    parser.add_argument("--lr", type=float, default=BASELINE["lr"])
    parser.add_argument("--resolution", type=int, default=BASELINE["resolution"])
    # `goaltender experiment --repeat N` runs seeds 0..N-1 through GOALTENDER_SEED.
    parser.add_argument("--seed", type=int, default=int(os.environ.get("GOALTENDER_SEED", "0")))
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the array cache")
    parser.add_argument(
        "--save-model",
        type=Path,
        default=Path(os.environ["GOALTENDER_EXPERIMENT_DIR"]) / MODEL_FILE
        if os.environ.get("GOALTENDER_EXPERIMENT_DIR")
        else None,
        help="where to save the trained weights (default: $GOALTENDER_EXPERIMENT_DIR/model.npz when set)",
    )
    args = parser.parse_args(argv)
    for name in ("train_size", "hidden", "iters", "resolution"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.lr <= 0:
        parser.error("--lr must be > 0")
    wc = WorkloadConfig(
        train_size=args.train_size,
        hidden=args.hidden,
        iters=args.iters,
        lr=args.lr,
        resolution=args.resolution,
        seed=args.seed,
    )
    summary = run(
        wc,
        use_cache=not args.no_cache,
        emit=lambda s: print(s, flush=True),
        save_model=args.save_model,
    )
    summary["estimated_seconds"] = estimate_cost(wc)
    for key, value in summary.items():
        print(f"{key}: {value}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
