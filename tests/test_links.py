"""Runner links end to end: a real runner, a real asyncssh server on 127.0.0.1 (tests/ssh_box.py),
real keys."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import asyncssh
import pytest
from helpers import events_until_report, eventually, submit, write_agent

from goaltender.bot.links import NoRunnerAvailable, RunnerLink, RunnerPool, UnknownRunner
from goaltender.bot.transports import HostKeyRejected, RunnerTarget, open_client
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.records import Event, FinalReport, MilestoneReported


class BlackHoleProxy:
    """A TCP relay that can swallow everything on its current connections without closing them:
    what a dead NAT entry or an unplugged cable looks like from both ends."""

    def __init__(self, port: int):
        self.port = port
        self.holed: set[asyncio.StreamWriter] = set()
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    def blackhole(self) -> None:
        self.holed |= self.writers

    async def _relay(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers |= {client_writer, server_writer}

        async def copy(reader, writer) -> None:
            with contextlib.suppress(Exception):
                while data := await reader.read(65536):
                    if writer not in self.holed:
                        writer.write(data)
                        await writer.drain()
            writer.close()

        await asyncio.gather(copy(client_reader, server_writer), copy(server_reader, client_writer))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()


class Collector:
    """The bot's side of a link: stores events by (runner, seq) and keeps the cursor, like bot.db."""

    def __init__(self):
        self.delivered: list[tuple[str, int]] = []  # every callback call, duplicates included
        self.stored: dict[tuple[str, int], Event] = {}
        self.cursors: dict[str, int] = {}

    async def on_event(self, runner: str, event: Event) -> None:
        self.delivered.append((runner, event.seq))
        self.stored.setdefault((runner, event.seq), event)
        self.cursors[runner] = max(self.cursors.get(runner, 0), event.seq)

    async def load_cursor(self, runner: str) -> int:
        return self.cursors.get(runner, 0)

    def seqs(self, runner: str) -> list[int]:
        return [seq for name, seq in self.delivered if name == runner]


def has_report(collector: Collector) -> bool:
    return any(isinstance(event.data, FinalReport) for event in collector.stored.values())


def milestone_agent(directory: Path, count: int, pause: float = 0.03) -> list[str]:
    """An agent that reports `count` milestones in quick succession, then its report."""
    return write_agent(
        directory,
        "milestones.sh",
        f"""exec python - <<'PY'
import asyncio, os
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, socket_from_env

async def main():
    goal = int(os.environ["GOALTENDER_GOAL_ID"])
    async with await RunnerClient.connect_unix(socket_from_env(), client="agent") as runner:
        for i in range(1, {count} + 1):
            await runner.request(p.ReportMilestone(goal_id=goal, title=f"step {{i}}", text="x" * 200))
            await asyncio.sleep({pause})
        await runner.request(p.SubmitReport(goal_id=goal, text="all steps reported"))

asyncio.run(main())
PY
""",
    )


SHORT_AGENT = """
goaltender milestone "Plan" "one quick experiment"
goaltender experiment -d "baseline" --metric acc -- python -c 'print("acc: 0.5")'
goaltender report "done"
"""


async def runner_events(runner) -> list[Event]:
    return await runner.store.events_since(0, limit=100_000)


# ---- the tests ----


async def test_streamlocal_round_trip(start_runner, ssh_box, tmp_path):
    """Status, a goal's whole event stream, and a clean close, through a direct-streamlocal channel."""
    runner = await start_runner(agents={"script": write_agent(tmp_path, "agent.sh", SHORT_AGENT)})
    box = await ssh_box({str(runner.settings.socket_path)})
    client = await open_client(box.target(remote_socket=str(runner.settings.socket_path)), "bot")
    assert client.runner_name == "test-runner"
    assert (await client.request(p.Status())).goals == []

    goal_id = await submit(client, "try a baseline, max 1 experiments", agent="script")
    events = await events_until_report(client, goal_id)
    kinds = [event.data.kind for event in events]
    assert kinds[0] == "goal_accepted" and kinds[-1] == "report"
    assert {"milestone", "experiment_started", "experiment_finished"} <= set(kinds)
    assert [e.seq for e in events] == [e.seq for e in await runner_events(runner) if e.goal_id == goal_id]
    status = await client.request(p.Status(goal_id=goal_id))
    assert status.goals[0].goal.state == "finished"

    assert len(box.connections) == 1
    await client.close()  # closing the client closes the SSH connection under it
    await eventually(lambda: not box.connections, timeout=5)


@pytest.mark.parametrize("bridge", ["subprocess", "in-process"])
async def test_attach_round_trip(start_runner, ssh_box, tmp_path, bridge):
    """The stdio bridge (`goaltender runner attach`) carries the same protocol, and says clearly
    when the runner it should bridge to is not there."""
    runner = await start_runner(agents={"script": write_agent(tmp_path, "agent.sh", SHORT_AGENT)})
    box = await ssh_box(set(), attach_in_process=bridge == "in-process")  # no streamlocal at all
    socket = str(runner.settings.socket_path)

    with pytest.raises(RunnerUnavailable, match="would not open"):
        await open_client(box.target(remote_socket=socket), "bot")

    client = await open_client(box.target(remote_socket=socket, mode="attach"), "bot")
    assert (await client.request(p.Status())).goals == []
    goal_id = await submit(client, "try a baseline, max 1 experiments", agent="script")
    events = await events_until_report(client, goal_id)
    assert [e.data.kind for e in events][-1] == "report"
    assert [e.seq for e in events] == [e.seq for e in await runner_events(runner) if e.goal_id == goal_id]
    await client.close()
    await eventually(lambda: not box.connections, timeout=5)

    if bridge == "subprocess":
        missing = box.target(name="gpu2", remote_socket=socket + ".missing", mode="attach")
        with pytest.raises(RunnerUnavailable) as refused:
            await open_client(missing, "bot")
        message = str(refused.value)
        assert message.startswith("runner gpu2: `goaltender runner attach --socket ")
        assert "exited with status 4" in message and "no runner is listening on" in message


LONG_LOG_AGENT = """
goaltender experiment -d "a long log" --metric acc -- python -c '
for i in range(60000):
    print(f"step {i} lossé {i / 7:.6f} ✓ grad_norm=0.5")
print("acc: 0.5")'
goaltender report "done"
"""


@pytest.mark.parametrize("mode", ["streamlocal", "attach"])
async def test_a_raw_log_fetch_over_ssh_returns_the_log(start_runner, ssh_box, tmp_path, mode):
    """`goaltender log`'s fetch (raw chunks: bytes after their reply lines) through either SSH
    link, over a window far smaller than a chunk, gives the run's log byte for byte."""
    runner = await start_runner(agents={"script": write_agent(tmp_path, "agent.sh", LONG_LOG_AGENT)})
    socket = str(runner.settings.socket_path)
    box = await ssh_box({socket} if mode == "streamlocal" else set())
    client = await open_client(box.target(remote_socket=socket, mode=mode, window=64 * 1024), "bot")
    goal_id = await submit(client, "log a lot, max 1 experiments", agent="script")
    await events_until_report(client, goal_id)
    [experiment] = await runner.store.experiments(goal_id)
    expected = Path(experiment.log_path).read_bytes()
    assert len(expected) > 2 * 1024 * 1024 and "✓".encode() in expected

    replies = [reply async for reply in client.fetch_log(experiment.id)]
    assert all(reply.raw_bytes is not None for reply in replies) and len(replies) > 1
    assert b"".join(reply.data for reply in replies) == expected
    await client.close()


async def test_host_key_pinning(start_runner, ssh_box, tmp_path):
    """Only the pinned host key is accepted, in any of its spellings; anything else is refused
    with a message that says so. ~/.ssh/config and ssh-agent play no part."""
    runner = await start_runner()
    socket = str(runner.settings.socket_path)
    box = await ssh_box({socket})

    # The pin as a bare key line, as a `[host]:port` known_hosts line, and as a known_hosts file.
    known_hosts_file = tmp_path / "known_hosts"
    known_hosts_file.write_text(f"[127.0.0.1]:{box.port} {box.pinned}\n")
    for pin in (box.pinned, f"[127.0.0.1]:{box.port} {box.pinned}", str(known_hosts_file)):
        client = await open_client(box.target(remote_socket=socket, known_hosts=pin), "bot")
        assert client.runner_name == "test-runner"
        await client.close()

    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    with pytest.raises(HostKeyRejected, match="does not match the pinned key") as rejected:
        await open_client(box.target(remote_socket=socket, known_hosts=impostor), "bot")
    assert f"127.0.0.1:{box.port}" in str(rejected.value)
    # The right key pinned for another port does not count either.
    with pytest.raises(HostKeyRejected):
        await open_client(box.target(remote_socket=socket, known_hosts=f"[127.0.0.1]:1 {box.pinned}"), "bot")

    stranger = tmp_path / "stranger_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    with pytest.raises(RunnerUnavailable, match="refused the login as bot"):
        await open_client(box.target(remote_socket=socket, client_key=stranger), "bot")

    with pytest.raises(ValueError, match="is not a key"):
        box.target(remote_socket=socket, known_hosts="ssh-ed25519 not-base64!")
    with pytest.raises(ValueError, match="also needs: remote_socket"):
        RunnerTarget(name="x", host="h", username="u", client_key=stranger, known_hosts=box.pinned)


async def test_an_event_longer_than_the_ssh_window_arrives_whole(start_runner, ssh_box):
    """asyncssh's readline returns part of a line that outgrows the channel window; the link's
    reader keeps reading, so a ~900 KiB event arrives whole over a 64 KiB window."""
    runner = await start_runner()
    socket = str(runner.settings.socket_path)
    box = await ssh_box({socket})
    text = "0123456789abcdef" * (900 * 1024 // 16)
    big = await runner.store.append_event(None, MilestoneReported(title="big", text=text))
    after = await runner.store.append_event(None, MilestoneReported(title="after"))
    window = 64 * 1024

    # The gotcha, shown with asyncssh alone: the same line through the same window comes back cut.
    async with asyncssh.connect(
        "127.0.0.1",
        box.port,
        username="bot",
        client_keys=[str(box.client_key_path)],
        known_hosts=None,
        config=None,
        agent_path=None,
    ) as conn:
        reader, writer = await conn.open_unix_connection(socket, window=window)
        writer.write(p.encode(p.Hello(id=1, version=p.PROTOCOL_VERSION, client="raw")))
        writer.write(p.encode(p.Subscribe(id=2, since=0)))
        assert b'"welcome"' in await reader.readline()
        assert b'"subscribed"' in await reader.readline()
        cut = await reader.readline()
        assert not cut.endswith(b"\n") and len(cut) < len(text)

    client = await open_client(box.target(remote_socket=socket, window=window), "bot")
    await client.subscribe(since=0)
    events = client.events()
    first = await anext(events)
    assert (first.seq, first.data.title, first.data.text) == (big.seq, "big", text)
    assert (await anext(events)).seq == after.seq
    await client.close()


async def test_link_survives_ssh_drops_mid_campaign(start_runner, ssh_box, tmp_path):
    """While an agent keeps reporting milestones, the SSH connection is killed and then the SSH
    server itself goes away and comes back. The link reconnects each time, resumes from the
    stored cursor, and the bot ends up with every event exactly once, in order, with no gap."""
    runner = await start_runner(agents={"steps": milestone_agent(tmp_path, count=60)})
    socket = str(runner.settings.socket_path)
    box = await ssh_box({socket})
    bot = Collector()
    link = RunnerLink(
        box.target(remote_socket=socket, keepalive_interval=1.0),
        on_event=bot.on_event,
        load_cursor=bot.load_cursor,
        client_name="bot",
    )
    running = asyncio.ensure_future(link.run())
    try:
        await asyncio.wait_for(link.wait_healthy(), 10)
        await link.request(p.SubmitGoal(text="report 60 steps", agent="steps"))
        await eventually(lambda: len(bot.stored) >= 10, timeout=30)

        # 1. sshd kills the connection.
        dropped_at = time.monotonic()
        box.drop()
        await eventually(lambda: link.connects == 2)
        reconnect_s = time.monotonic() - dropped_at
        assert any(why in (link.last_error or "") for why in ("SSH link lost", "closed", "lost the runner"))

        # 2. The SSH server goes away for a while (connections refused), then comes back.
        await eventually(lambda: len(bot.stored) >= 25, timeout=30)
        await box.stop()
        await eventually(lambda: not link.healthy)
        with pytest.raises(RunnerUnavailable, match="runner gpu is not connected"):
            await link.request(p.Status())
        await eventually(lambda: "cannot reach 127.0.0.1" in (link.last_error or ""), timeout=10)
        restarted_at = time.monotonic()
        await box.start()
        await eventually(lambda: link.connects == 3, timeout=15)
        back_s = time.monotonic() - restarted_at

        await eventually(lambda: has_report(bot), timeout=60)
        expected = [event.seq for event in await runner_events(runner)]
        await eventually(lambda: bot.cursors.get("gpu") == expected[-1], timeout=30)
        delivered = bot.seqs("gpu")
        assert delivered == expected  # every event, once, in order, no gap
        assert expected == list(range(1, len(expected) + 1))
        titles = [e.data.title for e in bot.stored.values() if isinstance(e.data, MilestoneReported)]
        assert [t for t in titles if t.startswith("step ")] == [f"step {i}" for i in range(1, 61)]
        # The runner heard the acks: its cursor for this client reached the last seq.
        await eventually(lambda: link.healthy)

        async def acked_to_the_end() -> bool:
            return await runner.store.cursor("bot") == expected[-1]

        await eventually(acked_to_the_end, timeout=10)
        print(
            f"\nreconnect after a server-side drop: {reconnect_s:.2f}s; after sshd came back: {back_s:.2f}s"
        )
        assert reconnect_s < 5
    finally:
        link.stop()
        await asyncio.wait_for(running, 10)
    assert not link.healthy and link.connected_since is None


async def test_keepalive_detects_a_black_holed_link(start_runner, ssh_box):
    """Nothing closes, nothing arrives: only keepalives notice. With interval 0.5 s and
    count_max 2 the link is declared dead after ~1.5 s, reconnects, and resumes from its cursor."""
    runner = await start_runner()
    socket = str(runner.settings.socket_path)
    box = await ssh_box({socket})
    proxy = BlackHoleProxy(box.port)
    proxy_port = await proxy.start()
    bot = Collector()
    target = box.target(remote_socket=socket, keepalive_interval=0.5, keepalive_count_max=2)
    target = target.model_copy(update={"port": proxy_port})
    link = RunnerLink(target, on_event=bot.on_event, load_cursor=bot.load_cursor, client_name="bot")
    running = asyncio.ensure_future(link.run())
    try:
        await asyncio.wait_for(link.wait_healthy(), 10)
        first = await runner.store.append_event(None, MilestoneReported(title="before"))
        await eventually(lambda: bot.cursors.get("gpu") == first.seq, timeout=30)

        holed_at = time.monotonic()
        proxy.blackhole()
        lost = await runner.store.append_event(None, MilestoneReported(title="during"))
        await eventually(lambda: not link.healthy, timeout=10)
        detected_s = time.monotonic() - holed_at
        assert "keepalive" in (link.last_error or "")
        await eventually(lambda: link.connects == 2, timeout=10)
        reconnected_s = time.monotonic() - holed_at
        await eventually(lambda: bot.cursors.get("gpu") == lost.seq, timeout=30)
        assert bot.seqs("gpu") == [first.seq, lost.seq]
        print(f"\nblack hole detected after {detected_s:.2f}s, link back after {reconnected_s:.2f}s")
        assert 1.0 <= detected_s < 4.0
    finally:
        link.stop()
        await asyncio.wait_for(running, 10)
        await proxy.close()


async def test_pool_picks_by_name_by_load_and_says_when_none_is_up(
    start_runner, ssh_box, tmp_path, short_dir
):
    busy_agent = write_agent(tmp_path, "busy.sh", "sleep 60\n")
    alpha = await start_runner(
        name="alpha", home=tmp_path / "alpha", socket=short_dir / "a.sock", agents={"busy": busy_agent}
    )
    beta = await start_runner(name="beta", home=tmp_path / "beta", socket=short_dir / "b.sock")
    box = await ssh_box({str(beta.settings.socket_path)})
    bot = Collector()
    pool = RunnerPool(
        [
            RunnerTarget(name="alpha", socket=alpha.settings.socket_path),
            box.target("beta", remote_socket=str(beta.settings.socket_path)),
        ],
        on_event=bot.on_event,
        load_cursor=bot.load_cursor,
        client_name="bot",
    )
    running = asyncio.ensure_future(pool.run())
    try:
        for link in pool:
            await asyncio.wait_for(link.wait_healthy(), 10)
        submitted = await pool["alpha"].request(p.SubmitGoal(text="keep busy", agent="busy"))
        await eventually(lambda: ("alpha", 1) in bot.stored, timeout=30)

        assert (await pool.pick("alpha")).name == "alpha"  # by name
        assert (await pool.pick()).name == "beta"  # alpha has an active goal, beta none
        # The pick counts the goal about to land on beta: the next goal goes to alpha (tie, by name).
        assert (await pool.pick()).name == "alpha"
        with pytest.raises(UnknownRunner, match="no runner called 'gamma'; configured: alpha, beta"):
            await pool.pick("gamma")
        # Links carry requests too: stop the busy goal through its link.
        goal_id = submitted.status.goal.id
        stopped = await pool["alpha"].request(p.Stop(goal_id=goal_id, by="test"))
        assert "stopped by test" in stopped.message
        await eventually(
            lambda: any(
                isinstance(e.data, FinalReport) for (name, _), e in bot.stored.items() if name == "alpha"
            ),
            timeout=30,
        )
    finally:
        pool.stop()
        await asyncio.wait_for(running, 10)

    # Nothing reachable: the error names each runner and why.
    down = RunnerPool(
        [
            RunnerTarget(name="alpha", socket=short_dir / "gone.sock"),
            box.target("beta", remote_socket=str(beta.settings.socket_path)).model_copy(update={"port": 1}),
        ],
        on_event=bot.on_event,
        load_cursor=bot.load_cursor,
    )
    running = asyncio.ensure_future(down.run())
    try:
        await eventually(lambda: all(link.last_error for link in down))
        with pytest.raises(NoRunnerAvailable) as none_up:
            await down.pick()
        message = str(none_up.value)
        assert message.startswith("no runner is available right now: alpha (")
        assert "gone.sock" in message and "beta (cannot reach 127.0.0.1:1" in message
        with pytest.raises(RunnerUnavailable, match="runner alpha is not connected"):
            await (await down.pick("alpha")).request(p.Status())
    finally:
        down.stop()
        await asyncio.wait_for(running, 10)
