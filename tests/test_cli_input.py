"""Bad input on the command line: one line on stderr and exit code 2, never a traceback.

Every verb is given bad input through the real entry point (`.venv/bin/goaltender`, argv as bytes,
so undecodable arguments arrive as Python sees them); the bulk of the fuzzing calls `cli.main` in
process. With no runner listening, input that passed the checks would exit 4 ("no runner"): an exit
2 shows the input was refused before the runner was asked. With a runner up, its own error replies
keep their exit code (4), and it refuses goal words and budget changes that cannot be.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import BIN, eventually, submit, write_agent
from hypothesis import given, settings
from hypothesis import strategies as st

from goaltender import cli
from goaltender.cli.commands import ALIASES
from goaltender.cli.commands.operator import print_status
from goaltender.protocol import messages as p

GOALTENDER = os.path.join(BIN, "goaltender")
NO_RUNNER = "/nonexistent/goaltender-test/runner.sock"


def run_cli(
    argv: list[str | bytes], *, env: dict[str, str] | None = None, stdin: bytes = b"", socket: str = NO_RUNNER
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "GOALTENDER_SOCKET": socket, "GOALTENDER_GOAL_ID": "1", **(env or {})}
    return subprocess.run(
        [GOALTENDER, *argv],
        input=stdin.decode("latin-1"),
        capture_output=True,
        text=True,
        encoding="latin-1",  # stderr shows argv bytes as they came; any byte decodes
        env=environment,
        timeout=60,
    )


def assert_refused(out: subprocess.CompletedProcess[str], says: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert says in out.stderr, out.stderr
    if out.stderr.startswith("goaltender: "):  # ours, not argparse's usage + error
        assert out.stderr.count("\n") == 1, out.stderr


# (verb, argv, what stderr says): every verb, with the inputs the fuzzers found and their kin.
CASES: list[tuple[str, list[str | bytes], str]] = [
    ("runner", ["runner", "bogus"], "invalid choice"),
    ("demo", ["demo", "x, max 0 experiments"], "`max 0 experiments`: an experiment count must be"),
    ("demo", ["demo", ""], "text: is empty"),
    ("bot", ["bot", "extra"], "unrecognized arguments"),
    ("doctor", ["doctor", "--ssh-port", "0"], "0 is not a port: use 1 to 65535"),
    ("doctor", ["doctor", "--ssh-port", "ssh"], "not a port number: 'ssh'"),
    ("service", ["service", "start"], "invalid choice"),
    ("service", ["service", "show"], "`show` takes runner or bot"),
    ("service", ["service", "install", "--as", "no-such-user-here"], "no user 'no-such-user-here'"),
    ("submit", ["submit", ""], "text: is empty"),
    ("submit", ["submit", "x" * 4001], "text: String should have at most 4000 characters"),
    ("submit", ["submit", "x, budget 0h"], "`budget 0h`: a time budget must be at least 1s"),
    ("submit", ["submit", " \t "], "a goal needs words"),
    ("submit", ["submit", "x, budget -2h"], "`budget -2h`: a budget or limit is never negative"),
    ("budget", ["budget", "1", "budget -1h"], "`budget -1h`: a budget or limit is never negative"),
    ("submit", ["submit", "x within 0s"], "`within 0s`"),
    ("submit", ["submit", "x, budget 99999999h"], "at most 365 days"),
    ("submit", ["submit", "reach 150% accuracy"], "a percentage target is at most 100%"),
    ("submit", ["submit", b"train \xff"], "text: b'train \\xff' is not UTF-8"),
    ("status", ["status", "99999999999999999999"], "is out of range"),
    ("summary", ["summary", "x"], "not a whole number"),
    ("steer", ["steer", "1", b"\xfe\xff"], "is not UTF-8"),
    ("steer", ["steer", "1", ""], "text: is empty"),
    ("steer", ["steer", "1", " \n "], "text: is blank: it must say something"),
    ("steer", ["steer", "1", "hurry, max 0 experiments"], "`max 0 experiments`: an experiment count"),
    ("budget", ["budget", "1", "+0h"], "`+0h`: an extension must be at least 1s"),
    ("budget", ["budget", "1", "+99999999h"], "at most 365 days"),
    ("budget", ["budget", "1", "+0 experiments"], "more experiments must be from 1"),
    ("budget", ["budget", "1", "x" * 201], "change: String should have at most 200 characters"),
    ("pause", ["pause", "0"], "is out of range"),
    ("resume", ["resume", "-1"], "is out of range"),
    ("stop", ["stop", "1", "--reason", b"\xff"], "reason: b'\\xff' is not UTF-8"),
    ("approve", ["approve", "1.5"], "not a whole number"),
    ("reject", ["reject", "1", "--comment", b"\xc3"], "comment: b'\\xc3' is not UTF-8"),
    ("audit", ["audit", "--limit", "0"], "limit: Input should be greater than 0"),
    ("disk-usage", ["disk-usage", "0"], "0 is out of range"),
    ("disk-usage", ["disk-usage", "abc"], "not a whole number"),
    ("backup", ["backup", "--to"], "expected one argument"),
    ("restore", ["restore", "x.db", "--only", "both"], "invalid choice: 'both'"),
    ("prune", ["prune", "--days", "0"], "0 is out of range: use 1 to 100000 days"),
    ("prune", ["prune", "--days", "9999999"], "9999999 is out of range"),
    ("prune", ["prune", "--days", "ninety"], "not a whole number of days: 'ninety'"),
    ("stage-done", ["stage-done"], "give the stage's summary"),
    ("cross-check", ["cross-check", "-d", "x", "--a", "'open", "--b", "true"], "--a: No closing quotation"),
    ("experiment", ["experiment", "-d", "x", "--gpus", "-1", "--", "true"], "--gpus"),
    ("experiment", ["experiment", "-d", "x", "--executor", "k8s", "--", "true"], "invalid choice: 'k8s'"),
    ("events", ["events", "--since", "-1"], "is out of range"),
    ("log", ["log", "1", "--offset", "x"], "not a whole number"),
    ("milestone", ["milestone", b"\xff"], "title: b'\\xff' is not UTF-8"),
    ("milestone", ["milestone", "x" * 301], "title: String should have at most 300 characters"),
    ("milestone", ["milestone", "   "], "title: is blank: it must say something"),
    ("metrics", ["metrics", "loss=nan"], "metric 'loss': not a finite number: 'nan'"),
    ("metrics", ["metrics", "loss=1e999"], "not a finite number"),
    ("metrics", ["metrics", "loss=1", "--step", "inf"], "not a finite number: 'inf'"),
    ("metrics", ["metrics", "loss"], "expected NAME=VALUE"),
    ("metrics", ["metrics", "--file", "-"], "stdin is not UTF-8 text"),
    ("metrics", ["metrics", "--file", "/nonexistent/points.jsonl"], "cannot read /nonexistent/points.jsonl"),
    ("metrics", ["metrics", "loss=1", "--file", "-"], "NAME=VALUE pairs or --file FILE (JSON lines), one or"),
    ("experiment", ["experiment", "-d", "x", "--timeout", "0", "--", "true"], "a timeout must be"),
    ("experiment", ["experiment", "-d", "x", "--timeout", "nan", "--", "true"], "a timeout must be"),
    (
        "experiment",
        ["experiment", "-d", "", "--", "true"],
        "description: is empty: give the hypothesis this run tests",
    ),
    (
        "experiment",
        ["experiment", "-d", " ", "--", "true"],
        "description: is blank: give the hypothesis this run",
    ),
    ("experiment", ["experiment", "-d", "x", "--", b"\xff"], "command: b'\\xff' is not UTF-8"),
    (
        "experiment",
        ["experiment", "-d", "x", "--eval", "'open", "--", "true"],
        "--eval: No closing quotation",
    ),
    ("ask", ["ask", "go?", "--timeout", "99999d"], "a timeout must be"),
    ("ask", ["ask", ""], "question: is empty"),
    ("ask", ["ask", "\t"], "question: is blank"),
    ("inbox", ["inbox", "--goal", "0"], "is out of range"),
    ("diary", ["diary", "read", "--last", "1001"], "last: Input should be less than or equal to 1000"),
    ("diary", ["diary", "write", "-"], "stdin is not UTF-8 text"),
    ("report", ["report", "--file", "/nonexistent/report.md"], "cannot read /nonexistent/report.md"),
    ("report", ["report", ""], "give the report text"),
    ("report", ["report", "  "], "text: is blank"),
    ("skills", ["skills", "edit", "--file", "x.md"], "the following arguments are required: --skill"),
    (
        "skills",
        ["skills", "edit", "--skill", "x", "--file", "/nonexistent/x.md"],
        "cannot read /nonexistent/x.md",
    ),
    ("skills", ["skills", "edit", "--skill", "x", "--file", "-"], "stdin is not UTF-8 text"),
    (
        "skills",
        ["skills", "edit", "--skill", "x" * 65, "--file", "/dev/null", "--goal", "1"],
        "skill: String should",
    ),
    ("skills", ["skills", "revert", "HEAD~1"], "commit: String should match pattern"),
    ("skills", ["skills", "log", "--limit", "1001"], "limit: Input should be less than or equal to 1000"),
    ("skills", ["skills", "forget"], "invalid choice: 'forget'"),
    ("fetch", ["fetch", "not/a/valid/repo/x"], "not a repo id: 'not/a/valid/repo/x'"),
    ("fetch", ["fetch", b"\xff"], "repo: b'\\xff' is not UTF-8"),
    ("fetch", ["fetch", "org/x", "--revision", ""], "the revision is empty"),
    ("fetch", ["fetch", "org/x", "--type", "space"], "invalid choice: 'space'"),
    ("nemo-rl", ["nemo-rl", "sft"], "the following arguments are required: --config"),
    ("nemo-rl", ["nemo-rl", "sft", "--config", "/nonexistent.yaml"], "--config: no such file"),
    ("preflight", ["preflight", "--data", "x", "--max-seq-len", "0"], "--max-seq-len must be at least 1"),
    (
        "preflight",
        ["preflight", "--data", "/nonexistent.jsonl", "--max-seq-len", "9"],
        "cannot read /nonexistent.jsonl: No such",
    ),
]
NOT_TEXT = b"\xff\xfe not text"  # on every case's stdin: `diary write -` reads it


@pytest.mark.parametrize(
    ("verb", "argv", "says"), CASES, ids=[f"{v}-{i}" for i, (v, _, _) in enumerate(CASES)]
)
def test_bad_input_through_the_real_entry_point(verb, argv, says):
    out = run_cli(argv, stdin=NOT_TEXT)
    assert_refused(out, says)


def test_every_verb_is_given_bad_input():
    parser = cli.build_parser()
    verbs = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(verbs) - set(ALIASES) == {verb for verb, _, _ in CASES}


# ---- old names: accepted as the verbs they name, never listed ----

ALIAS_CASES = [
    (["du", "abc"], ["disk-usage", "abc"]),
    (["du"], ["disk-usage"]),
    (["skill-edit", "--skill", "x", "--file", "-"], ["skills", "edit", "--skill", "x", "--file", "-"]),
    (["skill-edit", "--file", "x.md"], ["skills", "edit", "--file", "x.md"]),
]


def test_every_old_name_is_tried():
    assert {old[0] for old, _ in ALIAS_CASES} == set(ALIASES)


@pytest.mark.parametrize(("old", "new"), ALIAS_CASES, ids=[" ".join(old) for old, _ in ALIAS_CASES])
def test_an_old_name_does_what_the_new_one_does(old, new):
    """Through the real entry point: the same exit code and the same words, with no runner (4)
    for input that is fine, or the refusal (2) for input that is not."""
    said_old, said_new = run_cli(old, stdin=NOT_TEXT), run_cli(new, stdin=NOT_TEXT)
    assert said_old.returncode == said_new.returncode != 0, said_old.stderr
    assert (said_old.stdout, said_old.stderr) == (said_new.stdout, said_new.stderr)


@pytest.mark.parametrize(
    "argv", [["du", "3"], ["skill-edit", "--skill", "x", "--file", "f", "--why", "w", "--goal", "2"]]
)
def test_an_old_name_parses_as_its_verb(argv):
    verb = ALIASES[argv[0]]
    expected = cli.build_parser(only=verb.split()[0]).parse_args([*verb.split(), *argv[1:]])
    for parser in (cli.build_parser(only=argv[0]), cli.build_parser()):
        args = parser.parse_args(argv)
        assert args.verb == verb
        assert _arguments(args) == _arguments(expected)


def _arguments(args: argparse.Namespace) -> dict[str, object]:
    return {name: value for name, value in vars(args).items() if name not in ("func", "action")}


def test_old_names_are_not_listed(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listing = capsys.readouterr().out
    for old, verb in ALIASES.items():
        assert f"    {verb.split()[0]} " in listing
        assert not re.search(rf"(?<![\w-]){old}(?![\w-])", listing), old


# ---- in process: the bulk of the fuzzing ----

VERBS = [
    *("submit", "status", "summary", "steer", "budget", "pause", "resume", "stop", "approve", "reject"),
    *("audit", "disk-usage", "events", "log", "milestone", "metrics", "experiment", "ask", "inbox", "report"),
    *("diary write", "diary read", "skills edit", "du", "skill-edit"),
]
AWKWARD = [
    *("", "\udcff", "\udcfe\udcff", "x" * 5000, "x" * 301, "nan", "inf", "-inf", "-1", "0", "1", "2"),
    *("1.5", "1e999", "99999999999999999999999", "a=nan", "a=1", "k=v", "=", "=1", "budget 0h", "+0h"),
    *("+99999999h", "+2h", "max 0 experiments", "to 150%", "'", "\x00", "/nonexistent", "1h", "0s"),
    *("--goal", "--step", "--limit", "--last", "--offset", "--since", "--timeout", "--param", "--metric"),
    *("--eval", "-d", "--", "--comment", "--reason", "--detail", "--kind", "--author", "--owner"),
    *("--agent", "--handoff", "--all", "--file", "--experiment", "--minimize", "--follow"),
]
ARGS = st.lists(st.one_of(st.sampled_from(AWKWARD), st.text(max_size=12)), max_size=6)


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(st.sampled_from(VERBS), ARGS)
def test_fuzzed_arguments_in_process(verb, args):
    argv = ["--socket", NO_RUNNER, *verb.split(), *args]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(argv)
        except SystemExit as exit:  # argparse's own: usage errors (2) and --help (0)
            code = exit.code
    said = stderr.getvalue()
    assert "Traceback" not in said
    if code == 0:
        assert "usage:" in stdout.getvalue()  # an abbreviation of --help, generated by chance
    elif code == 4:
        assert "no runner is listening" in said  # the input was fine: only then is the runner asked
    else:
        assert code == 2, (code, said)
        assert said.startswith(("goaltender: ", "usage: goaltender")), said  # ours, or argparse's
        if said.startswith("goaltender: "):
            assert said.count("\n") == 1, said


# ---- with a runner: its refusals, and its error replies keep their exit code ----


async def test_the_runner_refuses_limits_that_cannot_be(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    socket = str(runner.settings.socket_path)
    goal_id = await submit(client, "wait, budget 1h, max 2 experiments", agent="wait")

    for text in ("x, budget 0h", "x, max 0 experiments", "x to 150%", "x, gpu-hours 99999999"):
        with pytest.raises(p.ProtocolError) as refused:
            await submit(client, text, agent="wait")
        assert refused.value.error.code == "bad_request" and refused.value.error.message.startswith("`")
    with pytest.raises(p.ProtocolError, match=r"bad_request: `\+99999999h`: an extension"):
        await client.request(p.ChangeBudget(goal_id=goal_id, change="+99999999h"))
    with pytest.raises(p.ProtocolError, match=r"bad_request: `budget 0h`: .* the message was not delivered"):
        await client.request(p.Steer(goal_id=goal_id, text="hurry, budget 0h"))
    assert await runner.store.read_inbox(goal_id, unread_only=False) == []

    async def cli_run(*argv: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(run_cli, list(argv), socket=socket)

    missing = await cli_run("status", "999")
    assert missing.returncode == cli.EXIT_RUNNER and "the runner refused: no goal #999" in missing.stderr
    not_budget = await cli_run("budget", str(goal_id), "focus on the dense scenes")
    assert not_budget.returncode == cli.EXIT_RUNNER and "no budget in" in not_budget.stderr
    assert_refused(await cli_run("budget", str(goal_id), "+0h"), "an extension must be at least 1s")
    extended = await cli_run("budget", str(goal_id), "+2h")
    assert extended.returncode == 0 and "budget changed: deadline +2h00m" in extended.stdout
    await client.request(p.Stop(goal_id=goal_id))
    assert Path(socket).exists()


async def test_status_shows_active_goals_and_pages_through_history(start_runner, connect, tmp_path):
    """`goaltender status` lists the active goals; `--all` the newest --limit goals, with the
    command for the next page: a long history never makes one reply over the line limit."""
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    ids = [await submit(client, f"goal {n}, budget 1h", agent="wait") for n in range(5)]
    for goal_id in ids[:4]:
        await client.request(p.Stop(goal_id=goal_id))

    async def only_the_last_active() -> bool:
        reply = await client.request(p.Status(active_only=True))
        return [s.goal.id for s in reply.goals] == [ids[4]]

    await eventually(only_the_last_active)
    socket = str(runner.settings.socket_path)

    def shown(out: subprocess.CompletedProcess[str]) -> list[int]:
        assert out.returncode == 0, out.stderr
        return [int(m) for m in re.findall(r"^goal #(\d+)", out.stdout, re.M)]

    active = await asyncio.to_thread(run_cli, ["status"], socket=socket)
    assert shown(active) == [ids[4]]
    page = await asyncio.to_thread(run_cli, ["status", "--all", "--limit", "2"], socket=socket)
    assert shown(page) == ids[3:5] and f"status --all --before {ids[3]}" in page.stdout
    older = await asyncio.to_thread(
        run_cli, ["status", "--all", "--limit", "2", "--before", str(ids[3])], socket=socket
    )
    assert shown(older) == ids[1:3]
    assert_refused(
        await asyncio.to_thread(run_cli, ["status", "--all", "--limit", "0"], socket=socket), "limit"
    )
    reply = await client.request(p.Status(limit=3))
    assert [s.goal.id for s in reply.goals] == ids[2:5]


def test_a_commands_help_says_percent_once(capsys):
    # argparse %-formats a command's help in the listing but prints its description as written:
    # `goaltender submit --help` said "reach 90%% accuracy" (found on a day-one walkthrough).
    for argv in (["submit", "--help"], ["--help"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert "90% accuracy" in out and "%%" not in out, out


def test_status_of_a_goal_that_ended_says_why(capsys):
    # Found on a day-one walkthrough: `goaltender submit` printed "goal #1 [failed]" and nothing
    # else, the reason (slirp4netns could not open /dev/net/tun) was in the event log alone.
    from goaltender.storage.records import Goal

    reason = "could not start agent 'sweep': slirp4netns failed: open(\"/dev/net/tun\"): Permission denied\nchild failed(1)"
    goal = Goal(id=1, text="reach 90%", state="failed", end_reason=reason)
    print_status(p.GoalStatus(goal=goal, attempted=0, compute_hours_used=0.0, stop_status="0/6 attempted"))
    running = Goal(id=2, text="reach 90%", state="running")
    print_status(p.GoalStatus(goal=running, attempted=0, compute_hours_used=0.0, stop_status="0/6 attempted"))
    out = capsys.readouterr().out.splitlines()
    assert (
        out[2]
        == "  ended: could not start agent 'sweep': slirp4netns failed: open(\"/dev/net/tun\"): Permission denied / child failed(1)"
    )
    assert not any(line.startswith("  ended:") for line in out[3:]), out
