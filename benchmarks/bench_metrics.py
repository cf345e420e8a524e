"""What a Prometheus scrape costs the runner: the scrape's own time, and how late the runner's event
loop gets meanwhile, against the same loop with no scrape, in the same run.

A real runner (its runner.db holding `--goals` goals, a tenth of them active) serves metrics on
127.0.0.1; a thread scrapes it back to back with urllib for `--seconds`, while a coroutine on the
runner's loop asks to wake every millisecond and records how late it woke. The same ticker runs for
as long without scrapes first (the baseline).

    python benchmarks/bench_metrics.py [--goals 2000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from goaltender.runner.config import RunnerSettings
from goaltender.runner.daemon import Runner
from goaltender.storage.records import Budget

TICK_S = 0.001


async def lateness(seconds: float) -> list[float]:
    """How late (s) each 1 ms sleep on this loop woke, for `seconds`."""
    late = []
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        await asyncio.sleep(TICK_S)
        late.append(time.perf_counter() - now - TICK_S)
    return late


def scrape_until(url: str, stop: threading.Event, took: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as answer:
            answer.read()
        took.append(time.perf_counter() - started)


async def fill(runner: Runner, goals: int) -> None:
    for n in range(goals):
        goal = await runner.store.create_goal(
            text=f"goal {n}",
            owner="bench",
            agent="sweep",
            budget=Budget(),
            metric=None,
            direction="maximize",
            target=None,
            workspace_root=runner.settings.workspaces,
        )
        if n % 10:
            await runner.store.set_goal_state(goal.id, "finished")


def percentile(values: list[float], share: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * share))]


async def main(goals: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = RunnerSettings(
            home=Path(tmp) / "home", socket=Path(tmp) / "r.sock", metrics_port=0, min_free_mb=64, name="bench"
        )
        runner = await Runner.start(settings)
        try:
            await fill(runner, goals)
            assert runner.metrics is not None
            baseline = await lateness(seconds)
            stop, took = threading.Event(), []
            scraper = threading.Thread(target=scrape_until, args=(runner.metrics.url, stop, took))
            scraper.start()
            scraped = await lateness(seconds)
            stop.set()
            await asyncio.to_thread(scraper.join)
        finally:
            await runner.close()
    print(
        f"runner.db with {goals} goals ({goals // 10} active); {len(took)} scrapes back to back in {seconds:g}s"
    )
    print(
        f"  a scrape: median {statistics.median(took) * 1e3:.1f} ms, p99 {percentile(took, 0.99) * 1e3:.1f} ms, "
        f"max {max(took) * 1e3:.1f} ms"
    )
    for name, late in (("no scrapes (baseline)", baseline), ("scraped back to back", scraped)):
        print(
            f"  loop lateness, {name}: median {statistics.median(late) * 1e3:.2f} ms, "
            f"p99 {percentile(late, 0.99) * 1e3:.2f} ms, max {max(late) * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    asyncio.run(main(args.goals, args.seconds))
