"""Each goal's disk cap: what one goal writes cannot fill the disk the others need.

A goal holds its workspace, its own caches and its /tmp (runner/sandbox.py makes them its only
writable places). The runner measures them every GOALTENDER_GOAL_DISK_CHECK_S with coreutils `du`
(allocated blocks, each hard link once, never following a link, however deep the tree), and holds
each goal to GOALTENDER_GOAL_DISK_GB (default: half of the disk the runner's home is on; 0: no
cap). Past it the goal's runs are killed and it pauses, saying what it holds: a person resumes it
once it holds less (or raises the cap). A goal that keeps writing while paused (its agent, say)
and passes the cap by a margin as well ends, failed: it would otherwise fill the disk all the same.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from goaltender.runner.config import RunnerSettings
from goaltender.runner.report import format_bytes

log = logging.getLogger("goaltender.runner")

GB = 1000**3
MARGIN_MIN = 16 << 20  # past the cap by a tenth of it (at least this), a goal paused for it ends


@dataclass(frozen=True)
class Verdict:
    """What a goal's measured size calls for: nothing, a pause, or its end."""

    action: str  # "ok", "pause" or "end"
    used: int
    cap: int

    @property
    def reason(self) -> str:
        what = f"it holds {format_bytes(self.used)}, over its disk cap of {format_bytes(self.cap)}"
        if self.action == "end":
            return f"{what} by more than {format_bytes(margin(self.cap))} while paused for it (GOALTENDER_GOAL_DISK_GB)"
        return (
            f"{what} (GOALTENDER_GOAL_DISK_GB): its runs were stopped; delete what it no longer needs "
            "(goaltender disk-usage) or raise the cap, then resume it"
        )


def margin(cap: int) -> int:
    return max(MARGIN_MIN, cap // 10)  # room to tidy up while paused, not to fill the disk


def disk_cap(settings: RunnerSettings) -> int:
    """Bytes a goal may hold; 0 for no cap."""
    if settings.goal_disk_gb is not None:
        return int(settings.goal_disk_gb * GB)
    try:
        return shutil.disk_usage(settings.home).total // 2
    except OSError:
        return 0


def judge(used: int, cap: int, paused_for_it: bool) -> Verdict:
    if not cap or used <= cap:
        return Verdict("ok", used, cap)
    if paused_for_it and used > cap + margin(cap):
        return Verdict("end", used, cap)
    return Verdict("pause", used, cap)


def goal_places(settings: RunnerSettings, workspace: Path, goal_id: int) -> list[Path]:
    """Where a goal can write."""
    return [workspace, settings.goal_cache(goal_id), settings.goal_tmp(goal_id)]


async def bytes_held(places: list[Path]) -> int | None:
    """The disk the places take (allocated), together; None when `du` cannot say."""
    there = [str(place) for place in places if place.exists()]
    if not there:
        return 0
    try:
        du = await asyncio.create_subprocess_exec(
            "du", "--summarize", "--one-file-system", "--block-size=1", "--total", "--", *there,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
    except OSError as exc:
        log.warning("goals' disk caps are not enforced: du cannot run (%s)", exc)
        return None
    out, _ = await du.communicate()
    # Exit 1 when some file could not be read (gone mid-walk, unreadable): the total is still what
    # it could read, the best there is.
    last = out.decode(errors="replace").strip().splitlines()[-1:] or [""]
    word = last[0].split("\t", 1)[0]
    return int(word) if word.isdigit() else None
