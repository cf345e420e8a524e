"""The Slack bot end to end over SSH, with the real star-count sweep.

The bot (in process, or as a real `goaltender bot` subprocess) talks to the fake Slack and reaches
the runner only through a real asyncssh server on 127.0.0.1 (tests/ssh_box.py); the runner drives
the real sweep agent, which trains the real CPU model on the star-count task. Faults: SSH links
dropped mid-campaign, the bot SIGKILLed mid-campaign (once right after Slack took a post), a 429
storm, and Slack redelivering events. The thread is checked against the runner's event log: every
event that renders a post appears once, in seq order, keyed by its Slack message metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from daemons import Daemon
from fake_slack import ALICE, BOB, FakeSlack
from helpers import blocks_text, eventually, write_agent
from ssh_box import SSHBox

from goaltender.bot import mrkdwn, render
from goaltender.bot.config import BotSettings
from goaltender.bot.keys import ApprovalKey, CardKey, EventKey, parse
from goaltender.bot.thread import NAMES_A_RUN
from goaltender.environments.star_count import workload
from goaltender.runner.daemon import Runner
from goaltender.storage.records import (
    ApprovalRequested,
    BudgetChanged,
    Event,
    ExperimentFinished,
    ExperimentStarted,
    FinalReport,
    GoalStateChanged,
    MilestoneReported,
    PostsFolded,
    SteerReceived,
)

RUNNER = "box"  # the bot's name for the runner: the prefix of every outbox key
ASK_ABOVE_S = 1.0  # below the baseline's estimate: the sweep asks before its very first run
NEVER_ASK_S = 10_000.0  # no run is that costly: the campaign runs to its stop rule unattended
# Events that always get a thread post (a state change only when people act on it: render decides).
POSTED = (MilestoneReported, ExperimentFinished, SteerReceived, BudgetChanged, FinalReport, PostsFolded)
WRITES = (
    "chat.postMessage",
    "chat.update",
    "chat.postEphemeral",
    "reactions.add",
    "files.completeUploadExternal",
)


def star_goal(experiments: int) -> str:
    return f"Train the star-count model to 98% exact accuracy, max {experiments} experiments"


@pytest.fixture(autouse=True)
def _shared_star_cache(tmp_path_factory, monkeypatch):
    # The workload caches rendered canvases; one cache for the session keeps every campaign quick.
    cache = tmp_path_factory.getbasetemp() / "star-count-cache"
    cache.mkdir(exist_ok=True)
    monkeypatch.setenv("GOALTENDER_CACHE_DIR", str(cache))


@pytest.fixture
async def star_box(start_runner, ssh_box):
    """A runner whose default agent is the real sweep on the star-count task (as `goaltender demo`
    runs it), reachable only through an SSH box. Returns (runner, box, the bot's RunnerTarget)."""

    async def start(approve_above: float):
        sweep = [sys.executable, "-m", "goaltender.agents.sweep", "--approve-above", str(approve_above)]
        runner = await start_runner(agents={"sweep": sweep}, default_agent="sweep", stop_grace_s=3.0)
        socket = str(runner.settings.socket_path)
        box = await ssh_box({socket})
        return runner, box, box.target(name=RUNNER, remote_socket=socket)

    return start


LINE_LIMIT = 64 * 1024 * 1024  # a ledger's reply is one NDJSON line, and may be long


class LedgerTap:
    """The runner's socket as the bot reaches it through the SSH box, relayed line by line. Armed,
    it kills the SSH link (as a crashed sshd would) the moment the bot asks for a goal's ledger
    (a Summary request: the bot draws a plot), so the answer never reaches the bot. With
    `drop_reply` set, it kills the link as a reply it matches comes back from the runner, which
    has done what was asked, unbeknown to the bot."""

    def __init__(self, runner_socket: Path, path: Path, box: SSHBox):
        self.runner_socket = runner_socket
        self.path = path
        self.box = box
        self.armed = asyncio.Event()
        self.drop_reply: Callable[[dict], bool] | None = None
        self.server: asyncio.Server | None = None

    async def start(self) -> LedgerTap:
        self.server = await asyncio.start_unix_server(self._relay, path=str(self.path), limit=LINE_LIMIT)
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _relay(self, bot_reader: asyncio.StreamReader, bot_writer: asyncio.StreamWriter) -> None:
        runner_reader, runner_writer = await asyncio.open_unix_connection(
            str(self.runner_socket), limit=LINE_LIMIT
        )
        await asyncio.gather(
            self._pump(bot_reader, runner_writer, watch=True),
            self._pump(runner_reader, bot_writer, watch=False),
            return_exceptions=True,  # one side gone: the other side's pump ends too
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, watch: bool):
        try:
            while line := await reader.readline():
                if watch and self.armed.is_set() and json.loads(line).get("type") == "summary":
                    self.armed.clear()
                    self.box.drop()
                    return
                if (
                    not watch
                    and self.drop_reply is not None
                    and line.startswith(b'{"id":')
                    and self.drop_reply(json.loads(line))
                ):
                    self.drop_reply = None
                    self.box.drop()
                    return
                writer.write(line)
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def ledger_tap(short_dir):
    """Put a LedgerTap between an SSH box and a runner: `await ledger_tap(runner, box)`."""
    taps: list[LedgerTap] = []

    async def start(runner: Runner, box: SSHBox) -> LedgerTap:
        tap = await LedgerTap(runner.settings.socket_path, short_dir / "tap.sock", box).start()
        box.sockets.add(str(tap.path))
        taps.append(tap)
        return tap

    yield start
    for tap in taps:
        await tap.close()


# ---- the thread against the runner's event log ----


async def goal_events(runner: Runner, goal_id: int) -> list[Event]:
    return await runner.store.events_since(0, limit=100_000, goal_id=goal_id)


async def runner_reached(runner: Runner, goal_id: int, what, timeout: float = 90) -> Event:
    """Wait until the runner's log holds an event of the goal matching `what`; return it."""

    async def find():
        return next((e for e in await goal_events(runner, goal_id) if what(e.data)), None)

    return await eventually(find, timeout)


def expected_keys(events: list[Event], goal_id: int) -> tuple[list[str], set[str]]:
    """The outbox key of every thread post the goal's events call for, in seq order, and those of
    them that may instead be an edit of the row before them (a milestone naming a run, right after
    a row: bot/thread.py adds it to the row unless a plot came between)."""
    keys: list[str] = []
    optional: set[str] = set()
    after_row = False
    for event in events:
        data = event.data
        key = str(EventKey(RUNNER, event.seq, 0))
        if isinstance(data, ApprovalRequested):
            keys.append(str(ApprovalKey(RUNNER, goal_id, data.approval.id)))
            after_row = False
        elif isinstance(data, MilestoneReported) and data.folded:
            continue  # past the goal's rate: its PostsFolded is the post
        elif isinstance(data, POSTED) or (
            isinstance(data, GoalStateChanged) and render.state_changed(goal_id, data) is not None
        ):
            keys.append(key)
            joins = (
                isinstance(data, MilestoneReported)
                and data.curves is None
                and NAMES_A_RUN.search(f"{data.title}\n{data.text or ''}")
            )
            if after_row and joins:
                optional.add(key)
            else:
                after_row = isinstance(data, ExperimentFinished)
    return keys, optional


def posted_as_expected(thread: list[str], events: list[Event], goal_id: int) -> bool:
    """The thread's posts are the expected ones, in order, less some of those that may be edits."""
    keys, optional = expected_keys(events, goal_id)
    return [k for k in keys if k in thread or k not in optional] == thread


def metadata_key(message) -> str | None:
    return ((message.metadata or {}).get("event_payload") or {}).get("key")


def thread_keys(fake: FakeSlack, channel: str, root_ts: str) -> list[str]:
    """The outbox keys of the bot's posts in a thread (rendered runner events only), in order."""
    keys = [metadata_key(m) for m in fake.messages(channel, root_ts)]
    return [k for k in keys if k and isinstance(parse(k), EventKey | ApprovalKey)]


def plot_seqs(fake: FakeSlack, channel: str, root_ts: str, goal_id: int) -> list[int]:
    """The seq of the event each plot in the thread was drawn for (from its file name)."""
    seqs = []
    for message in fake.messages(channel, root_ts):
        for f in message.files:
            if not f["name"].endswith(".png"):
                continue  # the report's ledger file
            seqs.append(int(re.fullmatch(rf"{RUNNER}-goal-{goal_id}-(\d+)\.png", f["name"]).group(1)))
    return seqs


def plots_due(events: list[Event]) -> tuple[set[int], set[int]]:
    """(the seqs that must have a plot, the seqs that may have one): milestones and the report may;
    none must (a plot is uploaded only when it shows a new run or a new best, which the log does
    not say: the ledger does)."""
    may = {
        e.seq
        for e in events
        if isinstance(e.data, FinalReport) or (isinstance(e.data, MilestoneReported) and not e.data.folded)
    }
    return set(), may


async def wait_for_whole_thread(fake: FakeSlack, runner: Runner, channel: str, root_ts: str, goal_id: int):
    """Until the goal has its report, and every post and plot its events call for is in the thread."""
    await runner_reached(runner, goal_id, lambda d: isinstance(d, FinalReport))
    events = await goal_events(runner, goal_id)
    keys, optional = expected_keys(events, goal_id)
    expected = set(keys) - optional
    must_plot, _ = plots_due(events)
    await fake.wait_for(
        lambda: (
            expected <= set(thread_keys(fake, channel, root_ts))
            and must_plot <= set(plot_seqs(fake, channel, root_ts, goal_id))
        ),
        120,
        what="every rendered event",
    )
    return events


def assert_thread_matches_log(fake: FakeSlack, events: list[Event], channel: str, root_ts: str, goal_id: int):
    """Every post once, none missing, in seq order; one card; one plot per milestone/report at most,
    and one for each of them once the ledger had a result."""
    everything = [metadata_key(m) for m in fake.messages(channel)] + [
        metadata_key(m) for m in fake.messages(channel, root_ts)
    ]
    everything = [k for k in everything if k]
    assert len(everything) == len(set(everything)), f"duplicate posts: {everything}"
    assert everything.count(str(CardKey(RUNNER, goal_id))) == 1
    assert posted_as_expected(thread_keys(fake, channel, root_ts), events, goal_id)

    plots = plot_seqs(fake, channel, root_ts, goal_id)
    assert len(plots) == len(set(plots)), f"a plot was uploaded twice: {plots}"
    must_plot, may_plot = plots_due(events)
    assert must_plot <= set(plots) <= may_plot
    for message in fake.messages(channel, root_ts):
        for f in message.files:
            content = fake.files[f["id"]].content
            if f["name"].endswith(".csv"):  # the report's ledger file
                assert content.startswith(b"#,status,metric,value")
            else:
                assert content.startswith(b"\x89PNG\r\n\x1a\n")


def prompt_ready(fake: FakeSlack, channel: str, root_ts: str, prompt) -> bool:
    """The bot knows where this approval prompt landed: the card edit queued after the prompt (the
    outbox records where each post landed before it sends the next write) shows the approval.
    A reaction before that would find no approval behind the message, and be ignored."""
    [approval_id] = {
        el["value"].rpartition(":")[2]
        for b in prompt.blocks
        if b["type"] == "actions"
        for el in b["elements"]
    }
    return f"waiting for approval #{approval_id}" in blocks_text(fake.message(channel, root_ts))


@contextlib.asynccontextmanager
async def approving(fake: FakeSlack, channel: str, root_ts: str, user: str = ALICE):
    """Meanwhile, the owner approves (✅) every approval prompt that shows up in the thread (how
    many the sweep asks for depends on how fast this machine trains)."""

    async def approve_all():
        while True:
            for message in fake.messages(channel, root_ts):
                if (
                    "approve" in message.action_ids()
                    and not message.reacted("white_check_mark", user)
                    and prompt_ready(fake, channel, root_ts, message)
                ):
                    await fake.user_reacts(channel, message.ts, "white_check_mark", user=user)
            await asyncio.sleep(0.1)

    task = asyncio.ensure_future(approve_all())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def open_goal(fake: FakeSlack, text: str, user: str = ALICE):
    """`/goal text` in #general: the ephemeral ack and the status card."""
    res = await fake.slash_command("/goal", text, fake.general, user)
    assert res.acked
    ack = await res.wait_for_ephemeral(timeout=30)
    card = await fake.wait_for_message(fake.general, where=lambda m: metadata_key(m) is not None, timeout=30)
    return res, ack, card


# ---- the tests ----


async def test_star_count_goal_over_ssh(fake, make_bot, star_box, caplog):
    """/goal -> ack, card, thread -> milestones, a plot -> an approval nobody but the owner can
    give -> a reply that steers the agent -> stop -> the final report; the runner only over SSH."""
    assert workload.estimate_cost(workload.BASELINE) > ASK_ABOVE_S  # so the baseline asks first
    runner, box, target = await star_box(ASK_ABOVE_S)
    await make_bot(target)
    general = fake.general

    _, ack, card = await open_goal(fake, star_goal(4))
    assert "goal #1 on box" in ack.text.lower()
    assert metadata_key(card) == str(CardKey(RUNNER, 1)) and card.thread_ts in (None, card.ts)
    assert "star-count model to 98%" in blocks_text(card)
    assert len(box.connections) == 1  # the bot's one link, through the SSH box

    plan = await fake.wait_for_message(general, thread_ts=card.ts, text="Plan: star_count sweep", timeout=60)
    assert "exact_accuracy" in plan.text and "train_size" in blocks_text(plan)
    prompt = await fake.wait_for_message(general, thread_ts=card.ts, text="Approval needed", timeout=60)
    assert prompt.action_ids() == ["approve", "reject"]
    assert "baseline" in blocks_text(prompt) and f"above the {ASK_ABOVE_S:.0f}s threshold" in prompt.text
    [pending] = await runner.store.pending_approvals(1)
    await fake.wait_for(lambda: prompt_ready(fake, general, card.ts, prompt), 15)

    # Bob is neither the owner nor an approver: his ✅ leaves the runner's approval pending.
    caplog.set_level(logging.INFO, logger="goaltender.bot")
    await fake.user_reacts(general, prompt.ts, "white_check_mark", user=BOB)
    await eventually(lambda: f"reaction by {BOB} on approval #{pending.id} ignored" in caplog.text)
    assert (await runner.store.get_approval(pending.id)).state == "pending"
    assert prompt.action_ids() == ["approve", "reject"]

    # Alice's 👍 approves it; the prompt then says who decided, and has no buttons left.
    await fake.user_reacts(general, prompt.ts, "+1", user=ALICE)

    async def decided():
        approval = await runner.store.get_approval(pending.id)
        return approval if approval.state != "pending" else None

    approval = await fake.wait_for(decided, 30)
    assert (approval.state, mrkdwn.slack_user(approval.decided_by)) == ("approved", ALICE)
    await fake.wait_for(lambda: "Approved" in blocks_text(prompt) and not prompt.action_ids(), 15)
    assert "<@U0ALICE>" in blocks_text(prompt)

    # `steer: …` steers: 👀 on it, the runner logs it, and the agent reads it from its inbox and
    # narrows its search.
    steer = await fake.user_replies(general, card.ts, "steer: only tune train_size and iters", user=ALICE)
    await fake.wait_for(lambda: fake.message(general, steer.ts).reacted("eyes", fake.bot_user_id), 30)
    logged = await runner_reached(runner, 1, lambda d: isinstance(d, SteerReceived))
    message = logged.data.message
    assert (message.author, message.text) == ("alice", "only tune train_size and iters")
    applied = await fake.wait_for_message(
        general, thread_ts=card.ts, text="Milestone: Steer from alice", timeout=90
    )
    # The agent's milestone names her by her name, as text: agents ping nobody
    # (the steer's own 👀 and "delivered" note told her).
    assert "Applied: searching only train_size, iters" in blocks_text(applied) and "<@" not in applied.text
    [inbox] = await runner.store.db.fetchall("SELECT author, text, read_at FROM inbox WHERE goal_id = 1")
    assert inbox["author"] == "alice" and inbox["read_at"] is not None  # the agent took it

    # The baseline's ledger row (the runner's own evaluation) and the campaign plot.
    row = await fake.wait_for_message(general, thread_ts=card.ts, text="#1 keep", timeout=60)
    assert (
        "exact_accuracy" in row.text and "baseline" in blocks_text(row) and "reported" not in blocks_text(row)
    )
    plotted = await fake.wait_for(lambda: [m for m in fake.messages(general, card.ts) if m.files], 60)
    assert plotted[0].files[0]["name"].endswith(".png") and "best so far: #1" in plotted[0].text

    # `stop` ends it: 👌, the final report in the thread, the card shows stopped.
    stop = await fake.user_replies(general, card.ts, "stop", user=ALICE)
    report = await fake.wait_for_message(general, thread_ts=card.ts, text="Final report", timeout=60)
    assert f"stopped by <@{ALICE}>" in report.text and "```" not in blocks_text(report)
    # Who stopped it, a mention where the runner says so; the ledger (one line a run) and the
    # agent's words, mentions nowhere in them.
    head, _, ledger = blocks_text(report).partition("*Ledger*")
    assert "slack:" not in head and "<@" not in ledger
    await fake.wait_for(lambda: fake.message(general, stop.ts).reacted("ok_hand", fake.bot_user_id), 15)
    await fake.wait_for(lambda: "stopped" in blocks_text(fake.message(general, card.ts)), 15)
    assert (await runner.store.get_goal(1)).state == "stopped"

    events = await wait_for_whole_thread(fake, runner, general, card.ts, 1)
    assert_thread_matches_log(fake, events, general, card.ts, 1)
    assert not fake.warnings


async def test_ssh_drops_mid_campaign_lose_and_repeat_nothing(fake, make_bot, star_box, ledger_tap):
    """The SSH connection is killed three times (mid-run, while the bot fetches the ledger for a
    plot, and while the runner's backlog streams in) and sshd goes away for a while: afterwards the
    thread has every rendered event exactly once, in order, with its plots."""
    runner, box, _ = await star_box(NEVER_ASK_S)
    tap = await ledger_tap(runner, box)
    bot = await make_bot(box.target(name=RUNNER, remote_socket=str(tap.path)))
    link = bot.pool[RUNNER]
    general = fake.general
    _, _, card = await open_goal(fake, star_goal(2))

    # 1. Killed while the first experiment runs.
    await runner_reached(runner, 1, lambda d: isinstance(d, ExperimentStarted))
    box.drop()
    await eventually(lambda: link.connects == 2 and link.healthy, 30)

    # 2. Killed while the bot fetches the ledger for the plot of the first result's milestone.
    tap.armed.set()  # (the agent reads its ledger on its own socket, not through the box)
    await runner_reached(runner, 1, lambda d: isinstance(d, ExperimentFinished))
    await eventually(lambda: link.connects == 3 and link.healthy and not tap.armed.is_set(), 60)

    # 3. sshd gone while the second run finishes and its milestones are logged; then back.
    await runner_reached(runner, 1, lambda d: isinstance(d, ExperimentStarted) and d.experiment.index == 2)
    await box.stop()
    await eventually(lambda: not link.healthy, 30)
    await runner_reached(runner, 1, lambda d: isinstance(d, ExperimentFinished) and d.experiment.index == 2)
    await box.start()
    # 4. Killed again the moment the link has resubscribed, while the backlog streams in.
    await asyncio.wait_for(link.wait_healthy(), 60)
    box.drop()
    await eventually(lambda: link.connects == 5 and link.healthy, 30)

    events = await wait_for_whole_thread(fake, runner, general, card.ts, 1)
    await eventually(bot.outbox.idle, 60)
    assert_thread_matches_log(fake, events, general, card.ts, 1)
    assert sum(isinstance(e.data, ExperimentFinished) for e in events) == 2
    assert "finished" in blocks_text(fake.message(general, card.ts))


async def test_bot_killed_and_restarted_mid_campaign(fake, star_box, tmp_path, monkeypatch):
    """The bot runs as `goaltender bot`. It is SIGKILLed right after Slack took the approval
    prompt (before it heard back), restarted, and the owner's ✅ on that prompt still decides it;
    killed again mid-campaign and restarted: the thread goes on to the report, nothing twice."""
    runner, _, target = await star_box(ASK_ABOVE_S)
    home = tmp_path / "bot-home"
    env = {
        **os.environ,
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "GOALTENDER_SLACK_API_URL": fake.api_url,
        "GOALTENDER_HOME": str(home),
        "GOALTENDER_RUNNERS": json.dumps([target.model_dump(mode="json")]),
        "GOALTENDER_OUTBOX_INTERVAL_S": "0.05",
    }
    env.pop("GOALTENDER_CONFIG", None)
    bot = Daemon("bot", env, tmp_path)
    general = fake.general

    # The crash window: Slack has stored the approval prompt, the bot dies before it hears back.
    post = fake._methods["chat.postMessage"]

    async def post_then_die(params):
        answer = await post(params)
        if ":approval:" in json.dumps(params.get("metadata") or "") and bot.starts == 1:
            bot.kill()
        return answer

    monkeypatch.setitem(fake._methods, "chat.postMessage", post_then_die)
    try:
        await bot.start()
        await fake.wait_connected(1, timeout=60)
        await bot.wait_linked()
        _, ack, card = await open_goal(fake, star_goal(2))
        assert "goal #1 on box" in ack.text.lower()
        prompt = await fake.wait_for_message(general, thread_ts=card.ts, text="Approval needed", timeout=60)
        await bot.killed()

        await bot.start()
        await fake.wait_connected(2, timeout=60)
        await bot.wait_linked()
        await fake.wait_for(lambda: prompt_ready(fake, general, card.ts, prompt), 60)
        await fake.user_reacts(general, prompt.ts, "white_check_mark", user=ALICE)
        await fake.wait_for(lambda: "Approved" in blocks_text(prompt), 60)
        approval = next(
            e.data.approval for e in await goal_events(runner, 1) if e.data.kind == "approval_decided"
        )
        assert (approval.state, mrkdwn.slack_user(approval.decided_by)) == ("approved", ALICE)

        async with approving(fake, general, card.ts):
            # Killed again wherever the campaign is when the first result is logged.
            await runner_reached(runner, 1, lambda d: isinstance(d, ExperimentFinished))
            bot.kill()
            await bot.killed()
            await bot.start()
            await fake.wait_connected(3, timeout=60)
            events = await wait_for_whole_thread(fake, runner, general, card.ts, 1)
            # The card's last edit follows the report's post: the bot must not be stopped before it.
            await fake.wait_for(
                lambda: "finished" in blocks_text(fake.message(general, card.ts)), 60, what="the final card"
            )
    finally:
        await bot.stop()

    assert_thread_matches_log(fake, events, general, card.ts, 1)
    # The prompt Slack took before the crash was found by its metadata, not posted again.
    key = str(ApprovalKey(RUNNER, 1, approval.id))
    sent = [c for c in fake.calls("chat.postMessage") if key in json.dumps(c.params.get("metadata") or "")]
    assert len(sent) == 1
    lookups = [c for c in fake.calls("conversations.replies") if c.params.get("ts") == card.ts]
    assert lookups and all(c.ok for c in lookups)
    assert "finished" in blocks_text(fake.message(general, card.ts))
    assert bot.starts == 3


async def test_a_429_storm_delays_but_loses_nothing(fake, make_bot, star_box):
    """Slack answers 429 (with Retry-After) to runs of posts, edits and uploads, and enforces its
    one-post-per-second channel limit. Everything still arrives once and in order, the bot never
    writes to the channel faster than once a second, and no retry comes before its Retry-After."""
    interval = BotSettings.model_fields["outbox_interval_s"].default
    assert interval == 1.0
    runner, _, target = await star_box(NEVER_ASK_S)
    fake.limit_channel_rate(1.0)
    fake.rate_limit("chat.postMessage", times=6, retry_after=1)  # six in a row: all on the card
    fake.rate_limit("chat.update", times=2, retry_after=2)
    fake.rate_limit("files.getUploadURLExternal", times=2, retry_after=1)
    bot = await make_bot(target, outbox_interval_s=interval)
    general = fake.general
    _, _, card = await open_goal(fake, star_goal(2))

    events = await wait_for_whole_thread(fake, runner, general, card.ts, 1)
    await eventually(bot.outbox.idle, 120)
    assert_thread_matches_log(fake, events, general, card.ts, 1)
    assert "finished" in blocks_text(fake.message(general, card.ts))

    calls = fake.calls()
    limited = [c for c in calls if c.status == 429]
    assert len(limited) >= 10  # the storm happened
    assert all(c.ok or c.status == 429 for c in calls if c.method in WRITES)

    # At most one write a second to the channel (429s included: they are attempts too).
    writes = [
        c
        for c in calls
        if c.method in WRITES and c.params.get("channel", c.params.get("channel_id")) == general
    ]
    gaps = [b.time - a.time for a, b in itertools.pairwise(writes)]
    assert min(gaps) >= interval - 0.2, sorted(gaps)[:5]

    # After a 429, nothing for that channel (or, for an upload, that method) until Retry-After.
    for c in limited:
        retry_after = float(c.headers["Retry-After"])
        channel = c.params.get("channel", c.params.get("channel_id"))
        later = [
            d
            for d in calls
            if d.time > c.time
            and (d.method in WRITES or d.method.startswith(("files.", "conversations.")))
            and (
                d.method == c.method
                if channel is None
                else d.params.get("channel", d.params.get("channel_id")) == channel
            )
        ]
        assert later, f"{c.method} was never retried"
        assert later[0].time - c.time >= retry_after - 0.05


async def test_redelivered_slack_events_act_once(fake, make_bot, star_box):
    """Slack delivers a /goal, an @mention and a thread reply twice: one goal each, one ack, one
    card, one steer in the runner's inbox."""
    runner, _, target = await star_box(NEVER_ASK_S)
    bot = await make_bot(target)
    general = fake.general

    res, _, card = await open_goal(fake, star_goal(2))
    again = await fake.redeliver(res.envelope)
    await again.wait_acked()

    mention = await fake.user_mentions_bot(general, star_goal(3), user=BOB)
    await fake.wait_for(lambda: len(mention.envelopes) == 2 and all(e.acked for e in mention.envelopes), 15)
    second = await fake.wait_for_message(
        general, where=lambda m: metadata_key(m) == str(CardKey(RUNNER, 2)), timeout=30
    )
    for envelope in list(mention.envelopes):
        await (await fake.redeliver(envelope)).wait_acked()

    steer = await fake.user_mentions_bot(general, "freeze resolution", user=ALICE, thread_ts=card.ts)
    await fake.wait_for(lambda: fake.message(general, steer.ts).reacted("eyes", fake.bot_user_id), 30)
    await (await fake.redeliver(steer.envelopes[0])).wait_acked()

    # Both goals are stopped; by their final reports every redelivery has long been handled.
    for goal_card in (card, second):
        await fake.user_replies(general, goal_card.ts, "stop", user=ALICE if goal_card is card else BOB)
    for goal_id in (1, 2):
        await runner_reached(runner, goal_id, lambda d: isinstance(d, FinalReport))
    await eventually(bot.outbox.idle, 60)

    goals = await runner.store.list_goals()
    assert [(g.id, g.owner) for g in goals] == [(1, "alice"), (2, "bob")]  # by name (users.info)
    cards = [m for m in fake.messages(general) if m.bot_id and metadata_key(m)]
    assert [metadata_key(m) for m in cards] == [str(CardKey(RUNNER, 1)), str(CardKey(RUNNER, 2))]
    acks = defaultdict(list)
    for e in fake.ephemerals():
        acks[e.user].append(e.text)
    assert len(acks[ALICE]) == 1 and "goal #1" in acks[ALICE][0].lower()
    assert len(acks[BOB]) == 1 and "goal #2" in acks[BOB][0].lower()
    steers = [e.data.message for e in await goal_events(runner, 1) if isinstance(e.data, SteerReceived)]
    assert [(mrkdwn.slack_user(m.author), m.text) for m in steers] == [(ALICE, "freeze resolution")]
    inbox = await runner.store.db.fetchall("SELECT text FROM inbox")
    assert [row["text"] for row in inbox] == ["freeze resolution"]
    eyes = [c for c in fake.calls("reactions.add") if c.params.get("timestamp") == steer.ts]
    assert len(eyes) == 1
    for goal_id, goal_card in ((1, card), (2, second)):
        events = await wait_for_whole_thread(fake, runner, general, goal_card.ts, goal_id)
        assert_thread_matches_log(fake, events, general, goal_card.ts, goal_id)


async def test_a_goal_whose_reply_the_link_lost_starts_once(
    fake, make_bot, start_runner, ssh_box, ledger_tap, tmp_path
):
    """The runner took the goal, and the SSH link dropped before its reply reached the bot, which
    queued it ("nothing is lost") and submitted it again once the link was back: two goals ran,
    one with no thread in Slack that nobody could see or stop. The same submission, sent again
    under its key, gets the goal the first try made."""
    runner = await start_runner(
        agents={"busy": write_agent(tmp_path, "busy.sh", "sleep 120\n")}, default_agent="busy"
    )
    box = await ssh_box(set())
    tap = await ledger_tap(runner, box)
    tap.drop_reply = lambda reply: reply.get("type") == "goal"
    await make_bot(box.target(name="box", remote_socket=str(tap.path), keepalive_interval=1.0))
    answered = await fake.slash_command("/goal", "count the stars, max 1 experiments", fake.general, ALICE)
    assert "It is queued (q1)" in (await answered.wait_for_ephemeral(timeout=30)).text
    card = await fake.wait_for_message(fake.general, text="Goal #1", timeout=30)
    assert "count the stars" in blocks_text(card)
    assert [goal.id for goal in await runner.store.list_goals()] == [1]
