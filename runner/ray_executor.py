"""An experiment's process as a Ray job, through the Job Submission REST API of a Ray dashboard.

The runner talks plain HTTP (aiohttp): Ray itself is not a dependency. The job's log lives in Ray;
it is copied into the experiment's run.log as it grows, so metrics are read from run.log exactly as
for a local run. Ray keeps a job after it ends; nothing here deletes one (a delete within seconds
of the end leaves a ghost entry, JOB_SUPERVISOR_ACTOR_DIED).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from goaltender.runner.executors import Job, OnPoints, OnStart, Placement
from goaltender.runner.supervisor import LiveMetrics, ProcessResult, RunCancelled, open_beneath

POLL_S = 0.5
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
STOP_SETTLE_S = 5.0  # beyond grace_s: Ray SIGKILLs a stopped job ~3 s after its SIGTERM
TOKEN_ENV = "GOALTENDER_RAY_TOKEN"
CPUS = 1  # what each job asks Ray for (entrypoint_num_cpus); cpu_seconds is charged from it


class RayError(OSError):
    """Ray could not do what was asked (unreachable, token auth on, submission refused). The message
    is one line naming the address and what to do about it."""


class RayUnauthorized(RayError):
    """Token auth is on and no (or a wrong) token was sent: retrying cannot help."""


@dataclass(frozen=True)
class _Answer:
    status: int
    body: Any  # parsed JSON, or the raw text when it was not JSON


class _RayApi:
    """The handful of REST calls this executor makes, each turned into an _Answer or a RayError."""

    def __init__(self, session: aiohttp.ClientSession, address: str):
        self.session = session
        self.address = address

    async def call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> _Answer:
        try:
            async with self.session.request(method, self.address + path, json=payload) as response:
                text = await response.text(errors="replace")
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as e:
            reason = str(e) or type(e).__name__
            raise RayError(
                f"Ray at {self.address}: unreachable ({reason}) — start it (tests/engines.sh start, "
                "or `ray start --head`) or fix the Ray address"
            ) from e
        if status == 401:
            raise RayUnauthorized(
                f"Ray at {self.address}: 401 Unauthorized — set {TOKEN_ENV} or start Ray with "
                "RAY_AUTH_MODE=disabled"
            )
        try:
            body: Any = json.loads(text)
        except json.JSONDecodeError:
            body = text
        return _Answer(status, body)


class RayExecutor:
    """Runs each job as a Ray job on the cluster whose dashboard is at `address`."""

    name = "ray"

    def __init__(self, address: str, token: str | None = None, *, patience_s: float = 60.0):
        self.address = address.rstrip("/")
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        # How long odd answers (5xx, non-JSON, connection drops) are retried while following a job
        # before the run is given up as lost: a dashboard restart must not crash a healthy run.
        self.patience_s = patience_s
        self.detached: set[str] = set()  # jobs left running when their following is cancelled

    def detach(self, job_id: str) -> None:
        """The runner is going down: stop following this job, but leave it running (the next
        runner attaches to it again)."""
        self.detached.add(job_id)

    def _session(self) -> aiohttp.ClientSession:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=10))

    async def run(self, job: Job, *, on_points: OnPoints, on_start: OnStart) -> ProcessResult:
        submission_id = _submission_id(job.name)
        async with self._session() as session:
            api = _RayApi(session, self.address)
            try:
                await self._submit(api, job, submission_id)
            except asyncio.CancelledError:
                # The POST may have reached Ray: the job must not run on unsupervised.
                await _stop_quietly(api, submission_id)
                raise RunCancelled(ProcessResult(None, None, 0.0, 0.0, 0.0, False, {})) from None
            follow = _Follow(api, job, submission_id, on_points, self.patience_s, self.detached)

            async def started() -> None:
                await on_start(Placement("ray", self.address, submission_id))

            return await follow.run(started, copied=0)

    async def attach(self, job: Job, placement: Placement, *, on_points: OnPoints) -> ProcessResult:
        """Follows `placement`'s job to its end. What run.log holds already was copied (and its
        metrics delivered) before the restart: copying resumes after it, in bytes."""
        address = placement.host.rstrip("/") or self.address
        async with self._session() as session:
            api = _RayApi(session, address)
            answer = await api.call("GET", f"/api/jobs/{placement.job_id}")
            if answer.status == 404:
                raise ProcessLookupError(f"Ray at {address}: job {placement.job_id} is not known there")
            follow = _Follow(api, job, placement.job_id, on_points, self.patience_s, self.detached)
            copied = await follow.resume_metrics()
            follow.resumed = True
            return await follow.run(None, copied=copied)

    async def _submit(self, api: _RayApi, job: Job, submission_id: str) -> None:
        payload: dict[str, Any] = {
            "entrypoint": f"cd {shlex.quote(str(job.cwd))} && exec {shlex.join(job.command)}",
            "submission_id": submission_id,
            "runtime_env": {"env_vars": job.env},
            "entrypoint_num_cpus": CPUS,
            "metadata": {"goal": str(job.goal.id), "experiment": job.name, "submitted_by": "goaltender"},
        }
        if job.gpus > 0:
            payload["entrypoint_num_gpus"] = job.gpus
        answer = await api.call("POST", "/api/jobs/", payload)
        if not 200 <= answer.status < 300:
            raise RayError(
                f"Ray at {api.address}: submission refused ({answer.status}): {_one_line(answer.body)}"
            )


class _Follow:
    """One job followed to its end: status and log polled, the log's new part appended to run.log,
    metrics drained after each append; a timeout or a cancellation stops it in Ray."""

    def __init__(
        self,
        api: _RayApi,
        job: Job,
        submission_id: str,
        on_points: OnPoints,
        patience_s: float,
        detached: set[str],
    ):
        self.detached = detached
        self.api = api
        self.job = job
        self.id = submission_id
        self.workspace = Path(job.goal.workspace)
        self.live = LiveMetrics(self.workspace, job.log_path, on_points)
        self.patience_s = patience_s
        self.began = time.monotonic()
        self.running_since: float | None = None  # monotonic
        self.resumed = False  # followed again after a restart (attach)
        self.info: dict[str, Any] = {}
        self.copied = 0
        self.failing_since: float | None = None

    async def resume_metrics(self) -> int:
        """Reads what run.log holds already for its summary lines only (its series points were
        delivered before the restart); returns its size, where copying resumes."""
        await self.live.skim()
        return self.live.tails[0].offset

    async def run(self, started: Callable[[], Awaitable[None]] | None, *, copied: int) -> ProcessResult:
        self.copied = copied
        timed_out = False
        try:
            if started is not None:
                await started()
            while not await self.poll():
                if self.past_deadline():
                    timed_out = True
                    await self.stop()
                    break
                await asyncio.sleep(POLL_S)
            await self.finish()
        except asyncio.CancelledError:
            if self.id in self.detached:
                raise
            await self.stop()
            await self.finish()
            raise RunCancelled(self.result(False)) from None
        return self.result(timed_out)

    async def poll(self) -> bool:
        """One round: status, then the log. Whether the job has ended."""
        info = await self.get(f"/api/jobs/{self.id}")
        if isinstance(info, dict):
            self.info = info
        logs = await self.get(f"/api/jobs/{self.id}/logs")
        if isinstance(logs, dict) and isinstance(logs.get("logs"), str):
            self.append(logs["logs"].encode())
        await self.live.drain()
        return self.info.get("status") in TERMINAL

    async def get(self, path: str) -> dict[str, Any] | None:
        """A GET's JSON object; None for an odd answer while Ray is given patience_s to recover."""
        try:
            answer = await self.api.call("GET", path)
        except RayUnauthorized:
            raise
        except RayError as e:
            answer = _Answer(0, str(e))
        if answer.status == 404:
            raise ProcessLookupError(f"Ray at {self.api.address}: job {self.id} is gone (deleted?)")
        if answer.status == 200 and isinstance(answer.body, dict):
            self.failing_since = None
            return answer.body
        now = time.monotonic()
        self.failing_since = self.failing_since or now
        if now - self.failing_since > self.patience_s:
            raise RayError(
                f"Ray at {self.api.address}: no usable answer for job {self.id} for {self.patience_s:.0f} s "
                f"(last: {answer.status} {_one_line(answer.body)}) — check the Ray dashboard"
            )
        return None

    def append(self, log: bytes) -> None:
        """Appends the part of Ray's log not copied yet (the log only grows)."""
        if len(log) <= self.copied:
            return
        fd = open_beneath(self.workspace, self.job.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "wb") as f:
            f.write(log[self.copied :])
        self.copied = len(log)

    def past_deadline(self) -> bool:
        """The per-run timeout counts while the job runs, not while it waits for resources (as on
        Slurm). Found running right after a restart, it counts from the job's start_time in Ray
        (which includes its wait: Ray keeps no separate start of running)."""
        if self.job.timeout_s is None:
            return False
        if self.running_since is None:
            if self.info.get("status") != "RUNNING":
                return False
            start = _seconds(self.info.get("start_time")) if self.resumed else None
            self.running_since = time.monotonic() - (
                max(0.0, time.time() - start) if start is not None else 0.0
            )
        return time.monotonic() - self.running_since >= self.job.timeout_s

    async def stop(self) -> None:
        """Stops the job in Ray and waits (bounded) until Ray says it has ended."""
        await _stop_quietly(self.api, self.id)
        deadline = time.monotonic() + self.job.grace_s + STOP_SETTLE_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                info = await self.get(f"/api/jobs/{self.id}")
                if isinstance(info, dict):
                    self.info = info
            if self.info.get("status") in TERMINAL:
                return
            await asyncio.sleep(POLL_S / 2)

    async def finish(self) -> None:
        """The last of the log, a note when the job did not end on its own, the last metrics."""
        with contextlib.suppress(OSError):
            logs = await self.get(f"/api/jobs/{self.id}/logs")
            if isinstance(logs, dict) and isinstance(logs.get("logs"), str):
                self.append(logs["logs"].encode())
        status = self.info.get("status")
        if status != "SUCCEEDED" and not isinstance(self.info.get("driver_exit_code"), int):
            message = _one_line(self.info.get("message") or "no message")
            with contextlib.suppress(OSError):
                self.note(f"goaltender: Ray job {self.id} ended {status or 'in an unknown state'}: {message}")
        await self.live.drain(final=True)

    def note(self, text: str) -> None:
        fd = open_beneath(self.workspace, self.job.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "w") as f:
            f.write(f"\n{text}\n")

    def result(self, timed_out: bool) -> ProcessResult:
        """What the job used. Ray does not measure CPU time: cpu_seconds is the wall time times the
        CPUs the job was allocated (entrypoint_num_cpus), and peak RSS is unknown (0)."""
        code = self.info.get("driver_exit_code")
        exit_code = code if isinstance(code, int) else None
        stopped = self.info.get("status") == "STOPPED"
        start, end = _seconds(self.info.get("start_time")), _seconds(self.info.get("end_time"))
        wall = max(
            0.0, end - start if start is not None and end is not None else time.monotonic() - self.began
        )
        return ProcessResult(
            exit_code=exit_code,
            signal=int(signal.SIGTERM) if stopped and exit_code is None else None,
            wall_seconds=wall,
            cpu_seconds=wall * CPUS,
            peak_rss_mb=0.0,
            timed_out=timed_out,
            summary=self.live.summary,
            unreadable_lines=self.live.unreadable,
        )


async def _stop_quietly(api: _RayApi, submission_id: str) -> None:
    """Asks Ray to stop the job; an error here must not hide why it was being stopped."""
    with contextlib.suppress(OSError):
        await api.call("POST", f"/api/jobs/{submission_id}/stop")


def _submission_id(name: str) -> str:
    """Unique per submission (a retried run must not collide with its last attempt), readable in
    `ray job list`."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:80] or "goaltender"
    return f"{safe}-{int(time.time())}-{secrets.token_hex(3)}"


def _seconds(ms: object) -> float | None:
    """A Ray timestamp (ms since the epoch; 0 or absent until it happens) in seconds."""
    if isinstance(ms, int | float) and not isinstance(ms, bool) and ms > 0:
        return ms / 1000
    return None


def _one_line(body: object, limit: int = 200) -> str:
    text = (body.get("message") or body.get("detail") or json.dumps(body)) if isinstance(body, dict) else body
    line = " ".join(str(text).split())
    return line[:limit] + ("…" if len(line) > limit else "")
