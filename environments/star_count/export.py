"""Export star-count examples as NeMo Gym JSONL rows.

CLI::

    python -m goaltender.environments.star_count.export --split heldout --out data/heldout.jsonl
    python -m goaltender.environments.star_count.export --split train --n 1000 --out data/train.jsonl
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
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
)
from .prompt import system_prompt, user_prompt

AGENT_NAME = "star_count_simple_agent"


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


def write_jsonl(
    path: str | os.PathLike[str], examples: Iterable[Example], cfg: StarCountConfig = DEFAULT_CONFIG
) -> int:
    """Write one Gym row per example (atomically); returns the number of rows."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp")
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for ex in examples:
                fh.write(json.dumps(to_gym_row(ex, cfg), separators=(",", ":")) + "\n")
                n += 1
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write star-count examples as NeMo Gym JSONL.")
    parser.add_argument("--split", choices=("train", "heldout"), required=True)
    parser.add_argument(
        "--n", type=int, default=None, help=f"rows (train: required; heldout: at most {HELDOUT_SIZE})"
    )
    parser.add_argument("--start", type=int, default=0, help="first train seed (train split only)")
    parser.add_argument("--out", required=True, help="output .jsonl path")
    args = parser.parse_args(argv)
    if args.split == "train":
        if args.n is None or args.n < 1:
            parser.error("--split train needs --n >= 1")
        examples = train_split(args.n, DEFAULT_CONFIG, start=args.start)
    else:
        examples = heldout_split(DEFAULT_CONFIG)
        if args.n is not None:
            examples = examples[: max(0, args.n)]
    n = write_jsonl(args.out, examples, DEFAULT_CONFIG)
    print(f"wrote {n} rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
