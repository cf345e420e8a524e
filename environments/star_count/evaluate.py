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

import os

# Run as the runner's evaluation: one BLAS thread, set before numpy is imported. Its products are
# small, and a second thread costs ~80 ms of CPU at numpy's import alone, taken from whatever else
# the box runs. Only then: a process that imports this module keeps its own environment.
if __name__ == "__main__":
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from . import mlp
from .errors import Analysis, Case, analyse
from .generate import DEFAULT_CONFIG, HELDOUT_SIZE, Example, heldout_split, render
from .verify import score
from .workload import MODEL_FILE, _features, load_split, predictions_to_answers

ERRORS_FILE = "errors.json"
GALLERY_FILE = "hard_cases.png"
GALLERY_SIZE = 8


def _answers(model_path: Path) -> list[str]:
    try:
        model, meta = mlp.load(model_path)
    except (OSError, ValueError, KeyError, IndexError) as exc:  # not an npz of this model's weights
        raise SystemExit(f"{model_path} is not a saved star-count model ({exc})") from None
    if meta.get("config") != DEFAULT_CONFIG.fingerprint():
        raise SystemExit(f"{model_path} was trained on another task config; refusing to score it")
    X_held, _ = load_split("heldout", HELDOUT_SIZE, int(meta["resolution"]), DEFAULT_CONFIG, True)
    with np.errstate(all="ignore"):
        pred = np.nan_to_num(model.predict(_features(X_held)), nan=0.0, posinf=0.0, neginf=0.0)
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
    """Truth vs prediction per colour, e.g. "red 3->2 · green 1 · blue 0->?" (Pillow's default
    font has no arrow)."""
    guess = case.predicted or {}
    parts = []
    for colour, n in case.truth.items():
        said = guess.get(colour)
        parts.append(f"{colour} {n}" if said == n else f"{colour} {n}->{'?' if said is None else said}")
    return f"#{case.index} ({case.resolution}px)\n" + " · ".join(parts)


TILE = 160  # px a canvas is drawn at in the gallery, whatever its own size
CAPTION = 34  # px of text under each canvas


def save_gallery(cases: list[Case], examples: list[Example], path: Path) -> None:
    """The rendered canvases of `cases`, each titled with truth vs prediction, as one PNG.

    Drawn with Pillow (which renders the canvases anyway): matplotlib's import alone cost the
    runner's evaluation more than the scoring did."""
    columns = min(4, max(1, len(cases)))
    rows = max(1, -(-len(cases) // columns))
    header = 24
    sheet = Image.new("RGB", (columns * (TILE + 8) + 8, header + rows * (TILE + CAPTION + 8)), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    title = "Hardest held-out cases (truth->prediction)" if cases else "no wrong answers"
    draw.text((8, 6), title, fill="black", font=font)
    for i, case in enumerate(cases):
        x = 8 + (i % columns) * (TILE + 8)
        y = header + (i // columns) * (TILE + CAPTION + 8)
        canvas = render(examples[case.index]).resize((TILE, TILE), Image.Resampling.NEAREST)
        sheet.paste(canvas, (x, y))
        draw.multiline_text((x, y + TILE + 2), _title(case), fill="black", font=font, spacing=2)
    # Named *.png, not given format="PNG": Pillow then loads its PNG plugin alone, not its five
    # usual ones (BMP, GIF, JPEG, PPM, PNG: a tenth of the evaluation).
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    sheet.save(tmp, compress_level=3)  # a third faster than the default 6; ~30% more bytes, ~17 KB
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
    parser.add_argument(
        "--model", type=Path, default=default, help=f"saved model weights (default: {default})"
    )
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
