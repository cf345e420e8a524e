"""How big a budget increase is, and whether it is over the size that needs a second person
(`GOALTENDER_BUDGET_SECOND_PERSON`, or a channel's `/goal admin budget …`).

A threshold is a duration — `1h`, `90m`: an increase that adds more than that much time or that many
compute-hours — or a share — `50%`: an increase that grows any limit by more than that share of it.
`0` makes every increase need a second person; `off` none. Pure functions over the runner's Budget:
the bot reads a change with the runner's own parser (`apply_budget_change`), so what it measures is
what the runner would do.

What is measured, per limit that grows:
- time: how much later the deadline falls (from now, when it had passed);
- compute-hours: how many more;
- experiments: how many more, counted as time at the per-experiment timeout (without a timeout
  their time is unbounded: over any duration threshold);
- the per-experiment timeout: how much longer, times the experiments allowed (when neither an
  experiment count bounds it, it is bounded by the deadline or compute-hours, which are measured).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

from goaltender.display.facts import format_duration
from goaltender.protocol.budget import check_duration, parse_duration
from goaltender.storage.records import Budget

# fullmatch; linear on any text without possessive quantifiers (see protocol/budget.py): each repeat
# is followed by what it cannot match (`\s*` by a digit or `%`, `\d+` by `.`, a space or `%`).
_SHARE = re.compile(r"\+?\s*(\d+(?:\.\d+)?)\s*%")
OFF = ("off", "none", "never", "no")


@dataclass(frozen=True)
class Growth:
    """One limit that grows: what it is, by how much (said for people), and its size."""

    what: str
    hours: float  # the growth as time or compute-hours (inf: unbounded)
    share: float  # the growth as a share of the limit it grows (inf: from nothing)


@dataclass(frozen=True)
class Threshold:
    """Budget increases bigger than this need a second person."""

    text: str
    hours: float | None = None
    share: float | None = None

    @classmethod
    def parse(cls, text: str) -> Threshold | None:
        """`1h`, `90m`, `2.5 hours`, `0`, `50%`, `+50%`; None for `off`; ValueError otherwise."""
        words = " ".join(text.split()).lower()
        if words in OFF or not words:
            return None
        if match := _SHARE.fullmatch(words):
            return cls._share(float(match.group(1)), text)
        seconds = 0.0 if words.lstrip("+ ") == "0" else parse_duration(words.lstrip("+ "))
        if seconds == 0:
            return cls("0", hours=0.0)
        if seconds is None:
            raise ValueError(
                f"`{text}` is not a budget size: use a duration (`1h`, `90m`, `0` for every increase), "
                "a share of the limit (`50%`), or `off`"
            )
        check_duration(seconds, text, "a budget size", "`1h`, `0` for every increase, `off` for none")
        return cls(format_duration(seconds), hours=seconds / 3600)

    @classmethod
    def _share(cls, percent: float, text: str) -> Threshold:
        if not math.isfinite(percent):
            raise ValueError(f"`{text[:40]}…` is too big a share of a limit: use one such as `50%`, or `off`")
        return cls(f"{percent:g}%", share=percent / 100)

    def over(self, before: Budget, after: Budget, now: datetime) -> str | None:
        """Why the change from `before` to `after` needs a second person; None when it does not."""
        for growth in growths(before, after, now):
            if self.hours is not None and growth.hours > self.hours:
                return f"{growth.what}, over {self._limit()}"
            if self.share is not None and growth.share > self.share:
                share = "∞" if math.isinf(growth.share) else f"{growth.share:.0%}"
                return f"{growth.what} (+{share}), over {self._limit()}"
        return None

    def _limit(self) -> str:
        if self.hours == 0:
            return "this channel's limit (every increase needs a second person)"
        if self.share is not None:
            return f"this channel's limit of +{self.text} per change"
        return f"this channel's limit of {self.text} per change"


def growths(before: Budget, after: Budget, now: datetime) -> list[Growth]:
    """Every limit the change makes bigger (a limit newly set makes nothing bigger)."""
    found: list[Growth] = []
    if before.deadline and after.deadline and after.deadline > max(before.deadline, now):
        added = (after.deadline - max(before.deadline, now)).total_seconds()
        total = before.wall_seconds or (before.deadline - now).total_seconds()
        found.append(Growth(f"adds {format_duration(added)} of time", added / 3600, _share(added, total)))
    if before.compute_hours is not None and after.compute_hours is not None:
        added = after.compute_hours - before.compute_hours
        if added > 0:
            found.append(Growth(f"adds {added:g} compute-hours", added, _share(added, before.compute_hours)))
    if before.max_experiments is not None and after.max_experiments is not None:
        more = after.max_experiments - before.max_experiments
        if more > 0:
            timeout = after.experiment_timeout_s
            hours = more * timeout / 3600 if timeout else math.inf
            each = f"{format_duration(timeout)} each" if timeout else "no per-experiment timeout"
            found.append(
                Growth(
                    f"adds {more} experiment{'s' if more != 1 else ''} ({each})",
                    hours,
                    _share(more, before.max_experiments),
                )
            )
    if before.experiment_timeout_s and after.experiment_timeout_s:
        longer = after.experiment_timeout_s - before.experiment_timeout_s
        if longer > 0 and after.max_experiments is not None:
            found.append(
                Growth(
                    f"makes each experiment's timeout {format_duration(longer)} longer "
                    f"(up to {after.max_experiments} experiments)",
                    longer * after.max_experiments / 3600,
                    _share(longer, before.experiment_timeout_s),
                )
            )
    return found


def _share(added: float, total: float | None) -> float:
    return added / total if total and total > 0 else math.inf
