"""Whether a database's files are still the ones the connection has open.

SQLite keeps writing to the files it opened: a runner.db deleted, renamed over or copied over while
open took every later write, acknowledged, into a file nobody would read again (and SQLite left the
runner's -wal beside whatever came next, which applied it to that file at its next open). So the
connection remembers, as it opens, which files it has (device and inode of the database, its -wal
and its -shm) and what the database file looked like (size, modification time, kept current after
each of its own commits, which are the only changes SQLite makes to that file while only this
process has it open). `FileWatch.problem()` compares that with the paths, a few `stat` calls: what
was removed, replaced by another file, or written over in place.

What is left to do once a file is lost is `rescue`: the connection still sees the database as it
was (its own inodes) unless the file was written over in place, so that view is saved beside it
with SQLite's backup API, and the connection's own -wal and -shm are taken off their paths, so
SQLite cannot apply them to the file now there. The connection itself is never closed: closing
checkpoints the -wal into the database file the connection has open, which after a copy in place
is the copied-in file.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

SIDECARS = ("-wal", "-shm")


@dataclass(frozen=True)
class _Seen:
    """A file as last looked at: which file it is, and (the database's) its size and mtime."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Seen:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def same_file(self, st: os.stat_result) -> bool:
        return (self.dev, self.ino) == (st.st_dev, st.st_ino)


@dataclass(frozen=True)
class Lost:
    """What happened to a database's files; `in_place` when the database file itself is the one
    the connection has open but someone else wrote it (its content is no longer the connection's)."""

    path: Path
    what: str  # "was removed", "was replaced by another file", ...
    in_place: bool = False

    def __str__(self) -> str:
        return f"{self.path} {self.what}"


class FileWatch:
    """The files a database connection has open, as they were when it opened (see the module)."""

    def __init__(self, path: Path):
        self.path = path
        self._seen: dict[str, _Seen] = {}
        self.remember()

    def remember(self) -> None:
        """Take the files as they are now as the connection's own (at open, and after its commits)."""
        for suffix in ("", *SIDECARS):
            try:
                self._seen[suffix] = _Seen.of(os.stat(f"{self.path}{suffix}"))
            except FileNotFoundError:
                self._seen.pop(suffix, None)

    def problem(self, *, content: bool = True) -> Lost | None:
        """What has become of the files since `remember`, if anything. `content`: also whether the
        database file was written by someone else (not while a commit of ours may be writing it)."""
        for suffix, seen in self._seen.items():
            path = Path(f"{self.path}{suffix}")
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return Lost(path, "was removed")
            if not seen.same_file(st):
                return Lost(path, "was replaced by another file")
        main = self._seen.get("")
        if content and main is not None:
            st = os.stat(self.path)
            if (st.st_size, st.st_mtime_ns) != (main.size, main.mtime_ns):
                return Lost(self.path, "was written over in place by another program", in_place=True)
        return None

    def ours(self, suffix: str) -> bool:
        """Whether the file at the database's path + `suffix` is still the connection's own."""
        seen = self._seen.get(suffix)
        try:
            return seen is not None and seen.same_file(os.stat(f"{self.path}{suffix}"))
        except FileNotFoundError:
            return False


@dataclass(frozen=True)
class Rescued:
    """What `rescue` did, in words, and where it saved the database (None: it could not)."""

    said: str
    saved: Path | None = None


async def rescue(conn, watch: FileWatch, lost: Lost) -> Rescued:
    """Save what the connection still holds and take its own -wal and -shm off their paths, for
    the line that stops the runner to tell. `conn` is the aiosqlite connection."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if lost.in_place:
        # The connection reads the copied-in pages where its -wal has none: its view is a mix, so
        # nothing is saved. Its -wal goes aside, or the next open (a `sqlite3` look included)
        # applies it to the copied-in file; if no copy was made (another program checkpointed into
        # the file), putting it back loses nothing.
        return Rescued(
            f"nothing is saved (what the runner sees is the copy mixed with its own writes){_set_aside(watch, stamp)}"
            " (put them back beside it only if nothing was copied over it)"
        )
    saved = watch.path.with_name(f"{watch.path.name}.lost-{stamp}")
    try:
        await _backup(conn, saved)
    except (OSError, sqlite3.Error) as exc:
        return Rescued(f"what it held could not be saved ({exc}){_set_aside(watch, stamp)}")
    for suffix in SIDECARS:  # what they held is in the saved copy
        if watch.ours(suffix):
            os.unlink(f"{watch.path}{suffix}")
    return Rescued(f"what it held is saved as {saved}", saved)


async def _backup(conn, to: Path) -> None:
    target = sqlite3.connect(to, check_same_thread=False)  # used from the connection's thread
    try:
        await conn.backup(target)
    finally:
        target.close()
    os.chmod(to, 0o600)


def _set_aside(watch: FileWatch, stamp: str) -> str:
    """Rename the connection's own -wal and -shm away from their paths (renaming needs no space)."""
    moved = []
    for suffix in SIDECARS:
        if watch.ours(suffix):
            aside = f"{watch.path}{suffix}.lost-{stamp}"
            os.rename(f"{watch.path}{suffix}", aside)
            moved.append(aside)
    return (
        f"; its own -wal and -shm, its writes since its last checkpoint, are set aside as {' and '.join(moved)}"
        if moved
        else ""
    )
