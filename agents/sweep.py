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
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from goaltender.agents.blocking import BlockingAgent, Misconfigured, PlainGoal, run_blocking_agent
from goaltender.display.params import format_metric, format_params
from goaltender.protocol.quick_client import RunnerRefused
from goaltender.runner.noise import LOW_SIGNAL_ANSWER
from goaltender.storage.direction import best_of, reached

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from typing import Any

    from goaltender.protocol.quick_client import ExperimentView, SummaryView


@dataclass
class SweepTask:
    """What the planner needs to know about a workload."""

    name: str
    metric: str
    space: dict[str, list[Any]]  # knob -> candidate values, in order
    baseline: dict[str, Any]
    command: Callable[[dict[str, Any]], list[str]]
    estimate_cost: Callable[[dict[str, Any]], float]  # seconds, roughly
    reasons: dict[tuple[str, int], str] = field(default_factory=dict)  # (knob, ±1) -> why it may help
    aliases: dict[str, str] = field(default_factory=dict)  # words people use -> knob
    direction: str = "maximize"
    # The direction each knob is believed to move the metric the right way (+1 up its values, -1
    # down); knobs left out have no prior. It lets the planner open with one bold move of them all.
    expect: dict[str, int] = field(default_factory=dict)
    eval_command: list[str] | None = None  # the runner scores each run itself with this
    # A first run that trains nothing (the SFT sweep: the base model as it is), measured before
    # `baseline`; the search then moves from the best trained config, whatever that scored.
    untrained: dict[str, Any] | None = None
    untrained_description: str = "baseline: the untrained model"
    baseline_description: str = "baseline: the starting config, unchanged"
    plan_text: str = ""  # how the plan reads in the goal's first milestone (default: from `expect`)
    # Makes what a config's run reads (its data) before it starts; returns a milestone (title, text)
    # when it made something. Runs in a thread: it may take a while.
    prepare: Callable[[dict[str, Any]], tuple[str, str] | None] | None = None
    approve_above_s: float = 60.0  # the default for --approve-above


def module_command(module: str) -> Callable[[dict[str, Any]], list[str]]:
    """A SweepTask's command for a workload run as `python -m module --knob-name value …`."""

    def command(config: dict[str, Any]) -> list[str]:
        args = [sys.executable, "-m", module]
        for knob, value in config.items():
            args += [f"--{knob.replace('_', '-')}", str(value)]
        return args

    return command


def star_count_task() -> SweepTask:
    # The knobs without the workload itself: importing numpy and Pillow was a third of the
    # agent's start-up, and only the runs need them.
    from goaltender.environments.star_count import space

    return SweepTask(
        name="star_count",
        metric="exact_accuracy",
        # The planner steps through values in order; the workload lists its baseline value first.
        space={knob: sorted(values) for knob, values in space.SEARCH_SPACE.items()},
        baseline=space.BASELINE,
        command=module_command("goaltender.environments.star_count.workload"),
        estimate_cost=space.estimate_cost,
        reasons=space.HYPOTHESES,
        aliases=space.ALIASES,
        expect=space.EXPECT,
        eval_command=[sys.executable, "-m", "goaltender.environments.star_count.evaluate"],
    )


# ---- planning ----

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?"
_LIMIT_WORDS = r"<=|>=|<|>|under|below|above|over|at most|at least"


@dataclass
class Proposal:
    config: dict[str, Any]
    knob: str | None
    step: int
    description: str


@dataclass
class Constraints:
    """What people asked for, as applied to the search space (kept in the diary handoff)."""

    frozen: set[str] = field(default_factory=set)
    pinned: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, tuple[str, float]] = field(default_factory=dict)  # knob -> ("<=" | ">=", bound)

    def to_json(self) -> dict:
        return {"frozen": sorted(self.frozen), "pinned": self.pinned, "limits": self.limits}

    @classmethod
    def from_json(cls, data: dict) -> Constraints:
        return cls(
            frozen=set(data.get("frozen", [])),
            pinned=dict(data.get("pinned", {})),
            limits={k: tuple(v) for k, v in data.get("limits", {}).items()},
        )

    def allows(self, knob: str, value: Any) -> bool:
        if knob not in self.limits:
            return True
        op, bound = self.limits[knob]
        return value <= bound if op == "<=" else value >= bound


@dataclass(frozen=True)
class Row:
    """A ledger row as the planner reads it: the fields of storage/records.py's Experiment it uses,
    from the runner's replies as they came (the runner validated them)."""

    index: int
    params: dict[str, Any]
    status: str
    description: str = ""
    metric_value: float | None = None
    wall_seconds: float | None = None
    within_noise: bool = False

    @property
    def counted(self) -> bool:
        """Does it count as attempted? Not when it was interrupted."""
        return self.status != "interrupted"

    @classmethod
    def from_reply(cls, experiment: dict[str, Any]) -> Row:
        return cls(
            index=experiment["index"],
            params=experiment.get("params") or {},
            status=experiment["status"],
            description=experiment.get("description", ""),
            metric_value=experiment.get("metric_value"),
            wall_seconds=experiment.get("wall_seconds"),
            within_noise=bool(experiment.get("within_noise")),
        )


def kept_scores(ledger: list[Row]) -> list[tuple[Row, float]]:
    """The kept rows with their headline values."""
    return [(e, e.metric_value) for e in ledger if e.status == "keep" and e.metric_value is not None]


class Planner:
    def __init__(self, task: SweepTask):
        self.task = task
        self.constraints = Constraints()
        self.rejected: set[str] = set()  # configs people declined to pay for

    @staticmethod
    def key(config: dict[str, Any]) -> str:
        return json.dumps(config, sort_keys=True)

    def best(self, ledger: list[Row]) -> Row | None:
        scored = self.best_scored(ledger)
        return scored[0] if scored else None

    def best_scored(self, ledger: list[Row]) -> tuple[Row, float] | None:
        """The best kept row, with its headline value."""
        return self._pick(kept_scores(ledger))

    def _pick(self, scored: list[tuple[Row, float]]) -> tuple[Row, float] | None:
        if not scored:
            return None
        return best_of(scored, lambda pair: pair[1], self.task.direction)

    def search_best(self, ledger: list[Row]) -> Row | None:
        """The config the next move starts from: the best kept row. After an untrained run, the
        best trained run, kept or not: training that scores below the untrained model is still
        where the search goes on from."""
        if self.task.untrained is None:
            return self.best(ledger)
        untrained = self.key(self.task.untrained)
        trained = [
            (e, e.metric_value)
            for e in ledger
            if e.status in ("keep", "discard")
            and e.metric_value is not None
            and self.key(e.params) != untrained
        ]
        found = self._pick(trained)
        return found[0] if found else None

    def propose(self, ledger: list[Row]) -> Proposal | None:
        """The next experiment: the untrained model (if the task has one) and the baseline first,
        then a one-knob move from the best config. A run the runner interrupted (it crashed, say)
        is not tried: it is proposed again."""
        tried = {self.key(e.params) for e in ledger if e.counted} | self.rejected
        untrained = self.task.untrained
        if untrained is not None and self.key(untrained) not in tried:
            return Proposal(dict(untrained), None, 0, self.task.untrained_description)
        if untrained is not None and self._failed(untrained, ledger):
            return None  # not even the untrained model could be scored: no run could be (see its log)
        best = self.search_best(ledger)
        if best is None:
            config = {**self.task.baseline, **self.constraints.pinned}
            if self.key(config) in tried:
                return None  # the baseline itself failed; nothing to build on
            return Proposal(config, None, 0, self.task.baseline_description)
        base = {**best.params, **self.constraints.pinned}
        if self.key(base) not in tried:  # a pin changed the best config: measure that first
            pins = ", ".join(f"{k}={v}" for k, v in self.constraints.pinned.items())
            return Proposal(base, None, 0, f"steered: best config with {pins}")
        stride = self.stride(base)
        if stride is not None and self.key(stride) not in tried and self._striding(ledger):
            return Proposal(stride, None, 1, self._describe_stride(base, stride))
        for knob, step in self._move_order(ledger, best):
            moved = self._move(base, knob, step)
            if moved is not None and self.key(moved) not in tried:
                return Proposal(moved, knob, step, self._describe(base, moved, knob, step))
        return None

    def stride(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """`config` with every knob that has a prior moved one step its believed way, together:
        from a weak baseline most of the gain lies along the priors, and one run tests them all
        (each is then checked alone, from the best, by the one-knob moves)."""
        moved = dict(config)
        for knob, step in self.task.expect.items():
            if knob in self.task.space and knob not in self.constraints.frozen | set(self.constraints.pinned):
                moved = self._move(moved, knob, step) or moved
        return moved if sum(moved[k] != config.get(k) for k in moved) >= 2 else None

    def _striding(self, ledger: list[Row]) -> bool:
        """Stride while strides pay: from the baseline, and again after a stride whose gain was
        beyond noise (the next one costs several times more, and may overshoot)."""
        counted = [e for e in ledger if e.counted]
        if len(counted) <= 1:
            return True
        last, before = counted[-1], counted[-2]
        paid = last.status == "keep" and not last.within_noise
        return paid and self.stride(before.params) == last.params

    def _describe_stride(self, base: dict, config: dict) -> str:
        moves = [f"{k} {base[k]} → {config[k]}" for k in self.task.space if base.get(k) != config.get(k)]
        return "together, each a step its believed way: " + ", ".join(moves)

    def _failed(self, config: dict[str, Any], ledger: list[Row]) -> bool:
        """Was `config` run to its end without a headline value?"""
        runs = [e for e in ledger if e.counted and self.key(e.params) == self.key(config)]
        return bool(runs) and all(e.metric_value is None for e in runs)

    def _move_order(self, ledger: list[Row], best: Row) -> list[tuple[str, int]]:
        knobs = [
            k
            for k in self.task.space
            if k not in self.constraints.frozen and k not in self.constraints.pinned
        ]
        order = [(k, +1) for k in knobs] + [(k, -1) for k in knobs]
        if self.task.expect:  # moves believed to help first, the cheapest of them first
            base = best.params

            def rank(move: tuple[str, int]) -> tuple[bool, float]:
                moved = self._move(base, *move)
                cost = self.task.estimate_cost(moved) if moved is not None else float("inf")
                return self.task.expect.get(move[0]) != move[1], cost

            order.sort(key=rank)
        # Momentum: if the move that produced the best helped, try the same direction again first.
        if best.index > 1 and (move := self._move_between(ledger, best)) and move in order:
            order.remove(move)
            order.insert(0, move)
        return order

    def _move_between(self, ledger: list[Row], best: Row) -> tuple[str, int] | None:
        earlier = [e for e in ledger if e.index < best.index and e.status == "keep"]
        if not earlier:
            return None
        parent = earlier[-1].params
        changed = [k for k in self.task.space if parent.get(k) != best.params.get(k)]
        if len(changed) != 1:
            return None
        knob = changed[0]
        values = self.task.space[knob]
        try:
            return knob, (1 if values.index(best.params[knob]) > values.index(parent[knob]) else -1)
        except ValueError:
            return None

    def _move(self, config: dict[str, Any], knob: str, step: int) -> dict[str, Any] | None:
        values = self.task.space[knob]
        try:
            i = values.index(config[knob])
        except (KeyError, ValueError):
            return None
        j = i + step
        if not 0 <= j < len(values) or not self.constraints.allows(knob, values[j]):
            return None
        return {**config, knob: values[j]}

    def _describe(self, base: dict, config: dict, knob: str, step: int) -> str:
        why = self.task.reasons.get((knob, step), "")
        return f"{knob} {base[knob]} → {config[knob]}" + (f": {why}" if why else "")

    def untried_moves(self, ledger: list[Row], limit: int = 3) -> list[str]:
        best = self.search_best(ledger)
        if best is None:
            return []
        tried = {self.key(e.params) for e in ledger if e.counted}
        moves = []
        for knob, step in self._move_order(ledger, best):
            config = self._move(best.params, knob, step)
            if config is not None and self.key(config) not in tried:
                moves.append(self._describe(best.params, config, knob, step))
        return moves[:limit]

    # ---- steering ----

    def apply_steer(self, text: str) -> list[str]:
        """Change the search space from a person's words. Returns what was applied."""
        applied = []
        lowered = text.lower()
        mentioned = self._knobs_in(lowered)
        if m := re.search(r"\b(?:only|just|focus on)\b", lowered):
            focus = self._knobs_in(lowered[m.end() :])
            if focus:
                self.constraints.frozen = set(self.task.space) - set(focus)
                applied.append(f"searching only {', '.join(focus)}")
        freeze = re.search(r"\b(?:freeze|don'?t (?:tune|touch|change)|stop tuning|leave|skip)\b", lowered)
        if freeze and mentioned and not applied:
            self.constraints.frozen |= set(mentioned)
            applied.append(f"frozen: {', '.join(mentioned)}")
        for knob in self.task.space:
            names = "|".join(re.escape(n) for n in [knob, *self._aliases_of(knob)])
            pin = re.search(rf"(?:{names})\s*(?:=|to|at)\s*({_NUMBER})", lowered)
            if pin:
                value = self._nearest(knob, float(pin.group(1)))
                self.constraints.pinned[knob] = value
                applied.append(f"pinned {knob}={value}")
            limit = re.search(rf"(?:{names})\s*({_LIMIT_WORDS})\s*({_NUMBER})", lowered)
            if limit:
                op = "<=" if limit.group(1) in ("<=", "<", "under", "below", "at most") else ">="
                self.constraints.limits[knob] = (op, float(limit.group(2)))
                applied.append(f"{knob} {op} {limit.group(2)}")
        return applied

    def _aliases_of(self, knob: str) -> list[str]:
        return [alias for alias, k in self.task.aliases.items() if k == knob]

    def _knobs_in(self, text: str) -> list[str]:
        found = []
        for knob in self.task.space:
            names = [knob, knob.replace("_", " "), *self._aliases_of(knob)]
            if any(re.search(rf"\b{re.escape(n)}\b", text) for n in names):
                found.append(knob)
        return found

    def _nearest(self, knob: str, value: float) -> Any:
        return min(self.task.space[knob], key=lambda v: abs(float(v) - value))


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
