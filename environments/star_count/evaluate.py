"""Score a trained star-count model on the fixed 64-example held-out split, independently of the
run that trained it. The runner runs this itself after an experiment (its `eval_command`), so the
headline number is one the runner measured, not one the experiment reported.

    python -m goaltender.environments.star_count.evaluate [--model PATH]

Prints `exact_accuracy: …`, `mean_reward: …`, `n_heldout: 64`, then the error analysis
(errors.py) as `acc/<colour>`, `acc/res_<side>` and `errors/<class>` lines; and writes
`errors.json` (the analysis) and `hard_cases.png` (a gallery of up to eight wrong examples) into
$GOALTENDER_EXPERIMENT_DIR, else beside the model.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from pathlib import Path

import numpy as np

from .errors import Analysis, Case, analyse
from .generate import DEFAULT_CONFIG, HELDOUT_SIZE, Example, heldout_split, render
from .verify import score
from .workload import MODEL_FILE, _features, load_split, predictions_to_answers

ERRORS_FILE = "errors.json"
GALLERY_FILE = "hard_cases.png"
GALLERY_SIZE = 8


def _answers(model_path: Path) -> list[str]:
    with model_path.open("rb") as f:
        saved = pickle.load(f)
    if saved.get("config") != DEFAULT_CONFIG.fingerprint():
        raise SystemExit(f"{model_path} was trained on another task config; refusing to score it")
    X_held, _ = load_split("heldout", HELDOUT_SIZE, saved["resolution"], DEFAULT_CONFIG, True)
    pred = np.nan_to_num(saved["model"].predict(_features(X_held)), nan=0.0, posinf=0.0, neginf=0.0)
    return predictions_to_answers(pred, DEFAULT_CONFIG)


def _headline(examples: list[Example], answers: list[str]) -> dict[str, float]:
    scores = score(examples, answers)
    return {
        "exact_accuracy": round(scores["exact_accuracy"], 4),
        "mean_reward": round(scores["mean_reward"], 4),
        "n_heldout": scores["n"],
    }


def evaluate(model_path: Path) -> dict[str, float]:
    """The headline scores of the model at `model_path`."""
    return _headline(heldout_split(DEFAULT_CONFIG), _answers(model_path))


def _title(case: Case) -> str:
    """Truth vs prediction per colour, e.g. "red 3→2 · green 1 · blue 0→?"."""
    guess = case.predicted or {}
    parts = []
    for colour, n in case.truth.items():
        said = guess.get(colour)
        parts.append(f"{colour} {n}" if said == n else f"{colour} {n}→{'?' if said is None else said}")
    return f"#{case.index} ({case.resolution}px)\n" + " · ".join(parts)


def save_gallery(cases: list[Case], examples: list[Example], path: Path) -> None:
    """The rendered canvases of `cases`, each titled with truth vs prediction, as one PNG."""
    # Imported here: only a run that writes a gallery pays for matplotlib.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = min(4, max(1, len(cases)))
    rows = max(1, -(-len(cases) // columns))
    fig = Figure(figsize=(2.4 * columns, 2.9 * rows), dpi=80)
    FigureCanvasAgg(fig)  # an explicit Agg canvas: no dependence on the configured backend
    if not cases:
        fig.text(0.5, 0.5, "no wrong answers", ha="center", va="center")
    for i, case in enumerate(cases):
        ax = fig.add_subplot(rows, columns, i + 1)
        ax.imshow(render(examples[case.index]), interpolation="nearest")
        ax.set_title(_title(case), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("Hardest held-out cases (truth→prediction)", fontsize=10)
    # Fixed margins, not tight_layout: that one measures every text and doubles the drawing time.
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - 0.8 / (2.9 * rows), hspace=0.3)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)


def write_analysis(analysis: Analysis, examples: list[Example], out_dir: Path) -> None:
    """errors.json and hard_cases.png in `out_dir` (each replaced whole, never half written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (ERRORS_FILE + ".tmp")
    tmp.write_text(json.dumps(analysis.to_json(), indent=1))
    os.replace(tmp, out_dir / ERRORS_FILE)
    save_gallery(analysis.hardest(GALLERY_SIZE), examples, out_dir / GALLERY_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    experiment_dir = os.environ.get("GOALTENDER_EXPERIMENT_DIR")
    default = Path(experiment_dir or ".") / MODEL_FILE
    parser.add_argument("--model", type=Path, default=default, help=f"pickled model (default: {default})")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        parser.error(f"no model at {args.model}; run the workload with --save-model first")
    examples = heldout_split(DEFAULT_CONFIG)
    answers = _answers(args.model)
    for key, value in _headline(examples, answers).items():
        print(f"{key}: {value}")
    analysis = analyse(examples, answers)
    for line in analysis.summary_lines():
        print(line)
    out_dir = Path(experiment_dir) if experiment_dir else args.model.parent
    try:
        write_analysis(analysis, examples, out_dir)
    except OSError as exc:  # the scores are printed already: a full disk must not lose them
        print(f"warning: could not write the error analysis: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
