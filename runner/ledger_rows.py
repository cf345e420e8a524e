"""Runs entered in the ledger: each row closed with its outcome and charged the compute it used
(GPU-hours on a GPU box or when it held GPUs, else CPU-hours); the row of a run that was stopped
closed in a task of its own, so that what stopped it goes on at once and a full disk holds only
the row (written when there is room). A goal's end and the runner's shutdown wait for those."""

from __future__ import annotations

import asyncio
import logging

from goaltender.runner import gpus
from goaltender.runner.supervisor import ProcessResult
from goaltender.storage.records import Experiment, ExperimentStatus
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import DiskFull

log = logging.getLogger("goaltender.runner")


class LedgerRows:
    """The ledger's rows as runs end, and the rows of stopped runs still being closed."""

    def __init__(self, store: RunnerStore, compute_unit: str):
        self.store = store
        self.compute_unit = compute_unit  # "gpu" or "cpu": what a run's compute is charged in
        # experiment id -> (its goal id, the closing of its row: close_stopped)
        self._closing: dict[int, tuple[int, asyncio.Task]] = {}

    def closing(self, experiment_id: int) -> asyncio.Task | None:
        """The closing of a stopped run's row, while it is under way."""
        found = self._closing.get(experiment_id)
        return found[1] if found else None

    def closing_of(self, goal_id: int) -> list[asyncio.Task]:
        return [task for of_goal, task in self._closing.values() if of_goal == goal_id]

    def all_closing(self) -> list[asyncio.Task]:
        return [task for _, task in self._closing.values()]

    def close_stopped(
        self, experiment: Experiment, status: ExperimentStatus, note: str, used: ProcessResult | None
    ) -> None:
        """Enter a run that was stopped (its processes are gone). Its own task: what stopped it goes
        on at once, and a full disk holds only the row (written when there is room)."""

        # What it printed before it ended (a launcher's best checkpoint, in its grace period) stays.
        metrics = dict(used.summary) if used is not None else {}
        value = metrics.get(experiment.metric_name) if experiment.metric_name else None

        async def close() -> None:
            try:
                await self.finish(experiment, status, note, result=used, value=value, metrics=metrics)
            except DiskFull:  # the runner is shutting down on a full disk
                log.error(
                    "experiment #%d's row is not closed (%s: %s): the disk was still full at shutdown; "
                    "the next start enters it as interrupted",
                    experiment.id,
                    status,
                    note,
                )
            finally:
                self._closing.pop(experiment.id, None)

        self._closing[experiment.id] = (experiment.goal_id, asyncio.ensure_future(close()))

    async def finish(
        self,
        experiment: Experiment,
        status: ExperimentStatus,
        note: str | None,
        *,
        result: ProcessResult | None = None,
        value: float | None = None,
        metrics: dict[str, float] | None = None,
        new_best: bool = False,
        verified: bool = False,
        usage: gpus.Usage | None = None,
        interval: tuple[float, float, str] | None = None,
        within_noise: bool = False,
        repeats: int = 1,
    ) -> Experiment:
        """Enter the experiment's outcome in the ledger, charging its compute to the budget:
        GPU-hours (wall time × the GPUs it held) on a GPU box or when it held GPUs, else CPU-hours."""
        compute = None
        if result is not None:
            if experiment.gpus or self.compute_unit == "gpu":
                seconds = result.wall_seconds * experiment.gpus
            else:
                seconds = result.cpu_seconds
            compute = seconds / 3600
        return await self.store.finish_experiment(
            experiment.id,
            status=status,
            metric_value=value,
            metrics=metrics or {},
            wall_seconds=result.wall_seconds if result else None,
            cpu_seconds=result.cpu_seconds if result else None,
            compute_hours=compute,
            peak_rss_mb=result.peak_rss_mb if result else None,
            exit_code=result.exit_code if result else None,
            note=note,
            new_best=new_best,
            verified=verified,
            peak_gpu_memory_mb=usage.peak_memory_mib
            if usage and usage.mean_utilization is not None
            else None,
            gpu_utilization=usage.mean_utilization if usage else None,
            interval=interval,
            within_noise=within_noise,
            repeats=repeats,
        )
