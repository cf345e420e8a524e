"""Slack bot speed, each figure against a baseline measured in the same run on the same machine.

Everything runs as the tests run it: the fake Slack (tests/fake_slack/: the Web API over HTTP and
Socket Mode over a WebSocket, on 127.0.0.1), the real slack_bolt AsyncApp + AsyncSocketModeHandler
+ slack_sdk AsyncWebClient, the bot (goaltender.bot.app.GoaltenderBot), the runner daemon and, for
2, the asyncssh server of tests/ssh_box.py, all in this one process and event loop; agents and
experiments are real subprocesses. So every figure includes the other parts' share of the loop.

1. `/goal` ack latency: the fake sends a slash-command envelope and times its ack (Envelope.
   ack_latency: frame sent -> ack frame received). The goal's agent is `sleep 600`, so goals just
   sit. Two ways of sending: back to back (the next command goes as soon as the previous one is
   acked, so each ack competes with the earlier goals' intake: the runner submission, the agent's
   spawn, the status card), and one at a time (the next command waits for the previous goal's
   "Queued as goal #N" reply). Outbox interval: the default (1 s per channel).
   Baseline: a bare AsyncApp whose `/ping` listener only calls ack(), same fake, same handler,
   back to back. (Bolt polls for the ack every 10 ms, so ~10 ms is the floor for both.)
2. Runner event -> Slack post: an agent reports milestones, paced slower than the outbox's
   per-channel interval; latency = the fake receiving the milestone's chat.postMessage minus the
   runner event's timestamp (Event.ts, stamped when it is appended to the event log). On the way
   the bot renders the event, asks the runner for the goal's summary (for a plot; none yet, as
   there are no experiments), stores the write with the event's seq, and the outbox sends it.
   The bot reaches the runner over SSH (asyncssh, direct-streamlocal to the runner's socket).
   Baseline: the same through a local Unix-socket link. Measured twice: at the default outbox
   interval (1 s per channel; milestones paced --pace apart), and with the interval set to 0, which
   leaves the path itself (render, bot.db, outbox, HTTP) — that one is NOT the default setting.
   The goal's rate of posts (runner/folding.py) is opened wide, so no milestone is folded.
3. Slack writes per campaign: one star-count sweep campaign (the goal and runner settings of
   `goaltender demo`) submitted with `/goal`; every approval prompt is answered by the owner's
   ✅ reaction. Counted: runner events of the goal (its event log) and the Slack calls the fake
   received, by kind. Runs at the default outbox interval (1 s per channel): waiting status-card
   edits are coalesced (only the newest is sent), so the count depends on the interval. Metrics
   events never cause a write, and their number follows how long the runs took (a run's log is read
   every 0.5 s), so the ratios are also given without them.

    python benchmarks/bench_bot.py [--acks 200] [--milestones 20] [--fast-milestones 100] [--no-campaign]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))  # the fake Slack and the SSH box live with the tests

from fake_slack import ALICE, FakeSlack  # noqa: E402
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler  # noqa: E402
from slack_bolt.async_app import AsyncApp  # noqa: E402
from ssh_box import SSHBox  # noqa: E402

from goaltender.bot.app import GoaltenderBot  # noqa: E402
from goaltender.bot.config import BotSettings  # noqa: E402
from goaltender.bot.transports import RunnerTarget  # noqa: E402
from goaltender.demo import DEFAULT_GOAL, Demo  # noqa: E402
from goaltender.runner.config import RunnerSettings  # noqa: E402
from goaltender.runner.daemon import Runner  # noqa: E402
from goaltender.storage.records import FinalReport, MilestoneReported  # noqa: E402

MS = 1000
RUNNER = "box"  # the bot's name for the runner in every set-up
DEFAULT_INTERVAL = BotSettings.model_fields["outbox_interval_s"].default  # the outbox's, per channel

# The agent of figure 2: waits for a start flag (so the card's first writes are out of the way),
# then reports `count` milestones `pace` seconds apart, then idles.
MILESTONE_AGENT = """\
import asyncio, os, sys
from pathlib import Path
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, socket_from_env

async def main(count, pace):
    goal = int(os.environ["GOALTENDER_GOAL_ID"])
    flag = Path(os.environ["GOALTENDER_WORKSPACE"], "go")  # the sandbox shows it the workspace, not /tmp
    async with await RunnerClient.connect_unix(socket_from_env(), client="bench-agent") as runner:
        while not flag.exists():
            await asyncio.sleep(0.01)
        for i in range(1, count + 1):
            await runner.request(p.ReportMilestone(goal_id=goal, title=f"bench-{i:04d}"))
            await asyncio.sleep(pace)
        await asyncio.sleep(3600)

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
"""
MILESTONE_TITLE = re.compile(r"bench-(\d{4})")


class LogTally(logging.Handler):
    """Keeps every WARNING-or-worse record instead of printing it; the run reports them at the end."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def until(predicate, limit_s: float, what: str, interval: float = 0.05):
    """Poll a (sync or async) predicate until it is truthy; return its value."""
    deadline = time.monotonic() + limit_s
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def bot_stack(
    tmp: Path,
    name: str,
    settings: RunnerSettings,
    *,
    interval: float,
    box: SSHBox | None = None,
) -> AsyncIterator[tuple[FakeSlack, Runner, GoaltenderBot]]:
    """A runner, a fake Slack and the bot linked to the runner (over SSH when `box` is given)."""
    runner = await Runner.start(settings)
    fake = await FakeSlack().start()
    bot: GoaltenderBot | None = None
    try:
        socket = settings.socket_path
        if box is not None:
            box.sockets.add(str(socket))
            target = box.target(RUNNER, remote_socket=str(socket))
        else:
            target = RunnerTarget(name=RUNNER, socket=socket)
        bot = await GoaltenderBot.open(
            BotSettings(
                home=tmp / name / "bot",
                runners=[target],
                slack_api_url=fake.api_url,
                slack_bot_token=fake.bot_token,
                slack_app_token=fake.app_token,
                outbox_interval_s=interval,
            )
        )
        await bot.start()
        await fake.wait_connected()
        await asyncio.wait_for(bot.pool[RUNNER].wait_healthy(), 15)
        yield fake, runner, bot
    finally:
        if bot is not None:
            await bot.close()
        await fake.stop()
        await runner.close()


def runner_settings(tmp: Path, name: str, agent: list[str]) -> RunnerSettings:
    return RunnerSettings(
        home=tmp / name / "runner",
        socket=tmp / f"{name}.sock",
        name=name,
        agents={"bench": agent},
        default_agent="bench",
        stop_grace_s=1.0,
        # The path is measured here, not the goal's rate (runner/folding.py): none is folded.
        milestone_burst=1_000_000,
    )


async def settled(bot: GoaltenderBot, runner: Runner, limit_s: float = 60) -> None:
    """Until the bot has rendered every runner event and the outbox has sent everything."""

    async def done() -> bool:
        head = await runner.store.head_seq()
        return await bot.store.cursor(RUNNER) >= head and await bot.store.pending_count() == 0

    await until(done, limit_s, "the bot to catch up with the runner and empty its outbox")


# ---- 1. /goal ack latency ----


async def slash_commands(
    fake: FakeSlack, command: str, text: str, n: int, warmup: int, *, one_at_a_time: bool = False
) -> tuple[list[float], list]:
    latencies, interactions = [], []
    for i in range(warmup + n):
        res = await fake.slash_command(command, text.format(i=i), fake.general, ALICE)
        if not res.acked:
            raise RuntimeError(f"{command} #{i} was not acked within {fake.ack_timeout}s")
        if i >= warmup:
            latencies.append(res.envelope.ack_latency)
        interactions.append(res)
        if one_at_a_time:
            await res.wait_for_response(timeout=30)
    return latencies, interactions


async def bench_ping(n: int, warmup: int) -> list[float]:
    async with FakeSlack() as fake:
        client = fake.client()
        app = AsyncApp(client=client)

        @app.command("/ping")
        async def ping(ack):
            await ack()

        handler = AsyncSocketModeHandler(app, app_token=fake.app_token, web_client=client)
        await handler.connect_async()
        try:
            await fake.wait_connected()
            latencies, _ = await slash_commands(fake, "/ping", "", n, warmup)
        finally:
            await handler.close_async()
    return latencies


async def bench_goal_acks(tmp: Path, name: str, n: int, warmup: int, *, one_at_a_time: bool) -> list[float]:
    settings = runner_settings(tmp, name, ["sleep", "600"])
    async with bot_stack(tmp, name, settings, interval=DEFAULT_INTERVAL) as (fake, runner, _):
        latencies, interactions = await slash_commands(
            fake, "/goal", "hold still, goal {i}", n, warmup, one_at_a_time=one_at_a_time
        )
        # The rest of each listener ran too: every command got its reply and became a goal.
        await until(lambda: all(r.responses for r in interactions), 60, "every /goal's reply")
        goals = await runner.store.list_goals()
        if len(goals) != len(interactions):
            raise RuntimeError(f"{len(interactions)} /goal commands made {len(goals)} goals")
    return latencies


# ---- 2. runner event -> Slack post ----


async def bench_event_to_post(
    tmp: Path, name: str, *, box: SSHBox | None, interval: float, n: int, pace: float
) -> list[float]:
    script = tmp / "milestone_agent.py"
    script.write_text(MILESTONE_AGENT)
    settings = runner_settings(tmp, name, [sys.executable, str(script), str(n), str(pace)])
    async with bot_stack(tmp, name, settings, interval=interval, box=box) as (fake, runner, bot):
        res = await fake.slash_command("/goal", "report milestones", fake.general, ALICE)
        await res.wait_for_response(timeout=30)
        await settled(bot, runner)  # the card and its first updates are out
        await asyncio.sleep(interval + 0.3)  # and the channel's write gate is open again
        [goal] = await runner.store.list_goals()
        (Path(goal.workspace) / "go").touch()

        def milestone_posts() -> dict[int, float]:
            found = {}
            for call in fake.calls("chat.postMessage"):
                if call.ok and (m := MILESTONE_TITLE.search(str(call.params.get("text", "")))):
                    found[int(m.group(1))] = call.time
            return found if len(found) >= n else {}

        posted = await until(milestone_posts, n * (pace + 1) + 60, f"{n} milestone posts")
        offset = time.time() - time.monotonic()  # the fake stamps calls with time.monotonic()
        emitted = {
            int(m.group(1)): event.ts.timestamp()
            for event in await runner.store.events_since(0, limit=1_000_000)
            if isinstance(event.data, MilestoneReported) and (m := MILESTONE_TITLE.search(event.data.title))
        }
    return [posted[i] + offset - emitted[i] for i in sorted(posted)]


# ---- 3. Slack writes per campaign ----

WRITE_METHODS = (
    "chat.postMessage",
    "chat.update",
    "reactions.add",
    "files.completeUploadExternal",
    "chat.postEphemeral",
    "response_url",
)


async def approve_every_prompt(fake: FakeSlack, answered: list[str]) -> None:
    """The goal's owner reacts ✅ on each approval prompt the bot posts."""
    while True:
        for msg in list(fake.channel(fake.general).messages):
            if msg.is_bot and "approve" in msg.action_ids() and msg.ts not in answered:
                answered.append(msg.ts)
                await fake.user_reacts(fake.general, msg.ts, "white_check_mark", ALICE)
        await asyncio.sleep(0.1)


async def bench_campaign(tmp: Path, interval: float, limit_s: float) -> dict:
    settings = Demo(DEFAULT_GOAL, tmp / "campaign", yes=True).settings()
    settings = settings.model_copy(update={"socket": tmp / "campaign.sock"})
    answered: list[str] = []
    async with bot_stack(tmp, "campaign", settings, interval=interval) as (fake, runner, bot):
        started = time.monotonic()
        res = await fake.slash_command("/goal", DEFAULT_GOAL, fake.general, ALICE)
        await res.wait_for_response(timeout=30)
        approver = asyncio.ensure_future(approve_every_prompt(fake, answered))
        try:

            async def reported() -> bool:
                events = await runner.store.events_since(0, limit=1_000_000)
                return any(isinstance(e.data, FinalReport) for e in events)

            await until(reported, limit_s, "the campaign's final report", interval=0.2)
            campaign_s = time.monotonic() - started
            await settled(bot, runner)
            drained_s = time.monotonic() - started
        finally:
            approver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await approver
        events = [e for e in await runner.store.events_since(0, limit=1_000_000) if e.goal_id is not None]
        experiments = await runner.store.experiments(events[0].goal_id)
        calls = Counter(c.method for c in fake.calls())
        failed = Counter(
            c.method for c in fake.calls() if c.response is not None and not c.response.get("ok")
        )
        warnings = list(fake.warnings)
    return {
        "events": Counter(e.data.kind for e in events),
        "calls": calls,
        "failed": failed,
        "warnings": warnings,
        "experiments": len(experiments),
        "approvals": len(answered),
        "campaign_s": campaign_s,
        "drained_s": drained_s,
    }


# ---- the run ----


def row(figure: str, ours: float, base: float) -> str:
    return f"{figure:52} {ours:12.1f} {base:12.1f} {ours / base:7.2f}"


def report_campaign(campaign: dict, interval: float) -> None:
    events, calls = campaign["events"], campaign["calls"]
    n_events = sum(events.values())
    writes = {method: calls.get(method, 0) for method in WRITE_METHODS}
    n_writes, n_http = sum(writes.values()), sum(calls.values())
    print(
        f"\ncampaign: the demo's star-count goal through /goal (outbox interval {interval:g}s): "
        f"{campaign['experiments']} experiments, {campaign['approvals']} approvals by the owner's ✅; "
        f"final report at {campaign['campaign_s']:.0f}s, outbox empty at {campaign['drained_s']:.0f}s"
    )
    print(f"{'count':52} {'n':>12} {'per event':>12}")
    print(f"{'runner events of the goal':52} {n_events:12d} {1:12.2f}")
    print("  " + ", ".join(f"{kind} {count}" for kind, count in events.most_common()))
    for method, count in writes.items():
        print(f"{'Slack writes: ' + method:52} {count:12d} {count / n_events:12.2f}")
    print(f"{'Slack writes: all of the above':52} {n_writes:12d} {n_writes / n_events:12.2f}")
    print(f"{'HTTP requests to Slack (reads, 3 per upload)':52} {n_http:12d} {n_http / n_events:12.2f}")
    print("  " + ", ".join(f"{method} {count}" for method, count in calls.most_common()))
    posts, metrics = writes["chat.postMessage"], events.get("metrics", 0)
    print(f"posts/events = {posts / n_events:.2f}; all writes/events = {n_writes / n_events:.2f}")
    # Metric points are read from a run's log every 0.5 s, so the number of metrics events follows
    # how long the runs took; they never cause a Slack write.
    others = n_events - metrics
    print(
        f"without the {metrics} metrics events: posts/events = {posts / others:.2f}; "
        f"all writes/events = {n_writes / others:.2f}"
    )
    if campaign["failed"] or campaign["warnings"]:
        print(f"  Slack errors: {dict(campaign['failed'])}; fake Slack warnings: {campaign['warnings'][:3]}")


async def main(args: argparse.Namespace) -> None:
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        os.environ.pop(var, None)  # slack_sdk would send even 127.0.0.1 through a proxy
    tally = LogTally()
    logging.getLogger().addHandler(tally)
    began = time.monotonic()
    lines: list[str] = []
    notes: list[str] = []
    campaign = None

    with tempfile.TemporaryDirectory(prefix="gt-bb-") as tmp_name:
        tmp = Path(tmp_name)
        if args.acks:
            ping = await bench_ping(args.acks, args.warmup)
            burst = await bench_goal_acks(tmp, "ack1", args.acks, args.warmup, one_at_a_time=False)
            single = await bench_goal_acks(tmp, "ack2", args.acks, args.warmup, one_at_a_time=True)
            for label, values in (("back to back", burst), ("one at a time", single)):
                for q in (50, 99):
                    lines.append(
                        row(
                            f"/goal ack p{q} (ms), {label}",
                            percentile(values, q) * MS,
                            percentile(ping, q) * MS,
                        )
                    )
            notes.append(
                f"/goal: n={args.acks} per figure after {args.warmup} warm-up commands, agent `sleep 600`, "
                f"outbox interval {DEFAULT_INTERVAL:g}s (default); baseline: a bare AsyncApp whose /ping "
                "listener only acks, back to back, same fake and handler"
            )

        runs = []
        if args.milestones:
            if args.pace <= DEFAULT_INTERVAL:
                raise SystemExit(f"--pace must be above the default outbox interval ({DEFAULT_INTERVAL:g}s)")
            runs.append(
                (f"outbox {DEFAULT_INTERVAL:g}s (default)", DEFAULT_INTERVAL, args.milestones, args.pace)
            )
        if args.fast_milestones:
            runs.append(("outbox 0 (not default)", 0.0, args.fast_milestones, args.fast_pace))
        if runs:
            keydir = tmp / "keys"
            keydir.mkdir()
            box = await SSHBox(keydir, set()).start()
            try:
                for i, (label, interval, n, pace) in enumerate(runs):
                    local = await bench_event_to_post(
                        tmp, f"ev{i}l", box=None, interval=interval, n=n, pace=pace
                    )
                    ssh = await bench_event_to_post(
                        tmp, f"ev{i}s", box=box, interval=interval, n=n, pace=pace
                    )
                    for q in (50, 99):
                        lines.append(
                            row(
                                f"event->post p{q} (ms), SSH/local, {label}",
                                percentile(ssh, q) * MS,
                                percentile(local, q) * MS,
                            )
                        )
                    notes.append(
                        f"event->post, {label}: n={n} milestones {pace:g}s apart; runner event timestamp -> "
                        "the fake receiving chat.postMessage; baseline: the same over a local Unix-socket link"
                    )
            finally:
                await box.stop()

        if args.campaign:
            campaign = await bench_campaign(tmp, args.campaign_interval, args.campaign_timeout)

    print(
        f"bot benchmarks ({os.cpu_count()} cores, Python {sys.version.split()[0]}); p99 of n samples is near their max"
    )
    if lines:
        print(f"{'figure':52} {'goaltender':>12} {'baseline':>12} {'ratio':>7}")
        print("\n".join(lines))
        print("\n".join(notes))
    if campaign is not None:
        report_campaign(campaign, args.campaign_interval)
    problems = Counter(
        f"{r.levelname} {r.name}: {r.getMessage().splitlines()[0][:150]}" for r in tally.records
    )
    print(f"\nlog records at WARNING or above: {len(tally.records)}")
    for text, count in problems.most_common(10):
        print(f"  {count} x {text}")
    print(f"total {time.monotonic() - began:.0f}s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--acks", type=int, default=200, help="slash commands per ack figure (0: skip)")
    parser.add_argument("--warmup", type=int, default=5, help="commands sent first and not counted")
    parser.add_argument(
        "--milestones", type=int, default=20, help="milestones at the default interval (0: skip)"
    )
    parser.add_argument("--pace", type=float, default=1.25, help="seconds between them (above the interval)")
    parser.add_argument("--fast-milestones", type=int, default=100, help="milestones at interval 0 (0: skip)")
    parser.add_argument("--fast-pace", type=float, default=0.1, help="seconds between them")
    parser.add_argument("--campaign", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--campaign-interval", type=float, default=1.0, help="the campaign's outbox interval")
    parser.add_argument("--campaign-timeout", type=float, default=200.0)
    asyncio.run(main(parser.parse_args()))
