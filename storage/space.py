"""Free space where the runner keeps its state, and telling a full disk from other write failures.

SQLite reports a write that found no space as SQLITE_FULL ("database or disk is full"); the OS
as ENOSPC (or EDQUOT, over a quota). Both mean the same to the runner: wait for space, lose nothing.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

MB = 1024 * 1024
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class FreeSpace:
    """What a probe found: free bytes on the filesystem holding `path`."""

    path: Path
    free_bytes: int

    @property
    def free_mb(self) -> float:
        return self.free_bytes / MB

    def __str__(self) -> str:
        return f"{self.free_mb:.0f} MB free on {self.path}"


def free_space(path: Path) -> FreeSpace:
    """Bytes an unprivileged writer may still use on `path`'s filesystem."""
    return FreeSpace(path, shutil.disk_usage(path).free)


class DiskFull(Exception):
    """A write failed for want of space; `space` is what was free just after."""

    def __init__(self, space: FreeSpace, cause: BaseException):
        super().__init__(f"disk full: {space} ({cause})")
        self.space = space


def is_disk_full(exc: BaseException) -> bool:
    """Did this write fail because the disk (or the user's quota) is full?"""
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def probe_after_failure(path: Path) -> FreeSpace:
    """The free space to report with a failed write (0 when even the probe fails)."""
    try:
        return free_space(path)
    except OSError:
        return FreeSpace(path, 0)
