"""The sweep planner against random search and Optuna's TPE, on the same declared search spaces.

Every method starts from the same baseline experiment (for TPE it is enqueued as the first trial)
and draws only declared values. One campaign per seed: the seed drives the method's own draws and
is the model's training seed in every run of that campaign. For each target the figure is the
number of experiments (the baseline counts as the first) until one scores at least the target, and
the compute spent until then by the workload's own cost model (`estimate_cost`, seconds on this
2-core machine, warm data cache), so a slow moment of the machine does not move the figures.
Runs are real: each config is trained and scored in this process (`workload.run`), memoised by
config and seed under the cache directory so a rerun costs only what changed.

    python benchmarks/bench_search.py [--workload star_count|text_sentiment] [--seeds 5] [--max 20]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import inspect
import json
import random
import statistics
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from goaltender.agents.sweep_planner import Planner, Row, SweepTask, star_count_task
from goaltender.environments import text_sentiment
from goaltender.environments.star_count import workload as star_workload
from goaltender.runner import noise

TARGETS = {"star_count": (0.85, 0.95, 0.98), "text_sentiment": (0.85, 0.95, 0.98)}
HELDOUT = {"star_count": 64, "text_sentiment": text_sentiment.HELDOUT_SIZE}  # examples a score is on


@dataclass
class Workload:
    task: SweepTask
    train: Callable[[dict[str, Any], int], float]  # config, seed -> the held-out metric
    cost: Callable[[dict[str, Any]], float]  # the workload's cost model, seconds
    sources: list[Any]  # what decides a result (modules, functions): the memo is keyed by their code


def star_count() -> Workload:
    def train(config: dict[str, Any], seed: int) -> float:
        return star_workload.run({**config, "seed": seed}, emit=lambda line: None)["exact_accuracy"]

    from goaltender.environments.star_count import generate, mlp

    return Workload(
        star_count_task(),
        train,
        lambda config: star_workload.estimate_cost(config, cached=True),
        [star_workload.run, star_workload.load_split, star_workload._features, mlp, generate],
    )


def text() -> Workload:
    def train(config: dict[str, Any], seed: int) -> float:
        return text_sentiment.run({**config, "seed": seed}, emit=lambda line: None)["accuracy"]

    return Workload(
        text_sentiment.task(),
        train,
        text_sentiment.estimate_cost,
        [text_sentiment.run, text_sentiment.review, text_sentiment.features, text_sentiment.encode],
    )


WORKLOADS = {"star_count": star_count, "text_sentiment": text}


class Memo:
    """Results by config and seed, in a JSON file named after the workload's sources."""

    def __init__(self, name: str, workload: Workload):
        # The code's syntax tree, not its text: reformatting or a comment does not rerun anything.
        trees = (ast.dump(ast.parse(textwrap.dedent(inspect.getsource(s)))) for s in workload.sources)
        digest = hashlib.sha256("".join(trees).encode()).hexdigest()[:12]
        self.path = star_workload.cache_dir() / "bench_search" / f"{name}-{digest}.json"
        self.results: dict[str, float] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.workload = workload
        self.trained = 0

    def score(self, config: dict[str, Any], seed: int) -> float:
        key = json.dumps([config, seed], sort_keys=True)
        if key not in self.results:
            self.results[key] = self.workload.train(config, seed)
            self.trained += 1
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.results))
        return self.results[key]


# ---- the methods: each runs configs one at a time until `enough` or the budget is spent ----


class Enough(Exception):
    """The campaign reached the highest target: what comes after it is never counted."""


Measure = Callable[[dict[str, Any]], float]
Method = Callable[[SweepTask, int, Measure, int], None]


def planner(task: SweepTask, seed: int, measure: Measure, budget: int) -> None:
    """The sweep agent's planner on a ledger kept as the runner keeps it: keep a new best, else
    discard, and flag a gain inside the new result's Wilson interval as within noise."""
    plan = Planner(task)
    ledger: list[Row] = []
    best: float | None = None
    while len(ledger) < budget and (proposal := plan.propose(ledger)) is not None:
        value = measure(proposal.config)
        better = best is None or value > best
        found = noise.interval(task.metric, value, {"n_heldout": HELDOUT[task.name]})
        noisy = better and noise.within_noise(found, best, task.direction)
        best = value if better else best
        ledger.append(
            Row(
                index=len(ledger) + 1,
                params=proposal.config,
                status="keep" if better else "discard",
                description=proposal.description,
                metric_value=value,
                within_noise=noisy,
            )
        )


def random_search(task: SweepTask, seed: int, measure: Measure, budget: int) -> None:
    draw = random.Random(seed)
    seen = [task.baseline]
    measure(task.baseline)
    while len(seen) < budget:
        config = {knob: draw.choice(values) for knob, values in task.space.items()}
        if config not in seen:
            seen.append(config)
            measure(config)


def tpe(task: SweepTask, seed: int, measure: Measure, budget: int, **sampler: Any) -> None:
    """Optuna's TPE as a user would set it up: each knob an ordinal index into its declared
    values, the baseline enqueued as the first trial, the sampler's defaults otherwise (its first
    ten trials are random)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # not the Enough that ends a campaign
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed, **sampler)
    )
    study.enqueue_trial({knob: values.index(task.baseline[knob]) for knob, values in task.space.items()})
    study.optimize(
        lambda trial: measure({k: v[trial.suggest_int(k, 0, len(v) - 1)] for k, v in task.space.items()}),
        n_trials=budget,
    )


def tpe_eager(task: SweepTask, seed: int, measure: Measure, budget: int) -> None:
    """TPE modelling from the second trial on (one random start: the baseline), knobs jointly."""
    tpe(task, seed, measure, budget, n_startup_trials=1, multivariate=True)


METHODS: dict[str, Method] = {
    "planner": planner,
    "random": random_search,
    "tpe": tpe,
    "tpe, eager": tpe_eager,
}


def campaign(
    method: Method, task: SweepTask, seed: int, memo: Memo, top: float, budget: int
) -> list[tuple[dict, float]]:
    """The runs `method` makes with this seed, up to the first that reaches the top target."""
    runs: list[tuple[dict, float]] = []

    def measure(config: dict[str, Any]) -> float:
        runs.append((config, value := memo.score(config, seed)))
        if value >= top:
            raise Enough
        return value

    with contextlib.suppress(Enough):
        method(task, seed, measure, budget)
    return runs


def to_target(
    runs: list[tuple[dict, float]], target: float, cost: Callable[[dict], float]
) -> tuple[int, float] | None:
    """(experiments, compute seconds) until the first run at or above `target`, or None."""
    spent = 0.0
    for n, (config, value) in enumerate(runs, start=1):
        spent += cost(config)
        if value >= target:
            return n, spent
    return None


def spread(values: list[float], fmt: str, miss: str) -> str:
    """median [min–max]; a campaign that missed the target counts as worse than any that hit it."""

    def show(value: float) -> str:
        return miss if value == float("inf") else f"{value:{fmt}}"

    return f"{show(statistics.median(values))} [{show(min(values))}–{show(max(values))}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max", type=int, default=20, help="experiments per campaign")
    args = parser.parse_args()
    for name in args.workload or sorted(WORKLOADS):
        workload = WORKLOADS[name]()
        memo = Memo(name, workload)
        targets = TARGETS[name]
        print(f"\n{name}: {args.seeds} seeds, at most {args.max} experiments; median [min–max]")
        print(
            "| method | " + " | ".join(f"experiments to {t:g} | compute s to {t:g}" for t in targets) + " |"
        )
        print("|---|" + "---:|---:|" * len(targets))
        for method_name, method in METHODS.items():
            hits: dict[float, list[tuple[int, float]]] = {t: [] for t in targets}
            for seed in range(args.seeds):
                runs = campaign(method, workload.task, seed, memo, max(targets), args.max)
                for t in targets:
                    found = to_target(runs, t, workload.cost)
                    hits[t].append(found if found else (float("inf"), float("inf")))
            cells = []
            for t in targets:
                counts = [float(n) for n, _ in hits[t]]
                spent = [s for _, s in hits[t]]
                missed = counts.count(float("inf"))
                cell = f"{spread(counts, '.0f', f'>{args.max}')} | {spread(spent, '.1f', 'missed')}"
                cells.append(cell + (f" ({missed} missed)" if missed else ""))
            print(f"| {method_name} | " + " | ".join(cells) + " |", flush=True)
        print(f"({memo.trained} runs trained now, the rest from {memo.path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
