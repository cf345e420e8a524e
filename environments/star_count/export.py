"""Export star-count examples as NeMo Gym JSONL rows or NeMo RL SFT (``openai_format``) rows.

Splits come from disjoint seed ranges (see ``generate``): train ``0..N-1``, validation
``500_000..``, and the fixed 64-example held-out split ``1_000_000..1_000_063``.

CLI::

    # every split of a reference shape into one directory: train.jsonl, validation.jsonl, heldout.jsonl
    python -m goaltender.environments.star_count.export --format sft --shape 2048/256 --out-dir sft_2048
    python -m goaltender.environments.star_count.export --format gym --train 4096 --validation 512 --out-dir data
    # one split into one file (Gym rows by default)
    python -m goaltender.environments.star_count.export --split heldout --out data/heldout.jsonl
    python -m goaltender.environments.star_count.export --split train --n 1000 --out data/train.jsonl
    python -m goaltender.environments.star_count.export --split validation --n 256 --out data/validation.jsonl

SFT rows are what NeMo RL's ``openai_format`` dataset reads: a system message, a user message
whose content is ``[{"type": "image", "image": <data URL>}, {"type": "text", "text": ...}]`` (the
part shape NeMo RL's VLM message code looks for; not OpenAI's ``image_url``), and an assistant
message whose content is exactly ``prompt.format_answer(counts)``, the form the verifier scores.
Images are inline ``data:image/png;base64,...`` URLs by default, so a file is self-contained and
loads from any working directory (NeMo RL's ``resolve_to_image`` opens a relative path from the
trainer's cwd, not from the file). ``--images files`` writes PNGs to ``images/`` beside the JSONL
and references them by absolute path instead. Load the files with ``use_preserving_dataset: true``
(see configs/sft_qwen3_vl_2b.yaml): message contents are strings and lists side by side, which the
Hugging Face JSON loader would refuse or None-fill.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .generate import (
    DEFAULT_CONFIG,
    HELDOUT_SIZE,
    Example,
    StarCountConfig,
    heldout_split,
    render,
    train_split,
    validation_split,
)
from .prompt import format_answer, system_prompt, user_prompt

AGENT_NAME = "star_count_simple_agent"
FORMATS = ("gym", "sft")
SPLITS = ("train", "validation", "heldout")
#: The reference SFT shapes (train/validation); the 64-example held-out split comes with each.
REFERENCE_SHAPES = ((2048, 256), (4096, 512))


def image_data_url(example: Example) -> str:
    """The rendered example as a ``data:image/png;base64,...`` URL."""
    buf = io.BytesIO()
    render(example).save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def to_gym_row(example: Example, cfg: StarCountConfig = DEFAULT_CONFIG) -> dict[str, Any]:
    """One NeMo Gym dataset row. Top-level fields besides ``responses_create_params`` and
    ``agent_ref`` (``counts``, ``stars``, ``seed``) travel into the resources server's verify request."""
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": system_prompt(cfg)},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": image_data_url(example), "detail": "auto"},
                        {"type": "input_text", "text": user_prompt(example, cfg)},
                    ],
                },
            ]
        },
        "stars": [s.to_dict() for s in example.stars],
        "counts": {name: int(example.counts[name]) for name in cfg.colours},
        "seed": example.seed,
        "agent_ref": {"type": "responses_api_agents", "name": AGENT_NAME},
    }


def to_sft_row(
    example: Example, cfg: StarCountConfig = DEFAULT_CONFIG, image: str | None = None
) -> dict[str, Any]:
    """One NeMo RL ``openai_format`` row: system, user (image + question), assistant (the exact
    answer in the verifier's format). ``image`` is a path or URL; by default an inline data URL.
    ``seed`` and ``counts`` ride along for checks; NeMo RL keeps only ``messages``."""
    return {
        "messages": [
            {"role": "system", "content": system_prompt(cfg)},
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image or image_data_url(example)},
                    {"type": "text", "text": user_prompt(example, cfg)},
                ],
            },
            {"role": "assistant", "content": format_answer(example.counts, cfg.colours)},
        ],
        "seed": example.seed,
        "counts": {name: int(example.counts[name]) for name in cfg.colours},
    }


def write_png(example: Example, image_dir: Path) -> str:
    """Render ``example`` to ``image_dir/<seed>.png``; returns its absolute path."""
    image_dir.mkdir(parents=True, exist_ok=True)
    path = (image_dir / f"{example.seed}.png").resolve()
    render(example).save(path, format="PNG", optimize=True)
    return str(path)


def row_builder(
    fmt: str, cfg: StarCountConfig = DEFAULT_CONFIG, image_dir: Path | None = None
) -> Callable[[Example], dict[str, Any]]:
    """Example -> row for ``fmt`` ("gym" or "sft"); SFT images go to ``image_dir`` when given."""
    if fmt == "gym":
        return lambda ex: to_gym_row(ex, cfg)
    if fmt == "sft":
        if image_dir is None:
            return lambda ex: to_sft_row(ex, cfg)
        return lambda ex: to_sft_row(ex, cfg, write_png(ex, image_dir))
    raise ValueError(f"unknown format {fmt!r}; use one of {FORMATS}")


def write_rows(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> int:
    """Write JSONL rows atomically (a temp file renamed into place); returns the number of rows."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp")
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, separators=(",", ":")) + "\n")
                n += 1
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def write_jsonl(
    path: str | os.PathLike[str], examples: Iterable[Example], cfg: StarCountConfig = DEFAULT_CONFIG
) -> int:
    """Write one Gym row per example (atomically); returns the number of rows."""
    return write_rows(path, (to_gym_row(ex, cfg) for ex in examples))


def split_examples(
    split: str, n: int | None, cfg: StarCountConfig = DEFAULT_CONFIG, start: int = 0
) -> list[Example]:
    """The examples of one split: train and validation need ``n``; heldout is the fixed 64
    (``n`` keeps only the first n of them)."""
    if split == "heldout":
        return heldout_split(cfg)[: max(0, n)] if n is not None else heldout_split(cfg)
    if n is None or n < 1:
        raise ValueError(f"the {split} split needs n >= 1")
    if split == "train":
        return train_split(n, cfg, start=start)
    if split == "validation":
        return validation_split(n, cfg)
    raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")


def export_splits(
    out_dir: str | os.PathLike[str],
    train: int,
    validation: int,
    fmt: str = "sft",
    cfg: StarCountConfig = DEFAULT_CONFIG,
    image_files: bool = False,
) -> dict[str, int]:
    """Write ``train.jsonl``, ``validation.jsonl`` and ``heldout.jsonl`` into ``out_dir``;
    returns the rows written per split."""
    directory = Path(out_dir)
    build = row_builder(fmt, cfg, directory / "images" if image_files else None)
    sizes = {"train": train, "validation": validation, "heldout": None}
    return {
        split: write_rows(directory / f"{split}.jsonl", map(build, split_examples(split, n, cfg)))
        for split, n in sizes.items()
    }


def worst_case_sft_rows(cfg: StarCountConfig = DEFAULT_CONFIG) -> list[dict[str, Any]]:
    """One SFT row per canvas resolution with every colour at its largest count: the longest
    example the config can produce (for sizing ``max_total_sequence_length``)."""
    most = cfg.count_range[1]
    rows = []
    for size in cfg.resolutions:
        canvas = Example(seed=-1, width=size, height=size, stars=(), counts=dict.fromkeys(cfg.colours, most))
        rows.append(to_sft_row(canvas, cfg))
    return rows


def parse_shape(text: str) -> tuple[int, int]:
    """``"2048/256"`` -> ``(2048, 256)``: train and validation sizes."""
    train, sep, validation = text.partition("/")
    if not sep or not train.strip().isdigit() or not validation.strip().isdigit():
        raise argparse.ArgumentTypeError(f"a shape is TRAIN/VALIDATION, e.g. 2048/256: {text!r}")
    shape = int(train), int(validation)
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"both sizes must be at least 1: {text!r}")
    return shape


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Write star-count examples as NeMo Gym JSONL (--format gym) or NeMo RL "
        "openai_format SFT JSONL (--format sft): one split into --out, or every split into --out-dir."
    )
    parser.add_argument("--format", choices=FORMATS, default="gym", help="row format (default: gym)")
    one = parser.add_argument_group("one split into one file")
    one.add_argument("--split", choices=SPLITS)
    one.add_argument(
        "--n",
        type=int,
        default=None,
        help=f"rows (train/validation: required; heldout: at most {HELDOUT_SIZE})",
    )
    one.add_argument("--start", type=int, default=0, help="first train seed (train split only)")
    one.add_argument("--out", help="output .jsonl path")
    every = parser.add_argument_group("train, validation and heldout into one directory")
    every.add_argument("--shape", type=parse_shape, help="TRAIN/VALIDATION sizes, e.g. 2048/256 or 4096/512")
    every.add_argument("--train", type=int, help="training rows (instead of --shape)")
    every.add_argument("--validation", type=int, help="validation rows (instead of --shape)")
    every.add_argument("--out-dir", help="writes train.jsonl, validation.jsonl and heldout.jsonl here")
    parser.add_argument(
        "--images",
        choices=("inline", "files"),
        default="inline",
        help="sft: inline data URLs (default) or PNG files in images/ beside the output, by absolute path",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.images == "files" and args.format != "sft":
        parser.error("--images files applies to --format sft only")
    if args.out_dir is not None:
        return _export_every_split(parser, args)
    if args.split is None or args.out is None:
        parser.error("give --split and --out (one split), or --out-dir with --shape or --train/--validation")
    try:
        examples = split_examples(args.split, args.n, DEFAULT_CONFIG, start=args.start)
    except ValueError as exc:
        parser.error(str(exc))
    image_dir = Path(args.out).parent / "images" if args.images == "files" else None
    n = write_rows(args.out, map(row_builder(args.format, DEFAULT_CONFIG, image_dir), examples))
    print(f"wrote {n} {args.format} rows ({args.split}) to {args.out}", file=sys.stderr)
    return 0


def _export_every_split(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.split is not None or args.out is not None:
        parser.error("--out-dir writes every split; leave out --split and --out")
    if args.shape is not None and (args.train is not None or args.validation is not None):
        parser.error("give --shape or --train/--validation, not both")
    train, validation = args.shape or (args.train, args.validation)
    if train is None or validation is None or min(train, validation) < 1:
        parser.error("--out-dir needs --shape TRAIN/VALIDATION or both --train N and --validation M (>= 1)")
    written = export_splits(
        args.out_dir, train, validation, args.format, DEFAULT_CONFIG, image_files=args.images == "files"
    )
    for split, n in written.items():
        print(
            f"wrote {n} {args.format} rows ({split}) to {Path(args.out_dir) / (split + '.jsonl')}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
