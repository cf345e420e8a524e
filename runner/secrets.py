r"""Secrets stay on the box: what the runner sends is redacted, and agents get no secret they were not granted.

A Redactor knows four kinds of secret:

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
  blocks, whole or cut short;
- the credentials of any URL (`scheme://user:password@host`): the userinfo goes, whoever wrote the
  URL (a mirror's address in HF_ENDPOINT, quoted by a library's retry line), and the password of a
  URL in any environment variable is a known value besides (HTTP_PROXY, a database URL).

A known value becomes `[redacted:NAME]`, a shape or a URL's userinfo `[redacted]`. `redact(text)`
works on plain text; `redact_line(line)` on one encoded NDJSON message: a single compiled
alternation of every value's JSON-escaped forms and the shapes' cores looks for anything to do (and
a check for a backslash, a %XX or a `://…@`), and a line with no hit passes through byte-identical;
a line with a hit is decoded, every string in it (keys too) redacted, and encoded again — so a
replacement never lands inside an escape sequence or breaks the JSON. A secret is caught whole; a
piece of one (a log chunk cut mid-token) is caught at a text's edges by `redact_edges`.

Redaction works on the text as its reader decodes it. Besides the text as it is, every text is
looked through decoded once: each JSON string escape (a \uXXXX, a surrogate pair, \/, \") and each
percent-escape (%2F) read as what it stands for — the bot decodes an artifact's JSON before posting
it, a model reads escapes as the letters they are, a link is followed decoded. A secret found there
is replaced in the text itself, escapes and all, so a text without one is left as it was, byte for
byte. An agent set on hiding a secret it was granted can always encode it further (base64,
reversed): redaction keeps secrets from leaking as they are written and quoted, not from an agent
that hides them on purpose (the secrets it is not granted, it never has).

The guarantee holds for secrets of 8 characters or more that contain no '[' or ']' (they could
otherwise be re-formed around a replacement marker).

`agent_safe(env, settings)` is the environment agents, experiments and eval commands start from:
the runner's, minus every variable the Redactor treats as secret, every SLACK_* variable and the
configured secrets — except the names in `GOALTENDER_GRANTS` (granted values are still redacted on
the way out).

One module past 600 lines on purpose: every way a secret is written (as it is, JSON-escaped,
percent-escaped, quoted twice) must be known the same way to the needle check, the regexes, the
decoded readings and `uncut`; apart, a form added to one and not the others would leak. What stands
alone, the Hyperscan pass, is runner/literal_scan.py.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import logging
import os
import re
import sys
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pydantic_core

from goaltender.runner.config import RunnerSettings
from goaltender.runner.literal_scan import LiteralScanner

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
_HEADLESS_KEY_BYTES = re.compile(_HEADLESS_KEY.pattern.encode())
_MARKERS = ("[redacted:{label}]", "[redacted]", "[secret]", "***")
# A URL's userinfo: after `://`, up to the authority's last '@' (a password may hold one unescaped).
# Neither '/', '?', '#', whitespace nor what cannot be in a URL at all ('"', '<', '>', '\\') is in it.
_USERINFO = re.compile(r"://([^\s/?#\"<>\\]*@)")
_USERINFO_BYTES = re.compile(_USERINFO.pattern.encode())
# What readers decode, one escape at a time. JSON's: a surrogate pair, a \uXXXX, a one-letter
# escape; a URL's: %XX. Each reader decodes its own kind only.
_JSON_ESCAPE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|\\[\"\\/bfnrt]"
)
_PERCENT_ESCAPE = re.compile(rb"%[0-9a-fA-F]{2}")
_ESCAPE = re.compile(_JSON_ESCAPE.pattern + b"|" + _PERCENT_ESCAPE.pattern)  # either kind
_ESCAPE_TEXT = re.compile(_ESCAPE.pattern.decode())
# Every JSON escape starts with one of these: a text without them holds none.
_JSON_ESCAPE_STARTS = [b"\\" + letter for letter in (b"u", b'"', b"/", b"\\", b"b", b"f", b"n", b"r", b"t")]
_ONE_LETTER = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b", ord("f"): b"\f",
               ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}  # fmt: skip
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The chunks that make a PNG's picture: the critical ones and those that only say how to show it.
_PNG_PICTURE = frozenset(
    {b"IHDR", b"PLTE", b"IDAT", b"IEND", b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"sBIT", b"pHYs", b"bKGD"}
)
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
    """(label, value) for every secret the settings name, then every secret the environment holds
    (environment_secrets)."""
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
    found.extend(environment_secrets(environ))
    return [(label, value) for label, value in found if len(value) >= MIN_SECRET_LENGTH]


def environment_secrets(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(name, value) of every secret-looking variable, and (name, password) of every URL with a
    password in any variable (HF_ENDPOINT=https://user:password@mirror, HTTP_PROXY): the password
    is redacted wherever it turns up, not only inside its URL."""
    found = [(name, value.strip()) for name, value in environ.items() if secret_looking(name, value)]
    for name, value in environ.items():
        if "@" in value and "://" in value:
            for match in _USERINFO.finditer(value):
                password = match.group(1)[:-1].partition(":")[2]
                found += [(name, password), (name, urllib.parse.unquote(password))]
    return [(name, value) for name, value in found if len(value) >= MIN_SECRET_LENGTH]


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
    """Replaces known secret values, token shapes and URLs' credentials in text (as it is and as it
    decodes) and in encoded NDJSON lines."""

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
        # The same secrets over bytes: a file's, a decoded view's, and where a log may be cut (`uncut`).
        # Their escaped forms too, found as they are: after a stray backslash (`\\` then `\ud800…`)
        # no JSON reading decodes them, yet a reader that starts one byte on would.
        self._bytes = re.compile(
            b"|".join([re.escape(form) for form in encoded] + [g.encode() for _, g in _SHAPES]),
            re.DOTALL,
        )
        self._byte_markers = {
            form: self._markers[value].encode() for value in longest_first for form in _encoded_forms(value)
        }
        #: Bytes a secret may span on either side of a point: `uncut` looks that far around it. A
        #: secret written with an escape for each character spans up to six times its length.
        self.reach = max([SHAPE_REACH, *(6 * len(_as_bytes(value)) for value in longest_first)])
        self._line_needles = _Needles(encoded, encode=True)

    @classmethod
    def from_settings(cls, settings: RunnerSettings, environ: Mapping[str, str] | None = None) -> Redactor:
        return cls(configured_secrets(settings, os.environ if environ is None else environ))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """The redactor of a process that has no runner settings (`goaltender fetch`, an agent):
        the token shapes, URLs' credentials and the secrets its environment holds."""
        return cls(environment_secrets(os.environ if environ is None else environ))

    def redact(self, text: str) -> str:
        """`text` with every secret replaced, as it is and as it decodes; the same object back
        when there is none."""
        if len(text) > NEEDLE_CHECK_FROM and not self._chunk_may_hold(_as_bytes(text)):
            return text  # a long text with nothing to look at (one Hyperscan pass, or a few)
        if ("\\" in text or "%" in text) and _escaped(text):
            data = _as_bytes(text)
            redacted = self._redact_bytes(data)
            return text if redacted is data else redacted.decode(errors="surrogatepass")
        if len(text) <= NEEDLE_CHECK_FROM or self._needles.in_(text):
            if self._text.search(text):
                text = self._text.sub(self._replace, text)
            if "PRIVATE KEY-----" in text:
                text = _HEADLESS_KEY.sub(self._shape_marker, text)
        if "@" in text and "://" in text:
            text = _USERINFO.sub(self._userinfo_marker, text)
        return text

    def redact_line(self, line: bytes) -> bytes:
        """One encoded NDJSON message (newline included) with every secret in its strings replaced."""
        if not self._line_may_hold(line):
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
        if self._needles.scans_bytes and data.isascii() and not self._chunk_may_hold(data):
            if not self._pieces:
                return data
            reach = max(map(len, self._pieces))
            if len(data) > 2 * reach and not self._edge_piece(data[:reach].decode(), data[-reach:].decode()):
                return data
        return self.redact_edges(data.decode(errors="replace")).encode()

    def _chunk_may_hold(self, data: bytes) -> bool:
        """Could these bytes hold a secret: a needle, an escape a reader decodes, a URL's
        credentials? Each check looks for a byte or a few literals first: a training log's chunk
        passes at memory speed."""
        if self._chunk_scanner is None:
            return self._needles.in_(data) or _escaped(data) or _in_a_url(data)
        return self._chunk_scanner.finds_any(data) or _percent_escaped(data) or _in_a_url(data)

    @functools.cached_property
    def _chunk_scanner(self) -> LiteralScanner | None:
        """The needles and where a JSON escape may start, in one Hyperscan database."""
        return LiteralScanner.of(
            [*(_as_bytes(needle) for needle in _leaves(self._needles.tree)), *_JSON_ESCAPE_STARTS]
        )

    def redact_file(self, data: bytes) -> bytes:
        """A file's bytes (an artifact: JSON, an image) with every secret replaced, as it is or as
        it decodes (JSON escapes, %XX), escapes and all; nothing else of it changes (it is not
        parsed), so a file without one comes back as it was, and JSON stays JSON. A PNG keeps only
        its picture: its text chunks (compressed ones too) are nobody's to read."""
        return self._redact_bytes(png_picture_only(data))

    def uncut(self, around: bytes, at: int) -> int:
        """Where a log chunk cut at `at` of `around` (the bytes `reach` either side of it) is to be
        cut so that no secret, a known value, a token shape or a URL's userinfo, as it is or
        escaped, is cut in two: `at`, or the end of the secret it falls inside. A chunk ends there
        and the next starts there, whatever offsets and sizes are asked for (a chunk wholly inside
        a secret is then empty): no piece of one is ever sent on its own, where redaction could
        not know it for one."""
        if not 0 < at < len(around):
            return at
        spans = self._secret_spans(around)
        while (moved := max((end for start, end, _ in spans if start < at < end), default=at)) != at:
            at = moved  # (the end of one may fall inside another that overlaps it)
        return at

    def _redact_bytes(self, data: bytes) -> bytes:
        """`data` with every secret replaced; `data` itself when there is none."""
        return _spliced(data, self._secret_spans(data))

    def _secret_spans(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """(start, end, marker) of every secret in `data`: as it is, as a JSON reader decodes it
        (once, or twice: JSON text that quotes JSON), as a URL's reader does, and as a URL inside
        JSON decodes. A span never starts or ends inside an escape (what replaces it leaves JSON
        JSON)."""
        spans = self._found(data)
        readings: list[_Decoded | _Composed] = []
        if (as_json := _Decoded.of(data, _JSON_ESCAPE, b"\\")) is not None:
            readings.append(as_json)
            for escape, starts in ((_JSON_ESCAPE, b"\\"), (_PERCENT_ESCAPE, b"%")):
                if (inner := _Decoded.of(as_json.view, escape, starts)) is not None:
                    readings.append(_Composed(as_json, inner))
        if (as_url := _Decoded.of(data, _PERCENT_ESCAPE, b"%")) is not None:
            readings.append(as_url)
        for decoded in readings:
            spans += [
                (*decoded.origin(start, end), marker) for start, end, marker in self._found(decoded.view)
            ]
        for decoded in readings:  # (JSON's escapes and a URL's never overlap: once is enough)
            spans = [(*decoded.widened(start, end), marker) for start, end, marker in spans]
        return spans

    def _found(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """(start, end, marker) of every secret in `data` as it is."""
        found: list[tuple[int, int, bytes]] = []
        # The line needles hold every secret's raw bytes (among its escaped forms) and the shapes':
        # looking for them first is far cheaper than the regular expression (a log's edges, a file).
        if self._line_needles.in_(data):
            found += [(m.start(), m.end(), self._byte_marker(m)) for m in self._bytes.finditer(data)]
            if b"PRIVATE KEY-----" in data:
                found += self._headless_key_spans(data)
        if b"@" in data and b"://" in data:
            found += self._userinfo_spans(data)
        return found

    def _headless_key_spans(self, data: bytes) -> list[tuple[int, int, bytes]]:
        marker = self._shape_marker.encode()
        return [(m.start(), m.end(), marker) for m in _HEADLESS_KEY_BYTES.finditer(data)]

    def _userinfo_spans(self, data: bytes) -> list[tuple[int, int, bytes]]:
        # From the `://` on: userinfo is known for one only after it (so a log is not cut there).
        marker = b"://" + self._shape_marker.encode() + b"@"
        return [(m.start(), m.end(), marker) for m in _USERINFO_BYTES.finditer(data)]

    def _userinfo_marker(self, match: re.Match[str]) -> str:
        return "://" + self._shape_marker + "@"

    def _byte_marker(self, match: re.Match[bytes]) -> bytes:
        return self._byte_markers.get(match.group(0), self._shape_marker.encode())

    def _line_may_hold(self, line: bytes) -> bool:
        """Could a string of this encoded line hold a secret: as it is, escaped (a backslash in a
        string is two in the line), percent-encoded, or as a URL's credentials? A long line (a log
        chunk's text) is looked through in one Hyperscan pass first."""
        if (
            len(line) > NEEDLE_CHECK_FROM
            and self._line_scanner is not None
            and not self._line_scanner.finds_any(line)
            and not _percent_escaped(line)
            and not _in_a_url(line)
        ):
            return False
        if (
            (b"\\" in line and b"\\\\" in line)
            or (b"%" in line and _percent_escaped(line))
            or (b"@" in line and _in_a_url(line))
        ):
            return True
        if len(line) > NEEDLE_CHECK_FROM and not self._line_needles.in_(line):
            return False
        return self._line.search(line) is not None

    @functools.cached_property
    def _line_scanner(self) -> LiteralScanner | None:
        """The line needles and an escaped backslash, in one Hyperscan database."""
        return LiteralScanner.of([*_leaves(self._line_needles.tree), b"\\\\"])

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


class _Decoded:
    """Bytes with each of its escapes of one kind (JSON's or a URL's) decoded, once: `view`, and
    for any span of it the span of the original it came from (an escape's whole sequence, never
    a part of one)."""

    @classmethod
    def of(cls, data: bytes, escape: re.Pattern[bytes], start: bytes) -> _Decoded | None:
        """`data` decoded, or None when it holds no such escape (`start` begins every one)."""
        if start not in data:
            return None
        escapes = list(escape.finditer(data))
        return cls(data, escapes) if escapes else None

    def __init__(self, data: bytes, escapes: list[re.Match[bytes]]):
        pieces: list[bytes] = []
        self._units: list[tuple[int, int, int, int]] = []  # (view start, view end, start, end)
        done = 0  # of data
        size = 0  # of the view
        for escape in escapes:
            pieces.append(data[done : escape.start()])
            size += escape.start() - done
            text = _unescaped(escape.group(0))
            self._units.append((size, size + len(text), escape.start(), escape.end()))
            pieces.append(text)
            size += len(text)
            done = escape.end()
        pieces.append(data[done:])
        self.view = b"".join(pieces)
        self._starts = [unit[0] for unit in self._units]
        self._origins = [unit[2] for unit in self._units]

    def origin(self, start: int, end: int) -> tuple[int, int]:
        """The span of the original that bytes [start, end) of the view (end > start) came from."""
        return self._byte(start)[0], self._byte(end - 1)[1]

    def widened(self, start: int, end: int) -> tuple[int, int]:
        """Span [start, end) of the original, grown to whole escapes where it cuts one."""
        return self._escape_around(start)[0], self._escape_around(end - 1)[1]

    def _escape_around(self, at: int) -> tuple[int, int]:
        """The escape byte `at` of the original is part of (start, end), or (at, at + 1)."""
        index = bisect.bisect_right(self._origins, at) - 1
        if index >= 0 and at < self._units[index][3]:
            return self._units[index][2], self._units[index][3]
        return at, at + 1

    def _byte(self, at: int) -> tuple[int, int]:
        index = bisect.bisect_right(self._starts, at) - 1
        if index < 0:
            return at, at + 1
        _, view_end, start, end = self._units[index]
        if at < view_end:
            return start, end
        return at - view_end + end, at - view_end + end + 1


class _Composed:
    """Two decodings one after the other (JSON in JSON, a URL in JSON): `inner` decodes `outer`'s
    view."""

    def __init__(self, outer: _Decoded, inner: _Decoded):
        self.outer, self.inner, self.view = outer, inner, inner.view

    def origin(self, start: int, end: int) -> tuple[int, int]:
        return self.outer.origin(*self.inner.origin(start, end))

    def widened(self, start: int, end: int) -> tuple[int, int]:
        return self.outer.widened(start, end)  # spans of the original: the outer one's escapes


def _unescaped(escape: bytes) -> bytes:
    """What one _ESCAPE match stands for, as UTF-8 (a lone surrogate as its own three bytes)."""
    if escape[0] == 0x25:  # %XX
        return bytes([int(escape[1:], 16)])
    if len(escape) == 2:
        return _ONE_LETTER[escape[1]]
    code = int(escape[2:6], 16)
    if len(escape) == 12:  # a surrogate pair
        code = 0x10000 + ((code - 0xD800) << 10) + (int(escape[8:12], 16) - 0xDC00)
    return chr(code).encode(errors="surrogatepass")


def _spliced(data: bytes, spans: list[tuple[int, int, bytes]]) -> bytes:
    """`data` with each span (start, end, replacement) replaced; spans that overlap are one, with
    the first one's replacement. `data` itself when there are none."""
    if not spans:
        return data
    out: list[bytes] = []
    done = 0
    for start, end, replacement in sorted(spans):
        if start < done:  # overlaps the one before
            if end > done:
                done = end
            continue
        out += [data[done:start], replacement]
        done = end
    out.append(data[done:])
    return b"".join(out)


def png_picture_only(data: bytes) -> bytes:
    """A well-formed PNG without the chunks that are not its picture: tEXt, zTXt and iTXt (zlib
    hides a secret from any byte search), eXIf, iCCP, private ones, and anything after IEND.
    Anything else (not a PNG, or not a well-formed one) comes back as it was."""
    if not data.startswith(_PNG_SIGNATURE):
        return data
    kept = [_PNG_SIGNATURE]
    at = len(_PNG_SIGNATURE)
    while at + 12 <= len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        kind, end = data[at + 4 : at + 8], at + 12 + size
        if end > len(data):
            return data
        if kind in _PNG_PICTURE:
            kept.append(data[at:end])
        if kind == b"IEND":
            picture = b"".join(kept)
            return data if picture == data else picture
        at = end
    return data


def _escaped(data: str | bytes) -> bool:
    """Does `data` hold an escape a reader decodes (JSON's, a URL's %XX)? A long one is looked
    through by Hyperscan where it is installed (the regular expression steps through every byte)."""
    if len(data) <= NEEDLE_CHECK_FROM or (scanners := _escape_scanners()) is None:
        found = _ESCAPE_TEXT.search(data) if isinstance(data, str) else _ESCAPE.search(data)
        return found is not None
    data = _as_bytes(data)
    return scanners[0].finds_any(data) or _percent_escaped(data)


def _percent_escaped(data: bytes) -> bool:
    """Does `data` hold a %XX? (A '%' alone, as in a progress bar's 45%|, is none.)"""
    if b"%" not in data:
        return False
    if len(data) <= NEEDLE_CHECK_FROM or (scanners := _escape_scanners()) is None:
        return _PERCENT_ESCAPE.search(data) is not None
    return scanners[1].finds_any(data)


def _in_a_url(data: bytes) -> bool:
    """Does `data` hold a URL's credentials (scheme://…@)?"""
    return b"@" in data and b"://" in data and _USERINFO_BYTES.search(data) is not None


@functools.cache
def _escape_scanners() -> tuple[LiteralScanner, LiteralScanner] | None:
    """Hyperscan for where a JSON escape may start, and for %XX (None: not here)."""
    json_starts = LiteralScanner.of(_JSON_ESCAPE_STARTS)
    percent = LiteralScanner.of_expressions([_PERCENT_ESCAPE.pattern])
    return (json_starts, percent) if json_starts is not None and percent is not None else None


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
        self._scanner = LiteralScanner.of(_as_bytes(needle) for needle in _leaves(self.tree))

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


class RedactedStream:
    """A text stream (a process's stdout or stderr) whose every write is redacted: a print, a log
    record, a line of a traceback each come in one write."""

    def __init__(self, stream: Any, redactor: Redactor):
        self.stream = stream
        self.redactor = redactor

    def write(self, text: str) -> int:
        self.stream.write(self.redactor.redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def redact_output(redactor: Redactor) -> None:
    """From now on, what this process writes to sys.stdout and sys.stderr is redacted: its own
    lines, and what libraries write there (huggingface_hub's retry lines quote the URL they ask,
    credentials and all; log handlers made from now on write to the redacted stream), warnings
    and tracebacks. Nothing depends on each message remembering url_shown."""
    sys.stdout = RedactedStream(sys.stdout, redactor)
    sys.stderr = RedactedStream(sys.stderr, redactor)


def url_shown(url: str) -> str:
    """`url` without any user:password@ in it: an endpoint may carry its credentials."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))
