"""What the built-in agent passes on of text it did not write: output cut to fit the model's
window (head and tail kept, the tail holds the errors), secrets from the environment redacted,
and one-line excerpts for logs and titles."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)


def truncate_middle(text: str | bytes, limit: int) -> str:
    """Keep the head and the tail of `text`, at most ~`limit` bytes in all, with a marker saying
    how much was cut from the middle."""
    data = text.encode(errors="replace") if isinstance(text, str) else text
    if len(data) <= limit:
        return data.decode(errors="replace")
    head = limit * 2 // 5
    return _join(data[:head], data[len(data) - (limit - head) :], len(data))


def truncate_file(path: Path, limit: int) -> str:
    """truncate_middle over a file's bytes, reading only the head and the tail it keeps."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        if size <= limit:
            return f.read().decode(errors="replace")
        head = f.read(limit * 2 // 5)
        f.seek(size - (limit - len(head)))
        return _join(head, f.read(), size)


def _join(head: bytes, tail: bytes, total: int) -> str:
    cut = total - len(head) - len(tail)
    marker = f"\n[... {cut:,} bytes cut from the middle of {total:,} bytes of output ...]\n"
    return head.decode(errors="replace") + marker + tail.decode(errors="replace")


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
