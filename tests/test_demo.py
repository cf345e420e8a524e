"""`goaltender demo --yes`: a whole star-count campaign, end to end, as a user runs it."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

from PIL import Image

from goaltender.storage.runner_store import RunnerStore


async def test_demo_runs_a_complete_campaign(tmp_path):
    directory = tmp_path / "demo"
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("GOALTENDER_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "goaltender.cli", "demo", "--yes", "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]

    # The thread, as a person reads it.
    assert "🎯 Goal #1 accepted" in out
    assert "🙋 Approval needed" in out and "👍 Approved by demo" in out
    assert "📋 Final report" in out and "## Ledger" in out and "## From the agent" in out
    assert "What to try next" in out

    # The ledger, from the runner's own database.
    store = await RunnerStore.open(directory / "runner" / "runner.db")
    try:
        [goal] = await store.list_goals()
        ledger = await store.experiments(goal.id)
        events = await store.events_since(0, limit=100_000)
    finally:
        await store.close()
    assert goal.state == "finished"
    baseline, best = ledger[0], max(e.metric_value or 0 for e in ledger)
    assert baseline.description.startswith("baseline") and baseline.metric_name == "exact_accuracy"
    assert all(e.verified for e in ledger if e.metric_value is not None)  # the runner scored them
    assert baseline.metric_value <= 0.40
    assert best >= 0.85
    assert all(e.status in ("keep", "discard", "crash") for e in ledger)
    assert any(e.data.kind == "approval_requested" for e in events)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].data.kind == "report"

    # The plots exist and are real PNG images.
    plots = sorted((directory / "plots").glob("*.png"))
    assert {p.name for p in plots} == {"goal-1-campaign.png", "goal-1-train_loss.png"}
    for path in plots:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 400


def test_demo_asks_at_the_terminal(tmp_path):
    """At a real terminal (a pty), prompts are answered by the person: here no once, then yes."""
    import pty
    import select
    import time

    prompt = b"[y/n, optional comment] >"
    pid, fd = pty.fork()
    if pid == 0:  # the child: the demo, attached to the pty
        os.environ["NO_COLOR"] = "1"
        os.environ.pop("GOALTENDER_HOME", None)
        goal = "star count to 99% exact accuracy, max 3 experiments"  # a rejection, then a yes
        os.execv(
            sys.executable, [sys.executable, "-m", "goaltender.cli", "demo", goal, "--dir", str(tmp_path)]
        )
    out, answered, deadline = b"", 0, time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the pty
            break
        if not chunk:
            break
        out += chunk
        while out.count(prompt) > answered:
            os.write(fd, b"n not on my laptop\n" if answered == 0 else b"y\n")
            answered += 1
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
    assert answered >= 1
    assert "👎 Rejected by" in text and "not on my laptop" in text
    assert "🏁 Skipped:" in text and "Trying the next hypothesis" in text
    assert "📋 Final report" in text


def test_a_demo_that_cannot_start_its_runner_says_why_in_a_line(tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("not a directory\n")
    done = subprocess.run(
        [sys.executable, "-m", "goaltender.cli", "demo", "--yes", "--dir", str(taken)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stderr.splitlines() == [
        f"goaltender demo: cannot start its runner: cannot write the runner's home {taken}/runner: Not a directory"
    ], done.stderr


def test_llm_demo_fails_fast_without_an_endpoint(tmp_path):
    env = {**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "GOALTENDER_MODEL": "m"}
    for agent in ("openai", "codex"):
        done = subprocess.run(
            [sys.executable, "-m", "goaltender.cli", "demo", "--agent", agent, "--dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 2
        assert "no model endpoint reachable at http://127.0.0.1:9/v1" in done.stderr
    env.pop("GOALTENDER_MODEL")
    done = subprocess.run(
        [sys.executable, "-m", "goaltender.cli", "demo", "--agent", "openai", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2 and "set GOALTENDER_MODEL" in done.stderr


def llm_demo(fake, directory, agent: str, *goal: str, base_url: str = "") -> subprocess.CompletedProcess:
    """`goaltender demo --yes --agent AGENT [GOAL]` against the fake endpoint (at its base URL,
    unless another is given), as a user runs it."""
    env = {
        **os.environ,
        "NO_COLOR": "1",
        "OPENAI_BASE_URL": base_url or fake.base_url,
        "GOALTENDER_MODEL": "fake-model",
    }
    env.pop("GOALTENDER_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "goaltender.cli", "demo", *goal, "--yes", "--agent", agent],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=directory,
    )


async def test_llm_demo_runs_against_the_endpoint_in_the_environment(tmp_path):
    """`goaltender demo --agent openai|codex` drives a goal on whatever endpoint the environment
    names; here the fake server answers that there is nothing more to do, so each goal finishes.
    The card at the end shows the tokens the agent spent against the goal's token budget (it
    showed 0 whatever they were: issue 36)."""
    from fake_openai import FakeOpenAI

    from goaltender.demo import LLM_GOAL

    fake = FakeOpenAI()
    await fake.start()
    try:
        for agent in ("openai", "codex"):
            (tmp_path / agent).mkdir()
            done = await asyncio.to_thread(
                llm_demo, fake, tmp_path / agent, agent, f"{LLM_GOAL}, max 900k tokens"
            )
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            assert "📋 Final report" in done.stdout and "Goal #1" in done.stdout
            spent = re.search(r"\n +tokens +\[[#-]+\] (\S+)/900k\n", done.stdout)
            assert spent and spent.group(1) != "0", done.stdout[-1500:]
        paths = {seen.path for seen in fake.requests}
        assert {"chat", "responses"} <= paths  # the built-in loop and Codex both asked the model
    finally:
        await fake.close()


async def test_a_demo_whose_goal_failed_exits_non_zero_saying_why(tmp_path):
    """Issue 36: it exited 0 whatever became of its goal."""
    from fake_openai import Fail, FakeOpenAI

    fake = FakeOpenAI(default=Fail(400, message="model exploded XYZ-36"))
    await fake.start()
    try:
        done = await asyncio.to_thread(llm_demo, fake, tmp_path, "openai")
    finally:
        await fake.close()
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    [said] = done.stderr.splitlines()
    assert said.startswith("goaltender demo: goal #1 failed: ") and "XYZ-36" in said, said


# ---- the endpoint check before an LLM demo (issue 36) ----


async def test_a_slow_endpoint_is_waited_for_not_called_unreachable(tmp_path):
    """A server that takes 6 s to list its models (loading, busy) works: the demo runs on it. It
    was called unreachable after 5 s."""
    from fake_openai import FakeOpenAI

    fake = FakeOpenAI()
    fake.models_delay_s = 6.0
    await fake.start()
    try:
        done = await asyncio.to_thread(llm_demo, fake, tmp_path, "openai")
    finally:
        await fake.close()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "📋 Final report" in done.stdout


async def test_an_endpoint_past_the_checks_patience_is_said_slow_not_down(monkeypatch):
    from fake_openai import FakeOpenAI

    from goaltender.demo import endpoint_problem

    fake = FakeOpenAI()
    fake.models_delay_s = 5.0
    await fake.start()
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("GOALTENDER_MODEL", "fake-model")
    try:
        problem = await endpoint_problem("openai", answer_s=1.0)
    finally:
        await fake.close()
    assert problem == (
        f"the endpoint at {fake.base_url} took the connection but sent no answer to "
        f"{fake.base_url}/models within 1s: it is up, but slow or stuck (still loading its model?); "
        "try again once it answers"
    )


async def test_a_base_url_without_v1_is_said_with_the_url_and_the_fix(tmp_path):
    """A 404 passed the check, and the goal failed later on every request."""
    from fake_openai import FakeOpenAI

    fake = FakeOpenAI()
    await fake.start()
    root = fake.base_url.removesuffix("/v1")
    try:
        done = await asyncio.to_thread(llm_demo, fake, tmp_path, "openai", base_url=root)
    finally:
        await fake.close()
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        f"goaltender demo --agent openai: {root}/models answered 404 Not Found: OPENAI_BASE_URL is "
        f"not the API's base URL (most servers serve it under /v1: {root}/v1?)"
    ]
    assert fake.requests == []  # no goal was started against it


async def test_codex_on_an_endpoint_without_the_responses_api_is_told_to_use_openai(tmp_path):
    from fake_openai import FakeOpenAI

    fake = FakeOpenAI(responses=False)
    await fake.start()
    try:
        done = await asyncio.to_thread(llm_demo, fake, tmp_path, "codex")
    finally:
        await fake.close()
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        f"goaltender demo --agent codex: this endpoint has no Responses API ({fake.base_url}/responses "
        "answered 404), which Codex needs: use --agent openai (the built-in agent speaks Chat Completions)"
    ]
