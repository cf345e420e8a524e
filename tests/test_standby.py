"""Standby interpreters (runner/standby.py): a goal's next Python run or eval, started before it is
asked for. A run handed to one must be the run a fresh interpreter would have made: the same argv,
sys.path, __main__, environment, working directory, stdin, output and exit status. Real runners,
bubblewrap, shell agents and Python processes; the standby's own processes are found through the
runner that made them."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import py_compile
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers import events_until_report, eventually, submit, write_agent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goaltender.protocol import messages as p
from goaltender.runner.config import RunnerSettings
from goaltender.runner.executors import Job, LocalExecutor
from goaltender.runner.sandbox import Sandbox
from goaltender.runner.standby import LATE_VARIABLES, LOADER, Standby, Standbys, discard
from goaltender.runner.supervisor import wait_process
from goaltender.storage.records import Goal

# What a Python process can see of how it was started, written as JSON to the experiment's
# directory (and a line on stdout and one on stderr, for the log); `acc: 0.5`, then exit code 7 when
# its last word is `fail`.
PROBE = r"""
_names = sorted(globals())
import json, os, signal, sys, warnings
kind = sys.argv[-1]
report = {
    "main_names": _names,
    "argv": sys.argv,
    "orig_argv": sys.orig_argv,
    "path": sys.path,
    "file": __file__,
    "name": __name__,
    "spec": __spec__.name if __spec__ else None,
    "package": __package__,
    "cached": __cached__,
    "loader": type(__loader__).__name__,
    "cwd": os.getcwd(),
    "environ": dict(os.environ),
    "stdin_is_devnull": os.path.samestat(os.fstat(0), os.stat("/dev/null")),
    "flags": repr(sys.flags),
    "sigint": repr(signal.getsignal(signal.SIGINT)),
    "sigpipe": repr(signal.getsignal(signal.SIGPIPE)),
    "warnings": repr(warnings.filters),
    "stdout": [sys.stdout.encoding, sys.stdout.line_buffering, sys.stdout.write_through],
}
out = os.path.join(os.environ["GOALTENDER_EXPERIMENT_DIR"], f"probe-{kind}.json")
with open(out, "w") as f:
    json.dump(report, f)
print("on stdout", kind)
print("on stderr", kind, file=sys.stderr)
print("acc: 0.5")
sys.exit(7 if kind == "fail" else 0)
"""

AGENT = """
cat > probe.py <<'EOF'
{probe}
EOF
mkdir -p sub && cp probe.py sub/script.py
while [ ! -e go ]; do sleep 0.05; done
goaltender experiment -d "in the agent's environment" -- python -m probe first
goaltender experiment -d "as a module" --metric acc --eval "python -m probe eval" -- python -m probe a 'b c' run
goaltender experiment -d "as a script" --metric acc -- python sub/script.py x fail
"""


def handed_off(monkeypatch) -> list[str]:
    """Each job a standby takes, as `<experiment>/<log>`, in order."""
    taken: list[str] = []
    hand_off = Standby.hand_off

    def spy(self, job):
        taken.append(f"{job.log_path.parent.name}/{job.log_path.name}")
        return hand_off(self, job)

    monkeypatch.setattr(Standby, "hand_off", spy)
    return taken


def standby_pids(runner, goal_id: int) -> set[int]:
    kept = runner.campaigns.standbys._kept.get(goal_id)
    return {standby.proc.pid for standby in kept.ready} if kept else set()


@pytest.fixture(autouse=True)
def started(monkeypatch) -> set[int]:
    """The pid of every standby the runners here start, as they start them."""
    pids: set[int] = set()
    make = Standbys._started

    def spy(self, goal, env):
        standby = make(self, goal, env)
        if standby is not None:
            pids.add(standby.proc.pid)
        return standby

    monkeypatch.setattr(Standbys, "_started", spy)
    return pids


async def campaign(runner, connect, goal_id: int) -> list:
    """Let the goal's agent go once it has a standby; its ledger at the end."""
    client = await connect(runner)
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    if runner.campaigns.standbys.enabled:
        await eventually(lambda: standby_pids(runner, goal_id))
    (Path(status.goal.workspace) / "go").touch()
    await events_until_report(client, goal_id)
    return (await client.request(p.Summary(goal_id=goal_id))).ledger


def reports(ledger) -> dict[str, dict]:
    """Each probe's report, its workspace path written as <ws>."""
    found = {}
    for experiment in ledger:
        directory = Path(experiment.log_path).parent
        workspace = str(directory.parent.parent)
        for path in sorted(directory.glob("probe-*.json")):
            text = path.read_text().replace(workspace, "<ws>")
            found[f"{experiment.index}/{path.stem}"] = json.loads(text)
    return found


async def test_a_run_handed_to_a_standby_is_the_run_a_fresh_interpreter_makes(
    start_runner, connect, tmp_path, short_dir, monkeypatch
):
    agent = write_agent(tmp_path, "agent.sh", AGENT.format(probe=PROBE))
    taken = handed_off(monkeypatch)
    seen = {}
    for mode, standby in (("cold", False), ("warm", True)):
        runner = await start_runner(
            home=tmp_path / mode, socket=short_dir / f"{mode}.sock", agents={"a": agent}, standby=standby
        )
        goal_id = await submit(await connect(runner), "probe, max 4 experiments", agent="a")
        ledger = await campaign(runner, connect, goal_id)
        seen[mode] = (ledger, reports(ledger))
    # Warm, a standby took every process: the runs, and the eval.
    assert taken == ["001/run.log", "002/run.log", "002/eval.log", "003/run.log"]

    for mode in ("cold", "warm"):
        ledger, found = seen[mode]
        assert ledger[0].exit_code == 0, mode
        assert [(e.index, e.status, e.exit_code, e.verified) for e in ledger[1:]] == [
            (2, "keep", 0, True),
            (3, "crash", 7, False),
        ], mode
        assert ledger[2].note == "exit code 7", mode
        for experiment in ledger[1:]:
            log = Path(experiment.log_path).read_text()
            assert "on stdout" in log and "on stderr" in log and "acc: 0.5" in log, (mode, log)
        assert set(found) == {"1/probe-first", "2/probe-run", "2/probe-eval", "3/probe-fail"}, mode
    cold, warm = seen["cold"][1], seen["warm"][1]
    for key in cold:
        for field in cold[key]:
            c, w = _unhomed(cold[key][field]), _unhomed(warm[key][field])
            assert c == w, f"{key} {field}: cold {c!r} warm {w!r}"
    assert warm["2/probe-run"]["argv"][1:] == ["a", "b c", "run"]
    assert warm["2/probe-run"]["path"][0] == "<ws>" and warm["3/probe-fail"]["path"][0] == "<ws>/sub"
    assert warm["2/probe-eval"]["environ"]["GOALTENDER_EXPERIMENT_ID"] == "2"
    assert warm["2/probe-run"]["main_names"] == [
        "__annotations__", "__builtins__", "__cached__", "__doc__", "__file__", "__loader__",
        "__name__", "__package__", "__spec__",
    ]  # fmt: skip


def _unhomed(value):
    """The runners' homes differ by name only (cold, warm)."""
    return json.loads(re.sub(r"/(cold|warm)\b", "/<home>", json.dumps(value)))


EVAL_AGENT = """
cat > probe.py <<'EOF'
{probe}
EOF
sed -i 's/sys.exit(7 if/sys.exit(0 if/' probe.py
while [ ! -e go ]; do sleep 0.05; done
for n in 1 2 3; do
  goaltender experiment -d "run $n" --metric acc --eval "python -m probe eval" -- python -m probe run
done
"""


async def test_runs_and_their_evals_are_handed_to_standbys_and_none_outlives_the_goal(
    start_runner, connect, tmp_path, started
):
    agent = write_agent(tmp_path, "agent.sh", EVAL_AGENT.format(probe=PROBE))
    runner = await start_runner(agents={"a": agent})
    goal_id = await submit(await connect(runner), "probe, max 5 experiments", agent="a")
    ledger, standbys = await campaign(runner, connect, goal_id), started
    assert [(e.status, e.metric_value, e.verified) for e in ledger] == [
        ("keep", 0.5, True),
        ("discard", 0.5, True),
        ("discard", 0.5, True),
    ]
    found = reports(ledger)
    assert found["1/probe-eval"]["environ"] == found["1/probe-run"]["environ"]
    assert {int(e.job_id) for e in ledger} <= standbys
    # The standbys' processes end with the goal (and are reaped: no zombies either).
    assert standby_pids(runner, goal_id) == set()
    for pid in standbys:
        assert not psutil.pid_exists(pid)


SHADOW_AGENT = """
cat > probe.py <<'EOF'
import sys
print("preloaded:", "json" in sys.modules)
import json
print("json from:", json.__file__)
EOF
mkdir -p shadow && cp probe.py shadow/ && echo 'print("the workspace json"); dumps = repr' > shadow/json.py
while [ ! -e go ]; do sleep 0.05; done
goaltender experiment -d warm -- python -m probe
(cd shadow && goaltender experiment -d shadowed -- python -m probe)
goaltender experiment -d options -- python -X utf8 -m probe
export EXTRA=1
goaltender experiment -d "another environment" -- python -m probe
goaltender experiment -d "the same again" -- python -m probe
"""


async def test_a_preloaded_module_the_command_would_find_in_its_directory_starts_it_cold(
    start_runner, connect, tmp_path, started
):
    runner = await start_runner(
        agents={"a": write_agent(tmp_path, "agent.sh", SHADOW_AGENT)}, preload=["json"]
    )
    goal_id = await submit(await connect(runner), "shadows, max 6 experiments", agent="a")
    ledger, standbys = await campaign(runner, connect, goal_id), started
    logs = [Path(e.log_path).read_text() for e in ledger]
    warm = f"preloaded: True\njson from: {Path(json.__file__)}\n"
    cold = f"preloaded: False\njson from: {Path(json.__file__)}\n"
    assert logs[0] == warm and int(ledger[0].job_id) in standbys
    # In shadow/, `python -m probe` imports shadow/json.py: the standby that took it (the agent's
    # environment but for PWD, a late variable) became a fresh interpreter.
    assert int(ledger[1].job_id) in standbys
    assert logs[1].startswith("preloaded: False\nthe workspace json\njson from: ")
    assert logs[1].rstrip().endswith("/shadow/json.py")
    # Interpreter options are a fresh interpreter's to take.
    assert logs[2] == cold and int(ledger[2].job_id) not in standbys
    # A run in another environment starts cold, and the standbys follow it there.
    assert logs[3] == cold and int(ledger[3].job_id) not in standbys
    assert logs[4] == warm and int(ledger[4].job_id) in standbys


STALE_AGENT = """
mkdir -p lib && echo 'VALUE = "old"' > lib/stale_probe.py
echo 'import stale_probe; print("value:", stale_probe.VALUE)' > probe.py
export PYTHONPATH=$PWD/lib
while [ ! -e go ]; do sleep 0.05; done
goaltender experiment -d "a new environment, cold" -- python -m probe
goaltender experiment -d "preloaded" -- python -m probe
while [ ! -e edit ]; do sleep 0.05; done
echo 'VALUE = "new, longer"' > lib/stale_probe.py
goaltender experiment -d "edited" -- python -m probe
"""


async def test_a_preloaded_module_edited_while_the_standby_waited_is_imported_anew(
    start_runner, connect, tmp_path, started
):
    runner = await start_runner(
        agents={"a": write_agent(tmp_path, "agent.sh", STALE_AGENT)}, preload=["stale_probe"]
    )
    client = await connect(runner)
    goal_id = await submit(client, "stale, max 4 experiments", agent="a")
    workspace = Path((await client.request(p.Status(goal_id=goal_id))).goals[0].goal.workspace)
    await eventually(lambda: standby_pids(runner, goal_id))
    (workspace / "go").touch()
    kept = runner.campaigns.standbys._kept[goal_id]
    await eventually(lambda: (workspace / "experiments" / "002" / "run.log").exists())
    # The goal's standbys, made in the PYTHONPATH it exported, have imported the old file.
    await eventually(lambda: len(kept.ready) == 2 and all(s.warm for s in kept.ready))
    (workspace / "edit").touch()
    await events_until_report(client, goal_id)
    ledger = (await client.request(p.Summary(goal_id=goal_id))).ledger
    logs = [Path(e.log_path).read_text() for e in ledger]
    assert logs == ["value: old\n", "value: old\n", "value: new, longer\n"]
    assert [int(e.job_id) in started for e in ledger] == [False, True, True]


TIMEOUT_AGENT = """
cat > sleeper.py <<'EOF'
import time
print("asleep", flush=True)
time.sleep(60)
EOF
goaltender experiment -d first -- python -m sleeper
goaltender experiment -d second -- python -m sleeper
"""


async def test_a_standbys_run_times_out_and_is_killed_like_any_other(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "agent.sh", TIMEOUT_AGENT)})
    client = await connect(runner)
    goal_id = await submit(client, "sleep, max 3 experiments, 1s each", agent="a")
    await events_until_report(client, goal_id)
    ledger = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert [(e.status, e.note) for e in ledger] == [("crash", "timeout after 1s")] * 2
    for experiment in ledger:
        assert "asleep" in Path(experiment.log_path).read_text()
        assert experiment.wall_seconds < 10 and experiment.cpu_seconds > 0
        assert not psutil.pid_exists(int(experiment.job_id))


async def test_a_standby_that_dies_is_replaced_and_one_that_dies_at_hand_off_starts_the_run_cold(
    start_runner, connect, tmp_path, monkeypatch, started
):
    agent = write_agent(
        tmp_path,
        "agent.sh",
        "echo 'print(\"acc: 0.75\")' > ok.py\nwhile [ ! -e go ]; do sleep 0.05; done\n"
        "goaltender experiment -d one --metric acc -- python ok.py\n"
        "goaltender experiment -d two --metric acc -- python ok.py\n",
    )
    runner = await start_runner(agents={"a": agent})
    goal_id = await submit(await connect(runner), "ok, max 3 experiments", agent="a")
    first = await eventually(lambda: standby_pids(runner, goal_id))
    for pid in first:
        os.killpg(pid, signal.SIGKILL)
    # Dead, they are seen to be (their socket closes) and replaced.
    await eventually(lambda: standby_pids(runner, goal_id) and not standby_pids(runner, goal_id) & first)

    hand_off = Standby.hand_off
    failed: list[int] = []

    def dies_first(self, job):
        if not failed:  # the first hand-off meets a standby that died since it was taken
            failed.append(self.proc.pid)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return hand_off(self, job)

    monkeypatch.setattr(Standby, "hand_off", dies_first)
    ledger, standbys = await campaign(runner, connect, goal_id), started
    assert [(e.status, e.metric_value) for e in ledger] == [("keep", 0.75), ("discard", 0.75)]
    assert int(ledger[0].job_id) not in standbys  # started cold, after the failed hand-off
    assert failed and failed[0] in standbys
    assert int(ledger[1].job_id) in standbys


# ---- Standbys on their own: a goal's sandbox without a runner ----


def lone_goal(home: Path) -> tuple[RunnerSettings, Goal]:
    """Settings under `home` and goal #1 with its workspace: what a goal's sandbox binds. (The box's
    network: a goal's own is opened by the runner as the goal starts, runner/goal_network.py.)"""
    settings_ = RunnerSettings(home=home, socket=home / "r.sock", sandbox_network="host")
    settings_.make_dirs()
    (home / "agents").mkdir()
    goal = Goal.model_construct(id=1, workspace=str(home / "workspaces" / "goal-1"))
    Path(goal.workspace).mkdir(parents=True)
    settings_.agent_socket(1).touch()  # the sandbox binds the goal's socket: a file will do
    return settings_, goal


def job_for(goal: Goal, command: list[str], env: dict[str, str], log: str) -> Job:
    workspace = Path(goal.workspace)
    return Job(
        goal=goal,
        command=command,
        cwd=workspace,
        env=env,
        log_path=workspace / log,
        name="probe",
        gpus=0,
        timeout_s=None,
        grace_s=1,
    )


async def test_a_run_that_takes_the_standby_still_warming_has_the_next_started_at_once(tmp_path):
    """The goal's last standby taken (it had not yet said it was warm): the next starts with the
    run, not after it, so that the run's eval finds one warm."""
    settings_, goal = lone_goal(tmp_path)
    (Path(goal.workspace) / "ok.py").write_text("print('acc: 1')\n")
    standbys = Standbys(Sandbox(settings_), settings_)
    standbys.keep(goal)
    kept = standbys._kept[goal.id]
    [first] = kept.ready  # warming: its `r` is read by this loop, which has not run since
    job = job_for(goal, [sys.executable, "ok.py"], dict(kept.env), "run.log")
    taken = [first]
    try:
        assert standbys.take(job) is first and not first.warm
        assert not kept.ready  # its replacement's spawn (~6 ms) waits for the hand-off, not the run
        proc = first.hand_off(job)
        await eventually(lambda: kept.ready)
        second = kept.ready[0]  # oldest first: a third may follow it once it is warm
        assert second is not first and second.proc.poll() is None
        status, _ = await wait_process(proc)
        assert status == 0 and job.log_path.read_text() == "acc: 1\n"
        await eventually(lambda: second.warm)
        taken.append(second)
        assert standbys.take(dataclasses.replace(job, log_path=job.log_path.with_name("eval.log"))) is second
    finally:
        await standbys.close()
        for standby in taken:
            await discard(standby)


async def test_a_finished_runs_result_is_passed_on_before_the_next_standby_spawns(tmp_path):
    """A standby taken is replaced once its process has ended, but after its result has gone on:
    the spawn holds the runner a few ms, which the run's eval (or its row) need not wait for."""
    settings_, goal = lone_goal(tmp_path)
    (Path(goal.workspace) / "ok.py").write_text("print('acc: 1')\n")
    standbys = Standbys(Sandbox(settings_), settings_)
    executor = LocalExecutor(standbys.sandbox, "box", standbys)
    standbys.keep(goal)
    kept = standbys._kept[goal.id]
    try:
        await eventually(lambda: len(kept.ready) == 2 and all(s.warm for s in kept.ready))
        job = job_for(goal, [sys.executable, "ok.py"], dict(kept.env), "run.log")

        async def ignore(_: object) -> None:
            return None

        result = await executor.run(job, on_points=ignore, on_start=ignore)
        assert result.exit_code == 0 and job.log_path.read_text() == "acc: 1\n"
        assert len(kept.ready) == 1  # the replacement is not spawned yet: the result came first
        await eventually(lambda: len(kept.ready) == 2)
    finally:
        await standbys.close()


async def test_a_hand_off_that_comes_while_the_standby_imports_stops_its_imports_there(tmp_path, monkeypatch):
    """A run that takes a standby still importing its preload need not wait for the modules it
    may never use: the standby stops at the hand-off (its log descriptor intact) and runs it, with
    what it had imported by then."""
    settings_, goal = lone_goal(tmp_path)
    workspace = Path(goal.workspace)
    lib = workspace / "lib"
    lib.mkdir()
    go = workspace / "go"
    (lib / "slow_first.py").write_text(
        f"import os, time\nopen({str(workspace / 'importing')!r}, 'w').close()\n"
        f"deadline = time.monotonic() + 60\nwhile not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
    )
    (lib / "later_probe.py").write_text("")
    (workspace / "ok.py").write_text(
        "import sys\nfor name in ('slow_first', 'later_probe'): print(name, name in sys.modules)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(lib))
    settings_.preload = ["slow_first", "later_probe"]
    standbys = Standbys(Sandbox(settings_), settings_)
    standbys.keep(goal)
    kept = standbys._kept[goal.id]
    [first] = kept.ready
    job = job_for(goal, [sys.executable, "ok.py"], dict(kept.env), "run.log")
    try:
        await eventually(lambda: (workspace / "importing").exists())
        assert standbys.take(job) is first and not first.warm
        proc = first.hand_off(job)  # waits in the socket while slow_first imports
        go.touch()
        status, _ = await wait_process(proc)
        assert status == 0
        assert job.log_path.read_text() == "slow_first True\nlater_probe False\n"
    finally:
        await standbys.close()
        await discard(first)


# ---- the hand-off itself, property-tested against the interpreter's own words ----

ARGV_PROBE = "import json, sys; print(json.dumps(sys.argv[1:]))\n"
WORDS = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12),
    max_size=5,
)


def test_any_argv_reaches_the_standbys_command_as_given(tmp_path_factory):
    settings_, goal = lone_goal(tmp_path_factory.mktemp("home"))
    (Path(goal.workspace) / "argv_probe.py").write_text(ARGV_PROBE)
    sandbox = Sandbox(settings_)

    async def hand_off(argv: list[str], n: int) -> str:
        standbys = Standbys(sandbox, settings_)
        standbys.keep(goal)
        env = dict(standbys._kept[goal.id].env) | {name: "x" for name in LATE_VARIABLES}
        job = job_for(goal, [sys.executable, "-m", "argv_probe", *argv], env, f"run-{n}.log")
        standby = standbys.take(job)
        assert standby is not None
        status, _ = await wait_process(standby.hand_off(job))
        assert status == 0
        await standbys.close()
        return job.log_path.read_text(errors="surrogateescape")

    counter = iter(range(10**6))

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(WORDS)
    def check(argv: list[str]) -> None:
        assert json.loads(asyncio.run(hand_off(argv, next(counter)))) == argv

    check()


PRIVATE_PATH_AGENT = """
mkdir -p /tmp/private-bin
printf '#!/bin/sh\\necho "the agent'"'"'s python: $*"\\n' > /tmp/private-bin/python
chmod +x /tmp/private-bin/python
echo 'print("the runner'"'"'s python")' > probe.py
export PATH=/tmp/private-bin:$PATH
goaltender experiment -d first -- python -m probe
goaltender experiment -d again -- python -m probe
"""


async def test_a_python_found_first_on_the_sandboxs_own_tmp_runs_as_it_would_cold(
    start_runner, connect, tmp_path, started
):
    """The runner looks `python` up outside the sandbox, where the goal's /tmp is not /tmp: the
    standby looks again inside, and execs what the sandbox's PATH finds first."""
    agent = write_agent(tmp_path, "agent.sh", PRIVATE_PATH_AGENT)
    runner = await start_runner(agents={"a": agent})
    goal_id = await submit(await connect(runner), "private python, max 3 experiments", agent="a")
    ledger, standbys = await campaign(runner, connect, goal_id), started
    logs = [Path(e.log_path).read_text() for e in ledger]
    assert logs == ["the agent's python: -m probe\n"] * 2
    assert int(ledger[1].job_id) in standbys  # taken by a standby, which became the agent's python


def test_the_standby_program_runs_from_its_cached_bytecode(tmp_path):
    """The loader takes standby_process.py's code as an import would: from the bytecode cached for
    it, when that is current (a standby's start does not compile it anew)."""
    source = tmp_path / "program.py"
    source.write_text("print(__name__, 'cached')\n")
    py_compile.compile(str(source), doraise=True)  # __pycache__/, stamped with the source's mtime and size
    stamp = source.stat()
    # The same size and times: the cache still counts as current, so its code is what runs.
    source.write_text("print(__name__, 'edited')\n")
    os.utime(source, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    done = subprocess.run([sys.executable, "-c", LOADER, str(source)], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "goaltender_standby cached\n"), done.stderr
