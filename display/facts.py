"""What a goal's records say, in words and numbers, once for every surface.

The terminal thread (``display.terminal``) and the Slack thread (``bot.render``) show the same
facts about the same records; they differ only in markup (ANSI colour against mrkdwn). So the
facts -- which emoji a kind of message gets, how a metric, a duration or a cost reads, which
costs an experiment shows, how full each budget is -- are decided here, and the renderers only
style them. Everything here is pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from goaltender.display.params import format_metric
from goaltender.display.params import format_params as _one_line_params
from goaltender.display.plain import clean
from goaltender.protocol.budget import format_tokens
from goaltender.storage.records import Approval, Budget, Experiment, Goal, PostsFolded

EMOJI = {
    "goal_accepted": "🎯",
    "goal_state": "▶️",
    "experiment_started": "🧪",
    "keep": "✅",
    "discard": "➖",
    "crash": "💥",
    "interrupted": "🔌",  # cut short by a runner crash or shutdown; not counted
    "running": "🧪",
    "queued": "⏳",
    "milestone": "🏁",
    "approval_requested": "🙋",
    "approved": "👍",
    "rejected": "👎",
    "expired": "⌛",
    "pending": "🙋",
    "steer": "💬",
    "budget_changed": "📐",
    "report": "📋",
    "hub_fetched": "📦",
    "posts_folded": "🗂️",
}
STATE_EMOJI = {
    "running": "▶️",
    "paused": "⏸️",
    "waiting_for_approval": "⏳",
    "finished": "🏆",
    "stopped": "⏹️",
    "failed": "❌",
}
BAR_WIDTH = 10


def format_duration(seconds: float | None) -> str:
    """14.2s, 1m32s, 2h05m, 3d04h. None or NaN -> "—"."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "—"
    if math.isinf(seconds):
        return "∞"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}s"
    total = round(seconds)
    if total < 3600:
        m, s = divmod(total, 60)
        return f"{m}m{s:02d}s"
    total_min = round(seconds / 60)
    if total_min < 24 * 60:
        h, m = divmod(total_min, 60)
        return f"{h}h{m:02d}m"
    total_h = round(seconds / 3600)
    d, h = divmod(total_h, 24)
    return f"{d}d{h:02d}h"


def format_params(params: Mapping[str, Any], max_len: int | None = None) -> str:
    """``train_size=2048 hidden=64 lr=0.001`` on one line, cut whole with " …" past ``max_len``."""
    return clean(_one_line_params(params, max_len)).replace("\n", " ")


def format_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """``[###-------]``: the number of ``#`` is ``floor(fraction * width)``, clamped to the bar."""
    if not math.isfinite(fraction):
        fraction = 1.0
    filled = min(width, max(0, int(fraction * width + 1e-9)))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def format_hours(hours: float) -> str:
    """Compute-hours, short: 0, 0.0042, 3.25, 12.5."""
    if hours == 0:
        return "0"
    if hours < 10:
        return f"{hours:.3f}".rstrip("0").rstrip(".") if hours >= 0.001 else f"{hours:.2g}"
    return f"{hours:.1f}"


def clock(ts: datetime) -> str:
    """A timestamp as local wall-clock time, HH:MM:SS."""
    try:
        return ts.astimezone().strftime("%H:%M:%S")
    except (ValueError, OSError):
        return ts.strftime("%H:%M:%S")


def state_label(state: str) -> str:
    """``waiting_for_approval`` -> ``waiting for approval``."""
    return state.replace("_", " ")


def budget_summary(budget: Budget, when: Callable[[datetime], str] = clock) -> str:
    """`3m00s wall · deadline 18:24:17 · ≤10 experiments · 1m30s per experiment`; `when` writes the
    deadline (Slack gives each reader their own zone's date and time)."""
    parts: list[str] = []
    if budget.wall_seconds is not None:
        parts.append(f"{format_duration(budget.wall_seconds)} wall")
    if budget.deadline is not None:
        parts.append(f"deadline {when(budget.deadline)}")
    if budget.max_experiments is not None:
        parts.append(f"≤{budget.max_experiments} experiments")
    if budget.compute_hours is not None:
        parts.append(f"{format_hours(budget.compute_hours)} compute-h")
    if budget.experiment_timeout_s is not None:
        parts.append(f"{format_duration(budget.experiment_timeout_s)} per experiment")
    if budget.max_tokens is not None:
        parts.append(f"≤{format_tokens(budget.max_tokens)} agent tokens")
    if budget.ask_to_continue:
        parts.append("asks before going past baseline + 3")
    return " · ".join(parts) if parts else "no limits"


def objective(goal: Goal, metric: str | None = None) -> str:
    """`↑ maximize, target 95.0%`: which way the goal's metric should move, and how far."""
    parts = [f"{'↑' if goal.direction == 'maximize' else '↓'} {goal.direction}"]
    if goal.target is not None:
        name = metric or goal.metric
        if name is None and "%" in goal.text and 0 < goal.target <= 1:
            # no metric named yet ("to 99.9%"): shown as a percentage, as its rows will be
            name = "accuracy"
        parts.append(f"target {format_metric(name, goal.target)}")
    return ", ".join(parts)


# ---- budgets used ----


def time_used(goal: Goal, now: datetime) -> tuple[float, float | None]:
    """(seconds used, seconds allowed or None) of a goal's time budget."""
    start = goal.accepted_at or goal.created_at
    used_s = max(0.0, ((goal.ended_at or now) - start).total_seconds())
    total_s = goal.budget.wall_seconds
    if total_s is None and goal.budget.deadline is not None:
        total_s = (goal.budget.deadline - start).total_seconds()
    return used_s, total_s


@dataclass(frozen=True)
class BudgetBar:
    """One budget on the status card: `time [###-------] 1m02s / 5m00s`."""

    label: str
    used: str
    total: str | None  # None: no limit
    fraction: float | None  # used / total; None without a limit
    sep: str = " / "

    @property
    def over(self) -> bool:
        return self.fraction is not None and self.fraction > 1.0 + 1e-9


def _bar(
    label: str, used: float, total: float | None, fmt: Callable[[float], str], sep: str = " / "
) -> BudgetBar:
    if total is None or total <= 0:
        return BudgetBar(label, fmt(used), None, None, sep)
    return BudgetBar(label, fmt(used), fmt(total), used / total, sep)


def budget_bars(
    goal: Goal, *, attempted: int, compute_hours_used: float, tokens_used: int, now: datetime
) -> list[BudgetBar]:
    """The card's budgets: time, experiments attempted, compute-hours, and the agent's tokens
    when it has a token budget or has spent any (no default: a card that forgot them showed 0)."""
    used_s, total_s = time_used(goal, now)
    b = goal.budget
    bars = [
        _bar("time", used_s, total_s, format_duration),
        _bar("experiments", float(attempted), b.max_experiments, lambda v: str(int(v)), sep="/"),
        _bar("compute-h", compute_hours_used, b.compute_hours, format_hours),
    ]
    if b.max_tokens is not None or tokens_used:
        bars.append(_bar("tokens", float(tokens_used), b.max_tokens, format_tokens, sep="/"))
    return bars


def budget_line(goal: Goal, *, attempted: int, compute_hours_used: float, now: datetime) -> str:
    """`time 1h02m/5h00m · 4/20 experiments · 0.52/8 compute-h`, for one-line summaries."""
    time_bar, experiments, compute, *_ = budget_bars(
        goal, attempted=attempted, compute_hours_used=compute_hours_used, tokens_used=0, now=now
    )

    def of(bar: BudgetBar) -> str:
        return f"{bar.used}/{bar.total}" if bar.total is not None else bar.used

    return f"time {of(time_bar)} · {of(experiments)} experiments · {of(compute)} compute-h"


# ---- experiments and approvals ----


def experiment_cost(e: Experiment) -> list[str]:
    """What a run cost: its wall time, then what the budget charges (compute-hours; the CPU time
    of a run that has no compute-hours recorded)."""
    cost = []
    if e.wall_seconds is not None:
        cost.append(format_duration(e.wall_seconds))
    if e.compute_hours is not None:
        cost.append(f"{format_hours(e.compute_hours)} compute-h")
    elif e.cpu_seconds is not None:
        cost.append(f"{format_hours(e.cpu_seconds / 3600)} cpu-h")
    if e.peak_gpu_memory_mb is not None:
        cost.append(f"GPU peak {e.peak_gpu_memory_mb / 1024:.1f} GiB")
    if e.gpu_utilization is not None:
        cost.append(f"{e.gpu_utilization:.0f}% busy")
    if e.queued_seconds:
        cost.append(f"queued {format_duration(e.queued_seconds)}")
    return cost


STOPPED_WITH_GOAL = "ended with the goal: stopped by "


def stopped_by_person(e: Experiment) -> bool:
    """A run cut short because a person stopped its goal (the runner notes it so): not a crash."""
    return e.status == "crash" and (e.note or "").startswith(STOPPED_WITH_GOAL)


def crash_text(e: Experiment) -> str:
    """Why a crashed run has no metric: stopped by a person, its exit code, or no metric."""
    if stopped_by_person(e):
        return "stopped by a person"
    return f"exit {e.exit_code}" if e.exit_code is not None else "no metric"


def interval_text(e: Experiment) -> str:
    """`18.9%–35.4% (Wilson 95%, n=64)`: how far the headline can be trusted; "" when unknown."""
    if e.interval_low is None or e.interval_high is None:
        return ""
    name = e.metric_name
    return f"{format_metric(name, e.interval_low)}–{format_metric(name, e.interval_high)} ({e.interval_how})"


def noise_mark(e: Experiment) -> str:
    """ "within noise" for a kept gain that lies inside its own interval (not yet a finding)."""
    return "within noise" if e.within_noise else ""


def reported_mark(e: Experiment) -> str:
    """ "reported" for a number the runner did not measure itself (every surface says so), else ""."""
    return "" if e.verified else "reported"


def goal_ended_before(a: Approval) -> bool:
    """An approval the runner closed because its goal ended (was stopped, failed, finished)."""
    return a.state == "expired" and (a.comment or "").startswith("the goal ended")


def approval_verdict(a: Approval) -> tuple[str, str]:
    """(emoji, verdict) for a decided approval: `Approved`, `Rejected`, `Expired …`, `Not needed …`,
    `Pending`."""
    if goal_ended_before(a):
        how = "was stopped" if "stopped by" in (a.comment or "") else "ended"
        return "⏹️", f"Not needed: the goal {how}"
    verdicts = {
        "approved": "Approved",
        "rejected": "Rejected",
        "expired": "Expired without an answer (treated as rejected)",
    }
    return EMOJI.get(a.state, EMOJI["pending"]), verdicts.get(a.state, "Still pending")


FOLDED_TITLE_MAX = 150  # characters of each folded post's title shown


def folded_summary(data: PostsFolded) -> str:
    """`1,990 milestones folded`, `3 milestones and 1 fetch folded`."""
    parts = [
        f"{count:,} {noun}{'' if count == 1 else plural}"
        for count, noun, plural in ((data.milestones, "milestone", "s"), (data.fetches, "fetch", "es"))
        if count
    ]
    return f"{' and '.join(parts) or 'nothing'} folded"


def folded_titles(
    data: PostsFolded, room: int, shown: Callable[[str], str] = lambda title: title
) -> tuple[list[str], bool]:
    """The folded posts' titles, one line each: the first ones, `… N more …`, the latest ones;
    each cut to FOLDED_TITLE_MAX characters, then as `shown` makes it (escaped for Slack), and
    together within `room` characters, titles being left out from the middle. True when any title
    was cut or left out to fit."""
    first = [_one_line(title) for title in data.titles]
    latest = [_one_line(title) for title in data.latest_titles]
    cut = any(len(title) > FOLDED_TITLE_MAX for title in first + latest)
    first, latest = [_cut_title(title) for title in first], [_cut_title(title) for title in latest]
    left_out = data.unnamed
    while True:
        lines = [f"• {shown(title)}" for title in first]
        if left_out:
            lines.append(f"… {left_out:,} more …")
        lines += [f"• {shown(title)}" for title in latest]
        if sum(len(line) + 1 for line in lines) <= room or not (first or latest):
            return lines, cut
        # From the middle: the first ones say how the burst began, the latest where the goal is now.
        if len(first) > len(latest):
            first.pop()
        else:
            latest.pop(0)
        left_out += 1
        cut = True


def _one_line(title: str) -> str:
    return " ".join(clean(title).split())


def _cut_title(title: str) -> str:
    return title if len(title) <= FOLDED_TITLE_MAX else title[: FOLDED_TITLE_MAX - 1] + "…"
