"""Where a demo campaign's time goes: training against everything around it.

Runs `goaltender demo --yes` (the real runner, sweep agent, sandbox and verifying evaluation) twice
with one data cache: first cold (every canvas rendered), then warm (a box that has run star count
before). From the runner's database and the runs' own logs: the campaign's wall time (goal accepted
→ ended), the experiments' wall time (each run and its evaluation, as the ledger charges them), and
the workload's own `train_seconds` and `data_seconds`. The figure issue 13 asks for is training /
campaign; the rest is start-ups, evaluation, the agent and the runner.

    python benchmarks/bench_campaign.py [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path


def campaign(directory: Path, cache: Path) -> dict[str, float]:
    env = {**os.environ, "GOALTENDER_CACHE_DIR": str(cache), "NO_COLOR": "1"}
    env.pop("GOALTENDER_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "goaltender.cli", "demo", "--yes", "--dir", str(directory)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"the demo failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    db = sqlite3.connect(directory / "runner" / "runner.db")
    accepted, ended = db.execute("SELECT accepted_at, ended_at FROM goals").fetchone()
    rows = db.execute("SELECT wall_seconds, log_path FROM experiments").fetchall()
    figures = {"experiments": float(len(rows)), "experiment_wall": 0.0, "train": 0.0, "data": 0.0}
    for wall, log in rows:
        figures["experiment_wall"] += wall or 0.0
        text = Path(log).read_text()
        for key, name in (("train", "train_seconds"), ("data", "data_seconds")):
            if found := re.search(rf"^{name}: ([0-9.]+)$", text, re.M):
                figures[key] += float(found.group(1))
    span = datetime.fromisoformat(ended) - datetime.fromisoformat(accepted)
    figures["campaign"] = span.total_seconds()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="campaigns on one cache (the first is cold)")
    args = parser.parse_args()
    print(
        "| cache | experiments | campaign s | experiments' wall s | data s | training s | training / campaign |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-campaign-") as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir()  # the sandbox binds a configured cache only when it exists
        for n in range(args.runs):
            f = campaign(Path(tmp) / f"demo-{n}", cache)
            print(
                f"| {'cold' if n == 0 else 'warm'} | {f['experiments']:.0f} | {f['campaign']:.1f} | "
                f"{f['experiment_wall']:.1f} | {f['data']:.1f} | {f['train']:.1f} | "
                f"{f['train'] / f['campaign']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
