"""The agent verbs' quick path (issue 13): `milestone`, `metrics`, `diary write` and `report` talk
to a real runner through protocol/quick_client.py (the standard library alone). What the runner
stored is checked, not only what the CLI printed, and bad input keeps its answer (exit 2, the
models' words) whether the runner is down, refuses, or never sees it. That these verbs import
neither pydantic nor asyncio is checked here; what that saves is benchmarks/bench_cli.py's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from helpers import eventually, submit, write_agent
from test_cli_input import NO_RUNNER, assert_refused, run_cli

from goaltender import cli
from goaltender.cli import talk
from goaltender.protocol import messages as p

HEAVY = ("pydantic", "pydantic_core", "asyncio")


def test_the_agent_verbs_import_neither_pydantic_nor_asyncio():
    script = f"""
import contextlib, io, sys
from goaltender import cli
for argv in (["milestone", "done"], ["metrics", "loss=1", "--step", "3"], ["metrics", "--file", "-"],
             ["diary", "write", "x"], ["report", "text"]):
    cli.build_parser(only=argv[0]).parse_args(argv)
for argv in (["--help"], ["milestone", "--help"], ["metrics", "--help"], ["status", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        cli.main(argv)
print(" ".join(m for m in {HEAVY!r} if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_quick_requests_are_what_the_models_would_send(monkeypatch, capsys):
    sent: list[str] = []

    def exchange(path, client, requests):
        sent.extend(requests)
        return [{"id": n, "type": "done", "message": "ok"} for n, _ in enumerate(requests, start=1)]

    monkeypatch.setattr(talk, "exchange", exchange)
    monkeypatch.setenv("GOALTENDER_SOCKET", NO_RUNNER)
    for argv in (
        ["milestone", "trained", "--goal", "3"],
        ["metrics", "loss=0.25", "acc=1", "--goal", "3"],
        ["metrics", "loss=2", "--step", "7", "--experiment", "4", "--goal", "3"],
        ["diary", "write", "--handoff", "next: warmup", "--goal", "3"],
        ["report", "findings", "--goal", "3"],
    ):
        assert cli.main(argv) == cli.EXIT_OK, argv
    assert capsys.readouterr().out == "ok\n" * 5
    for line in sent:
        fields = json.loads(line)
        model = p.REQUEST_MODELS[fields["type"]]
        assert json.loads(p.encode(model(id=0, **fields))) == {"id": 0, **fields}, line


@pytest.fixture
async def agent_goal(start_runner, connect, tmp_path):
    """A runner, an operator client, and a goal whose agent waits: (runner, client, goal id, the
    goal's own socket, which the verbs use as an agent's would)."""
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    goal_id = await submit(client, "wait, max 1 experiments", agent="wait")
    sock = runner.settings.agent_socket(goal_id)
    await eventually(sock.exists)
    yield runner, client, goal_id, str(sock)
    await client.request(p.Stop(goal_id=goal_id))


async def goaltender(
    argv: list[str], sock: str, goal_id: int, stdin: str = ""
) -> subprocess.CompletedProcess:
    # In a thread: the runner answering it runs on this test's event loop.
    env = {"GOALTENDER_GOAL_ID": str(goal_id)}
    return await asyncio.to_thread(run_cli, argv, env=env, socket=sock, stdin=stdin.encode())


async def stored(runner, goal_id: int, kind: str) -> list:
    return [e.data for e in await runner.store.events_since(0, goal_id=goal_id) if e.data.kind == kind]


async def series(client, goal_id: int, name: str) -> list[tuple[float, float]]:
    return (await client.request(p.GetSeries(goal_id=goal_id, name=name))).points


async def test_a_milestone_is_stored_and_imports_nothing_heavy(agent_goal):
    runner, _, goal_id, sock = agent_goal
    out = await goaltender(["milestone", "Baseline trained", "acc **0.81** after 3 epochs"], sock, goal_id)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    [milestone] = await stored(runner, goal_id, "milestone")
    assert (milestone.title, milestone.text, milestone.curves) == (
        "Baseline trained",
        "acc **0.81** after 3 epochs",
        None,
    )
    # The whole verb, connection included, as a process of its own.
    script = f"import sys; from goaltender.cli import main; main(sys.argv[1:]); print(*[m for m in {HEAVY!r} if m in sys.modules])"
    env = {**os.environ, "GOALTENDER_SOCKET": sock, "GOALTENDER_GOAL_ID": str(goal_id)}
    argv = [sys.executable, "-c", script, "milestone", "again"]
    out = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, env=env, check=True)
    assert out.stdout.splitlines()[-1].strip() == "", out.stdout
    assert [m.title for m in await stored(runner, goal_id, "milestone")] == ["Baseline trained", "again"]


async def test_metrics_from_pairs_and_from_odd_lines(agent_goal):
    runner, client, goal_id, sock = agent_goal
    out = await goaltender(["metrics", "loss=0.75", "acc=0.5", "--step", "10"], sock, goal_id)
    assert out.returncode == 0, out.stderr
    lines = "\n".join(
        [
            '{"name": "loss", "value": 0.5, "step": 1}',
            '   {"name": "loss", "value": 2}   ',  # blanks around, an integer, no step: --step's
            "",
            '{"name": "acc", "value": "0.25", "step": 3}',  # text for a number: the model reads it
            '{"step": 4, "value": -1e-3, "name": "loss"}',
            '{"name": "loss", "value": 1, "step": null}',  # an explicit null step stays null
        ]
    )
    out = await goaltender(["metrics", "--file", "-", "--step", "9"], sock, goal_id, stdin=lines)
    assert out.returncode == 0, out.stderr
    assert "5 metric point(s) logged" in out.stdout
    loss = {(1.0, 0.5), (4.0, -0.001), (9.0, 2.0), (10.0, 0.75), (None, 1.0)}
    assert set(await series(client, goal_id, "loss")) == loss
    assert set(await series(client, goal_id, "acc")) == {(3.0, 0.25), (10.0, 0.5)}
    logged = await stored(runner, goal_id, "metrics")
    assert any(point.step is None for event in logged for point in event.points)


async def test_points_too_long_for_one_line_go_in_several_requests(agent_goal):
    _, client, goal_id, sock = agent_goal
    name = "n" * 190  # 10,000 points of ~230 bytes: more than two request lines hold
    lines = "".join(json.dumps({"name": name, "value": i, "step": i}) + "\n" for i in range(10_000))
    out = await goaltender(["metrics", "--file", "-"], sock, goal_id, stdin=lines)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "10000 metric point(s) logged in 3 requests\n"
    assert await series(client, goal_id, name) == [(float(i), float(i)) for i in range(10_000)]


async def test_a_bad_line_is_refused_and_nothing_is_logged(agent_goal):
    runner, client, goal_id, sock = agent_goal
    lines = '{"name": "loss", "value": 1}\n{"name": "loss", "value": 2,\n'
    assert_refused(
        await goaltender(["metrics", "--file", "-"], sock, goal_id, lines), "line 2: not a JSON object"
    )
    # Plain to this process, but no text the runner can take (a lone surrogate): it refuses the
    # request, and the models say why, as for any bad input.
    lines = '{"name": "loss", "value": 1}\n{"name": "\\ud800", "value": 2}\n'
    assert_refused(
        await goaltender(["metrics", "--file", "-"], sock, goal_id, lines), "cannot send this to the runner"
    )
    assert await stored(runner, goal_id, "metrics") == []
    assert await series(client, goal_id, "loss") == []


async def test_the_runners_refusal_keeps_its_words_and_exit_code(agent_goal):
    runner, client, goal_id, sock = agent_goal
    other = await submit(client, "another, max 1 experiments", agent="wait")
    for argv in (
        ["milestone", "not mine", "--goal", str(other)],
        ["metrics", "loss=1", "--goal", str(other)],
    ):
        out = await goaltender(argv, sock, goal_id)
        assert out.returncode == cli.EXIT_RUNNER, out.stderr
        assert out.stderr == (
            f"goaltender: the runner refused: this connection belongs to goal #{goal_id}'s agent: it "
            f"acts on goal #{goal_id} only, and {'milestone' if argv[0] == 'milestone' else 'log_metrics'} "
            f"names goal #{other}\n"
        )
    assert await stored(runner, other, "milestone") == []
    await client.request(p.Stop(goal_id=other))


@pytest.mark.parametrize(
    "argv", [["milestone", "hi"], ["metrics", "loss=1"], ["diary", "write", "x"], ["report", "done"]]
)
def test_no_runner_says_how_to_start_one(argv):
    out = run_cli(argv)
    assert out.returncode == cli.EXIT_RUNNER, out.stderr
    assert out.stderr == (
        f"goaltender: no runner is listening on {NO_RUNNER} (No such file or directory); "
        "start one with `goaltender runner`\n"
    )


async def test_diary_and_report_through_the_quick_path(agent_goal):
    runner, client, goal_id, sock = agent_goal
    out = await goaltender(
        ["diary", "write", "--handoff", "-"], sock, goal_id, stdin="best lr=0.1; next: warmup"
    )
    assert out.returncode == 0, out.stderr
    diary = await client.request(p.ReadDiary(goal_id=goal_id, kind="handoff"))
    assert [e.text for e in diary.entries] == ["best lr=0.1; next: warmup"]
    out = await goaltender(["report", "warmup helps; try cosine next"], sock, goal_id)
    assert out.returncode == 0, out.stderr
    assert await runner.store.agent_report(goal_id) == "warmup helps; try cosine next"
