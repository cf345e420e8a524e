"""What the built-in agent passes on of text it did not write: output cut to fit the model's
window (head and tail kept, the tail holds the errors), secrets from the environment redacted,
and one-line excerpts for logs and titles."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)


def truncate_middle(text: str | bytes, limit: int, secrets: Sequence[str] = ()) -> str:
    """Keep the head and the tail of `text`, at most ~`limit` bytes in all, with a marker saying
    how much was cut from the middle. `secrets` are redacted first, so no piece of one is kept at
    the cut."""
    data = text.encode(errors="replace") if isinstance(text, str) else text
    if secrets:
        data = redact(data.decode(errors="replace"), secrets).encode()
    if len(data) <= limit:
        return data.decode(errors="replace")
    head = limit * 2 // 5
    return _join(data[:head], data[len(data) - (limit - head) :], len(data), secrets)


def truncate_file(path: Path, limit: int, secrets: Sequence[str] = ()) -> str:
    """truncate_middle over a file's bytes, reading only the head and the tail it keeps (and, with
    `secrets`, enough around them to redact a secret that crosses either edge)."""
    head_room, tail_room = cut_shares(limit, secrets)
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        if size <= head_room + tail_room:
            return truncate_middle(f.read(), limit, secrets)
        head = f.read(head_room)
        f.seek(size - tail_room)
        return cut_between(head, f.read(), size, limit, secrets)


def cut_shares(limit: int, secrets: Sequence[str] = ()) -> tuple[int, int]:
    """Bytes to read of a long text's head and of its tail for cut_between: the shares
    truncate_middle keeps, each with room for the longest secret."""
    margin = max((len(s.encode()) for s in secrets), default=0)
    return limit * 2 // 5 + margin, limit - limit * 2 // 5 + margin


def cut_between(head: bytes, tail: bytes, total: int, limit: int, secrets: Sequence[str] = ()) -> str:
    """truncate_middle of a text of `total` bytes read only as its first and last bytes (at least
    cut_shares each): each end redacted, then cut so that no piece of a secret is kept."""
    head_size = limit * 2 // 5
    kept_head = _redacted(head, secrets)[:head_size]
    tail = _redacted(tail, secrets)
    return _join(kept_head, tail[len(tail) - (limit - head_size) :], total, secrets)


def _redacted(data: bytes, secrets: Sequence[str]) -> bytes:
    return redact(data.decode(errors="replace"), secrets).encode() if secrets else data


def _join(head: bytes, tail: bytes, total: int, secrets: Sequence[str] = ()) -> str:
    head_text, tail_text = head.decode(errors="replace"), tail.decode(errors="replace")
    # A secret the cut goes through was not redacted whole: drop its pieces on either side.
    head_text = head_text[: len(head_text) - _piece_at_end(head_text, secrets)]
    tail_text = tail_text[_piece_at_start(tail_text, secrets) :]
    cut = total - len(head_text.encode()) - len(tail_text.encode())
    marker = f"\n[... {cut:,} bytes cut from the middle of {total:,} bytes of output ...]\n"
    return head_text + marker + tail_text


def _piece_at_end(text: str, secrets: Sequence[str]) -> int:
    """Length of the longest start of a secret that `text` ends with."""
    return max((k for s in secrets for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def _piece_at_start(text: str, secrets: Sequence[str]) -> int:
    """Length of the longest end of a secret that `text` starts with."""
    return max((k for s in secrets for k in range(1, len(s)) if text.startswith(s[-k:])), default=0)


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """Values of environment variables that look like secrets (long enough to be worth hiding),
    longest first so that a secret containing another is redacted whole."""
    return sorted(
        {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= 8 and v != "EMPTY"},
        key=len,
        reverse=True,
    )


def redact(text: str, secrets: Iterable[str]) -> str:
    for value in secrets:
        text = text.replace(value, "[redacted]")
    return text


def one_line(text: Any, limit: int) -> str:
    """`text` with its whitespace collapsed, cut to `limit` characters."""
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
