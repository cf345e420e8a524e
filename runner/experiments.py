"""A goal's experiments: admitted against the budget, given a slot in the box's queue, run to their
end (each seed, then the eval command) by an executor (runner/executors.py), judged
(runner/judging.py) and entered in the ledger, charged what they used (runner/ledger_rows.py).

Admission asks the humans first when the default stop rule is reached, and refuses what the budget,
the goal's stage or the disk does not allow. A queued run checks the budget again when its turn
comes. A run stopped (its goal ended or paused over its disk cap, the runner shutting down) has
its row closed with what it used; a run whose processes have ended is left to enter its row. After
a crash, `close_interrupted` settles what the ledger says was running; a Ray or Slurm job outlives
the runner and is followed again to its end.

A little over 600 lines: the whole path of one run (admission → slot → run → judge → ledger) reads
in one place, and its state (the runs' tasks, why each was cancelled, which are concluding) is
shared by every step of it; the judging, the rows and the executors are apart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from goaltender.protocol import messages as p
from goaltender.protocol.budget import DEFAULT_BLOCK, check_new_experiment, experiment_timeout
from goaltender.runner import gpus, noise, stages
from goaltender.runner.agent_env import experiment_environment
from goaltender.runner.approvals import Approvals
from goaltender.runner.config import RunnerSettings
from goaltender.runner.disk_guard import DiskGuard
from goaltender.runner.executors import Executors, Job, LocalExecutor, OnStart, Placement
from goaltender.runner.folding import Spawn
from goaltender.runner.goal_records import GoalRecords
from goaltender.runner.holds import ExperimentHolds
from goaltender.runner.judging import (
    Attempt,
    NotStarted,
    add,
    beats,
    combined,
    judge,
    seed_note,
    seeded,
    together,
    total,
    with_unreadable,
)
from goaltender.runner.ledger_rows import LedgerRows
from goaltender.runner.low_signal import LowSignalPrompts
from goaltender.runner.report import best_experiment
from goaltender.runner.retention import prune_checkpoints
from goaltender.runner.sandbox import Sandbox
from goaltender.runner.server import Refused
from goaltender.runner.slots import Grant, Slots, Unfit, Waiting, waiting_for
from goaltender.runner.standby import Standbys
from goaltender.runner.supervisor import (
    ProcessResult,
    RunCancelled,
    SupervisionFailed,
    kill_leftover_group,
    leftover_usage,
)
from goaltender.storage.records import (
    Budget,
    Experiment,
    ExperimentStatus,
    Goal,
    MetricPoint,
    MilestoneReported,
    utcnow,
)
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import is_disk_full

log = logging.getLogger("goaltender.runner")
SetBudget = Callable[[Goal, Budget, str], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class ExperimentParts:
    """What the experiments are given: where they run (this box's sandbox, its GPUs, how compute
    is counted) and the concerns they ask (the disk, people, the deadline's owner)."""

    records: GoalRecords
    holds: ExperimentHolds
    disk: DiskGuard
    approvals: Approvals
    low_signal: LowSignalPrompts
    sandbox: Sandbox
    standbys: Standbys
    gpus: list[int]  # the box's GPUs (NVML indexes)
    compute_unit: str  # "gpu" or "cpu": what a run's compute is charged in
    spawn: Spawn
    set_budget: SetBudget  # a budget change (its deadline armed again)


class Experiments:
    """Every experiment of this runner's goals, from its admission to its row in the ledger."""

    def __init__(self, settings: RunnerSettings, store: RunnerStore, parts: ExperimentParts):
        self.settings = settings
        self.store = store
        self.records = parts.records
        self.holds = parts.holds
        self.disk = parts.disk
        self.approvals = parts.approvals
        self.low_signal = parts.low_signal
        self.rows = LedgerRows(store, parts.compute_unit)
        self._spawn = parts.spawn
        self._set_budget = parts.set_budget
        self.slots = Slots(settings.slots or os.cpu_count() or 1, parts.gpus, self._queue_moved)
        self.executors = Executors(settings, LocalExecutor(parts.sandbox, settings.name, parts.standbys))
        self._told_waiting: dict[int, str] = {}  # queued experiment id -> where it stands, as last written
        self._unwritten_waits: set[int] = set()
        self._writing_waits: asyncio.Task | None = None
        self._detached: set[int] = set()  # cluster runs left running at shutdown
        self._experiments: dict[int, asyncio.Task] = {}  # experiment id -> supervising task
        self._experiment_goal: dict[int, int] = {}
        self._concluding: set[int] = set()  # experiments whose processes are done: left to finish
        # experiment id -> how its row ends when its task is cancelled, and why
        self._cancel_reasons: dict[int, tuple[ExperimentStatus, str]] = {}
        self._goal_locks: dict[int, asyncio.Lock] = {}

    def running_goals(self) -> set[int]:
        """The goals with an experiment under way (queued or running)."""
        return set(self._experiment_goal.values())

    def rows_of(self, goal_id: int) -> list[asyncio.Task]:
        """What is still to be entered of the goal's runs: their tasks, and the rows being closed."""
        rows = [task for id_, task in self._experiments.items() if self._experiment_goal.get(id_) == goal_id]
        return rows + self.rows.closing_of(goal_id)

    # ---- stopped runs, shutdown and recovery ----

    async def stop(self, goal_id: int, note: str) -> None:
        """Kill the goal's runs (their rows are closed after: LedgerRows.close_stopped). A run
        whose processes have ended already is left to enter its row."""
        tasks = []
        for experiment_id, task in list(self._experiments.items()):
            if self._experiment_goal.get(experiment_id) == goal_id and experiment_id not in self._concluding:
                self._cancel_reasons[experiment_id] = ("crash", note)
                task.cancel()
                tasks.append(task)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Runner shutdown: every run stopped and its row closed (interrupted), except a cluster
        job, left running to be followed again at the next start."""
        for experiment_id, task in list(self._experiments.items()):
            experiment = await self.store.get_experiment(experiment_id)
            if experiment is not None and experiment.executor != "local" and experiment.job_id:
                # A cluster job outlives the runner: it is followed again at the next start.
                self.executors.get(experiment.executor).detach(experiment.job_id)
                self._detached.add(experiment_id)
            if experiment_id not in self._concluding:
                self._cancel_reasons[experiment_id] = ("interrupted", "interrupted: the runner shut down")
                task.cancel()
        await asyncio.gather(*self._experiments.values(), return_exceptions=True)
        await asyncio.gather(*self.rows.all_closing(), return_exceptions=True)

    async def close_interrupted(self, experiment: Experiment) -> None:
        """A run the runner lost track of in a crash: killed if it still runs, charged what can
        still be measured of it, and entered as `interrupted`, which does not count against
        max experiments (the agent runs it again if it wants it). A queued one never ran; a Ray
        or Slurm job outlives the runner, and is followed again to its end."""
        if experiment.status == "queued":
            await self.rows.finish(
                experiment, "interrupted", "never started: the runner restarted while it waited"
            )
            return
        if experiment.executor != "local" and experiment.job_id:
            self._follow_again(experiment)
            return
        started = experiment.started_at.timestamp()
        workspace = Path((await self.records.goal(experiment.goal_id)).workspace).resolve()
        used = leftover_usage(experiment.pid, started, workspace)  # before the kill: its CPU time so far
        killed = kill_leftover_group(experiment.pid, started, workspace)
        note = "interrupted: the runner restarted while it ran" + (
            " (process group killed)" if killed else ""
        )
        await self.rows.finish(experiment, "interrupted", note, result=used)

    def _follow_again(self, experiment: Experiment) -> None:
        task = asyncio.ensure_future(self._reattach(experiment))
        self._experiments[experiment.id] = task
        self._experiment_goal[experiment.id] = experiment.goal_id
        task.add_done_callback(lambda _: self._forget_experiment(experiment.id))

    async def _reattach(self, experiment: Experiment) -> None:
        """Follow a cluster job started before a restart to its end, and enter it like any other.
        Its eval command (if it had one) does not run again: the row says so."""
        goal = await self.records.goal(experiment.goal_id)
        assert experiment.job_id is not None
        placement = Placement(experiment.executor, experiment.host or "", experiment.job_id)
        job = self._job(goal, experiment, experiment.command)

        async def on_points(points: list[MetricPoint]) -> None:
            await self.store.add_metrics(goal.id, experiment.id, points)

        try:
            running = self.executors.get(experiment.executor).attach(job, placement, on_points=on_points)
            result = await self._measure(experiment, running)
        except OSError as exc:
            await self.rows.finish(experiment, "interrupted", f"lost after a runner restart: {exc}")
            return
        unverified = experiment.eval_command is not None
        status, note = judge(
            result, job.timeout_s, None if unverified else experiment.metric_name, result.summary
        )
        if unverified and status != "crash":
            note = "followed again after a runner restart; its eval command did not run (reported metric)"
        await self._conclude(goal, experiment, Attempt(result, status, note, result.summary, False))

    # ---- admission ----

    async def run(self, req: p.RunExperiment) -> tuple[Experiment, bool]:
        """Admit one experiment against the budget, wait for its slot, run it to its end and enter
        it in the ledger: (its row, whether it is the new best). A client that hangs up leaves it
        running (or queued)."""
        goal = await self.records.active_goal(req.goal_id)
        if why := stages.experiments_refused(goal):
            raise Refused("conflict", f"experiment not started: {why}")
        executor = req.executor or goal.executor or self.settings.executor
        self.executors.check(executor)
        wanted = self._gpus_wanted(req, goal, executor)
        unpaused = self.holds.unpaused(goal.id)
        if not unpaused.is_set():
            log.info("goal #%d is paused: its next experiment waits until it resumes", goal.id)
        await unpaused.wait()
        async with self._goal_locks.setdefault(goal.id, asyncio.Lock()):
            self.disk.check_space(goal.id)
            goal = await self._admit(goal.id, req)
            metric = req.metric or goal.metric
            if metric and goal.metric is None:
                await self.store.set_goal_metric(goal.id, metric, req.direction or "maximize")
                goal = await self.records.goal(goal.id)
            grant = self.slots.try_acquire(goal.id, wanted) if executor == "local" else None
            waiting = waiting_for(wanted) if executor == "local" and grant is None else None
            experiment = await self.store.start_experiment(
                goal.id,
                description=req.description,
                command=req.command,
                params=req.params,
                metric_name=metric,
                experiments_dir=Path(goal.workspace) / "experiments",
                eval_command=req.eval_command,
                waiting=waiting,
                executor=executor,
                host=self.settings.name if executor == "local" else None,
                # What it holds now: the GPUs granted here, or (on a cluster) those it asks for.
                gpus=wanted if executor != "local" else len(grant.devices) if grant else 0,
                devices=grant.cuda_visible_devices if grant and grant.devices else None,
            )
            if goal.id in self.records.ending:
                # The goal began to end while this row was written, too late to find its run: it
                # never starts (and does not count).
                if grant is not None:
                    self.slots.release(grant)
                return await self.rows.finish(
                    experiment, "interrupted", "never started: its goal ended"
                ), False
            task = asyncio.ensure_future(self._supervise(goal, experiment, req, grant, wanted))
            self._experiments[experiment.id] = task
            self._experiment_goal[experiment.id] = goal.id
            task.add_done_callback(lambda _: self._forget_experiment(experiment.id))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
            # Ended with its goal or the runner: its row says why (LedgerRows.close_stopped), once written.
            if (closing := self.rows.closing(experiment.id)) is not None:
                await asyncio.wait([closing])
            finished = await self.store.get_experiment(experiment.id)
            assert finished is not None, "its row was written before its task started"
            return finished, False

    def _gpus_wanted(self, req: p.RunExperiment, goal: Goal, executor: str) -> int:
        """GPUs the experiment asks for: its own word, its goal's, the box's, else 1 where there
        are GPUs (0 elsewhere). Refused at once when this box can never give them."""
        default = self.settings.gpus_per_experiment
        if default is None:
            default = 1 if self.slots.gpus else 0
        wanted = next(n for n in (req.gpus, goal.gpus_per_experiment, default) if n is not None)
        if executor == "local":
            try:
                self.slots.check(wanted)
            except Unfit as exc:
                remote = [name for name in self.settings.allowed_executors if name != "local"]
                elsewhere = f", or run it on a cluster (--executor {'|'.join(remote)})" if remote else ""
                raise Refused(
                    "bad_request", f"experiment not started: {exc}. Ask for fewer (--gpus){elsewhere}."
                ) from None
        return wanted

    def _queue_moved(self, waiting: list[Waiting]) -> None:
        """The box's queue changed: each queued experiment whose place changed is told (in its
        goal's thread card), in order, by one writer."""
        for w in waiting:
            if self._told_waiting.get(w.experiment_id) != w.text:
                self._told_waiting[w.experiment_id] = w.text
                self._unwritten_waits.add(w.experiment_id)
        if self._unwritten_waits and (self._writing_waits is None or self._writing_waits.done()):
            self._writing_waits = self._spawn(self._write_waits())

    async def _write_waits(self) -> None:
        while self._unwritten_waits:
            experiment_id = min(self._unwritten_waits)
            self._unwritten_waits.discard(experiment_id)
            if (text := self._told_waiting.get(experiment_id)) is not None:
                await self.store.experiment_waiting(experiment_id, text)

    async def _admit(self, goal_id: int, req: p.RunExperiment) -> Goal:
        """The goal, once the budget allows one more experiment (the default stop rule asks first)."""
        goal = await self.records.active_goal(goal_id)
        attempted, compute_used = await self.store.usage(goal.id)
        check = check_new_experiment(goal.budget, attempted, compute_used, utcnow())
        if not check.needs_continue_approval:
            if not check.ok:
                raise Refused("budget_exhausted", check.reason)
            return goal
        approval = await self.approvals.ask(
            goal,
            "continue",
            f"{check.reason}. Run {DEFAULT_BLOCK} more experiments?",
            f"Next: {req.description}\nBest so far is in the ledger above; reject to end the campaign.",
            None,
        )
        if approval.state != "approved":
            raise Refused("budget_exhausted", f"{check.reason}; continuing was {approval.state}")
        goal = await self.records.active_goal(goal.id)
        budget = goal.budget.model_copy(update={"max_experiments": attempted + DEFAULT_BLOCK})
        await self._set_budget(goal, budget, f"{approval.decided_by}: {DEFAULT_BLOCK} more experiments")
        return await self.records.active_goal(goal.id)

    def _forget_experiment(self, experiment_id: int) -> None:
        self._experiments.pop(experiment_id, None)
        self._experiment_goal.pop(experiment_id, None)
        self._concluding.discard(experiment_id)

    # ---- the slot and the run ----

    async def _supervise(
        self, goal: Goal, experiment: Experiment, req: p.RunExperiment, grant: Grant | None, wanted: int
    ) -> tuple[Experiment, bool]:
        """The experiment's life: its wait for a slot (local runs), its run and its eval, its row."""
        try:
            if experiment.status == "queued":
                grant = await self._wait_for_slot(experiment, wanted)
                await self._still_in_budget(experiment)
                experiment = await self.store.experiment_started(
                    experiment.id,
                    executor="local",
                    host=self.settings.name,
                    gpus=len(grant.devices),
                    devices=grant.cuda_visible_devices or None,
                )
            return await self._run(goal, experiment, req, grant)
        finally:
            if grant is not None:
                self.slots.release(grant)

    async def _still_in_budget(self, experiment: Experiment) -> None:
        """A queued run's turn has come: the goal's time and compute budgets again, which the runs
        before it may have spent (its count was checked as it was admitted). Parallel requests on
        a busy box all passed while nothing was spent, and ran to 5x a compute budget. Past them,
        it never starts (and does not count), refused as a run asked for then would be."""
        goal = await self.records.goal(experiment.goal_id)
        _, compute_used = await self.store.usage(goal.id)
        check = check_new_experiment(goal.budget, 0, compute_used, utcnow())
        if not check.ok:
            await self.rows.finish(experiment, "interrupted", f"never started: {check.reason}")
            raise Refused("budget_exhausted", check.reason)

    async def _wait_for_slot(self, experiment: Experiment, wanted: int) -> Grant:
        """Its turn in the box's queue; a goal paused meanwhile gives the slot back and waits to
        be resumed (then queues again), as pause holds every next run."""
        unpaused = self.holds.unpaused(experiment.goal_id)
        try:
            while True:
                grant = await self.slots.acquire(experiment.goal_id, experiment.id, wanted)
                if unpaused.is_set():
                    return grant
                self.slots.release(grant)
                self._told_waiting.pop(experiment.id, None)  # its place is written anew when it queues again
                await self.store.experiment_waiting(experiment.id, "waiting for its goal to be resumed")
                await unpaused.wait()
        except asyncio.CancelledError:
            # Stopped while queued: it never ran, so it is no fault of its and does not count.
            _, why = self._cancel_reasons.pop(experiment.id, ("interrupted", "cancelled"))
            self.rows.close_stopped(experiment, "interrupted", f"never started ({why})", None)
            raise
        finally:
            self._told_waiting.pop(experiment.id, None)

    def _job(
        self,
        goal: Goal,
        experiment: Experiment,
        command: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Job:
        """The experiment's run as its executor takes it (`timeout_s`: what it asked for, within
        the goal's budget)."""
        return Job(
            goal=goal,
            command=command,
            cwd=Path(cwd or goal.workspace),
            env=env or {},
            log_path=Path(experiment.log_path),
            name=f"goaltender-g{goal.id}-e{experiment.id}",
            gpus=experiment.gpus,
            timeout_s=experiment_timeout(goal.budget, timeout_s, utcnow()),
            grace_s=self.settings.stop_grace_s,
        )

    def _environment(
        self, goal: Goal, experiment: Experiment, req: p.RunExperiment, grant: Grant | None
    ) -> dict[str, str]:
        env = experiment_environment(self.settings, goal, experiment, req.env)
        if grant is not None and self.slots.gpus:
            # Only its own GPUs (none for a CPU-only run), numbered as NVML numbers them.
            env |= {"CUDA_VISIBLE_DEVICES": grant.cuda_visible_devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        elif experiment.executor != "local":
            env.pop("CUDA_VISIBLE_DEVICES", None)  # a cluster's engine assigns the GPUs
        return env

    async def _run(
        self, goal: Goal, experiment: Experiment, req: p.RunExperiment, grant: Grant | None
    ) -> tuple[Experiment, bool]:
        env = self._environment(goal, experiment, req, grant)
        job = self._job(goal, experiment, req.command, cwd=req.cwd, env=env, timeout_s=req.timeout_s)
        if grant is not None and experiment.executor == "local":
            job = dataclasses.replace(job, devices=grant.devices)
        executor = self.executors.get(experiment.executor)
        usage = gpus.Usage()
        watching = (
            asyncio.ensure_future(gpus.watch(grant.devices, self.settings.gpu_sample_s, usage))
            if grant is not None and grant.devices
            else None
        )

        async def on_points(points: list[MetricPoint]) -> None:
            await self.store.add_metrics(goal.id, experiment.id, points)

        async def placed(placement: Placement) -> None:
            pid = int(placement.job_id) if placement.executor == "local" else None
            await self.store.set_experiment_placement(
                experiment.id, host=placement.host, job_id=placement.job_id, pid=pid
            )

        async def run(part: Job, command: list[str], log_to: Path, on_start: OnStart) -> ProcessResult:
            part = dataclasses.replace(part, command=command, log_path=log_to)
            return await executor.run(part, on_points=on_points, on_start=on_start)

        async def attempt(seed: int, before: ProcessResult | None) -> Attempt:
            """One run (and its eval): with --repeat, seed N's logs are run-N+1.log, eval-N+1.log."""
            part = (
                job
                if req.repeat == 1
                else dataclasses.replace(job, env={**job.env, "GOALTENDER_SEED": str(seed)})
            )
            log_to = seeded(job.log_path, seed)
            result = await self._measure(experiment, run(part, req.command, log_to, placed), before)
            summary, verified = result.summary, False
            # With an eval command the run need not print the metric: the evaluation measures it.
            status, note = judge(result, job.timeout_s, None if req.eval_command else metric, summary)
            if status != "crash" and req.eval_command:
                # The runner measures the headline itself; the run's own numbers stay under `run/`.
                eval_log = seeded(job.log_path.parent / "eval.log", seed)
                try:
                    evaluation = await self._measure(
                        experiment, run(part, req.eval_command, eval_log, _ignore), add(before, result)
                    )
                except OSError as exc:
                    raise NotStarted(exc, add(before, result), "eval: ") from exc
                status, note = judge(evaluation, job.timeout_s, metric, evaluation.summary, what="eval")
                summary = {**{f"run/{k}": v for k, v in result.summary.items()}, **evaluation.summary}
                result = together(result, evaluation)
                verified = status != "crash"
            return Attempt(result, status, note, summary, verified)

        metric = experiment.metric_name
        attempts: list[Attempt] = []
        try:
            for seed in range(req.repeat):
                before = total([a.result for a in attempts])
                try:
                    attempts.append(await attempt(seed, before))
                except NotStarted as late:
                    what = seed_note(seed, req.repeat) + late.what
                    return await self._not_started(goal, experiment, late.cause, late.used, what=what), False
                except OSError as exc:
                    what = seed_note(seed, req.repeat)
                    return await self._not_started(goal, experiment, exc, before, what=what), False
                if attempts[-1].status == "crash":
                    break  # a crashed seed crashes the row: the rest would not change that
        finally:
            if watching is not None:
                watching.cancel()
        done = combined(attempts, metric, req.repeat)
        done.note = with_unreadable(done.note, done.result.unreadable_lines)
        # Its processes have ended: a goal's end or the runner's waits for its row, not cancels it
        # (cancelled in the middle of its writes, the row stayed `running`).
        self._concluding.add(experiment.id)
        return await self._conclude(goal, experiment, done, usage)

    # ---- judged, entered in the ledger ----

    async def _conclude(
        self, goal: Goal, experiment: Experiment, done: Attempt, usage: gpus.Usage | None = None
    ) -> tuple[Experiment, bool]:
        """Judge the finished run against the best so far, with its interval, and enter it in the
        ledger. A new best inside the noise of its predecessor is kept, flagged within noise."""
        status, note = done.status, done.note
        if status == "crash" and (space := self.disk.low_space()):
            note = f"{note}; the disk was nearly full when it ended ({space})"
        metric = experiment.metric_name
        value = done.summary.get(metric) if metric and status != "crash" else None
        new_best, found, noisy = False, None, False
        if value is not None and metric:
            found = noise.interval(metric, value, done.summary, done.seeds)
        if status == "keep" and value is not None:
            best = best_experiment(await self.store.experiments(goal.id), goal.direction)
            new_best = beats(value, best, goal.direction)
            status = "keep" if new_best else "discard"
            noisy = new_best and noise.within_noise(
                found, best.metric_value if best else None, goal.direction
            )
        finished = await self.rows.finish(
            experiment,
            status,
            note,
            result=done.result,
            value=value,
            metrics=done.summary,
            new_best=new_best,
            verified=done.verified,
            usage=usage,
            interval=(found.low, found.high, found.how) if found else None,
            within_noise=noisy,
            repeats=len(done.seeds) or 1,
        )
        await self._keep_checkpoints(goal)
        await self.low_signal.after_run(goal, finished, noisy)
        return finished, new_best

    async def _keep_checkpoints(self, goal: Goal) -> None:
        """After each run: the goal keeps its best GOALTENDER_KEEP_CHECKPOINTS checkpoints and the
        latest; what that frees is said in its thread."""
        if self.settings.keep_checkpoints <= 0:
            return
        experiments = await self.store.experiments(goal.id)
        pruned = await asyncio.to_thread(
            prune_checkpoints,
            Path(goal.workspace),
            experiments,
            direction=goal.direction,
            keep_best=self.settings.keep_checkpoints,
        )
        if pruned.removed:
            log.info("goal #%d: %s", goal.id, pruned.text())
            await self.store.append_event(
                goal.id, MilestoneReported(title="Checkpoints pruned", text=pruned.text())
            )

    async def _measure(
        self, experiment: Experiment, running: Awaitable[ProcessResult], before: ProcessResult | None = None
    ) -> ProcessResult:
        """One supervised process of the experiment, to its end. Cancelled (its goal ended, the
        runner is stopping), the row is closed then and there, charged what the process used (and
        `before`, an earlier process of the same experiment): killed work costs like any other."""
        try:
            return await running
        except asyncio.CancelledError as cancelled:
            if experiment.id in self._detached:
                raise  # left running on its cluster: its row stays open for the next runner
            used = cancelled.result if isinstance(cancelled, RunCancelled) else None
            if before is not None:
                used = before if used is None else together(before, used)
            status, note = self._cancel_reasons.pop(experiment.id, ("crash", "cancelled"))
            self.rows.close_stopped(experiment, status, note, used)
            raise
        except SupervisionFailed as failed:
            # A fault of the runner's own: the process was killed, its row is closed and charged.
            used = add(before, failed.result)
            await self.rows.finish(
                experiment, "crash", f"killed: the runner failed to follow it ({failed})", result=used
            )
            raise

    async def _not_started(
        self,
        goal: Goal,
        experiment: Experiment,
        exc: OSError,
        before: ProcessResult | None = None,
        what: str = "",
    ) -> Experiment:
        """A process that could not be started. For want of disk space that is no fault of the
        experiment: its goal pauses until there is room, and the row does not count."""
        if is_disk_full(exc):
            space = self.disk.free_space()
            self.disk.pause_for_disk(goal.id, space)
            note = f"{what}not started: disk full: {space}"
            return await self.rows.finish(experiment, "interrupted", note, result=before)
        return await self.rows.finish(experiment, "crash", f"{what}could not start: {exc}", result=before)


async def _ignore(placement: Placement) -> None:
    return None  # an eval command's placement: its run's is the row's
