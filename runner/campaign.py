"""Each goal's campaign: its agent started, watched and ended; its deadline; its recovery after a
restart. `Campaigns` puts together the parts each concern lives in, each given only what it needs:

- runner/goal_records.py: a goal as it stands, its writes in its own order (a full disk stops no
  control), its posts folded past its rate;
- runner/holds.py: which goals' next experiments wait (paused);
- runner/approvals.py: the questions a goal waits on people for;
- runner/disk_guard.py: goals paused for a full disk or over their disk cap, resumed with room;
- runner/experiments.py: experiments admitted, queued, run, judged (runner/judging.py), entered;
- runner/low_signal.py: people asked when results carry little signal;
- runner/stage_gates.py: stage gates and cross-checks.

Every way a goal ends (its agent exits or cannot start, the deadline passes, an operator stops it,
its disk cap) goes through `end_goal`: its downloads from the hub (runner/fetches.py), the agent
and the goal's experiments are stopped with their whole process groups, then whatever is left in
the goal's cgroup (runner/limits.py), pending approvals expire, the goal's socket, network and /tmp
go, and the final report is written once.

The agent and every experiment and eval command run in the goal's sandbox (runner/sandbox.py),
holding only the goal's own socket (`AgentSockets`, the server), which lets them act on this goal
through the agent verbs and on nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Protocol

from goaltender.runner import gpus
from goaltender.runner.agent_env import agent_environment
from goaltender.runner.approvals import Approvals
from goaltender.runner.config import RunnerSettings
from goaltender.runner.disk_guard import DiskGuard
from goaltender.runner.experiments import ExperimentParts, Experiments
from goaltender.runner.fetches import HubFetches
from goaltender.runner.goal_records import GoalRecords
from goaltender.runner.holds import ExperimentHolds
from goaltender.runner.limits import Counters, GoalCgroups
from goaltender.runner.low_signal import LowSignalPrompts
from goaltender.runner.report import final_report
from goaltender.runner.sandbox import Sandbox
from goaltender.runner.stage_gates import StageGates
from goaltender.runner.standby import Standbys
from goaltender.runner.supervisor import (
    Launch,
    kill_leftover_group,
    read_end_beneath,
    spawn,
    terminate_group,
    wait_process,
)
from goaltender.runner.task_set import TaskSet
from goaltender.storage.records import AGENT_LOG, Budget, Goal, GoalState, MilestoneReported, utcnow
from goaltender.storage.runner_store import RunnerStore

log = logging.getLogger("goaltender.runner")
AGENT_LOG_TAIL = 1500  # bytes of agent.log quoted when an agent fails


class AgentSockets(Protocol):
    """Where each goal's capability is served (the server): opened for its agent, closed at its end."""

    async def open_agent_socket(self, goal_id: int, path: Path) -> None: ...

    def close_agent_socket(self, goal_id: int) -> None: ...


class Campaigns:
    """Every goal's campaign on this runner: its agent and deadline here, the rest in the parts."""

    def __init__(self, settings: RunnerSettings, store: RunnerStore, sockets: AgentSockets):
        self.settings = settings
        self.store = store
        self.sockets = sockets
        self.tasks = TaskSet()
        self.limits = GoalCgroups(settings)  # started by the runner (runner/daemon.py)
        inventory = gpus.inventory() if settings.compute_unit != "cpu" else []
        minors = {g.index: g.minor for g in inventory if g.minor is not None}
        self.sandbox = Sandbox(settings, minors, self.limits)
        self.compute_unit = "gpu" if (settings.compute_unit == "gpu" or inventory) else "cpu"
        self.standbys = Standbys(self.sandbox, settings)
        self.fetches = HubFetches(settings)  # goals' downloads into the shared hub cache
        self.records = GoalRecords(settings, store, self.tasks.spawn)
        self.holds = ExperimentHolds()
        self.approvals = Approvals(settings, store)
        self.disk = DiskGuard(
            settings,
            store,
            self.records,
            self.holds,
            self.tasks.spawn,
            end_goal=self.end_goal,
            stop_runs=lambda goal_id, note: self.experiments.stop(goal_id, note),
            running_goals=lambda: self.experiments.running_goals(),
        )
        parts = ExperimentParts(
            records=self.records,
            holds=self.holds,
            disk=self.disk,
            approvals=self.approvals,
            low_signal=LowSignalPrompts(settings, store, self.approvals, self.tasks.spawn),
            sandbox=self.sandbox,
            standbys=self.standbys,
            gpus=[g.index for g in inventory],
            compute_unit=self.compute_unit,
            spawn=self.tasks.spawn,
            set_budget=self.set_budget,
        )
        self.experiments = Experiments(settings, store, parts)
        self.slots = self.experiments.slots
        self.gates = StageGates(
            settings, store, self.records, self.approvals, self.experiments.executors.get("local")
        )
        self._agents: dict[int, subprocess.Popen] = {}  # goal id -> its agent
        self._deadline_timers: dict[int, asyncio.Task] = {}

    # ---- recovery and shutdown ----

    async def recover(self) -> None:
        """After a crash or restart: nothing the log says is running may be left half-done."""
        for experiment in await self.store.running_experiments():
            await self.experiments.close_interrupted(experiment)
        # Measured (and killed by process group) above; now whatever of theirs is left anywhere,
        # and the cgroups themselves: the goals resumed below get new ones.
        await self.limits.clear_stale()
        await self.approvals.expire_pending(None, "the runner restarted; the agent will ask again")
        for goal in await self.store.list_goals(active_only=True):
            await self._resume(goal)
        self.disk.watch()

    async def _resume(self, goal: Goal) -> None:
        accepted = goal.accepted_at.timestamp() if goal.accepted_at else None
        kill_leftover_group(goal.agent_pid, accepted, Path(goal.workspace).resolve())
        if goal.state == "paused":
            self.holds.hold(goal.id)
            await self.disk.resume_after_restart(goal)
        if goal.budget.deadline and utcnow() >= goal.budget.deadline:
            await self.end_goal(goal.id, "finished", "deadline reached while the runner was down")
            return
        if goal.state == "waiting_for_approval":
            await self.store.set_goal_state(goal.id, "running", "the runner restarted")
        if await self.store.folded_unshown(goal.id):
            self.records.folding.left_folded(goal.id)
        await self.store.append_event(
            goal.id,
            MilestoneReported(
                title="Runner restarted",
                text="Interrupted experiments are marked interrupted (they do not count against max "
                "experiments); the agent resumes from the ledger and diary.",
            ),
        )
        await self.start_agent(await self.records.goal(goal.id), resumed=True)

    async def close(self) -> None:
        """Runner shutdown: stop every agent and experiment, and leave the goals as they are (a
        restart resumes them). What is queued for runner.db is written, unless the disk is still
        full: then the log says what was not."""
        self.store.stop_waiting_for_room()
        self.tasks.cancel_all()
        await self.fetches.close()
        await self.standbys.close()
        for proc in list(self._agents.values()):
            await terminate_group(proc.pid, None, self.settings.stop_grace_s)
            proc.poll()  # reap it (its watcher was cancelled), so no zombie is left behind
        await self.experiments.close()
        await asyncio.gather(*self.records.queued(), return_exceptions=True)
        self.sandbox.networks.close_all()
        await self.limits.close()

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
        self.tasks.spawn(self._watch_agent(goal.id, proc, launch))
        self.arm_deadline(goal)

    async def _watch_agent(self, goal_id: int, proc: subprocess.Popen, launch: Launch) -> None:
        status, _ = await wait_process(proc)
        self._agents.pop(goal_id, None)
        if goal_id in self.records.ending:
            return
        code = launch.exit_code(status)
        if code == 0:
            await self.end_goal(goal_id, "finished", "the agent finished")
        else:
            goal = await self.records.goal(goal_id)
            tail = _tail_text(Path(goal.workspace), AGENT_LOG_TAIL)
            # Its cgroup was made for it: what its limits did since is what they did in its life.
            usage = self.limits.usage(goal_id, Counters())
            said = (
                "".join(f", {what}" for what in usage.verdict(-code if code < 0 else None)) if usage else ""
            )
            await self.end_goal(goal_id, "failed", f"the agent exited with code {code}{said}:\n{tail}")

    # ---- budget and deadline ----

    async def set_budget(self, goal: Goal, budget: Budget, reason: str) -> None:
        goal = await self.store.update_budget(goal.id, budget, reason)
        self.arm_deadline(goal)

    def arm_deadline(self, goal: Goal) -> None:
        if old := self._deadline_timers.pop(goal.id, None):
            old.cancel()
        if goal.budget.deadline is not None:
            self._deadline_timers[goal.id] = self.tasks.spawn(self._end_at(goal.id, goal.budget.deadline))

    async def _end_at(self, goal_id: int, deadline: datetime) -> None:
        await asyncio.sleep(max(0.0, (deadline - utcnow()).total_seconds()))
        self._deadline_timers.pop(goal_id, None)
        await self.end_goal(goal_id, "finished", "deadline reached")

    # ---- the end ----

    def end_soon(self, goal_id: int, state: GoalState, reason: str) -> None:
        """End the goal from a request its own agent is waiting on (end_goal stops that agent)."""
        self.tasks.spawn(self.end_goal(goal_id, state, reason))

    async def end_goal(self, goal_id: int, state: GoalState, reason: str) -> bool:
        """Stop the agent and the goal's experiments (process groups), settle approvals, enter a
        terminal state and write the final report. Idempotent. True once it is all written; False
        on a full disk: the processes are stopped all the same, and the rest is written (in the
        goal's queue) when there is room."""
        if (ended := self.records.begin_end(goal_id, state, reason)) is None:
            return True
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
        await self.experiments.stop(goal_id, f"ended with the goal: {first_line}")
        await self.limits.end(goal_id)  # whatever escaped its process groups (a double fork) too
        self.disk.forget_pause(goal_id)
        self.records.folding.forget(goal_id)  # what is left folded is shown with its end (_record_end)
        self.sockets.close_agent_socket(goal_id)
        self.sandbox.networks.close(goal_id)
        self.sandbox.remove_goal_files(goal_id)
        self.holds.release(goal_id)
        recording = self.records.record(
            goal_id,
            lambda: self._record_end(goal_id, state, reason),
            f"its end ({state}: {first_line})",
            ended,
        )
        return await self.store.done_unless_full(recording)

    async def _record_end(self, goal_id: int, state: GoalState, reason: str) -> None:
        """The end of a goal whose processes are stopped: its runs' rows, its approvals, its state
        and its final report."""
        await asyncio.gather(
            *self.experiments.rows_of(goal_id), return_exceptions=True
        )  # the report counts them
        await self.store.show_folded(goal_id)  # what is left folded, before its end, whatever the rate
        await self.approvals.expire_pending(goal_id, f"the goal ended: {reason.splitlines()[0]}")
        goal = await self.store.set_goal_state(goal_id, state, reason) or await self.records.goal(goal_id)
        if not await self.store.has_report(goal_id):
            await self._write_report(goal, reason)

    async def _write_report(self, goal: Goal, reason: str) -> None:
        experiments = await self.store.experiments(goal.id)
        ledger = (await self.store.ledgers([goal.id]))[goal.id]
        text = final_report(
            goal,
            experiments,
            ledger,
            utcnow(),
            reason,
            await self.store.agent_report(goal.id),
            fetches=await self.store.hub_fetches(goal.id),
        )
        await self.store.record_report(goal.id, end_reason=reason, text=text, best=ledger.best)


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
