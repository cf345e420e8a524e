"""How an experiment's run is judged: keep (for now) or crash, with the reason; its processes
(run, then eval; each seed of a --repeat) added up into one charge; its seeds combined into one
outcome (means, the headline's spread); a headline compared with the best so far."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from goaltender.runner.supervisor import MAX_LINE, ProcessResult
from goaltender.storage.direction import better
from goaltender.storage.records import Experiment, ExperimentStatus


def judge(
    result: ProcessResult, timeout: float | None, metric: str | None, summary: dict, what: str = "run"
) -> tuple[ExperimentStatus, str | None]:
    """keep (for now; the best-so-far comparison may make it discard) or crash, with the reason."""
    prefix = "" if what == "run" else f"{what}: "
    if result.timed_out:
        return "crash", prefix + _limited(result, f"timeout after {timeout:.0f}s", None)
    if result.exit_code != 0:
        how = (
            f"exit code {result.exit_code}" if result.signal is None else f"killed by signal {result.signal}"
        )
        return "crash", prefix + _limited(result, how, result.signal)
    if metric and metric not in summary:
        return "crash", f"{prefix}no '{metric}: <value>' summary line in the output"
    return "keep", None


def _limited(result: ProcessResult, how: str, killed_by: int | None) -> str:
    """How a crashed process ended, with what its goal's limits did meanwhile (runner/limits.py).
    `killed_by`: the signal that ended it, unless the runner sent it (a timeout's SIGKILL)."""
    return result.limits.explain(how, killed_by) if result.limits is not None else how


def together(first: ProcessResult, then: ProcessResult) -> ProcessResult:
    """One experiment's processes (its run, then its eval) as one charge: times add up; the exit,
    the timeout and the summary are the first's."""
    return ProcessResult(
        exit_code=first.exit_code,
        signal=first.signal,
        wall_seconds=first.wall_seconds + then.wall_seconds,
        cpu_seconds=first.cpu_seconds + then.cpu_seconds,
        peak_rss_mb=max(first.peak_rss_mb, then.peak_rss_mb),
        timed_out=first.timed_out,
        summary=first.summary,
        limits=first.limits,
        unreadable_lines=first.unreadable_lines + then.unreadable_lines,
    )


def with_unreadable(note: str | None, unreadable: int) -> str | None:
    """The row's note, saying how many of its output lines were skipped as no metrics could be
    read from them (so a person sees why a number printed as `{'acc': 0.5}` is missing)."""
    if not unreadable:
        return note
    said = (
        f"{unreadable} unreadable output line{'' if unreadable == 1 else 's'} skipped "
        f"(a {{…}} line that is not a JSON object, or a line over {MAX_LINE // 1024 // 1024} MiB)"
    )
    return f"{note}; {said}" if note else said


class NotStarted(OSError):
    """An eval command that could not start, after its run had: what the run used is charged."""

    def __init__(self, cause: OSError, used: ProcessResult | None, what: str):
        super().__init__(str(cause))
        self.cause, self.used, self.what = cause, used, what


@dataclasses.dataclass
class Attempt:
    """One seed's run (and eval) of an experiment, judged; or, combined, the whole experiment."""

    result: ProcessResult
    status: ExperimentStatus
    note: str | None
    summary: dict[str, float]
    verified: bool
    seeds: list[float] = dataclasses.field(default_factory=list)  # each seed's headline (--repeat)


def combined(attempts: list[Attempt], metric: str | None, repeats: int) -> Attempt:
    """The experiment's outcome from its seeds: times add up; a crashed seed crashes it; every
    number all seeds printed is their mean, and the headline gets `/sd` and each seed's value."""
    if repeats == 1:
        return attempts[0]
    result = total([a.result for a in attempts])
    assert result is not None, "at least one seed ran"
    last = attempts[-1]
    if last.status == "crash":
        return Attempt(result, "crash", f"seed {len(attempts) - 1}: {last.note}", last.summary, False)
    keys = set.intersection(*(set(a.summary) for a in attempts))
    summary = {k: statistics.fmean(a.summary[k] for a in attempts) for k in sorted(keys)}
    seeds = [a.summary[metric] for a in attempts] if metric and metric in keys else []
    if seeds:
        summary[f"{metric}/sd"] = statistics.stdev(seeds)
        summary |= {f"{metric}/seed_{i}": v for i, v in enumerate(seeds)}
    return Attempt(result, "keep", None, summary, all(a.verified for a in attempts), seeds)


def seeded(path: Path, seed: int) -> Path:
    """Seed 0 keeps the plain name (run.log); seed N writes run-N+1.log beside it."""
    return path if seed == 0 else path.with_name(f"{path.stem}-{seed + 1}{path.suffix}")


def seed_note(seed: int, repeats: int) -> str:
    return f"seed {seed}: " if repeats > 1 else ""


def add(before: ProcessResult | None, then: ProcessResult) -> ProcessResult:
    return then if before is None else together(before, then)


def total(results: list[ProcessResult]) -> ProcessResult | None:
    summed = None
    for result in results:
        summed = add(summed, result)
    return summed


def beats(value: float, best: Experiment | None, direction: str) -> bool:
    """Is `value` better than the best so far, in the goal's direction?"""
    if best is None or best.metric_value is None:
        return True
    return better(value, best.metric_value, direction)
