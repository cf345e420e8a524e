"""Supervised processes: experiments and agents, each in its own process group.

An experiment's stdout and stderr go to its run.log; the log (and an optional metrics.jsonl beside
it) is tailed while it runs, so metrics arrive live. `key: value` lines are the run's summary;
JSON-object lines are series points. Resources come from wait4(): CPU time and peak RSS of the
process and every descendant it waited for.

A process is started from a Launch: the command itself, or the sandbox wrapped around it
(runner/sandbox.py), in its goal's cgroup (runner/limits.py). Its logs live in the goal's
workspace, which the agent writes too, so the runner opens them with `open_beneath`: never
through a symlink or onto a FIFO the agent left there.

Nothing a run prints frees it from supervision. Its output is the run's to choose, so reading it
is total: a line that cannot be read (a `{…}` line that is no JSON object, nested past the
recursion limit, a line over MAX_LINE) is skipped and counted in the run's result, never raised.
It is read a bounded chunk at a time, in a worker thread, so the runner's memory does not grow
with a run's output and the event loop keeps answering through a burst. And whatever goes wrong
while it is followed, the run's timeout stands and its process group is not abandoned: a fault of
the runner's own kills the group and measures it (SupervisionFailed).

One module past 600 lines on purpose: starting a group, following its output and ending it share
the one state that must never be lost between them (the group, its log's handle and offset, the
timeout), and each step's failure is handled by the others (a fault while following kills the group).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from resource import struct_rusage
from typing import TypeGuard

import psutil

from goaltender.runner.limits import Usage, joined
from goaltender.storage.records import MetricPoint

log = logging.getLogger("goaltender.runner")

MAX_METRIC_NAME = 128  # characters: a longer `name: value` or JSON key is no metric's name
_SUMMARY_LINE = re.compile(
    rf"^\s*([A-Za-z_][\w./-]{{0,{MAX_METRIC_NAME - 1}}})\s*[:=]\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)
# `key: value` lines a run's summary keeps: the latest, so a headline printed after thousands of
# per-example lines is among them; it is part of every event and reply that carries the run.
MAX_SUMMARY = 256
TAIL_INTERVAL_S = 0.5
# Bytes of a run's output read at a time: a chunk of tiny JSON lines is ~16 MB of points.
READ_CHUNK = 256 * 1024
MAX_LINE = 1024 * 1024  # bytes: a longer line is skipped (and counted) without being held whole
DRAIN_CHUNKS = 64  # chunks one drain reads of a file while the run goes on; the rest come next
_INT_DIGITS = 18  # a longer integer is read as the float it is near (inf past 1e308): no int() limit


@dataclass
class MetricParser:
    """Incremental parser for an experiment's output (fed whole lines). Total: any line at all is
    read or counted in `unreadable`, never raised."""

    summary: dict[str, float] = field(default_factory=dict)
    unreadable: int = 0  # lines refused: `{…}` lines that are no JSON object
    # One decoder for all lines (json.loads with options builds one a call), not shared between
    # parsers: each is fed by one thread at a time.
    _json: json.JSONDecoder = field(default_factory=lambda: json.JSONDecoder(parse_int=_integer), repr=False)

    def feed(self, line: str) -> list[MetricPoint]:
        try:
            return self._read(line)
        except Exception:  # the run chooses its lines: none may end its supervision
            self.unreadable += 1
            return []

    def _read(self, line: str) -> list[MetricPoint]:
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            # ValueError (not JSON) or RecursionError (nested too deep) make it unreadable.
            obj = self._json.decode(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            step = obj.get("step")
            step = float(step) if _is_number(step) else None
            return [
                MetricPoint(name=k, value=float(v), step=step)
                for k, v in obj.items()
                if k != "step" and _is_number(v) and len(k) <= MAX_METRIC_NAME and _is_text(k)
            ]
        if m := _SUMMARY_LINE.match(line):
            value = float(m.group(2))
            if math.isfinite(value):
                self.summary.pop(m.group(1), None)  # the latest last: the oldest goes first
                self.summary[m.group(1)] = value
                if len(self.summary) > MAX_SUMMARY:
                    del self.summary[next(iter(self.summary))]
        return []


def _integer(digits: str) -> int | float:
    """A JSON integer; a long one as a float (1e400 is inf, not a metric), as int() refuses
    4,300 digits and float() overflows on an int past 1e308."""
    return int(digits) if len(digits.lstrip("-")) <= _INT_DIGITS else float(digits)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_text(name: str) -> bool:
    """Whether a JSON key is text that can be stored: a `\\ud800` escape decodes to a lone
    surrogate, which no UTF-8 (SQLite, the wire) can carry."""
    return name.isascii() or not any("\ud800" <= c <= "\udfff" for c in name)


class _Tail:
    """Reads whole new lines appended to a file (inside `root`), at most `chunk` bytes a call.

    A line is held until its newline comes, but never more than `max_line` of it: past that it is
    skipped to its newline and counted in `skipped`. Only lines that may be metrics are returned:
    a burst of plain text must not cost a Python object a line."""

    def __init__(self, root: Path, path: Path, chunk: int = READ_CHUNK, max_line: int = MAX_LINE):
        self.root = root
        self.path = path
        self.chunk = chunk
        self.max_line = max_line
        # A long line (to skip), or one with `{`, `:` or `=` in it; found by the regex engine.
        self.candidates = re.compile(rb"^(?:[^\n]{%d,}|[^\n]*[{:=][^\n]*)" % (max_line + 1), re.MULTILINE)
        self.offset = 0
        self.partial = bytearray()  # the start of the line being written (grown in place)
        self.overlong = False  # the line being written is past max_line: skipped to its newline
        self.skipped = 0
        self.end: int | None = None  # where a final read stops: the file's size when it began

    def read_lines(self, final: bool = False) -> tuple[list[str], bool]:
        """The next chunk's lines that may be metrics, and whether there is more to read.
        `final`: the writer is done; the read goes on to where the file ended when it began, and
        a last line without a newline counts too."""
        try:
            data, size = _read_sized(self.root, self.path, self.offset, self.chunk)
        except OSError:  # replaced by something that is not a file: nothing more to read
            return [], False
        if final and self.end is None:
            self.end = size
        self.offset += len(data)
        more = len(data) == self.chunk and (self.end is None or self.offset < self.end)
        cut = data.rfind(b"\n") + 1  # after the last newline: 0 when there is none
        whole = self._ended(data[:cut]) if cut else b""
        self._hold(data[cut:])
        if final and not more:
            if self.partial:
                whole, self.partial = whole + b"\n" + self.partial, bytearray()
            self.overlong, self.end = False, None
        return self._worth_reading(whole), more

    def _ended(self, ended: bytes) -> bytes:
        """The lines that end in this chunk, the one begun before it first (unless skipped)."""
        if self.overlong:
            ended = ended[ended.index(b"\n") + 1 :]  # the end of the skipped line
            self.overlong = False
        else:
            ended = bytes(self.partial) + ended
        self.partial = bytearray()
        return ended

    def _hold(self, begun: bytes) -> None:
        """The start of a line whose newline is not written yet, kept up to max_line."""
        if self.overlong or not begun:
            return
        if len(self.partial) + len(begun) > self.max_line:
            self.partial, self.overlong = bytearray(), True
            self.skipped += 1
        else:
            self.partial += begun

    def _worth_reading(self, whole: bytes) -> list[str]:
        lines = []
        for found in self.candidates.finditer(whole):
            if len(line := found.group()) > self.max_line:
                self.skipped += 1
            else:
                lines.append(line.decode(errors="replace"))
        return lines


class LiveMetrics:
    """A run's metrics as they are written: its log and the metrics.jsonl beside it, read for new
    whole lines; series points go to `on_points`, `key: value` lines to the summary.

    `drain` never raises (but CancelledError): the files are read in a worker thread, a chunk at a
    time; a line that cannot be read is counted (`unreadable`), and so are points `on_points`
    failed to take (`lost_points`); the run is followed on."""

    def __init__(
        self,
        beneath: Path,
        log_path: Path,
        on_points: Callable[[list[MetricPoint]], Awaitable[None]],
        *,
        chunk: int = READ_CHUNK,
        max_line: int = MAX_LINE,
    ):
        self.parser = MetricParser()
        self.tails = [
            _Tail(beneath, path, chunk, max_line) for path in (log_path, log_path.parent / "metrics.jsonl")
        ]
        self.on_points = on_points
        self.lost_points = 0
        self.given_up = False  # reading itself failed (a bug): the run is supervised, not followed

    @property
    def unreadable(self) -> int:
        """Lines skipped: not readable as metrics, or over MAX_LINE."""
        return self.parser.unreadable + sum(tail.skipped for tail in self.tails)

    @property
    def summary(self) -> dict[str, float]:
        return dict(self.parser.summary)  # a copy: a cancelled drain's thread may still add to it

    async def drain(self, final: bool = False) -> bool:
        """Reads what both files have new: up to DRAIN_CHUNKS chunks each, or (`final`: the run
        has ended) all they held then. Whether it caught up."""
        return await self._drain(final, DRAIN_CHUNKS if not final else None, deliver=True)

    async def skim(self) -> None:
        """Reads all both files hold for the summary alone: their series points were delivered
        before (a run followed again after a runner restart)."""
        await self._drain(False, None, deliver=False)

    async def _drain(self, final: bool, budget: int | None, *, deliver: bool) -> bool:
        caught_up = True
        for tail in self.tails:
            left, more = budget, True
            while more and not self.given_up:
                points, more = await self._read(tail, final)
                if points and deliver:
                    await self._deliver(points)
                if left is not None and more and (left := left - 1) <= 0:
                    caught_up = False
                    break
        return caught_up

    async def _read(self, tail: _Tail, final: bool) -> tuple[list[MetricPoint], bool]:
        """A chunk's points, read in a worker thread: the event loop answers meanwhile."""

        def read() -> tuple[list[MetricPoint], bool]:
            lines, more = tail.read_lines(final)
            return [point for line in lines for point in self.parser.feed(line)], more

        try:
            return await asyncio.to_thread(read)
        except Exception:
            self.given_up = True
            log.exception("reading a run's output failed: its metrics are no longer followed")
            return [], False

    async def _deliver(self, points: list[MetricPoint]) -> None:
        try:
            await self.on_points(points)
        except Exception:
            if not self.lost_points:
                log.exception("storing a run's metric points failed: they are dropped, the run followed on")
            self.lost_points += len(points)


@dataclass
class ProcessResult:
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    wall_seconds: float
    cpu_seconds: float
    peak_rss_mb: float
    timed_out: bool
    summary: dict[str, float]
    limits: Usage | None = None  # what its goal's limits did while it ran (local runs; runner/limits.py)
    unreadable_lines: int = 0  # of its output: skipped, not read as metrics (LiveMetrics.unreadable)


@dataclass
class Launch:
    """How to start one process: what Popen gets, and how to read its exit status."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()  # closed here once the process has them
    signals_as_codes: bool = False  # bwrap reports a death by signal N as exit code 128 + N
    cgroup: tuple[str, ...] = ()  # its goal's cgroup.procs files, joined before it runs (runner/limits.py)

    @property
    def command(self) -> list[str]:
        """What Popen runs: argv, in its goal's cgroup from its first instruction."""
        return joined(self.cgroup, self.argv)

    def exit_code(self, status: int) -> int:
        """Like os.waitstatus_to_exitcode: the exit code, or -N for a death by signal N."""
        code = os.waitstatus_to_exitcode(status)
        if self.signals_as_codes and 128 < code <= 128 + signal.NSIG:
            return 128 - code
        return code

    def close(self) -> None:
        """Close the descriptors the process was given, once: a second close would close whatever
        took their numbers since (another socket's, a log's)."""
        fds, self.pass_fds = self.pass_fds, ()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def spawn(launch: Launch, *, log_path: Path, beneath: Path) -> subprocess.Popen:
    """Start the process as the leader of a new session and process group, output appended to
    `log_path` (a file under `beneath`, opened with open_beneath)."""
    try:
        log = open_beneath(beneath, log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            return subprocess.Popen(
                launch.command,
                cwd=launch.cwd,
                env=launch.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=launch.pass_fds,
            )
        finally:
            os.close(log)
    finally:
        launch.close()


def open_beneath(root: Path, path: Path, flags: int) -> int:
    """Open `path`, a regular file inside the directory `root`, following no symlink below `root`
    (with O_CREAT, missing directories are made). Raises OSError for anything else: a link, a FIFO,
    a device, a path outside `root`."""
    relative = Path(os.path.normpath(path)).relative_to(os.path.normpath(root))  # ValueError if outside
    *directories, name = relative.parts
    if not name or ".." in relative.parts:
        raise OSError(f"not a file inside {root}: {path}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in directories:
            if flags & os.O_CREAT:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
        # O_NONBLOCK: a FIFO put in the log's place must not hang the runner in open().
        opened = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(opened).st_mode):
        os.close(opened)
        raise OSError(f"not a regular file: {path}")
    os.set_blocking(opened, True)
    return opened


def read_beneath(root: Path, path: Path, offset: int = 0, limit: int = -1) -> bytes:
    """Up to `limit` bytes (-1: all) of a file inside `root` from `offset` (open_beneath's rules);
    b"" when it does not exist."""
    try:
        fd = open_beneath(root, path, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        return f.read(limit)


def read_end_beneath(root: Path, path: Path, limit: int) -> bytes:
    """The last `limit` bytes of a file inside `root` (read_beneath's rules): however long it
    grew, only they are read."""
    try:
        fd = open_beneath(root, path, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        return os.pread(fd, limit, max(0, os.fstat(fd).st_size - limit))
    finally:
        os.close(fd)


def _read_sized(root: Path, path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """read_beneath's `limit` bytes from `offset`, and the file's size then (0 when missing)."""
    try:
        fd = open_beneath(root, path, os.O_RDONLY)
    except FileNotFoundError:
        return b"", 0
    try:
        return os.pread(fd, limit, offset), os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_chunk_beneath(
    root: Path, path: Path, offset: int, limit: int, peek: int, behind: int = 0
) -> tuple[bytes, bytes, bytes]:
    """The up to `behind` bytes before `offset` of a file inside `root`, the `limit` bytes from
    it, and the up to `peek` bytes after them (read_beneath's rules): read apart, so that a chunk
    is never a copy cut from a longer read. A chunk cut short by the end of the file has nothing
    after it: what is written meanwhile belongs to the next chunk."""
    try:
        fd = open_beneath(root, path, os.O_RDONLY)
    except FileNotFoundError:
        return b"", b"", b""
    try:
        before = os.pread(fd, min(behind, offset), offset - min(behind, offset))
        chunk = os.pread(fd, limit, offset)
        return before, chunk, os.pread(fd, peek, offset + limit) if len(chunk) == limit else b""
    finally:
        os.close(fd)


async def wait_process(proc: subprocess.Popen) -> tuple[int, struct_rusage]:
    """Reap `proc` with wait4 once it has exited; returns (status, rusage).

    A pidfd becomes readable when the process exits, so waiting holds no thread: a thread per live
    agent or experiment would exhaust the default executor (min(32, cores + 4) threads) and stall
    every other wait behind it. Without pidfd (non-Linux, kernel < 5.3) a thread waits instead."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        _, status, rusage = await asyncio.to_thread(os.wait4, proc.pid, 0)
    else:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_exit)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        _, status, rusage = os.wait4(proc.pid, 0)  # noqa: ASYNC222 -- it has exited: returns at once
    proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen it has been reaped
    return status, rusage


class RunCancelled(asyncio.CancelledError):
    """The run was cancelled (its goal ended, the runner is stopping) and its process group killed;
    `result` is what it used until then, so that killed work is charged like any other."""

    def __init__(self, result: ProcessResult):
        super().__init__("the run was cancelled; its process group was killed")
        self.result = result


class SupervisionFailed(RuntimeError):
    """Following the run failed by a fault of the runner's own (its output cannot cause one): its
    process group was killed rather than left unsupervised, and `result` is what it used."""

    def __init__(self, cause: Exception, result: ProcessResult):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.result = result


async def run_supervised(
    launch: Launch,
    *,
    log_path: Path,
    beneath: Path,
    timeout_s: float | None,
    on_points: Callable[[list[MetricPoint]], Awaitable[None]],
    on_start: Callable[[int], Awaitable[None]],
    grace_s: float = 5.0,
    start: Callable[[], subprocess.Popen] | None = None,
) -> ProcessResult:
    """Run one experiment to its end: live metrics, timeout by process-group kill, rusage. Its
    files (log_path, metrics.jsonl beside it) are inside `beneath`, the goal's workspace.
    `start`: how its process comes to be, when not spawned from `launch` (a standby handed the
    run, runner/standby.py); `launch` still reads its exit status.

    However it ends (exit, timeout, cancellation) its wall and CPU time are measured: a cancelled
    run raises RunCancelled carrying them; one the runner failed to follow, SupervisionFailed.
    Once the process has started, nothing else is raised, and the process never outlives this."""
    follow = LiveMetrics(beneath, log_path, on_points)
    started = time.monotonic()
    proc = start() if start is not None else spawn(launch, log_path=log_path, beneath=beneath)
    waiter = asyncio.ensure_future(wait_process(proc))
    # A timer, not a check between reads: a metrics write waiting for disk space must not stop
    # the timeout from being enforced.
    timer = asyncio.ensure_future(_kill_after(timeout_s, proc.pid, waiter, grace_s))

    def measured(timed_out: bool) -> ProcessResult:
        return _measured(launch, started, _reaped(waiter), timed_out, follow)

    try:
        await on_start(proc.pid)
        caught_up = True
        while not waiter.done():
            if caught_up:  # behind a burst of output, it reads on at once
                await asyncio.wait({waiter}, timeout=TAIL_INTERVAL_S)
            caught_up = await follow.drain()
        await waiter
        timed_out = await timer  # returns at once now (or once its kill is done)
        await follow.drain(final=True)
    except asyncio.CancelledError:
        # The runner is stopping this experiment: take its whole process group down with it, then
        # read what it printed in its grace period (a launcher names its best checkpoint there).
        timer.cancel()
        await terminate_group(proc.pid, waiter, grace_s)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(follow.drain(final=True), grace_s)
        raise RunCancelled(measured(False)) from None
    except Exception as exc:
        log.exception("following pid %d failed: its process group is killed", proc.pid)
        timer.cancel()
        await terminate_group(proc.pid, waiter, grace_s)
        raise SupervisionFailed(exc, measured(False)) from exc
    finally:
        timer.cancel()  # done already, unless something failed: then it must not kill later
    return measured(timed_out)


async def _kill_after(
    timeout_s: float | None, pgid: int, waiter: asyncio.Future[tuple[int, struct_rusage]], grace_s: float
) -> bool:
    """Whether the run outlived its timeout (and so was killed, with its process group)."""
    if timeout_s is None:
        return False
    done, _ = await asyncio.wait({waiter}, timeout=timeout_s)
    if done:
        return False
    await terminate_group(pgid, waiter, grace_s)
    return True


def _reaped(waiter: asyncio.Future[tuple[int, struct_rusage]]) -> tuple[int, struct_rusage] | None:
    if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
        return waiter.result()
    return None


def _measured(
    launch: Launch,
    started: float,
    reaped: tuple[int, struct_rusage] | None,
    timed_out: bool,
    follow: LiveMetrics,
) -> ProcessResult:
    """The run's ProcessResult: its exit, wall time since `started`, wait4's rusage, what its
    output said. `reaped` is None only when a killed group's leader could not be reaped: then
    wall time alone is known."""
    wall = time.monotonic() - started
    summary, unreadable = follow.summary, follow.unreadable
    if reaped is None:
        return ProcessResult(None, None, wall, 0.0, 0.0, timed_out, summary, unreadable_lines=unreadable)
    status, rusage = reaped
    code = launch.exit_code(status)
    return ProcessResult(
        exit_code=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        wall_seconds=wall,
        cpu_seconds=rusage.ru_utime + rusage.ru_stime,
        peak_rss_mb=rusage.ru_maxrss / 1024,  # KiB on Linux
        timed_out=timed_out,
        summary=summary,
        unreadable_lines=unreadable,
    )


KILL_SETTLE_S = 2.0  # the most a SIGKILLed group is waited for before terminate_group returns


async def terminate_group(pgid: int, waiter: asyncio.Future | None = None, grace_s: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace_s`.

    When `pgid` leads a session (the runner starts every agent and experiment in a session of its
    own), the rest of the session goes too: an agent runs each shell command in a group of its
    own, so that it can end one command, and those must not outlive it. The group gets the first
    SIGTERM alone, so an agent can end its commands its own way (Codex interrupts its turn); what
    it leaves in the session gets SIGTERM once the group is gone, and everything SIGKILL at the
    deadline. `waiter` resolves when the group's leader has been reaped."""
    deadline = time.monotonic() + grace_s

    def group_done() -> bool:
        return waiter.done() if waiter is not None else not _members(pgid, session=False)

    if _signal_groups({pgid}, signal.SIGTERM):
        await _until(group_done, deadline)
    if _signal_groups(_session_groups(pgid), signal.SIGTERM):
        await _until(lambda: not group_alive(pgid), deadline)
    # Until all are gone, so that "stopped" means nothing is left: SIGKILL is not instant, and a
    # group may have formed in the session since it was listed (bash with job control makes one
    # per command).
    settle = time.monotonic() + KILL_SETTLE_S
    while _signal_groups({pgid} | _session_groups(pgid), signal.SIGKILL) and time.monotonic() < settle:
        if not group_alive(pgid):
            break
        await asyncio.sleep(0.05)
    if waiter is not None:
        with contextlib.suppress(Exception):
            await asyncio.shield(waiter)


async def _until(done: Callable[[], bool], deadline: float) -> None:
    while not done() and time.monotonic() < deadline:  # noqa: ASYNC110 - nothing signals an empty group
        await asyncio.sleep(0.05)


def _signal_groups(groups: set[int], sig: int) -> bool:
    """Signal each group; whether any got it."""
    sent = False
    for group in groups:
        try:
            os.killpg(group, sig)
            sent = True
        except (ProcessLookupError, PermissionError):
            continue
    return sent


def _session_groups(sid: int) -> set[int]:
    """The process groups of the session `sid` leads (none when it leads no session)."""
    groups = set()
    for pid in _members(sid, session=True):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(pid) == sid:
                groups.add(os.getpgid(pid))
    return groups


def _members(pgid: int, *, session: bool) -> list[int]:
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) == pgid or (session and os.getsid(proc.pid) == pgid):
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes in a process group, or in the session it leads."""
    return _members(pgid, session=True)


def group_alive(pgid: int) -> bool:
    """Is any process still in the group, or in the session it leads (zombies aside)?"""
    return bool(group_members(pgid))


def leftover_usage(pid: int | None, started_at: float, workspace: Path) -> ProcessResult | None:
    """After a runner restart: what a run we lost track of has used, measured before it is killed
    (wait4 cannot reach it: it is no longer our child). CPU time of its group and session so far
    (with children they reaped); wall time since it started, since it is still running. None when
    it is gone, or is not ours (as in kill_leftover_group)."""
    if not pid:
        return None
    try:
        leader = psutil.Process(pid)
        if not _ours(leader, started_at, workspace):
            return None
    except (psutil.Error, ProcessLookupError):
        return None
    cpu = 0.0
    for member in _group_and_descendants(leader):
        with contextlib.suppress(psutil.Error):
            times = member.cpu_times()
            cpu += times.user + times.system + times.children_user + times.children_system
    wall = max(0.0, time.time() - started_at)
    return ProcessResult(None, None, wall, cpu, 0.0, False, {})


def _group_and_descendants(leader: psutil.Process) -> list[psutil.Process]:
    """The group and session `leader` leads, and its descendants (a sandbox's are in a pid
    namespace of their own, and may have left the session), each once."""
    found: dict[int, psutil.Process] = {}
    for pid in group_members(leader.pid):
        with contextlib.suppress(psutil.Error):
            found[pid] = psutil.Process(pid)
    with contextlib.suppress(psutil.Error):
        found.update((child.pid, child) for child in leader.children(recursive=True))
    return list(found.values())


def kill_leftover_group(pid: int | None, started_after: float | None, workspace: Path) -> bool:
    """After a runner restart: SIGKILL a process group we once led, if it is still ours."""
    if not pid:
        return False
    try:
        if not _ours(psutil.Process(pid), started_after, workspace):
            return False
    except (psutil.Error, ProcessLookupError):
        # The leader is gone; members of its group (and session) may not be.
        return _signal_groups({pid} | _session_groups(pid), signal.SIGKILL) if group_alive(pid) else False
    return _signal_groups({pid} | _session_groups(pid), signal.SIGKILL)


def _ours(leader: psutil.Process, started_after: float | None, workspace: Path) -> bool:
    """Is `leader` the group leader a record named (an agent or a run of the goal in `workspace`),
    not a process that got its pid since? Not older than the record, leading its group, and started
    in the goal's workspace, as the runner starts them all. (Pids come round again within minutes
    where pid_max is 32768: a restarted runner had SIGKILLed an unrelated process group, a shell
    session with everything in it, that had come to lead with a recorded pid.)"""
    if started_after is not None and leader.create_time() < started_after - 5:
        return False
    if os.getpgid(leader.pid) != leader.pid:
        return False
    try:
        cwd = Path(leader.cwd())
    except (psutil.Error, OSError):
        return False
    return cwd == workspace or cwd.is_relative_to(workspace)
