"""Never silent, never stuck: `goaltender bot` (a real subprocess) against a fake Slack that
misbehaves, linked to a real runner whose agent reports one step at a time when told.

Each fault (a 503 with a text body, a dropped connection, a 429, Slack's ok:false errors, a failed
upload, an answer lost after Slack acted) hits one write; that write still arrives once, the
thread's later writes follow in order, and the log says what happened. A write that keeps failing
is parked with a note in its thread. A refused token stops the bot with a message naming its
variable. `/goal` where the bot is not a member starts nothing. Health: `/goal health` and
`check()` (what `goaltender bot --check` runs).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from daemons import Daemon
from fake_slack import ALICE, FakeSlack
from helpers import blocks_text, bot_check, eventually, write_agent

from goaltender.bot.config import BotSettings
from goaltender.bot.health import check
from goaltender.bot.outbox import Outbox
from goaltender.protocol import messages as p
from goaltender.runner.daemon import Runner
from goaltender.storage.bot_store import BotStore

MAX_ATTEMPTS = 4
# Per gate file the test makes, one milestone; an experiment before each, so each milestone brings
# a plot (a plot is uploaded only when it shows a run the last one did not).
GATED_AGENT = """
goaltender experiment -d base --metric acc -- python -c 'print("acc: 0.5")'
while [ ! -e "$GOALTENDER_WORKSPACE/go-first" ]; do sleep 0.1; done
goaltender milestone "Step first" "words of the first step"
goaltender experiment -d again --metric acc -- python -c 'print("acc: 0.5")'
while [ ! -e "$GOALTENDER_WORKSPACE/go-second" ]; do sleep 0.1; done
goaltender milestone "Step second" "words of the second step"
sleep 60
"""


def bot_env(fake: FakeSlack, home: Path, socket: Path, **settings: str) -> dict[str, str]:
    env = {
        **os.environ,
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "GOALTENDER_SLACK_API_URL": fake.api_url,
        "GOALTENDER_HOME": str(home),
        "GOALTENDER_RUNNERS": json.dumps([{"name": "box", "socket": str(socket)}]),
        "GOALTENDER_OUTBOX_INTERVAL_S": "0.05",
        "GOALTENDER_OUTBOX_BACKOFF_S": "0.05",
        "GOALTENDER_OUTBOX_BACKOFF_CAP_S": "0.5",
        "GOALTENDER_OUTBOX_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        **settings,
    }
    env.pop("GOALTENDER_CONFIG", None)
    return env


@pytest.fixture
async def gated(start_runner, tmp_path):
    agent = write_agent(tmp_path, "gated.sh", GATED_AGENT)
    return await start_runner(agents={"gated": agent}, default_agent="gated")


@pytest.fixture
async def start_bot(fake, gated, tmp_path):
    """Start `goaltender bot` linked to the gated runner; wait until Slack and the runner are up."""
    bots: list[Daemon] = []

    async def start(**settings: str) -> Daemon:
        env = bot_env(fake, tmp_path / "bot-home", gated.settings.socket_path, **settings)
        logs = tmp_path / f"bot-{len(bots)}"
        logs.mkdir()
        bot = Daemon("bot", env, logs)
        bots.append(bot)
        await bot.start()
        await fake.wait_connected(len(bots), timeout=60)
        await bot.wait_linked()
        return bot

    yield start
    for bot in bots:
        await bot.stop()


class Goal:
    """Goal #1 in #general: its card, and its thread as the fake shows it."""

    def __init__(self, fake: FakeSlack, runner: Runner, card_ts: str):
        self.fake = fake
        self.runner = runner
        self.card_ts = card_ts

    @classmethod
    async def open(cls, fake: FakeSlack, runner: Runner) -> Goal:
        """`/goal`, then wait for its experiment's row: the agent then waits for its first gate."""
        res = await fake.slash_command("/goal", "find a good lr, max 3 experiments", fake.general, ALICE)
        assert "goal #1 on box" in (await res.wait_for_ephemeral(timeout=30)).text.lower()
        card = await fake.wait_for_message(fake.general, text="Goal #1", timeout=30)
        await fake.wait_for_message(fake.general, thread_ts=card.ts, text="#1 keep", timeout=60)
        return cls(fake, runner, card.ts)

    def step(self, name: str) -> None:
        """Let the agent report its milestone `name`."""
        (self.runner.settings.workspaces / "goal-1" / f"go-{name}").touch()

    async def milestone(self, name: str, timeout: float = 30):
        return await self.fake.wait_for_message(
            self.fake.general, thread_ts=self.card_ts, text=f"Step {name}", timeout=timeout
        )

    async def plots(self, count: int, timeout: float = 30) -> list:
        def shared():
            found = [m for m in self.replies() if m.files]
            return found if len(found) >= count else None

        return await self.fake.wait_for(shared, timeout, what=f"{count} plot(s) in the thread")

    def replies(self) -> list:
        return self.fake.messages(self.fake.general, self.card_ts)

    def keys(self) -> list[str]:
        return [m.metadata["event_payload"]["key"] for m in self.replies() if m.metadata]

    def texts(self) -> list[str]:
        return [blocks_text(m) for m in self.replies()]


def key_of(message) -> str:
    return message.metadata["event_payload"]["key"]


async def both_steps_arrive_once(goal: Goal) -> None:
    """The thread gets both milestones and both plots, in order, each once."""
    first = await goal.milestone("first")
    goal.step("second")
    second = await goal.milestone("second")
    await goal.plots(2)
    replies = goal.replies()
    order = [m.ts for m in replies if m in (first, second) or m.files]
    assert order.index(first.ts) < order.index(second.ts)
    assert len(goal.keys()) == len(set(goal.keys())), goal.keys()  # nothing twice
    assert sum("Step first" in t for t in goal.texts()) == 1
    assert sum("Step second" in t for t in goal.texts()) == 1
    assert len([m for m in replies if m.files]) == 2
    assert len([f for f in goal.fake.files.values() if f.completed]) == 2


def milestone_posts(fake: FakeSlack, name: str) -> list:
    return [c for c in fake.calls("chat.postMessage") if f"Step {name}" in json.dumps(c.params)]


# ---- one fault on one write: it still arrives once, the later writes follow, the log says so ----

# fault -> (inject it on the next `times` posts, `times`, what the log line about it holds)
FAULTS: dict[str, tuple[Callable[[FakeSlack, int], object], int, tuple[str, ...]]] = {
    "503 with a text body": (
        lambda fake, n: fake.fail_text("chat.postMessage", "upstream connect error", status=503, times=n),
        2,
        ("failed (try 2 of 4): HTTP 503: upstream connect error",),
    ),
    "dropped connection": (
        lambda fake, n: fake.drop_connection("chat.postMessage", times=n),
        2,
        ("failed (try 2 of 4): ServerDisconnectedError",),
    ),
    "429 with Retry-After": (
        lambda fake, n: fake.rate_limit("chat.postMessage", times=n, retry_after=1),
        3,
        ("failed: rate limited (HTTP 429, Retry-After 1s); trying again in 1.0s",),
    ),
    "ok:false internal_error": (
        lambda fake, n: fake.fail("chat.postMessage", "internal_error", times=n),
        2,
        ("failed (try 2 of 4): internal_error;",),
    ),
    # Answers with no Slack error code in them say nothing about the write: tried again too.
    "200 with no body": (
        lambda fake, n: fake.fail_text("chat.postMessage", "", status=200, times=n),
        2,
        ("failed (try 2 of 4): ",),
    ),
    "a proxy's 404 page": (
        lambda fake, n: fake.fail_text("chat.postMessage", "not found (proxy)", status=404, times=n),
        2,
        ("failed (try 2 of 4): HTTP 404: not found (proxy)",),
    ),
    "a proxy's 408 page": (
        lambda fake, n: fake.fail_text("chat.postMessage", "request timeout", status=408, times=n),
        2,
        ("failed (try 2 of 4): HTTP 408: request timeout",),
    ),
    "200 with a text body": (  # slack_sdk itself trips over it (AttributeError): logged with a traceback
        lambda fake, n: fake.fail_text("chat.postMessage", "<html>oops</html>", status=200, times=n),
        1,
        ("failed (try 1 of 4): AttributeError",),
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_faulty_answer_delays_a_post_but_loses_and_repeats_nothing(fake, gated, start_bot, fault):
    inject, times, logged = FAULTS[fault]
    bot = await start_bot()
    goal = await Goal.open(fake, gated)
    inject(fake, times)
    goal.step("first")
    first = await goal.milestone("first")
    await bot.logged("slack write", f"(post {key_of(first)} to {fake.general})", *logged)
    await both_steps_arrive_once(goal)
    tries = milestone_posts(fake, "first")
    assert [c.ok for c in tries] == [False] * times + [True]
    # Still serving, and nothing left behind.
    status = await fake.slash_command("/goal", "health", fake.general, ALICE)
    assert "0 waiting, 0 parked" in (await status.wait_for_ephemeral(timeout=10)).text


UPLOAD_FAULTS: dict[str, Callable[[FakeSlack], object]] = {
    "getUploadURLExternal 503 text": lambda fake: fake.fail_text("files.getUploadURLExternal", times=2),
    "upload URL 500": lambda fake: fake.fail_text("upload", "upload failed", status=500, times=2),
    "upload URL dropped": lambda fake: fake.drop_connection("upload", times=2),
    "completeUploadExternal dropped": lambda fake: fake.drop_connection(
        "files.completeUploadExternal", times=2
    ),
    "completeUploadExternal ok:false": lambda fake: fake.fail(
        "files.completeUploadExternal", "internal_error", times=2
    ),
}


@pytest.mark.parametrize("fault", list(UPLOAD_FAULTS))
async def test_a_failed_upload_is_tried_again_and_arrives_once(fake, gated, start_bot, fault):
    bot = await start_bot()
    goal = await Goal.open(fake, gated)
    UPLOAD_FAULTS[fault](fake)
    goal.step("first")
    await goal.milestone("first")
    [plot] = await goal.plots(1)
    await bot.logged("slack write", "(upload box:", ":plot to C0GENERAL)", "failed (try 2 of 4)")
    assert plot.files[0]["name"].endswith(".png")
    await both_steps_arrive_once(goal)


@pytest.mark.parametrize("others", [0, 230])
async def test_an_answer_lost_after_slack_took_the_post_is_not_posted_twice(fake, gated, start_bot, others):
    """With `others` replies before it too: Slack lists a thread's replies oldest first, 200 a
    page, so the lookup pages on and a post past the first page (the soak's 500-post thread) is
    found rather than posted again."""
    bot = await start_bot()
    goal = await Goal.open(fake, gated)
    for n in range(others):  # another app's replies fill the thread's first page and more
        await fake.bot_posts(fake.general, f"other app {n}", thread_ts=goal.card_ts)
    fake.drop_connection("chat.postMessage", after=True)  # Slack stores it; the bot never hears
    goal.step("first")
    first = await goal.milestone("first")
    await bot.logged("slack write", key_of(first), "found in Slack already")
    await both_steps_arrive_once(goal)
    assert len(milestone_posts(fake, "first")) == 1
    lookups = [c for c in fake.calls("conversations.replies") if c.params.get("ts") == goal.card_ts]
    assert lookups and all(c.ok for c in lookups)
    if others:
        assert any(c.params.get("cursor") for c in lookups)  # it went past the first page


# ---- writes that cannot be delivered: parked, with a note where they were going ----


async def test_an_upload_that_keeps_failing_is_parked_with_a_note(fake, gated, start_bot):
    bot = await start_bot()
    goal = await Goal.open(fake, gated)
    fake.fail_text("upload", "upload failed", status=500, times=MAX_ATTEMPTS)
    goal.step("first")
    await goal.milestone("first")
    note = await fake.wait_for_message(
        fake.general, thread_ts=goal.card_ts, text="could not deliver", timeout=60
    )
    assert "the file box-goal-1-" in note.text and ".png" in note.text
    assert "status: 500" in note.text and f"gave up after {MAX_ATTEMPTS} tries" in note.text
    assert "best so far" in note.text  # its words, quoted
    await bot.logged("slack write", ":plot to C0GENERAL)", "parked", f"gave up after {MAX_ATTEMPTS} tries")
    await bot.logged("goaltender.bot.health: health", "waiting, 1 parked")
    # The thread goes on: the next milestone and its plot arrive.
    goal.step("second")
    await goal.milestone("second")
    await goal.plots(1)
    status = await fake.slash_command("/goal", "health", fake.general, ALICE)
    text = (await status.wait_for_ephemeral(timeout=10)).text
    assert "1 parked" in text and "status: 500" in text and "box up" in text


async def test_a_post_slack_refuses_for_good_is_parked_at_once_with_a_note(fake, gated, start_bot):
    bot = await start_bot()
    goal = await Goal.open(fake, gated)
    fake.fail("chat.postMessage", "invalid_arguments", times=1)
    goal.step("first")
    note = await fake.wait_for_message(
        fake.general, thread_ts=goal.card_ts, text="could not deliver", timeout=30
    )
    assert note.text.startswith(":warning: I could not deliver a message to Slack: invalid_arguments.")
    assert "Step first" in note.text
    await bot.logged("slack write", "parked: invalid_arguments")
    assert len(milestone_posts(fake, "first")) == 2  # the refused post, and the note quoting it
    goal.step("second")
    await goal.milestone("second")
    assert not any("Step first" in t and "could not" not in t for t in goal.texts())


async def test_a_layout_slack_refuses_is_sent_as_plain_text(fake, gated, start_bot):
    bot = await start_bot()
    goal = await Goal.open(fake, gated)
    fake.fail("chat.postMessage", "invalid_blocks", times=1)
    goal.step("first")
    first = await goal.milestone("first")
    assert first.blocks is None and "plain text: Slack refused the layout: invalid_blocks" in first.text
    await bot.logged("slack write", key_of(first), "Slack refused it (invalid_blocks)")
    await both_steps_arrive_once(goal)


# ---- start-up and channels ----


@pytest.mark.parametrize("variable", ["SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"])
async def test_a_refused_token_stops_the_bot_naming_its_variable(fake, gated, tmp_path, variable):
    env = bot_env(fake, tmp_path / "bot-home", gated.settings.socket_path)
    env[variable] = env[variable][:5] + "not-the-right-one"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "goaltender.cli",
        "bot",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    said = stderr.decode()
    assert f"Slack refused the token in {variable} (invalid_auth)" in said, said
    assert "Traceback" not in said
    assert fake.live_connections == []


async def test_goal_in_a_channel_without_the_bot_starts_nothing(fake, gated, start_bot):
    await start_bot()
    res = await fake.slash_command("/goal", "tune the lr", "#random", ALICE)
    answer = await res.wait_for_ephemeral(timeout=30)
    assert "Invite me with `/invite @goaltender` first" in answer.text and "tune the lr" in answer.text
    assert [c.response["channel"]["is_member"] for c in fake.calls("conversations.info")] == [False]
    assert (await _runner_status(gated)).goals == []  # nothing started on the runner
    assert not fake.calls("chat.postMessage") and fake.messages("#random") == []


async def _runner_status(runner: Runner) -> p.StatusReply:
    from goaltender.protocol.client import RunnerClient

    client = await RunnerClient.connect_unix(runner.settings.socket_path, client="test")
    try:
        return await client.request(p.Status())
    finally:
        await client.close()


# ---- health, as `goaltender bot --check` sees it ----


def check_settings(fake: FakeSlack, home: Path, socket: Path, **overrides) -> BotSettings:
    return BotSettings(
        **{
            "home": home,
            "runners": [{"name": "box", "socket": socket}],
            "slack_api_url": fake.api_url,
            "slack_bot_token": fake.bot_token,
            "slack_app_token": fake.app_token,
            **overrides,
        }
    )


async def test_check_says_what_answers_and_what_does_not(fake, gated, tmp_path, short_dir):
    home = tmp_path / "bot-home"
    good = await check(check_settings(fake, home, gated.settings.socket_path))
    assert good.exit_code == 0, good.text
    assert "SLACK_BOT_TOKEN accepted: @goaltender (U0BOT)" in good.text
    assert "SLACK_APP_TOKEN accepted" in good.text
    assert "runner box: reachable" in good.text and "calls itself test-runner" in good.text
    assert "bot.db: none yet" in good.text and good.text.rstrip().endswith("bot check: OK")

    store = await BotStore.open(home / "bot.db")
    parked = await store.enqueue("C0GENERAL", "post", {"text": "hello"}, "box:9:0")
    assert parked is not None
    await store.mark_failed(parked, "HTTP 503: upstream connect error (gave up after 8 tries)")
    await store.enqueue("C0GENERAL", "post", {"text": "waiting"}, "box:10:0")
    await store.close()
    bad = await check(
        check_settings(
            fake, home, short_dir / "nobody.sock", slack_bot_token="xoxb-wrong", slack_app_token="xapp-wrong"
        )
    )
    assert bad.exit_code == 1
    assert "Slack refused the token in SLACK_BOT_TOKEN (invalid_auth)" in bad.text
    assert "runner box" in bad.text and "unreachable" in bad.text
    assert "bot.db: 1 write(s) waiting for Slack, 1 parked" in bad.text
    assert "box:9:0 to C0GENERAL: HTTP 503: upstream connect error" in bad.text
    assert len(bad.problems) == 2


async def test_goaltender_bot_check_exits_with_its_verdict(fake, gated, tmp_path):
    """The real entry point: `goaltender bot --check`, configured through its environment."""

    async def run_check(token: str) -> tuple[int, str]:
        return await bot_check(
            fake, gated.settings.socket_path, tmp_path / "check-home", SLACK_BOT_TOKEN=token
        )

    code, text = await run_check(fake.bot_token)
    assert code == 0 and text.rstrip().endswith("bot check: OK"), text
    code, text = await run_check("xoxb-wrong")
    assert code == 1 and "Slack refused the token in SLACK_BOT_TOKEN" in text, text
    assert "Traceback" not in text


# ---- the outbox on its own: one channel's trouble does not hold up another; the loop restarts ----


async def test_a_failing_channel_does_not_hold_up_the_others(fake, tmp_path, caplog):
    fake.add_channel("C0TWO", "two")
    fake.fail_text("chat.postMessage", channel=fake.general, times=1000)
    store = await BotStore.open(tmp_path / "bot.db")
    outbox = Outbox(
        store, fake.client(), per_channel_interval_s=0.05, max_attempts=3, backoff_s=0.05, backoff_cap_s=0.2
    )
    task = asyncio.ensure_future(outbox.run())
    try:
        await outbox.enqueue(fake.general, "post", {"text": "to general"})
        for i in range(3):
            await outbox.enqueue("C0TWO", "post", {"text": f"two {i}"})
        await fake.wait_for(lambda: len(fake.messages("C0TWO")) == 3, 10)
        await eventually(outbox.idle)
        assert fake.messages(fake.general) == []  # parked: its note failed too, and was not noted
        assert await store.failed_count() == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()
    assert [m.text for m in fake.messages("C0TWO")] == ["two 0", "two 1", "two 2"]
    assert any("parked" in r.message and "note:" in r.message for r in caplog.records)


async def test_the_send_loop_restarts_after_it_fails(fake, tmp_path, caplog, monkeypatch):
    store = await BotStore.open(tmp_path / "bot.db")
    outbox = Outbox(store, fake.client(), per_channel_interval_s=0.05)
    outbox.restart_pause_s = 0.1
    real = store.next_pending
    broken = {"times": 2}

    async def next_pending(now):
        if broken["times"]:
            broken["times"] -= 1
            raise RuntimeError("database disk image is malformed")
        return await real(now)

    monkeypatch.setattr(store, "next_pending", next_pending)
    task = asyncio.ensure_future(outbox.run())
    try:
        with caplog.at_level(logging.ERROR, logger="goaltender.bot.outbox"):
            await outbox.enqueue(fake.general, "post", {"text": "still here"})
            await fake.wait_for_message(fake.general, text="still here", timeout=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()
    restarts = [r for r in caplog.records if "the send loop failed" in r.message]
    assert len(restarts) == 2 and restarts[0].exc_info is not None
    assert "database disk image is malformed" in str(restarts[0].exc_info[1])
