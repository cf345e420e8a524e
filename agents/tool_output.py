"""What the built-in agent passes on of text it did not write: output cut to fit the model's
window (head and tail kept, the tail holds the errors), secrets redacted, and one-line excerpts for
logs and titles.

Redaction is the runner's Redactor (runner/secrets.py) over the agent's own secrets (its
environment's secret-looking values and the passwords of URLs in it): values, token shapes and
URLs' credentials, as text is and as it decodes (JSON escapes, %XX), with `[redacted]` for each.
Everything a tool returns to the model provider passes it, so a mirror's password in HF_ENDPOINT,
echoed by a command or quoted by a library's retry line, or a token escaped in a JSON file read,
does not reach the provider. A cut goes where Redactor.uncut says: never through a secret.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the sweep agent's start needs one_line only, not pydantic
    from goaltender.runner.secrets import Redactor


def truncate_middle(text: str | bytes, limit: int, secrets: Sequence[str] = ()) -> str:
    """Keep the head and the tail of `text`, at most ~`limit` bytes in all, with a marker saying
    how much was cut from the middle. `secrets` are redacted first, so no piece of one is kept at
    the cut."""
    data = text.encode(errors="replace") if isinstance(text, str) else text
    data = _redacted(data, secrets)
    if len(data) <= limit:
        return data.decode(errors="replace")
    head = limit * 2 // 5
    return _join(data[:head], data[len(data) - (limit - head) :], len(data) - limit, len(data))


def truncate_file(path: Path, limit: int, secrets: Sequence[str] = ()) -> str:
    """truncate_middle over a file's bytes, reading only the head and the tail it keeps (and
    enough around them to find a secret that crosses either cut)."""
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
    truncate_middle keeps, each with room for the longest secret (escaped, a shape, a URL)."""
    margin = _redactor(tuple(secrets)).reach
    return limit * 2 // 5 + margin, limit - limit * 2 // 5 + margin


def cut_between(head: bytes, tail: bytes, total: int, limit: int, secrets: Sequence[str] = ()) -> str:
    """truncate_middle of a text of `total` bytes read only as its first and last bytes (at least
    cut_shares each): each end cut where no secret crosses the cut (Redactor.uncut), then
    redacted."""
    redactor = _redactor(tuple(secrets))
    head_size, tail_size = limit * 2 // 5, limit - limit * 2 // 5
    end = redactor.uncut(head, head_size) if head_size < len(head) else len(head)
    start = redactor.uncut(tail, len(tail) - tail_size) if tail_size < len(tail) else 0
    cut = total - end - (len(tail) - start)
    return _join(_redacted(head[:end], secrets), _redacted(tail[start:], secrets), cut, total)


def _redacted(data: bytes, secrets: Sequence[str]) -> bytes:
    text = data.decode(errors="replace")
    redacted = _redactor(tuple(secrets)).redact(text)
    return data if redacted is text else redacted.encode()


def _join(head: bytes, tail: bytes, cut: int, total: int) -> str:
    marker = f"\n[... {cut:,} bytes cut from the middle of {total:,} bytes of output ...]\n"
    return head.decode(errors="replace") + marker + tail.decode(errors="replace")


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The secrets an environment holds (runner/secrets.py: environment_secrets), longest first
    so that a secret containing another is redacted whole."""
    from goaltender.runner.secrets import environment_secrets

    return sorted({value for _, value in environment_secrets(environ)}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` without `secrets`, token shapes and URLs' credentials, as it is and as it decodes."""
    return _redactor(tuple(secrets)).redact(text)


@functools.lru_cache(maxsize=8)
def _redactor(secrets: tuple[str, ...]) -> Redactor:
    from goaltender.runner.secrets import Redactor

    return Redactor(("", value) for value in secrets)  # unlabelled: each is `[redacted]`


def one_line(text: Any, limit: int) -> str:
    """`text` with its whitespace collapsed, cut to `limit` characters."""
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
