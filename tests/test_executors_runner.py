"""`goaltender experiment --executor ray|slurm` through the real runner, CLI and engines: the run
shows up in the ledger with where it ran (executor, host, job id), its log, its metric and its
accounted time; a goal's "via slurm" is its experiments' default; `stop` cancels the job in its
engine. Needs tests/engines.sh start (CI does it); skips without the engines unless
GOALTENDER_REQUIRE_ENGINES=1."""

from __future__ import annotations

import asyncio

import pytest
from engine_probes import RAY, ray_job, require
from helpers import events_until_report, eventually, submit, write_agent

from goaltender.protocol import messages as p

RUN = (
    "goaltender experiment -d 'on {engine}' --metric score {flags} -- python -c "
    "\"import json; print(json.dumps({{'step': 1, 'loss': 0.5}})); print('score: 0.75')\"\n"
)
LONG = "goaltender experiment -d 'long on {engine}' --metric score {flags} -- sleep 600\n"
REMOTE = ["ray", "slurm"]  # GOALTENDER_EXECUTORS: an operator lets goals use them


@pytest.fixture(params=["ray", "slurm"])
def engine(request) -> str:
    require(request.param)
    return request.param


async def test_an_experiment_runs_on_a_cluster_and_lands_in_the_ledger(
    start_runner, connect, tmp_path, engine
):
    # The ray one asks with --executor; the slurm one through its goal's words.
    flags = "--executor ray" if engine == "ray" else ""
    goal_text = "one run, max 1 experiments" + (" via slurm" if engine == "slurm" else "")
    agent = write_agent(tmp_path, "a.sh", RUN.format(engine=engine, flags=flags))
    runner = await start_runner(agents={"a": agent}, compute_unit="cpu", ray_address=RAY, executors=REMOTE)
    client = await connect(runner)
    goal_id = await submit(client, goal_text, agent="a")
    await events_until_report(client, goal_id, timeout=120)

    summary = await client.request(p.Summary(goal_id=goal_id))
    [row] = summary.ledger
    assert row.status == "keep" and row.metric_value == 0.75, row.note
    assert row.executor == engine and row.job_id and row.host
    assert row.where.startswith(f"{engine} job {row.job_id} on ")
    assert (
        "score: 0.75"
        in (runner.settings.workspaces / f"goal-{goal_id}" / "experiments" / "001" / "run.log").read_text()
    )
    assert row.wall_seconds is not None and row.compute_hours == pytest.approx(row.cpu_seconds / 3600)
    series = await client.request(p.GetSeries(goal_id=goal_id, name="loss"))
    assert series.points == [(1.0, 0.5)]


GPU_RUN = (
    "goaltender experiment -d 'one gpu on ray' --metric visible_gpus --executor ray --gpus 1 -- python -c "
    "\"import os; print('visible_gpus:', len([d for d in os.environ.get('CUDA_VISIBLE_DEVICES', '').split(',') if d]))\"\n"
)


async def test_a_gpu_experiment_on_ray_from_a_box_without_gpus(start_runner, connect, tmp_path):
    """The box has no GPU; the Ray head declares two (tests/engines.sh): `--gpus 1 --executor ray`
    is the cluster's to place, and the run sees the GPU Ray gave it."""
    require("ray")
    agent = write_agent(tmp_path, "a.sh", GPU_RUN)
    runner = await start_runner(agents={"a": agent}, compute_unit="cpu", ray_address=RAY, executors=REMOTE)
    client = await connect(runner)
    goal_id = await submit(client, "one gpu run, max 1 experiments", agent="a")
    await events_until_report(client, goal_id, timeout=120)
    [row] = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert (row.status, row.executor, row.gpus, row.metric_value) == ("keep", "ray", 1, 1.0), row.note


async def test_stop_cancels_the_job_in_its_engine(start_runner, connect, tmp_path, engine):
    agent = write_agent(tmp_path, "a.sh", LONG.format(engine=engine, flags=f"--executor {engine}"))
    runner = await start_runner(agents={"a": agent}, compute_unit="cpu", ray_address=RAY, executors=REMOTE)
    client = await connect(runner)
    goal_id = await submit(client, "a long run, max 1 experiments", agent="a")

    async def placed():
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        return status.running if status.running and status.running.job_id else None

    running = await eventually(placed, timeout=60)
    await eventually(lambda: _engine_says(engine, running.job_id, "running"), timeout=60)
    await client.request(p.Stop(goal_id=goal_id, by="ana"))
    [row] = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert row.status == "crash" and row.note.startswith("ended with the goal: stopped by ana")
    assert row.job_id == running.job_id
    await eventually(lambda: _engine_says(engine, running.job_id, "stopped"), timeout=30)


async def _engine_says(engine: str, job_id: str, state: str) -> bool:
    if engine == "ray":
        info = await asyncio.to_thread(ray_job, job_id)
        return info["status"] == ("RUNNING" if state == "running" else "STOPPED")
    proc = await asyncio.create_subprocess_exec(
        "squeue",
        "-h",
        "-j",
        job_id,
        "-o",
        "%T",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    queued = out.decode().strip()
    return queued == "RUNNING" if state == "running" else queued in ("", "CANCELLED", "COMPLETING")


async def test_a_cluster_job_outlives_a_runner_restart(start_runner, connect, tmp_path, engine):
    # The job waits for a file in its workspace: it runs on while no runner follows it.
    agent = write_agent(
        tmp_path,
        "a.sh",
        f"goaltender experiment -d 'outlives' --metric score --executor {engine} -- python -c "
        "\"import os, time\nwhile not os.path.exists('go'): time.sleep(0.1)\nprint('score: 0.5')\"\n"
        "sleep 600\n",
    )
    options = {"agents": {"a": agent}, "compute_unit": "cpu", "ray_address": RAY, "executors": REMOTE}
    runner = await start_runner(**options)
    client = await connect(runner)
    goal_id = await submit(client, "outlive a restart, max 2 experiments", agent="a")

    async def placed():
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        return status.running if status.running and status.running.job_id else None

    running = await eventually(placed, timeout=60)
    await eventually(lambda: _engine_says(engine, running.job_id, "running"), timeout=60)
    await runner.close()
    assert await _engine_says(engine, running.job_id, "running")  # the shutdown left it be

    runner = await start_runner(**options)
    client = await connect(runner)
    (runner.settings.workspaces / f"goal-{goal_id}" / "go").write_text("")

    async def ended():
        [row, *_] = (await client.request(p.Summary(goal_id=goal_id))).ledger
        return row if row.finished else None

    row = await eventually(ended, timeout=60)
    assert row.status == "keep" and row.metric_value == 0.5 and row.job_id == running.job_id
    await client.request(p.Stop(goal_id=goal_id))
