"""The box's fair queue (runner/slots.py): slots and GPUs handed out fairly across goals, first
come first served within a goal, a big request never overtaken, a cancelled wait leaving no trace."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goaltender.runner.slots import Slots, Unfit, Waiting


async def test_three_goals_on_two_gpu_slots_take_turns():
    changes: list[list[Waiting]] = []
    slots = Slots(2, [0, 1], changes.append)
    a1 = slots.try_acquire(1, 1)
    a2 = slots.try_acquire(1, 1)
    assert a1 is not None and a2 is not None and {a1.devices, a2.devices} == {(0,), (1,)}
    # Goal 1 asks for a third, then goals 2 and 3 for one and goal 2 for a second: goal 1 runs
    # two already, so the others go first, goal 2's second too (it would run one).
    waits = [
        asyncio.ensure_future(slots.acquire(goal, exp, 1))
        for goal, exp in ((1, 13), (2, 21), (3, 31), (2, 22))
    ]
    await asyncio.sleep(0)
    assert [(w.experiment_id, w.ahead) for w in slots.waiting()] == [(21, 0), (31, 1), (22, 2), (13, 3)]
    assert slots.waiting()[2].text == "waiting for a GPU, 2 ahead"
    order = []
    for grant in (a1, a2):
        slots.release(grant)
        await asyncio.sleep(0)
        order += [i for i, w in enumerate(waits) if w.done() and i not in order]
    # Both ended experiments were goal 1's: with none running, its third goes before goal 3's
    # (which came later) and goal 2's second (goal 2 runs one).
    assert [(13, 21, 31, 22)[i] for i in order] == [21, 13]
    assert [(w.experiment_id, w.ahead) for w in changes[-1]] == [(31, 0), (22, 1)]
    for w in waits:
        w.cancel()


async def test_first_come_first_served_within_a_goal():
    slots = Slots(1, [])
    first = slots.try_acquire(7, 0)
    assert first is not None and first.devices == ()
    waits = [asyncio.ensure_future(slots.acquire(7, exp, 0)) for exp in (1, 2, 3)]
    await asyncio.sleep(0)
    assert [w.experiment_id for w in slots.waiting()] == [1, 2, 3]
    slots.release(first)
    await asyncio.sleep(0)
    assert [w.done() for w in waits] == [True, False, False]
    for w in waits[1:]:
        w.cancel()


async def test_a_two_gpu_request_holds_its_place():
    slots = Slots(4, [0, 1])
    one = slots.try_acquire(1, 1)
    assert one is not None
    big = asyncio.ensure_future(slots.acquire(2, 20, 2))
    small = asyncio.ensure_future(slots.acquire(3, 30, 1))
    await asyncio.sleep(0)
    # GPU 1 is free, but the small request is behind the big one: it waits too.
    assert not big.done() and not small.done()
    assert slots.waiting()[0].text == "waiting for 2 GPUs, 0 ahead"
    slots.release(one)
    await asyncio.sleep(0)
    assert big.done() and big.result().devices == (0, 1) and big.result().cuda_visible_devices == "0,1"
    slots.release(big.result())
    await asyncio.sleep(0)
    assert small.done()


async def test_a_stop_while_queued_leaves_the_queue():
    slots = Slots(1, [0])
    held = slots.try_acquire(1, 1)
    assert held is not None
    queued = asyncio.ensure_future(slots.acquire(2, 20, 1))
    after = asyncio.ensure_future(slots.acquire(3, 30, 1))
    await asyncio.sleep(0)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert [w.experiment_id for w in slots.waiting()] == [30]
    slots.release(held)
    await asyncio.sleep(0)
    assert after.done() and after.result().devices == (0,)


async def test_a_grant_that_races_a_cancellation_is_given_back():
    slots = Slots(1, [])
    held = slots.try_acquire(1, 0)
    assert held is not None
    queued = asyncio.ensure_future(slots.acquire(2, 20, 0))
    await asyncio.sleep(0)
    slots.release(held)  # grants it: the future is done, its task not yet resumed
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert slots.in_use == 0 and slots.try_acquire(3, 0) is not None


def test_requests_the_box_cannot_ever_satisfy():
    with pytest.raises(Unfit, match="asks for 3 GPUs; this box has 2"):
        Slots(8, [0, 1]).try_acquire(1, 3)
    with pytest.raises(Unfit, match="has none"):
        Slots(8, []).try_acquire(1, 1)


@settings(max_examples=150, deadline=None)
@given(
    slots=st.integers(1, 3),
    gpus=st.integers(0, 3),
    plan=st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(1, 5)), min_size=1, max_size=25
    ),
)
def test_every_goal_progresses_and_no_limit_is_exceeded(slots, gpus, plan):
    """Random goals, GPU asks and durations: never more running than slots, never a GPU twice,
    and every request is served."""

    async def main() -> None:
        box = Slots(slots, list(range(gpus)))
        running: set[int] = set()
        held: set[int] = set()
        done = []

        async def experiment(n: int, goal: int, ask: int, ticks: int) -> None:
            grant = await box.acquire(goal, n, ask)
            assert len(running) < slots and not held & set(grant.devices)
            running.add(n)
            held.update(grant.devices)
            for _ in range(ticks):
                await asyncio.sleep(0)
            running.discard(n)
            held.difference_update(grant.devices)
            box.release(grant)
            done.append(n)

        fitting = [(n, g, min(ask, gpus), t) for n, (g, ask, t) in enumerate(plan)]
        await asyncio.wait_for(asyncio.gather(*(experiment(*f) for f in fitting)), 10)
        assert sorted(done) == list(range(len(plan))) and box.in_use == 0

    asyncio.run(main())
