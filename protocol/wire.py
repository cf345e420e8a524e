"""The wire's JSON profile: what one request line may hold before any protocol model looks at it.

Python's json.loads accepts more than the runner can carry safely, and each excess used to surface
far from the socket: NaN and ±Infinity (stored as null, so the event later failed to read back and
stalled every subscriber), integers past SQLite's 64 bits (an OverflowError deep in a handler) or
past Python's 4,300-digit conversion limit (a ValueError), nesting deep enough to exhaust the
recursion limit, and `\\ud800`-style escapes that decode to lone surrogates (valid JSON, but no
text at all: a reply echoing one cannot be encoded). All of these are refused here, while the line
is parsed, so the models in protocol/messages.py only ever see UTF-8 text, finite floats, 64-bit
integers and shallow structures (much like I-JSON, RFC 7493). A refused line still gets its error
reply, echoing the request's id when that id is itself safe to echo.
"""

from __future__ import annotations

import json
import math
import re

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from typing import Any

# The protocol's own constants live here, free of pydantic, for protocol/quick_client.py too.
PROTOCOL_VERSION = 1
MAX_LINE = 1024 * 1024  # bytes, newline included
MAX_POINTS = 10_000  # metric points in one log_metrics request

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_DEPTH = 32  # a request is a few levels deep; experiment params get the rest
MAX_ID_CHARS = 200  # a request id is echoed in every reply, so it stays short

_INT64_DIGITS = len(str(INT64_MAX))
_SURROGATE = re.compile("[\ud800-\udfff]")
_SCALARS = (int, float, bool, type(None))


class LineRefused(ValueError):
    """A line outside the profile; `message` (and the id, when safe) go into its `bad_json` reply."""

    def __init__(self, message: str, request_id: int | str | None = None):
        super().__init__(message)
        self.message = message
        self.request_id = request_id


class _Unfit:
    """A number json.loads met that the profile refuses; kept in place so the whole object is
    still parsed (and its id echoed) before the line is refused."""

    def __init__(self, why: str):
        self.why = why


def decode_object(line: bytes) -> dict[str, Any]:
    """One line as a JSON object within the profile; raises LineRefused saying what is wrong."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LineRefused(f"not UTF-8: {exc}") from None
    try:
        raw = json.loads(text, parse_int=_int64, parse_float=_finite_float, parse_constant=_no_constant)
    except RecursionError:  # the C decoder's own guard, far deeper than MAX_DEPTH
        raise LineRefused(f"nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as exc:
        raise LineRefused(f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise LineRefused(f"a message must be a JSON object, not {json_type(raw)}")
    request_id = safe_id(raw.get("id"))
    for key, value in raw.items():
        if problem := _text_problem(key) or _problem(value, depth=2):
            raise LineRefused(f"{_field_name(key)}: {problem}", request_id)
    return raw


def safe_id(value: object) -> int | str | None:
    """`value` if it may be echoed as a reply's id: a 64-bit integer or a short, valid string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if INT64_MIN <= value <= INT64_MAX else None
    if isinstance(value, str) and len(value) <= MAX_ID_CHARS and _text_problem(value) is None:
        return value
    return None


def json_type(value: object) -> str:
    """What a decoded JSON value is, in JSON's words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, _Unfit | int | float):
        return "a number"
    names = {str: "a string", list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _problem(value: Any, depth: int) -> str | None:
    """What makes `value` (at nesting level `depth`) fall outside the profile, if anything."""
    if isinstance(value, _SCALARS):
        return None
    if isinstance(value, str):
        return _text_problem(value)
    if isinstance(value, _Unfit):
        return value.why
    if depth > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, dict):
        for key, item in value.items():
            if problem := _text_problem(key) or _problem(item, depth + 1):
                return problem
    else:  # a list: the only container left
        for item in value:
            if not isinstance(item, _SCALARS) and (problem := _problem(item, depth + 1)):
                return problem
    return None


def _text_problem(text: str) -> str | None:
    # Only a \udXXX escape with no partner makes a surrogate: raw bytes were strict UTF-8.
    if text.isascii() or not (found := _SURROGATE.search(text)):
        return None
    return f"a lone surrogate (\\u{ord(found.group()):04x}) is no text; strings must be valid Unicode"


def _field_name(key: str) -> str:
    return repr(key[:40]) if _text_problem(key) is None else "a field name"


def _int64(digits: str) -> int | _Unfit:
    if len(digits.lstrip("-")) <= _INT64_DIGITS and INT64_MIN <= (value := int(digits)) <= INT64_MAX:
        return value
    shown = digits if len(digits) <= 30 else f"{digits[:12]}…({len(digits)} digits)"
    return _Unfit(f"integer {shown} is outside the signed 64-bit range")


def _finite_float(digits: str) -> float | _Unfit:
    value = float(digits)
    if math.isfinite(value):
        return value
    return _Unfit(f"number {digits[:30]} is too large for a 64-bit float")


def _no_constant(name: str) -> _Unfit:
    return _Unfit(f"{name} is not a JSON number; numbers must be finite")
