"""Every benchmark `make bench` runs still runs: each as its own process, at a small size, against
a fresh cache, and prints its figures. The figures themselves are the benchmarks' business (docs/benchmarks.md);
this only keeps them from rotting unseen (from the day agents were sandboxed, bench_bot's milestone
agent waited for a flag in a /tmp its sandbox does not show, and `make bench` stopped there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# name -> (small arguments, a line its output must have)
SMALL = {
    "bench_runner": (["--n", "50"], "request round trip p50"),
    "bench_bot": (
        ["--acks", "3", "--warmup", "1", "--milestones", "2", "--fast-milestones", "3", "--no-campaign"],
        "event->post p50",
    ),
    "bench_redact": (["--n", "200"], "ratio"),
    "bench_metrics": (["--goals", "20", "--seconds", "1"], "loop lateness, scraped back to back"),
    "bench_parsing": (["--repeat", "1"], "ratio"),
    "bench_wire": (["--repeat", "1"], "ratio"),
    "bench_history": (["--events", "3000", "--log-mib", "2"], "replay of 3000 events"),
    "bench_cli": (["--runs", "1"], "python -c pass"),
    "bench_slots": (["--goals", "2"], "makespan"),
    "bench_search": (["--workload", "text_sentiment", "--seeds", "1", "--max", "2"], "text_sentiment"),
    "bench_campaign": (["--turns", "1"], "training / campaign"),
    "bench_prompt": (["--no-model"], "sum of the parts"),
}


def test_make_bench_runs_every_benchmark_here():
    makefile = (REPO / "Makefile").read_text()
    assert sorted(SMALL) == sorted(
        {  # bench_cli runs twice: from the editable .venv and from the wheel's
            line.split("benchmarks/")[1].split()[0].removesuffix(".py")
            for line in makefile.split("\nbench:")[1].split("\n\n")[0].splitlines()
            if "benchmarks/" in line
        }
    )


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_benchmark_runs_small_and_prints_its_figures(name, tmp_path):
    arguments, expected = SMALL[name]
    env = {**os.environ, "GOALTENDER_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}
    env.pop("GOALTENDER_HOME", None)
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{name}.py"), *arguments],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"{name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert expected in done.stdout, done.stdout[-3000:]
