"""Backups and restores of runner.db and bot.db, with SQLite's online backup API.

A backup reads the database through a connection of its own, in one read transaction (the whole
file in one step of `sqlite3.Connection.backup`), so the copy is the database as one commit left
it, even while the runner or the bot writes: WAL lets a reader and a writer go on side by side.
The connection only reads (`query_only`), and it is never the last one on a running database, so
it does not checkpoint into the file either (which the runner's watch over its files would take
for a copy written over runner.db: storage/db_files.py). The copy is written beside its final name
and renamed there once it passes `quick_check`, so a backup interrupted half-way is no backup.

A restore puts a copy back with the program that uses it stopped: the runner's home lock
(`runner.lock`, held by a running runner) is taken for the while, and a bot with bot.db open is
found in /proc. What was at the path (the database, its -wal and -shm, which SQLite would
otherwise apply to the copy) is set aside, not deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

SIDECARS = ("-wal", "-shm")
RUNNER_LOCK = "runner.lock"  # runner/daemon.py's HOME_LOCK (not imported: it pulls in the runner)
LOST_MARKER = "database-lost.txt"  # runner/config.py's lost_marker


class RestoreRefused(Exception):
    """The restore cannot be done now; the message says why and what to do."""


@dataclass(frozen=True)
class Copied:
    """One database written by a backup."""

    source: Path
    target: Path
    bytes: int


def stamp(now: datetime | None = None) -> str:
    """A timestamp for file names: sorts by time, no `:` in it."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def backup_database(source: Path, target: Path) -> Copied:
    """Copy the database at `source` to `target` (a new file) consistently, whoever writes it."""
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    if target.exists():
        raise FileExistsError(f"{target} exists already: a backup never writes over one")
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        with contextlib.closing(_reader(source)) as src, contextlib.closing(sqlite3.connect(partial)) as dst:
            src.backup(dst)  # pages=-1: the whole file in one read transaction
            # One self-contained file: looking into it (even read-only) leaves no -wal or -shm.
            dst.execute("PRAGMA journal_mode=DELETE")
            _check(dst, partial)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return Copied(source, target, target.stat().st_size)


def _reader(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=10)
    conn.execute("PRAGMA query_only=1")
    return conn


def _check(conn: sqlite3.Connection, path: Path) -> None:
    found = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
    if found != ["ok"]:
        raise sqlite3.DatabaseError(f"the copy {path} is damaged ({'; '.join(found)})")


def kind_of(path: Path) -> str:
    """'runner' or 'bot', by the tables the database holds; ValueError for anything else."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            _check(conn, path)
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{path} is not a usable SQLite database ({exc})") from None
    if "identity" in tables and "goals" in tables:
        return "runner"
    if "outbox" in tables and "threads" in tables:
        return "bot"
    raise ValueError(
        f"{path} is neither a runner.db nor a bot.db (tables: {', '.join(sorted(tables)) or 'none'})"
    )


def runner_facts(path: Path) -> dict[str, int | str]:
    """What a runner.db holds, for the lines a restore prints: identity, goals, last ids."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return {
            "runner_id": conn.execute("SELECT runner_id FROM identity").fetchone()[0],
            "goals": conn.execute("SELECT COUNT(*) FROM goals").fetchone()[0],
            "last_goal": conn.execute("SELECT COALESCE(MAX(id), 0) FROM goals").fetchone()[0],
            "last_seq": conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0],
            "schema": conn.execute("PRAGMA user_version").fetchone()[0],
        }


@contextlib.contextmanager
def runner_stopped(home: Path, doing: str = "restore") -> Iterator[None]:
    """Hold the home's runner lock for the block, so that no runner runs on it meanwhile;
    RestoreRefused if a runner holds it now."""
    path = home / RUNNER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise RestoreRefused(
                f"the runner is running on {home} ({holder}): stop it first "
                f"(systemctl stop goaltender-runner), then {doing}"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def processes_with_open(path: Path) -> list[int]:
    """The pids of this user's processes that have `path` open (from /proc; others' are unreadable)."""
    try:
        wanted = os.stat(path)
    except FileNotFoundError:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    st = fd.stat()
                    if (st.st_dev, st.st_ino) == (wanted.st_dev, wanted.st_ino):
                        pids.append(int(entry.name))
                        break
    return pids


def put_back(backup: Path, path: Path, when: str) -> list[Path]:
    """Put the database `backup` at `path` (its program stopped): what was there (the database,
    its -wal and -shm) is renamed aside with `when` in its name. Returns what was set aside."""
    aside: list[Path] = []
    incoming = path.with_name(path.name + ".restoring")
    incoming.unlink(missing_ok=True)
    os.close(os.open(incoming, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        with contextlib.closing(_reader(backup)) as src, contextlib.closing(sqlite3.connect(incoming)) as dst:
            src.backup(dst)
            _check(dst, incoming)
        kept = path.with_name(f"{path.name}.before-restore-{when}")
        for suffix in ("", *SIDECARS):  # the database first: its -wal is never left on a copy
            current = Path(f"{path}{suffix}")
            if current.exists():
                os.rename(current, f"{kept}{suffix}")
                aside.append(Path(f"{kept}{suffix}"))
        os.replace(incoming, path)
    except BaseException:
        incoming.unlink(missing_ok=True)
        raise
    return aside
