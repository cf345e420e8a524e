"""The sweep agent: a no-LLM autoresearch planner.

Baseline first; then one hypothesis per experiment — move one knob of the best config one step
through its declared values — each run through the runner's supervised-experiment verb, which
keeps or discards it by the held-out metric. A milestone on each new best; an approval request
before any run whose estimated cost is above a threshold; steering read between runs (narrow the
search space, pin or freeze a knob); a diary handoff after every run, so a restarted agent picks
up where it left off; a final report with the best config and what to try next.

    python -m goaltender.agents.sweep [--task module:attr] [--approve-above SECONDS]
    python -m goaltender.agents.sweep --nemo-rl [CHECKOUT] --eval CMD   # SFT with NeMo RL

It starts on the standard library alone (agents/blocking.py): its start-up is part of every
campaign. Without --task the workload is star count: the CPU model, or, when the goal asks for SFT (or
--nemo-rl is given), Qwen3-VL-2B fine-tuned with NeMo RL (agents/sft_sweep.py).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from goaltender.agents.blocking import BlockingAgent, Misconfigured, PlainGoal, run_blocking_agent
from goaltender.agents.sweep_planner import (
    Constraints,
    Planner,
    Proposal,
    Row,
    SweepTask,
    kept_scores,
    star_count_task,
)
from goaltender.display.params import format_metric, format_params
from goaltender.protocol.quick_client import RunnerRefused
from goaltender.runner.noise import LOW_SIGNAL_ANSWER
from goaltender.storage.direction import reached

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from typing import Any

    from goaltender.protocol.quick_client import ExperimentView, SummaryView


# ---- the campaign ----

COVER = 1.25  # an approved cost also covers later runs up to this multiple of it


@dataclass(frozen=True)
class CostThreshold:
    """Which runs the humans approve first: those estimated above `seconds`, or above `times` the
    baseline's own wall time (`2x`: a threshold that means the same on a fast box and a slow one)."""

    seconds: float | None = None
    times: float | None = None

    @classmethod
    def parse(cls, text: str) -> CostThreshold:
        """`60` (seconds) or `2x`; ValueError for anything else."""
        word = text.strip().lower()
        relative = word.endswith("x")
        value = float(word[:-1] if relative else word)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"{text!r}: a cost threshold is a positive number of seconds, or a multiple like 2x"
            )
        return cls(times=value) if relative else cls(seconds=value)

    def limit(self, baseline_s: float | None) -> float | None:
        """The threshold in seconds; None while there is no baseline to measure it by (the
        baseline itself is never asked about then)."""
        if self.times is None:
            return self.seconds
        return self.times * baseline_s if baseline_s else None

    def covering(self, estimate: float, baseline_s: float | None) -> CostThreshold:
        """Raised to cover runs up to COVER times an approved estimate."""
        if self.times is not None and baseline_s:
            return CostThreshold(times=max(self.times, estimate * COVER / baseline_s))
        return CostThreshold(seconds=max(self.seconds or 0.0, estimate * COVER))

    def __str__(self) -> str:
        return f"{self.times:.3g}×" if self.times is not None else f"{self.seconds:.0f}s"

    def said(self) -> str:
        """In a sentence: `60s`, `2× the baseline's time`."""
        return f"{self} the baseline's time" if self.times is not None else str(self)


CONFIRM_SEEDS = 3  # seeds a within-noise best is run with when the humans ask for a change of course


class SweepAgent(BlockingAgent):
    stop_within_s = 3.0

    def __init__(self, goal: PlainGoal, task: SweepTask, approve_above: CostThreshold, summary: SummaryView):
        super().__init__(goal)
        self.task = task
        self.planner = Planner(task)
        self.approve_above = approve_above
        self.summary = summary  # the goal as it stood when the agent started (a `summary` reply)
        self.ledger: list[Row] = [Row.from_reply(e) for e in summary["ledger"]]
        self.goal_target: float | None = summary["status"]["goal"].get("target")
        self.end_note = ""
        self.confirm_best = False  # the humans answered a low-signal prompt with "change course"

    def run(self) -> None:
        if self.goal.resumed:
            self._resume()
        else:
            self.milestone(
                f"Plan: {self.task.name} sweep on {self.task.metric}",
                f"{self.task.plan_text or self._plan_text()}\n"
                f"Search space: {self._space_text()}\n"
                f"Approval asked before any run estimated above {self.approve_above.said()}.\n"
                f"{self.summary['status']['stop_status']}",
            )
        while True:
            self._read_inbox()
            if self.confirm_best:
                self.confirm_best = False
                if self._confirm():
                    continue
            if self._target_reached():
                self.end_note = f"target {self.goal_target:g} reached"
                break
            proposal = self.planner.propose(self.ledger)
            if proposal is None:
                self.end_note = (
                    "the search space is exhausted around the best config"
                    if self.planner.best(self.ledger)
                    else "the baseline produced no metric, so there is nothing to build on (see its log)"
                )
                break
            if not self._approved(proposal):
                continue
            self._prepare(proposal.config)
            try:
                self._run(proposal.config, proposal.description)
            except RunnerRefused as exc:
                if exc.code in ("budget_exhausted", "conflict"):
                    self.end_note = exc.message
                    break
                if exc.code == "disk_full":
                    continue  # the goal is paused until there is room: the next request waits for it
                raise
        self.finish()

    def _run(self, config: dict[str, Any], description: str, repeat: int = 1) -> None:
        """One experiment of `config` through the runner, entered in the ledger and reported."""
        reply = self.call(
            "run_experiment",
            "experiment",
            command=self.task.command(config),
            description=description,
            params=config,
            metric=self.task.metric,
            direction=self.task.direction,
            eval_command=self.task.eval_command,
            repeat=repeat,
        )
        self.ledger.append(Row.from_reply(reply["experiment"]))
        self._after_run(reply)

    def _confirm(self) -> bool:
        """The humans asked for a change of course on gains within noise: run the best config
        again with CONFIRM_SEEDS seeds (the runner records their mean ± sd) before going on."""
        best = self.planner.best(self.ledger)
        if best is None:
            return False
        self.milestone(
            f"Confirming #{best.index} with {CONFIRM_SEEDS} seeds",
            "Its gain lies within noise; its mean over seeds says whether it is real before the "
            "search goes on.",
        )
        try:
            self._run(
                best.params,
                f"confirm #{best.index} with {CONFIRM_SEEDS} seeds: its gain lies within noise",
                repeat=CONFIRM_SEEDS,
            )
        except RunnerRefused as exc:
            if exc.code in ("budget_exhausted", "conflict", "disk_full"):
                return False
            raise
        return True

    def _approved(self, proposal: Proposal) -> bool:
        estimate = self._estimate(proposal.config)
        baseline_s = self._baseline_seconds()
        limit = self.approve_above.limit(baseline_s)
        if limit is None or estimate <= limit:
            return True
        cost = (
            f"~{estimate:.1f}s, {estimate / baseline_s:.1f}× the baseline's {baseline_s:.1f}s"
            if self.approve_above.times is not None and baseline_s
            else f"~{estimate:.0f}s"
        )
        covered = self.approve_above.covering(estimate, baseline_s)
        reply = self.call(
            "ask",
            "decision",
            kind="cost",
            question=f"Run a costly experiment ({cost}, above the {self.approve_above} threshold)?",
            detail=f"Hypothesis: {proposal.description}\nConfig: {format_params(proposal.config)}\n"
            f"Approving also covers later runs estimated up to {covered.said()}.",
        )
        approval = reply["approval"]
        if approval["state"] == "approved":
            self.approve_above = covered
            return True
        self.planner.rejected.add(self.planner.key(proposal.config))
        self.milestone(
            f"Skipped: {proposal.description.split(':')[0]} ({approval['state']})",
            f"{approval.get('decided_by') or 'nobody'} said no"
            + (f": {approval['comment']}" if approval.get("comment") else "")
            + ". Trying the next hypothesis.",
        )
        return False

    def _prepare(self, config: dict[str, Any]) -> None:
        if self.task.prepare is None:
            return
        made = self.task.prepare(config)
        if made is not None:
            self.milestone(*made)

    def _baseline_seconds(self) -> float | None:
        """The wall time of the campaign's first finished run: what a relative threshold scales."""
        return next(
            (e.wall_seconds for e in self.ledger if e.wall_seconds and e.status in ("keep", "discard")), None
        )

    def _estimate(self, config: dict[str, Any]) -> float:
        """The task's estimate, calibrated by how the finished runs compared with theirs."""
        raw = self.task.estimate_cost(config)
        ratios = [
            e.wall_seconds / est
            for e in self.ledger
            if e.wall_seconds
            and e.status in ("keep", "discard")
            and (est := self.task.estimate_cost(e.params)) > 0
        ]
        return raw * statistics.median(ratios) if ratios else raw

    def _after_run(self, reply: ExperimentView) -> None:
        e = self.ledger[-1]
        stop_status = reply.get("stop_status", "")
        if reply.get("new_best"):
            previous = [x for x in self.ledger[:-1] if x.status == "keep"]
            was = f" (was {format_metric(self.task.metric, previous[-1].metric_value)})" if previous else ""
            self.milestone(
                f"New best: {self.task.metric} {format_metric(self.task.metric, e.metric_value)}{was}",
                f"#{e.index} {e.description}\nConfig: {format_params(e.params)}\n{stop_status}",
            )
        self._handoff(stop_status)

    def _read_inbox(self) -> None:
        messages = self.call("read_inbox", "inbox")["messages"]
        for message in messages:
            text = message["text"]
            if text.startswith(LOW_SIGNAL_ANSWER):
                if "change course" in text:
                    self.confirm_best = True
                continue  # the runner's own prompt, answered: not a steer of the search space
            applied = self.planner.apply_steer(text)
            if applied:
                said = "Applied: " + "; ".join(applied) + f".\nSearch space now: {self._space_text()}"
            else:
                said = (
                    "I could not map this onto the search space, so the plan is unchanged. I understand "
                    "'only <knob>', 'freeze <knob>', '<knob>=<value>', '<knob> under <value>'; budget "
                    "changes ('+2m', 'max 10 experiments') are applied by the runner."
                )
            self.milestone(f"Steer from {message['author']}: “{text}”", said)
        if messages:
            self._handoff("after steering")

    def _target_reached(self) -> bool:
        best = self.planner.best_scored(self.ledger)
        if self.goal_target is None or best is None:
            return False
        return reached(best[1], self.goal_target, self.task.direction)

    def _plan_text(self) -> str:
        if not self.task.expect:
            return "Baseline first, then one knob at a time from the best config."
        believed = ", ".join(f"{k} {'up' if step > 0 else 'down'}" for k, step in self.task.expect.items())
        return (
            f"Baseline first; then one step of every knob with a prior at once ({believed}), again "
            "while that pays beyond noise; then one knob at a time from the best config, the believed "
            "moves first and the cheapest of them first."
        )

    def _space_text(self) -> str:
        parts = []
        for knob, values in self.task.space.items():
            c = self.planner.constraints
            if knob in c.pinned:
                parts.append(f"{knob}={c.pinned[knob]} (pinned)")
            elif knob in c.frozen:
                parts.append(f"{knob} (frozen)")
            else:
                allowed = [v for v in values if c.allows(knob, v)]
                parts.append(f"{knob} ∈ {allowed}")
        return "; ".join(parts)

    def _handoff(self, stop_status: str) -> None:
        best = self.planner.best(self.ledger)
        state = {
            "constraints": self.planner.constraints.to_json(),
            "rejected": sorted(self.planner.rejected),
            "best": {"index": best.index, "value": best.metric_value, "config": best.params}
            if best
            else None,
            "attempted": sum(e.counted for e in self.ledger),
            "stop_status": stop_status,
        }
        self.call("write_diary", kind="handoff", text="sweep state: " + json.dumps(state))

    def _resume(self) -> None:
        entries = self.call("read_diary", "diary", last=1, kind="handoff")["entries"]
        restored = "no handoff found; rebuilt from the ledger alone"
        if entries and entries[-1]["text"].startswith("sweep state: "):
            state = json.loads(entries[-1]["text"].removeprefix("sweep state: "))
            self.planner.constraints = Constraints.from_json(state["constraints"])
            self.planner.rejected = set(state["rejected"])
            restored = f"handoff restored ({state['attempted']} attempted at the time)"
        best = self.planner.best(self.ledger)
        interrupted = [f"#{e.index}" for e in self.ledger if not e.counted]
        self.milestone(
            "Resumed after a restart",
            f"{restored}; the ledger has {len(self.ledger)} rows"
            + (f", best #{best.index} {self.task.metric} {best.metric_value:.4g}" if best else "")
            + "."
            + (
                f" Interrupted, so run again if still wanted: {', '.join(interrupted)}."
                if interrupted
                else ""
            ),
        )

    def stop(self) -> None:
        self.finish(stopped=True)

    def finish(self, stopped: bool = False) -> None:
        best = self.planner.best(self.ledger)
        lines = [f"**Why it ended:** {'stopped by a person' if stopped else self.end_note}."]
        if best is not None:
            lines.append(
                f"**Best:** #{best.index} {self.task.metric} = {best.metric_value:.4g} with `{format_params(best.params)}`."
            )
            helped = self._effects()
            if helped:
                lines.append("**What moved the metric:** " + "; ".join(helped) + ".")
            if moves := self.planner.untried_moves(self.ledger):
                lines.append("**What to try next:** " + "; ".join(moves) + ".")
        crashes = [e for e in self.ledger if e.status == "crash"]
        if crashes:
            lines.append(f"**Crashes:** {len(crashes)} (see the ledger notes and the run logs).")
        self.submit_report("\n\n".join(lines))
        if not stopped:
            self.milestone("Campaign finished", lines[0] + "\n" + (lines[1] if len(lines) > 1 else ""))

    def _effects(self) -> list[str]:
        """The metric change of each one-knob move and stride, measured from the kept config it
        started from."""
        effects = []
        kept = kept_scores(self.ledger)
        for e in self.ledger:
            if e.metric_value is None:
                continue
            parents = [
                (k, value)
                for k, value in kept
                if k.index < e.index
                and (
                    sum(k.params.get(n) != e.params.get(n) for n in self.task.space) == 1
                    or self.planner.stride(k.params) == e.params
                )
            ]
            if parents:
                parent, parent_value = parents[-1]
                moved = [n for n in self.task.space if parent.params.get(n) != e.params.get(n)]
                what = " + ".join(f"{n} {parent.params[n]}→{e.params[n]}" for n in moved)
                delta = e.metric_value - parent_value
                effects.append((abs(delta), f"{what}: {delta:+.3g}"))
        return [text for _, text in sorted(effects, reverse=True)[:4]]


def load_task(spec: str) -> SweepTask:
    """'module:attr' naming a SweepTask or a function returning one."""
    module, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr or "TASK")
    except (ImportError, AttributeError) as exc:
        raise Misconfigured(f"--task {spec}: {type(exc).__name__}: {exc}") from exc
    return obj() if callable(obj) and not isinstance(obj, SweepTask) else obj


# Not "fine-tune" alone: people fine-tune hyper-parameters too.
_SFT_WORDS = re.compile(r"\bSFT\b|\bsupervised fine-?tuning\b|\bnemo[- ]?rl\b", re.I)


def asks_for_sft(goal_text: str) -> bool:
    """Does the goal ask for supervised fine-tuning (`… with SFT …`)?"""
    return bool(_SFT_WORDS.search(goal_text))


def choose_task(args: argparse.Namespace, goal_text: str, workspace: Path) -> SweepTask:
    """--task when given; else star count: SFT with NeMo RL when --nemo-rl is given or the goal
    asks for SFT, the CPU model otherwise. The SFT module (yaml, the export, the launcher: a fifth
    of the agent's start-up) is imported only for SFT."""
    if args.task:
        return load_task(args.task)
    if args.nemo_rl is not None or asks_for_sft(goal_text):
        from goaltender.agents import sft_sweep

        return sft_sweep.star_count_sft_task(workspace, args.eval, args.nemo_rl or None, os.environ)
    return star_count_task()


def _threshold(text: str) -> CostThreshold:
    try:
        return CostThreshold.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main() -> None:
    parser = argparse.ArgumentParser(prog="goaltender-sweep", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--task", help="module:attr of a SweepTask (default: star count, CPU or SFT)")
    parser.add_argument(
        "--nemo-rl",
        nargs="?",
        const="",
        metavar="CHECKOUT",
        help="sweep SFT of Qwen3-VL-2B on star count with NeMo RL (checkout default: $NEMO_RL_DIR; "
        "GOALTENDER_NEMO_RL_COMMAND runs another trainer); also chosen when the goal says SFT",
    )
    parser.add_argument(
        "--eval",
        help="SFT: the command that scores a run on the held-out split (default: $GOALTENDER_SFT_EVAL)",
    )
    parser.add_argument(
        "--approve-above",
        type=_threshold,
        help="ask before a run estimated to take more seconds than this, or (2x) more than this many "
        "times the baseline's time (default: $GOALTENDER_SWEEP_APPROVE_ABOVE, else 60; SFT 3600)",
    )
    args = parser.parse_args()

    def build(goal: PlainGoal) -> SweepAgent:
        summary = goal.runner.call("summary", "summary", goal_id=goal.id)
        task = choose_task(args, summary["status"]["goal"]["text"], goal.workspace)
        approve_above = args.approve_above
        if approve_above is None:
            try:
                approve_above = CostThreshold.parse(
                    os.environ.get("GOALTENDER_SWEEP_APPROVE_ABOVE", str(task.approve_above_s))
                )
            except ValueError as exc:
                raise Misconfigured(f"GOALTENDER_SWEEP_APPROVE_ABOVE: {exc}") from exc
        return SweepAgent(goal, task, approve_above, summary)

    run_blocking_agent("sweep", "The sweep agent", build)


if __name__ == "__main__":
    main()
