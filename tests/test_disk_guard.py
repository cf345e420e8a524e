"""The big disk while runs go on, through the real runner and CLI: the disk filling up during a
run pauses its goal (the run finishes; nothing new starts) with a message; checkpoints beyond the
best k and the latest are pruned after each run, said in the thread; `goaltender disk-usage` shows
what each goal holds."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from helpers import events_until_report, eventually, submit, write_agent

from goaltender.protocol import messages as p
from goaltender.runner import disk_guard
from goaltender.storage.records import GoalStateChanged, MilestoneReported
from goaltender.storage.space import MB, FreeSpace

# Each run saves two NeMo RL-style checkpoints of 20 kB; run N scores N/10.
SAVE = (
    'goaltender experiment -d "run {n}" --metric score -- python -c "'
    "import os, pathlib; d = pathlib.Path(os.environ['GOALTENDER_EXPERIMENT_DIR']) / 'checkpoints'; "
    "[((d / f'step_{{s}}').mkdir(parents=True), (d / f'step_{{s}}' / 'model.bin').write_bytes(bytes(20000))) "
    "for s in (10, 20)]; print('score: {score}')\"\n"
)


async def test_checkpoints_beyond_the_best_and_the_latest_are_pruned(start_runner, connect, tmp_path):
    script = "".join(SAVE.format(n=n, score=score) for n, score in ((1, 0.5), (2, 0.9), (3, 0.2)))
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)}, keep_checkpoints=1)
    client = await connect(runner)
    goal_id = await submit(client, "save checkpoints, max 3 experiments", agent="a")
    events = await events_until_report(client, goal_id)

    experiments = runner.settings.workspaces / f"goal-{goal_id}" / "experiments"
    left = sorted(str(path.relative_to(experiments)) for path in experiments.glob("*/checkpoints/step_*"))
    # The best (run 2: both of its steps score 0.9, the later one wins) and the latest (run 3's last).
    assert left == ["002/checkpoints/step_20", "003/checkpoints/step_20"]
    pruned = [
        e.data
        for e in events
        if isinstance(e.data, MilestoneReported) and e.data.title == "Checkpoints pruned"
    ]
    assert pruned and pruned[-1].text.startswith("freed ")

    # `goaltender disk-usage`, as an operator would run it.
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "goaltender"),
        "disk-usage",
        str(goal_id),
        env={"PATH": str(Path(sys.executable).parent), "GOALTENDER_SOCKET": str(runner.settings.socket_path)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    stdout = out.decode()
    assert stdout.startswith(f"goal #{goal_id} (finished): ")
    assert "free on the runner's disk" in stdout
    assert "#3" in stdout and "#2" in stdout


async def test_the_disk_filling_during_a_run_pauses_its_goal(start_runner, connect, tmp_path, monkeypatch):
    disk = {"mb": 500.0}
    monkeypatch.setattr(disk_guard, "free_space", lambda path: FreeSpace(path, int(disk["mb"] * MB)))
    # The run waits until the test has "filled" the disk (a file in its workspace), then finishes.
    script = (
        "goaltender experiment -d filling --metric score -- python -c "
        "\"import os, time\nwhile not os.path.exists('fill'): time.sleep(0.05)\nprint('score: 1')\"\n"
        "goaltender experiment -d next --metric score -- python -c 'print(\"score: 2\")'\n"
    )
    runner = await start_runner(
        agents={"a": write_agent(tmp_path, "a.sh", script)}, min_free_mb=100, disk_check_s=0.1
    )
    client = await connect(runner)
    goal_id = await submit(client, "fill the disk, max 2 experiments", agent="a")

    async def state() -> str:
        return (await client.request(p.Status(goal_id=goal_id))).goals[0].goal.state

    async def running() -> bool:
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        return status.running is not None and status.running.status == "running"

    await eventually(running)
    disk["mb"] = 10
    await eventually(lambda: _is(state(), "paused"), timeout=10)
    (runner.settings.workspaces / f"goal-{goal_id}" / "fill").write_text(
        ""
    )  # the run ends well; the next one waits for room
    summary = await eventually(lambda: _ledger_with(client, goal_id, 1), timeout=20)
    assert summary[0].status == "keep"
    assert await state() == "paused"  # until the disk has room
    disk["mb"] = 500
    events = await events_until_report(client, goal_id)
    reasons = [e.data.reason for e in events if isinstance(e.data, GoalStateChanged)]
    assert any(r.startswith("disk full: 10 MB free") for r in reasons)
    assert any(r.startswith("resumed: disk space is back") for r in reasons)
    assert [e.status for e in (await client.request(p.Summary(goal_id=goal_id))).ledger] == [
        "keep",
        "keep",
    ]


async def _is(value, expected) -> bool:
    return await value == expected


async def _ledger_with(client, goal_id: int, count: int):
    ledger = (await client.request(p.Summary(goal_id=goal_id))).ledger
    finished = [e for e in ledger if e.finished]
    return finished if len(finished) >= count else None
