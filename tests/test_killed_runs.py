"""Killed work costs like any other: a run ended by its timeout, by its goal's end (a stop, the
deadline) or by the runner shutting down is charged its wall and CPU time (wait4's rusage of the
killed group), so compute budgets see it. Through the real runner, with real busy processes."""

from __future__ import annotations

import asyncio
import re

import psutil
from helpers import events_until_report, eventually, submit, write_agent

from goaltender.protocol import messages as p
from goaltender.runner.experiments import Experiments
from goaltender.storage.runner_store import RunnerStore

SPIN = "goaltender experiment -d spin --metric acc -- python -c 'while True: pass'\n"


async def spinning(client, goal_id: int, cpu_s: float = 0.3):
    """Wait until the goal's run has burnt `cpu_s` of CPU (its whole sandboxed tree, as seen here)."""

    async def burnt():
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        if not (status.running and status.running.pid):
            return None
        try:
            leader = psutil.Process(status.running.pid)
            tree = [leader, *leader.children(recursive=True)]
            used = sum(sum(proc.cpu_times()[:2]) for proc in tree)
        except psutil.Error:
            return None
        return status.running if used >= cpu_s else None

    return await eventually(burnt)


def assert_charged(row, at_least_s: float) -> None:
    """The row has the wall and CPU time of a process that spun for `at_least_s`, in compute."""
    assert row.wall_seconds >= at_least_s
    assert row.cpu_seconds > 0
    assert row.compute_hours == row.cpu_seconds / 3600  # a CPU box: compute is CPU time


async def test_a_run_killed_at_its_timeout_is_charged(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", SPIN)}, compute_unit="cpu")
    client = await connect(runner)
    goal_id = await submit(client, "spin, max 1 experiments, 2s each", agent="a")
    await events_until_report(client, goal_id)

    summary = await client.request(p.Summary(goal_id=goal_id))
    [row] = summary.ledger
    assert row.status == "crash" and row.note == "timeout after 2s"
    assert_charged(row, 2.0)
    assert summary.status.compute_hours_used == row.compute_hours > 0
    assert summary.status.attempted == 1  # a run killed by its timeout counts


async def test_a_run_killed_by_stop_or_deadline_is_charged(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", SPIN)}, compute_unit="cpu")
    client = await connect(runner)
    stopped = await submit(client, "spin until stopped, max 1 experiments", agent="a")
    deadline = await submit(client, "spin until the deadline, budget 3s", agent="a")

    await spinning(client, stopped)
    await client.request(p.Stop(goal_id=stopped, by="ana"))
    await events_until_report(client, deadline)

    [by_stop] = (await client.request(p.Summary(goal_id=stopped))).ledger
    assert by_stop.status == "crash" and by_stop.note.startswith("ended with the goal: stopped by ana")
    assert_charged(by_stop, 0.0)
    summary = await client.request(p.Summary(goal_id=deadline))
    [by_deadline] = summary.ledger
    # The deadline's timer and the run's timeout (the time its goal had left when it started)
    # fall together; either way the killed run is charged.
    assert by_deadline.note == "ended with the goal: deadline reached" or re.fullmatch(
        r"timeout after [123]s", by_deadline.note or ""
    ), by_deadline
    assert_charged(by_deadline, 1.0)
    assert summary.status.compute_hours_used == by_deadline.compute_hours > 0


async def test_a_run_cut_short_by_shutdown_is_interrupted_and_charged(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", SPIN)}, compute_unit="cpu")
    client = await connect(runner)
    goal_id = await submit(client, "spin, max 3 experiments", agent="a")

    await spinning(client, goal_id)
    await runner.close()  # SIGTERM's path: runs end, are recorded, and a restart resumes the goal

    store = await RunnerStore.open(runner.settings.db_path)
    try:
        [row] = await store.experiments(goal_id)
        attempted, compute_used = await store.usage(goal_id)
    finally:
        await store.close()
    assert row.status == "interrupted" and row.note == "interrupted: the runner shut down"
    assert_charged(row, 0.0)
    assert attempted == 0 and compute_used == row.compute_hours > 0  # not counted, still charged


async def test_a_goal_ending_while_a_finished_run_is_entered_waits_for_its_row(
    start_runner, connect, tmp_path, monkeypatch
):
    """A run's process has ended and its row is being written when its goal ends (its deadline, a
    stop): the row is still written. Cancelled in the middle of its writes, it stayed `running`."""
    agent = write_agent(
        tmp_path, "a.sh", "goaltender experiment -d quick --metric acc -- python -c 'print(\"acc: 0.5\")'\n"
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    concluding, release = asyncio.Event(), asyncio.Event()
    conclude = Experiments._conclude

    async def held(self, *args, **kwargs):
        concluding.set()
        await release.wait()
        return await conclude(self, *args, **kwargs)

    monkeypatch.setattr(Experiments, "_conclude", held)
    goal_id = await submit(client, "quick, max 2 experiments", agent="a")
    await concluding.wait()
    stopping = asyncio.ensure_future(client.request(p.Stop(goal_id=goal_id, by="ana")))
    await eventually(lambda: goal_id in runner.campaigns.records.ending)
    release.set()
    await stopping
    [row] = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert (row.status, row.metric_value) == ("keep", 0.5)
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    assert status.goal.state == "stopped"
