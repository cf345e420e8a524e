"""Shared fixtures: a real runner on a real Unix socket, with real SQLite and real subprocesses."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
from fake_slack import FakeSlack
from ssh_box import SSHBox

from goaltender.bot.app import GoaltenderBot
from goaltender.bot.config import BotSettings
from goaltender.bot.transports import RunnerTarget
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner.config import RunnerSettings
from goaltender.runner.daemon import Runner
from goaltender.storage.records import Approval, ApprovalRequested, Event, FinalReport

pytest_plugins = ["fake_openai"]  # its model_server fixture: a fake OpenAI-compatible endpoint

BIN = str(Path(sys.executable).parent)


@pytest.fixture(autouse=True)
def _goaltender_on_path(monkeypatch):
    # Agents written as shell scripts call the `goaltender` CLI of this environment.
    monkeypatch.setenv("PATH", BIN + os.pathsep + os.environ.get("PATH", ""))


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    # slack_sdk and openai route even 127.0.0.1 through HTTP(S)_PROXY; tests talk to local fakes only.
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def short_dir():
    # Unix socket paths are limited to ~108 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="gt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def bot_check(fake: FakeSlack, runner_socket: Path, home: Path, **env: str) -> tuple[int, str]:
    """The real `goaltender bot --check` against the fake Slack and one runner named box: its exit
    code and its output. `env` adds to or overrides its environment (SLACK_BOT_TOKEN=…)."""
    full = {
        **os.environ,
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "GOALTENDER_SLACK_API_URL": fake.api_url,
        "GOALTENDER_HOME": str(home),
        "GOALTENDER_RUNNERS": json.dumps([{"name": "box", "socket": str(runner_socket)}]),
        **env,
    }
    full.pop("GOALTENDER_CONFIG", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "goaltender.cli", "bot", "--check",
        env=full, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode()


async def eventually(predicate, timeout: float = 20.0, interval: float = 0.05):
    """Poll `predicate()` (plain or async) until it is truthy and return that value.

    The one way tests wait for something to happen: on a signal (a row stored, an event recorded,
    a post made), never after a fixed sleep. A hang becomes a TimeoutError naming the predicate."""

    async def check():
        result = predicate()
        return await result if inspect.isawaitable(result) else result

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (result := await check()):
        if loop.time() > deadline:
            raise TimeoutError(
                f"timed out after {timeout}s waiting for {getattr(predicate, '__qualname__', predicate)}"
            )
        await asyncio.sleep(interval)
    return result


async def closing(done, what: str, timeout: float = 60.0) -> None:
    """Await a teardown; a hang becomes a failure that shows where every task is stuck."""
    task = asyncio.ensure_future(done)
    finished, _ = await asyncio.wait({task}, timeout=timeout)
    if finished:
        return task.result()
    for each in asyncio.all_tasks():
        each.print_stack(file=sys.stderr)
    task.cancel()
    raise AssertionError(f"closing the {what} hung for {timeout}s (task stacks on stderr)")


def vouched(name: str, client: str = "test") -> str:
    """How the runner records `name` given by an operator client (this test's user) named `client`."""
    return f"{name} via {client} (uid {os.getuid()})"


def host_pid(sandboxed_pid: int, sandbox: int) -> int | None:
    """The pid, as this test sees it, of the process that is `sandboxed_pid` inside the sandbox led
    by `sandbox` (an agent's pid as the runner records it): the sandbox has a pid namespace."""
    for line_of in _descendants_status(sandbox):
        ns_pids = next((line.split()[1:] for line in line_of[1] if line.startswith("NSpid:")), [])
        if ns_pids and int(ns_pids[-1]) == sandboxed_pid:
            return line_of[0]
    return None


def _descendants_status(leader: int) -> list[tuple[int, list[str]]]:
    found = []
    try:
        children = psutil.Process(leader).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            found.append((child.pid, Path(f"/proc/{child.pid}/status").read_text().splitlines()))
        except OSError:
            continue
    return found


def write_agent(directory: Path, name: str, script: str) -> list[str]:
    """A shell-script agent; returns its command."""
    path = directory / name
    path.write_text("#!/bin/bash\nset -u\n" + script)
    path.chmod(0o755)
    return [str(path)]


@pytest.fixture
async def start_runner(tmp_path, short_dir):
    runners: list[Runner] = []

    async def start(**overrides) -> Runner:
        settings = RunnerSettings(
            **{
                "home": tmp_path / "home",
                "socket": short_dir / "runner.sock",
                "name": "test-runner",
                "stop_grace_s": 1.0,
                "min_free_mb": 64,  # the tests' own disk may be small; test_disk_full sets its own
                **overrides,
            }
        )
        runner = await Runner.start(settings)
        runners.append(runner)
        return runner

    yield start
    for runner in runners:
        await closing(runner.close(), "runner")


@pytest.fixture
async def connect():
    clients: list[RunnerClient] = []

    async def open_client(runner: Runner, name: str = "test") -> RunnerClient:
        client = await RunnerClient.connect_unix(runner.settings.socket_path, client=name)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await client.close()


async def events_until_report(client: RunnerClient, goal_id: int, timeout: float = 60) -> list[Event]:
    """Subscribe to a goal and collect its events until the final report arrives."""
    events: list[Event] = []

    async def collect():
        await client.subscribe(since=0, goal_id=goal_id)
        async for event in client.events():
            events.append(event)
            if isinstance(event.data, FinalReport):
                return

    await asyncio.wait_for(collect(), timeout)
    return events


async def approval_prompts(client: RunnerClient, goal_id: int) -> AsyncIterator[Approval]:
    """The goal's approval prompts as a person watching its thread sees them, oldest first."""
    await client.subscribe(goal_id=goal_id)
    async for event in client.events():
        if isinstance(event.data, ApprovalRequested):
            yield event.data.approval


async def pending_approval(client: RunnerClient, goal_id: int, kind: str | None = None) -> Approval | None:
    """The goal's oldest pending approval (of `kind`), as its status shows it; None when there is
    none (a predicate for `eventually`)."""
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    return next((a for a in status.pending_approvals if kind is None or a.kind == kind), None)


async def submit(client: RunnerClient, text: str, **fields) -> int:
    reply = await client.request(p.SubmitGoal(text=text, **fields))
    return reply.status.goal.id


@pytest.fixture
async def ssh_box(tmp_path):
    boxes: list[SSHBox] = []

    async def start(sockets: set[str], **options) -> SSHBox:
        keydir = tmp_path / f"keys{len(boxes)}"
        keydir.mkdir()
        box = await SSHBox(keydir, sockets, **options).start()
        boxes.append(box)
        return box

    yield start
    for box in boxes:
        await closing(box.stop(), "ssh box")


# ---- the Slack bot against the fake Slack (test_bot.py, test_bot_e2e.py) ----


@pytest.fixture
async def fake():
    async with FakeSlack() as server:
        yield server


@pytest.fixture
async def make_bot(fake, tmp_path):
    """An in-process GoaltenderBot on the fake Slack, linked to one runner: a local socket (named
    "box") or any RunnerTarget (e.g. an SSH box's `box.target(...)`)."""
    bots: list[GoaltenderBot] = []

    async def make(
        runner: Path | RunnerTarget, *, wait_runner: bool = True, start: bool = True, **overrides
    ) -> GoaltenderBot:
        target = runner if isinstance(runner, RunnerTarget) else RunnerTarget(name="box", socket=runner)
        settings = BotSettings(
            **{
                "home": tmp_path / "bot",
                "runners": [target],
                "slack_api_url": fake.api_url,
                "slack_bot_token": fake.bot_token,
                "slack_app_token": fake.app_token,
                "outbox_interval_s": 0.05,
                **overrides,
            }
        )
        bot = await GoaltenderBot.open(settings)
        bots.append(bot)
        if not start:
            return bot  # the test starts it, once it has looked at it
        await bot.start()
        await fake.wait_connected()
        if wait_runner:
            await asyncio.wait_for(bot.pool[target.name].wait_healthy(), 10)
        return bot

    yield make
    for bot in bots:
        await closing(bot.close(), "bot")


def blocks_text(msg) -> str:
    return msg.text + json.dumps(msg.blocks or [])
