"""Preflight for SFT data: count each example's tokens as NeMo RL will, before it trains on them.

NeMo RL's ``sft_processor`` gives an example **zero loss, without a word**, when its token
length is ``>= max_total_sequence_length`` (it truncates the example to a few tokens and sets
``loss_multiplier = 0``). This preflight counts every example first and refuses the data
(exit 1, naming the worst offenders) when any would be masked; with ``--drop`` it writes a
filtered copy instead and says what it dropped.

Counting: with the target model's processor when ``transformers`` is installed and the model is
on this machine (a local path or the Hugging Face cache; nothing is downloaded), else an
estimate (``EstimateCounter``). Its image tokens are the Qwen-VL processor's own arithmetic: the
image resized by ``smart_resize`` (each side to a multiple of ``patch * merge`` pixels, the area
scaled into [min_pixels, max_pixels]), one token per ``patch * merge`` square, plus the
``<|vision_start|>``/``<|vision_end|>`` markers: every star-count canvas (64 to 128 px, scaled
up to 256 x 256) is 8 * 8 + 2 = 66 tokens on Qwen3-VL. The geometry (patch, merge, pixel bounds)
is read from the model's ``preprocessor_config.json`` when it is on this machine, else known
by the model's name. Text is estimated at a conservative 3 UTF-8 bytes per token, plus the chat
template's few tokens per message: that part errs high on purpose (too high costs padding, too
low silently costs examples).

Rows may be NeMo RL ``openai_format`` (``{"messages": [...]}``, images as
``{"type": "image", "image": <path or data URL>}``) or NeMo Gym rows
(``responses_create_params.input`` with ``input_image`` / ``input_text`` parts).

CLI::

    goaltender preflight --data train.jsonl --data validation.jsonl --max-seq-len 1024 \\
        [--model Qwen/Qwen3-VL-2B-Instruct] [--estimate] [--drop [--out-dir DIR]]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "Qwen/Qwen3-VL-2B-Instruct"
WORST_SHOWN = 5

# -- the estimate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionGeometry:
    """How a Qwen-VL processor turns pixels into tokens: the image is resized to a multiple of
    ``patch * merge`` pixels within [min_pixels, max_pixels]; each merged patch is one token."""

    name: str
    patch: int
    merge: int
    min_pixels: int
    max_pixels: int

    @property
    def pixels_per_token_side(self) -> int:
        return self.patch * self.merge

    def describe(self) -> str:
        return (
            f"{self.name}: patch {self.patch}, merge {self.merge}, "
            f"{self.min_pixels:,}-{self.max_pixels:,} pixels"
        )


# Qwen3-VL's preprocessor_config: patch 16, merge 2, size {shortest_edge: 65536, longest_edge: 16777216}.
QWEN3_VL = VisionGeometry("qwen3-vl", patch=16, merge=2, min_pixels=65_536, max_pixels=16_777_216)
# Qwen2/2.5-VL: patch 14, merge 2, min_pixels 56*56, max_pixels 28*28*16384.
QWEN2_5_VL = VisionGeometry("qwen2.5-vl", patch=14, merge=2, min_pixels=3_136, max_pixels=12_845_056)

VISION_MARKERS = 2  # <|vision_start|> ... <|vision_end|> around the image pads
BYTES_PER_TOKEN = 3.0  # English runs ~4 bytes per token; answers like "\boxed{red: 3}" run denser
MESSAGE_OVERHEAD = 5  # <|im_start|>role\n ... <|im_end|>\n
REPLY_HEADER = 3  # <|im_start|>assistant\n: counted by vLLM's input tokens, and part of any SFT row
PREPROCESSOR_CONFIG = "preprocessor_config.json"


def geometry_for(model: str | None) -> VisionGeometry:
    """The model's own geometry when its preprocessor_config.json is on this machine (a local
    path, or a snapshot in the Hugging Face cache); else Qwen2/2.5-VL's by name, and Qwen3-VL's
    (the target model) for everything else."""
    name = (model or "").lower().replace("_", "-")
    known = QWEN2_5_VL if ("qwen2.5-vl" in name or "qwen2-vl" in name) else QWEN3_VL
    config = local_preprocessor_config(model) if model else None
    return (
        known if config is None else geometry_from_config(config, known, f"{model}'s {PREPROCESSOR_CONFIG}")
    )


def geometry_from_config(path: Path, fallback: VisionGeometry, name: str) -> VisionGeometry:
    """A processor config's patch and merge sizes and pixel bounds, as transformers' Qwen2-VL image
    processor reads them (``min_pixels``/``max_pixels`` over ``size``'s shortest and longest
    edge); what it does not say is `fallback`'s. An unreadable file is `fallback`."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        size = config.get("size") if isinstance(config.get("size"), dict) else {}
        return VisionGeometry(
            name,
            patch=int(config.get("patch_size") or fallback.patch),
            merge=int(config.get("merge_size") or fallback.merge),
            min_pixels=int(config.get("min_pixels") or size.get("shortest_edge") or fallback.min_pixels),
            max_pixels=int(config.get("max_pixels") or size.get("longest_edge") or fallback.max_pixels),
        )
    except (OSError, ValueError, TypeError, AttributeError):
        return fallback


def local_preprocessor_config(model: str) -> Path | None:
    """The model's preprocessor_config.json on this machine: in a directory it names, or in its
    snapshot of the Hugging Face cache (HF_HUB_CACHE, else $HF_HOME/hub), main's first."""
    local = Path(model).expanduser()
    if local.is_dir():
        found = local / PREPROCESSOR_CONFIG
        return found if found.is_file() else None
    repo = _hub_cache() / f"models--{model.replace('/', '--')}"
    try:
        main = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    snapshots = [repo / "snapshots" / main] if main else []
    snapshots += sorted((repo / "snapshots").glob("*"))
    return next((s / PREPROCESSOR_CONFIG for s in snapshots if (s / PREPROCESSOR_CONFIG).is_file()), None)


def _hub_cache() -> Path:
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's resize rule: the nearest multiple of ``factor`` per side, then scaled (keeping
    the aspect ratio) into [min_pixels, max_pixels]. Small canvases are scaled UP."""
    if min(height, width) < 1:
        raise ValueError(f"empty image {width}x{height}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def grid_tokens(width: int, height: int, geometry: VisionGeometry = QWEN3_VL) -> int:
    """The image's pad tokens, as the processor counts them: its resized sides over
    ``patch * merge``, multiplied (grid_h * grid_w / merge**2 of its image_grid_thw)."""
    side = geometry.pixels_per_token_side
    h, w = smart_resize(height, width, side, geometry.min_pixels, geometry.max_pixels)
    return (h // side) * (w // side)


def image_tokens(width: int, height: int, geometry: VisionGeometry = QWEN3_VL) -> int:
    """Tokens one image costs in the prompt: its pads and the two markers around them."""
    return grid_tokens(width, height, geometry) + VISION_MARKERS


def text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


# -- reading rows ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    kind: str  # "text" or "image"
    value: str  # the text, or the image's path / data URL


@dataclass(frozen=True)
class Message:
    role: str
    parts: tuple[Part, ...]


def _part(item: Any) -> Part | None:
    """One content item in any of the shapes we meet: openai_format (text / image), OpenAI chat
    (image_url), NeMo Gym / Responses (input_text / input_image). Unknown items are skipped."""
    if isinstance(item, str):
        return Part("text", item)
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind in ("text", "input_text", "output_text"):
        return Part("text", str(item.get("text") or ""))
    if kind == "image" and isinstance(item.get("image"), str):
        return Part("image", item["image"])
    if kind in ("image_url", "input_image"):
        url = item.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return Part("image", url) if isinstance(url, str) else None
    return None


def messages_of(row: dict[str, Any]) -> list[Message]:
    """The conversation of an openai_format row (``messages``) or a Gym row (its prompt)."""
    if isinstance(row.get("messages"), list):
        raw = row["messages"]
    elif isinstance(row.get("responses_create_params"), dict):
        raw = row["responses_create_params"].get("input") or []
    else:
        raise ValueError("neither 'messages' nor 'responses_create_params.input'")
    out = []
    for msg in raw:
        content = msg.get("content")
        items = content if isinstance(content, list) else [content or ""]
        parts = tuple(p for p in (_part(item) for item in items) if p is not None)
        out.append(Message(str(msg.get("role", "user")), parts))
    return out


def open_image(ref: str, base_dir: Path | None = None) -> Any:
    """A PIL image from a data URL, ``file://`` URL or path (as NeMo RL's ``resolve_to_image``
    reads them; a relative path is tried from the working directory, then from ``base_dir``)."""
    from PIL import Image

    if ref.startswith("data:"):
        return Image.open(io.BytesIO(base64.b64decode(ref.split(",", 1)[1])))
    if ref.startswith(("http://", "https://")):
        raise ValueError(f"remote image not fetched by the preflight: {ref[:80]}")
    path = Path(ref.removeprefix("file://"))
    if not path.is_absolute() and not path.exists() and base_dir is not None:
        path = base_dir / path
    return Image.open(path)


# -- counters -------------------------------------------------------------------------------------


class EstimateCounter:
    """Tokens from image sizes and text lengths; needs only Pillow. Remembers the image sizes it
    met and their tokens (``canvases``), which the preflight prints."""

    def __init__(self, geometry: VisionGeometry = QWEN3_VL, base_dir: Path | None = None):
        self.geometry = geometry
        self.base_dir = base_dir
        self.name = f"estimate ({geometry.name} geometry)"
        self.canvases: dict[tuple[int, int], int] = {}

    def count(self, row: dict[str, Any]) -> int:
        messages = messages_of(row)
        total = REPLY_HEADER if messages and messages[-1].role != "assistant" else 0
        for msg in messages:
            total += MESSAGE_OVERHEAD
            for part in msg.parts:
                if part.kind == "text":
                    total += text_tokens(part.value)
                else:
                    width, height = open_image(part.value, self.base_dir).size  # reads the header only
                    tokens = image_tokens(width, height, self.geometry)
                    self.canvases[width, height] = tokens
                    total += tokens
        return total

    def canvas_line(self) -> str:
        """The tokens each image size costs, e.g. ``64x64: 66``."""
        sizes = sorted(self.canvases, key=lambda wh: (wh[0] * wh[1], wh))
        each = ", ".join(f"{w}x{h}: {self.canvases[w, h]}" for w, h in sizes)
        return (
            f"image tokens per canvas ({self.geometry.describe()}; pads + {VISION_MARKERS} markers): {each}"
        )


class ProcessorCounter:
    """Exact counts with the model's own processor: its chat template, then its tokenizer and
    image processor over the whole conversation, as NeMo RL's sft_processor does per message."""

    def __init__(self, processor: Any, name: str, base_dir: Path | None = None):
        self.processor = processor
        self.base_dir = base_dir
        self.name = f"processor ({name})"

    def count(self, row: dict[str, Any]) -> int:
        messages, images = self._chat(messages_of(row))
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        encoded = self.processor(text=[text], images=images or None)
        return len(encoded["input_ids"][0])

    def _chat(self, messages: list[Message]) -> tuple[list[dict[str, Any]], list[Any]]:
        chat, images = [], []
        for msg in messages:
            content: list[dict[str, Any]] = []
            for part in msg.parts:
                if part.kind == "text":
                    content.append({"type": "text", "text": part.value})
                else:
                    images.append(open_image(part.value, self.base_dir).convert("RGB"))
                    content.append({"type": "image"})
            chat.append({"role": msg.role, "content": content})
        return chat, images


Counter = EstimateCounter | ProcessorCounter


def load_processor(model: str) -> Any:
    """The model's processor, from a local path or the Hugging Face cache only (never a download).
    Raises ImportError without transformers (the optional ``sft`` extra), OSError when not local."""
    from transformers import AutoProcessor  # optional: pip install 'goaltender[sft]'

    return AutoProcessor.from_pretrained(model, local_files_only=True)


def make_counter(
    model: str | None,
    estimate_only: bool = False,
    base_dir: Path | None = None,
    loader: Callable[[str], Any] = load_processor,
) -> tuple[Counter, str]:
    """The best counter available, and a note saying why when it is only the estimate."""
    estimate = EstimateCounter(geometry_for(model), base_dir)
    if estimate_only or not model:
        return estimate, ""
    try:
        return ProcessorCounter(loader(model), model, base_dir), ""
    except ImportError:
        return estimate, "transformers is not installed (pip install 'goaltender[sft]')"
    except OSError as exc:  # huggingface_hub's "not in the cache" errors are OSErrors
        return estimate, f"{model} is not available locally ({_first_line(exc)})"
    except Exception as exc:  # any other loading failure: still count, and say why it is the estimate
        return estimate, f"{model}'s processor did not load ({type(exc).__name__}: {_first_line(exc)})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:120] if text else type(exc).__name__


# -- checking -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counted:
    line: int  # 1-based line in the file
    tokens: int
    seed: Any
    text: str  # the row's line as read (a filtered file keeps rows byte for byte)


@dataclass
class SplitReport:
    name: str
    limit: int
    counter: str
    rows: list[Counted] = field(default_factory=list)

    @property
    def over(self) -> list[Counted]:
        """Rows NeMo RL would mask: length >= limit (sft_processor's own test), worst first."""
        return sorted((r for r in self.rows if r.tokens >= self.limit), key=lambda r: -r.tokens)

    @property
    def max_tokens(self) -> int:
        return max((r.tokens for r in self.rows), default=0)

    @property
    def p95(self) -> int:
        ordered = sorted(r.tokens for r in self.rows)
        return ordered[math.ceil(0.95 * len(ordered)) - 1] if ordered else 0

    def summary(self) -> str:
        return (
            f"{self.name}: n={len(self.rows)} max={self.max_tokens} p95={self.p95} "
            f"over_limit={len(self.over)} (limit {self.limit}; {self.counter})"
        )

    def worst(self, k: int = WORST_SHOWN) -> str:
        shown = [f"line {r.line}{_seed(r)}: {r.tokens} tokens" for r in self.over[:k]]
        more = len(self.over) - len(shown)
        return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _seed(row: Counted) -> str:
    return f" (seed {row.seed})" if row.seed is not None else ""


def read_rows(path: Path) -> Iterable[tuple[int, str, dict[str, Any]]]:
    """(line number, line, parsed row) for each non-blank line; bad JSON is an error naming it."""
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: a row must be a JSON object")
            yield number, line.rstrip("\n"), row


def check_file(path: Path, limit: int, counter: Counter) -> SplitReport:
    report = SplitReport(path.name, limit, counter.name)
    for number, line, row in read_rows(path):
        try:
            tokens = counter.count(row)
        except (ValueError, OSError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: cannot count this row: {exc}") from exc
        report.rows.append(Counted(number, tokens, row.get("seed"), line))
    return report


def write_kept(report: SplitReport, out: Path) -> int:
    """Write the rows under the limit (atomically), byte for byte; returns how many."""
    out.parent.mkdir(parents=True, exist_ok=True)
    dropped = {r.line for r in report.over}
    kept = [r.text for r in report.rows if r.line not in dropped]
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in kept)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(kept)


def filtered_path(path: Path, out_dir: Path | None) -> Path:
    return (out_dir or path.parent) / f"{path.stem}.filtered{path.suffix or '.jsonl'}"


# -- CLI ------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", type=Path, action="append", required=True, help="a JSONL file (repeat for each split)"
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        required=True,
        help="policy.max_total_sequence_length of the run (NeMo RL masks rows of this length or more)",
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model whose processor counts, if installed and local (default: {DEFAULT_MODEL})",
    )
    parser.add_argument("--estimate", action="store_true", help="use the estimate even if a processor loads")
    parser.add_argument(
        "--drop",
        action="store_true",
        help="write NAME.filtered.jsonl without the over-limit rows instead of refusing",
    )
    parser.add_argument("--out-dir", type=Path, help="where --drop writes (default: beside each file)")


def run(args: argparse.Namespace, out: Any = None, err: Any = None) -> int:
    """Exit 0 when every row fits (or, with --drop, when the kept rows were written), 1 when rows
    would be masked (or --drop would leave a file empty), 2 for unreadable input."""
    out, err = out or sys.stdout, err or sys.stderr
    if args.max_seq_len < 1:
        print("preflight: --max-seq-len must be at least 1", file=err)
        return 2
    counter, note = make_counter(args.model, args.estimate)
    if note:
        print(f"preflight: counting with the estimate: {note}", file=err)
    try:
        reports = [(path, check_file(path, args.max_seq_len, _rebased(counter, path))) for path in args.data]
    except OSError as exc:
        print(f"preflight: cannot read {exc.filename or 'the data'}: {exc.strerror or exc}", file=err)
        return 2
    except ValueError as exc:
        print(f"preflight: {exc}", file=err)
        return 2
    for _path, report in reports:
        print(report.summary(), file=out)
    if isinstance(counter, EstimateCounter) and counter.canvases:
        print(counter.canvas_line(), file=out)
    if args.drop:
        return _drop(reports, args.out_dir, out, err)
    return _refuse_if_over(reports, err)


def _rebased(counter: Counter, path: Path) -> Counter:
    """Relative image paths in a file are also looked for beside that file."""
    counter.base_dir = path.parent.resolve()
    return counter


def _refuse_if_over(reports: list[tuple[Path, SplitReport]], err: Any) -> int:
    refused = [(path, report) for path, report in reports if report.over]
    for path, report in refused:
        print(
            f"preflight: REFUSED {path}: {len(report.over)} of {len(report.rows)} examples have "
            f">= {report.limit} tokens (max_total_sequence_length); NeMo RL would train on them with "
            f"zero loss and no warning. Worst: {report.worst()}. Raise the limit, or re-run with --drop.",
            file=err,
        )
    return 1 if refused else 0


def _drop(reports: list[tuple[Path, SplitReport]], out_dir: Path | None, out: Any, err: Any) -> int:
    status = 0
    for path, report in reports:
        target = filtered_path(path, out_dir)
        if report.over and len(report.over) == len(report.rows):
            print(
                f"preflight: every example in {path} has >= {report.limit} tokens; nothing to keep", file=err
            )
            status = 1
            continue
        kept = write_kept(report, target)
        why = f" (>= {report.limit} tokens: {report.worst()})" if report.over else ""
        print(
            f"{path.name}: dropped {len(report.over)} of {len(report.rows)}{why}; wrote {kept} rows to {target}",
            file=out,
        )
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m goaltender.environments.preflight",
        description="Count tokens per SFT example; refuse (or --drop) those NeMo RL would silently mask.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
