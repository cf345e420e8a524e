"""Which goals' next experiments wait: a goal paused (by a person, for a full disk, over its disk
cap) lets its current experiment finish and holds every next one, queued or asked for, until it is
released (resumed, or its end)."""

from __future__ import annotations

import asyncio


class ExperimentHolds:
    """One flag a goal, set unless the goal is paused."""

    def __init__(self) -> None:
        self._unpaused: dict[int, asyncio.Event] = {}

    def hold(self, goal_id: int) -> None:
        """Paused: the current experiment finishes, a new one waits for `release`."""
        self.unpaused(goal_id).clear()

    def release(self, goal_id: int) -> None:
        self.unpaused(goal_id).set()

    def held(self, goal_id: int) -> bool:
        return not self.unpaused(goal_id).is_set()

    def unpaused(self, goal_id: int) -> asyncio.Event:
        """The goal's flag: what an experiment waits on before it starts."""
        if goal_id not in self._unpaused:
            self._unpaused[goal_id] = asyncio.Event()
            self._unpaused[goal_id].set()
        return self._unpaused[goal_id]
