"""How much disk a goal's workspace takes: per experiment (checkpoints broken out) and the rest.

The agent controls the workspace, so the walk goes by directory descriptors opened with O_NOFOLLOW:
a symlink is counted as the link it is (never followed), a FIFO or device is only lstat'ed (never
opened), and a file that vanishes or cannot be read mid-walk counts as 0 rather than failing. Sizes
are apparent sizes (st_size) of everything but directories, each inode once: a hardlinked file is
counted where the walk first meets it."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from goaltender.runner.report import format_bytes
from goaltender.training.checkpoints import STEP_DIR

__all__ = ["ExperimentUsage", "Usage", "format_bytes", "goal_usage", "open_dir", "tree_bytes"]

MAX_DEPTH = 200  # deeper trees are an agent's prank: each level holds an fd and a Python frame
MAX_ROWS = 20

Seen = set[tuple[int, int]]  # (st_dev, st_ino) already counted


def open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    """A directory's fd; OSError if `name` is a symlink (ELOOP), not a directory, or gone."""
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


@contextlib.contextmanager
def opened_dir(name: str | Path, dir_fd: int | None = None) -> Iterator[int]:
    fd = open_dir(name, dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def entries(dir_fd: int) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of each entry of the directory; those that vanish meanwhile are left out."""
    found = []
    try:
        with os.scandir(dir_fd) as scan:
            for entry in scan:
                with contextlib.suppress(OSError):
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
    except OSError:  # unreadable (permissions) or removed under us
        pass
    return found


def tree_bytes(dir_fd: int, seen: Seen, skip: frozenset[str] = frozenset(), depth: int = 0) -> int:
    """Bytes beneath the directory `dir_fd` (top-level names in `skip` left out), inodes in `seen`
    not counted again."""
    total = 0
    for name, st in entries(dir_fd):
        if name in skip:
            continue
        if stat.S_ISDIR(st.st_mode):
            total += _subtree_bytes(dir_fd, name, seen, depth + 1)
        elif (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def _subtree_bytes(dir_fd: int, name: str, seen: Seen, depth: int) -> int:
    if depth > MAX_DEPTH:
        return 0
    try:
        with opened_dir(name, dir_fd) as fd:
            return tree_bytes(fd, seen, depth=depth)
    except OSError:  # replaced by a link or removed since it was listed
        return 0


@dataclass(frozen=True)
class ExperimentUsage:
    index: int
    bytes: int  # all of experiments/NNN, checkpoints included
    checkpoint_bytes: int  # experiments/NNN/checkpoints (unfinished tmp_step_N included)
    checkpoints: int  # finished step_N directories


@dataclass(frozen=True)
class Usage:
    total: int
    experiments: dict[int, ExperimentUsage] = field(default_factory=dict)
    other: int = 0  # the rest of the workspace: repos, caches, data the agent put there

    def lines(self, max_rows: int = MAX_ROWS) -> list[str]:
        """A short table, newest experiments first."""
        rows = [f"total {format_bytes(self.total)}"]
        newest = sorted(self.experiments.values(), key=lambda e: e.index, reverse=True)
        for usage in newest[:max_rows]:
            row = f"  #{usage.index:<4} {format_bytes(usage.bytes):>9}"
            if usage.checkpoints or usage.checkpoint_bytes:
                plural = "" if usage.checkpoints == 1 else "s"
                row += f"  ({usage.checkpoints} checkpoint{plural}, {format_bytes(usage.checkpoint_bytes)})"
            rows.append(row)
        if len(newest) > max_rows:
            rest = sum(usage.bytes for usage in newest[max_rows:])
            rows.append(f"  … {len(newest) - max_rows} more  {format_bytes(rest)}")
        rows.append(f"  other {format_bytes(self.other):>9}")
        return rows


def goal_usage(workspace: Path) -> Usage:
    """The workspace's bytes; Usage(0) when it cannot be opened. The workspace itself is the
    runner's choice, so a link there is followed; nothing below it is."""
    seen: Seen = set()
    try:
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return Usage(total=0)
    try:
        experiments, experiments_other = _experiments(root, seen)
        # After the experiments: a file hardlinked into both is the experiment's.
        skip = frozenset({"experiments"}) if experiments_other is not None else frozenset()
        other = tree_bytes(root, seen, skip) + (experiments_other or 0)
    finally:
        os.close(root)
    total = sum(usage.bytes for usage in experiments.values()) + other
    return Usage(total=total, experiments=experiments, other=other)


def _experiments(root: int, seen: Seen) -> tuple[dict[int, ExperimentUsage], int | None]:
    """Each experiments/NNN directory's usage, and the bytes of the rest of experiments/ (None when
    experiments/ is no real directory: the caller counts it as any other entry)."""
    try:
        fd = open_dir("experiments", root)
    except OSError:
        return {}, None
    try:
        found: dict[int, ExperimentUsage] = {}
        done = set()
        for name, st in sorted(entries(fd)):
            if (index := experiment_index(name)) is not None and stat.S_ISDIR(st.st_mode):
                with contextlib.suppress(OSError):  # a link, or gone: counted with the rest
                    found[index] = _experiment(fd, name, index, seen)
                    done.add(name)
        rest = tree_bytes(fd, seen, skip=frozenset(done))
    finally:
        os.close(fd)
    return found, rest


def experiment_index(name: str) -> int | None:
    """5 for `005`, as the runner names experiment directories; None for any other name."""
    if name.isascii() and name.isdigit() and name == f"{int(name):03d}":
        return int(name)
    return None


def _experiment(experiments: int, name: str, index: int, seen: Seen) -> ExperimentUsage:
    with opened_dir(name, experiments) as fd:
        checkpoint_bytes, count = 0, 0
        try:
            with opened_dir("checkpoints", fd) as checkpoints:
                checkpoint_bytes = tree_bytes(checkpoints, seen, depth=1)
                count = sum(
                    1
                    for entry, st in entries(checkpoints)
                    if STEP_DIR.match(entry) and stat.S_ISDIR(st.st_mode)
                )
            skip = frozenset({"checkpoints"})
        except OSError:  # none, or a link: counted as any other entry
            skip = frozenset()
        rest = tree_bytes(fd, seen, skip)
    return ExperimentUsage(index, rest + checkpoint_bytes, checkpoint_bytes, count)
