"""Runner links that fail in ways SSH cannot see: a runner that stops answering while sshd and its
keepalives are fine, a runner that fails straight after subscribing, an approval reaction given
while the link is down, and a configuration naming two runners alike. A real runner behind the
real asyncssh box (tests/ssh_box.py), the real bot against the fake Slack.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_slack import ALICE
from helpers import eventually, write_agent

from goaltender.bot.links import RunnerLink
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.records import Event, MilestoneReported

LINE_LIMIT = 2 * p.MAX_LINE


class FreezingRelay:
    """A Unix-socket relay between the SSH box and a runner's socket that can freeze: every
    connection stays open but nothing passes either way, as with a wedged runner process whose
    sshd is fine. What is sent while frozen is lost (the wedged runner never reads it)."""

    def __init__(self, runner_socket: Path, path: Path):
        self.runner_socket = runner_socket
        self.path = path
        self.frozen = False
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> FreezingRelay:
        self.server = await asyncio.start_unix_server(self._relay, path=str(self.path), limit=LINE_LIMIT)
        return self

    def freeze(self) -> None:
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        runner_reader, runner_writer = await asyncio.open_unix_connection(
            str(self.runner_socket), limit=LINE_LIMIT
        )
        await asyncio.gather(
            self._pump(reader, runner_writer), self._pump(runner_reader, writer), return_exceptions=True
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if not self.frozen:
                    writer.write(data)
                    await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def relay(short_dir):
    relays: list[FreezingRelay] = []

    async def start(runner) -> FreezingRelay:
        made = await FreezingRelay(runner.settings.socket_path, short_dir / "relay.sock").start()
        relays.append(made)
        return made

    yield start
    for each in relays:
        await each.close()


class Collector:
    """The bot's side of a link: events by seq, and the cursor."""

    def __init__(self):
        self.stored: dict[int, Event] = {}

    async def on_event(self, runner: str, event: Event) -> None:
        self.stored.setdefault(event.seq, event)

    async def load_cursor(self, runner: str) -> int:
        return max(self.stored, default=0)


# ---- a runner that stops answering while SSH stays up ----


async def test_a_request_the_runner_leaves_unanswered_drops_the_link_and_it_comes_back(
    start_runner, ssh_box, relay
):
    runner = await start_runner()
    hub = await relay(runner)
    box = await ssh_box({str(hub.path)})
    # Keepalives every 0.5 s: SSH stays healthy throughout, so only the request's deadline can tell.
    target = box.target(
        remote_socket=str(hub.path),
        keepalive_interval=0.5,
        connect_timeout=2,
        request_timeout=1,
        probe_interval=3600,  # no probe: the request itself must notice
    )
    bot = Collector()
    link = RunnerLink(target, on_event=bot.on_event, load_cursor=bot.load_cursor, backoff_base=0.1)
    running = asyncio.ensure_future(link.run())
    try:
        await asyncio.wait_for(link.wait_healthy(), 10)
        before = await runner.store.append_event(None, MilestoneReported(title="before"))
        await eventually(lambda: before.seq in bot.stored)

        hub.freeze()
        asked_at = time.monotonic()
        with pytest.raises(RunnerUnavailable) as hung:
            await asyncio.wait_for(link.request(p.Status()), 10)  # (a hang fails, not waits)
        assert str(hung.value) == "runner gpu: the runner did not answer a Status request within 1s"
        assert 1 <= time.monotonic() - asked_at < 3
        assert not link.healthy  # at once, not at the next keepalive: health shows it
        assert link.last_error == "the runner did not answer a Status request within 1s"
        with pytest.raises(RunnerUnavailable, match=r"not connected \(last error: the runner did not answer"):
            await link.request(p.Status())

        during = await runner.store.append_event(None, MilestoneReported(title="during"))
        hub.thaw()
        await eventually(lambda: link.connects == 2 and link.healthy, timeout=20)
        await eventually(lambda: during.seq in bot.stored)  # resumed from the cursor
        assert (await link.request(p.Status())).goals == []
    finally:
        link.stop()
        await asyncio.wait_for(running, 10)


async def _bot_through_relay(runner, make_bot, ssh_box, relay, *, probe_interval: float):
    """The relay the test can freeze, and the link of a bot to `runner` over SSH through it (1 s deadlines)."""
    hub = await relay(runner)
    box = await ssh_box({str(hub.path)})
    target = box.target(
        name="box",
        remote_socket=str(hub.path),
        keepalive_interval=0.5,
        connect_timeout=2,
        request_timeout=1,
        probe_interval=probe_interval,
    )
    bot = await make_bot(target)
    return hub, bot.pool["box"]


async def test_an_idle_link_notices_a_hung_runner_and_health_says_so(
    fake, make_bot, start_runner, ssh_box, relay
):
    runner = await start_runner()
    hub, link = await _bot_through_relay(runner, make_bot, ssh_box, relay, probe_interval=0.5)

    hub.freeze()  # nobody asks anything: only the link's own probe can notice
    await eventually(lambda: not link.healthy, timeout=10)
    assert link.last_error == "the runner did not answer a Status request within 1s"
    health = await fake.slash_command("/goal", "health", fake.general, ALICE)
    said = (await health.wait_for_ephemeral(timeout=10)).text
    assert "box down (the runner did not answer a Status request within 1s)" in said

    # A goal meanwhile is queued visibly, and starts once the runner answers again.
    asked = await fake.slash_command(
        "/goal", "count the stars on box, max 1 experiments", fake.general, ALICE
    )
    assert "It is queued (q1)" in (await asked.wait_for_ephemeral(timeout=10)).text
    hub.thaw()
    await eventually(lambda: link.healthy, timeout=20)
    await eventually(lambda: runner.store.get_goal(1), timeout=20)
    await fake.wait_for_message(fake.general, text="Goal #1", timeout=20)


async def test_a_goal_sent_to_a_hung_runner_is_queued_not_left_unanswered(
    fake, make_bot, start_runner, ssh_box, relay, tmp_path
):
    """`/goal` reaches a runner that has stopped answering but whose link still looks up: the
    submission's deadline passes, the link goes down, and the goal is queued (intake's
    RunnerUnavailable), not left with no answer."""
    busy = write_agent(tmp_path, "busy.sh", "sleep 120\n")
    runner = await start_runner(agents={"busy": busy}, default_agent="busy")
    hub, link = await _bot_through_relay(runner, make_bot, ssh_box, relay, probe_interval=3600)

    hub.freeze()
    asked = await fake.slash_command(
        "/goal", "count the stars on box, max 1 experiments", fake.general, ALICE
    )
    answer = (await asked.wait_for_ephemeral(timeout=15)).text
    assert "runner box: the runner did not answer a SubmitGoal request within 1s" in answer
    assert "It is queued (q1)" in answer
    assert not link.healthy

    hub.thaw()
    await eventually(lambda: link.connects == 2 and link.healthy, timeout=20)
    await eventually(lambda: runner.store.get_goal(1), timeout=20)
    assert await runner.store.get_goal(2) is None  # submitted once


# ---- a runner that fails straight after subscribing ----


async def badbatch_runner(path: Path, accepted: list[float]) -> asyncio.Server:
    """Says welcome, answers the subscription, then sends a cut-off events batch (a poison line)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(time.monotonic())
        hello = json.loads(await reader.readline())
        writer.write(p.encode(p.Welcome(id=hello["id"], runner="poisoned")))
        subscribe = json.loads(await reader.readline())
        writer.write(p.encode(p.Subscribed(id=subscribe["id"], head=3)))
        writer.write(b'{"id":null,"type":"events","events":[{"seq":1,"goal_id":null,"data":{"kind":"mi\n')
        await writer.drain()
        await reader.read()  # until the bot hangs up

    return await asyncio.start_unix_server(serve, path=str(path))


async def test_a_runner_that_fails_right_after_subscribing_is_backed_off(ssh_box, short_dir):
    path = short_dir / "poison.sock"
    accepted: list[float] = []
    server = await badbatch_runner(path, accepted)
    box = await ssh_box({str(path)})
    bot = Collector()
    base = 0.05
    link = RunnerLink(
        box.target(remote_socket=str(path)),
        on_event=bot.on_event,
        load_cursor=bot.load_cursor,
        backoff_base=base,
    )
    running = asyncio.ensure_future(link.run())
    try:
        await eventually(lambda: len(accepted) >= 6, timeout=20)
        assert link.connects >= 5 and not bot.stored
        gaps = [later - earlier for earlier, later in itertools.pairwise(accepted)]
        # Each retry waits base * 2**n * (0.5..1): the fifth gap at least 0.4 s. A backoff reset
        # by every subscription would wait 0.025-0.05 s each time: a reconnect storm.
        assert gaps[4] >= base * 2**4 * 0.5, gaps
        assert gaps[4] > gaps[0], gaps
    finally:
        link.stop()
        await asyncio.wait_for(running, 10)
        server.close()


# ---- an approval reaction while the link is down ----

ASKER = 'goaltender ask "Spend 2 GPU-hours?" --timeout 10m && goaltender report "approved"\nsleep 60\n'


async def test_a_reaction_while_the_runner_is_down_is_answered_and_can_be_given_again(
    fake, make_bot, start_runner, ssh_box, tmp_path
):
    runner = await start_runner(agents={"ask": write_agent(tmp_path, "ask.sh", ASKER)}, default_agent="ask")
    socket = str(runner.settings.socket_path)
    box = await ssh_box({socket})
    bot = await make_bot(box.target(name="box", remote_socket=socket, keepalive_interval=1.0))
    link = bot.pool["box"]
    asked = await fake.slash_command("/goal", "spend GPUs wisely, max 1 experiments", fake.general, ALICE)
    await asked.wait_for_ephemeral(timeout=30)
    card = await fake.wait_for_message(fake.general, text="Goal #1", timeout=30)
    prompt = await fake.wait_for_message(
        fake.general, thread_ts=card.ts, text="Spend 2 GPU-hours?", timeout=60
    )
    [pending] = await runner.store.pending_approvals(1)

    await box.stop()  # the SSH box goes away for a while
    await eventually(lambda: not link.healthy, timeout=20)
    await fake.user_reacts(fake.general, prompt.ts, "white_check_mark", user=ALICE)

    def told():
        return next((e for e in fake.ephemerals(ALICE) if "decided nothing" in e.text), None)

    note = await eventually(told, timeout=20)
    assert note.thread_ts == card.ts and note.source == "chat.postEphemeral"
    assert note.text.startswith(f"Your :white_check_mark: on approval #{pending.id} decided nothing. ")
    assert "Runner box is not reachable right now" in note.text
    assert "take your :white_check_mark: off the prompt and add it again" in note.text
    assert (await runner.store.get_approval(pending.id)).state == "pending"

    # Once the runner is back, the same reaction given again decides it.
    await box.start()
    await eventually(lambda: link.healthy, timeout=30)
    await fake.user_unreacts(fake.general, prompt.ts, "white_check_mark", user=ALICE)
    await fake.user_reacts(fake.general, prompt.ts, "white_check_mark", user=ALICE)

    async def decided():
        return (await runner.store.get_approval(pending.id)).state == "approved"

    await eventually(decided, timeout=30)
    assert len([e for e in fake.ephemerals(ALICE) if "decided nothing" in e.text]) == 1


# ---- two runners of one name ----


def test_two_runners_of_one_name_are_a_configuration_error_not_a_traceback(tmp_path, short_dir):
    runners = [
        {"name": "gpu", "socket": str(short_dir / "a.sock")},
        {"name": "gpu", "socket": str(short_dir / "b.sock")},
    ]
    env = {
        **os.environ,
        "GOALTENDER_HOME": str(tmp_path),
        "GOALTENDER_RUNNERS": json.dumps(runners),
        "SLACK_BOT_TOKEN": "xoxb-test",
        "SLACK_APP_TOKEN": "xapp-test",
        "GOALTENDER_SLACK_API_URL": "http://127.0.0.1:9/api/",  # never reached
    }
    env.pop("GOALTENDER_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "goaltender.cli", "bot"], capture_output=True, text=True, timeout=30, env=env
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "goaltender: bad configuration: GOALTENDER_RUNNERS: Value error, two runners are both named 'gpu'"
    ), done.stderr
