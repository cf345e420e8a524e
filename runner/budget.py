"""Stop rules and budgets: read them from a goal's words, make them explicit, and do the arithmetic.

A goal is accepted with every limit explicit: an absolute deadline (fixed at acceptance),
compute-hours, an attempted-experiment count, a per-experiment timeout. With no stop rule at
all, the default is the baseline plus three experiments, then ask before going on.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from pydantic import BaseModel

from goaltender.storage.records import Budget

DEFAULT_BLOCK = 4  # baseline + 3; also how many more each "continue?" approval grants

_UNITS = r"(?:days?|d|hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)(?![a-z])"
_DURATION = rf"(\d+(?:\.\d+)?)\s*({_UNITS})"
_DURATION_PART = re.compile(_DURATION, re.I)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


class GoalSpec(BaseModel):
    """What a goal's text asks for, before defaults are applied."""

    text: str
    wall_seconds: float | None = None
    compute_hours: float | None = None
    max_experiments: int | None = None
    experiment_timeout_s: float | None = None
    target: float | None = None
    runner: str | None = None
    agent: str | None = None

    @property
    def has_stop_rule(self) -> bool:
        return any(v is not None for v in (self.wall_seconds, self.compute_hours, self.max_experiments))


def parse_duration(text: str) -> float | None:
    """'5h' -> 18000, '1h30m' -> 5400, '90 s' -> 90, '2.5 hours' -> 9000; None if not a duration."""
    text = text.strip()
    parts = list(_DURATION_PART.finditer(text))
    if not parts or "".join(p.group(0) for p in parts).replace(" ", "") != text.replace(" ", ""):
        return None
    return sum(float(p.group(1)) * _UNIT_SECONDS[p.group(2)[0].lower()] for p in parts)


_DUR = rf"((?:\d+(?:\.\d+)?\s*{_UNITS}\s*)+)"
_PATTERNS = {
    "wall": re.compile(rf"\b(?:time\s+)?budget\s*(?:of\s+)?{_DUR}", re.I),
    "within": re.compile(rf"\bwithin\s+{_DUR}", re.I),
    "compute": re.compile(r"\b(?:gpu|cpu|compute)[- ]hours?\s*(?:of\s+)?(\d+(?:\.\d+)?)", re.I),
    "compute_after": re.compile(r"\b(\d+(?:\.\d+)?)\s*(?:gpu|cpu|compute)[- ]hours?\b", re.I),
    "max_exp": re.compile(r"\b(?:max(?:imum)?|up\s+to|at\s+most)\s+(\d+)\s+(?:experiments?|runs?)\b", re.I),
    "timeout": re.compile(rf"\b(?:timeout\s+{_DUR}|{_DUR}\s*(?:each|per\s+(?:experiment|run)))", re.I),
    "target_pct": re.compile(r"(?:\bto|\breach|\btarget|>=|≥)\s*(\d+(?:\.\d+)?)\s*%", re.I),
    "target": re.compile(r"\btarget\s+(?:of\s+)?(\d*\.\d+|\d+)\b(?!\s*%)", re.I),
    "runner": re.compile(r"\bon\s+([A-Za-z0-9][\w.-]*)\s*$|\bon\s+runner\s+([\w.-]+)", re.I),
    "agent": re.compile(r"\bwith\s+(sweep|codex|openai|[\w-]+-agent)\b", re.I),
}


def parse_goal_text(text: str) -> GoalSpec:
    """Find budget and stop-rule phrases in free text ("... budget 5h, max 20 experiments")."""
    spec = GoalSpec(text=text.strip())
    if m := _PATTERNS["wall"].search(text) or _PATTERNS["within"].search(text):
        spec.wall_seconds = parse_duration(m.group(1))
    if m := _PATTERNS["compute"].search(text) or _PATTERNS["compute_after"].search(text):
        spec.compute_hours = float(m.group(1))
    if m := _PATTERNS["max_exp"].search(text):
        spec.max_experiments = int(m.group(1))
    if m := _PATTERNS["timeout"].search(text):
        spec.experiment_timeout_s = parse_duration(m.group(1) or m.group(2))
    if m := _PATTERNS["target_pct"].search(text):
        spec.target = float(m.group(1)) / 100
    elif m := _PATTERNS["target"].search(text):
        spec.target = float(m.group(1))
    if m := _PATTERNS["runner"].search(text):
        spec.runner = m.group(1) or m.group(2)
    if m := _PATTERNS["agent"].search(text):
        spec.agent = m.group(1).lower()
    return spec


def explicit_budget(spec: GoalSpec, now: datetime, default_timeout_s: float | None) -> Budget:
    """The budget a goal is accepted with: every limit spelled out, the deadline absolute."""
    budget = Budget(
        wall_seconds=spec.wall_seconds,
        deadline=now + timedelta(seconds=spec.wall_seconds) if spec.wall_seconds else None,
        compute_hours=spec.compute_hours,
        max_experiments=spec.max_experiments,
        experiment_timeout_s=spec.experiment_timeout_s or default_timeout_s,
    )
    if not spec.has_stop_rule:
        budget.max_experiments = DEFAULT_BLOCK
        budget.ask_to_continue = True
    return budget


_EXTEND = re.compile(rf"^\s*(?:budget\s*)?\+\s*{_DUR}\s*$", re.I)
_MORE_EXP = re.compile(r"^\s*\+\s*(\d+)\s+(?:experiments?|runs?)\s*$", re.I)


def apply_budget_change(budget: Budget, change: str, now: datetime) -> tuple[Budget, str] | None:
    """Apply a person's budget phrase to a running goal's budget.

    Understands "+2h" / "budget +2h" (extend the deadline), "+5 experiments", and the phrases of
    `parse_goal_text` ("budget 5h" resets the deadline from now, "max 10 experiments", "gpu-hours 8").
    Returns (new budget, what changed) or None when the phrase names no budget.
    """
    new = budget.model_copy()
    changes = []
    if m := _EXTEND.match(change):
        extra = parse_duration(m.group(1)) or 0
        base = max(budget.deadline, now) if budget.deadline else now
        new.deadline = base + timedelta(seconds=extra)
        new.wall_seconds = (budget.wall_seconds or 0) + extra
        changes.append(f"deadline +{_fmt_seconds(extra)}")
    elif m := _MORE_EXP.match(change):
        new.max_experiments = (budget.max_experiments or 0) + int(m.group(1))
        new.ask_to_continue = False
        changes.append(f"max experiments {new.max_experiments}")
    else:
        spec = parse_goal_text(change)
        if spec.wall_seconds:
            new.deadline = now + timedelta(seconds=spec.wall_seconds)
            new.wall_seconds = spec.wall_seconds
            changes.append(f"deadline {_fmt_seconds(spec.wall_seconds)} from now")
        if spec.max_experiments is not None:
            new.max_experiments = spec.max_experiments
            new.ask_to_continue = False
            changes.append(f"max experiments {spec.max_experiments}")
        if spec.compute_hours is not None:
            new.compute_hours = spec.compute_hours
            changes.append(f"compute-hours {spec.compute_hours:g}")
        if spec.experiment_timeout_s is not None:
            new.experiment_timeout_s = spec.experiment_timeout_s
            changes.append(f"per-experiment timeout {_fmt_seconds(spec.experiment_timeout_s)}")
    return (new, ", ".join(changes)) if changes else None


class BudgetCheck(BaseModel):
    ok: bool
    reason: str = ""  # why not, when not ok
    needs_continue_approval: bool = False  # the default stop rule was reached: ask before going on


def check_new_experiment(budget: Budget, attempted: int, compute_used: float, now: datetime) -> BudgetCheck:
    """May the goal start one more experiment?"""
    if budget.deadline and now >= budget.deadline:
        return BudgetCheck(ok=False, reason="the time budget is used up (deadline passed)")
    if budget.compute_hours is not None and compute_used >= budget.compute_hours:
        return BudgetCheck(
            ok=False, reason=f"compute budget used: {compute_used:.3g}/{budget.compute_hours:g} compute-hours"
        )
    if budget.max_experiments is not None and attempted >= budget.max_experiments:
        if budget.ask_to_continue:
            return BudgetCheck(
                ok=False,
                needs_continue_approval=True,
                reason=f"default stop rule reached: {attempted}/{budget.max_experiments} attempted",
            )
        return BudgetCheck(
            ok=False, reason=f"experiment budget used: {attempted}/{budget.max_experiments} attempted"
        )
    return BudgetCheck(ok=True)


def experiment_timeout(budget: Budget, requested: float | None, now: datetime) -> float | None:
    """The tighter of the requested timeout, the goal's per-experiment timeout and the time left."""
    limits = [t for t in (requested, budget.experiment_timeout_s) if t]
    if budget.deadline:
        limits.append(max(1.0, (budget.deadline - now).total_seconds()))
    return min(limits) if limits else None


def stop_status(budget: Budget, attempted: int, compute_used: float, now: datetime) -> str:
    """One line, as the autoresearch skill asks after every run: '3/8 attempted, 1m52s left'."""
    parts, met = [], []
    if budget.max_experiments is not None:
        parts.append(f"{attempted}/{budget.max_experiments} attempted")
        if attempted >= budget.max_experiments:
            met.append("experiment count")
    else:
        parts.append(f"{attempted} attempted")
    if budget.deadline:
        left = (budget.deadline - now).total_seconds()
        parts.append(f"{_fmt_seconds(max(left, 0))} left")
        if left <= 0:
            met.append("deadline")
    if budget.compute_hours is not None:
        parts.append(f"{compute_used:.3g}/{budget.compute_hours:g} compute-h")
        if compute_used >= budget.compute_hours:
            met.append("compute")
    head = f"stop condition met ({', '.join(met)})" if met else "stop condition not yet met"
    return f"{head}: {', '.join(parts)}"


def _fmt_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
