"""Words the runner writes itself: the ledger as a table, the summary, the final report."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from goaltender.runner.budget import stop_status
from goaltender.storage.records import Experiment, Goal


def best_experiment(experiments: list[Experiment], direction: str = "maximize") -> Experiment | None:
    """The kept experiment with the best headline (the first of equals)."""
    scored = [(e.metric_value, e) for e in experiments if e.status == "keep" and e.metric_value is not None]
    if not scored:
        return None
    pick = max if direction == "maximize" else min
    return pick(scored, key=lambda scored_experiment: scored_experiment[0])[1]


def format_params(params: Mapping[str, Any], max_len: int | None = None) -> str:
    """`train_size=2048 hidden=64 lr=0.001`; with max_len, whole params only, then " …"."""
    tokens = [f"{k}={_format_value(v)}" for k, v in params.items()]
    text = " ".join(tokens)
    if max_len is not None and len(text) > max_len:
        kept: list[str] = []  # a value cut in half would read as another value
        for token in tokens:
            if len(" ".join([*kept, token])) > max_len - 2:
                break
            kept.append(token)
        text = " ".join([*kept, "…"])
    return text


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ",".join(_format_value(v) for v in value)
    return str(value)


def ledger_table(experiments: list[Experiment], metric: str | None) -> str:
    """The ledger as a markdown table (one row per attempted experiment)."""
    name = metric or "metric"
    lines = [
        f"| # | status | {name} | wall | compute-h | config | description |",
        "|---:|---|---:|---:|---:|---|---|",
    ]
    for e in experiments:
        value = (
            "—" if e.metric_value is None else f"{e.metric_value:.4g}" + ("" if e.verified else " (reported)")
        )
        wall = f"{e.wall_seconds:.1f}s" if e.wall_seconds is not None else "—"
        compute = f"{e.compute_hours:.4f}" if e.compute_hours is not None else "—"
        description = e.description + (f" ({e.note})" if e.note else "")
        lines.append(
            f"| {e.index} | {e.status} | {value} | {wall} | {compute} | {format_params(e.params)} | "
            f"{description.replace('|', '/')} |"
        )
    return "\n".join(lines)


def summary_text(
    goal: Goal,
    experiments: list[Experiment],
    compute_used: float,
    now: datetime,
    end_reason: str | None = None,
) -> str:
    best = best_experiment(experiments, goal.direction)
    head = f"Goal #{goal.id} — {goal.state}" + (f" ({end_reason})" if end_reason else "")
    lines = [f"# {head}", "", f"> {goal.text}", ""]
    if best is not None:
        how = "verified by the runner" if best.verified else "reported by the experiment"
        lines.append(
            f"**Best:** #{best.index} {best.metric_name} = {best.metric_value:.4g} ({how}) — {best.description}"
        )
        if best.params:
            lines.append(f"**Best config:** `{format_params(best.params)}`")
    else:
        lines.append("**Best:** no successful experiment yet.")
    if goal.target is not None:
        reached = best is not None and _reached(best.metric_value, goal.target, goal.direction)
        lines.append(f"**Target:** {goal.target:g} — {'reached' if reached else 'not reached'}")
    lines += [
        f"**Stop status:** {stop_status(goal.budget, sum(e.counted for e in experiments), compute_used, now)}",
        f"**Compute used:** {compute_used:.4f} compute-hours",
        "",
        "## Ledger",
        "",
        ledger_table(experiments, goal.metric),
    ]
    return "\n".join(lines)


def final_report(
    goal: Goal,
    experiments: list[Experiment],
    compute_used: float,
    now: datetime,
    end_reason: str,
    agent_words: str | None,
) -> str:
    text = summary_text(goal, experiments, compute_used, now, end_reason)
    if agent_words:
        text += "\n\n## From the agent\n\n" + agent_words.strip()
    return text


def _reached(value: float | None, target: float, direction: str) -> bool:
    if value is None:
        return False
    return value >= target if direction == "maximize" else value <= target
