"""A goal's posts beyond its rate are folded, so that one goal cannot flood its channel.

Slack takes about one message a second per channel, and the bot sends a channel's writes in order.
Each milestone an agent reports becomes a post in its goal's thread, so one agent's 2,000
milestones in 2 s queued ~33 minutes of posts ahead of every other goal in the channel. The same
holds for what the runner posts on an agent's request: a fetch's milestones and its record, a
cross-check's agreement.

Each goal has a token bucket (`PostRate`): GOALTENDER_MILESTONE_BURST posts at once, then
GOALTENDER_MILESTONES_PER_MINUTE. A post within it is logged as ever. Past it the post is still
taken and logged whole, marked `folded` (records.Folded: the bot and the console give it no post of
its own), and as soon as the bucket has a token again one PostsFolded event shows them all: how
many, with their titles. While folded posts wait for it, every new one folds too, so the thread
keeps their order. The goal's end shows what is left folded at once (before the final report).

The rate lives in the runner, not the bot: the event log, every subscriber (the bot, the console)
and every channel are spared alike, and the bot stays a renderer. The bucket is in memory; the
count is not: a PostsFolded shows the folded posts logged after the goal's previous one
(RunnerStore.show_folded, one transaction), so each folded post is counted once, whenever the disk
lets it be written (folded posts and their PostsFolded go through the goal's queue of writes,
GoalRecords.record, in order) and wherever a restart falls (the goal's recovery shows folded posts
left without a PostsFolded).

Never folded: approvals and questions, experiment rows (their rate is the experiments'), state,
stage and budget changes, steering, the runner's own milestones and errors, the final report.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

# A token counted from float arithmetic may come to 1 - 1e-16: that is a token.
_EPSILON = 1e-9


@dataclass
class PostRate:
    """A token bucket: `burst` posts at once, then `per_minute`. Times are seconds (any clock)."""

    burst: int
    per_minute: float
    tokens: float
    at: float  # when `tokens` was counted

    @classmethod
    def full(cls, burst: int, per_minute: float, now: float) -> PostRate:
        return cls(burst, per_minute, float(burst), now)

    def _refill(self, now: float) -> None:
        if now > self.at:  # a clock read earlier than the last (another task's) adds nothing
            self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.per_minute / 60)
            self.at = now

    def take(self, now: float) -> bool:
        """Spend a token if there is one."""
        self._refill(now)
        if self.tokens < 1 - _EPSILON:
            return False
        self.tokens = max(0.0, self.tokens - 1)
        return True

    def wait(self, now: float) -> float:
        """Seconds from `now` until there is a token."""
        self._refill(now)
        return max(0.0, (1 - self.tokens) * 60 / self.per_minute)


@dataclass
class GoalPosts:
    """One goal's rate, and whether folded posts of it wait to be shown."""

    rate: PostRate
    folded_waiting: bool = False

    def arrive(self, now: float) -> bool:
        """A post of the goal: True to post it, False to fold it."""
        if self.folded_waiting or not self.rate.take(now):
            self.folded_waiting = True
            return False
        return True

    def show_due(self, now: float) -> bool:
        """Whether the folded posts are to be shown now (the token it costs spent): True once."""
        if self.folded_waiting and self.rate.take(now):
            self.folded_waiting = False
            return True
        return False

    def wait(self, now: float) -> float:
        return self.rate.wait(now)


Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task]


@dataclass
class Folding:
    """Every goal's posts against its rate. `show(goal_id)` queues the PostsFolded write of a goal
    (in its order); `spawn` runs the waits for a token (tasks a shutdown cancels)."""

    burst: int
    per_minute: float
    show: Callable[[int], None]
    spawn: Spawn
    clock: Callable[[], float] = time.monotonic
    _goals: dict[int, GoalPosts] = field(default_factory=dict)
    _waits: dict[int, asyncio.Task] = field(default_factory=dict)

    def arrive(self, goal_id: int) -> bool:
        """A post of the goal: True to post it, False to fold it (then it is shown, folded with
        the others, as soon as the goal's rate allows)."""
        posts = self._goals.get(goal_id)
        if posts is None:
            posts = self._goals[goal_id] = GoalPosts(PostRate.full(self.burst, self.per_minute, self.clock()))
        if posts.arrive(self.clock()):
            return True
        self._show_when_due(goal_id, posts)
        return False

    def left_folded(self, goal_id: int) -> None:
        """Folded posts logged before a restart, not shown yet: shown when the rate allows."""
        posts = self._goals.setdefault(
            goal_id, GoalPosts(PostRate.full(self.burst, self.per_minute, self.clock()))
        )
        posts.folded_waiting = True
        self._show_when_due(goal_id, posts)

    def forget(self, goal_id: int) -> None:
        """The goal ended (its end shows what is left folded)."""
        self._goals.pop(goal_id, None)
        if (wait := self._waits.pop(goal_id, None)) is not None:
            wait.cancel()

    def _show_when_due(self, goal_id: int, posts: GoalPosts) -> None:
        if goal_id not in self._waits:
            self._waits[goal_id] = self.spawn(self._wait_to_show(goal_id, posts))

    async def _wait_to_show(self, goal_id: int, posts: GoalPosts) -> None:
        try:
            while posts.folded_waiting:
                if posts.show_due(self.clock()):
                    self.show(goal_id)
                    return
                await asyncio.sleep(posts.wait(self.clock()))
        finally:
            if self._waits.get(goal_id) is asyncio.current_task():
                del self._waits[goal_id]
