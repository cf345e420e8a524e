"""Answer parsing and scoring for the star-count task.

Standard library only, so the NeMo Gym resources server (``app.py``) can load this file on its own.

Accepted answer forms (colour names are case-insensitive):

* ``\\boxed{red: 3, blue: 2}`` -- the last parseable ``\\boxed{...}`` wins;
* JSON objects ``{"red": 3, "blue": 2}``, bare, inside ``\\boxed{...}`` or within prose -- the
  last one wins;
* plain ``red: 3, blue: 2`` / ``red=3 blue=2`` / one colour per line (``- Red stars: 3``); when a
  colour is mentioned several times the last mention wins.

A colour the answer does not mention is wrong (it is NOT read as zero).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_BOXED = "\\boxed"
# name, optional " stars", optional closing quote/brace/markdown, a separator, a whole number.
_KV = re.compile(
    r"(?<![A-Za-z])([A-Za-z]+)(?:\s+stars?)?[\"'}*\]]*\s*(?::|=|-|–)\s*[\"'*]*\s*(\d+)(?!\d|\.\d)",
    re.IGNORECASE,
)
_STAR_SUFFIX = re.compile(r"\s+stars?$")


def _norm_key(key: str) -> str:
    return _STAR_SUFFIX.sub("", key.strip().lower()).strip()


def _as_count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _boxed_contents(text: str) -> list[str]:
    """Contents of every balanced ``\\boxed{...}`` in order of appearance."""
    out: list[str] = []
    i = 0
    while (j := text.find(_BOXED, i)) >= 0:
        k = j + len(_BOXED)
        while k < len(text) and text[k].isspace():
            k += 1
        if k >= len(text) or text[k] != "{":
            i = k
            continue
        depth = 0
        end = -1
        for pos in range(k, len(text)):
            if text[pos] == "{":
                depth += 1
            elif text[pos] == "}":
                depth -= 1
                if depth == 0:
                    end = pos
                    break
        if end < 0:  # unbalanced: give up on this one
            i = k + 1
            continue
        out.append(text[k + 1 : end])
        i = end + 1
    return out


def _counts_from_mapping(obj: Mapping[Any, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            continue
        count = _as_count(value)
        name = _norm_key(key)
        if count is not None and name:
            out[name] = count
    return out


def _last_json_counts(text: str) -> dict[str, int] | None:
    """Counts from the last JSON object in ``text`` that holds at least one whole-number value."""
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"\{", text)]
    for start in reversed(starts):
        try:
            obj, _end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(obj, dict):
            counts = _counts_from_mapping(obj)
            if counts:
                return counts
    return None


def _kv_counts(text: str) -> dict[str, int] | None:
    out: dict[str, int] = {}
    for m in _KV.finditer(text):
        name = _norm_key(m.group(1))
        if name:
            out.pop(name, None)  # keep "last mention wins" AND its position in the order
            out[name] = int(m.group(2))
    return out or None


def _parse_fragment(text: str) -> dict[str, int] | None:
    return _last_json_counts(text) or _kv_counts(text)


def parse_answer(text: str) -> dict[str, int] | None:
    """Colour -> count from a model answer, or ``None`` when nothing parseable is in it."""
    if not isinstance(text, str) or not text.strip():
        return None
    for inner in reversed(_boxed_contents(text)):
        counts = _parse_fragment(inner)
        if counts:
            return counts
    return _parse_fragment(text)


@dataclass(frozen=True)
class Verdict:
    correct: bool  # every expected colour counted exactly
    reward: float  # fraction of expected colours counted exactly (partial credit)
    predicted: dict[str, int] | None  # parsed answer, None when unparseable
    per_colour: dict[str, bool] = field(default_factory=dict)


def verify(expected: Mapping[str, int], answer_text: str) -> Verdict:
    """Score one answer against the true counts.

    ``reward`` is the fraction of colours in ``expected`` whose count is exactly right; a colour
    missing from the answer is wrong. Colours in the answer but not in ``expected`` are ignored.
    """
    predicted = parse_answer(answer_text)
    truth = {_norm_key(k): int(v) for k, v in expected.items()}
    if not truth:
        raise ValueError("expected counts are empty")
    per_colour = {c: predicted is not None and predicted.get(c) == v for c, v in truth.items()}
    hits = sum(per_colour.values())
    return Verdict(
        correct=hits == len(truth),
        reward=hits / len(truth),
        predicted=predicted,
        per_colour=per_colour,
    )


def _expected_of(example: Any) -> Mapping[str, int]:
    if isinstance(example, Mapping):
        inner = example.get("counts")
        return inner if isinstance(inner, Mapping) else example
    return example.counts


def score(examples: Sequence[Any] | Iterable[Any], answers: Sequence[str] | Iterable[str]) -> dict[str, Any]:
    """Aggregate verdicts: ``{"exact_accuracy", "mean_reward", "n"}``.

    ``examples`` are ``Example`` objects (anything with ``.counts``), count mappings, or rows
    holding a ``"counts"`` mapping; ``answers`` are the answer texts, in the same order.
    """
    verdicts = [verify(_expected_of(ex), ans) for ex, ans in zip(examples, answers, strict=True)]
    n = len(verdicts)
    if n == 0:
        return {"exact_accuracy": 0.0, "mean_reward": 0.0, "n": 0}
    return {
        "exact_accuracy": sum(v.correct for v in verdicts) / n,
        "mean_reward": sum(v.reward for v in verdicts) / n,
        "n": n,
    }
