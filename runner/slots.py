"""Fair shares of one box: how many experiments run at once, and which GPUs each one gets.

Every local experiment takes a slot (GOALTENDER_SLOTS of them; by default one per CPU core) and as
many of the box's GPUs as it asks for. What cannot start waits in one queue, served in a fair
order: next is the goal with the fewest experiments running (a goal that has none goes first),
its oldest request first; between goals with as many running, the one that has waited longest.
No goal starves: each grant goes to a goal at the bottom of the count, and a waiting goal's
request only gets older. A request that does not fit yet holds its place: nothing behind it jumps
ahead, so an experiment asking for every GPU is not overtaken forever by ones asking for one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Grant:
    """What a started experiment holds until it ends: a slot, and these GPUs (NVML indices)."""

    goal_id: int
    devices: tuple[int, ...] = ()

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(d) for d in self.devices)


@dataclass
class _Request:
    goal_id: int
    experiment_id: int
    gpus: int
    seq: int
    granted: asyncio.Future[Grant] = field(repr=False)


@dataclass(frozen=True)
class Waiting:
    """A queued experiment, as its goal's card shows it: "waiting for a GPU, 2 ahead"."""

    experiment_id: int
    goal_id: int
    gpus: int
    ahead: int

    @property
    def text(self) -> str:
        return f"{waiting_for(self.gpus)}, {self.ahead} ahead"


def waiting_for(gpus: int) -> str:
    return "waiting for " + ("a slot" if not gpus else "a GPU" if gpus == 1 else f"{gpus} GPUs")


class Unfit(ValueError):
    """A request this box can never satisfy (more GPUs than it has)."""


class Slots:
    """The box's slots and GPUs, and the queue for them."""

    def __init__(self, slots: int, gpus: list[int], on_change: Callable[[list[Waiting]], None] | None = None):
        if slots < 1:
            raise ValueError("a box has at least one slot")
        self.slots = slots
        self.gpus = sorted(gpus)
        self._free_gpus = set(self.gpus)
        self._running: Counter[int] = Counter()  # goal id -> experiments holding a slot
        self._queue: list[_Request] = []
        self._seq = itertools.count()
        self._on_change = on_change

    @property
    def in_use(self) -> int:
        return sum(self._running.values())

    @property
    def gpus_in_use(self) -> int:
        return len(self.gpus) - len(self._free_gpus)

    def check(self, gpus: int) -> None:
        """Raise Unfit when no amount of waiting gets `gpus` GPUs on this box."""
        if gpus < 0:
            raise Unfit("an experiment asks for 0 GPUs or more")
        if gpus > len(self.gpus):
            has = f"has {len(self.gpus)}" if self.gpus else "has none (NVML sees no GPU)"
            raise Unfit(f"it asks for {gpus} GPU{'s' if gpus > 1 else ''}; this box {has}")

    def try_acquire(self, goal_id: int, gpus: int) -> Grant | None:
        """A grant at once, if nobody waits and it fits; else None (then `acquire` queues)."""
        self.check(gpus)
        if self._queue or not self._fits(gpus):
            return None
        return self._grant(goal_id, gpus)

    async def acquire(self, goal_id: int, experiment_id: int, gpus: int) -> Grant:
        """Wait in the fair queue for a slot and `gpus` GPUs. Cancelled, the request leaves the
        queue (and a grant that raced the cancellation is given back)."""
        self.check(gpus)
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(goal_id, experiment_id, gpus, next(self._seq), future))
        self._dispatch()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            else:
                self._queue = [r for r in self._queue if r.granted is not future]
                self._dispatch()
            raise

    def release(self, grant: Grant) -> None:
        """The experiment ended: its slot and GPUs go to whoever is next."""
        self._running[grant.goal_id] -= 1
        if self._running[grant.goal_id] <= 0:
            del self._running[grant.goal_id]
        self._free_gpus.update(grant.devices)
        self._dispatch()

    def waiting(self) -> list[Waiting]:
        """The queue in the order it will be served."""
        return [Waiting(r.experiment_id, r.goal_id, r.gpus, ahead) for ahead, r in enumerate(self._order())]

    # ---- inside ----

    def _fits(self, gpus: int) -> bool:
        return self.in_use < self.slots and gpus <= len(self._free_gpus)

    def _grant(self, goal_id: int, gpus: int) -> Grant:
        devices = tuple(sorted(self._free_gpus)[:gpus])
        self._free_gpus.difference_update(devices)
        self._running[goal_id] += 1
        return Grant(goal_id, devices)

    def _order(self) -> list[_Request]:
        """The fair order: repeatedly, the head of the goal with the fewest running (counting
        the ones ordered before it), then the longest-waiting head."""
        queues: dict[int, deque[_Request]] = defaultdict(deque)
        for request in sorted(self._queue, key=lambda r: r.seq):
            queues[request.goal_id].append(request)
        running = Counter(self._running)
        order = []
        while queues:
            goal = min(queues, key=lambda g: (running[g], queues[g][0].seq))
            order.append(queues[goal].popleft())
            running[goal] += 1
            if not queues[goal]:
                del queues[goal]
        return order

    def _dispatch(self) -> None:
        """Start the head of the fair order while it fits; tell the queue where it stands."""
        self._queue = [r for r in self._queue if not r.granted.done()]  # cancelled ones
        for request in self._order():
            if not self._fits(request.gpus):
                break
            self._queue.remove(request)
            request.granted.set_result(self._grant(request.goal_id, request.gpus))
        if self._on_change is not None:
            self._on_change(self.waiting())
