"""The highest goal id, approval id and event seq a runner's home has handed out, kept outside
runner.db (`high-water.json` beside it), so that a database restored from an earlier copy never
hands one out again.

SQLite numbers a new row one above the highest row the file holds. A runner.db copied back from a
backup therefore gave its next goal the id of a goal made after the backup: that goal's workspace
(`workspaces/goal-N`, with its run logs) and, in Slack, its thread. Likewise event seqs: the bot,
which had read past them, skipped the new events. RunnerStore numbers new goals, approvals and
events above both the database's highest and the mark here (and a new goal's workspace must not
exist yet), and raises the mark after each commit, before anyone is told of what it made.

The file is rewritten in place (a few dozen bytes) without fsync: it survives the runner being
killed, as the database does; after a power loss it may lag as runner.db's last commits may.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

FILE = "high-water.json"
log = logging.getLogger("goaltender.storage")


@dataclass
class Marks:
    goal: int = 0
    approval: int = 0
    seq: int = 0


class HighWater:
    """The marks of one home, read at open and raised as ids are handed out."""

    def __init__(self, path: Path):
        self.path = path
        self.marks = _read(path)
        self._fd: int | None = None
        self._said = False  # a failed write is logged once

    def raise_to(self, *, goal: int = 0, approval: int = 0, seq: int = 0) -> None:
        """Raise the marks to these ids where they are higher, and write them if any changed."""
        marks = self.marks
        if goal <= marks.goal and approval <= marks.approval and seq <= marks.seq:
            return
        marks.goal, marks.approval, marks.seq = (
            max(goal, marks.goal),
            max(approval, marks.approval),
            max(seq, marks.seq),
        )
        data = json.dumps(asdict(marks)).encode() + b"\n"
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
        except OSError as exc:  # the marks are kept in memory; a full disk is the runner's to report
            if not self._said:
                log.warning(
                    "cannot write %s (%s): ids are still never reused while this runner runs", self.path, exc
                )
                self._said = True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read(path: Path) -> Marks:
    try:
        raw = json.loads(path.read_bytes())
        return Marks(**{name: int(raw.get(name, 0)) for name in ("goal", "approval", "seq")})
    except FileNotFoundError:
        return Marks()
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.warning("%s is unreadable (%s): new ids follow the database's (and unused workspaces)", path, exc)
        return Marks()
