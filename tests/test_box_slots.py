"""Fair slots on one box, through the real runner, sandbox and CLI: a burst of goals never runs
more experiments than GOALTENDER_SLOTS and every goal progresses; on a (fake-NVML) GPU box each run
gets its own GPUs in CUDA_VISIBLE_DEVICES, is charged wall time × those GPUs, and its GPU memory
and utilisation go into its ledger row; a stop while queued and a restart with runs in flight
leave nothing held."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers import events_until_report, eventually, submit, write_agent

from goaltender.protocol import messages as p
from goaltender.storage.records import Experiment

FAKE_NVML = Path(__file__).parent / "fake_nvml" / "pynvml.py"
# An experiment that says which GPUs it was given, and takes `sleep` seconds.
RUN = (
    'goaltender experiment -d "{d}" --metric score {flags} -- python -c '
    "\"import os, time; print('devices:', os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')); "
    "time.sleep({sleep}); print('score: 1')\"\n"
)


@pytest.fixture
def gpu_box(tmp_path, monkeypatch):
    """This process's NVML becomes the fake one, describing `devices`; returns a writer of its state."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML)
    assert spec and spec.loader
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    state = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))

    def describe(devices: list[dict] | None) -> None:
        state.write_text(json.dumps({"devices": devices}))

    describe([{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}] * 2)
    return describe


def most_at_once(rows: list[Experiment]) -> int:
    """The most rows whose [started, ended] intervals overlap at one moment."""
    edges = sorted(
        [(r.started_at, 1) for r in rows] + [(r.ended_at, -1) for r in rows],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


async def ledger(client, goal_id: int) -> list[Experiment]:
    return (await client.request(p.Summary(goal_id=goal_id))).ledger


async def test_a_burst_of_20_goals_on_2_slots(start_runner, connect, tmp_path):
    agent = write_agent(tmp_path, "a.sh", RUN.format(d="first", flags="", sleep=0.2) * 2)
    runner = await start_runner(agents={"a": agent}, compute_unit="cpu", slots=2)
    client = await connect(runner)
    goals = [await submit(client, f"burst {n}, max 2 experiments", agent="a") for n in range(20)]
    for goal_id in goals:
        await events_until_report(client, goal_id, timeout=180)

    rows = [row for goal_id in goals for row in await ledger(client, goal_id)]
    assert len(rows) == 40 and all(r.status in ("keep", "discard") for r in rows)
    assert most_at_once(rows) <= 2
    waits = sorted(r.queued_seconds or 0 for r in rows)
    assert waits[-1] > 0  # some waited: 20 goals cannot all run at once on 2 slots
    for r in rows:
        assert r.executor == "local" and r.host == "test-runner" and r.gpus == 0
    print(f"\n20 goals × 2 runs on 2 slots: waited median {waits[20]:.1f}s, max {waits[-1]:.1f}s")


async def test_three_goals_on_two_gpus(start_runner, connect, tmp_path, gpu_box):
    one = write_agent(tmp_path, "one.sh", RUN.format(d="one GPU", flags="", sleep=0.6) * 3)
    two = write_agent(tmp_path, "two.sh", RUN.format(d="both GPUs", flags="--gpus 2", sleep=0.6) * 2)
    runner = await start_runner(agents={"one": one, "two": two}, slots=8)
    client = await connect(runner)
    a = await submit(client, "goal a, max 3 experiments", agent="one")
    b = await submit(client, "goal b, max 3 experiments", agent="one")
    c = await submit(client, "goal c, max 2 experiments", agent="two")
    for goal_id in (a, b, c):
        await events_until_report(client, goal_id, timeout=120)

    rows = {goal_id: await ledger(client, goal_id) for goal_id in (a, b, c)}
    every = [r for goal_rows in rows.values() for r in goal_rows]
    assert all(r.status in ("keep", "discard") for r in every)
    # Each run saw exactly the GPUs it was given, and no GPU was given twice at once.
    for r in every:
        seen = Path(r.log_path).read_text().split("devices: ")[1].split()[0]
        assert seen == r.devices
        assert r.gpus == len(r.devices.split(","))
        assert r.compute_hours == pytest.approx(r.wall_seconds * r.gpus / 3600)  # GPU-hours
    for device in ("0", "1"):
        assert most_at_once([r for r in every if device in r.devices.split(",")]) == 1
    assert [r.devices for r in rows[c]] == ["0,1", "0,1"]
    # Fairness: each goal's wait for its runs.
    report = {g: [round(r.queued_seconds or 0, 2) for r in rows[g]] for g in rows}
    print(f"\nwaits per goal (s) on 2 GPUs: {report}")
    assert all(rows[g] for g in rows)


async def test_gpu_memory_and_utilisation_go_into_the_ledger(start_runner, connect, tmp_path, gpu_box):
    gpu_box([{"name": "NVIDIA L4", "memory_mib": 23034, "used_mib": 5120, "utilization": 80}] * 2)
    agent = write_agent(tmp_path, "a.sh", RUN.format(d="busy", flags="", sleep=1.0))
    runner = await start_runner(agents={"a": agent}, gpu_sample_s=0.1)
    client = await connect(runner)
    goal_id = await submit(client, "sample the GPUs, max 1 experiments", agent="a")
    await events_until_report(client, goal_id)
    [row] = await ledger(client, goal_id)
    assert row.devices == "0" and row.peak_gpu_memory_mb == 5120 and row.gpu_utilization == 80


async def test_what_the_box_cannot_give_is_refused_at_once(start_runner, connect, tmp_path, gpu_box):
    agent = write_agent(
        tmp_path,
        "a.sh",
        'goaltender experiment -d greedy --gpus 3 -- true; echo "exit $?" > greedy.txt; sleep 30\n',
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "greedy", agent="a")
    workspace = Path((await client.request(p.Status(goal_id=goal_id))).goals[0].goal.workspace)
    await eventually(lambda: (workspace / "greedy.txt").exists())
    assert (workspace / "greedy.txt").read_text().strip() not in ("exit 0", "")
    assert "asks for 3 GPUs; this box has 2" in (workspace / "agent.log").read_text()
    assert await ledger(client, goal_id) == []  # nothing admitted, nothing charged
    await client.request(p.Stop(goal_id=goal_id))


async def test_a_stop_while_queued_and_a_restart_leave_nothing_held(start_runner, connect, tmp_path):
    hog = write_agent(tmp_path, "hog.sh", RUN.format(d="hog", flags="", sleep=600))
    runner = await start_runner(agents={"hog": hog}, compute_unit="cpu", slots=1)
    client = await connect(runner)

    # One at a time, so that the queue's order is known.
    holder = await submit(client, "holds the slot", agent="hog")
    await eventually(lambda: _running_state(client, holder, "running"), timeout=30)
    queued = await submit(client, "waits for it", agent="hog")
    await eventually(lambda: _running_state(client, queued, "queued"), timeout=30)
    later = await submit(client, "waits behind it", agent="hog")
    waiting = await eventually(lambda: _running_state(client, later, "queued"), timeout=30)
    assert waiting.note == "waiting for a slot, 1 ahead"
    await client.request(p.Stop(goal_id=queued, by="ana"))
    [never] = await ledger(client, queued)
    assert never.status == "interrupted" and never.note.startswith(
        "never started (ended with the goal: stopped by"
    )
    moved = await eventually(lambda: _running_state(client, later, "queued"), timeout=30)
    await eventually(lambda: _note_is(client, later, "waiting for a slot, 0 ahead"), timeout=30)
    assert moved.index == 1

    # A restart with one run in flight and one queued: both interrupted, the slot is free again.
    await runner.close()
    runner = await start_runner(agents={"hog": hog}, compute_unit="cpu", slots=1)
    client = await connect(runner)
    [held] = await ledger(client, holder)
    [queued_row, *_] = await ledger(client, later)
    assert held.status == "interrupted" and queued_row.status == "interrupted"
    assert queued_row.note == "never started (interrupted: the runner shut down)"
    # The resumed agents run again; one of them gets the slot.
    await eventually(
        lambda: _any_running(client, [holder, later]),
        timeout=60,
    )
    for goal_id in (holder, later):
        await client.request(p.Stop(goal_id=goal_id))


async def goal_status(client, goal_id: int):
    return (await client.request(p.Status(goal_id=goal_id))).goals[0]


async def _running_state(client, goal_id: int, state: str):
    status = await goal_status(client, goal_id)
    return status.running if status.running is not None and status.running.status == state else None


async def _note_is(client, goal_id: int, note: str) -> bool:
    status = await goal_status(client, goal_id)
    return status.running is not None and status.running.note == note


async def _any_running(client, goal_ids) -> bool:
    for goal_id in goal_ids:
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        if status.running is not None and status.running.status == "running":
            return True
    return False


async def test_a_paused_goal_gives_its_turn_back(start_runner, connect, tmp_path):
    hog = write_agent(tmp_path, "hog.sh", RUN.format(d="hog", flags="", sleep=600))
    quick = write_agent(tmp_path, "quick.sh", RUN.format(d="quick", flags="", sleep=0))
    runner = await start_runner(agents={"hog": hog, "quick": quick}, compute_unit="cpu", slots=1)
    client = await connect(runner)

    holder = await submit(client, "holds the slot", agent="hog")
    await eventually(lambda: _running_state(client, holder, "running"), timeout=30)
    paused = await submit(client, "queued, then paused, max 1 experiments", agent="quick")
    await eventually(lambda: _running_state(client, paused, "queued"), timeout=30)
    await client.request(p.Pause(goal_id=paused))
    await client.request(p.Stop(goal_id=holder))  # the slot is free: its turn comes, and passes
    await eventually(lambda: _note_is(client, paused, "waiting for its goal to be resumed"), timeout=30)
    assert (await goal_status(client, paused)).running.status == "queued"
    await client.request(p.Resume(goal_id=paused))
    await events_until_report(client, paused, timeout=60)
    [row] = await ledger(client, paused)
    assert row.status == "keep" and row.queued_seconds > 0


BURN = "python -c 'import time; t = time.process_time()\nwhile time.process_time() - t < 0.4: pass'"
PARALLEL = f"""
for n in 1 2 3 4; do
  goaltender experiment -d "burn $n" -- {BURN} > "out-$n" 2>&1 &
done
wait
echo done > all-done
sleep 60
"""


async def test_queued_runs_meet_the_compute_budget_as_their_turn_comes(start_runner, connect, tmp_path):
    """Four runs asked for at once on a one-slot box, against 0.72 CPU-seconds: all four were
    admitted while nothing was spent, and ran to several times the budget. A queued run's turn
    checks the budget again: once spent, it never starts (and does not count), refused as a run
    asked for then would be."""
    runner = await start_runner(
        agents={"a": write_agent(tmp_path, "a.sh", PARALLEL)}, compute_unit="cpu", slots=1
    )
    client = await connect(runner)
    goal_id = await submit(client, "burn, cpu-hours 0.0002, max 10 experiments", agent="a")
    workspace = Path((await client.request(p.Status(goal_id=goal_id))).goals[0].goal.workspace)
    await eventually(lambda: (workspace / "all-done").exists(), timeout=60)
    rows = await ledger(client, goal_id)
    ran = [row for row in rows if row.status != "interrupted"]
    never = [row for row in rows if row.status == "interrupted"]
    assert len(ran) == 2 and len(never) == 2, [(r.status, r.note) for r in rows]
    assert all(row.note.startswith("never started: compute budget used: ") for row in never)
    said = [(workspace / f"out-{n}").read_text() for n in range(1, 5)]
    assert sum("budget_exhausted" in text or "compute budget used" in text for text in said) == 2, said
    await client.request(p.Stop(goal_id=goal_id))
