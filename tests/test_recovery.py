"""SIGKILL the runner mid-campaign, start it again: the log, the ledger and the campaign survive."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
from helpers import events_until_report, eventually, submit
from toy_task import AGENT as TOY_AGENT

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable

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


async def sigkill_while_running(tmp_path, short_dir, goal_text: str, index: int):
    """Start a runner process, submit `goal_text` to the toy sweep, SIGKILL the runner while
    experiment `index` runs, start it again and let the campaign finish. Returns the run that was
    interrupted (as the first runner had it), the first agent's pid, the final summary and the
    whole event log."""
    home, socket = tmp_path / "home", short_dir / "runner.sock"
    first = start_runner_process(home, socket)
    try:
        client = await connect_when_up(socket)
        goal_id = await submit(client, goal_text, agent="toy")

        async def experiment_running():
            status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
            return status if status.running and status.running.index == index and status.running.pid else None

        status = await eventually(experiment_running, 30)
        interrupted, agent_pid = status.running, status.goal.agent_pid
        assert alive(interrupted.pid) and alive(agent_pid)
        await client.close()
        first.send_signal(signal.SIGKILL)
        first.wait()

        second = start_runner_process(home, socket)
        try:
            client = await connect_when_up(socket)
            await events_until_report(client, goal_id, timeout=60)
            summary = await client.request(p.Summary(goal_id=goal_id))
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
    return interrupted, agent_pid, summary, all_events


async def test_sigkill_mid_campaign_then_restart(tmp_path, short_dir):
    interrupted, agent_pid, summary, all_events = await sigkill_while_running(
        tmp_path, short_dir, "toy sweep, max 6 experiments", index=2
    )

    # The event log: every event kept, seq gap-free across the crash.
    seqs = [e.seq for e in all_events]
    assert seqs == list(range(1, len(seqs) + 1))
    # The ledger: intact; the interrupted run marked so and not counted (its sandbox died with the
    # runner, --die-with-parent, so there may be nothing left of it to measure):
    # the campaign went on to 6 counted experiments, running the interrupted config again.
    ledger = summary.ledger
    assert [e.index for e in ledger] == list(range(1, 8))
    assert ledger[0].status == "keep"
    row = ledger[1]
    assert row.id == interrupted.id and row.status == "interrupted"
    assert row.note.startswith("interrupted: the runner restarted while it ran")
    assert ledger[2].params == row.params and ledger[2].status in ("keep", "discard")
    assert sum(e.counted for e in ledger) == 6 and summary.status.attempted == 6
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


async def test_crash_during_the_baseline_runs_it_again(tmp_path, short_dir):
    """The sweep's baseline, interrupted by a runner crash, is run again after the restart: the
    campaign goes on to its budget instead of ending with 'nothing to build on' after 1 of 4."""
    interrupted, _, summary, all_events = await sigkill_while_running(
        tmp_path, short_dir, "toy sweep, max 4 experiments", index=1
    )

    ledger = summary.ledger
    assert [e.status for e in ledger][:2] == ["interrupted", "keep"]
    assert ledger[0].id == interrupted.id
    assert ledger[1].params == ledger[0].params and ledger[1].description.startswith("baseline")
    assert sum(e.counted for e in ledger) == 4 and len(ledger) == 5
    goal = summary.status.goal
    assert goal.state == "finished" and goal.end_reason == "the agent finished"
    resumed = next(e.data for e in all_events if getattr(e.data, "title", "") == "Resumed after a restart")
    assert "Interrupted, so run again if still wanted: #1" in resumed.text
    report = next(e.data for e in all_events if e.data.kind == "report")
    assert "nothing to build on" not in report.text and "4/4 attempted" in report.text


async def test_a_restart_kills_no_process_that_got_a_recorded_pid_since(start_runner, connect, tmp_path):
    """Pids come round again within minutes where pid_max is 32768: a process group leader that got
    the pid a goal's record names, after the record, is not the goal's (it runs elsewhere) and
    survives the restart's clean-up of leftovers."""
    from helpers import write_agent

    agents = {"a": write_agent(tmp_path, "a.sh", "sleep 300\n")}
    runner = await start_runner(agents=agents)
    goal = await submit(await connect(runner), "wait, max 1 experiments", agent="a")
    await eventually(lambda: _agent_pid(runner, goal))
    await runner.close()
    decoy = subprocess.Popen(["sleep", "300"], cwd=tmp_path, start_new_session=True)  # a leader, later
    try:
        db = sqlite3.connect(runner.settings.db_path)
        with db:
            db.execute("UPDATE goals SET agent_pid = ? WHERE id = ?", (decoy.pid, goal))
        db.close()
        await start_runner(agents=agents)  # recovery: the leftovers of goal #1 are killed
        assert decoy.poll() is None, "the restart killed a process that was never the goal's"
    finally:
        decoy.kill()
        decoy.wait()


async def _agent_pid(runner, goal_id: int) -> int | None:
    return (await runner.store.get_goal(goal_id)).agent_pid
