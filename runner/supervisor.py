"""Supervised processes: experiments and agents, each in its own process group.

An experiment's stdout and stderr go to its run.log; the log (and an optional metrics.jsonl beside
it) is tailed while it runs, so metrics arrive live. `key: value` lines are the run's summary;
JSON-object lines are series points. Resources come from wait4(): CPU time and peak RSS of the
process and every descendant it waited for.

A process is started from a Launch: the command itself, or the sandbox wrapped around it
(runner/sandbox.py), in its goal's cgroup (runner/limits.py). Its logs live in the goal's
workspace, which the agent writes too, so the runner opens them with `open_beneath`: never
through a symlink or onto a FIFO the agent left there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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

MAX_METRIC_NAME = 128  # characters: a longer `name: value` or JSON key is no metric's name
_SUMMARY_LINE = re.compile(
    rf"^\s*([A-Za-z_][\w./-]{{0,{MAX_METRIC_NAME - 1}}})\s*[:=]\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)
# `key: value` lines a run's summary keeps: the latest, so a headline printed after thousands of
# per-example lines is among them; it is part of every event and reply that carries the run.
MAX_SUMMARY = 256
TAIL_INTERVAL_S = 0.5


@dataclass
class MetricParser:
    """Incremental parser for an experiment's output (fed whole lines)."""

    summary: dict[str, float] = field(default_factory=dict)

    def feed(self, line: str) -> list[MetricPoint]:
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                return []
            if not isinstance(obj, dict):
                return []
            step = obj.get("step")
            step = float(step) if _is_number(step) else None
            return [
                MetricPoint(name=k, value=float(v), step=step)
                for k, v in obj.items()
                if k != "step" and _is_number(v) and len(k) <= MAX_METRIC_NAME
            ]
        if m := _SUMMARY_LINE.match(line):
            value = float(m.group(2))
            if math.isfinite(value):
                self.summary.pop(m.group(1), None)  # the latest last: the oldest goes first
                self.summary[m.group(1)] = value
                if len(self.summary) > MAX_SUMMARY:
                    del self.summary[next(iter(self.summary))]
        return []


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class _Tail:
    """Reads whole new lines appended to a file (inside `root`) since the last call."""

    def __init__(self, root: Path, path: Path):
        self.root = root
        self.path = path
        self.offset = 0
        self.partial = b""

    def read_lines(self, final: bool = False) -> list[str]:
        try:
            chunk = read_beneath(self.root, self.path, self.offset)
        except OSError:  # replaced by something that is not a file: nothing more to read
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        return [raw.decode(errors="replace") for raw in lines]


class LiveMetrics:
    """A run's metrics as they are written: its log and the metrics.jsonl beside it, read for new
    whole lines; series points go to `on_points`, `key: value` lines to the summary."""

    def __init__(
        self, beneath: Path, log_path: Path, on_points: Callable[[list[MetricPoint]], Awaitable[None]]
    ):
        self.parser = MetricParser()
        self.tails = [_Tail(beneath, log_path), _Tail(beneath, log_path.parent / "metrics.jsonl")]
        self.on_points = on_points

    async def drain(self, final: bool = False) -> None:
        points = [p for tail in self.tails for line in tail.read_lines(final) for p in self.parser.feed(line)]
        if points:
            await self.on_points(points)


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
        for fd in self.pass_fds:
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
    run raises RunCancelled carrying them."""
    follow = LiveMetrics(beneath, log_path, on_points)
    parser, drain = follow.parser, follow.drain
    started = time.monotonic()
    proc = start() if start is not None else spawn(launch, log_path=log_path, beneath=beneath)
    waiter = asyncio.ensure_future(wait_process(proc))
    # A timer, not a check between reads: a metrics write waiting for disk space must not stop
    # the timeout from being enforced.
    timer = asyncio.ensure_future(_kill_after(timeout_s, proc.pid, waiter, grace_s))

    try:
        await on_start(proc.pid)
        while not waiter.done():
            await asyncio.wait({waiter}, timeout=TAIL_INTERVAL_S)
            await drain()
        ended = await waiter
        timed_out = await timer  # returns at once now (or once its kill is done)
        await drain(final=True)
    except asyncio.CancelledError:
        # The runner is stopping this experiment: take its whole process group down with it.
        timer.cancel()
        await terminate_group(proc.pid, waiter, grace_s)
        raise RunCancelled(_measured(launch, started, _reaped(waiter), False, parser.summary)) from None
    finally:
        timer.cancel()  # done already, unless something failed: then it must not kill later
    return _measured(launch, started, ended, timed_out, parser.summary)


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
    summary: dict[str, float],
) -> ProcessResult:
    """The run's ProcessResult: its exit, wall time since `started`, wait4's rusage. `reaped` is
    None only when a killed group's leader could not be reaped: then wall time alone is known."""
    wall = time.monotonic() - started
    if reaped is None:
        return ProcessResult(None, None, wall, 0.0, 0.0, timed_out, summary)
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


def leftover_usage(pid: int | None, started_at: float) -> ProcessResult | None:
    """After a runner restart: what a run we lost track of has used, measured before it is killed
    (wait4 cannot reach it: it is no longer our child). CPU time of its group and session so far
    (with children they reaped); wall time since it started, since it is still running. None when
    it is gone, or is not ours (as in kill_leftover_group)."""
    if not pid:
        return None
    try:
        leader = psutil.Process(pid)
        if leader.create_time() < started_at - 5 or os.getpgid(pid) != pid:
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


def kill_leftover_group(pid: int | None, started_after: float | None = None) -> bool:
    """After a runner restart: SIGKILL a process group we once led, if it is still ours.

    `started_after` (epoch seconds) guards against a recycled pid: the process must not be older
    than the record that named it.
    """
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if started_after is not None and proc.create_time() < started_after - 5:
            return False
        if os.getpgid(pid) != pid:
            return False
    except (psutil.Error, ProcessLookupError):
        # The leader is gone; members of its group (and session) may not be.
        return _signal_groups({pid} | _session_groups(pid), signal.SIGKILL) if group_alive(pid) else False
    return _signal_groups({pid} | _session_groups(pid), signal.SIGKILL)
