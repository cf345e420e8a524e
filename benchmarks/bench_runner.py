"""Runner speed, each figure against a baseline measured in the same run on the same machine.

1. Event path: an agent reports N milestones over the socket; each is validated, appended to the
   WAL event log in its own BEGIN IMMEDIATE transaction, and streamed to a subscriber.
   Baseline: the bare storage floor — N single-row INSERT transactions with aiosqlite, same pragmas.
2. Request round trip: `ack` requests through RunnerClient (pydantic in and out, the daemon's
   dispatch). Baseline: a bare newline-JSON echo server on a Unix socket (json.loads/dumps only).

    python benchmarks/bench_runner.py [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner.config import RunnerSettings
from goaltender.runner.daemon import Runner
from goaltender.storage.db import Database
from goaltender.storage.records import Budget


async def bench_event_path(tmp: Path, n: int) -> float:
    settings = RunnerSettings(
        home=tmp / "home", socket=tmp / "r.sock", agents={"none": ["true"]}, default_agent="none"
    )
    runner = await Runner.start(settings)
    goal = await runner.store.create_goal(
        text="bench",
        owner="bench",
        agent="none",
        budget=Budget(),
        metric=None,
        direction="maximize",
        target=None,
        workspace_root=tmp,
    )
    agent = await RunnerClient.connect_unix(settings.socket_path, "bench-agent")
    watcher = await RunnerClient.connect_unix(settings.socket_path, "bench-bot")
    head = await watcher.subscribe(since=await runner.store.head_seq())
    target = head + n

    async def receive():
        async for event in watcher.events():
            if event.seq >= target:
                return

    receiving = asyncio.ensure_future(receive())
    start = time.perf_counter()
    for i in range(n):
        await agent.request(p.ReportMilestone(goal_id=goal.id, title=f"milestone {i}"))
    await receiving
    elapsed = time.perf_counter() - start
    await agent.close()
    await watcher.close()
    await runner.close()
    return n / elapsed


async def bench_storage_floor(tmp: Path, n: int) -> float:
    db = await Database.open(tmp / "floor.db", ["CREATE TABLE events (seq INTEGER PRIMARY KEY, data TEXT);"])
    start = time.perf_counter()
    for i in range(n):
        await db.execute("INSERT INTO events (data) VALUES (?)", (json.dumps({"title": f"milestone {i}"}),))
    elapsed = time.perf_counter() - start
    await db.close()
    return n / elapsed


async def bench_round_trip(tmp: Path, n: int) -> list[float]:
    settings = RunnerSettings(home=tmp / "home2", socket=tmp / "r2.sock", agents={"none": ["true"]})
    runner = await Runner.start(settings)
    client = await RunnerClient.connect_unix(settings.socket_path, "bench")
    times = []
    for i in range(n):
        start = time.perf_counter()
        await client.request(p.Ack(seq=i))
        times.append(time.perf_counter() - start)
    await client.close()
    await runner.close()
    return times


async def bench_echo_floor(tmp: Path, n: int) -> list[float]:
    async def echo(reader, writer):
        while line := await reader.readline():
            message = json.loads(line)
            writer.write(json.dumps({"type": "done", "id": message["id"]}).encode() + b"\n")
            await writer.drain()

    server = await asyncio.start_unix_server(echo, path=str(tmp / "echo.sock"))
    reader, writer = await asyncio.open_unix_connection(str(tmp / "echo.sock"))
    times = []
    for i in range(n):
        start = time.perf_counter()
        writer.write(json.dumps({"type": "ack", "id": i, "seq": i}).encode() + b"\n")
        await writer.drain()
        json.loads(await reader.readline())
        times.append(time.perf_counter() - start)
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    return times


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gt-bench-") as tmp:
        tmp = Path(tmp)
        ours = await bench_event_path(tmp, n)
        floor = await bench_storage_floor(tmp, n)
        rt = await bench_round_trip(tmp, n)
        echo = await bench_echo_floor(tmp, n)
    ms = 1000
    print(f"runner benchmarks, n={n}")
    print(f"{'figure':44} {'goaltender':>12} {'baseline':>12} {'ratio':>7}")
    print(
        f"{'event path: milestones/s (logged + streamed)':44} {ours:12.0f} {floor:12.0f} {ours / floor:7.2f}"
    )
    for q in (50, 99):
        a, b = percentile(rt, q) * ms, percentile(echo, q) * ms
        print(f"{f'request round trip p{q} (ms)':44} {a:12.3f} {b:12.3f} {a / b:7.2f}")
    print("baselines: bare aiosqlite INSERT transactions; bare newline-JSON echo over a Unix socket")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    asyncio.run(main(parser.parse_args().n))
