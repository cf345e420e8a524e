"""Retention for runner.db and the goals' run logs: what goals that ended long ago leave behind.

A goal that ended more than the retention period ago (GOALTENDER_RETENTION_DAYS, default 90) loses
its events (every milestone, metrics batch and status change it logged: the bulk of runner.db; its
final report and fetch records are kept) and the logs of its runs, except the run its ledger marks best. The goal's
row, its ledger (one row a run), diary, approvals, audit trail and metric series stay: they are
small, and `goaltender summary` and the bot's threads read them. Active goals, and goals that ended
within the period, are not touched.

Events are deleted in batches, each its own short write, so that the runner's own writes are never
held up for long. Deleting the newest events would let SQLite number the next event with a seq
already handed out: the store keeps numbering above its high-water mark (storage/high_water.py).
Logs are removed from the goal's workspace, which its agent controlled, through directory
descriptors opened with O_NOFOLLOW: a link anywhere on the way is skipped, never followed.
Afterwards, when a quarter of the file or more is free pages, it is VACUUMed to give them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from goaltender.storage.records import TERMINAL_STATES, utcnow

if TYPE_CHECKING:
    from goaltender.storage.db import Database
    from goaltender.storage.runner_store import RunnerStore

log = logging.getLogger("goaltender.storage")

DEFAULT_RETENTION_DAYS = 90
BATCH = 5_000  # events deleted in one transaction: a few tens of milliseconds of the write lock
# Kept: the goal's final report (read again by summaries) and its fetch records (what data it
# used: they stand in its ledger)
KEPT_KINDS = ("report", "hub_fetched")
VACUUM_WHEN_FREE = 0.25  # VACUUM once this share of the file is free pages


@dataclass
class Pruned:
    """What a prune removed (or, in a dry run, would remove)."""

    dry_run: bool
    cutoff: datetime
    goals: int = 0  # ended goals past the cutoff whose history was looked at
    events: int = 0
    logs: list[Path] = field(default_factory=list)
    log_bytes: int = 0
    best_logs_kept: int = 0
    rows: dict[str, int] = field(default_factory=dict)  # other tables (the bot's), by name
    size_before: int = 0
    size_after: int = 0
    vacuumed: bool = False

    def lines(self, name: str) -> list[str]:
        """What it did, in a few lines for a person."""
        verb = "would remove" if self.dry_run else "removed"
        if self.rows:  # the bot's
            what = ", ".join(f"{count} {table}s" for table, count in self.rows.items())
            said = [f"{name}: {verb} {what} from before {self.cutoff:%Y-%m-%d %H:%M} UTC"]
        else:
            said = [
                f"{name}: {verb} {self.events} events and {len(self.logs)} run logs "
                f"({size_text(self.log_bytes)}) of {self.goals} goals that ended before "
                f"{self.cutoff:%Y-%m-%d %H:%M} UTC; kept the best runs' logs ({self.best_logs_kept})"
            ]
        if not self.dry_run and self.size_before:
            how = "after VACUUM" if self.vacuumed else "(not VACUUMed: under a quarter of it free)"
            said.append(f"{name}: {size_text(self.size_before)} -> {size_text(self.size_after)} {how}")
        return said


def cutoff_for(days: int, now: datetime | None = None) -> datetime:
    return (now or utcnow()) - timedelta(days=days)


async def prune_runner(store: RunnerStore, days: int, *, dry_run: bool = False) -> Pruned:
    """Prune runner.db's events and the run logs of goals that ended `days` ago or more. A goal
    is pruned logs first, events last, so that one with no events left to prune is done with and
    is not looked at again (on the events index: no walk of old workspaces every day)."""
    db = store.db
    pruned = Pruned(dry_run=dry_run, cutoff=cutoff_for(days), size_before=file_size(db.path))
    terminal = ", ".join(f"'{state}'" for state in sorted(TERMINAL_STATES))
    kept = ", ".join(f"'{kind}'" for kind in KEPT_KINDS)
    goals = await db.fetchall(
        f"SELECT id, workspace FROM goals WHERE state IN ({terminal}) AND ended_at < ? AND EXISTS "
        f"(SELECT 1 FROM events WHERE goal_id = goals.id AND kind NOT IN ({kept})) ORDER BY id",
        (pruned.cutoff.isoformat(),),
    )
    pruned.goals = len(goals)
    for goal_id, workspace in (tuple(row) for row in goals):
        await _prune_logs(store, goal_id, Path(workspace), pruned)
        pruned.events += await _prune_events(db, goal_id, kept, dry_run)
    if pruned.events and not dry_run:
        store.number_above_marks()
        pruned.vacuumed = await vacuum_if_worth_it(db)
    pruned.size_after = file_size(db.path)
    return pruned


async def _prune_logs(store: RunnerStore, goal_id: int, workspace: Path, pruned: Pruned) -> None:
    """Remove the logs of a goal's runs but the best's (the one its ledger marks best)."""
    best = (await store.ledgers([goal_id]))[goal_id].best
    for experiment in await store.experiments(goal_id):
        if best is not None and experiment.id == best.id:
            pruned.best_logs_kept += 1
            continue
        log_path = Path(experiment.log_path)
        removed = await asyncio.to_thread(remove_run_logs, workspace, log_path, dry_run=pruned.dry_run)
        for path, size in removed:
            pruned.logs.append(path)
            pruned.log_bytes += size


async def _prune_events(db: Database, goal_id: int, kept: str, dry_run: bool) -> int:
    where = f"goal_id = ? AND kind NOT IN ({kept})"
    if dry_run:
        return int((await db.one(f"SELECT COUNT(*) FROM events WHERE {where}", (goal_id,)))[0])
    total = 0
    while True:
        async with db.write() as tx:
            gone = await tx.run(
                f"DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE {where} LIMIT {BATCH})",
                (goal_id,),
            )
        total += gone
        if gone < BATCH:
            return total


async def vacuum_if_worth_it(db: Database) -> bool:
    """VACUUM when a quarter of the file or more is free pages (a prune's deletions leave them)."""
    free = int((await db.one("PRAGMA freelist_count"))[0])
    pages = int((await db.one("PRAGMA page_count"))[0])
    if not pages or free / pages < VACUUM_WHEN_FREE:
        return False
    room = shutil.disk_usage(db.path.parent).free
    if room < 2 * file_size(db.path):  # VACUUM writes a whole new copy before the old one goes
        log.warning("%s not VACUUMed: %d bytes free on its disk, under twice its size", db.path, room)
        return False
    await db.vacuum()
    return True


def file_size(path: Path) -> int:
    """The database's bytes on disk, its -wal included."""
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(f"{path}{suffix}").st_size
    return total


def remove_run_logs(workspace: Path, log_path: Path, *, dry_run: bool) -> list[tuple[Path, int]]:
    """Remove a run's logs: `log_path` and its seeds' (run-2.log, ...) and eval logs beside it,
    walking from `workspace` without following links. Returns each (path, bytes) removed."""
    try:
        parts = log_path.parent.relative_to(workspace).parts
    except ValueError:
        return []  # not under the workspace: not the goal's to lose
    if ".." in parts:
        return []
    names = re.compile(rf"({re.escape(log_path.stem)}|eval)(-[0-9]+)?{re.escape(log_path.suffix)}")
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    removed: list[tuple[Path, int]] = []
    try:
        for part in parts:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
        for name in os.listdir(fd):
            if not names.fullmatch(name):
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                continue
            if not dry_run:
                os.unlink(name, dir_fd=fd)
            removed.append((log_path.parent / name, st.st_size))
    except OSError as exc:  # gone already, a link on the way, or not ours to remove
        log.debug("run logs under %s left: %s", log_path.parent, exc)
    finally:
        os.close(fd)
    return removed


def size_text(count: int) -> str:
    """A byte count for people: 812 B, 3.4 MB."""
    size = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"
