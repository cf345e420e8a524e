"""Whether a database's files are still the ones the connection has open.

SQLite keeps writing to the files it opened: a runner.db deleted, renamed over or copied over while
open took every later write, acknowledged, into a file nobody would read again (and SQLite left the
runner's -wal beside whatever came next, which applied it to that file at its next open). So the
connection remembers, as it opens, which files it has (device and inode of the database, its -wal
and its -shm) and what the database file looked like (size, modification time, kept current after
each of its own commits, which are the only changes SQLite makes to that file while only this
process has it open). `FileWatch` compares that with the paths, a few `stat` calls: what
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
class Lost:
    """What happened to a database's files; `in_place` when the database file itself is the one
    the connection has open but someone else wrote it (its content is no longer the connection's)."""

    path: Path
    what: str  # "was removed", "was replaced by another file", ...
    in_place: bool = False

    def __str__(self) -> str:
        return f"{self.path} {self.what}"


class FileWatch:
    """The files a database connection has open, as they were when it opened (see the module).

    A write costs six `stat` calls: the three files before it begins (`before_write`: still ours,
    the database file unchanged? so that nothing goes into a lost file) and after its commit
    (`after_commit`: still ours? then the commit's own checkpoint is what changed the database
    file)."""

    def __init__(self, path: Path):
        self.path = path
        self._paths = {suffix: f"{path}{suffix}" for suffix in ("", *SIDECARS)}
        self._files: dict[str, tuple[int, int]] = {}  # suffix -> (device, inode), of those there at open
        self._content = (0, 0)  # the database file's size and mtime, as its last commit left them
        for suffix, name in self._paths.items():
            try:
                st = os.stat(name)
            except FileNotFoundError:
                continue
            self._files[suffix] = (st.st_dev, st.st_ino)
            if not suffix:
                self._content = (st.st_size, st.st_mtime_ns)

    def before_write(self) -> Lost | None:
        """What has become of the files, if anything: removed, replaced, or the database file
        written by someone else (not to be asked while a commit of ours may be writing it)."""
        looked = {suffix: self._look(suffix) for suffix in self._files}
        for lost, _ in looked.values():
            if lost is not None:
                return lost
        st = looked.get("", (None, None))[1]
        if st is not None and (st.st_size, st.st_mtime_ns) != self._content:
            return Lost(self.path, "was written over in place by another program", in_place=True)
        return None

    def after_commit(self, *, remember: bool = True) -> Lost | None:
        """Whether any of the files was removed or replaced; if none was, `remember` the database
        file's size and mtime as this connection's commit (and its checkpoint) left them."""
        looked = {suffix: self._look(suffix) for suffix in self._files}
        for lost, _ in looked.values():
            if lost is not None:
                return lost
        if remember and (st := looked.get("", (None, None))[1]) is not None:
            self._content = (st.st_size, st.st_mtime_ns)
        return None

    def _look(self, suffix: str) -> tuple[Lost | None, os.stat_result | None]:
        if suffix not in self._files:
            return None, None
        try:
            st = os.stat(self._paths[suffix])
        except FileNotFoundError:
            return Lost(Path(self._paths[suffix]), "was removed"), None
        except OSError as exc:  # what cannot be looked at cannot be vouched for either
            return Lost(Path(self._paths[suffix]), f"can no longer be looked at ({exc.strerror})"), None
        if (st.st_dev, st.st_ino) != self._files[suffix]:
            return Lost(Path(self._paths[suffix]), "was replaced by another file"), st
        return None, st

    def ours(self, suffix: str) -> bool:
        """Whether the file at the database's path + `suffix` is still the connection's own."""
        lost, st = self._look(suffix)
        return lost is None and st is not None


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
