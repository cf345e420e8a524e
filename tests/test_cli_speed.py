"""Agent verbs that start at once (issue 13): what `goaltender` imports, `metrics --file`, and the
client's batched requests. The CPU time itself is a benchmark (benchmarks/bench_cli.py), not a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import events_until_report, submit, write_agent
from test_cli_input import assert_refused, run_cli

import goaltender
from goaltender.protocol import messages as p
from goaltender.protocol.client import MetricBuffer

# Each is imported by the command that needs it, never by an agent verb's start-up.
HEAVY = [
    *("matplotlib", "numpy", "huggingface_hub", "slack_sdk", "pydantic_settings", "psutil"),
    *("aiosqlite", "goaltender.runner.config", "goaltender.bot", "goaltender.runner.daemon"),
    *("goaltender.runner.hub", "goaltender.runner.report"),
]


def test_an_agent_verb_imports_nothing_heavy():
    script = (
        "import sys\n"
        "from goaltender import cli\n"
        "cli.build_parser().parse_args(['metrics', 'loss=1'])\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# Nor what the interpreter itself does not import: a tenth of a quick verb's start-up, measured
# against a bare `python -c pass` (an editable install's import hook loads them in every process,
# so the interpreter here runs without site, the package reached through a link of its name).
UNNEEDED = ["pathlib", "shutil", "importlib", "importlib.util", "textwrap", "typing"]


@pytest.mark.parametrize("argv", [["milestone", "done"], ["metrics", "loss=1"], ["diary", "write", "x"]])
def test_a_quick_verb_imports_only_what_it_uses(tmp_path, argv):
    (tmp_path / "goaltender").symlink_to(Path(goaltender.__file__).parent)
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from goaltender import cli\n"
        f"cli.build_parser({argv[0]!r}).parse_args({argv!r})\n"
        f"print(' '.join(m for m in {UNNEEDED!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    ("argv", "imported"),
    [
        (["--help"], []),
        (["milestone", "--help"], ["agent"]),
        (["status", "--help"], ["operator"]),
        (["doctor", "--help"], ["box"]),
        (["du", "--help"], ["operator"]),  # an old name: the module of the verb it names
    ],
)
def test_only_the_verbs_module_is_imported(argv, imported):
    """The command table imports a verb's module when that verb runs, and no other's."""
    script = (
        "import contextlib, io, sys\n"
        "from goaltender import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    cli.main({argv!r})\n"
        "print(' '.join(sorted(m.rpartition('.')[2] for m in sys.modules if m.startswith('goaltender.cli.commands.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == imported


def test_the_models_are_built_on_first_use():
    script = (
        "from goaltender.protocol import messages as p\n"
        "print(sum(m.__pydantic_complete__ for m in p.REQUEST_MODELS.values()))\n"
        'p.parse_request(b\'{"id": 1, "type": "ack", "seq": 3}\')\n'
        "print(sum(m.__pydantic_complete__ for m in p.REQUEST_MODELS.values()))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1"]


def test_a_started_runner_has_built_every_model(tmp_path, short_dir):
    """The runner builds them before it serves: not inside its first goal's campaign."""
    script = (
        "import asyncio, sys\n"
        "from pydantic import BaseModel\n"
        "from goaltender.runner.config import RunnerSettings\n"
        "from goaltender.runner.daemon import Runner\n"
        "def models(base):\n"
        "    for model in base.__subclasses__():\n"
        "        yield model\n"
        "        yield from models(model)\n"
        "def unbuilt():\n"
        "    return sorted({m.__name__ for m in models(BaseModel)\n"
        "                   if m.__module__.startswith('goaltender.') and not m.__pydantic_complete__})\n"
        "async def main():\n"
        "    print(len(unbuilt()) > 10)\n"
        "    settings = RunnerSettings(home=sys.argv[1], socket=sys.argv[2], sandbox='none', min_free_mb=1)\n"
        "    runner = await Runner.start(settings)\n"
        "    print(unbuilt())\n"
        "    await runner.close()\n"
        "asyncio.run(main())\n"
    )
    argv = [sys.executable, "-c", script, str(tmp_path / "home"), str(short_dir / "r.sock")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["True", "[]"]


def points_file(count: int) -> str:
    return "".join(json.dumps({"name": "loss", "value": 1 / (i + 1), "step": i}) + "\n" for i in range(count))


@pytest.mark.parametrize(
    ("stdin", "says"),
    [
        ('{"name": "loss", "value": 1}\n\n{"name": "loss", "value": NaN}\n', "line 3: not a JSON object"),
        ('{"name": "loss", "value": 1e999}\n', "line 1: value: Input should be a finite number"),
        ("[1, 2]\n", 'line 1: expected an object like {"name": "loss", "value": 0.3}'),
        ('{"name": "loss"}\n', "line 1: value: is missing"),
        ('{"name": "loss", "value": "x"}\n', "line 1: value: Input should be a valid number"),
        ('{"name": "loss", "value": 1, "stp": 2}\n', "line 1: stp: Extra inputs are not permitted"),
        ("\n\n", "no points: the file has no JSON lines"),
    ],
)
def test_bad_lines_are_refused_with_their_number(stdin, says):
    assert_refused(run_cli(["metrics", "--file", "-"], stdin=stdin.encode()), says)


def test_pairs_or_a_file_not_both():
    assert_refused(run_cli(["metrics", "loss=1", "--file", "-"]), "one or the other")
    assert_refused(run_cli(["metrics"]), "give NAME=VALUE pairs or --file FILE")
    assert_refused(run_cli(["metrics", "--file", "/nonexistent/p.jsonl"]), "cannot read /nonexistent/p.jsonl")


async def test_metrics_from_a_file_arrive_as_series(start_runner, connect, tmp_path):
    # 12,001 points: two requests (at most 10,000 each), sent together over the goal's own socket.
    agent = write_agent(
        tmp_path,
        "agent.sh",
        """seq 0 12000 | sed 's/.*/{"name": "loss", "value": &, "step": &}/' > points.jsonl\n"""
        "goaltender metrics --file - < points.jsonl > out 2>&1\n"
        "echo rc=$? >> out\n"
        """echo '{"name": "acc", "value": 0.5}' | goaltender metrics --file - --step 7 >> out 2>&1\n""",
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "log a lot, max 1 experiments", agent="a")
    await events_until_report(client, goal_id)

    summary = await client.request(p.Summary(goal_id=goal_id))
    out = (Path(summary.status.goal.workspace) / "out").read_text()
    assert "12001 metric point(s) logged in 2 requests\nrc=0\n1 metric point(s) logged" in out, out
    loss = await client.request(p.GetSeries(goal_id=goal_id, name="loss"))
    assert loss.points == [(float(i), float(i)) for i in range(12_001)]
    acc = await client.request(p.GetSeries(goal_id=goal_id, name="acc"))
    assert acc.points == [(7.0, 0.5)]


async def test_the_client_batches_metric_points(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    goal_id = await submit(client, "wait, max 1 experiments", agent="wait")

    async with MetricBuffer(client, goal_id, max_points=3, max_delay=3600) as metrics:
        for step in range(7):
            await metrics.add("loss", step / 10, step)
        series = await client.request(p.GetSeries(goal_id=goal_id, name="loss"))
        assert len(series.points) == 6  # two full batches sent; the seventh waits for the exit
    series = await client.request(p.GetSeries(goal_id=goal_id, name="loss"))
    assert series.points == [(float(step), step / 10) for step in range(7)]

    points = [p.MetricPoint(name="acc", value=v) for v in (0.1, 0.2)]
    requests = [p.LogMetrics(goal_id=goal_id, points=[point]) for point in points]
    replies = await client.request_many(requests)
    assert [r.message for r in replies] == ["1 metric point(s) logged"] * 2
    with pytest.raises(p.ProtocolError, match="no goal #999"):
        await client.request_many([*requests, p.LogMetrics(goal_id=999, points=points[:1])])
    await client.request(p.Stop(goal_id=goal_id))
