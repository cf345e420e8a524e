"""Monitoring: the runner's and the bot's Prometheus endpoints, scraped over HTTP with aiohttp and
parsed with prometheus_client's own text parser while real goals start and end and real Slack
writes queue and go out; JSON logs; and no warning lines when `goaltender runner` and
`goaltender bot` start (both as real processes)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import aiohttp
import pytest
from daemons import Daemon
from fake_slack import ALICE
from helpers import eventually, submit, write_agent
from prometheus_client.parser import text_string_to_metric_families

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner import monitoring

SECRET = "hf_monitoringSecret0123456789"  # a token shape, in every daemon's environment here
GOAL_WORD = "zanzibar"  # in every goal's text: no metric may show it
# An agent that runs one experiment that lasts until its goal is stopped.
LONG_RUN = 'goaltender experiment -d "long" --metric score -- python -c "import time; time.sleep(600)"\n'
LOG_LINE = {
    "runner": re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \S+ (INFO|WARNING|ERROR|CRITICAL) "),
    "bot": re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR|CRITICAL) \S+: "),
}


Samples = dict[tuple[str, frozenset], float]


async def scrape(url: str) -> tuple[Samples, str]:
    """One scrape: every sample by (name, labels), and the body as served."""
    async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(30)) as got:
        assert got.status == 200 and got.content_type == "text/plain"
        body = await got.text()
    return parsed(body), body


def parsed(body: str) -> Samples:
    """What prometheus_client's parser reads in a scrape's body."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def value(samples: Samples, metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


async def metrics_url(daemon: Daemon) -> str:
    """Where this start of the daemon serves its metrics (it logs the port it was given)."""
    line = await daemon.logged("metrics for Prometheus on", timeout=60)
    found = re.search(r"http://127\.0\.0\.1:\d+/metrics", line)
    assert found, line
    return found.group(0)


def assert_nothing_secret(body: str) -> None:
    assert SECRET not in body and GOAL_WORD not in body


def runner_env(tmp_path, short_dir, **more: str) -> dict[str, str]:
    env = {
        **os.environ,
        "GOALTENDER_HOME": str(tmp_path / "runner-home"),
        "GOALTENDER_SOCKET": str(short_dir / "runner.sock"),
        "GOALTENDER_NAME": "box",
        "GOALTENDER_MIN_FREE_MB": "64",
        "HF_TOKEN": SECRET,
        **more,
    }
    env.pop("GOALTENDER_CONFIG", None)
    return env


def bot_env(fake, tmp_path, short_dir, **more: str) -> dict[str, str]:
    env = {
        **os.environ,
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "GOALTENDER_SLACK_API_URL": fake.api_url,
        "GOALTENDER_HOME": str(tmp_path / "bot-home"),
        "GOALTENDER_RUNNERS": json.dumps([{"name": "box", "socket": str(short_dir / "runner.sock")}]),
        "GOALTENDER_OUTBOX_INTERVAL_S": "0.05",
        "HF_TOKEN": SECRET,
        **more,
    }
    env.pop("GOALTENDER_CONFIG", None)
    return env


async def test_runner_metrics_follow_goals_and_slots(tmp_path, short_dir):
    """One slot, two goals each running an experiment until stopped: the scrapes show goals
    running, the slot in use and the second goal's run queued, then each change as goals stop."""
    agent = write_agent(tmp_path, "long.sh", LONG_RUN)
    env = runner_env(
        tmp_path,
        short_dir,
        GOALTENDER_METRICS_PORT="0",
        GOALTENDER_SLOTS="1",
        GOALTENDER_AGENTS=json.dumps({"long": agent}),
        GOALTENDER_DEFAULT_AGENT="long",
        GOALTENDER_STOP_GRACE_S="1",
    )
    runner = Daemon("runner", env, tmp_path)
    await runner.start()
    client: RunnerClient | None = None
    try:
        url = await metrics_url(runner)
        await runner.logged("listening on")
        now, body = await scrape(url)
        assert_nothing_secret(body)
        assert value(now, "goaltender_runner_info", name="box") == 1
        assert value(now, "goaltender_state_read_ok") == 1
        assert value(now, "goaltender_runner_goals", state="running") == 0
        assert (value(now, "goaltender_runner_slots"), value(now, "goaltender_runner_slots_in_use")) == (1, 0)
        assert value(now, "goaltender_runner_slot_queue_experiments") == 0
        assert (value(now, "goaltender_runner_disk_free_bytes") or 0) > 0
        assert value(now, "goaltender_runner_disk_min_free_bytes") == 64 * 1024 * 1024
        assert (value(now, "process_resident_memory_bytes") or 0) > 0  # the library's process metrics

        client = await RunnerClient.connect_unix(short_dir / "runner.sock", client="test")
        first = await submit(client, f"{GOAL_WORD} one, max 1 experiments")

        async def shows(**expected: float) -> Samples:
            """A scrape in which every `name=value` (name: the metric after goaltender_runner_) holds."""

            async def check() -> Samples | None:
                samples, body = await scrape(url)
                assert_nothing_secret(body)
                running = value(samples, "goaltender_runner_goals", state="running")
                seen = {"running": running} | {
                    name: value(samples, f"goaltender_runner_{name}")
                    for name in expected
                    if name != "running"
                }
                return samples if seen == expected else None

            return await eventually(check, 120, interval=0.2)

        await shows(running=1, slots_in_use=1, slot_queue_experiments=0)
        second = await submit(client, f"{GOAL_WORD} two, max 1 experiments")
        await shows(running=2, slots_in_use=1, slot_queue_experiments=1, slot_queue_goals=1)

        await client.request(p.Stop(goal_id=first))
        await shows(running=1, slots_in_use=1, slot_queue_experiments=0, slot_queue_goals=0)
        await client.request(p.Stop(goal_id=second))
        await shows(running=0, slots_in_use=0, slot_queue_experiments=0)
    finally:
        if client is not None:
            await client.close()
        await runner.stop()


async def test_bot_metrics_follow_links_and_the_outbox(fake, start_runner, tmp_path, short_dir, monkeypatch):
    """The bot as `goaltender bot`: its runner link up, then down; a goal typed meanwhile is queued
    for the runner and its card waits in the outbox while Slack holds the post (the oldest write's
    age grows); once Slack answers the outbox is empty and the last write's time is shown."""
    runner = await start_runner(name="box")
    bot = Daemon("bot", bot_env(fake, tmp_path, short_dir, GOALTENDER_BOT_METRICS_PORT="0"), tmp_path)
    held = asyncio.Event()
    post = fake._methods["chat.postMessage"]

    async def held_post(params):
        await held.wait()
        return await post(params)

    try:
        await bot.start()
        url = await metrics_url(bot)
        await fake.wait_connected(1, timeout=60)
        await bot.wait_linked()
        now, body = await scrape(url)
        assert_nothing_secret(body)
        assert value(now, "goaltender_bot_runner_up", runner="box") == 1
        assert value(now, "goaltender_bot_queued_goals") == 0
        assert value(now, "goaltender_bot_last_slack_write_timestamp_seconds") is None  # none yet
        assert (value(now, "process_cpu_seconds_total") or 0) > 0

        await runner.close()

        async def link_down() -> bool:
            return value((await scrape(url))[0], "goaltender_bot_runner_up", runner="box") == 0

        await eventually(link_down, 60)

        monkeypatch.setitem(fake._methods, "chat.postMessage", held_post)
        typed = await fake.slash_command(
            "/goal", f"{GOAL_WORD} while the runner is down", fake.general, ALICE
        )
        assert typed.acked

        async def waiting() -> Samples | None:
            samples, _ = await scrape(url)
            pending = value(samples, "goaltender_bot_outbox_pending") or 0
            age = value(samples, "goaltender_bot_outbox_oldest_pending_age_seconds") or 0
            return samples if pending >= 1 and age > 0.2 else None

        before = await eventually(waiting, 60)
        assert value(before, "goaltender_bot_queued_goals") == 1
        released_at = time.time()
        held.set()

        async def delivered() -> Samples | None:
            samples, body = await scrape(url)
            assert_nothing_secret(body)
            assert fake.bot_token not in body and fake.app_token not in body
            done = value(samples, "goaltender_bot_outbox_pending") == 0
            return (
                samples
                if done and value(samples, "goaltender_bot_last_slack_write_timestamp_seconds")
                else None
            )

        after = await eventually(delivered, 60)
        assert value(after, "goaltender_bot_outbox_oldest_pending_age_seconds") == 0
        last = value(after, "goaltender_bot_last_slack_write_timestamp_seconds") or 0
        assert released_at - 1 <= last <= time.time() + 1
        assert value(after, "goaltender_bot_queued_goals") == 1  # still waiting for the runner
    finally:
        held.set()
        await bot.stop()


async def test_the_endpoint_answers_beside_a_stalled_scrape(start_runner, connect):
    """A scraper that connects and never finishes its request holds only its own thread: another
    scrape is answered, and so is the runner's own socket."""
    runner = await start_runner(metrics_port=0)
    assert runner.metrics is not None and runner.metrics.port
    stalled = socket.create_connection(("127.0.0.1", runner.metrics.port))
    try:
        stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no end of headers: it waits for more
        samples, _ = await scrape(runner.metrics.url)
        assert value(samples, "goaltender_state_read_ok") == 1
        client = await connect(runner)
        status = await asyncio.wait_for(client.request(p.Status()), 30)
        assert status.goals == []
    finally:
        stalled.close()


async def test_a_stuck_loop_is_said_not_waited_for(start_runner, monkeypatch):
    """While the runner's loop is stuck, a scrape answers after READ_TIMEOUT_S with
    goaltender_state_read_ok 0 (and what needs no loop: the disk); once the loop is back, 1."""
    monkeypatch.setattr(monitoring, "READ_TIMEOUT_S", 0.5)
    runner = await start_runner(metrics_port=0)
    assert runner.metrics is not None
    url, answered, body = runner.metrics.url, threading.Event(), []

    def scrape_from_a_thread() -> None:
        with urllib.request.urlopen(url, timeout=60) as answer:
            body.append(answer.read().decode())
        answered.set()

    threading.Thread(target=scrape_from_a_thread, daemon=True).start()
    assert answered.wait(60)  # blocks this loop, the runner's, on purpose: the stuck loop
    samples = parsed(body[0])
    assert value(samples, "goaltender_state_read_ok") == 0
    assert value(samples, "goaltender_runner_goals", state="running") is None
    assert (value(samples, "goaltender_runner_disk_free_bytes") or 0) > 0
    assert value((await scrape(url))[0], "goaltender_state_read_ok") == 1


async def test_a_taken_metrics_port_stops_the_runner_saying_so(tmp_path, short_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "goaltender.cli", "runner"],
            env=runner_env(tmp_path, short_dir, GOALTENDER_METRICS_PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"GOALTENDER_METRICS_PORT is {port}: cannot serve metrics on 127.0.0.1:{port}" in done.stderr


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_runner_and_bot_start_without_warnings(fake, tmp_path, short_dir, log_format):
    """`goaltender runner` and `goaltender bot` start, link and stop: every line either wrote is a
    log record of its format (no warnings module output, no stray text) and none is a library's
    warning (asyncssh's DSA deprecations, Bolt's "token will be unused" were ten lines)."""
    fmt = {"GOALTENDER_LOG_FORMAT": log_format}
    runner = Daemon("runner", runner_env(tmp_path, short_dir, **fmt), tmp_path)
    bot = Daemon("bot", bot_env(fake, tmp_path, short_dir, **fmt), tmp_path)
    try:
        await runner.start()
        await runner.logged("listening on", timeout=60)
        await bot.start()
        await fake.wait_connected(1, timeout=60)
        await bot.wait_linked()
        await bot.logged("Slack: connected as")
    finally:
        await bot.stop()
        await runner.stop()
    for daemon in (runner, bot):
        lines = daemon.lines()
        assert lines, daemon.verb
        for line in lines:
            level, logger = record_of(daemon.verb, line, log_format)
            assert level == "INFO" or logger.startswith("goaltender"), f"{daemon.verb}: {line}"
            assert "Warning" not in line and "token will be unused" not in line, f"{daemon.verb}: {line}"


def record_of(verb: str, line: str, log_format: str) -> tuple[str, str]:
    """A log line's level and logger (failing the test when the line is no log record)."""
    if log_format == "json":
        record = json.loads(line)
        assert {"time", "level", "logger", "message", "exception"} <= set(record), line
        return record["level"], record["logger"]
    assert LOG_LINE[verb].match(line), f"{verb}: not a log line: {line}"
    words = line.split()
    return (words[3], words[2]) if verb == "runner" else (words[2], words[3].rstrip(":"))


def test_json_logs_are_redacted_and_carry_the_exception(tmp_path):
    """The daemons' logging (redact_output, then configure_logging) in a process of its own: a
    secret in a message and in an exception is replaced, and each line is one JSON object."""
    program = (
        "import logging\n"
        "from goaltender.runner.logs import configure_logging, RUNNER_TEXT\n"
        "from goaltender.runner.secrets import Redactor, redact_output\n"
        "redact_output(Redactor.from_environment())\n"
        "configure_logging('json', RUNNER_TEXT)\n"
        "log = logging.getLogger('goaltender.test')\n"
        f"log.info('the key is %s', {SECRET!r})\n"
        "try:\n"
        f"    raise ValueError('refused \"{SECRET}\"')\n"
        "except ValueError:\n"
        "    log.exception('a failure')\n"
        "import warnings; warnings.warn('a warning, logged')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "HF_TOKEN": SECRET},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(r["level"], r["logger"]) for r in records] == [
        ("INFO", "goaltender.test"),
        ("ERROR", "goaltender.test"),
        ("WARNING", "py.warnings"),
    ]
    assert records[0]["message"] == "the key is [redacted:HF_TOKEN]" and records[0]["exception"] is None
    assert (
        "ValueError: refused" in records[1]["exception"] and "[redacted:HF_TOKEN]" in records[1]["exception"]
    )
    assert records[0]["time"].endswith("+00:00")
