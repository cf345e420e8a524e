"""Secrets stay on the box: what the runner sends is redacted, and agents get no secret they were not granted.

A Redactor knows three kinds of secret:

- the values of configured secrets (`GOALTENDER_SECRETS`: names of environment variables, or paths
  of files that each hold one secret — an entry with a '/' is a file; each of its lines counts too,
  so the lines of a key file are caught in a log tail that starts mid-key);
- the values of secret-looking environment variables: the name contains TOKEN, KEY, SECRET,
  PASSWORD, PASSWD or CREDENTIAL (any case) and the value could be a secret — at least 8
  characters, not a number (token counts and key sizes such as GOALTENDER_CONTEXT_TOKENS=128000 are
  settings, and a short value would redact ordinary words), not the path of an existing file (it
  names where a credential is; put the file itself in GOALTENDER_SECRETS);
- known token shapes: Slack (xox?-, xapp-), OpenAI-style sk-…, Hugging Face hf_…, GitHub
  (ghp_/gho_/ghu_/ghs_/ghr_, github_pat_), AWS access key ids (AKIA/ASIA…) and PEM private-key
  blocks, whole or cut short.

A known value becomes `[redacted:NAME]`, a shape `[redacted]`. `redact(text)` works on plain text;
`redact_line(line)` on one encoded NDJSON message: a single compiled alternation of every value's
JSON-escaped forms and the shapes' cores looks for anything to do, and a line with no hit passes
through byte-identical; a line with a hit is decoded, every string in it (keys too) redacted, and
encoded again — so a replacement never lands inside an escape sequence or breaks the JSON. A secret
is caught whole; a piece of one (a log chunk cut mid-token) is caught at a text's edges by
`redact_edges`. The guarantee holds for secrets of 8 characters or more that contain no '[' or ']'
(they could otherwise be re-formed around a replacement marker).

`agent_safe(env, settings)` is the environment agents, experiments and eval commands start from:
the runner's, minus every variable the Redactor treats as secret, every SLACK_* variable and the
configured secrets — except the names in `GOALTENDER_GRANTS` (granted values are still redacted on
the way out).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pydantic_core

from goaltender.runner.config import RunnerSettings

try:
    import hyperscan
except ImportError:  # no wheel for this machine (pyproject.toml): the needles are looked for one by one
    hyperscan = None  # type: ignore[assignment]

log = logging.getLogger("goaltender.runner")

SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
MIN_SECRET_LENGTH = 8
MIN_EDGE_PIECE = 6  # the shortest piece of a secret redact_edges takes for one
NEEDLE_CHECK_FROM = 2048  # longer texts are looked through for needles before the regex runs
SHAPE_REACH = 1024  # bytes a token of a known shape may span: far longer than any issued
NEVER_GRANTED_BY_DEFAULT = "SLACK_"
OUR_SETTINGS = frozenset({"GOALTENDER_SECRETS", "GOALTENDER_GRANTS"})  # lists of names, not secrets

_NUMBER = re.compile(r"[+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?")
_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]")

# Each shape: (the core, which also finds it in an encoded line; the guarded form used on text).
# The guard keeps `sk-` from matching inside words ("task-…"); after an ANSI colour code ("\x1b[31m")
# it still matches.
_SK_GUARD = r"(?:(?<![A-Za-z0-9])|(?<=[0-9]m))"
_SHAPES: list[tuple[str, str]] = [
    (r"xox[a-z]-[A-Za-z0-9-]{10}", r"xox[a-z]-[A-Za-z0-9-]{10,}"),
    (r"xapp-[A-Za-z0-9-]{10}", r"xapp-[A-Za-z0-9-]{10,}"),
    (r"sk-[A-Za-z0-9_-]{20}", _SK_GUARD + r"sk-[A-Za-z0-9_-]{20,}"),
    (r"hf_[A-Za-z0-9]{20}", r"hf_[A-Za-z0-9]{20,}"),
    (r"gh[pousr]_[A-Za-z0-9]{20}", r"gh[pousr]_[A-Za-z0-9]{20,}"),
    (r"github_pat_[A-Za-z0-9_]{20}", r"github_pat_[A-Za-z0-9_]{20,}"),
    (r"AKIA[A-Z0-9]{16}", r"(?<![A-Z0-9])AKIA[A-Z0-9]{16}(?![A-Z0-9])"),
    (r"ASIA[A-Z0-9]{16}", r"(?<![A-Z0-9])ASIA[A-Z0-9]{16}(?![A-Z0-9])"),
    (r"PRIVATE KEY-----", r"-----BEGIN[A-Z ]{0,40}PRIVATE KEY-----(?:.*?-----END[A-Z ]{0,40}PRIVATE KEY-----"
     r"|[A-Za-z0-9+/=\s:,.-]*)"),
]  # fmt: skip
# A key block whose BEGIN was cut off (a log tail that starts mid-key): base64 lines up to its END.
# Its lines are 64 characters; the first (cut) and the last may be shorter.
_HEADLESS_KEY = re.compile(
    r"(?:[A-Za-z0-9+/=]+\r?\n)?(?:[A-Za-z0-9+/=]{16,}\r?\n)*(?:[A-Za-z0-9+/=]+\r?\n)?"
    r"-----END[A-Z ]{0,40}PRIVATE KEY-----"
)
_MARKERS = ("[redacted:{label}]", "[redacted]", "[secret]", "***")
# Every shape's match holds one of these: text with none of them (and no secret value) cannot match,
# and `in` finds out at memory speed where the guarded alternation steps through every position.
_SHAPE_NEEDLES = ("xox", "xapp-", "sk-", "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "AKIA", "ASIA",
                  "PRIVATE KEY-----")  # fmt: skip
# Needles that share a piece are looked for by it first: a text without it is one scan, not one
# per needle (and one character is a memchr). Each group's needles all hold its piece.
_NeedleTree = tuple[str, tuple["str | _NeedleTree", ...]]
_SHAPE_NEEDLE_TREE: tuple[str | _NeedleTree, ...] = (
    "sk-",
    ("x", ("xox", "xapp-")),
    ("_", ("hf_", "github_pat_", ("gh", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")))),
    ("A", ("AKIA", "ASIA", "PRIVATE KEY-----")),
)


def secret_looking(name: str, value: str) -> bool:
    """Is this environment variable a secret by its name, with a value that could be one?"""
    upper = name.upper()
    return (
        upper not in OUR_SETTINGS and any(word in upper for word in SECRET_WORDS) and _could_be_secret(value)
    )


def _could_be_secret(value: str) -> bool:
    value = value.strip()
    if len(value) < MIN_SECRET_LENGTH or _NUMBER.fullmatch(value):
        return False
    if value.startswith(("/", "~")) and "\n" not in value:
        try:
            return not Path(value).expanduser().exists()
        except (OSError, RuntimeError, ValueError):  # ~nobody, a name too long: not a file
            return True
    return True


def configured_secrets(settings: RunnerSettings, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(label, value) for every secret the settings name, then every secret-looking variable."""
    found: list[tuple[str, str]] = []
    for entry in settings.secrets:
        if "/" in entry:
            path = Path(entry).expanduser()
            try:
                text = path.read_text(errors="replace").strip()
            except OSError as exc:
                log.warning("secret file %s cannot be read (%s); it is not redacted", path, exc)
                continue
            found.append((path.name, text))
            found.extend((path.name, line.strip()) for line in text.splitlines())
        elif value := environ.get(entry, "").strip():
            found.append((entry, value))
    found.extend((name, value.strip()) for name, value in environ.items() if secret_looking(name, value))
    return [(label, value) for label, value in found if len(value) >= MIN_SECRET_LENGTH]


def agent_safe(env: Mapping[str, str], settings: RunnerSettings) -> dict[str, str]:
    """`env` without the runner's and the bot's secrets, except the variables granted to goals."""
    granted = set(settings.grants)
    named = {entry for entry in settings.secrets if "/" not in entry}
    return {
        name: value
        for name, value in env.items()
        if name in granted
        or not (name.startswith(NEVER_GRANTED_BY_DEFAULT) or name in named or secret_looking(name, value))
    }


class Redactor:
    """Replaces known secret values and token shapes in text and in encoded NDJSON lines."""

    def __init__(self, secrets: Iterable[tuple[str, str]] = ()):
        values: dict[str, str] = {}  # value -> label; the first label named for a value wins
        for label, value in secrets:
            if len(value) >= MIN_SECRET_LENGTH:
                values.setdefault(value, _LABEL_CHARS.sub("_", label))
        self._markers = {value: _marker(label, values) for value, label in values.items()}
        self._shape_marker = _marker("", values)
        longest_first = sorted(values, key=len, reverse=True)
        literals = [re.escape(value) for value in longest_first]
        self._text = re.compile("|".join(literals + [guarded for _, guarded in _SHAPES]), re.DOTALL)
        encoded = sorted({form for value in values for form in _encoded_forms(value)}, key=len, reverse=True)
        self._line = re.compile(
            b"|".join([re.escape(form) for form in encoded] + [core.encode() for core, _ in _SHAPES])
        )
        self._pieces = [value for value in longest_first if len(value) > MIN_EDGE_PIECE]
        self._needles = _Needles(longest_first)
        # The same secrets over bytes, for where a log may be cut (`uncut`).
        self._bytes = re.compile(
            b"|".join(
                [re.escape(_as_bytes(value)) for value in longest_first] + [g.encode() for _, g in _SHAPES]
            ),
            re.DOTALL,
        )
        self._escaped = re.compile(b"|".join(re.escape(form) for form in encoded)) if encoded else None
        #: Bytes a secret may span on either side of a point: `uncut` looks that far around it.
        self.reach = max([SHAPE_REACH, *(len(_as_bytes(value)) for value in longest_first)])
        self._line_needles = _Needles(encoded, encode=True)

    @classmethod
    def from_settings(cls, settings: RunnerSettings, environ: Mapping[str, str] | None = None) -> Redactor:
        return cls(configured_secrets(settings, os.environ if environ is None else environ))

    def redact(self, text: str) -> str:
        """`text` with every secret replaced; the same object back when there is none."""
        if len(text) > NEEDLE_CHECK_FROM and not self._needles.in_(text):
            return text
        if self._text.search(text):
            text = self._text.sub(self._replace, text)
        if "PRIVATE KEY-----" in text:
            text = _HEADLESS_KEY.sub(self._shape_marker, text)
        return text

    def redact_line(self, line: bytes) -> bytes:
        """One encoded NDJSON message (newline included) with every secret in its strings replaced."""
        if len(line) > NEEDLE_CHECK_FROM and not self._line_needles.in_(line):
            return line
        if not self._line.search(line):
            return line
        try:
            message = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):  # not ours to repair: fail closed
            text = self.redact(line.decode(errors="replace")).encode()
            return self._line.sub(self._shape_marker.encode(), text)
        redacted = self._walk(message)
        if redacted == message:  # a near miss (an escaped form without the secret): leave it be
            return line
        return json.dumps(redacted, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    def redact_edges(self, text: str) -> str:
        """`text` also without a piece of a secret at either edge (a chunk of a log cut mid-secret)."""
        text = self.redact(text)
        for value in self._pieces:
            for size in range(len(value) - 1, MIN_EDGE_PIECE - 1, -1):
                if text.startswith(value[-size:]):
                    text = self._markers[value] + text[size:]
                    break
            for size in range(len(value) - 1, MIN_EDGE_PIECE - 1, -1):
                if text.endswith(value[:size]):
                    text = text[:-size] + self._markers[value]
                    break
        return text

    def redact_edges_utf8(self, data: bytes) -> bytes:
        """A chunk of UTF-8 (a log's bytes) as `redact_edges` leaves its text (read with errors
        replaced), encoded again; `data` itself when that changes nothing. Where Hyperscan reads the
        bytes, ASCII `data` (most logs) is checked as it is and never decoded."""
        if self._needles.scans_bytes and data.isascii() and not self._needles.in_(data):
            if not self._pieces:
                return data
            reach = max(map(len, self._pieces))
            if len(data) > 2 * reach and not self._edge_piece(data[:reach].decode(), data[-reach:].decode()):
                return data
        return self.redact_edges(data.decode(errors="replace")).encode()

    def redact_file(self, data: bytes) -> bytes:
        """A file's bytes (an artifact: JSON, an image) with every secret replaced, as it is or
        JSON-escaped; nothing else of it changes (it is not decoded), so a file without one
        comes back as it was."""
        if not self._line_needles.in_(data):
            return data
        data = self._bytes.sub(
            lambda match: self._markers.get(
                match.group(0).decode(errors="surrogatepass"), self._shape_marker
            ).encode(),
            data,
        )
        return self._escaped.sub(self._shape_marker.encode(), data) if self._escaped else data

    def uncut(self, around: bytes, at: int) -> int:
        """Where a log chunk cut at `at` of `around` (the bytes `reach` either side of it) is to be
        cut so that no secret, a known value or a token shape, is cut in two: `at`, or the end of
        the secret it falls inside. A chunk ends there and the next starts there, whatever offsets
        and sizes are asked for (a chunk wholly inside a secret is then empty): no piece of one is
        ever sent on its own, where redaction could not know it for one."""
        # The line needles hold every secret's raw bytes (among its escaped forms) and the shapes'.
        if 0 < at < len(around) and self._line_needles.in_(around):
            for match in self._bytes.finditer(around):
                if match.start() >= at:
                    break
                if match.end() > at:
                    return match.end()
        return at

    def _edge_piece(self, head: str, tail: str) -> bool:
        """Could redact_edges find a piece of a secret at the start of `head` or the end of `tail`?"""
        return any(
            head.startswith(value[-size:]) or tail.endswith(value[:size])
            for value in self._pieces
            for size in range(MIN_EDGE_PIECE, len(value))
        )

    def _replace(self, match: re.Match[str]) -> str:
        return self._markers.get(match.group(0), self._shape_marker)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self._walk(item) for item in value]
        if isinstance(value, dict):
            return {self.redact(key): self._walk(item) for key, item in value.items()}
        return value


class _Needles:
    """The needles of a Redactor (its secrets' values, or their encoded forms, and the shapes'
    literals, _SHAPE_NEEDLE_TREE); `in_(haystack)` says whether any is in it.

    With Hyperscan installed, every needle is looked for in one pass over the haystack's UTF-8
    (several GB/s: a log chunk checks at memory speed, whatever letters it holds); without it, `in`
    looks for each needle in turn, shared pieces first. UTF-8 is self-synchronising, so a needle is
    in a text exactly when its encoding is in the text's encoding: both say the same."""

    def __init__(self, values: Iterable[Any], *, encode: bool = False):
        def form(node: str | _NeedleTree) -> Any:
            if isinstance(node, str):
                return node.encode() if encode else node
            piece, members = node
            return (form(piece), tuple(form(member) for member in members))

        self.tree = (*values, *(form(node) for node in _SHAPE_NEEDLE_TREE))
        self._scanner = _LiteralScanner.of(_as_bytes(needle) for needle in _leaves(self.tree))

    @property
    def scans_bytes(self) -> bool:
        """Does in_() take bytes for a text's needles (as their UTF-8)?"""
        return self._scanner is not None

    def in_(self, haystack: Any) -> bool:
        if self._scanner is not None:
            return self._scanner.finds_any(_as_bytes(haystack))
        return _any_in(self.tree, haystack)


def _leaves(nodes: tuple[Any, ...]) -> Iterator[Any]:
    for node in nodes:
        if isinstance(node, tuple):
            yield from _leaves(node[1])
        else:
            yield node


def _as_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode(errors="surrogatepass")


def _any_in(nodes: tuple[Any, ...], haystack: Any) -> bool:
    return any(
        node in haystack
        if not isinstance(node, tuple)
        else node[0] in haystack and _any_in(node[1], haystack)
        for node in nodes
    )


class _LiteralScanner:
    """Hyperscan over a set of byte strings: does a block hold any of them?"""

    def __init__(self, database: Any):
        self._database = database
        self._scratch = threading.local()  # a scan's scratch space is used by one thread at a time

    @classmethod
    def of(cls, needles: Iterable[bytes]) -> _LiteralScanner | None:
        """A scanner for `needles`, or None where Hyperscan is not installed or cannot run here."""
        if hyperscan is None:
            return None
        literals = sorted(set(needles))
        # As patterns of escaped bytes: Hyperscan's regex compiler scans a set of literals faster
        # (4.9 GB/s on a training log here) than its literal compiler does (3.2); the literal one
        # is the fallback, for a needle the regex compiler will not take.
        patterns = [b"".join(b"\\x%02x" % byte for byte in literal) for literal in literals]
        error: Exception | None = None
        for expressions, literal in ((patterns, False), (literals, True)):
            try:
                database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
                database.compile(
                    expressions=expressions,
                    ids=list(range(len(expressions))),
                    flags=hyperscan.HS_FLAG_SINGLEMATCH,
                    literal=literal,
                )
            except hyperscan.HyperscanError as exc:  # e.g. a CPU without the instructions it needs
                error = exc
                continue
            return cls(database)
        log.warning("Hyperscan cannot compile the redaction needles (%s); using str search", error)
        return None

    def finds_any(self, data: bytes) -> bool:
        scratch = getattr(self._scratch, "space", None)
        if scratch is None:
            scratch = self._scratch.space = hyperscan.Scratch(self._database)
        try:
            self._database.scan(data, match_event_handler=_stop_at_first, scratch=scratch)
        except hyperscan.ScanTerminated:
            return True
        return False


def _stop_at_first(*match: object) -> bool:
    return True  # a true answer ends the scan: one match is enough


def _encoded_forms(value: str) -> set[bytes]:
    """How `value` can appear in an encoded line: as is, and escaped the ways JSON encoders escape it."""
    forms = {value.encode(errors="surrogatepass"), json.dumps(value)[1:-1].encode()}
    forms.add(json.dumps(value, ensure_ascii=False)[1:-1].encode(errors="surrogatepass"))
    with contextlib.suppress(pydantic_core.PydanticSerializationError):  # a lone surrogate
        forms.add(pydantic_core.to_json(value)[1:-1])
    return forms


def _marker(label: str, values: Iterable[str]) -> str:
    """The first replacement text that contains none of the secrets (a secret 'redacted' is possible)."""
    for template in _MARKERS if label else _MARKERS[1:]:
        marker = template.format(label=label)
        if not any(value in marker for value in values):
            return marker
    return ""


def url_shown(url: str) -> str:
    """`url` without any user:password@ in it: an endpoint may carry its credentials."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))
