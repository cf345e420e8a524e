"""Agent verb start-up (issue 13): the CPU time (user + sys) of one `goaltender` process, against
`python -c pass` measured in the same run on the same machine.

Every agent verb is a fresh process, so its start-up is paid on every milestone and metric. The
verbs talk to a real runner started here, in a temporary directory, in this process (its own CPU
is not counted: only the CLI child's, from getrusage(RUSAGE_CHILDREN) around each run).

Run it from an installed package too (`make bench` runs it from .venv-wheel, `pip install .`): an
editable install made by `pip install -e` alone has every interpreter's site import setuptools'
import hook, ~10 ms of pathlib and importlib that the baseline pays and a verb would have paid
anyway, so the ratios there flatter the verbs (`make install` puts a path entry in its place).

    python benchmarks/bench_cli.py [--runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from goaltender.runner.config import RunnerSettings
from goaltender.runner.daemon import Runner
from goaltender.storage.records import Budget

GOALTENDER = str(Path(sys.executable).parent / "goaltender")
POINTS = 10_000


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def run_once(argv: list[str], env: dict[str, str], stdin: bytes) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one process, which must succeed."""
    before, start = children_cpu(), time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
    )
    out, _ = await proc.communicate(stdin)
    wall, cpu = time.perf_counter() - start, children_cpu() - before
    if proc.returncode != 0:
        raise SystemExit(f"{argv[1:3]} exited {proc.returncode}: {out.decode()[-300:]}")
    return cpu, wall


async def medians(argv: list[str], env: dict[str, str], runs: int, stdin: bytes = b"") -> tuple[float, float]:
    await run_once(argv, env, stdin)  # warm the page cache and .pyc files
    samples = [await run_once(argv, env, stdin) for _ in range(runs)]
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gt-bench-") as tmp:
        settings = RunnerSettings(
            home=Path(tmp) / "home", socket=Path(tmp) / "r.sock", agents={"none": ["true"]}
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
            workspace_root=Path(tmp),
        )
        env = {
            **os.environ,
            "GOALTENDER_SOCKET": str(settings.socket_path),
            "GOALTENDER_GOAL_ID": str(goal.id),
        }
        # The warm-up run writes the .pyc files an installed package has; without them every run
        # would compile the modules edited since the last write.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        points = "".join(
            json.dumps({"name": "loss", "value": 1 / (i + 1), "step": i}) + "\n" for i in range(POINTS)
        )
        base = await medians([sys.executable, "-c", "pass"], env, runs)
        figures = [
            ("goaltender --help", await medians([GOALTENDER, "--help"], env, runs)),
            (
                "goaltender milestone (one request)",
                await medians([GOALTENDER, "milestone", "step done"], env, runs),
            ),
            (
                "goaltender metrics loss=1 (one point)",
                await medians([GOALTENDER, "metrics", "loss=1"], env, runs),
            ),
            (
                f"goaltender metrics --file - ({POINTS:,} points)",
                await medians([GOALTENDER, "metrics", "--file", "-"], env, runs, points.encode()),
            ),
        ]
        await runner.close()
    hook = any(name.startswith("__editable__") for name in sys.modules)
    print(
        f"CLI start-up, median of {runs} runs; baseline `python -c pass`: {base[0]:.3f} CPU-s, {base[1]:.3f} s wall"
    )
    hook_said = "loaded in every interpreter, the baseline's too" if hook else "not loaded"
    print(f"install: {sys.prefix}; setuptools' editable import hook {hook_said}")
    print(f"{'figure':44} {'CPU-s':>7} {'ratio':>6} {'wall s':>7}")
    for name, (cpu, wall) in figures:
        print(f"{name:44} {cpu:7.3f} {cpu / base[0]:6.1f} {wall:7.3f}")
    _, (_, wall) = figures[-1]
    print(f"metrics --file: {POINTS / wall:,.0f} points/s end to end (process start included)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    asyncio.run(main(parser.parse_args().runs))
