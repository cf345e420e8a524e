"""An experiment's process as a Slurm batch job, through Slurm's own commands (sbatch, squeue,
scontrol, scancel, sacct), each run as an asyncio subprocess so the runner's loop never blocks.

Slurm writes the job's output into the experiment's run.log itself (-o/-e, appended); the runner
tails it for metrics exactly as for a local run, polls squeue until the job leaves the queue, and
reads what it used from `scontrol show job` (or the job-completion log, `sacct -c`, once the
controller has forgotten it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from goaltender.runner.executors import Job, OnPoints, OnStart, Placement
from goaltender.runner.supervisor import LiveMetrics, ProcessResult, RunCancelled, open_beneath

POLL_S = 0.5
CLI_TIMEOUT_S = 30.0  # a Slurm command waits for an unreachable controller ~10 s (MessageTimeout)
STOP_SETTLE_S = 5.0  # beyond grace_s, for a cancelled job to leave the queue
QUEUED = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING")
UNKNOWN = "UNKNOWN"  # squeue failed: not known to have ended, so still followed
FOLLOWED = (*QUEUED, UNKNOWN)
SLURM_ENV = ("SLURM_CONF",)  # the runner's, passed on to sbatch so it finds the same cluster


class SlurmError(OSError):
    """A Slurm command is missing or refused what was asked; the message is one line with the fix."""


@dataclass
class _Cli:
    returncode: int
    out: str
    err: str


@dataclass
class _JobRecord:
    """What Slurm says about a job that has left the queue (or is leaving it)."""

    state: str = ""
    exit_code: int | None = None
    signal: int | None = None
    start: float | None = None  # epoch seconds
    end: float | None = None
    cpus: int = 1


async def _cli(argv: list[str], env: dict[str, str] | None = None) -> _Cli:
    """Runs a Slurm command to its end without blocking the loop. A missing command is a
    SlurmError saying how to get it; a cancelled call does not leave the command behind."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
    except FileNotFoundError as e:
        raise SlurmError(
            f"Slurm: {argv[0]} not found — install the Slurm client (apt-get install slurm-client) "
            "or put Slurm's bin directory on the runner's PATH"
        ) from e
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    except BaseException as e:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if isinstance(e, TimeoutError):  # a hung controller: a failed call, retried like any other
            return _Cli(-1, "", f"{argv[0]} did not answer in {CLI_TIMEOUT_S:.0f} s")
        raise
    return _Cli(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


class SlurmExecutor:
    """Runs each job with sbatch on the cluster this box's Slurm client talks to."""

    name = "slurm"

    def __init__(
        self,
        partition: str | None = None,
        extra_args: list[str] | None = None,
        cluster: str | None = None,
        *,
        patience_s: float = 60.0,
    ):
        self.partition = partition
        self.extra_args = list(extra_args or [])
        self._cluster = cluster
        # How long failing squeue/scontrol calls (controller restarting) are retried while
        # following a job before the run is given up as lost.
        self.patience_s = patience_s
        self.detached: set[str] = set()  # jobs left running when their following is cancelled

    def detach(self, job_id: str) -> None:
        """The runner is going down: stop following this job, but leave it queued or running
        (the next runner attaches to it again)."""
        self.detached.add(job_id)

    async def cluster(self) -> str:
        """The cluster's name (Placement.host), read from `scontrol show config` once."""
        if self._cluster is None:
            answer = await _cli(["scontrol", "show", "config"])
            found = re.search(r"^ClusterName\s*=\s*(\S+)", answer.out, re.MULTILINE)
            self._cluster = found.group(1) if found else "slurm"
        return self._cluster

    async def run(self, job: Job, *, on_points: OnPoints, on_start: OnStart) -> ProcessResult:
        script = self.write_script(job)
        job_id = await self.submit(job, script)
        follow = _Follow(job, job_id, on_points, self.patience_s, self.detached)
        try:
            await on_start(Placement("slurm", await self.cluster(), job_id))
        except asyncio.CancelledError:
            await follow.cancel()
            raise RunCancelled(await follow.result(False)) from None
        return await follow.run()

    async def attach(self, job: Job, placement: Placement, *, on_points: OnPoints) -> ProcessResult:
        """Follows `placement`'s job to its end. Slurm kept writing run.log while no runner read it,
        so it is read again from its start: series points from before the restart are delivered
        again (the offset read then is not known), none is lost."""
        follow = _Follow(job, placement.job_id, on_points, self.patience_s, self.detached)
        if await follow.queue_state() is None and not (await follow.record()).state:
            raise ProcessLookupError(f"Slurm: job {placement.job_id} is not known to the cluster")
        return await follow.run()

    def write_script(self, job: Job) -> Path:
        """job.sh beside the log: cd and exec the command, quoted (sbatch keeps its own copy)."""
        script = job.log_path.parent / "job.sh"
        text = f"#!/bin/sh\ncd {shlex.quote(str(job.cwd))} || exit 1\nexec {shlex.join(job.command)}\n"
        fd = open_beneath(Path(job.goal.workspace), script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return script

    async def submit(self, job: Job, script: Path) -> str:
        """sbatch the script; the job's environment is job.env (with PATH, so sbatch is found)."""
        argv = [
            shutil.which("sbatch") or "sbatch",
            "--parsable",
            "-J",
            job.name,
            "-o",
            str(job.log_path),
            "-e",
            str(job.log_path),
            "--open-mode=append",
            "--chdir",
            str(job.cwd),
        ]
        if job.gpus > 0:
            argv.append(f"--gres=gpu:{job.gpus}")
        if self.partition:
            argv += ["-p", self.partition]
        argv += [*self.extra_args, "--export=ALL", str(script)]
        env = {key: os.environ[key] for key in ("PATH", *SLURM_ENV) if key in os.environ} | job.env
        answer = await _cli(argv, env=env)
        job_id = answer.out.strip().split(";")[0]
        if answer.returncode != 0 or not job_id.isdigit():
            detail = _one_line(answer.err or answer.out) or f"exit code {answer.returncode}"
            raise SlurmError(f"Slurm: sbatch refused job {job.name}: {detail}")
        return job_id


class _Follow:
    """One Slurm job followed to its end: the queue polled, run.log tailed for metrics; a timeout
    or a cancellation scancels it."""

    def __init__(self, job: Job, job_id: str, on_points: OnPoints, patience_s: float, detached: set[str]):
        self.detached = detached
        self.job = job
        self.id = job_id
        self.live = LiveMetrics(Path(job.goal.workspace), job.log_path, on_points)
        self.patience_s = patience_s
        self.began = time.monotonic()
        self.running_since: float | None = None  # monotonic: the per-run timeout counts from here
        self.failing_since: float | None = None

    async def run(self) -> ProcessResult:
        timed_out = False
        try:
            while (state := await self.queue_state()) in FOLLOWED:
                await self.live.drain()
                if state == "RUNNING" and self.running_since is None:
                    self.running_since = await self.started_monotonic()
                if self.past_deadline():
                    timed_out = True
                    await self.cancel()
                    break
                await asyncio.sleep(POLL_S)
            result = await self.result(timed_out)
        except asyncio.CancelledError:
            if self.id in self.detached:
                raise
            await self.cancel()
            raise RunCancelled(await self.result(False)) from None
        return result

    async def queue_state(self) -> str | None:
        """The job's state in squeue; None once it has left the queue (or is unknown)."""
        answer = await _cli(["squeue", "-h", "-j", self.id, "-o", "%T"])
        if answer.returncode == 0:
            self.failing_since = None
            state = answer.out.strip()
            return state or None
        if "invalid job id" in answer.err.lower():
            return None
        self.patience(f"squeue: {_one_line(answer.err)}")
        return UNKNOWN

    def patience(self, what: str) -> None:
        now = time.monotonic()
        self.failing_since = self.failing_since or now
        if now - self.failing_since > self.patience_s:
            raise SlurmError(
                f"Slurm: job {self.id} could not be followed for {self.patience_s:.0f} s ({what})"
            )

    async def started_monotonic(self) -> float:
        """When the job started, on the monotonic clock (from scontrol's StartTime: right after a
        restart too)."""
        start = (await self.record()).start
        now = time.monotonic()
        return now - max(0.0, time.time() - start) if start is not None else now

    def past_deadline(self) -> bool:
        """The per-run timeout counts while the job runs, not while it waits in the queue."""
        if self.job.timeout_s is None or self.running_since is None:
            return False
        return time.monotonic() - self.running_since >= self.job.timeout_s

    async def cancel(self) -> None:
        """scancel, then wait (bounded) until the job has left the queue."""
        with contextlib.suppress(OSError):
            await _cli(["scancel", self.id])
        deadline = time.monotonic() + self.job.grace_s + STOP_SETTLE_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if await self.queue_state() not in FOLLOWED:
                    return
            await asyncio.sleep(POLL_S / 2)

    async def record(self) -> _JobRecord:
        """The job as scontrol knows it, or as the job-completion log does once scontrol has
        forgotten it; an empty record when neither knows it."""
        answer = await _cli(["scontrol", "-o", "show", "job", self.id])
        if answer.returncode == 0 and "JobState=" in answer.out:
            return _parse_scontrol(answer.out)
        with contextlib.suppress(OSError):
            sacct = await _cli(
                ["sacct", "-c", "-j", self.id, "-P", "-n", "-o", "JobID,State,ExitCode,Start,End"]
            )
            return _parse_sacct(sacct.out, self.id)
        return _JobRecord()

    async def result(self, timed_out: bool) -> ProcessResult:
        """What the job used. Slurm (without accounting) does not measure CPU time here:
        cpu_seconds is the wall time times the CPUs allocated (NumCPUs), peak RSS unknown (0)."""
        await self.live.drain(final=True)
        record = await self.record()
        if record.start is not None and record.end is not None:
            wall = max(0.0, record.end - record.start)
        else:
            wall = time.monotonic() - self.began
        return ProcessResult(
            exit_code=record.exit_code,
            signal=record.signal,
            wall_seconds=wall,
            cpu_seconds=wall * record.cpus,
            peak_rss_mb=0.0,
            timed_out=timed_out,
            summary=self.live.summary,
            unreadable_lines=self.live.unreadable,
        )


def _field(text: str, key: str) -> str:
    found = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", text)
    return found.group(1) if found else ""


def _parse_exit(value: str) -> tuple[int | None, int | None]:
    """Slurm's ExitCode N:SIG as (exit code, signal): a death by signal has no exit code, as for a
    local process."""
    code, _, sig = value.partition(":")
    if not code.isdigit():
        return None, None
    if sig.isdigit() and int(sig) > 0:
        return None, int(sig)
    return int(code), None


def _parse_time(value: str) -> float | None:
    """A Slurm timestamp (local time, e.g. 2026-12-03T16:50:55; Unknown/None when not yet)."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _parse_scontrol(text: str) -> _JobRecord:
    exit_code, sig = _parse_exit(_field(text, "ExitCode"))
    cpus = _field(text, "NumCPUs")
    return _JobRecord(
        state=_field(text, "JobState"),
        exit_code=exit_code,
        signal=sig,
        start=_parse_time(_field(text, "StartTime")),
        end=_parse_time(_field(text, "EndTime")),
        cpus=int(cpus) if cpus.isdigit() and int(cpus) > 0 else 1,
    )


def _parse_sacct(text: str, job_id: str) -> _JobRecord:
    """`sacct -c -P -n -o JobID,State,ExitCode,Start,End` rows; the job's own row. The completion
    log has no signal for a cancelled job (0:0): a CANCELLED state reads as SIGTERM."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or parts[0] != job_id:
            continue
        state = parts[1].split()[0] if parts[1].split() else ""
        exit_code, sig = _parse_exit(parts[2])
        if state == "CANCELLED" and sig is None:
            exit_code, sig = None, 15
        return _JobRecord(state, exit_code, sig, _parse_time(parts[3]), _parse_time(parts[4]))
    return _JobRecord()


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line[:limit] + ("…" if len(line) > limit else "")
