"""Files people give a goal: written into its workspace's `inputs/` folder, a chunk at a time.

A file comes from an operator client (the bot: a PDF attached in the goal's Slack thread) in
chunks of a PutInput request each, because a protocol line is at most 1 MiB. Its name is made safe
here (no folders, no leading dots, no control characters: nothing can land outside `inputs/`), its
size is held to the runner's cap (GOALTENDER_MAX_INPUT_MB) whatever the client says, and it appears
under its name only once whole (until then it is a hidden `.name.part`). A name already taken gets
a number ("paper-2.pdf"), so nothing a goal was given is overwritten.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

INPUTS = "inputs"  # in a goal's workspace
MAX_NAME = 120  # characters of a file's name, its extension included
_UNSAFE = re.compile(r"[^\w.+-]+")


class InputRefused(ValueError):
    """The file cannot be taken; the message says why, in one line."""


def safe_name(name: str) -> str:
    """`name` as a plain file name inside inputs/: its last path part, with anything but letters,
    digits and `.+-_` made `_`, no leading dots, at most MAX_NAME characters. InputRefused when
    nothing usable is left."""
    base = re.split(r"[/\\]", unicodedata.normalize("NFKC", name))[-1]
    base = _UNSAFE.sub("_", base).strip("._ ")
    if len(base) > MAX_NAME:
        stem, dot, ext = base.rpartition(".")
        ext = ext[:16] if dot else ""
        base = (stem if dot else base)[: MAX_NAME - len(ext) - 1].rstrip("._") + (f".{ext}" if ext else "")
    if not base or base in (".", ".."):
        raise InputRefused(f"{name[:80]!r} is not a usable file name")
    return base


def free_name(folder: Path, name: str) -> str:
    """`name`, or "stem-2.ext", "stem-3.ext", … when a file there has it."""
    if not (folder / name).exists():
        return name
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    n = 2
    while (folder / f"{stem}-{n}{dot}{ext}").exists():
        n += 1
    return f"{stem}-{n}{dot}{ext}"


def put_chunk(
    workspace: Path, name: str, *, offset: int, data: bytes, size: int, cap: int, last: bool
) -> Path | None:
    """Write one chunk of a file for the goal whose workspace this is; returns the file's path
    (relative to the workspace) once `last` made it whole, else None. InputRefused when the file
    is over `cap` bytes, the chunk is not where the file so far ends, or the sizes disagree; a
    refused file leaves nothing behind."""
    safe = safe_name(name)
    if size > cap:
        raise InputRefused(
            f"{safe} is {size:,} bytes; this runner takes files up to {cap:,} bytes (GOALTENDER_MAX_INPUT_MB)"
        )
    folder = workspace / INPUTS
    if folder.is_symlink():  # the agent owns its workspace: a link must not take the file elsewhere
        raise InputRefused(
            f"{INPUTS}/ in the goal's workspace is a link; the runner writes only into a folder"
        )
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f".{safe}.part"
    have = part.stat().st_size if offset and part.exists() else 0
    if offset != have:
        part.unlink(missing_ok=True)
        raise InputRefused(
            f"{safe}: a chunk at byte {offset:,} where the file so far has {have:,}; send it again"
        )
    if offset + len(data) > min(size, cap):
        part.unlink(missing_ok=True)
        raise InputRefused(f"{safe} is longer than the {size:,} bytes it was said to be")
    # O_NOFOLLOW: a symlink planted where the part goes is refused, not followed out of inputs/.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if offset else os.O_TRUNC)
    with os.fdopen(os.open(part, flags, 0o644), "wb") as out:
        out.write(data)
    if not last:
        return None
    if part.stat().st_size != size:
        part.unlink(missing_ok=True)
        raise InputRefused(
            f"{safe} ended at {offset + len(data):,} bytes, not the {size:,} it was said to be"
        )
    final = free_name(folder, safe)
    part.rename(folder / final)
    return Path(INPUTS) / final
