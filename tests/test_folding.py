"""One goal cannot flood its channel: posts beyond a goal's rate are folded (runner/folding.py).

Through the real parts: a real runner whose agent floods it over its socket (2,000 milestones, as
fast as one connection goes) and through the real `goaltender` CLI; the real bot on the fake Slack,
with a second goal posting in the same channel; the goal's end and a restart with posts left
folded. And the arithmetic under any arrival times (hypothesis), against a real runner.db.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import sys
from decimal import Decimal
from pathlib import Path

from fake_slack import ALICE, BOB
from helpers import events_until_report, eventually, submit, write_agent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goaltender.bot import mrkdwn, render
from goaltender.protocol import messages as p
from goaltender.runner.folding import GoalPosts, PostRate
from goaltender.storage.records import (
    Budget,
    Event,
    FinalReport,
    GoalStateChanged,
    HubFetched,
    MilestoneReported,
    PostsFolded,
)
from goaltender.storage.runner_store import RunnerStore

FLOOD = 2000
BURST, PER_MINUTE = 10, 6.0  # the runner's defaults, which the flood tests run with

# An agent that floods its goal over one connection (a CLI verb is a process each: too slow to
# flood with), then reports one more milestone through the CLI and keeps what it was told.
FLOOD_AGENT = """
import os, subprocess, sys
from goaltender.protocol.quick_client import Session, socket_from_env

goal = int(os.environ["GOALTENDER_GOAL_ID"])
runner = Session(socket_from_env(), f"agent:flood:{goal}")
for i in range(int(sys.argv[1])):
    runner.call("milestone", "done", goal_id=goal, title=f"step {i}", text="", curves=None)
said = subprocess.run(["goaltender", "milestone", "after the flood", "one more"], capture_output=True, text=True)
with open(os.path.join(os.environ["GOALTENDER_WORKSPACE"], "cli.txt"), "w") as out:
    out.write(f"{said.returncode}\\n{said.stdout}{said.stderr}")
subprocess.run(["sleep", "600"])
"""


def flood_agent(tmp_path: Path, count: int = FLOOD) -> list[str]:
    path = tmp_path / "flood.py"
    path.write_text(FLOOD_AGENT)
    return [sys.executable, str(path), str(count)]


async def goal_events(store: RunnerStore, goal_id: int) -> list[Event]:
    return await store.events_since(0, limit=1_000_000, goal_id=goal_id)


def milestones(events: list[Event]) -> list[tuple[int, MilestoneReported]]:
    return [(e.seq, e.data) for e in events if isinstance(e.data, MilestoneReported)]


def shown(events: list[Event]) -> list[tuple[int, PostsFolded]]:
    return [(e.seq, e.data) for e in events if isinstance(e.data, PostsFolded)]


def assert_each_folded_shown_once(events: list[Event]) -> None:
    """Every folded post is in exactly one PostsFolded, which comes after it; none is in two."""
    folded = [e.seq for e in events if isinstance(e.data, MilestoneReported | HubFetched) and e.data.folded]
    counted: list[int] = []
    for seq, show in shown(events):
        covers = [s for s in folded if show.first_seq <= s <= show.last_seq]
        assert len(covers) == show.count and show.last_seq < seq, (show, covers)
        counted += covers
    assert sorted(counted) == folded  # each once: none left out, none twice


# ---- the arithmetic, under any arrival times ----


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    gaps=st.lists(st.floats(0, 40, allow_nan=False) | st.just(0.0), min_size=1, max_size=60),
    burst=st.integers(1, 12),
    per_minute=st.floats(0.5, 120, allow_nan=False),
    lag=st.floats(0, 5, allow_nan=False),
)
def test_every_milestone_is_posted_or_in_exactly_one_fold(tmp_path_factory, gaps, burst, per_minute, lag):
    """Milestones arriving at any times, against a goal's rate, and the wait for a token waking up
    to `lag` seconds late: each milestone is either posted or folded and then counted in exactly
    one PostsFolded (written to a real runner.db); none is lost, the thread keeps their order, and
    it never gets more posts than the bucket allows (`burst`, then `per_minute`)."""
    db = tmp_path_factory.mktemp("fold") / "runner.db"
    asyncio.run(_arrivals(db, list(itertools.accumulate(gaps)), burst, per_minute, lag))


async def _arrivals(db: Path, times: list[float], burst: int, per_minute: float, lag: float) -> None:
    store = await RunnerStore.open(db)
    try:
        goal = await store.create_goal(
            text="flood",
            owner="t",
            agent="a",
            budget=Budget(),
            metric=None,
            direction="maximize",
            target=None,
            workspace_root=db.parent,
        )
        posts = GoalPosts(PostRate.full(burst, per_minute, 0.0))
        posted_at: list[float] = []  # when the thread got a post: a milestone of its own, or a fold
        wake: float | None = None  # when Folding's wait for a token next looks

        async def wait_until(until: float) -> None:
            """What Folding's wait does until then: looks when a token is due (waking `lag` late,
            so that a milestone may come first and find the token), and shows the folded posts."""
            nonlocal wake
            while wake is not None and wake <= until:
                if posts.show_due(wake):
                    assert await store.show_folded(goal.id) is not None
                    posted_at.append(wake)
                    wake = None
                else:
                    wake += posts.wait(wake) + lag

        for i, at in enumerate(times):
            await wait_until(at)
            milestone = MilestoneReported(title=f"m{i}")
            if posts.arrive(at):
                posted_at.append(at)
            else:
                milestone = milestone.model_copy(update={"folded": True})
                wake = at + posts.wait(at) + lag if wake is None else wake
            await store.append_event(goal.id, milestone)
        await wait_until(math.inf)

        events = await goal_events(store, goal.id)
        assert [m.title for _, m in milestones(events)] == [f"m{i}" for i in range(len(times))]
        assert_each_folded_shown_once(events)
        assert not posts.folded_waiting and await store.folded_unshown(goal.id) == 0
        # Folded ones wait for their fold: the thread keeps their order.
        for _, show in shown(events):
            assert all(m.folded for s, m in milestones(events) if show.first_seq <= s <= show.last_seq)
        assert sum(not m.folded for _, m in milestones(events)) + len(shown(events)) == len(posted_at)
        for i, j in itertools.combinations(range(len(posted_at)), 2):
            allowed = burst + (posted_at[j] - posted_at[i]) * per_minute / 60
            assert j - i + 1 <= allowed + 1e-6, (posted_at[i], posted_at[j])
    finally:
        await store.close()


def test_a_fold_names_the_first_and_latest_titles_and_fits_slack():
    """A PostsFolded of thousands, with long titles: one post within Slack's section limit, the
    first and the latest named, the count right, and the cut said."""
    fold = PostsFolded(
        milestones=1990,
        fetches=1,
        first_seq=13,
        last_seq=2003,
        titles=[f"step {i} " + "x" * 400 for i in range(25)],
        latest_titles=[f"step {i} <!channel> & co" for i in range(1965, 1990)],
    )
    post = render.posts_folded(fold)
    text = json.dumps(post, ensure_ascii=False)
    assert post["text"].startswith("1,990 milestones and 1 fetch folded")
    assert all(
        len(block["text"]["text"]) <= mrkdwn.SECTION_MAX for block in post["blocks"] if "text" in block
    )
    assert "step 0 x" in text and "step 1989 &lt;!channel&gt; &amp; co" in text and "<!channel>" not in text
    assert "more …" in text and "Titles cut to fit Slack" in text and "events 13–2003" in text


# ---- the real runner, flooded ----


async def test_a_flood_of_milestones_is_folded_and_nothing_is_lost(start_runner, connect, tmp_path):
    """2,000 milestones in a burst: each is taken (the CLI's is answered `folded`, exit 0) and
    logged whole; the thread gets the burst and then folds, each milestone posted or in exactly
    one fold, and no more posts than the rate allows."""
    runner = await start_runner(agents={"flood": flood_agent(tmp_path)}, default_agent="flood")
    client = await connect(runner)
    goal_id = await submit(client, "flood the thread, max 1 experiments")
    cli = runner.settings.workspaces / f"goal-{goal_id}" / "cli.txt"
    await eventually(cli.exists, timeout=120)
    code, said = cli.read_text().split("\n", 1)
    assert code == "0" and said.startswith("milestone logged (event ") and "; folded: goal #" in said, said

    async def all_shown() -> list[Event] | None:
        events = await goal_events(runner.store, goal_id)
        return (
            events
            if len(milestones(events)) == FLOOD + 1
            and shown(events)
            and not (await runner.store.folded_unshown(goal_id))
            else None
        )

    events = await eventually(all_shown, timeout=60)
    titles = [m.title for _, m in milestones(events)]
    assert titles == [f"step {i}" for i in range(FLOOD)] + ["after the flood"]  # each once, in order
    assert_each_folded_shown_once(events)
    posted = [e for e in events if isinstance(e.data, MilestoneReported) and not e.data.folded]
    posted += [e for e in events if isinstance(e.data, PostsFolded)]
    assert BURST <= len(posted) <= BURST + token_count(posted) + 1, [e.data for e in posted]
    assert sum(fold.milestones for _, fold in shown(events)) >= FLOOD + 1 - len(posted)
    print(f"\n{FLOOD + 1} milestones: {len(posted)} posts in the thread ({len(shown(events))} of them folds)")


def token_count(posted: list[Event]) -> float:
    """Tokens a goal's bucket gains over the time its posts span."""
    return (posted[-1].ts - posted[0].ts).total_seconds() * PER_MINUTE / 60


async def test_folded_milestones_are_shown_before_the_goal_ends(start_runner, connect, tmp_path):
    """A goal stopped while milestones wait folded (its rate would show them in days): they are
    shown at once, before its end and its report."""
    agent = write_agent(
        tmp_path, "a.sh", 'for i in 1 2 3 4 5; do goaltender milestone "m$i" || exit 1; done\nsleep 600\n'
    )
    runner = await start_runner(agents={"a": agent}, milestone_burst=2, milestones_per_minute=0.001)
    client = await connect(runner)
    goal_id = await submit(client, "post five, max 1 experiments", agent="a")
    await eventually(lambda: _logged(runner.store, goal_id, 5), timeout=60)
    await client.request(p.Stop(goal_id=goal_id, by="ana"))
    events = await events_until_report(client, goal_id)

    [(seq, fold)] = shown(events)
    assert (fold.milestones, fold.titles) == (3, ["m3", "m4", "m5"])
    stopped = next(
        e.seq for e in events if isinstance(e.data, GoalStateChanged) and e.data.state == "stopped"
    )
    report = next(e.seq for e in events if isinstance(e.data, FinalReport))
    assert seq < stopped < report
    assert_each_folded_shown_once(events)


async def _logged(store: RunnerStore, goal_id: int, count: int) -> bool:
    return len(milestones(await goal_events(store, goal_id))) >= count


async def test_milestones_left_folded_by_a_restart_are_shown_after_it(start_runner, connect, tmp_path):
    """The runner stops while folded milestones wait to be shown: the next start shows them (the
    rate is in memory; what was folded is in the log)."""
    agent = write_agent(
        tmp_path,
        "a.sh",
        # Once: the agent is started again on the restart.
        '[ -e posted ] || { for i in 1 2 3; do goaltender milestone "m$i"; done; touch posted; }\n'
        "sleep 600\n",
    )
    settings = {"agents": {"a": agent}, "milestone_burst": 1, "milestones_per_minute": 0.001}
    runner = await start_runner(**settings)
    client = await connect(runner)
    goal_id = await submit(client, "post three, max 1 experiments", agent="a")
    await eventually(lambda: _logged(runner.store, goal_id, 3), timeout=60)
    assert not shown(await goal_events(runner.store, goal_id))
    await client.close()
    await runner.close()

    runner = await start_runner(**settings)

    async def shown_now() -> list[tuple[int, PostsFolded]]:
        return shown(await goal_events(runner.store, goal_id))

    [(_, fold)] = await eventually(shown_now, timeout=30)
    assert (fold.milestones, fold.titles) == (2, ["m2", "m3"])
    assert_each_folded_shown_once(await goal_events(runner.store, goal_id))


# ---- in Slack: the flood does not hold up the channel ----


async def test_a_flooding_goal_does_not_hold_up_another_goals_posts(fake, make_bot, start_runner, tmp_path):
    """Goal A floods 2,000 milestones; goal B, in the same channel, then posts one. B's card and
    milestone are in Slack behind at most A's burst (and the folds the rate allowed by then), not
    behind 2,000 posts; A's thread ends with the burst and posts saying `N milestones folded`,
    N adding up to all the others."""
    news = write_agent(tmp_path, "news.sh", 'goaltender milestone "news from B" "B is fine"\nsleep 600\n')
    runner = await start_runner(
        agents={"flood": flood_agent(tmp_path), "news-agent": news}, default_agent="flood"
    )
    await make_bot(runner.settings.socket_path)
    general = fake.general

    await fake.slash_command("/goal", "flood the thread, max 1 experiments", general, ALICE)
    card_a = await fake.wait_for_message(general, text="Goal #1", timeout=20)
    cli = runner.settings.workspaces / "goal-1" / "cli.txt"
    await eventually(cli.exists, timeout=120)  # all of A's milestones are in the log

    await fake.slash_command("/goal", "say hello, max 1 experiments with news-agent", general, BOB)
    card_b = await fake.wait_for_message(general, text="Goal #2", timeout=60)
    news_b = await fake.wait_for_message(general, thread_ts=card_b.ts, text="news from B", timeout=60)

    events = await goal_events(runner.store, 1)
    news_seq = next(
        e.seq for e in await goal_events(runner.store, 2) if isinstance(e.data, MilestoneReported)
    )
    folds_before = sum(seq < news_seq for seq, _ in shown(events))
    a_before = [m for m in fake.messages(general, card_a.ts) if _ts(m.ts) < _ts(news_b.ts)]
    assert len(a_before) <= BURST + folds_before, [m.text for m in a_before]

    # A's thread: the burst, then its folds, which count every other milestone.
    async def folds_in_slack() -> list[int] | None:
        events = await goal_events(runner.store, 1)
        if await runner.store.folded_unshown(1) or not shown(events):
            return None
        said = [_folded_count(m) for m in fake.messages(general, card_a.ts)]
        return (
            [n for n in said if n is not None] if said.count(None) + len(shown(events)) == len(said) else None
        )

    counts = await fake.wait_for(folds_in_slack, 60, what="A's folds in its thread")
    events = await goal_events(runner.store, 1)
    folded = sum(m.folded for _, m in milestones(events))
    posted = [m for _, m in milestones(events) if not m.folded]
    assert sum(counts) == folded == FLOOD + 1 - len(posted)
    assert len(fake.messages(general, card_a.ts)) == len(posted) + len(counts)
    print(
        f"\nA: {FLOOD + 1} milestones -> {len(posted)} posts + {len(counts)} fold(s) {counts}; "
        f"B's milestone in Slack after {len(a_before)} of A's posts"
    )


def _ts(ts: str) -> Decimal:
    return Decimal(ts)


def _folded_count(message) -> int | None:
    """N of an `N milestones folded` post; None for any other post."""
    found = re.search(r"([\d,]+) milestones? folded", message.text)
    return int(found[1].replace(",", "")) if found else None


async def test_an_agent_cannot_flood_its_channel_with_questions(start_runner, connect, tmp_path):
    """Approval prompts are never folded, so an agent's questions are bounded instead: past
    WAITING_QUESTIONS (5) waiting at once, one more is refused (exit 4) saying why."""
    script = 'for i in $(seq 8); do (goaltender ask "may I do $i?" --timeout 1h > ask-$i.out 2>&1; echo $? > ask-$i.rc) & done\nwait\n'
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)})
    client = await connect(runner)
    goal = await submit(client, "ask a lot, max 1 experiments", agent="a")
    workspace = Path((await runner.store.get_goal(goal)).workspace)

    def refused() -> list[Path]:
        return [rc for rc in workspace.glob("ask-*.rc") if rc.read_text().strip() == "4"]

    await eventually(lambda: len(refused()) == 3, timeout=60)
    pending = await runner.store.pending_approvals(goal)
    assert len(pending) == 5
    said = refused()[0].with_suffix(".out").read_text()
    assert "has 5 questions waiting for people already" in said and "wait for their answers" in said
    await client.request(p.Stop(goal_id=goal, by="ana"))
