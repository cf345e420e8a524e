"""The Ray and Slurm executors against the real engines (tests/engines.sh start brings both up).

Each test runs for both engines: metrics and output of a run, a failing run, cancellation (the
job is stopped in its engine), the per-run timeout, and attach after a runner "crash" (the
follower dies, the job does not). Without an engine its tests skip, unless
GOALTENDER_REQUIRE_ENGINES=1 (CI), where they fail. Answers Ray would give in trouble (401,
5xx, non-JSON) come from a small fake dashboard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from engine_probes import RAY, ray_job, require
from helpers import eventually

from goaltender.runner.executors import Job, Placement
from goaltender.runner.ray_executor import RayError, RayExecutor
from goaltender.runner.slurm_executor import SlurmError, SlurmExecutor
from goaltender.runner.supervisor import ProcessResult, RunCancelled
from goaltender.storage.records import Goal, MetricPoint

ENGINES = ["ray", "slurm"]


@dataclass
class Engine:
    """One engine under test: a fresh executor, and how to ask the engine itself about a job."""

    name: str
    make: Callable[[], RayExecutor | SlurmExecutor]

    async def stopped(self, job_id: str) -> bool:
        """The engine says the job was stopped and is no longer running."""
        if self.name == "ray":
            return await asyncio.to_thread(_ray_status, job_id) == "STOPPED"
        queue = await _slurm("squeue", "-h", "-j", job_id, "-o", "%T")
        shown = await _slurm("scontrol", "-o", "show", "job", job_id)
        return queue.strip() == "" and "JobState=CANCELLED" in shown


def _ray_status(job_id: str) -> str:
    return ray_job(job_id)["status"]


async def _slurm(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return out.decode()


@pytest.fixture(params=ENGINES)
def engine(request) -> Engine:
    require(request.param)
    if request.param == "ray":
        return Engine("ray", lambda: RayExecutor(RAY))
    return Engine("slurm", lambda: SlurmExecutor())


def make_job(
    workspace: Path, code: str, *, env: dict[str, str] | None = None, timeout_s: float | None = None
) -> Job:
    goal = Goal(id=7, text="remote executor test", workspace=str(workspace))
    return Job(
        goal=goal,
        command=[sys.executable, "-u", "-c", code],
        cwd=workspace,
        env=env or {},
        log_path=workspace / "experiments" / "e1" / "run.log",
        name=f"goaltender-test-{uuid.uuid4().hex[:8]}",
        gpus=0,
        timeout_s=timeout_s,
        grace_s=1.0,
    )


@dataclass
class Seen:
    """What the runner's callbacks got."""

    points: list[MetricPoint] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)

    async def on_points(self, points: list[MetricPoint]) -> None:
        self.points.extend(points)

    async def on_start(self, placement: Placement) -> None:
        self.placements.append(placement)


def log_of(job: Job) -> str:
    return job.log_path.read_text() if job.log_path.exists() else ""


TALKER = """
import os, sys
print('{"step": 1, "loss": 0.5}')
print("SECRET_SEEN=" + os.environ.get("GT_TEST_VALUE", "missing"))
print("accuracy: 0.9")
"""

SLEEPER = "import time; print('started', flush=True); time.sleep(60)"


async def test_a_run_reports_metrics_output_and_env(engine, tmp_path):
    job = make_job(tmp_path, TALKER, env={"GT_TEST_VALUE": "from-job-env"})
    seen = Seen()
    result = await engine.make().run(job, on_points=seen.on_points, on_start=seen.on_start)
    assert result.exit_code == 0 and result.signal is None and not result.timed_out
    assert result.summary == {"accuracy": 0.9}
    assert [(p.name, p.value, p.step) for p in seen.points] == [("loss", 0.5, 1.0)]
    log = log_of(job)
    assert "accuracy: 0.9" in log and "SECRET_SEEN=from-job-env" in log
    [placement] = seen.placements
    assert placement.executor == engine.name and placement.job_id and placement.host
    assert result.wall_seconds >= 0 and result.cpu_seconds >= result.wall_seconds


GPU_COUNTER = """
import os
visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
print("visible_gpus:", len(visible))
"""


async def test_a_run_asking_for_a_gpu_gets_one_from_ray(tmp_path):
    """tests/engines.sh declares 2 GPUs on the Ray head (no hardware): a job asking for one is
    scheduled against them and sees the one Ray gave it, as on a GPU node."""
    require("ray")
    job = dataclasses.replace(make_job(tmp_path, GPU_COUNTER), gpus=1)
    result = await RayExecutor(RAY).run(job, on_points=Seen().on_points, on_start=Seen().on_start)
    assert result.exit_code == 0 and result.summary == {"visible_gpus": 1.0}, log_of(job)
    (tmp_path / "cpu").mkdir()
    without = make_job(tmp_path / "cpu", GPU_COUNTER)
    result = await RayExecutor(RAY).run(without, on_points=Seen().on_points, on_start=Seen().on_start)
    assert result.exit_code == 0 and result.summary == {"visible_gpus": 0.0}, log_of(without)


async def test_a_failing_run_has_its_exit_code(engine, tmp_path):
    job = make_job(tmp_path, "import sys; print('failing'); sys.exit(3)")
    seen = Seen()
    result = await engine.make().run(job, on_points=seen.on_points, on_start=seen.on_start)
    assert result.exit_code == 3 and not result.timed_out
    assert "failing" in log_of(job)


async def test_cancelling_the_run_stops_the_job_in_its_engine(engine, tmp_path):
    job = make_job(tmp_path, SLEEPER)
    seen = Seen()
    task = asyncio.ensure_future(engine.make().run(job, on_points=seen.on_points, on_start=seen.on_start))
    await eventually(lambda: "started" in log_of(job), timeout=30)
    task.cancel()
    with pytest.raises(RunCancelled) as cancelled:
        await task
    assert isinstance(cancelled.value.result, ProcessResult)
    assert cancelled.value.result.exit_code is None and not cancelled.value.result.timed_out
    [placement] = seen.placements
    await eventually(lambda: engine.stopped(placement.job_id), timeout=15)


async def test_the_timeout_stops_the_job(engine, tmp_path):
    job = make_job(tmp_path, SLEEPER, timeout_s=2.0)
    seen = Seen()
    result = await engine.make().run(job, on_points=seen.on_points, on_start=seen.on_start)
    assert result.timed_out and result.exit_code != 0
    assert "started" in log_of(job)
    await eventually(lambda: engine.stopped(seen.placements[0].job_id), timeout=15)


COUNTER = """
import json, time
for step in range(1, 13):
    print(json.dumps({"step": step, "loss": 1.0 / step}), flush=True)
    print(f"line {step}", flush=True)
    time.sleep(0.25)
print("accuracy: 0.75")
"""


class RunnerCrashed(BaseException):
    """Stands for the runner dying while it follows a job: the follower stops, the job runs on.
    A BaseException, as SystemExit is: a failing `on_points` (an Exception) is survived by design."""


async def test_attach_follows_a_job_to_its_end_after_a_restart(engine, tmp_path):
    job = make_job(tmp_path, COUNTER)
    before = Seen()

    async def crash_at_step_3(points: list[MetricPoint]) -> None:
        await before.on_points(points)
        if any(p.step is not None and p.step >= 3 for p in points):
            raise RunnerCrashed

    with pytest.raises(RunnerCrashed):
        await engine.make().run(job, on_points=crash_at_step_3, on_start=before.on_start)
    [placement] = before.placements
    after = Seen()
    result = await engine.make().attach(job, placement, on_points=after.on_points)

    assert result.exit_code == 0 and result.summary == {"accuracy": 0.75}
    lines = [line for line in log_of(job).splitlines() if line.startswith("line ")]
    assert lines == [f"line {step}" for step in range(1, 13)]  # each once, in order
    steps_before = {p.step for p in before.points}
    steps_after = {p.step for p in after.points}
    assert steps_before | steps_after == {float(s) for s in range(1, 13)}
    if engine.name == "ray":  # the log copied before the crash is not copied (nor parsed) again
        assert not steps_before & steps_after


async def test_attach_to_an_unknown_job_says_so(engine, tmp_path):
    job = make_job(tmp_path, TALKER)
    unknown = Placement(engine.name, RAY if engine.name == "ray" else "ci", "999999999")
    with pytest.raises(ProcessLookupError):
        await engine.make().attach(job, unknown, on_points=Seen().on_points)


# --- clear errors --------------------------------------------------------------------------


async def test_an_unreachable_ray_is_a_one_line_os_error(tmp_path):
    job = make_job(tmp_path, TALKER)
    with pytest.raises(OSError) as raised:
        await RayExecutor("http://127.0.0.1:9").run(job, on_points=Seen().on_points, on_start=Seen().on_start)
    assert isinstance(raised.value, RayError)
    message = str(raised.value)
    assert "http://127.0.0.1:9" in message and "unreachable" in message and "\n" not in message


async def test_missing_sbatch_is_a_one_line_os_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    job = make_job(tmp_path, TALKER)
    with pytest.raises(SlurmError) as raised:
        await SlurmExecutor(cluster="ci").run(job, on_points=Seen().on_points, on_start=Seen().on_start)
    assert isinstance(raised.value, OSError)
    assert "sbatch not found" in str(raised.value) and "slurm-client" in str(raised.value)


async def test_slurm_refusing_a_job_is_an_os_error(tmp_path):
    require("slurm")
    job = make_job(tmp_path, TALKER)
    with pytest.raises(SlurmError, match="sbatch refused"):
        await SlurmExecutor(partition="no-such-partition").run(
            job, on_points=Seen().on_points, on_start=Seen().on_start
        )


class FakeRay:
    """A dashboard that answers as Ray does when things go wrong: token auth on, a refused
    submission, or odd answers (5xx, HTML) for a while before the job's real status."""

    def __init__(self, *, unauthorized: bool = False, refuse: bool = False, odd_answers: int = 0):
        self.unauthorized, self.refuse, self.odd_answers = unauthorized, refuse, odd_answers
        self.polls = 0
        self.stopped: list[str] = []

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.auth])
        app.router.add_post("/api/jobs/", self.submit)
        app.router.add_get("/api/jobs/{id}", self.status)
        app.router.add_get("/api/jobs/{id}/logs", self.logs)
        app.router.add_post("/api/jobs/{id}/stop", self.stop)
        return app

    @web.middleware
    async def auth(self, request, handler):
        if self.unauthorized:
            return web.Response(status=401, text="Unauthorized: Missing authentication token")
        return await handler(request)

    async def submit(self, request):
        body = await request.json()
        if self.refuse:
            return web.Response(status=400, text="Failed to submit job: bad runtime_env")
        return web.json_response({"job_id": body["submission_id"], "submission_id": body["submission_id"]})

    async def status(self, request):
        self.polls += 1
        if self.polls <= self.odd_answers:
            if self.polls % 2:
                return web.Response(status=502, text="<html>Bad Gateway</html>")
            return web.Response(status=200, text="<html>not json</html>")
        return web.json_response(
            {"status": "SUCCEEDED", "driver_exit_code": 0, "start_time": 1_000_000, "end_time": 1_004_500}
        )

    async def logs(self, request):
        return web.json_response({"logs": "Running entrypoint\naccuracy: 0.5\n"})

    async def stop(self, request):
        self.stopped.append(request.match_info["id"])
        return web.json_response({"stopped": True})


async def serve(fake: FakeRay) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(fake.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def test_token_auth_on_is_a_one_line_os_error_naming_the_fix(tmp_path):
    runner, address = await serve(FakeRay(unauthorized=True))
    try:
        with pytest.raises(RayError) as raised:
            await RayExecutor(address).run(
                make_job(tmp_path, TALKER), on_points=Seen().on_points, on_start=Seen().on_start
            )
    finally:
        await runner.cleanup()
    message = str(raised.value)
    assert address in message and "401" in message and "GOALTENDER_RAY_TOKEN" in message
    assert "RAY_AUTH_MODE=disabled" in message and "\n" not in message


async def test_a_refused_submission_is_an_os_error(tmp_path):
    runner, address = await serve(FakeRay(refuse=True))
    try:
        with pytest.raises(RayError, match=r"submission refused \(400\).*bad runtime_env"):
            await RayExecutor(address).run(
                make_job(tmp_path, TALKER), on_points=Seen().on_points, on_start=Seen().on_start
            )
    finally:
        await runner.cleanup()


async def test_odd_answers_while_following_are_retried(tmp_path):
    fake = FakeRay(odd_answers=4)
    runner, address = await serve(fake)
    job = make_job(tmp_path, TALKER)
    try:
        result = await RayExecutor(address).run(job, on_points=Seen().on_points, on_start=Seen().on_start)
    finally:
        await runner.cleanup()
    assert fake.polls > 4 and not fake.stopped
    assert result.exit_code == 0 and result.summary == {"accuracy": 0.5}
    assert result.wall_seconds == 4.5 and result.cpu_seconds == 4.5  # from Ray's times, 1 CPU allocated
    assert log_of(job) == "Running entrypoint\naccuracy: 0.5\n"
