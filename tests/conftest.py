"""Shared fixtures: a real runner on a real Unix socket, with real SQLite and real subprocesses."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from fake_slack import FakeSlack
from helpers import BIN, closing
from ssh_box import SSHBox

from goaltender.bot.app import GoaltenderBot
from goaltender.bot.config import BotSettings
from goaltender.bot.transports import RunnerTarget
from goaltender.protocol.client import RunnerClient
from goaltender.runner.config import RunnerSettings
from goaltender.runner.daemon import Runner

pytest_plugins = ["fake_openai"]  # its model_server fixture: a fake OpenAI-compatible endpoint


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
