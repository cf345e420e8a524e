"""The sweep agent's planning (agents/sweep.py runs it): a task's knobs and their values, and the
next hypothesis to test — move one knob of the best config one step through its declared values,
or stride a few at once when single steps stop paying — from the ledger so far and the humans'
steering (narrow the search space, pin or freeze a knob). Pure: no runner, no I/O.

Standard library only, as the sweep agent is (its start-up is part of every campaign).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from goaltender.storage.direction import best_of

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from typing import Any


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
