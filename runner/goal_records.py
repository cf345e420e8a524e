"""A goal as it stands, and its writes to runner.db in the goal's own order.

A full disk stops no control. What a person or an agent changes is carried out at once and written
to runner.db through the goal's own queue (`record`: in order, each waiting for room); the reply
waits for the write only while the disk has room, and until it is written the goal's status shows
the state it is in (`as_it_stands`). A goal ended, paused or resumed on a full disk is so at once;
the runner's log says what a shutdown on a full disk left unwritten.

Posts made for an agent (milestones, a fetch's record) are folded past the goal's rate here too
(runner/folding.py). The goals whose end has begun (`ending`) take no more changes.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from goaltender.runner.config import RunnerSettings
from goaltender.runner.folding import Folding, Spawn
from goaltender.runner.server import Refused
from goaltender.storage.records import TERMINAL_STATES, Event, Goal, GoalState, HubFetched, MilestoneReported
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import DiskFull

log = logging.getLogger("goaltender.runner")
WAITING_WRITES_MOST = 100  # an agent's writes of one goal held for room on a full disk; past it, refused
T = TypeVar("T")
Post = MilestoneReported | HubFetched  # what an agent's requests post to its thread (GoalRecords.post)


class GoalRecords:
    """Every goal's state as it stands and its queue of writes to runner.db."""

    def __init__(self, settings: RunnerSettings, store: RunnerStore, spawn: Spawn):
        self.store = store
        self.ending: set[int] = set()  # goals whose end has begun (Campaigns.end_goal)
        self._recording: dict[int, asyncio.Task] = {}  # goal id -> the last of its writes queued (record)
        self._queued_writes: collections.Counter[int] = collections.Counter()  # goal id -> writes queued
        # goal id -> the state it is in, until runner.db has it: (state, reason)
        self._unrecorded: dict[int, tuple[GoalState, str]] = {}
        self.folding = Folding(
            settings.milestone_burst, settings.milestones_per_minute, self._show_folded, spawn
        )

    # ---- a goal as it stands ----

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
        if goal.state in TERMINAL_STATES or goal_id in self.ending:
            why = f" ({goal.end_reason.splitlines()[0]})" if goal.end_reason else ""
            raise Refused(
                "conflict",
                f"goal #{goal_id} is {goal.state}{why}; it takes no more changes. Start a new goal.",
            )
        return goal

    async def reporting_goal(self, goal_id: int) -> Goal:
        """The goal, if its agent may still report on it: one that takes changes, or one whose end
        has begun and is not written yet. What a stopped run names in its grace period (the launcher's
        best checkpoint, its last metrics) belongs to the goal, before its final report."""
        if goal_id in self.ending:
            stored = await self.store.get_goal(goal_id)
            if stored is not None and stored.state not in TERMINAL_STATES:  # its end not written yet
                return self.as_it_stands(stored)
        return await self.active_goal(goal_id)

    def begin_end(self, goal_id: int, state: GoalState, reason: str) -> tuple[GoalState, str] | None:
        """The goal's end begins: it takes no more changes, and its status shows `state` at once
        (until its end is written). None when its end had begun already."""
        if goal_id in self.ending:
            return None
        self.ending.add(goal_id)
        self._unrecorded[goal_id] = ended = (state, reason)
        return ended

    # ---- writes in each goal's order ----

    def record(
        self,
        goal_id: int,
        write: Callable[[], Awaitable[T]],
        what: str,
        shows: tuple[GoalState, str] | None = None,
    ) -> asyncio.Task[T]:
        """Write `what` (a change of the goal, already carried out) to runner.db after the goal's
        writes queued before it; on a full disk it waits for room. Until it is written, the goal's
        status shows `shows` (the state it leaves). A shutdown waits for it (`queued`)."""
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

    def queued(self) -> list[asyncio.Task]:
        """The last write queued of each goal (each waits for those before it): what a shutdown waits for."""
        return list(self._recording.values())

    async def change_state(self, goal_id: int, state: GoalState, reason: str) -> bool:
        """A person paused or resumed the goal (carried out by the caller): record it. True once
        written; False on a full disk, where it is written when there is room."""
        recording = self.record(
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
        recording = self.record(goal_id, write, what)
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
        self.record(goal_id, lambda: self.store.show_folded(goal_id), "its folded posts' summary")
