"""SIGKILL the runner mid-campaign, start it again: the log, the ledger and the campaign survive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from conftest import events_until_report, eventually, submit
from toy_task import AGENT as TOY_AGENT

from goaltender.runner import protocol as p
from goaltender.runner.client import RunnerClient, RunnerUnavailable

TESTS = Path(__file__).parent


def start_runner_process(home: Path, socket: Path) -> subprocess.Popen:
    agent = TOY_AGENT
    env = {
        **os.environ,
        "GOALTENDER_AGENTS": json.dumps({"toy": agent}),
        "GOALTENDER_DEFAULT_AGENT": "toy",
        "GOALTENDER_STOP_GRACE_S": "1",
        "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    log = open(home.parent / "runner.log", "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [sys.executable, "-m", "goaltender.cli", "--socket", str(socket), "runner", "--home", str(home)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def connect_when_up(socket: Path) -> RunnerClient:
    async def connected():
        try:
            return await RunnerClient.connect_unix(socket, client="test")
        except RunnerUnavailable:
            return None

    return await eventually(connected, timeout=20, interval=0.1)


def alive(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def test_sigkill_mid_campaign_then_restart(tmp_path, short_dir):
    home, socket = tmp_path / "home", short_dir / "runner.sock"
    first = start_runner_process(home, socket)
    try:
        client = await connect_when_up(socket)
        goal_id = await submit(client, "toy sweep, max 6 experiments", agent="toy")

        async def second_experiment_running():
            status = (await client.call(p.Status, p.StatusReply, goal_id=goal_id)).goals[0]
            return status if status.running and status.running.index == 2 and status.running.pid else None

        status = await eventually(second_experiment_running, 30)
        interrupted, agent_pid = status.running, status.goal.agent_pid
        assert alive(interrupted.pid) and alive(agent_pid)
        await client.close()
        first.send_signal(signal.SIGKILL)
        first.wait()

        second = start_runner_process(home, socket)
        try:
            client = await connect_when_up(socket)
            await events_until_report(client, goal_id, timeout=60)
            summary = await client.call(p.Summary, p.SummaryReply, goal_id=goal_id)
            head = await client.subscribe(since=0)
            all_events = []
            async for event in client.events():
                all_events.append(event)
                if event.seq == head:
                    break
            await client.close()
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=20)
    finally:
        if first.poll() is None:
            first.kill()

    # The event log: every event kept, seq gap-free across the crash.
    seqs = [e.seq for e in all_events]
    assert seqs == list(range(1, len(seqs) + 1))
    # The ledger: intact, the interrupted run marked crash, and the campaign went on to its budget.
    ledger = summary.ledger
    assert [e.index for e in ledger] == list(range(1, 7))
    assert ledger[0].status == "keep"
    row = ledger[1]
    assert row.id == interrupted.id and row.status == "crash"
    assert row.note.startswith("interrupted: the runner restarted while it ran")
    assert all(e.status != "running" for e in ledger)
    assert summary.status.goal.state == "finished"
    assert summary.status.best.metric_value == max(
        e.metric_value for e in ledger if e.metric_value is not None
    )
    # Nothing from before the crash is left running.
    assert not alive(interrupted.pid) and not alive(agent_pid)
    titles = [e.data.title for e in all_events if e.data.kind == "milestone"]
    assert "Runner restarted" in titles and "Resumed after a restart" in titles
    assert [e.data.kind for e in all_events].count("report") == 1
