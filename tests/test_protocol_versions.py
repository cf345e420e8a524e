"""A bot (or any client) and a runner of different releases: they speak the newest protocol version
both know, or the hello is refused with one line naming what to upgrade, which the bot logs and
shows in Slack as its link's state. A real runner (a process of its own where the bot in this
process claims another release's versions), real sockets, the real bot on the fake Slack.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from fake_slack import ALICE
from helpers import eventually, write_agent
from test_runner_identity import connect_when_up, runner_process

from goaltender.protocol import messages as p
from goaltender.protocol import versions
from goaltender.protocol.client import RunnerClient

UPGRADE_RUNNER = (
    "runner at protocol 1, bot at 2: upgrade the runner "
    "(update goaltender on the runner's box (git pull, then make install, in its checkout), then restart the runner)"
)


async def hello(socket, **fields) -> dict:
    """One hello on a raw connection, and the runner's answer to it."""
    reader, writer = await asyncio.open_unix_connection(str(socket))
    try:
        writer.write(json.dumps({"type": "hello", "id": 1, **fields}).encode() + b"\n")
        return json.loads(await asyncio.wait_for(reader.readline(), 10))
    finally:
        writer.close()


async def test_the_runner_answers_at_the_newest_version_both_speak_or_says_what_to_upgrade(start_runner):
    runner = await start_runner()
    socket = runner.settings.socket_path
    newer = await hello(socket, version=2, client="goaltender-bot")  # a newer bot that dropped 1
    assert newer["code"] == "version_mismatch" and newer["message"] == UPGRADE_RUNNER
    older = await hello(socket, version=0, client="goaltender-bot")
    assert older["message"] == (
        "runner at protocol 1, bot at 0: upgrade the bot (update goaltender where the bot runs "
        "(git pull, then make install, in its checkout), then restart it)"
    )
    cli = await hello(socket, version=0, client="cli:status")
    assert cli["message"].startswith("runner at protocol 1, client at 0: upgrade the client")
    # A newer bot that still speaks 1 is answered at 1.
    welcome = await hello(socket, version=3, oldest=1, client="goaltender-bot")
    assert (welcome["type"], welcome["version"]) == ("welcome", 1)


def test_which_side_to_upgrade():
    assert versions.agreed(3, 2, ours_newest=4, ours_oldest=1) == 3
    assert versions.agreed(5, 5, ours_newest=4, ours_oldest=1) is None
    assert versions.agreed(5, 3, ours_newest=2, ours_oldest=1) is None
    assert "upgrade the runner" in versions.mismatch(4, "goaltender-bot", 5)
    assert "upgrade the bot" in versions.mismatch(4, "goaltender-bot", 2)


@pytest.fixture
def claim(monkeypatch):
    """Make this process's clients (the bot's included) claim another release's versions."""

    def claim(newest: int, oldest: int) -> None:
        monkeypatch.setattr(p, "PROTOCOL_VERSION", newest)
        monkeypatch.setattr(versions, "OLDEST_PROTOCOL_VERSION", oldest)

    return claim


@pytest.fixture
async def runner_socket(tmp_path, short_dir):
    """A runner of this release in a process of its own."""
    agent = write_agent(tmp_path, "idle.sh", "sleep 300\n")
    socket = short_dir / "runner.sock"
    proc = runner_process(tmp_path / "home", socket, agent)
    try:
        client = await connect_when_up(socket)
        await client.close()
        yield socket
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, timeout=60)


async def test_a_bot_of_a_release_the_runner_does_not_speak_says_to_upgrade_the_runner(
    runner_socket, claim, fake, make_bot, caplog
):
    caplog.set_level(logging.WARNING, logger="goaltender.bot.links")
    claim(newest=2, oldest=2)
    bot = await make_bot(runner_socket, wait_runner=False)
    link = bot.pool["box"]
    await eventually(lambda: link.last_error == UPGRADE_RUNNER, timeout=20)
    assert not link.healthy
    # One line in the bot's log...
    assert f"runner box: link down ({UPGRADE_RUNNER}); retrying in" in caplog.text
    # ...and in Slack, where the bot says how its runners are.
    health = await fake.slash_command("/goal", "health", fake.general, ALICE)
    said = (await health.wait_for_ephemeral(timeout=10)).text
    assert f"box down ({UPGRADE_RUNNER})" in said


async def test_a_bot_of_a_newer_release_that_still_speaks_the_runners_version_works(
    runner_socket, claim, make_bot
):
    claim(newest=2, oldest=1)
    bot = await make_bot(runner_socket)
    link = bot.pool["box"]
    assert link.healthy
    status = await link.request(p.Status())
    assert status.goals == []
    client = await RunnerClient.connect_unix(runner_socket, client="test")
    assert client.protocol_version == 1
    await client.close()


async def test_a_runner_from_before_versions_were_negotiated_is_spoken_to_at_its_version(short_dir, claim):
    """A runner of the release before: it knows no `oldest` (refused as any unknown field) and
    speaks exactly one version, refusing others in its own words."""
    claim(newest=2, oldest=1)
    hellos: list[dict] = []

    async def older_runner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            hello = json.loads(line)
            hellos.append(hello)
            reply = {"id": hello["id"], "type": "welcome", "version": 1, "runner": "old"}
            if "oldest" in hello:
                reply = {"id": hello["id"], "type": "error", "code": "bad_request"}
                reply["message"] = "invalid hello: oldest: Extra inputs are not permitted"
            elif hello["version"] != 1:
                reply = {"id": hello["id"], "type": "error", "code": "version_mismatch"}
                reply["message"] = f"runner speaks protocol 1, client sent {hello['version']}"
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()

    server = await asyncio.start_unix_server(older_runner, path=str(short_dir / "old.sock"))
    try:
        client = await RunnerClient.connect_unix(short_dir / "old.sock", client="goaltender-bot")
        assert (client.runner_name, client.protocol_version) == ("old", 1)
        assert [(hello["version"], "oldest" in hello) for hello in hellos] == [(2, True), (1, False)]
        await client.close()
        claim(newest=3, oldest=2)  # a release that no longer speaks 1
        with pytest.raises(p.ProtocolError) as refused:
            await RunnerClient.connect_unix(short_dir / "old.sock", client="goaltender-bot")
        assert refused.value.message.startswith("runner at protocol 1, bot at 3: upgrade the runner")
    finally:
        server.close()
