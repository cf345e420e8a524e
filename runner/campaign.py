"""Each goal's campaign: its agent started, watched and ended; its experiments admitted against the
budget, supervised, judged and entered in the ledger; the approvals it waits on; its deadline.

Every way a goal ends (its agent exits or cannot start, the deadline passes, an operator stops it)
goes through `end_goal`: its downloads from the hub (runner/fetches.py), the agent and the goal's
experiments are stopped with their whole process groups, then whatever is left in the goal's cgroup
(runner/limits.py), pending approvals expire, the goal's socket, network and /tmp go, and the final
report is written once.

A full disk stops no control. What a person or an agent changes is carried out at once and written
to runner.db through the goal's own queue (`_record`: in order, each waiting for room); the reply
waits for the write only while the disk has room, and until it is written the goal's status shows
the state it is in (`_unrecorded`). A goal ended, paused or resumed on a full disk is so at once;
the runner's log says what a shutdown on a full disk left unwritten.

The agent and every experiment and eval command run in the goal's sandbox (runner/sandbox.py),
holding only the goal's own socket (`AgentSockets`, the server), which lets them act on this goal
through the agent verbs and on nothing else.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import os
import statistics
import subprocess
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

from goaltender.protocol import messages as p
from goaltender.protocol.budget import DEFAULT_BLOCK, check_new_experiment, experiment_timeout
from goaltender.runner import goal_disk, gpus, noise, stages
from goaltender.runner.agent_env import agent_environment, experiment_environment, goal_environment
from goaltender.runner.config import RunnerSettings
from goaltender.runner.executors import Executor, Job, LocalExecutor, OnStart, Placement
from goaltender.runner.fetches import HubFetches
from goaltender.runner.folding import Folding
from goaltender.runner.limits import Counters, GoalCgroups
from goaltender.runner.report import best_experiment, final_report
from goaltender.runner.retention import prune_checkpoints
from goaltender.runner.sandbox import Sandbox
from goaltender.runner.server import Refused
from goaltender.runner.slots import Grant, Slots, Unfit, Waiting, waiting_for
from goaltender.runner.standby import Standbys
from goaltender.runner.supervisor import (
    MAX_LINE,
    Launch,
    ProcessResult,
    RunCancelled,
    SupervisionFailed,
    kill_leftover_group,
    leftover_usage,
    read_end_beneath,
    spawn,
    terminate_group,
    wait_process,
)
from goaltender.storage.direction import better
from goaltender.storage.records import (
    AGENT_LOG,
    TERMINAL_STATES,
    Approval,
    Budget,
    Event,
    Experiment,
    ExperimentStatus,
    Goal,
    GoalState,
    HubFetched,
    MetricPoint,
    MilestoneReported,
    utcnow,
)
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import DiskFull, FreeSpace, free_space, is_disk_full

log = logging.getLogger("goaltender.runner")
AGENT_LOG_TAIL = 1500  # bytes of agent.log quoted when an agent fails
WAITING_WRITES_MOST = 100  # an agent's writes of one goal held for room on a full disk; past it, refused
ACTIVE = ("running", "waiting_for_approval")  # the states a full disk pauses
WAITING_QUESTIONS = 5  # an agent's questions waiting for people at once, per goal
T = TypeVar("T")
Post = MilestoneReported | HubFetched  # what an agent's requests post to its thread (Campaigns.post)


class AgentSockets(Protocol):
    """Where each goal's capability is served (the server): opened for its agent, closed at its end."""

    async def open_agent_socket(self, goal_id: int, path: Path) -> None: ...

    def close_agent_socket(self, goal_id: int) -> None: ...


class Campaigns:
    """Every goal's campaign on this runner, and the processes, tasks and waits each one holds."""

    def __init__(self, settings: RunnerSettings, store: RunnerStore, sockets: AgentSockets):
        self.settings = settings
        self.store = store
        self.sockets = sockets
        self.limits = GoalCgroups(settings)  # started by the runner (runner/daemon.py)
        inventory = gpus.inventory() if settings.compute_unit != "cpu" else []
        minors = {g.index: g.minor for g in inventory if g.minor is not None}
        self.sandbox = Sandbox(settings, minors, self.limits)
        self.compute_unit = "gpu" if (settings.compute_unit == "gpu" or inventory) else "cpu"
        self.slots = Slots(
            settings.slots or os.cpu_count() or 1, [g.index for g in inventory], self._queue_moved
        )
        self.standbys = Standbys(self.sandbox, settings)
        self.fetches = HubFetches(settings)  # goals' downloads into the shared hub cache
        self._executors: dict[str, Executor] = {
            "local": LocalExecutor(self.sandbox, settings.name, self.standbys)
        }
        self._told_waiting: dict[int, str] = {}  # queued experiment id -> where it stands, as last written
        self._unwritten_waits: set[int] = set()
        self._writing_waits: asyncio.Task | None = None
        self._detached: set[int] = set()  # cluster runs left running at shutdown
        self._asking_low_signal: set[int] = set()  # goals with a low-signal prompt open
        self._asked_flat: set[int] = set()  # goals asked about a training curve that did not move
        self._agents: dict[int, subprocess.Popen] = {}  # goal id -> its agent
        self._experiments: dict[int, asyncio.Task] = {}  # experiment id -> supervising task
        self._experiment_goal: dict[int, int] = {}
        self._concluding: set[int] = set()  # experiments whose processes are done: left to finish
        # experiment id -> how its row ends when its task is cancelled, and why
        self._cancel_reasons: dict[int, tuple[ExperimentStatus, str]] = {}
        self._approval_waiters: dict[int, asyncio.Future[Approval]] = {}
        self._deadline_timers: dict[int, asyncio.Task] = {}
        self._unpaused: dict[int, asyncio.Event] = {}  # set unless the goal is paused
        self._goal_locks: dict[int, asyncio.Lock] = {}
        self._ending: set[int] = set()
        self._disk_waits: dict[int, asyncio.Task] = {}  # goal id -> its wait for disk space
        self._over_cap: set[int] = set()  # goals paused for their disk cap (runner/goal_disk.py)
        self._asking: dict[int, asyncio.Lock] = {}  # goal id -> its agent's questions, one at a time
        self._disk_full_logged = False
        self._tasks: set[asyncio.Task] = set()
        self._recording: dict[int, asyncio.Task] = {}  # goal id -> the last of its writes queued (_record)
        self._queued_writes: collections.Counter[int] = collections.Counter()  # goal id -> writes queued
        # goal id -> the state it is in, until runner.db has it: (state, reason)
        self._unrecorded: dict[int, tuple[GoalState, str]] = {}
        # experiment id -> (its goal id, the closing of its row, killed: _close_row)
        self._rows: dict[int, tuple[int, asyncio.Task]] = {}
        self.folding = Folding(
            settings.milestone_burst, settings.milestones_per_minute, self._show_folded, self._spawn
        )

    # ---- goals ----

    async def goal(self, goal_id: int) -> Goal:
        goal = await self.store.get_goal(goal_id)
        if goal is None:
            raise Refused("not_found", f"no goal #{goal_id}")
        return self.as_it_stands(goal)

    def as_it_stands(self, goal: Goal) -> Goal:
        """The goal as runner.db has it, in the state it is in when that is not written yet."""
        if (unrecorded := self._unrecorded.get(goal.id)) is None or goal.state in TERMINAL_STATES:
            return goal
        state, reason = unrecorded
        ended = {"end_reason": reason} if state in TERMINAL_STATES else {}
        return goal.model_copy(update={"state": state, **ended})

    async def active_goal(self, goal_id: int) -> Goal:
        """The goal, if it still takes changes (not ended, not ending)."""
        goal = await self.goal(goal_id)
        if goal.state in TERMINAL_STATES or goal_id in self._ending:
            why = f" ({goal.end_reason.splitlines()[0]})" if goal.end_reason else ""
            raise Refused(
                "conflict",
                f"goal #{goal_id} is {goal.state}{why}; it takes no more changes. Start a new goal.",
            )
        return goal

    # ---- recovery and shutdown ----

    async def recover(self) -> None:
        """After a crash or restart: nothing the log says is running may be left half-done."""
        for experiment in await self.store.running_experiments():
            await self._close_interrupted(experiment)
        # Measured (and killed by process group) above; now whatever of theirs is left anywhere,
        # and the cgroups themselves: the goals resumed below get new ones.
        await self.limits.clear_stale()
        for approval in await self.store.pending_approvals():
            await self.store.decide_approval(
                approval.id,
                state="expired",
                by="runner",
                comment="the runner restarted; the agent will ask again",
            )
        for goal in await self.store.list_goals(active_only=True):
            await self._resume(goal)
        self._spawn(self._watch_disk())
        self._spawn(self._watch_goal_disks())

    async def _close_interrupted(self, experiment: Experiment) -> None:
        """A run the runner lost track of in a crash: killed if it still runs, charged what can
        still be measured of it, and entered as `interrupted`, which does not count against
        max experiments (the agent runs it again if it wants it). A queued one never ran; a Ray
        or Slurm job outlives the runner, and is followed again to its end."""
        if experiment.status == "queued":
            await self._finish(
                experiment, "interrupted", "never started: the runner restarted while it waited"
            )
            return
        if experiment.executor != "local" and experiment.job_id:
            self._follow_again(experiment)
            return
        started = experiment.started_at.timestamp()
        workspace = Path((await self.goal(experiment.goal_id)).workspace).resolve()
        used = leftover_usage(experiment.pid, started, workspace)  # before the kill: its CPU time so far
        killed = kill_leftover_group(experiment.pid, started, workspace)
        note = "interrupted: the runner restarted while it ran" + (
            " (process group killed)" if killed else ""
        )
        await self._finish(experiment, "interrupted", note, result=used)

    def _follow_again(self, experiment: Experiment) -> None:
        task = asyncio.ensure_future(self._reattach(experiment))
        self._experiments[experiment.id] = task
        self._experiment_goal[experiment.id] = experiment.goal_id
        task.add_done_callback(lambda _: self._forget_experiment(experiment.id))

    async def _reattach(self, experiment: Experiment) -> None:
        """Follow a cluster job started before a restart to its end, and enter it like any other.
        Its eval command (if it had one) does not run again: the row says so."""
        goal = await self.goal(experiment.goal_id)
        assert experiment.job_id is not None
        placement = Placement(experiment.executor, experiment.host or "", experiment.job_id)
        job = self._job(goal, experiment, experiment.command)

        async def on_points(points: list[MetricPoint]) -> None:
            await self.store.add_metrics(goal.id, experiment.id, points)

        try:
            running = self.executor(experiment.executor).attach(job, placement, on_points=on_points)
            result = await self._measure(experiment, running)
        except OSError as exc:
            await self._finish(experiment, "interrupted", f"lost after a runner restart: {exc}")
            return
        unverified = experiment.eval_command is not None
        status, note = _judge(
            result, job.timeout_s, None if unverified else experiment.metric_name, result.summary
        )
        if unverified and status != "crash":
            note = "followed again after a runner restart; its eval command did not run (reported metric)"
        await self._conclude(goal, experiment, _Attempt(result, status, note, result.summary, False))

    async def _resume(self, goal: Goal) -> None:
        accepted = goal.accepted_at.timestamp() if goal.accepted_at else None
        kill_leftover_group(goal.agent_pid, accepted, Path(goal.workspace).resolve())
        if goal.state == "paused":
            self.hold_experiments(goal.id)
            if await self.store.paused_for_disk(goal.id):
                self._disk_waits[goal.id] = self._spawn(self._resume_when_space(goal.id))
        if goal.budget.deadline and utcnow() >= goal.budget.deadline:
            await self.end_goal(goal.id, "finished", "deadline reached while the runner was down")
            return
        if goal.state == "waiting_for_approval":
            await self.store.set_goal_state(goal.id, "running", "the runner restarted")
        if await self.store.folded_unshown(goal.id):
            self.folding.left_folded(goal.id)
        await self.store.append_event(
            goal.id,
            MilestoneReported(
                title="Runner restarted",
                text="Interrupted experiments are marked interrupted (they do not count against max "
                "experiments); the agent resumes from the ledger and diary.",
            ),
        )
        await self.start_agent(await self.goal(goal.id), resumed=True)

    async def close(self) -> None:
        """Runner shutdown: stop every agent and experiment, and leave the goals as they are (a
        restart resumes them). What is queued for runner.db is written, unless the disk is still
        full: then the log says what was not."""
        self.store.stop_waiting_for_room()
        for task in self._tasks:
            task.cancel()
        await self.fetches.close()
        await self.standbys.close()
        for proc in list(self._agents.values()):
            await terminate_group(proc.pid, None, self.settings.stop_grace_s)
            proc.poll()  # reap it (its watcher was cancelled), so no zombie is left behind
        for experiment_id, task in list(self._experiments.items()):
            experiment = await self.store.get_experiment(experiment_id)
            if experiment is not None and experiment.executor != "local" and experiment.job_id:
                # A cluster job outlives the runner: it is followed again at the next start.
                self.executor(experiment.executor).detach(experiment.job_id)
                self._detached.add(experiment_id)
            if experiment_id not in self._concluding:
                self._cancel_reasons[experiment_id] = ("interrupted", "interrupted: the runner shut down")
                task.cancel()
        await asyncio.gather(*self._experiments.values(), return_exceptions=True)
        rows = [task for _, task in self._rows.values()]
        await asyncio.gather(*rows, *self._recording.values(), return_exceptions=True)
        self.sandbox.networks.close_all()
        await self.limits.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- writes in each goal's order ----

    def _record(
        self,
        goal_id: int,
        write: Callable[[], Awaitable[T]],
        what: str,
        shows: tuple[GoalState, str] | None = None,
    ) -> asyncio.Task[T]:
        """Write `what` (a change of the goal, already carried out) to runner.db after the goal's
        writes queued before it; on a full disk it waits for room. Until it is written, the goal's
        status shows `shows` (the state it leaves). A shutdown waits for it (Campaigns.close)."""
        before = self._recording.get(goal_id)
        if shows is not None:
            self._unrecorded[goal_id] = shows

        async def in_turn() -> T:
            if before is not None:
                await asyncio.wait([before])  # its outcome is its own
            try:
                return await write()
            except DiskFull:  # only once the runner is shutting down
                log.error(
                    "goal #%d: %s is not in runner.db: the disk was still full at shutdown; the next start "
                    "takes the goal as runner.db has it",
                    goal_id,
                    what,
                )
                raise
            finally:
                if shows is not None and self._unrecorded.get(goal_id) is shows:
                    del self._unrecorded[goal_id]

        task = asyncio.ensure_future(in_turn())
        self._recording[goal_id] = task
        self._queued_writes[goal_id] += 1
        task.add_done_callback(functools.partial(self._recorded, goal_id))
        return task

    def _recorded(self, goal_id: int, task: asyncio.Task) -> None:
        if self._recording.get(goal_id) is task:
            del self._recording[goal_id]
        self._queued_writes[goal_id] -= 1
        if not self._queued_writes[goal_id]:
            del self._queued_writes[goal_id]
        if not task.cancelled() and (exc := task.exception()) and not isinstance(exc, DiskFull):
            log.error("goal #%d: a write failed", goal_id, exc_info=exc)

    async def change_state(self, goal_id: int, state: GoalState, reason: str) -> bool:
        """A person paused or resumed the goal (carried out by the caller): record it. True once
        written; False on a full disk, where it is written when there is room."""
        recording = self._record(
            goal_id,
            lambda: self.store.set_goal_state(goal_id, state, reason),
            f"{state} ({reason})",
            (state, reason),
        )
        return await self.store.done_unless_full(recording)

    async def write_in_turn(
        self, goal_id: int, write: Callable[[], Awaitable[T]], what: str
    ) -> tuple[bool, T | None]:
        """An agent's write about its goal: (True, its result) once written; (False, None) on a
        full disk, where it waits in the goal's queue for room. Refused (disk_full) when the goal
        has WAITING_WRITES_MOST queued already."""
        if self._queued_writes[goal_id] >= WAITING_WRITES_MOST:
            raise Refused(
                "disk_full",
                f"{what} not taken: the disk is full, and goal #{goal_id} has {WAITING_WRITES_MOST} writes "
                "waiting for room already; try again when there is room",
            )
        recording = self._record(goal_id, write, what)
        if await self.store.done_unless_full(recording):
            return True, recording.result()
        return False, None

    async def post(self, goal_id: int, data: Post, what: str) -> tuple[bool, Event | None, bool]:
        """A post to the goal's thread made for its agent (a milestone, a fetch's record), logged
        as write_in_turn does, folded past the goal's rate (runner/folding.py): (written, its
        event once written, folded)."""
        folded = not self.folding.arrive(goal_id)
        if folded:
            data = data.model_copy(update={"folded": True})
        written, event = await self.write_in_turn(
            goal_id, lambda: self.store.append_event(goal_id, data), what
        )
        return written, event, folded

    def _show_folded(self, goal_id: int) -> None:
        self._record(goal_id, lambda: self.store.show_folded(goal_id), "its folded posts' summary")

    # ---- the agent ----

    async def start_agent(self, goal: Goal, *, resumed: bool) -> None:
        """Start the goal's agent, in its sandbox, with the goal's socket as its way to the runner."""
        workspace = Path(goal.workspace)
        workspace.mkdir(parents=True, exist_ok=True)
        env = agent_environment(self.settings, goal, resumed=resumed)
        command = self.settings.agents[goal.agent]
        try:
            await self.sandbox.open_goal(goal.id)
            await self.sockets.open_agent_socket(goal.id, self.settings.agent_socket(goal.id))
            if (goal.executor or self.settings.executor) == "local":
                # Before the agent, whose start is shorter than the first run's standby's (numpy):
                # that run waits on it. (The standby's sandbox binds the goal's socket, there now.)
                self.standbys.keep(goal)
            launch = self.sandbox.launch(goal, command, cwd=workspace, env=env, agent=True)
            proc = spawn(launch, log_path=workspace / AGENT_LOG, beneath=workspace)
        except OSError as exc:
            await self.end_goal(goal.id, "failed", f"could not start agent {goal.agent!r}: {exc}")
            return
        self._agents[goal.id] = proc
        await self.store.set_agent_pid(goal.id, proc.pid)
        if goal.state in ("accepted", "submitted"):
            await self.store.set_goal_state(goal.id, "running", f"agent {goal.agent} started")
        self._spawn(self._watch_agent(goal.id, proc, launch))
        self.arm_deadline(goal)

    async def _watch_agent(self, goal_id: int, proc: subprocess.Popen, launch: Launch) -> None:
        status, _ = await wait_process(proc)
        self._agents.pop(goal_id, None)
        if goal_id in self._ending:
            return
        code = launch.exit_code(status)
        if code == 0:
            await self.end_goal(goal_id, "finished", "the agent finished")
        else:
            goal = await self.goal(goal_id)
            tail = _tail_text(Path(goal.workspace), AGENT_LOG_TAIL)
            # Its cgroup was made for it: what its limits did since is what they did in its life.
            usage = self.limits.usage(goal_id, Counters())
            said = (
                "".join(f", {what}" for what in usage.verdict(-code if code < 0 else None)) if usage else ""
            )
            await self.end_goal(goal_id, "failed", f"the agent exited with code {code}{said}:\n{tail}")

    # ---- budget, deadline, pause ----

    async def set_budget(self, goal: Goal, budget: Budget, reason: str) -> None:
        goal = await self.store.update_budget(goal.id, budget, reason)
        self.arm_deadline(goal)

    def arm_deadline(self, goal: Goal) -> None:
        if old := self._deadline_timers.pop(goal.id, None):
            old.cancel()
        if goal.budget.deadline is not None:
            self._deadline_timers[goal.id] = self._spawn(self._end_at(goal.id, goal.budget.deadline))

    async def _end_at(self, goal_id: int, deadline: datetime) -> None:
        await asyncio.sleep(max(0.0, (deadline - utcnow()).total_seconds()))
        self._deadline_timers.pop(goal_id, None)
        await self.end_goal(goal_id, "finished", "deadline reached")

    def hold_experiments(self, goal_id: int) -> None:
        """Paused: the current experiment finishes, a new one waits for release_experiments."""
        self._unpaused_event(goal_id).clear()

    def release_experiments(self, goal_id: int) -> None:
        self._unpaused_event(goal_id).set()

    def _unpaused_event(self, goal_id: int) -> asyncio.Event:
        if goal_id not in self._unpaused:
            self._unpaused[goal_id] = asyncio.Event()
            self._unpaused[goal_id].set()
        return self._unpaused[goal_id]

    # ---- a full disk ----

    def free_space(self) -> FreeSpace:
        try:
            return free_space(self.settings.home)  # the module's probe, looked up here: tests replace it
        except OSError:
            return FreeSpace(self.settings.home, 0)

    def low_space(self) -> FreeSpace | None:
        """The home's free space, when it is below the floor (GOALTENDER_MIN_FREE_MB)."""
        space = self.free_space()
        return space if space.free_mb < self.settings.min_free_mb else None

    def wait_for_space_on_writes(self) -> None:
        """From now on a write to runner.db that finds the disk full waits and is tried again
        (until then it fails, so that a runner that cannot start says so and exits)."""
        self.store.when_full = self._on_disk_full

    async def _on_disk_full(self, full: DiskFull) -> None:
        """A write found the disk full: every active goal pauses, and the write is tried again
        once there is room. Nothing is lost: the row that could not be closed is closed then."""
        if not self._disk_full_logged:
            log.error("%s: goals pause, writes wait until there is room", full)
            self._disk_full_logged = True
        for goal in await self.store.list_goals(active_only=True):
            if goal.state in ACTIVE:
                self.pause_for_disk(goal.id, full.space)
        await asyncio.sleep(self.settings.disk_check_s)
        await self._until_space()

    async def _watch_disk(self) -> None:
        """While experiments run, the disk is looked at every GOALTENDER_DISK_CHECK_S: below the
        floor, each goal with a run pauses (the run goes on; nothing new starts) and says why."""
        while True:
            await asyncio.sleep(self.settings.disk_check_s)
            if self._experiments and (space := self.low_space()):
                for goal_id in set(self._experiment_goal.values()):
                    self.pause_for_disk(goal_id, space)

    async def _watch_goal_disks(self) -> None:
        """Every GOALTENDER_GOAL_DISK_CHECK_S, each goal is held to its disk cap (runner/goal_disk.py)."""
        if not (cap := goal_disk.disk_cap(self.settings)):
            return
        while True:
            await asyncio.sleep(self.settings.goal_disk_check_s)
            for goal in await self.store.list_goals(active_only=True):
                places = goal_disk.goal_places(self.settings, Path(goal.workspace), goal.id)
                if goal.id in self._ending or (used := await goal_disk.bytes_held(places)) is None:
                    continue
                paused_for_it = goal.id in self._over_cap and goal.state == "paused"
                await self._hold_to_disk_cap(goal.id, goal_disk.judge(used, cap, paused_for_it))

    async def _hold_to_disk_cap(self, goal_id: int, verdict: goal_disk.Verdict) -> None:
        """Over its cap, a goal's runs stop and it pauses; still growing past it while paused, it ends."""
        if verdict.action == "ok":
            self._over_cap.discard(goal_id)
        elif verdict.action == "end":
            await self.end_goal(goal_id, "failed", verdict.reason)
        elif goal_id not in self._over_cap or (await self.goal(goal_id)).state != "paused":
            self._over_cap.add(goal_id)
            self.forget_disk_pause(goal_id)
            self.hold_experiments(goal_id)
            log.info("goal #%d: %s", goal_id, verdict.reason)
            await self._cancel_experiments(goal_id, f"stopped: the goal {verdict.reason.split(' (')[0]}")
            await self.change_state(goal_id, "paused", f"paused: {verdict.reason}")

    def pause_for_disk(self, goal_id: int, space: FreeSpace) -> None:
        """Hold the goal's experiments until the disk has room again; its status says paused at
        once, and its thread is told why as soon as that can be written (and again when it goes
        on). A goal a person has paused stays theirs."""
        held = not self._unpaused_event(goal_id).is_set()
        if goal_id in self._ending or goal_id in self._disk_waits or held:
            return
        self.hold_experiments(goal_id)
        reason = (
            f"disk full: {space}, under the {self.settings.min_free_mb:g} MB this runner keeps free "
            "(GOALTENDER_MIN_FREE_MB); no new experiment starts until there is room"
        )
        pausing = self._record(
            goal_id,
            lambda: self.store.pause_for_disk(goal_id, reason),
            "its pause for the disk",
            ("paused", reason),
        )
        self._disk_waits[goal_id] = self._spawn(self._resume_when_space(goal_id, pausing))

    def forget_disk_pause(self, goal_id: int) -> None:
        """A person took over (resumed the goal, or paused it themselves): it no longer resumes by
        itself when there is room."""
        if (task := self._disk_waits.pop(goal_id, None)) is not None:
            task.cancel()

    async def paused_for_disk(self, goal_id: int) -> bool:
        """Paused for a full disk (and so to resume by itself when there is room), written yet or not."""
        return goal_id in self._disk_waits or await self.store.paused_for_disk(goal_id)

    async def _resume_when_space(
        self, goal_id: int, pausing: asyncio.Task[Goal | None] | None = None
    ) -> None:
        if pausing is not None and await asyncio.shield(pausing) is None:
            # Paused by a person already (it stays so), or ended.
            self._disk_waits.pop(goal_id, None)
            if (await self.goal(goal_id)).state != "paused":
                self.release_experiments(goal_id)
            return
        await self._until_space()
        self._disk_waits.pop(goal_id, None)
        # "resumed …": the thread shows resumes (bot/render.state_changed)
        reason = f"resumed: disk space is back ({self.free_space()})"
        resuming = self._record(goal_id, lambda: self.store.end_disk_pause(goal_id, reason), "its resume")
        if await asyncio.shield(resuming):
            self.release_experiments(goal_id)

    async def _until_space(self) -> None:
        while self.low_space():  # noqa: ASYNC110 - nothing signals free space
            await asyncio.sleep(self.settings.disk_check_s)
        if self._disk_full_logged:
            log.info("disk space is back: %s", self.free_space())
            self._disk_full_logged = False

    # ---- approvals ----

    async def ask(
        self,
        goal: Goal,
        kind: str,
        question: str,
        detail: str,
        timeout_s: float | None,
        *,
        agent_asks: bool = False,
    ) -> Approval:
        """Ask the humans and wait for the decision; no decision in time expires the approval. A
        question its agent asks is refused (disk_full) when the disk has no room to ask it, and
        (conflict) when WAITING_QUESTIONS of its goal wait already: approval prompts are never
        folded (runner/folding.py), so an agent asking without bound would flood its channel."""
        timeout = timeout_s or self.settings.approval_timeout_s
        try:
            async with self._asking.setdefault(goal.id, asyncio.Lock()):  # counted, then asked
                if (
                    agent_asks
                    and len(waiting := await self.store.pending_approvals(goal.id)) >= WAITING_QUESTIONS
                ):
                    raise Refused(
                        "conflict",
                        f"not asked: goal #{goal.id} has {len(waiting)} questions waiting for people "
                        f"already (#{', #'.join(str(a.id) for a in waiting)}); wait for their answers",
                    )
                with self.store.refuse_when_full() if agent_asks else contextlib.nullcontext():
                    approval = await self.store.create_approval(
                        goal.id,
                        kind=kind,
                        question=question,
                        detail=detail,
                        expires_at=utcnow() + timedelta(seconds=timeout),
                    )
        except DiskFull as full:
            raise Refused(
                "disk_full", f"{full}: the question was not asked; try again when there is room"
            ) from None
        waiter: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._approval_waiters[approval.id] = waiter
        await self.store.set_goal_state(goal.id, "waiting_for_approval", question, only_from={"running"})
        try:
            approval = await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            approval, _ = await self.store.decide_approval(
                approval.id, state="expired", by="runner", comment=f"no decision within {timeout:.0f}s"
            )
        finally:
            self._approval_waiters.pop(approval.id, None)
        if not await self.store.pending_approvals(goal.id):
            await self.store.set_goal_state(
                goal.id, "running", "approval answered", only_from={"waiting_for_approval"}
            )
        return approval

    def deliver_decision(self, approval: Approval) -> None:
        """Wake whoever waits in `ask` for this approval."""
        if (waiter := self._approval_waiters.get(approval.id)) and not waiter.done():
            waiter.set_result(approval)

    # ---- experiments ----

    async def run_experiment(self, req: p.RunExperiment) -> tuple[Experiment, bool]:
        """Admit one experiment against the budget, wait for its slot, run it to its end and enter
        it in the ledger: (its row, whether it is the new best). A client that hangs up leaves it
        running (or queued)."""
        goal = await self.active_goal(req.goal_id)
        if why := stages.experiments_refused(goal):
            raise Refused("conflict", f"experiment not started: {why}")
        executor = req.executor or goal.executor or self.settings.executor
        self.check_executor(executor)
        wanted = self._gpus_wanted(req, goal, executor)
        unpaused = self._unpaused_event(goal.id)
        if not unpaused.is_set():
            log.info("goal #%d is paused: its next experiment waits until it resumes", goal.id)
        await unpaused.wait()
        async with self._goal_locks.setdefault(goal.id, asyncio.Lock()):
            self._check_space(goal.id)
            goal = await self._admit(goal.id, req)
            metric = req.metric or goal.metric
            if metric and goal.metric is None:
                await self.store.set_goal_metric(goal.id, metric, req.direction or "maximize")
                goal = await self.goal(goal.id)
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
            if goal.id in self._ending:
                # The goal began to end while this row was written, too late to find its run: it
                # never starts (and does not count).
                if grant is not None:
                    self.slots.release(grant)
                return await self._finish(experiment, "interrupted", "never started: its goal ended"), False
            task = asyncio.ensure_future(self._supervise(goal, experiment, req, grant, wanted))
            self._experiments[experiment.id] = task
            self._experiment_goal[experiment.id] = goal.id
            task.add_done_callback(lambda _: self._forget_experiment(experiment.id))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
            # Ended with its goal or the runner: its row says why (_close_row), once written.
            if (closing := self._rows.get(experiment.id)) is not None:
                await asyncio.wait([closing[1]])
            finished = await self.store.get_experiment(experiment.id)
            assert finished is not None, "its row was written before its task started"
            return finished, False

    def check_executor(self, executor: str) -> None:
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

    def executor(self, name: str) -> Executor:
        """The executor by name; Ray's and Slurm's are made when first used."""
        if name not in self._executors:
            if name == "ray":
                from goaltender.runner.ray_executor import RayExecutor

                self._executors[name] = RayExecutor(
                    self.settings.ray_address, self.settings.ray_token or None
                )
            elif name == "slurm":
                from goaltender.runner.slurm_executor import SlurmExecutor

                self._executors[name] = SlurmExecutor(
                    partition=self.settings.slurm_partition or None, extra_args=self.settings.slurm_args
                )
            else:
                raise Refused("bad_request", f"no executor {name!r}; there are local, ray and slurm")
        return self._executors[name]

    # ---- gates: stages and cross-checks (runner/stages.py) ----

    async def end_stage(self, req: p.StageDone) -> tuple[Approval, Goal]:
        """Ask the humans to pass the goal's stage; approved, the next stage starts."""
        goal = await self.active_goal(req.goal_id)
        if not goal.stages:
            raise Refused(
                "bad_request", f"goal #{goal.id} has no stages (a goal declares them: `stages: plan, …`)"
            )
        if goal.stage + 1 >= len(goal.stages):
            raise Refused(
                "conflict",
                f"'{goal.stage_name}' is goal #{goal.id}'s last stage: it ends with the goal "
                "(`goaltender report`, then exit)",
            )
        detail = stages.gate_detail(req.summary, req.document, req.document_name)
        approval = await self.ask(
            goal, "stage_gate", stages.gate_question(goal), detail, None, agent_asks=True
        )
        if approval.state == "approved":
            goal = await self.store.advance_stage(goal.id, f"approved by {approval.decided_by}")
        return approval, goal

    async def cross_check(self, req: p.CrossCheck) -> p.CrossCheckReply:
        """Run both implementations (in the goal's sandbox, one after the other) and compare what
        they print. A disagreement blocks the goal's experiments until a person lets it pass."""
        goal = await self.active_goal(req.goal_id)
        directory = Path(goal.workspace) / "cross-checks"
        number = sum(1 for _ in directory.glob("[0-9][0-9][0-9]")) + 1 if directory.is_dir() else 1
        env = goal_environment(self.settings, goal) | req.env
        summaries, logs = [], []
        for side, command in (("a", req.a), ("b", req.b)):
            log_path = directory / f"{number:03d}" / f"{side}.log"
            job = Job(
                goal=goal,
                command=command,
                cwd=Path(req.cwd or goal.workspace),
                env=env,
                log_path=log_path,
                name=f"goaltender-g{goal.id}-check{number}{side}",
                gpus=0,
                timeout_s=experiment_timeout(goal.budget, None, utcnow()),
                grace_s=self.settings.stop_grace_s,
            )
            try:
                result = await self.executor("local").run(job, on_points=_no_points, on_start=_ignore)
            except OSError as exc:
                raise Refused(
                    "conflict", f"cross-check not made: {side.upper()} could not start: {exc}"
                ) from None
            if result.timed_out or result.exit_code != 0:
                how = "timed out" if result.timed_out else f"exited with code {result.exit_code}"
                raise Refused("conflict", f"cross-check not made: {side.upper()} {how} (log: {log_path})")
            summaries.append(result.summary)
            logs.append(str(log_path))
        found = stages.compare(summaries[0], summaries[1], req.rtol, req.atol)
        compared = len(found.agreed) + len(found.differing)
        reply = p.CrossCheckReply(
            agreed=found.ok, compared=compared, differing=len(found.differing), table=found.table(), logs=logs
        )
        if found.ok:
            await self.store.block_experiments(goal.id, None)
            agreed = MilestoneReported(
                title=f"Cross-check #{number} agreed: {compared} numbers",
                text=f"{req.description}\n\nA and B agree within rtol {req.rtol:g}, atol {req.atol:g}.",
            )
            await self.post(goal.id, agreed, "a cross-check's agreement")
            return reply
        return await self._decide_disagreement(goal, req, number, found, reply)

    async def _decide_disagreement(
        self, goal: Goal, req: p.CrossCheck, number: int, found: stages.Comparison, reply: p.CrossCheckReply
    ) -> p.CrossCheckReply:
        held = f"cross-check #{number} disagrees on {len(found.differing)} number(s)"
        await self.store.block_experiments(goal.id, f"{held}: no experiment starts until a person decides it")
        approval = await self.ask(
            goal,
            "cross_check",
            f"The two implementations disagree on {len(found.differing)} of {reply.compared} numbers. "
            "Go on to experiments anyway?",
            f"{req.description}\n\nA: `{' '.join(req.a)}`\nB: `{' '.join(req.b)}`\n\n{found.table()}\n\n"
            "Approve to let the campaign go on with this disagreement; reject to keep experiments "
            "blocked until a cross-check agrees.",
            None,
        )
        if approval.state == "approved":
            await self.store.block_experiments(goal.id, None)
        else:
            await self.store.block_experiments(
                goal.id,
                f"{held}, and that was {approval.state}: fix the implementations and cross-check again",
            )
        return reply.model_copy(update={"agreed": approval.state == "approved", "approval": approval})

    def _check_space(self, goal_id: int) -> None:
        """Refuse to start an experiment the disk has no room for; its goal pauses until it has."""
        if (space := self.low_space()) is None:
            return
        self.pause_for_disk(goal_id, space)
        raise Refused(
            "disk_full",
            f"experiment not started: disk full: {space}, under the {self.settings.min_free_mb:g} MB "
            f"this runner keeps free (GOALTENDER_MIN_FREE_MB). Goal #{goal_id} is paused until there "
            "is room; the next experiment waits for that.",
        )

    async def _admit(self, goal_id: int, req: p.RunExperiment) -> Goal:
        """The goal, once the budget allows one more experiment (the default stop rule asks first)."""
        goal = await self.active_goal(goal_id)
        attempted, compute_used = await self.store.usage(goal.id)
        check = check_new_experiment(goal.budget, attempted, compute_used, utcnow())
        if not check.needs_continue_approval:
            if not check.ok:
                raise Refused("budget_exhausted", check.reason)
            return goal
        approval = await self.ask(
            goal,
            "continue",
            f"{check.reason}. Run {DEFAULT_BLOCK} more experiments?",
            f"Next: {req.description}\nBest so far is in the ledger above; reject to end the campaign.",
            None,
        )
        if approval.state != "approved":
            raise Refused("budget_exhausted", f"{check.reason}; continuing was {approval.state}")
        goal = await self.active_goal(goal.id)
        budget = goal.budget.model_copy(update={"max_experiments": attempted + DEFAULT_BLOCK})
        await self.set_budget(goal, budget, f"{approval.decided_by}: {DEFAULT_BLOCK} more experiments")
        return await self.active_goal(goal.id)

    def _forget_experiment(self, experiment_id: int) -> None:
        self._experiments.pop(experiment_id, None)
        self._experiment_goal.pop(experiment_id, None)
        self._concluding.discard(experiment_id)

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
        goal = await self.goal(experiment.goal_id)
        _, compute_used = await self.store.usage(goal.id)
        check = check_new_experiment(goal.budget, 0, compute_used, utcnow())
        if not check.ok:
            await self._finish(experiment, "interrupted", f"never started: {check.reason}")
            raise Refused("budget_exhausted", check.reason)

    async def _wait_for_slot(self, experiment: Experiment, wanted: int) -> Grant:
        """Its turn in the box's queue; a goal paused meanwhile gives the slot back and waits to
        be resumed (then queues again), as pause holds every next run."""
        unpaused = self._unpaused_event(experiment.goal_id)
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
            self._close_row(experiment, "interrupted", f"never started ({why})", None)
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
        executor = self.executor(experiment.executor)
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

        async def attempt(seed: int, before: ProcessResult | None) -> _Attempt:
            """One run (and its eval): with --repeat, seed N's logs are run-N+1.log, eval-N+1.log."""
            part = (
                job
                if req.repeat == 1
                else dataclasses.replace(job, env={**job.env, "GOALTENDER_SEED": str(seed)})
            )
            log_to = _seeded(job.log_path, seed)
            result = await self._measure(experiment, run(part, req.command, log_to, placed), before)
            summary, verified = result.summary, False
            # With an eval command the run need not print the metric: the evaluation measures it.
            status, note = _judge(result, job.timeout_s, None if req.eval_command else metric, summary)
            if status != "crash" and req.eval_command:
                # The runner measures the headline itself; the run's own numbers stay under `run/`.
                eval_log = _seeded(job.log_path.parent / "eval.log", seed)
                try:
                    evaluation = await self._measure(
                        experiment, run(part, req.eval_command, eval_log, _ignore), _add(before, result)
                    )
                except OSError as exc:
                    raise _NotStarted(exc, _add(before, result), "eval: ") from exc
                status, note = _judge(evaluation, job.timeout_s, metric, evaluation.summary, what="eval")
                summary = {**{f"run/{k}": v for k, v in result.summary.items()}, **evaluation.summary}
                result = _together(result, evaluation)
                verified = status != "crash"
            return _Attempt(result, status, note, summary, verified)

        metric = experiment.metric_name
        attempts: list[_Attempt] = []
        try:
            for seed in range(req.repeat):
                before = _total([a.result for a in attempts])
                try:
                    attempts.append(await attempt(seed, before))
                except _NotStarted as late:
                    what = _seed_note(seed, req.repeat) + late.what
                    return await self._not_started(goal, experiment, late.cause, late.used, what=what), False
                except OSError as exc:
                    what = _seed_note(seed, req.repeat)
                    return await self._not_started(goal, experiment, exc, before, what=what), False
                if attempts[-1].status == "crash":
                    break  # a crashed seed crashes the row: the rest would not change that
        finally:
            if watching is not None:
                watching.cancel()
        done = _combined(attempts, metric, req.repeat)
        done.note = _with_unreadable(done.note, done.result.unreadable_lines)
        # Its processes have ended: a goal's end or the runner's waits for its row, not cancels it
        # (cancelled in the middle of its writes, the row stayed `running`).
        self._concluding.add(experiment.id)
        return await self._conclude(goal, experiment, done, usage)

    async def _conclude(
        self, goal: Goal, experiment: Experiment, done: _Attempt, usage: gpus.Usage | None = None
    ) -> tuple[Experiment, bool]:
        """Judge the finished run against the best so far, with its interval, and enter it in the
        ledger. A new best inside the noise of its predecessor is kept, flagged within noise."""
        status, note = done.status, done.note
        if status == "crash" and (space := self.low_space()):
            note = f"{note}; the disk was nearly full when it ended ({space})"
        metric = experiment.metric_name
        value = done.summary.get(metric) if metric and status != "crash" else None
        new_best, found, noisy = False, None, False
        if value is not None and metric:
            found = noise.interval(metric, value, done.summary, done.seeds)
        if status == "keep" and value is not None:
            best = best_experiment(await self.store.experiments(goal.id), goal.direction)
            new_best = _beats(value, best, goal.direction)
            status = "keep" if new_best else "discard"
            noisy = new_best and noise.within_noise(
                found, best.metric_value if best else None, goal.direction
            )
        finished = await self._finish(
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
        if noisy:
            await self._ask_when_low_signal(goal)
        elif status != "crash":
            await self._ask_when_flat(goal, finished)
        return finished, new_best

    async def _ask_when_flat(self, goal: Goal, experiment: Experiment) -> None:
        """A run whose training loss has not moved learned nothing to judge: the humans are asked
        how to go on (once a goal, and only with GOALTENDER_NOISE_ASK_AFTER set)."""
        if (
            not self.settings.noise_ask_after
            or goal.id in self._asked_flat
            or goal.id in self._asking_low_signal
        ):
            return
        found = noise.flat_curve(await self.store.loss_curves(goal.id, experiment.id))
        if found is None:
            return
        name, (start, end, points) = found
        self._asked_flat.add(goal.id)
        self._asking_low_signal.add(goal.id)
        question = (
            f"The training curve of #{experiment.index} has not moved ({name} {start:.4g} → "
            f"{end:.4g} over {points} points). Go on as planned?"
        )
        self._spawn(self._low_signal_prompt(goal, [], question))

    async def _ask_when_low_signal(self, goal: Goal) -> None:
        """After GOALTENDER_NOISE_ASK_AFTER kept results in a row within noise, ask the humans how
        to go on; their answer (and comment) reaches the agent's inbox. Asked once per streak."""
        wanted = self.settings.noise_ask_after
        kept = [e for e in await self.store.experiments(goal.id) if e.status == "keep"]
        streak = kept[-wanted:] if wanted else []
        if (
            len(streak) < wanted
            or not all(e.within_noise for e in streak)
            or goal.id in self._asking_low_signal
        ):
            return
        if any(e.within_noise for e in kept[-wanted - 1 : -wanted]) and len(kept) > wanted:
            return  # the streak was asked about when it reached this length
        self._asking_low_signal.add(goal.id)
        self._spawn(self._low_signal_prompt(goal, streak))

    async def _low_signal_prompt(self, goal: Goal, streak: list[Experiment], question: str = "") -> None:
        rows = ", ".join(
            f"#{e.index} {e.metric_value:.4g} ({e.interval_how}: {e.interval_low:.3g}–{e.interval_high:.3g})"
            for e in streak
            if e.metric_value is not None and e.interval_low is not None and e.interval_high is not None
        )
        question = question or f"The last {len(streak)} gains are within noise ({rows}). Go on as planned?"
        why = (
            "Each new best lies inside the noise of the one before it, so none is a finding yet. "
            if streak
            else "A run whose loss did not move is too small to learn from. "
        )
        detail = (
            why + "Options: repeat the best configs with other seeds (`--repeat 3`); a larger eval split; "
            "longer runs; or a change of direction. Approve to let the agent go on as planned, "
            "reject to have it change course; a comment reaches the agent either way."
        )
        try:
            approval = await self.ask(goal, "low_signal", question, detail, None)
            if approval.state in ("approved", "rejected"):
                verdict = "go on as planned" if approval.state == "approved" else "change course"
                comment = f": {approval.comment}" if approval.comment else ""
                await self.store.add_inbox(
                    goal.id,
                    approval.decided_by or "people",
                    f"{noise.LOW_SIGNAL_ANSWER} (#{approval.id}) the humans said: {verdict}{comment}. "
                    "Options were: repeat with other seeds (--repeat 3), a larger eval split, longer "
                    "runs, another direction.",
                )
        finally:
            self._asking_low_signal.discard(goal.id)

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
                used = before if used is None else _together(before, used)
            status, note = self._cancel_reasons.pop(experiment.id, ("crash", "cancelled"))
            self._close_row(experiment, status, note, used)
            raise
        except SupervisionFailed as failed:
            # A fault of the runner's own: the process was killed, its row is closed and charged.
            used = _add(before, failed.result)
            await self._finish(
                experiment, "crash", f"killed: the runner failed to follow it ({failed})", result=used
            )
            raise

    def _close_row(
        self, experiment: Experiment, status: ExperimentStatus, note: str, used: ProcessResult | None
    ) -> None:
        """Enter a run that was stopped (its processes are gone). Its own task: what stopped it goes
        on at once, and a full disk holds only the row (written when there is room)."""

        # What it printed before it ended (a launcher's best checkpoint, in its grace period) stays.
        metrics = dict(used.summary) if used is not None else {}
        value = metrics.get(experiment.metric_name) if experiment.metric_name else None

        async def close() -> None:
            try:
                await self._finish(experiment, status, note, result=used, value=value, metrics=metrics)
            except DiskFull:  # the runner is shutting down on a full disk
                log.error(
                    "experiment #%d's row is not closed (%s: %s): the disk was still full at shutdown; "
                    "the next start enters it as interrupted",
                    experiment.id,
                    status,
                    note,
                )
            finally:
                self._rows.pop(experiment.id, None)

        self._rows[experiment.id] = (experiment.goal_id, asyncio.ensure_future(close()))

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
            space = self.free_space()
            self.pause_for_disk(goal.id, space)
            note = f"{what}not started: disk full: {space}"
            return await self._finish(experiment, "interrupted", note, result=before)
        return await self._finish(experiment, "crash", f"{what}could not start: {exc}", result=before)

    async def _finish(
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

    # ---- the end ----

    def end_soon(self, goal_id: int, state: GoalState, reason: str) -> None:
        """End the goal from a request its own agent is waiting on (end_goal stops that agent)."""
        self._spawn(self.end_goal(goal_id, state, reason))

    async def end_goal(self, goal_id: int, state: GoalState, reason: str) -> bool:
        """Stop the agent and the goal's experiments (process groups), settle approvals, enter a
        terminal state and write the final report. Idempotent. True once it is all written; False
        on a full disk: the processes are stopped all the same, and the rest is written (in the
        goal's queue) when there is room."""
        if goal_id in self._ending:
            return True
        self._ending.add(goal_id)
        self._unrecorded[goal_id] = ended = (state, reason)
        first_line = reason.splitlines()[0]
        if state == "failed":  # the journal says it too, not only the goal's thread and event log
            said = " / ".join(line.strip() for line in reason.splitlines() if line.strip())
            log.warning("goal #%d failed: %s", goal_id, said[:1000])
        timer = self._deadline_timers.pop(goal_id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        await self.fetches.cancel(goal_id, f"goal #{goal_id} ended: {first_line}")
        if (proc := self._agents.pop(goal_id, None)) is not None:
            # SIGTERM first: the agent may use the grace period to hand in its report.
            await terminate_group(proc.pid, None, self.settings.stop_grace_s)
        await self.standbys.drop(goal_id)  # first: a run's end would otherwise make it new ones
        await self._cancel_experiments(goal_id, f"ended with the goal: {first_line}")
        await self.limits.end(goal_id)  # whatever escaped its process groups (a double fork) too
        self.forget_disk_pause(goal_id)
        self.folding.forget(goal_id)  # what is left folded is shown with its end (_record_end)
        self.sockets.close_agent_socket(goal_id)
        self.sandbox.networks.close(goal_id)
        self.sandbox.remove_goal_files(goal_id)
        self.release_experiments(goal_id)
        recording = self._record(
            goal_id,
            lambda: self._record_end(goal_id, state, reason),
            f"its end ({state}: {first_line})",
            ended,
        )
        return await self.store.done_unless_full(recording)

    async def _record_end(self, goal_id: int, state: GoalState, reason: str) -> None:
        """The end of a goal whose processes are stopped: its runs' rows, its approvals, its state
        and its final report."""
        rows = [task for id_, task in self._experiments.items() if self._experiment_goal.get(id_) == goal_id]
        rows += [task for of_goal, task in self._rows.values() if of_goal == goal_id]
        await asyncio.gather(*rows, return_exceptions=True)  # the report counts them
        await self.store.show_folded(goal_id)  # what is left folded, before its end, whatever the rate
        first_line = reason.splitlines()[0]
        for approval in await self.store.pending_approvals(goal_id):
            approval, _ = await self.store.decide_approval(
                approval.id, state="expired", by="runner", comment=f"the goal ended: {first_line}"
            )
            self.deliver_decision(approval)
        goal = await self.store.set_goal_state(goal_id, state, reason) or await self.goal(goal_id)
        if not await self.store.has_report(goal_id):
            await self._write_report(goal, reason)

    async def _cancel_experiments(self, goal_id: int, note: str) -> None:
        """Kill the goal's runs (their rows are closed after: _close_row). A run whose processes
        have ended already is left to enter its row."""
        tasks = []
        for experiment_id, task in list(self._experiments.items()):
            if self._experiment_goal.get(experiment_id) == goal_id and experiment_id not in self._concluding:
                self._cancel_reasons[experiment_id] = ("crash", note)
                task.cancel()
                tasks.append(task)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _write_report(self, goal: Goal, reason: str) -> None:
        experiments = await self.store.experiments(goal.id)
        _, compute_used = await self.store.usage(goal.id)
        text = final_report(
            goal,
            experiments,
            compute_used,
            utcnow(),
            reason,
            await self.store.agent_report(goal.id),
            tokens_used=(await self.store.tokens_used([goal.id])).get(goal.id, 0),
            fetches=await self.store.hub_fetches(goal.id),
        )
        await self.store.record_report(
            goal.id, end_reason=reason, text=text, best=best_experiment(experiments, goal.direction)
        )


def _judge(
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


def _together(first: ProcessResult, then: ProcessResult) -> ProcessResult:
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


def _with_unreadable(note: str | None, unreadable: int) -> str | None:
    """The row's note, saying how many of its output lines were skipped as no metrics could be
    read from them (so a person sees why a number printed as `{'acc': 0.5}` is missing)."""
    if not unreadable:
        return note
    said = (
        f"{unreadable} unreadable output line{'' if unreadable == 1 else 's'} skipped "
        f"(a {{…}} line that is not a JSON object, or a line over {MAX_LINE // 1024 // 1024} MiB)"
    )
    return f"{note}; {said}" if note else said


class _NotStarted(OSError):
    """An eval command that could not start, after its run had: what the run used is charged."""

    def __init__(self, cause: OSError, used: ProcessResult | None, what: str):
        super().__init__(str(cause))
        self.cause, self.used, self.what = cause, used, what


@dataclasses.dataclass
class _Attempt:
    """One seed's run (and eval) of an experiment, judged; or, combined, the whole experiment."""

    result: ProcessResult
    status: ExperimentStatus
    note: str | None
    summary: dict[str, float]
    verified: bool
    seeds: list[float] = dataclasses.field(default_factory=list)  # each seed's headline (--repeat)


def _combined(attempts: list[_Attempt], metric: str | None, repeats: int) -> _Attempt:
    """The experiment's outcome from its seeds: times add up; a crashed seed crashes it; every
    number all seeds printed is their mean, and the headline gets `/sd` and each seed's value."""
    if repeats == 1:
        return attempts[0]
    result = _total([a.result for a in attempts])
    assert result is not None, "at least one seed ran"
    last = attempts[-1]
    if last.status == "crash":
        return _Attempt(result, "crash", f"seed {len(attempts) - 1}: {last.note}", last.summary, False)
    keys = set.intersection(*(set(a.summary) for a in attempts))
    summary = {k: statistics.fmean(a.summary[k] for a in attempts) for k in sorted(keys)}
    seeds = [a.summary[metric] for a in attempts] if metric and metric in keys else []
    if seeds:
        summary[f"{metric}/sd"] = statistics.stdev(seeds)
        summary |= {f"{metric}/seed_{i}": v for i, v in enumerate(seeds)}
    return _Attempt(result, "keep", None, summary, all(a.verified for a in attempts), seeds)


def _seeded(path: Path, seed: int) -> Path:
    """Seed 0 keeps the plain name (run.log); seed N writes run-N+1.log beside it."""
    return path if seed == 0 else path.with_name(f"{path.stem}-{seed + 1}{path.suffix}")


def _seed_note(seed: int, repeats: int) -> str:
    return f"seed {seed}: " if repeats > 1 else ""


def _add(before: ProcessResult | None, then: ProcessResult) -> ProcessResult:
    return then if before is None else _together(before, then)


def _total(results: list[ProcessResult]) -> ProcessResult | None:
    total = None
    for result in results:
        total = _add(total, result)
    return total


def _beats(value: float, best: Experiment | None, direction: str) -> bool:
    """Is `value` better than the best so far, in the goal's direction?"""
    if best is None or best.metric_value is None:
        return True
    return better(value, best.metric_value, direction)


async def _ignore(placement: Placement) -> None:
    return None


async def _no_points(points: list[MetricPoint]) -> None:
    return None  # a cross-check's numbers are compared, not kept as series


def _tail_text(workspace: Path, limit: int) -> str:
    """The end of the agent's log (in its workspace: never read through a link it left there)."""
    try:
        data = read_end_beneath(workspace, workspace / AGENT_LOG, limit + 1)
    except OSError as exc:
        return f"(agent.log cannot be read: {exc})"
    if len(data) > limit:
        # Start at a line break: a tail cut mid-line could begin inside a secret, too short to redact.
        data = data[-limit:]
        data = data[data.find(b"\n") + 1 :]
    return data.decode(errors="replace").strip() or "(agent.log is empty)"
