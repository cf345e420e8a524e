"""The runner daemon end to end: real socket, real SQLite, real agent and experiment processes."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers import BIN, approval_prompts, events_until_report, eventually, submit, write_agent

from goaltender import cli
from goaltender.protocol import messages as p
from goaltender.runner import server
from goaltender.runner.supervisor import MAX_SUMMARY, group_members
from goaltender.storage import db as db_module
from goaltender.storage.records import Budget, Event, ExperimentStarted, MilestoneReported, utcnow


def kinds(events):
    return [e.data.kind for e in events]


AGENT = """
goaltender milestone "Plan" "baseline, then two ideas"
goaltender experiment -d "baseline" --param lr=0.1 --metric acc -- \
    python -c 'import json; print(json.dumps({"step": 1, "loss": 0.9})); print("acc: 0.50")'
echo "baseline rc=$?" >> agent.out
goaltender experiment -d "worse idea" --param lr=1.0 --metric acc -- python -c 'print("acc: 0.40")'
goaltender experiment -d "broken idea" --param lr=9 -- python -c 'raise SystemExit(3)'
echo "crash rc=$?" >> agent.out
goaltender ask "Run the big one?" --detail "~2 GPU-hours" --kind cost
echo "ask rc=$?" >> agent.out
goaltender inbox >> agent.out
goaltender diary write "handoff: best lr=0.1" --handoff
goaltender diary read --handoff >> agent.out
goaltender report "lr=0.1 is best; try warmup next."
"""


async def test_goal_life_with_a_script_agent(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"script": write_agent(tmp_path, "agent.sh", AGENT)})
    client = await connect(runner)
    goal_id = await submit(client, "find a good lr, max 5 experiments", owner="ana", agent="script")

    async def answer_approvals():
        watcher = await connect(runner, "watcher")
        async for approval in approval_prompts(watcher, goal_id):
            await watcher.request(p.Steer(goal_id=goal_id, text="also try warmup", author="bob"))
            decided = await watcher.request(p.Decide(approval_id=approval.id, approve=True, by="ana"))
            assert decided.approval.state == "approved"
            with pytest.raises(p.ProtocolError, match="already approved by ana"):
                await watcher.request(p.Decide(approval_id=approval.id, approve=False, by="bob"))
            return

    answering = asyncio.ensure_future(answer_approvals())
    events = await events_until_report(client, goal_id)
    await answering

    assert kinds(events)[:3] == ["goal_accepted", "goal_state", "milestone"]
    assert kinds(events)[-2:] == ["goal_state", "report"]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert [(e.index, e.status) for e in summary.ledger] == [(1, "keep"), (2, "discard"), (3, "crash")]
    assert summary.ledger[0].metric_value == 0.5 and summary.ledger[0].params == {"lr": 0.1}
    assert summary.ledger[2].note == "exit code 3"
    assert summary.status.goal.state == "finished"
    assert summary.status.best.index == 1
    series = await client.request(p.GetSeries(goal_id=goal_id, name="loss"))
    assert series.points == [(1.0, 0.9)]

    out = (Path(summary.status.goal.workspace) / "agent.out").read_text()
    assert "baseline rc=0" in out and "crash rc=1" in out and "ask rc=0" in out
    assert f"bob via watcher (uid {os.getuid()}): also try warmup" in out  # as the runner saw bob's client
    assert "handoff: best lr=0.1" in out
    report = events[-1].data
    assert report.best.index == 1
    assert "| 2 | discard | 0.4 (reported) |" in report.text
    assert "try warmup next" in report.text

    # A finished goal takes no more steering, and says why.
    with pytest.raises(p.ProtocolError, match=r"goal #1 is finished \(the agent finished\)"):
        await client.request(p.Steer(goal_id=goal_id, text="one more?"))


async def test_the_stop_status_counts_the_target_and_stops_with_the_goal(start_runner, connect, tmp_path):
    """A best run at the goal's target meets its stop rule (it said "not yet met" then, beside a
    report saying "reached")."""
    agent = write_agent(
        tmp_path,
        "a.sh",
        "goaltender experiment -d base --metric acc -- python -c 'print(\"acc: 0.96\")' > said\n",
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "reach 95% acc, budget 1h, max 5 experiments", agent="a")
    report = (await events_until_report(client, goal_id))[-1].data
    workspace = Path((await client.request(p.Summary(goal_id=goal_id))).status.goal.workspace)
    assert "stop condition met (target): 1/5 attempted, " in (workspace / "said").read_text()
    [line] = [line for line in report.text.splitlines() if line.startswith("**Stop status:**")]
    assert line.startswith("**Stop status:** stop condition met (target): 1/5 attempted, ")

    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    assert status.stop_status == line.removeprefix("**Stop status:** ")  # as it ended, not as of now


BIG_OUTPUT_AGENT = """
goaltender experiment -d chatty --metric acc -- python -c '
import json
for i in range(60000): print(f"example_{i}_score: 1")
for i in range(40000): print(json.dumps({"step": i, "loss": 1 / (i + 1), "grad_norm": 0.5}))
print("acc: 0.75")'
echo "experiment rc=$?" > rc
goaltender milestone "after the chatty run"
"""


async def test_a_run_that_prints_a_lot_stalls_no_subscriber(start_runner, connect, tmp_path):
    """60k summary lines and 40k metric lines made a 2.4 MB experiment_finished event and a 2.7 MB
    metrics event: every client hung up on the line, the agent's own call failed, subscribers (the
    bot) stalled there for good. The run's summary keeps its latest lines, metrics go in events
    of a bounded size, and nothing over a line's limit is sent."""
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", BIG_OUTPUT_AGENT)})
    client = await connect(runner)
    goal_id = await submit(client, "chatty, max 1 experiments", agent="a")
    events = await events_until_report(client, goal_id)
    assert any(e.data.kind == "milestone" and e.data.title == "after the chatty run" for e in events)
    summary = await client.request(p.Summary(goal_id=goal_id))
    [row] = summary.ledger
    assert (
        row.metric_value == 0.75 and len(row.metrics) <= MAX_SUMMARY and "example_59999_score" in row.metrics
    )
    assert (Path(summary.status.goal.workspace) / "rc").read_text().strip() == "experiment rc=0"
    logged = [e for e in events if e.data.kind == "metrics"]
    assert sum(len(e.data.points) for e in logged) == 80000 and len(logged) > 1
    series = await client.request(p.GetSeries(goal_id=goal_id, name="loss"))
    assert len(series.points) == p.MAX_SERIES_POINTS  # thinned evenly, first and last kept
    assert series.points[0] == (0.0, 1.0) and series.points[-1] == (39999.0, 1 / 40000)
    assert [step for step, _ in series.points] == sorted(step for step, _ in series.points)


async def test_a_database_locked_by_another_process_holds_writes_up_not_goals(
    start_runner, connect, tmp_path, monkeypatch, caplog
):
    """Another process held a write on runner.db past the busy timeout: the run's entry failed,
    and its goal was left running with no agent. The write waits for the lock and is tried again."""
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_MS", 100)
    script = "while [ ! -e go ]; do sleep 0.05; done\n"
    script += "goaltender experiment -d one --metric acc -- python -c 'print(\"acc: 0.5\")'\n"
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)})
    client = await connect(runner)
    goal_id = await submit(client, "locked out, max 1 experiments", agent="a")
    workspace = Path((await client.request(p.Status(goal_id=goal_id))).goals[0].goal.workspace)
    holder = sqlite3.connect(runner.settings.db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # as an operator's sqlite3 shell might, while the run goes on
    with caplog.at_level(logging.WARNING, logger="goaltender.storage"):
        (workspace / "go").touch()
        await eventually(lambda: "runner.db is locked by another process" in caplog.text)
    holder.execute("COMMIT")
    holder.close()
    await events_until_report(client, goal_id)
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "finished"
    assert [(e.status, e.metric_value) for e in summary.ledger] == [("keep", 0.5)]


async def test_per_experiment_timeout_is_a_crash_row(start_runner, connect, tmp_path):
    agent = write_agent(
        tmp_path, "a.sh", "goaltender experiment -d slow --metric acc -- sleep 60\necho rc=$? > rc\n"
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "slow, max 2 experiments, 1s each", agent="a")
    await events_until_report(client, goal_id)
    [row] = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert row.status == "crash" and row.note == "timeout after 1s"
    assert row.wall_seconds < 10
    ws = Path((await client.request(p.Summary(goal_id=goal_id))).status.goal.workspace)
    assert (ws / "rc").read_text().strip() == "rc=1"


async def test_stop_ends_agent_and_experiments_with_no_orphans(start_runner, connect, tmp_path):
    agent = write_agent(
        tmp_path,
        "a.sh",
        # The agent leaves a stray child of its own, and its experiment forks a grandchild.
        "sleep 300 &\ngoaltender experiment -d forever -- bash -c 'sleep 300 & sleep 300; wait'\n",
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "run forever, max 3 experiments", agent="a")

    async def running_experiment():
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        return status.running if status.running and status.running.pid else None

    experiment = await eventually(running_experiment)
    await eventually(lambda: len(group_members(experiment.pid)) >= 3)
    agent_pid = (await runner.store.get_goal(goal_id)).agent_pid
    assert group_members(agent_pid)

    done = await client.request(p.Stop(goal_id=goal_id, by="ana", reason="enough"))
    stopped = f"stopped by ana via test (uid {os.getuid()}): enough"
    assert stopped in done.message

    assert group_members(experiment.pid) == []
    assert group_members(agent_pid) == []
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "stopped"
    [row] = summary.ledger
    assert row.status == "crash" and row.note == f"ended with the goal: {stopped}"
    events = await events_until_report(client, goal_id, timeout=5)
    assert events[-1].data.end_reason == stopped


async def test_stop_ends_what_the_agent_started_in_groups_of_its_own(start_runner, connect, tmp_path):
    """An agent may run each command in a process group of its own (the built-in agent does, to
    end one command at a time); stopping the goal still ends them, even when the agent ignores
    SIGTERM and has to be killed."""
    agent = write_agent(
        tmp_path,
        "a.sh",
        # `set -m`: each background job gets a process group of its own, in the agent's session.
        "set -m\ntrap '' TERM\nsleep 301 &\nwhile true; do sleep 1; done\n",
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "hold on, max 1 experiments", agent="a")
    agent_pid = (await runner.store.get_goal(goal_id)).agent_pid

    def the_job() -> int | None:  # seen from here: the sandbox has pids of its own
        return next((pid for pid in group_members(agent_pid) if _cmdline(pid) == ["sleep", "301"]), None)

    job = await eventually(the_job)
    assert os.getpgid(job) != agent_pid and os.getsid(job) == agent_pid

    await client.request(p.Stop(goal_id=goal_id, by="ana", reason="enough"))
    assert group_members(agent_pid) == []
    assert not psutil.pid_exists(job) or psutil.Process(job).status() == psutil.STATUS_ZOMBIE


async def test_default_stop_rule_asks_before_going_on(start_runner, connect, tmp_path):
    agent = write_agent(
        tmp_path,
        "a.sh",
        "for i in 1 2 3 4 5; do goaltender experiment -d run$i -- true; echo $? >> rcs; done\n",
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "improve it", agent="a")  # no stop rule at all

    async def reject_continue():
        watcher = await connect(runner, "watcher")
        async for approval in approval_prompts(watcher, goal_id):
            assert approval.kind == "continue" and "4/4 attempted" in approval.question
            await watcher.request(p.Decide(approval_id=approval.id, approve=False, by="ana"))
            return

    rejecting = asyncio.ensure_future(reject_continue())
    await events_until_report(client, goal_id)
    await rejecting
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert len(summary.ledger) == 4
    rcs = (Path(summary.status.goal.workspace) / "rcs").read_text().split()
    assert rcs == ["0", "0", "0", "0", "5"]  # the fifth was refused: budget used up


async def test_deadline_ends_the_goal(start_runner, connect, tmp_path):
    agent = write_agent(tmp_path, "a.sh", "goaltender experiment -d long -- sleep 60\nsleep 60\n")
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "quick one, budget 2s", agent="a")
    events = await events_until_report(client, goal_id)
    assert events[-1].data.end_reason == "deadline reached"
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "finished"
    assert summary.ledger[0].status == "crash"


async def test_pause_holds_new_experiments_until_resume(start_runner, connect, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="goaltender.runner")
    # The agent asks for its experiment once the goal is paused: the test leaves `paused` for it.
    agent = write_agent(
        tmp_path,
        "a.sh",
        "until [ -e paused ]; do sleep 0.05; done\ngoaltender experiment -d after-pause -- true\n",
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "pausable, max 2 experiments", agent="a")
    await client.request(p.Pause(goal_id=goal_id, by="ana"))
    (Path((await runner.store.get_goal(goal_id)).workspace) / "paused").touch()
    await eventually(lambda: f"goal #{goal_id} is paused: its next experiment waits" in caplog.text)
    assert (await client.request(p.Summary(goal_id=goal_id))).ledger == []
    await client.request(p.Resume(goal_id=goal_id, by="ana"))
    events = await events_until_report(client, goal_id)
    states = [(e.seq, e.data.state) for e in events if e.data.kind == "goal_state"]
    started = next(e.seq for e in events if isinstance(e.data, ExperimentStarted))
    resumed = next(seq for seq, state in states if state == "running" and seq > states[1][0])
    assert ("paused" in [s for _, s in states]) and started > resumed


async def test_with_names_any_configured_agent(start_runner, connect, tmp_path):
    """`with staged` used to run the default sweep: only built-in names and `<name>-agent` were read."""
    agent = write_agent(tmp_path, "a.sh", "sleep 30\n")
    runner = await start_runner(agents={"sweep": agent, "staged": agent, "openai": agent})
    client = await connect(runner)
    goal = await client.request(p.SubmitGoal(text="tune lr with warmup, with staged, max 1 experiments"))
    assert goal.status.goal.agent == "staged"  # `with warmup` names no agent and is passed over
    plain = await client.request(p.SubmitGoal(text="tune lr with warmup, max 1 experiments"))
    assert plain.status.goal.agent == "sweep"
    with pytest.raises(
        p.ProtocolError, match="unknown agent 'mine-agent'; this runner has: sweep, staged, openai"
    ):
        await client.request(p.SubmitGoal(text="x with mine-agent, max 1 experiments"))
    # A staged goal needs an agent that can pass its gates: never the sweep.
    with pytest.raises(p.ProtocolError, match="a staged goal needs an agent that can do each stage's work"):
        await client.request(p.SubmitGoal(text="implement OAPL, max 2 experiments, stages: plan, campaign"))
    staged = await client.request(
        p.SubmitGoal(text="implement OAPL with openai, max 2 experiments, stages: plan, campaign")
    )
    assert staged.status.goal.stages == ["plan", "campaign"]
    # The list of stages ends where the budget's words begin.
    both = await client.request(
        p.SubmitGoal(text="implement OAPL, stages: plan, campaign, max 2 experiments, with openai")
    )
    assert both.status.goal.stages == ["plan", "campaign"] and both.status.goal.budget.max_experiments == 2


async def test_steer_can_change_the_budget(start_runner, connect, tmp_path):
    agent = write_agent(tmp_path, "a.sh", "sleep 30\n")
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "anything, max 2 experiments", agent="a")
    done = await client.request(p.Steer(goal_id=goal_id, text="max 6 experiments", author="ana"))
    assert "budget changed: max experiments 6" in done.message
    goal = (await client.request(p.Status(goal_id=goal_id))).goals[0].goal
    assert goal.budget.max_experiments == 6
    with pytest.raises(p.ProtocolError, match="no budget in"):
        await client.request(p.ChangeBudget(goal_id=goal_id, change="more please"))
    with pytest.raises(p.ProtocolError, match="unknown agent 'nope'"):
        await client.request(p.SubmitGoal(text="x", agent="nope"))
    with pytest.raises(p.ProtocolError, match="a budget or limit is never negative"):
        await client.request(p.ChangeBudget(goal_id=goal_id, change="budget -1h"))
    with pytest.raises(p.ProtocolError, match="a goal needs words"):
        await client.request(p.SubmitGoal(text=" \n ", agent="a"))
    assert len((await client.request(p.Status())).goals) == 1  # none made
    # The model the runner reads refuses it before it is sent, as the runner would, in one line.
    with pytest.raises(
        p.ProtocolError, match=r"^bad_request: invalid steer: text: is blank: it must say something$"
    ):
        await client.request(p.Steer(goal_id=goal_id, text=" \n\t", author="ana"))
    stopped = await client.request(p.Stop(goal_id=goal_id, reason="   "))
    assert re.fullmatch(r"goal #\d+ stopped by [^:]+; final report written", stopped.message), stopped.message


def test_cli_help_for_every_verb(capsys):
    # The console script itself, once; every verb's help in-process (a cold start each is slow).
    out = subprocess.run([os.path.join(BIN, "goaltender"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "goaltender demo" in out.stdout
    verbs = [
        "runner",
        "bot",
        "demo",
        "submit",
        "status",
        "summary",
        "steer",
        "budget",
        "pause",
        "resume",
        "stop",
        "approve",
        "reject",
        "events",
        "log",
        "milestone",
        "metrics",
        "experiment",
        "ask",
        "inbox",
        "diary",
        "report",
    ]
    for verb in verbs:
        assert f"    {verb}" in out.stdout
        with pytest.raises(SystemExit) as helped:
            cli.main([verb, "--help"])
        assert helped.value.code == 0 and "exit codes" in capsys.readouterr().out, verb


def test_cli_without_runner_says_how_to_start_one(tmp_path):
    env = {**os.environ, "GOALTENDER_SOCKET": str(tmp_path / "none.sock"), "GOALTENDER_GOAL_ID": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "goaltender.cli", "milestone", "hi"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 4
    assert "no runner is listening" in out.stderr and "goaltender runner" in out.stderr


async def test_ack_records_the_clients_position(start_runner, connect):
    runner = await start_runner()
    client = await connect(runner, "bot")
    await client.request(p.Ack(seq=7))
    await client.request(p.Ack(seq=3))  # never moves backwards
    assert await runner.store.cursor("bot") == 7


VERIFY_AGENT = """
goaltender experiment -d "reported only" --metric acc -- python -c 'print("acc: 0.99")'
goaltender experiment -d "verified" --metric acc --eval "python -c 'import os; print(\\"acc: 0.61\\"); print(os.environ[\\"GOALTENDER_EXPERIMENT_DIR\\"].endswith(\\"002\\") * 1)'" -- \
    python -c 'print("acc: 0.99")'
goaltender experiment -d "eval breaks" --metric acc --eval "python -c 'raise SystemExit(2)'" -- python -c 'print("acc: 0.99")'
"""


async def test_the_runner_measures_the_headline_with_the_eval_command(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"v": write_agent(tmp_path, "v.sh", VERIFY_AGENT)})
    client = await connect(runner)
    goal_id = await submit(client, "verify me, max 3 experiments", agent="v")
    events = await events_until_report(client, goal_id)
    reported, verified, broken = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert reported.metric_value == 0.99 and not reported.verified
    # The run claimed 0.99; the runner's own evaluation says 0.61, and that is the headline.
    assert verified.metric_value == 0.61 and verified.verified
    assert verified.metrics["run/acc"] == 0.99 and verified.metrics["acc"] == 0.61
    assert (Path(verified.log_path).parent / "eval.log").read_text().strip().endswith("1")
    assert broken.status == "crash" and broken.note == "eval: exit code 2" and not broken.verified
    report = events[-1].data.text
    assert "| 1 | keep | 0.99 (reported) |" in report and "| 2 | discard | 0.61 |" in report


async def test_many_live_agents_do_not_starve_experiments(start_runner, connect, tmp_path):
    """Waiting for a child holds no thread: more live agents than the default executor has threads
    (min(32, cores + 4)) still leave room for a new goal's experiment to finish."""
    idle = write_agent(tmp_path, "idle.sh", "sleep 120\n")
    quick = write_agent(
        tmp_path,
        "quick.sh",
        """goaltender experiment -d only --metric acc -- python -c 'print("acc: 0.5")'
goaltender report "done"
""",
    )
    runner = await start_runner(agents={"idle": idle, "quick": quick}, default_agent="idle")
    client = await connect(runner)
    for i in range(min(32, (os.cpu_count() or 1) + 4) + 1):
        await submit(client, f"idle {i}", agent="idle")
    goal_id = await submit(client, "one quick experiment", agent="quick")
    events = await events_until_report(client, goal_id, timeout=90)
    finished = [e.data for e in events if e.data.kind == "experiment_finished"]
    assert [f.experiment.metric_value for f in finished] == [0.5]


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


async def test_a_replay_is_whole_and_in_order_across_batches(start_runner, connect, monkeypatch):
    monkeypatch.setattr(server, "STREAM_BATCH", 7)
    runner = await start_runner()
    for i in range(30):
        await runner.store.append_event(None, MilestoneReported(title=f"m{i}"))
    head = await runner.store.head_seq()
    since = 10  # inside the second batch of 7
    client = await connect(runner)
    assert await client.subscribe(since=since) == head
    seen = []
    async for event in client.events():
        seen.append(event.seq)
        if event.seq >= head:
            break
    assert seen == list(range(since + 1, head + 1))


async def test_active_only_status_among_many_finished_goals(start_runner, connect, tmp_path):
    runner = await start_runner()
    goals = [
        await runner.store.create_goal(
            text=f"g{i}",
            owner="ana",
            agent="sweep",
            budget=Budget(),
            metric=None,
            direction="maximize",
            target=None,
            workspace_root=tmp_path / "ws",
        )
        for i in range(25)
    ]
    for goal in goals[:-2]:
        await runner.store.set_goal_state(goal.id, "finished", "done")
    client = await connect(runner)
    reply = await client.request(p.Status(active_only=True))
    assert [s.goal.id for s in reply.goals] == [g.id for g in goals[-2:]]
    assert all(s.attempted == 0 and s.best is None for s in reply.goals)
    assert len((await client.request(p.Status())).goals) == 25


def test_a_line_too_long_for_any_client_is_never_sent():
    """An event over MAX_LINE goes as what it was (its seq, goal, time, kind), so a subscriber
    moves past it; a reply over it as an error saying why, to the request that asked."""
    conn = server._Connection(reader=None, writer=None, redactor=server.Redactor())  # type: ignore[arg-type]
    huge = MilestoneReported(title="big", text="x" * (p.MAX_LINE + 10))
    event = Event(seq=7, goal_id=1, ts=utcnow(), data=huge)
    for line in (
        conn._line(p.EventMessage(event=event)),
        *conn._event_lines([event.model_dump_json().encode()]),
    ):
        assert len(line) <= p.MAX_LINE
        reply = p.parse_reply(line)
        [sent] = reply.events if isinstance(reply, p.EventBatch) else [reply.event]
        assert (sent.seq, sent.goal_id, sent.data.kind, sent.data.stored_kind) == (
            7,
            1,
            "unreadable",
            "milestone",
        )
        assert "over the 1048576 a line may hold" in sent.data.reason
    points = [(float(i), 0.5) for i in range(p.MAX_LINE // 8)]
    error = p.parse_reply(conn._line(p.SeriesReply(id=42, name="loss", points=points)))
    assert isinstance(error, p.Error) and error.id == 42 and "the series reply would be" in error.message


async def test_a_goal_whose_budget_does_not_read_back_is_blocked_not_the_runner(
    start_runner, connect, tmp_path
):
    """A row edited by hand (its budget's max_experiments "lots") stopped the runner at start with a
    traceback, every other goal with it. Now that goal is blocked until its budget is set again."""
    script = "while [ ! -e go ]; do sleep 0.05; done\ngoaltender experiment -d one -- true; echo rc=$? > rc\nsleep 60\n"
    agents = {"a": write_agent(tmp_path, "a.sh", script)}
    runner = await start_runner(agents=agents)
    client = await connect(runner)
    goal_id = await submit(client, "edited, max 3 experiments", agent="a")
    other = await submit(client, "untouched, max 3 experiments", agent="a")
    await runner.close()
    with sqlite3.connect(runner.settings.db_path) as db:
        db.execute("UPDATE goals SET budget = ? WHERE id = ?", ('{"max_experiments": "lots"}', goal_id))
    runner = await start_runner(agents=agents)
    client = await connect(runner)
    [status] = (await client.request(p.Status(goal_id=goal_id))).goals
    assert status.goal.blocked.startswith("its budget in runner.db does not read back (max_experiments: ")
    assert (await client.request(p.Status(goal_id=other))).goals[0].goal.blocked is None
    workspace = Path(status.goal.workspace)
    (workspace / "go").touch()
    assert (
        await eventually(lambda: (workspace / "rc").exists() and (workspace / "rc").read_text())
    ) == "rc=4\n"
    await client.request(p.ChangeBudget(goal_id=goal_id, change="max 5 experiments"))
    [status] = (await client.request(p.Status(goal_id=goal_id))).goals
    assert status.goal.blocked is None and status.goal.budget.max_experiments == 5


async def test_a_submission_sent_again_under_its_key_gets_the_goal_it_made(start_runner, connect, tmp_path):
    """A client whose link dropped before the reply cannot know whether its goal was made: sent
    again under the same key (per user) it gets that goal, and no second one starts."""
    runner = await start_runner(agents={"idle": write_agent(tmp_path, "idle.sh", "sleep 60\n")})
    client = await connect(runner)
    fields = {"text": "once only, max 1 experiments", "agent": "idle", "key": "slack-goal-1"}
    first, again = await asyncio.gather(
        client.request(p.SubmitGoal(**fields)), client.request(p.SubmitGoal(**fields))
    )
    later = await client.request(p.SubmitGoal(**fields))
    assert first.status.goal.id == again.status.goal.id == later.status.goal.id
    other = await client.request(p.SubmitGoal(**{**fields, "key": "slack-goal-2"}))
    unnamed = await client.request(p.SubmitGoal(text="no key, max 1 experiments", agent="idle"))
    assert len({first.status.goal.id, other.status.goal.id, unnamed.status.goal.id}) == 3
    assert len(await runner.store.list_goals()) == 3


async def test_a_goal_that_fails_is_a_warning_in_the_runners_log(start_runner, connect, tmp_path, caplog):
    # Found on a day-one walkthrough: a goal whose agent could not start (there, slirp4netns and
    # /dev/net/tun) failed with nothing in the journal; the reason was in the event log alone.
    caplog.set_level(logging.WARNING, logger="goaltender.runner")
    runner = await start_runner(sandbox="none", agents={"gone": [str(tmp_path / "no-such-agent")]})
    client = await connect(runner)
    goal_id = await submit(client, "reach 90%, max 2 experiments", owner="ana", agent="gone")
    events = await events_until_report(client, goal_id)
    assert events[-1].data.kind == "report" and "no-such-agent" in events[-1].data.end_reason
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    failed = [m for m in warned if m.startswith(f"goal #{goal_id} failed: ")]
    assert len(failed) == 1 and "no-such-agent: not found" in failed[0] and "\n" not in failed[0], warned
