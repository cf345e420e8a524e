"""Outbox keys: which Slack write is which — a goal's card, an approval prompt, a budget increase
waiting for a second person, a queued goal's card, the writes a runner event produced, the answer
to a thread reply, a digest.

A key is a small frozen value; `str(key)` is how it is stored (the outbox's dedupe key, and the
`thread_of` / `ts_of` references in payloads) and `parse` reads it back, to route a reply, a
reaction or a click to its goal, and a failed write to whoever asked for it.

The stored text is readable and `:`-separated: `gpu1:5:card`, `gpu1:5:approval:2`, `gpu1:5:budget:1`, `queue:3`,
`gpu1:41:0`, `gpu1:41:plot`. A `:` or `%` inside a name is written `%3A` / `%25`, so every field
is one segment and a key is told by its shape: a runner's keys have the goal id or event seq
second, the others a channel id (never all digits) or two segments. So a runner named `queue`,
`card` or `lab:gpu` reads back as itself, and ordinary names are written as they always were:
rows stored before keys were typed parse the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from goaltender.storage.bot_store import KeyMove

_SPECIAL = re.compile(r"%(25|3A)")
_DIGITS = re.compile(r"[0-9]+")
_DIGEST_TIME = "%Y%m%dT%H%M%S.%fZ"  # no `:` in it, so it is one segment
_ROW_ID = re.compile(r"[1-9][0-9]{0,18}")  # ASCII digits only: str.isdigit() takes "²" too
ROW_ID_MAX = 2**63 - 1  # SQLite's integers, and the runner's ids


@dataclass(frozen=True)
class CardKey:
    """A goal's status card: the root of the goal's thread."""

    runner: str
    goal_id: int

    def __str__(self) -> str:
        return f"{_escape(self.runner)}:{self.goal_id}:card"


@dataclass(frozen=True)
class ApprovalKey:
    """The prompt asking people to decide an approval, in its goal's thread."""

    runner: str
    goal_id: int
    approval_id: int

    def __str__(self) -> str:
        return f"{_escape(self.runner)}:{self.goal_id}:approval:{self.approval_id}"


@dataclass(frozen=True)
class BudgetKey:
    """The prompt asking a second person to decide a budget increase (bot.db's budget_requests row)."""

    runner: str
    goal_id: int
    request_id: int

    def __str__(self) -> str:
        return f"{_escape(self.runner)}:{self.goal_id}:budget:{self.request_id}"


@dataclass(frozen=True)
class QueueKey:
    """The card of a goal waiting for a runner (bot.db's queued_goals row)."""

    queue_id: int

    def __str__(self) -> str:
        return f"queue:{self.queue_id}"


@dataclass(frozen=True)
class EventKey:
    """A write a runner event produced: its thread post (0), its plot, or its card's update."""

    runner: str
    seq: int
    part: int | Literal["plot", "card-update"]

    def __str__(self) -> str:
        return f"{_escape(self.runner)}:{self.seq}:{self.part}"


@dataclass(frozen=True)
class ReplyKey:
    """The bot's answer to a person's reply in a goal thread."""

    channel: str
    ts: str

    def __str__(self) -> str:
        return f"reply:{_escape(self.channel)}:{_escape(self.ts)}"


@dataclass(frozen=True)
class DigestKey:
    """A channel's digest post, or its plot."""

    channel: str
    at: datetime
    plot: bool = False

    def __str__(self) -> str:
        text = f"digest:{_escape(self.channel)}:{self.at.astimezone(UTC).strftime(_DIGEST_TIME)}"
        return text + ":plot" if self.plot else text


OutboxKey = CardKey | ApprovalKey | BudgetKey | QueueKey | EventKey | ReplyKey | DigestKey
RUNNER_KEYS = (CardKey, ApprovalKey, BudgetKey, EventKey)  # the keys of one runner's goals and events


def moved(old: str, new: str, *, events_after: int | None = None) -> KeyMove:
    """Runner `old`'s keys renamed as runner `new`'s (bot.db's switch_database and rewind); with
    `events_after`, only the keys of events after that seq."""

    def rekey(text: str) -> str | None:
        key = parse(text)
        if not isinstance(key, RUNNER_KEYS) or key.runner != old:
            return None
        if events_after is not None and not (isinstance(key, EventKey) and key.seq > events_after):
            return None
        return str(replace(key, runner=new))

    return KeyMove(prefix=f"{_escape(old)}:", rekey=rekey)


def parse(text: str) -> OutboxKey | None:
    """The key stored as `text`; None for text no key is written as."""
    match text.split(":"):
        case ["queue", queue_id] if _is_int(queue_id):
            return QueueKey(int(queue_id))
        case ["reply", channel, ts] if not _is_int(channel):
            return ReplyKey(_unescape(channel), _unescape(ts))
        case ["digest", channel, at, *plot] if not _is_int(channel) and plot in ([], ["plot"]):
            try:
                when = datetime.strptime(at, _DIGEST_TIME).replace(tzinfo=UTC)
            except ValueError:
                return None
            return DigestKey(_unescape(channel), when, plot=bool(plot))
        case [runner, goal_id, "card"] if _is_int(goal_id):
            return CardKey(_unescape(runner), int(goal_id))
        case [runner, goal_id, "approval", approval_id] if _is_int(goal_id) and _is_int(approval_id):
            return ApprovalKey(_unescape(runner), int(goal_id), int(approval_id))
        case [runner, goal_id, "budget", request_id] if _is_int(goal_id) and _is_int(request_id):
            return BudgetKey(_unescape(runner), int(goal_id), int(request_id))
        case [runner, seq, "plot" | "card-update" as part] if _is_int(seq):
            return EventKey(_unescape(runner), int(seq), part)
        case [runner, seq, part] if _is_int(seq) and _is_int(part):
            return EventKey(_unescape(runner), int(seq), int(part))
    return None


def row_id(text: str) -> int | None:
    """The id (an approval's, a budget request's) a button's value names: 1..2**63-1 in ASCII
    digits; None for anything else, such as a forged or garbled value."""
    if _ROW_ID.fullmatch(text) and (value := int(text)) <= ROW_ID_MAX:
        return value
    return None


def _is_int(segment: str) -> bool:
    return _DIGITS.fullmatch(segment) is not None


def _escape(name: str) -> str:
    return name.replace("%", "%25").replace(":", "%3A")


def _unescape(segment: str) -> str:
    # One pass, so `%253A` (a name holding the text "%3A") comes back as "%3A", not ":".
    return _SPECIAL.sub(lambda m: "%" if m.group(1) == "25" else ":", segment)
