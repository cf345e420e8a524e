"""Words the runner writes itself: the ledger as a table, the summary, the final report."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from goaltender.display.params import format_params
from goaltender.protocol.budget import stop_status
from goaltender.storage.direction import best_of, reached
from goaltender.storage.records import Experiment, Goal, HubFetch

if TYPE_CHECKING:
    from goaltender.storage.runner_rows import Ledger

# A summary line a run prints to name its best checkpoint, `best_checkpoint_step: 240` (the NeMo RL
# launcher does: goaltender/training), kept in the row's metrics and named in the report.
BEST_CHECKPOINT_STEP = "best_checkpoint_step"


def best_experiment(experiments: list[Experiment], direction: str = "maximize") -> Experiment | None:
    """The kept experiment with the best headline (the first of equals)."""
    kept = [e for e in experiments if e.status == "keep" and e.metric_value is not None]
    return best_of(kept, lambda e: e.metric_value or 0.0, direction)


def best_checkpoint(experiment: Experiment) -> str | None:
    """`step_240 of experiment #3`, and where it is when it lies where the launcher puts it. A run
    scored by an eval command keeps its own summary lines under `run/`."""
    step = experiment.metrics.get(BEST_CHECKPOINT_STEP, experiment.metrics.get(f"run/{BEST_CHECKPOINT_STEP}"))
    if step is None:
        return None
    name = f"step_{step:.0f}"
    path = Path(experiment.log_path).parent / "checkpoints" / name
    where = f" (`{path}`)" if experiment.log_path and path.is_dir() else ""
    return f"{name} of experiment #{experiment.index}{where}"


def error_classes(experiment: Experiment) -> str:
    """ "off_by_one 2 (dominant), off_by_more 0, format 0": the error classes its evaluation
    reported as `errors/<class>` lines (star count's does), largest first; "" when none."""
    counts = {k.removeprefix("errors/"): v for k, v in experiment.metrics.items() if k.startswith("errors/")}
    if not counts:
        return ""
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    parts = [f"{name} {value:g}" for name, value in ranked]
    if ranked[0][1] > 0:
        parts[0] += " (dominant)"
    return ", ".join(parts)


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
        if e.interval_low is not None and e.interval_high is not None:
            value += f" [{e.interval_low:.3g}–{e.interval_high:.3g}, {e.interval_how}]"
        if e.within_noise:
            value += " **within noise**"
        wall = f"{e.wall_seconds:.1f}s" if e.wall_seconds is not None else "—"
        compute = f"{e.compute_hours:.4f}" if e.compute_hours is not None else "—"
        description = e.description + (f" ({e.note})" if e.note else "")
        lines.append(
            f"| {e.index} | {e.status} | {value} | {wall} | {compute} | {format_params(e.params)} | "
            f"{description.replace('|', '/')} |"
        )
    return "\n".join(lines)


def format_bytes(size: int) -> str:
    """`512 B`, `5.2 MB`, `3.4 GB`: decimal units, as the hub shows sizes."""
    if size < 1000:
        return f"{size} B"
    value = size / 1000
    for unit in ("kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def fetch_summary(fetch: HubFetch, *, short_commit: bool = False) -> str:
    """`model org/name (main, commit 1a2b…): 3 files, 5.2 MB, 5.2 MB downloaded`."""
    commit = fetch.commit[:12] if short_commit else fetch.commit
    at = f"commit {commit}" if fetch.revision == fetch.commit else f"{fetch.revision}, commit {commit}"
    came = (
        "all from the cache"
        if not fetch.downloaded_bytes
        else f"{format_bytes(fetch.downloaded_bytes)} downloaded"
    )
    files = f"{fetch.files} file{'' if fetch.files == 1 else 's'}"
    return f"{fetch.repo_type} {fetch.repo} ({at}): {files}, {format_bytes(fetch.bytes)}, {came}"


def summary_text(
    goal: Goal,
    experiments: list[Experiment],
    ledger: Ledger,
    now: datetime,
    end_reason: str | None = None,
    *,
    fetches: Sequence[HubFetch] = (),
) -> str:
    """The goal's summary: its best, target and stop status as its status has them (`ledger`,
    RunnerStore.ledgers: one path for both), then the whole ledger as a table."""
    best, compute_used = ledger.best, ledger.compute_hours_used
    head = f"Goal #{goal.id} — {goal.state}" + (f" ({end_reason})" if end_reason else "")
    lines = [f"# {head}", "", f"> {goal.text}", ""]
    if best is not None:
        how = "verified by the runner" if best.verified else "reported by the experiment"
        lines.append(
            f"**Best:** #{best.index} {best.metric_name} = {best.metric_value:.4g} ({how}) — {best.description}"
        )
        if best.params:
            lines.append(f"**Best config:** `{format_params(best.params)}`")
        if (checkpoint := best_checkpoint(best)) is not None:
            lines.append(f"**Best checkpoint:** {checkpoint}")
        if errors := error_classes(best):
            lines.append(f"**Errors of the best:** {errors}")
    else:
        lines.append("**Best:** no successful experiment yet.")
    if goal.target is not None:
        lines.append(
            f"**Target:** {goal.target:g} — {'reached' if target_reached(goal, best) else 'not reached'}"
        )
    lines += [
        f"**Stop status:** "
        f"{goal_stop_status(goal, ledger.attempted, compute_used, best, now, tokens_used=ledger.tokens_used)}",
        f"**Compute used:** {compute_used:.4f} compute-hours",
        "",
        "## Ledger",
        "",
        ledger_table(experiments, goal.metric),
    ]
    if fetches:
        lines += ["", "## From the hub", ""]
        lines += [f"- {fetch_summary(f)} — `{f.path}`" for f in fetches]
    return "\n".join(lines)


def final_report(
    goal: Goal,
    experiments: list[Experiment],
    ledger: Ledger,
    now: datetime,
    end_reason: str,
    agent_words: str | None,
    *,
    fetches: Sequence[HubFetch] = (),
) -> str:
    text = summary_text(goal, experiments, ledger, now, end_reason, fetches=fetches)
    if agent_words:
        text += "\n\n## From the agent\n\n" + agent_words.strip()
    return text


def target_reached(goal: Goal, best: Experiment | None) -> bool:
    """Has the goal's best experiment reached the target its text set (`to 95%`)?"""
    if goal.target is None or best is None or best.metric_value is None:
        return False
    return reached(best.metric_value, goal.target, goal.direction)


def goal_stop_status(
    goal: Goal,
    attempted: int,
    compute_used: float,
    best: Experiment | None,
    now: datetime,
    *,
    tokens_used: int,
) -> str:
    """The goal's stop status: its budgets (the agent's tokens among them) and its target; an ended
    goal's as it ended (its time left does not run on, nor run out, after it)."""
    at = goal.ended_at or now
    return stop_status(
        goal.budget,
        attempted,
        compute_used,
        at,
        tokens_used=tokens_used,
        target_reached=target_reached(goal, best),
    )
