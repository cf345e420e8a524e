"""Where an experiment's processes run: on this box (local), as a Ray job, or as a Slurm job.

One interface for all three. The runner keeps supervising whichever runs it: the process's output
ends up in the experiment's run.log (written there by the process, or copied there from the
engine's log as it grows), metrics are read from it as they come (LiveMetrics), the per-run
timeout and a stop cancel it, and a ProcessResult says what it used. A remote job outlives a
runner restart: `attach` follows it again from its Placement. `Executors` gives each by name, and
refuses one an operator has not allowed this runner's goals (GOALTENDER_EXECUTORS).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from goaltender.runner.config import RunnerSettings
from goaltender.runner.sandbox import Sandbox
from goaltender.runner.server import Refused
from goaltender.runner.standby import Standbys
from goaltender.runner.supervisor import Launch, ProcessResult, run_supervised, spawn
from goaltender.storage.records import Goal, MetricPoint

log = logging.getLogger("goaltender.runner")
EXECUTORS = ("local", "ray", "slurm")
OnPoints = Callable[[list[MetricPoint]], Awaitable[None]]


@dataclass(frozen=True)
class Placement:
    """Where a process runs: which executor, on what (a box, a Ray address, a Slurm cluster), and
    its id there (a pid, a Ray submission id, a Slurm job id)."""

    executor: str
    host: str
    job_id: str


OnStart = Callable[[Placement], Awaitable[None]]


@dataclass(frozen=True)
class Job:
    """One process of an experiment (its run, or its eval command)."""

    goal: Goal
    command: list[str]
    cwd: Path
    env: dict[str, str]  # CUDA_VISIBLE_DEVICES included when this box assigned GPUs
    log_path: Path  # inside the goal's workspace
    name: str  # e.g. goaltender-g3-e12: how the job shows in the engine's queue
    gpus: int  # GPUs it asks for (a remote engine picks them; locally they are in env)
    timeout_s: float | None
    grace_s: float
    devices: tuple[int, ...] = ()  # the GPUs this box granted it (NVML indices): all its sandbox shows


class Executor(Protocol):
    name: str

    async def run(self, job: Job, *, on_points: OnPoints, on_start: OnStart) -> ProcessResult:
        """Start the job and follow it to its end. Cancelled, it stops the job (a remote one is
        cancelled in its engine) and raises RunCancelled with what it used."""
        ...

    async def attach(self, job: Job, placement: Placement, *, on_points: OnPoints) -> ProcessResult:
        """After a runner restart: follow a job started before it to its end, like `run`."""
        ...

    def detach(self, job_id: str) -> None:
        """The runner is shutting down: when this job's `run` or `attach` is cancelled next, it
        stops following and leaves the job be (a cluster job outlives the runner)."""
        ...


class LocalExecutor:
    """On this box, in the goal's sandbox and cgroup, as the leader of its own process group;
    handed to the goal's standby interpreter when it can take the command (runner/standby.py).
    Its result says what the goal's limits did while it ran (runner/limits.py)."""

    name = "local"

    def __init__(self, sandbox: Sandbox, box: str, standbys: Standbys | None = None):
        self.sandbox = sandbox
        self.box = box
        self.standbys = standbys

    def launch(self, job: Job) -> Launch:
        return self.sandbox.launch(job.goal, job.command, cwd=job.cwd, env=job.env, gpus=job.devices)

    async def run(self, job: Job, *, on_points: OnPoints, on_start: OnStart) -> ProcessResult:
        async def started(pid: int) -> None:
            await on_start(Placement("local", self.box, str(pid)))

        beneath = Path(job.goal.workspace)
        standby = self.standbys.take(job) if self.standbys is not None else None
        launch = standby.launch if standby is not None else self.launch(job)

        def start() -> subprocess.Popen:
            if standby is None:
                return spawn(launch, log_path=job.log_path, beneath=beneath)
            try:
                return standby.hand_off(job)
            except OSError as exc:
                assert self.standbys is not None
                log.info("goal #%d: a standby could not take its run (%s)", job.goal.id, exc)
                self.standbys.release(standby)
                return spawn(self.launch(job), log_path=job.log_path, beneath=beneath)

        limits = self.sandbox.limits
        before = limits.counters(job.goal.id) if limits is not None else None
        try:
            result = await run_supervised(
                launch,
                log_path=job.log_path,
                beneath=beneath,
                timeout_s=job.timeout_s,
                on_points=on_points,
                on_start=started,
                grace_s=job.grace_s,
                start=start,
            )
            if limits is not None and before is not None:
                result.limits = limits.usage(job.goal.id, before)
            return result
        finally:
            # The goal's next standby warms once this process is done, not while it runs: on a
            # small box it would take the run's CPU (a training run's BLAS threads use every core).
            # Spawned after its result is passed on (a sandbox's spawn holds the runner ~3 ms), so
            # the run's eval, or the experiment's row, does not wait for it.
            if self.standbys is not None:
                asyncio.get_running_loop().call_soon(self.standbys.refill, job.goal)

    async def attach(self, job: Job, placement: Placement, *, on_points: OnPoints) -> ProcessResult:
        # A local process dies with its sandbox when the runner goes (--die-with-parent): there is
        # nothing to attach to; recovery marks the run interrupted.
        raise ProcessLookupError(f"local process {placement.job_id} did not outlive the runner")

    def detach(self, job_id: str) -> None:
        pass  # it dies with the runner: nothing outlives it to attach to


class Executors:
    """The executors this runner's goals may use, by name: local always; Ray's and Slurm's made
    when first used."""

    def __init__(self, settings: RunnerSettings, local: LocalExecutor):
        self.settings = settings
        self._made: dict[str, Executor] = {"local": local}

    def check(self, executor: str) -> None:
        """Refused unless an operator lets this runner's goals use `executor`: a remote one runs
        outside the goal's sandbox, so a goal's agent (or its submitter) cannot pick one alone."""
        allowed = self.settings.allowed_executors
        if executor not in allowed:
            raise Refused(
                "forbidden",
                f"this runner's goals may not use the {executor} executor: it runs commands outside "
                f"the goal's sandbox, so an operator allows it (GOALTENDER_EXECUTORS); allowed here: "
                f"{', '.join(allowed)}",
            )

    def get(self, name: str) -> Executor:
        """The executor by name."""
        if name not in self._made:
            if name == "ray":
                from goaltender.runner.ray_executor import RayExecutor

                self._made[name] = RayExecutor(self.settings.ray_address, self.settings.ray_token or None)
            elif name == "slurm":
                from goaltender.runner.slurm_executor import SlurmExecutor

                self._made[name] = SlurmExecutor(
                    partition=self.settings.slurm_partition or None, extra_args=self.settings.slurm_args
                )
            else:
                raise Refused("bad_request", f"no executor {name!r}; there are local, ray and slurm")
        return self._made[name]
