"""Checkpoint retention for a goal: delete the finished experiments' checkpoints no one will want.

Kept: the `keep_best` best-scored checkpoints of the finished experiments, the latest checkpoint of
the newest finished experiment that has one, and everything of running or queued experiments (never
even listed). A checkpoint scores by its training_info.json metric when NeMo RL wrote one, else by
its experiment's ledger value; a checkpoint with neither ranks last.

The agent controls the workspace, so the walk from the workspace down to each checkpoint goes by
directory descriptors opened with O_NOFOLLOW: a symlink anywhere below the workspace (an experiment
directory, `checkpoints/`, a `step_N`) is skipped, never followed, and the deletion itself is
shutil.rmtree relative to the parent's descriptor, which refuses a link and does not follow the
links inside. A component swapped for a link after the check is caught by the same descriptors.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from goaltender.runner.disk_usage import format_bytes, open_dir, opened_dir, tree_bytes
from goaltender.runner.report import BEST_CHECKPOINT_STEP
from goaltender.storage.direction import sign
from goaltender.storage.records import Experiment
from goaltender.training.checkpoints import STEP_DIR, Checkpoint, info_key

ACTIVE = frozenset({"running", "queued"})  # their checkpoints are not ours to touch
SHOWN = 5  # best checkpoints named in the thread's line
INFO_LIMIT = 1 << 20  # training_info.json is a few hundred bytes; an agent's 10 GB one is not read


@dataclass(frozen=True, eq=False)  # by identity: a Checkpoint's info dict is unhashable
class Candidate:
    experiment: int  # its index
    checkpoint: Checkpoint
    score: float | None  # None: ranks last
    named: bool = False  # the step the launcher named best (breaks ties of ledger-scored ones)

    @property
    def label(self) -> str:
        return f"#{self.experiment} {self.checkpoint.name}"


@dataclass
class Pruned:
    removed: list[Path] = field(default_factory=list)
    freed_bytes: int = 0
    kept: list[Path] = field(default_factory=list)  # the candidates kept (best and latest)
    best: list[str] = field(default_factory=list)  # "#3 step_240", best first
    latest: str | None = None
    skipped: list[Path] = field(default_factory=list)  # links, and what could not be removed
    experiments: list[int] = field(default_factory=list)  # whose checkpoints were removed
    enabled: bool = True

    def text(self) -> str:
        """One line for the goal's thread."""
        if not self.enabled:
            return "checkpoint retention is off: every checkpoint kept"
        kept = self._kept_text()
        if not self.removed:
            return f"no checkpoint to remove; {kept}" if kept else "no checkpoint to remove"
        plural = "" if len(self.removed) == 1 else "s"
        whose = ", ".join(f"#{index}" for index in self.experiments)
        noun = "experiment" if len(self.experiments) == 1 else "experiments"
        line = f"freed {format_bytes(self.freed_bytes)}: {len(self.removed)} checkpoint{plural} of {noun} {whose}"
        return f"{line}; {kept}" if kept else line

    def _kept_text(self) -> str:
        parts = []
        if self.best:
            shown = ", ".join(self.best[:SHOWN]) + (", …" if len(self.best) > SHOWN else "")
            parts.append(f"the best {len(self.best)} ({shown})")
        if self.latest is not None and self.latest not in self.best:
            parts.append(f"the latest ({self.latest})")
        elif self.latest is not None:
            parts[-1] = parts[-1][:-1] + ", the latest among them)"
        return "kept " + " and ".join(parts) if parts else ""


def prune_checkpoints(
    workspace: Path, experiments: list[Experiment], *, direction: str, keep_best: int
) -> Pruned:
    """Delete the checkpoints the policy does not keep (see the module); keep_best <= 0: none."""
    if keep_best <= 0:
        return Pruned(enabled=False)
    pruned = Pruned()
    finished = [e for e in experiments if e.status not in ACTIVE]
    try:
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the runner's own choice
    except OSError:
        return pruned
    try:
        candidates = [c for e in finished for c in _candidates(root, workspace, e, pruned)]
        keep = _keep(candidates, direction, keep_best, pruned)
        pruned.kept = [c.checkpoint.path for c in candidates if c in keep]
        for candidate in candidates:
            if candidate not in keep:
                _remove(root, candidate, pruned)
    finally:
        os.close(root)
    pruned.experiments = sorted({_experiment_of(path, workspace) for path in pruned.removed})
    return pruned


def _keep(candidates: list[Candidate], direction: str, keep_best: int, pruned: Pruned) -> set[Candidate]:
    best = sorted(candidates, key=_rank(direction))[:keep_best]
    pruned.best = [c.label for c in best]
    keep = set(best)
    if latest := _latest(candidates):
        pruned.latest = latest.label
        keep.add(latest)
    return keep


Rank = tuple[bool, float, int, bool, int]


def _rank(direction: str) -> Callable[[Candidate], Rank]:
    """Best first: scored before unscored; then the earlier experiment (as report.best_experiment
    takes the first of equals), and within one the later step (as NeMo RL does)."""

    def key(c: Candidate) -> Rank:
        return (
            c.score is None,
            -sign(direction) * (c.score or 0.0),
            c.experiment,
            not c.named,
            -c.checkpoint.step,
        )

    return key


def _latest(candidates: list[Candidate]) -> Candidate | None:
    """The newest finished experiment's latest checkpoint: what a follow-up would resume from."""
    return max(candidates, key=lambda c: (c.experiment, c.checkpoint.step), default=None)


def _experiment_of(path: Path, workspace: Path) -> int:
    return int(path.relative_to(workspace).parts[1])


# ---- listing, by descriptors ----


@contextlib.contextmanager
def _checkpoints_dir(root: int, index: int) -> Iterator[int]:
    """experiments/NNN/checkpoints below the workspace's fd, no component a link; OSError else."""
    with (
        opened_dir("experiments", root) as experiments,
        opened_dir(f"{index:03d}", experiments) as run,
        opened_dir("checkpoints", run) as checkpoints,
    ):
        yield checkpoints


def _checkpoints_path(workspace: Path, index: int) -> Path:
    return workspace / "experiments" / f"{index:03d}" / "checkpoints"


def _candidates(root: int, workspace: Path, experiment: Experiment, pruned: Pruned) -> list[Candidate]:
    directory = _checkpoints_path(workspace, experiment.index)
    found = []
    try:
        with _checkpoints_dir(root, experiment.index) as fd:
            for name, st in _listing(fd):
                if not (m := STEP_DIR.match(name)):
                    continue  # tmp_step_N is still being written; anything else is not ours
                if not stat.S_ISDIR(st.st_mode):
                    pruned.skipped.append(directory / name)  # a link planted as a checkpoint
                    continue
                info = _training_info(fd, name)
                checkpoint = Checkpoint(int(m.group(1)), directory / name, info)
                named = checkpoint.step == _named_step(experiment)
                found.append(Candidate(experiment.index, checkpoint, _score(checkpoint, experiment), named))
    except OSError:  # no checkpoints, or a link on the way: not ours to judge
        if _is_link_on_the_way(workspace, experiment.index):
            pruned.skipped.append(directory)
    return found


def _listing(dir_fd: int) -> list[tuple[str, os.stat_result]]:
    found = []
    with os.scandir(dir_fd) as scan:
        for entry in scan:
            with contextlib.suppress(OSError):
                found.append((entry.name, entry.stat(follow_symlinks=False)))
    return sorted(found)


def _is_link_on_the_way(workspace: Path, index: int) -> bool:
    path = workspace
    for part in ("experiments", f"{index:03d}", "checkpoints"):
        path = path / part
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return True
        except OSError:
            return False
    return False


def _training_info(step_dir_parent: int, name: str) -> dict[str, Any]:
    """step_N/training_info.json, read only when it is a regular file (a FIFO would hang a plain
    open; a link would read outside the workspace)."""
    try:
        with opened_dir(name, step_dir_parent) as step:
            fd = os.open(
                "training_info.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=step
            )
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return {}
            data = f.read(INFO_LIMIT + 1)
        info = json.loads(data) if len(data) <= INFO_LIMIT else {}
    except (OSError, ValueError, RecursionError):  # the agent writes it: any bytes at all
        return {}
    return info if isinstance(info, dict) else {}


def _score(checkpoint: Checkpoint, experiment: Experiment) -> float | None:
    for key in _info_keys(experiment.metric_name):
        if _finite(value := checkpoint.info.get(key)):
            return float(value)
    if experiment.status == "crash" or not _finite(experiment.metric_value):
        return None  # a crashed run's number (if any) is no verdict on its checkpoints
    return float(experiment.metric_value)


def _info_keys(metric: str | None) -> list[str]:
    """Where training_info.json may hold the ledger's metric: `validation/accuracy` (a NeMo RL
    TensorBoard tag) is under `val:accuracy`; a bare `accuracy` most likely is too."""
    if not metric:
        return []
    if key := info_key(metric):
        return [key]
    return [metric] if ":" in metric else [f"val:{metric}", metric]


def _named_step(experiment: Experiment) -> float | None:
    """The step the NeMo RL launcher reported as the run's best checkpoint (report.best_checkpoint)."""
    metrics = experiment.metrics
    return metrics.get(BEST_CHECKPOINT_STEP, metrics.get(f"run/{BEST_CHECKPOINT_STEP}"))


def _finite(value: object) -> TypeGuard[int | float]:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past any float
        return False


# ---- deletion ----


def _remove(root: int, candidate: Candidate, pruned: Pruned) -> None:
    name, path = candidate.checkpoint.name, candidate.checkpoint.path
    try:
        with _checkpoints_dir(root, candidate.experiment) as parent:
            before = _bytes(parent, name)
            if before is None:
                pruned.skipped.append(path)  # swapped for a link (or removed) since it was listed
                return
            # Relative to the descriptor: a component swapped for a link meanwhile is not followed.
            # RecursionError: a tree thousands deep is left as far as rmtree got.
            with contextlib.suppress(RecursionError):
                shutil.rmtree(name, dir_fd=parent, ignore_errors=True)
            after = _bytes(parent, name)
    except OSError:
        pruned.skipped.append(path)
        return
    pruned.freed_bytes += before - (after or 0)
    (pruned.skipped if after is not None else pruned.removed).append(path)


def _bytes(parent: int, name: str) -> int | None:
    """The directory's bytes, None when `name` is no real directory (gone, or a link)."""
    try:
        fd = open_dir(name, parent)
    except OSError:
        return None
    try:
        return tree_bytes(fd, set(), depth=1)
    finally:
        os.close(fd)
