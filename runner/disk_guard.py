"""The disk guard: goals pause when the runner's disk runs out of room, and go on by themselves
when it has room again; each goal is held to its own disk cap (runner/goal_disk.py).

Below the floor (GOALTENDER_MIN_FREE_MB) no experiment starts, each goal with a run pauses (the
run goes on) and its thread is told why; a write to runner.db that finds the disk full waits for
room (`wait_for_space_on_writes`) and every active goal pauses meanwhile. A person who pauses or
resumes a goal takes it over (`forget_pause`): it no longer resumes by itself. Over its cap, a
goal's runs stop and it pauses; still growing past it while paused, it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from goaltender.runner import goal_disk
from goaltender.runner.config import RunnerSettings
from goaltender.runner.folding import Spawn
from goaltender.runner.goal_records import GoalRecords
from goaltender.runner.holds import ExperimentHolds
from goaltender.runner.server import Refused
from goaltender.storage.records import Goal, GoalState
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import DiskFull, FreeSpace, free_space

log = logging.getLogger("goaltender.runner")
ACTIVE = ("running", "waiting_for_approval")  # the states a full disk pauses
EndGoal = Callable[[int, GoalState, str], Awaitable[bool]]
StopRuns = Callable[[int, str], Awaitable[None]]


class DiskGuard:
    """The runner's disk and each goal's share of it, watched; goals paused and resumed for it."""

    def __init__(
        self,
        settings: RunnerSettings,
        store: RunnerStore,
        records: GoalRecords,
        holds: ExperimentHolds,
        spawn: Spawn,
        *,
        end_goal: EndGoal,
        stop_runs: StopRuns,
        running_goals: Callable[[], set[int]],
    ):
        self.settings = settings
        self.store = store
        self.records = records
        self.holds = holds
        self._spawn = spawn
        self._end_goal = end_goal
        self._stop_runs = stop_runs  # a goal's experiments killed, their rows closed
        self._running_goals = running_goals  # the goals with an experiment under way
        self._disk_waits: dict[int, asyncio.Task] = {}  # goal id -> its wait for disk space
        self._over_cap: set[int] = set()  # goals paused for their disk cap (runner/goal_disk.py)
        self._disk_full_logged = False

    def free_space(self) -> FreeSpace:
        try:
            return free_space(self.settings.home)  # the module's probe, looked up here: tests replace it
        except OSError:
            return FreeSpace(self.settings.home, 0)

    def low_space(self) -> FreeSpace | None:
        """The home's free space, when it is below the floor (GOALTENDER_MIN_FREE_MB)."""
        space = self.free_space()
        return space if space.free_mb < self.settings.min_free_mb else None

    def check_space(self, goal_id: int) -> None:
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

    def wait_for_space_on_writes(self) -> None:
        """From now on a write to runner.db that finds the disk full waits and is tried again
        (until then it fails, so that a runner that cannot start says so and exits)."""
        self.store.when_full = self._on_disk_full

    def watch(self) -> None:
        """Start watching the disk and each goal's share of it (for as long as the runner runs)."""
        self._spawn(self._watch_disk())
        self._spawn(self._watch_goal_disks())

    async def resume_after_restart(self, goal: Goal) -> None:
        """A goal paused for the disk before a restart resumes by itself when there is room."""
        if await self.store.paused_for_disk(goal.id):
            self._disk_waits[goal.id] = self._spawn(self._resume_when_space(goal.id))

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
            if (running := self._running_goals()) and (space := self.low_space()):
                for goal_id in running:
                    self.pause_for_disk(goal_id, space)

    async def _watch_goal_disks(self) -> None:
        """Every GOALTENDER_GOAL_DISK_CHECK_S, each goal is held to its disk cap (runner/goal_disk.py)."""
        if not (cap := goal_disk.disk_cap(self.settings)):
            return
        while True:
            await asyncio.sleep(self.settings.goal_disk_check_s)
            for goal in await self.store.list_goals(active_only=True):
                places = goal_disk.goal_places(self.settings, Path(goal.workspace), goal.id)
                if goal.id in self.records.ending or (used := await goal_disk.bytes_held(places)) is None:
                    continue
                paused_for_it = goal.id in self._over_cap and goal.state == "paused"
                await self._hold_to_disk_cap(goal.id, goal_disk.judge(used, cap, paused_for_it))

    async def _hold_to_disk_cap(self, goal_id: int, verdict: goal_disk.Verdict) -> None:
        """Over its cap, a goal's runs stop and it pauses; still growing past it while paused, it ends."""
        if verdict.action == "ok":
            self._over_cap.discard(goal_id)
        elif verdict.action == "end":
            await self._end_goal(goal_id, "failed", verdict.reason)
        elif goal_id not in self._over_cap or (await self.records.goal(goal_id)).state != "paused":
            self._over_cap.add(goal_id)
            self.forget_pause(goal_id)
            self.holds.hold(goal_id)
            log.info("goal #%d: %s", goal_id, verdict.reason)
            await self._stop_runs(goal_id, f"stopped: the goal {verdict.reason.split(' (')[0]}")
            await self.records.change_state(goal_id, "paused", f"paused: {verdict.reason}")

    def pause_for_disk(self, goal_id: int, space: FreeSpace) -> None:
        """Hold the goal's experiments until the disk has room again; its status says paused at
        once, and its thread is told why as soon as that can be written (and again when it goes
        on). A goal a person has paused stays theirs."""
        if goal_id in self.records.ending or goal_id in self._disk_waits or self.holds.held(goal_id):
            return
        self.holds.hold(goal_id)
        reason = (
            f"disk full: {space}, under the {self.settings.min_free_mb:g} MB this runner keeps free "
            "(GOALTENDER_MIN_FREE_MB); no new experiment starts until there is room"
        )
        pausing = self.records.record(
            goal_id,
            lambda: self.store.pause_for_disk(goal_id, reason),
            "its pause for the disk",
            ("paused", reason),
        )
        self._disk_waits[goal_id] = self._spawn(self._resume_when_space(goal_id, pausing))

    def forget_pause(self, goal_id: int) -> None:
        """A person took over (resumed the goal, or paused it themselves), or the goal ended: it no
        longer resumes by itself when there is room."""
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
            if (await self.records.goal(goal_id)).state != "paused":
                self.holds.release(goal_id)
            return
        await self._until_space()
        self._disk_waits.pop(goal_id, None)
        # "resumed …": the thread shows resumes (bot/render.state_changed)
        reason = f"resumed: disk space is back ({self.free_space()})"
        resuming = self.records.record(
            goal_id, lambda: self.store.end_disk_pause(goal_id, reason), "its resume"
        )
        if await asyncio.shield(resuming):
            self.holds.release(goal_id)

    async def _until_space(self) -> None:
        while self.low_space():  # noqa: ASYNC110 - nothing signals free space
            await asyncio.sleep(self.settings.disk_check_s)
        if self._disk_full_logged:
            log.info("disk space is back: %s", self.free_space())
            self._disk_full_logged = False
