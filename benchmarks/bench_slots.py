"""Fair slots on a shared box, through a real runner, sandbox and CLI (shell agents).

1. Three goals on two slots, four 1-second runs each: each goal's wait for its runs (mean, max),
   and the makespan against the ideal (all the work / 2 slots). Fairness = the least-waiting
   goal's mean wait / the most-waiting goal's (1.0 = perfectly even).
2. A burst of 20 goals, two CPU-bound runs each (~0.4 CPU-s), on GOALTENDER_SLOTS=2 against the
   same burst with a slot each (what the runner did before slots): the most runs at once, every
   goal's progress, and a run's own wall time (the time it takes once started) in both.

    python benchmarks/bench_slots.py [--goals 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner.config import RunnerSettings
from goaltender.runner.daemon import Runner
from goaltender.storage.records import Experiment

SLEEP = "goaltender experiment -d wait --metric score -- python -c 'import time; time.sleep(1.0); print(\"score: 1\")'\n"
SPIN = (
    "goaltender experiment -d spin --metric score -- python -c "
    "'s = sum(i * i for i in range(4_000_000)); print(\"score: 1\")'\n"
)


async def campaign(
    tmp: Path, name: str, script: str, goals: int, slots: int
) -> tuple[list[list[Experiment]], float]:
    agent = tmp / f"{name}.sh"
    agent.write_text("#!/bin/bash\n" + script)
    agent.chmod(0o755)
    settings = RunnerSettings(
        home=tmp / name,
        socket=tmp / f"{name}.sock",
        agents={"a": [str(agent)]},
        default_agent="a",
        compute_unit="cpu",
        slots=slots,
        min_free_mb=64,
    )
    runner = await Runner.start(settings)
    client = await RunnerClient.connect_unix(settings.socket_path, "bench")
    try:
        started = time.perf_counter()
        ids = []
        for n in range(goals):
            reply = await client.request(
                p.SubmitGoal(text=f"{name} {n}, max {script.count('goaltender')} experiments")
            )
            ids.append(reply.status.goal.id)
        while True:
            status = await client.request(p.Status(active_only=True))
            if not any(s.goal.id in ids for s in status.goals):
                break
            await asyncio.sleep(0.2)
        makespan = time.perf_counter() - started
        ledgers = [(await client.request(p.Summary(goal_id=g))).ledger for g in ids]
        return ledgers, makespan
    finally:
        await client.close()
        await runner.close()


def most_at_once(rows: list[Experiment]) -> int:
    edges = sorted(
        [(r.started_at, 1) for r in rows] + [(r.ended_at, -1) for r in rows], key=lambda e: (e[0], e[1])
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--goals", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gt-bench-") as tmp_name:
        tmp = Path(tmp_name)

        ledgers, makespan = await campaign(tmp, "three", SLEEP * 4, goals=3, slots=2)
        rows = [r for ledger in ledgers for r in ledger]
        work = sum(r.wall_seconds or 0 for r in rows)
        print("3 goals × 4 runs of 1 s on 2 slots")
        means = []
        for n, ledger in enumerate(ledgers, 1):
            waits = [r.queued_seconds or 0.0 for r in ledger]
            means.append(statistics.mean(waits))
            print(f"  goal {n}: {len(ledger)} runs, waited mean {means[-1]:.2f} s, max {max(waits):.2f} s")
        print(f"  at most {most_at_once(rows)} at once; makespan {makespan:.1f} s vs ideal {work / 2:.1f} s")
        print(
            f"  fairness (least / most mean wait): {min(means) / max(means):.2f}"
            if max(means)
            else "  no waits"
        )

        for slots in (2, args.goals):
            ledgers, makespan = await campaign(tmp, f"burst{slots}", SPIN * 2, goals=args.goals, slots=slots)
            rows = [r for ledger in ledgers for r in ledger]
            walls = sorted(r.wall_seconds or 0 for r in rows)
            progressed = sum(1 for ledger in ledgers if any(r.status in ("keep", "discard") for r in ledger))
            print(
                f"{args.goals} goals × 2 CPU-bound runs, {slots} slots: at most {most_at_once(rows)} at once, "
                f"{progressed}/{args.goals} goals progressed, run wall median {statistics.median(walls):.2f} s "
                f"(max {walls[-1]:.2f} s), makespan {makespan:.1f} s"
            )


if __name__ == "__main__":
    asyncio.run(main())
