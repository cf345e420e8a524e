"""A goal's disk usage (runner/disk_usage.py) on real trees: the sizes add up exactly, links are
counted as links and never followed, a hardlinked file counts once, a FIFO does not hang the walk,
and the CLI's table."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from goaltender.runner.disk_usage import ExperimentUsage, Usage, format_bytes, goal_usage


def put(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\1" * size)
    return path


def made_tree(ws: Path) -> None:
    put(ws / "experiments" / "001" / "run.log", 100)
    put(ws / "experiments" / "001" / "metrics.jsonl", 20)
    put(ws / "experiments" / "001" / "checkpoints" / "step_10" / "policy" / "weights.bin", 1000)
    put(ws / "experiments" / "001" / "checkpoints" / "step_20" / "training_info.json", 30)
    put(ws / "experiments" / "001" / "checkpoints" / "tmp_step_30" / "weights.bin", 500)
    put(ws / "experiments" / "002" / "run.log", 50)
    put(ws / "experiments" / "notes.txt", 7)  # not an experiment: other
    put(ws / "experiments" / "5" / "run.log", 9)  # not how the runner names one: other
    put(ws / "repo" / "src" / "a.py", 300)
    put(ws / ".cache" / "blob", 4000)


def test_sizes_add_up_exactly(tmp_path):
    ws = tmp_path / "ws"
    made_tree(ws)
    usage = goal_usage(ws)
    assert usage.experiments == {
        1: ExperimentUsage(index=1, bytes=1650, checkpoint_bytes=1530, checkpoints=2),
        2: ExperimentUsage(index=2, bytes=50, checkpoint_bytes=0, checkpoints=0),
    }
    assert usage.other == 7 + 9 + 300 + 4000
    assert usage.total == 1650 + 50 + 4316


def test_links_are_counted_as_links_and_not_followed(tmp_path):
    ws = tmp_path / "ws"
    made_tree(ws)
    outside = put(tmp_path / "outside" / "huge", 100_000).parent
    links = [ws / "repo" / "escape", ws / "experiments" / "003", ws / "experiments" / "002" / "checkpoints"]
    for link in links:
        link.symlink_to(outside)
    (ws / "repo" / "loop").symlink_to(ws)  # a cycle, were it followed
    link_bytes = [os.lstat(link).st_size for link in links]
    usage = goal_usage(ws)
    assert sorted(usage.experiments) == [1, 2]  # 003 is a link: the rest of experiments/
    assert usage.experiments[2] == ExperimentUsage(
        index=2, bytes=50 + link_bytes[2], checkpoint_bytes=0, checkpoints=0
    )
    loop = os.lstat(ws / "repo" / "loop").st_size
    assert usage.other == 4316 + link_bytes[0] + link_bytes[1] + loop
    assert usage.total == 1650 + 50 + link_bytes[2] + usage.other


def test_a_hardlinked_file_counts_once(tmp_path):
    ws = tmp_path / "ws"
    made_tree(ws)
    weights = ws / "experiments" / "001" / "checkpoints" / "step_10" / "policy" / "weights.bin"
    os.link(weights, ws / "repo" / "weights_again.bin")
    os.link(weights, ws / "experiments" / "001" / "checkpoints" / "step_20" / "same.bin")
    usage = goal_usage(ws)
    # The experiment meets it first and has it; the repo's and step_20's links add nothing.
    assert usage.experiments[1].checkpoint_bytes == 1530
    assert usage.other == 4316
    assert usage.total == 1650 + 50 + 4316


def test_a_fifo_does_not_hang_and_counts_nothing(tmp_path):
    ws = tmp_path / "ws"
    made_tree(ws)
    os.mkfifo(ws / "repo" / "pipe")
    os.mkfifo(ws / "experiments" / "001" / "checkpoints" / "step_10" / "training_info.json")
    result: list[Usage] = []
    walker = threading.Thread(target=lambda: result.append(goal_usage(ws)), daemon=True)
    walker.start()
    walker.join(timeout=20)
    assert result, "goal_usage hung on a FIFO"
    assert result[0].total == 1650 + 50 + 4316


def test_unreadable_and_missing(tmp_path):
    assert goal_usage(tmp_path / "missing") == Usage(total=0)
    ws = tmp_path / "ws"
    made_tree(ws)
    locked = ws / "repo" / "src"
    locked.chmod(0)
    try:
        usage = goal_usage(ws)
    finally:
        locked.chmod(0o700)
    # root reads it anyway; anyone else gets what could be read.
    assert usage.other in (4316, 4316 - 300)


def test_lines_newest_first_with_the_rest_folded():
    experiments = {
        i: ExperimentUsage(
            index=i, bytes=i * 1_000_000, checkpoint_bytes=i * 900_000 if i % 2 else 0, checkpoints=i % 2
        )
        for i in range(1, 26)
    }
    usage = Usage(
        total=sum(e.bytes for e in experiments.values()) + 2_500, experiments=experiments, other=2_500
    )
    lines = usage.lines()
    assert lines[0] == "total 325.0 MB"
    assert lines[1] == "  #25     25.0 MB  (1 checkpoint, 22.5 MB)"
    assert lines[2] == "  #24     24.0 MB"
    assert lines[20] == "  #6       6.0 MB"
    assert lines[21] == "  … 5 more  15.0 MB"
    assert lines[22] == "  other    2.5 kB"
    assert len(lines) == 23
    assert Usage(total=0).lines() == ["total 0 B", "  other       0 B"]


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 999, 1000, 12_345_678, 12_300_000_000, 5 * 10**12)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "12.3 MB",
        "12.3 GB",
        "5.0 TB",
    ]
