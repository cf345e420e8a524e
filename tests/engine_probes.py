"""Are the real Ray head and Slurm cluster up (tests/engines.sh start)? Their tests skip without
them, unless GOALTENDER_REQUIRE_ENGINES=1 (CI), where a missing engine fails the test."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import urllib.request

import pytest

RAY = os.environ.get("GOALTENDER_TEST_RAY", "http://127.0.0.1:8265")


def require(engine: str) -> None:
    """Skip (or, in CI, fail) the calling test when `engine` ("ray" or "slurm") is not up."""
    if reason := (ray_down() if engine == "ray" else slurm_down()):
        if os.environ.get("GOALTENDER_REQUIRE_ENGINES") == "1":
            pytest.fail(f"{reason} (GOALTENDER_REQUIRE_ENGINES=1; run tests/engines.sh start)")
        pytest.skip(f"{reason}: run tests/engines.sh start")


@functools.cache  # probed once a session: a down Slurm controller takes ~10 s to say so
def ray_down() -> str | None:
    try:
        with urllib.request.urlopen(f"{RAY}/api/version", timeout=3) as answer:
            json.load(answer)
    except (OSError, ValueError) as e:
        return f"Ray is not reachable at {RAY} ({e})"
    return None


@functools.cache
def slurm_down() -> str | None:
    if not shutil.which("sinfo"):
        return "Slurm's client (sinfo) is not installed"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "Slurm's controller did not answer sinfo in 20 s"
    if done.returncode != 0 or not {"idle", "mix", "alloc"} & set(done.stdout.split()):
        return f"no usable Slurm node ({(done.stderr or done.stdout).strip()[:200]})"
    return None


def ray_job(job_id: str) -> dict:
    """What Ray's Job Submission API says of a job."""
    with urllib.request.urlopen(f"{RAY}/api/jobs/{job_id}", timeout=5) as answer:
        return json.load(answer)
