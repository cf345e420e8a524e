"""Metric points for `goaltender metrics`: read from NAME=VALUE pairs or JSON lines, and sent as
log_metrics requests of JSON text, at most MAX_POINTS and one line each. A plain point's line is
sent as it came (the runner reads the same point from it): neither pydantic nor encoding it again
costs the verb's process anything (issue 13); only another line goes through MetricPoint."""

from __future__ import annotations

import argparse
import json
import math

from goaltender.cli.common import UsageError, finite
from goaltender.protocol.quick_client import encode
from goaltender.protocol.wire import INT64_MAX, INT64_MIN, MAX_LINE, MAX_POINTS

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def metric_value(name: str, text: str) -> float:
    try:
        return finite(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"metric {name[:40]!r}: {exc}") from None


_JSON = json.JSONDecoder(parse_constant=_no_constant)  # one for every line: json.loads makes one a call


def points_from_lines(text: str, step: float | None) -> list[str]:
    """The points of JSON lines `{"name": …, "value": …, "step": …}`, each as JSON text; blank lines
    are skipped. `step` (--step) is the step of lines that give none."""
    points = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            fields = _decode(line)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"line {number}: not a JSON object: {str(exc)[:80]}") from None
        if not isinstance(fields, dict):
            raise UsageError(f'line {number}: expected an object like {{"name": "loss", "value": 0.3}}')
        if "step" in fields or step is None:
            points.append(line if _is_plain_point(fields) else _validated_point(fields, number))
        else:
            fields["step"] = step
            points.append(encode(fields) if _is_plain_point(fields) else _validated_point(fields, number))
    if not points:
        raise UsageError("no points: the file has no JSON lines")
    return points


def _decode(line: str) -> Any:
    """`line` as json.loads reads it: most lines are one value with no blanks around, which
    raw_decode reads alone (a quarter faster on 10,000 lines)."""
    try:
        value, end = _JSON.raw_decode(line)
        if end == len(line):
            return value
    except ValueError:
        pass
    return _JSON.decode(line)  # blanks around the value, or the error saying what is wrong


def _is_plain_point(fields: dict[str, Any]) -> bool:
    """Whether `fields` are plainly a MetricPoint (a text name, finite numbers, nothing else). Such a
    line is sent as it came, for the runner to read the same point from it: most lines are, and
    neither pydantic nor encoding them again costs this process anything (issue 13)."""
    step = fields.get("step")
    return (
        len(fields) == 2 + ("step" in fields)
        and type(fields.get("name")) is str
        and _plain_number(fields.get("value"))
        and (step is None or _plain_number(step))
    )


def _plain_number(value: object) -> bool:
    # A JSON number: a finite float, or an integer the wire takes (bool is no number).
    return (type(value) is float and math.isfinite(value)) or (
        type(value) is int and INT64_MIN <= value <= INT64_MAX
    )


def _validated_point(fields: dict[str, Any], number: int) -> str:
    """A line that is no plain point, as MetricPoint makes it, or why it cannot."""
    from pydantic import ValidationError

    from goaltender.protocol.messages import problems
    from goaltender.storage.records import MetricPoint

    try:
        return MetricPoint.model_validate(fields).model_dump_json()
    except ValidationError as exc:
        raise UsageError(f"line {number}: {problems(exc, MetricPoint)}") from None


def metric_requests(goal: int, experiment_id: int | None, points: list[str]) -> list[str]:
    """log_metrics requests for `points` (JSON texts): at most MAX_POINTS each, each line within the
    runner's limit (a point too long alone still goes: the runner says why)."""
    from bisect import bisect_right
    from itertools import accumulate

    request = encode({"type": "log_metrics", "goal_id": goal, "points": [], "experiment_id": experiment_id})
    room = MAX_LINE - len(request) - 64 - MAX_POINTS  # and the id, the newline, a comma a point
    ends = list(accumulate(map(len, map(str.encode, points))))  # bytes up to each point's end
    chunks = []
    start = 0
    while start < len(points):
        fits = bisect_right(ends, (ends[start - 1] if start else 0) + room)
        stop = max(start + 1, min(fits, start + MAX_POINTS))
        chunks.append(points[start:stop])
        start = stop
    return [request.replace('"points":[]', f'"points":[{",".join(chunk)}]', 1) for chunk in chunks]
