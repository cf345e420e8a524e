"""Per-goal limits (runner/limits.py): a goal that fork-bombs or allocates without bound loses its
own runs, nothing else; every process of a goal is in its cgroup, and a goal's end takes all of
them. Through the real runner, bubblewrap, shell-script agents and the kernel's own cgroups, with
small limits so that the bombs stay harmless.

These tests need cgroups the runner may write (root on a box with a writable cgroup filesystem,
or a systemd service with Delegate=yes): without them they fail, unless
GOALTENDER_ALLOW_NO_CGROUPS=1 says this machine has none on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from daemons import Daemon
from helpers import eventually, submit, write_agent
from hypothesis import given, settings
from hypothesis import strategies as st

from goaltender.protocol import messages as p
from goaltender.runner.config import RunnerSettings
from goaltender.runner.limits import GoalCgroups, Tree, joined, plan, runner_id

STEADY = """
while [ ! -e go ]; do sleep 0.05; done
for n in 1 2 3; do
  goaltender experiment -d "steady $n" --metric acc -- python -c 'print("acc: 0.5")'
done
"""
# Every process forks copies of itself for ever: without a limit the box's process table fills;
# with one, a fork that fails is tried again (a bash bomb gives up on a failed fork and ends), a
# little later: the test box is shared.
FORK_BOMB = """python -c '
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.1)
'"""


@pytest.fixture(autouse=True)
def cgroups_here(tmp_path):
    """This machine gives the runner cgroups, or the tests here fail (unless told it has none)."""
    planned = plan(RunnerSettings(home=tmp_path / "probe"))
    if isinstance(planned, str):
        if os.environ.get("GOALTENDER_ALLOW_NO_CGROUPS") == "1":
            pytest.skip(f"no per-goal limits here ({planned}); GOALTENDER_ALLOW_NO_CGROUPS=1")
        pytest.fail(
            f"per-goal limits cannot be tested here: {planned}. Run as root on a box with a writable "
            "cgroup filesystem, or set GOALTENDER_ALLOW_NO_CGROUPS=1 to skip these tests"
        )


def tree(runner) -> Tree:
    limits = runner.campaigns.limits
    assert limits.tree is not None, limits.problem
    return limits.tree


def cgroup_file(runner, goal_id: int, controller: str, name: str) -> Path:
    return tree(runner).parents[controller] / f"goal-{goal_id}" / name


def counter(path: Path, key: str) -> int:
    """A counter of a cgroup's flat-keyed file (pids.events, memory.events); 0 once it is gone."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in lines if line.split()[0] == key), 0)


def processes(pids: set[int]) -> list[psutil.Process]:
    """The processes, known by their start time too: a pid freed since is another's soon (the
    bombs go through thousands)."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def in_goal_cgroup(proc_cgroup: str, runner, goal_id: int) -> bool:
    """Does a /proc/<pid>/cgroup text put the process in the goal's cgroup, in every hierarchy
    the runner limits with?"""
    where = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else ["v2"]:
            where[controller] = path
    suffix = f"/{runner_id(runner.settings)}/goal-{goal_id}"
    wanted = ["v2"] if tree(runner).version == 2 else list(tree(runner).parents)
    return all(where.get(controller, "").endswith(suffix) for controller in wanted)


async def ledger(client, goal_id: int) -> list:
    return (await client.request(p.Summary(goal_id=goal_id))).ledger


async def state(client, goal_id: int) -> str:
    return (await client.request(p.Status(goal_id=goal_id))).goals[0].goal.state


async def ended(client, goal_id: int) -> bool:
    return await state(client, goal_id) in ("finished", "failed", "stopped")


async def running_since(client, goal_id: int) -> float | None:
    """When the goal's run started (epoch seconds), once it runs."""
    running = (await client.request(p.Status(goal_id=goal_id))).goals[0].running
    return running.started_at.timestamp() if running and running.started_at and running.pid else None


async def steady_campaign(client, runner, tmp_path) -> list[float]:
    """A goal of three short runs, started and waited for: their wall times."""
    goal_id = await submit(client, "steady, max 3 experiments", agent="steady")
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    (Path(status.goal.workspace) / "go").touch()
    await eventually(lambda: ended(client, goal_id), timeout=180)
    rows = await ledger(client, goal_id)
    assert [(row.status, row.exit_code) for row in rows] == [("keep", 0), ("discard", 0), ("discard", 0)]
    # Its status says finished as its end begins (runner/campaign.py: end_goal); the cgroup goes last.
    await eventually(lambda: not any(path.exists() for path in tree(runner).goal_dirs(goal_id)))
    return [row.wall_seconds for row in rows]


async def test_a_fork_bomb_is_held_to_its_goal(start_runner, connect, tmp_path):
    """Two goals fork-bomb (64 processes each): their forks fail there; another goal's runs start
    and finish meanwhile, an operator's status and stop are answered, and the bombs end with their
    run's timeout or their goal's stop, every process of theirs gone."""
    agents = {
        "steady": write_agent(tmp_path, "steady.sh", STEADY),
        "bomb": write_agent(tmp_path, "bomb.sh", f"goaltender experiment -d bomb -- {FORK_BOMB}\n"),
        "timed bomb": write_agent(
            tmp_path,
            "timed.sh",
            f"goaltender experiment -d bomb --timeout 15s -- {FORK_BOMB}\necho $? > bombed\n",
        ),
    }
    runner = await start_runner(agents=agents, goal_pids=64)
    assert tree(runner).limits.pids == 64  # before any bomb: without limits it would fill the box
    client = await connect(runner)
    alone = await steady_campaign(client, runner, tmp_path)

    timed = await submit(client, "bomb until the run's timeout, max 1 experiments", agent="timed bomb")
    stopped = await submit(client, "bomb until stopped, max 1 experiments", agent="bomb")
    contained = {}
    for goal_id in (timed, stopped):
        running = await eventually(lambda goal_id=goal_id: running_since(client, goal_id), timeout=60)
        events = cgroup_file(runner, goal_id, "pids", "pids.events")
        await eventually(lambda events=events: counter(events, "max") > 0, timeout=60, interval=0.01)
        contained[goal_id] = time.time() - running
        assert int(cgroup_file(runner, goal_id, "pids", "pids.current").read_text()) <= 64
        if (peak := cgroup_file(runner, goal_id, "pids", "pids.peak")).exists():
            assert int(peak.read_text()) <= 64  # never past the limit, not even for a moment
    bombs = processes({pid for goal_id in (timed, stopped) for pid in tree(runner).members(goal_id)})

    answers = []
    steady_task = asyncio.ensure_future(steady_campaign(client, runner, tmp_path))
    asked = time.monotonic()
    await client.request(p.Status())
    answers.append(time.monotonic() - asked)
    during = await steady_task
    assert int(cgroup_file(runner, stopped, "pids", "pids.current").read_text()) > 32  # still bombing

    asked = time.monotonic()
    await client.request(p.Stop(goal_id=stopped, by="ana"))
    answers.append(time.monotonic() - asked)
    [by_stop] = await ledger(client, stopped)
    assert by_stop.status == "crash" and by_stop.note.startswith("ended with the goal: stopped by ana")

    await eventually(lambda: ended(client, timed), timeout=120)
    [by_timeout] = await ledger(client, timed)
    assert by_timeout.status == "crash"
    assert by_timeout.note.startswith(
        "timeout after 15s; the goal's process limit, 64 (GOALTENDER_GOAL_PIDS), refused "
    )
    assert await state(client, timed) == "finished"  # its agent went on once its run was killed
    assert not [bomb for bomb in bombs if alive(bomb)]
    for goal_id in (timed, stopped):  # its cgroup goes last, as its end is carried out
        await eventually(lambda: not any(path.exists() for path in tree(runner).goal_dirs(goal_id)))  # noqa: B023
    print(
        f"\nfork bombs held at 64 processes: the first fork refused {contained[timed]:.2f} s and "
        f"{contained[stopped]:.2f} s after their runs started; status answered in {answers[0] * 1000:.0f} ms and stop in "
        f"{answers[1] * 1000:.0f} ms during the bombs; the steady goal's runs took "
        f"{', '.join(f'{s:.2f}' for s in alone)} s alone and {', '.join(f'{s:.2f}' for s in during)} s "
        "beside two bombs"
    )


async def test_a_memory_bomb_loses_its_own_run_and_nothing_else(start_runner, connect, tmp_path):
    hog = "x = []\nwhile True: x.append(bytearray(1 << 20))"
    agents = {
        "steady": write_agent(tmp_path, "steady.sh", STEADY),
        "hog": write_agent(
            tmp_path, "hog.sh", f"goaltender experiment -d hog -- python -c '{hog}'\necho $? > hogged\n"
        ),
        "hogging agent": write_agent(tmp_path, "hogging.sh", f"exec python -c '{hog}'\n"),
    }
    runner = await start_runner(agents=agents, goal_memory_mb=128)
    assert tree(runner).limits.memory_mb == 128  # before the hog: without limits it would take the box
    client = await connect(runner)
    hogging = await submit(client, "allocate without bound, max 1 experiments", agent="hog")
    agent = await submit(client, "allocate without bound myself", agent="hogging agent")
    beside = await steady_campaign(client, runner, tmp_path)

    await eventually(lambda: ended(client, hogging), timeout=120)
    [row] = await ledger(client, hogging)
    assert (
        row.status == "crash"
        and row.note == "killed by the goal's memory limit, 128 MB (GOALTENDER_GOAL_MEMORY_MB)"
    )
    goal = (await client.request(p.Status(goal_id=hogging))).goals[0].goal
    assert (Path(goal.workspace) / "hogged").exists()  # its agent outlived the run: the hog was chosen
    assert await state(client, hogging) == "finished"
    print(
        f"\nmemory bomb at 128 MB killed {row.wall_seconds:.2f} s into its run (peak RSS "
        f"{row.peak_rss_mb:.0f} MB); the steady goal's runs beside it took {', '.join(f'{s:.2f}' for s in beside)} s"
    )
    await eventually(lambda: ended(client, agent), timeout=120)
    goal = (await client.request(p.Status(goal_id=agent))).goals[0].goal
    assert goal.state == "failed"
    assert goal.end_reason.startswith(
        "the agent exited with code -9, killed by the goal's memory limit, 128 MB (GOALTENDER_GOAL_MEMORY_MB):"
    ), goal.end_reason


AGENT_MEMBERSHIP = """
cat /proc/self/cgroup > agent.cgroup
# skills/gpu-box-etiquette: how an agent reads its goal's memory limit
{ cat /sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)/memory.max 2>/dev/null ||
  cat /sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)/memory.limit_in_bytes; } > memory.limit
echo 'print(open("/proc/self/cgroup").read())' > probe.py
goaltender experiment -d "a python script" -- python probe.py
goaltender experiment -d "a shell" -- sh -c 'cat /proc/self/cgroup'
touch ran
sleep 600
"""


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_every_process_of_a_goal_is_in_its_cgroup(start_runner, connect, tmp_path, sandbox):
    """The agent, its runs (cold, and handed to a standby) and the standbys waiting: each in the
    goal's cgroup, sandboxed or not."""
    runner = await start_runner(
        agents={"a": write_agent(tmp_path, "a.sh", AGENT_MEMBERSHIP)}, sandbox=sandbox
    )
    client = await connect(runner)
    goal_id = await submit(client, "where am I, max 2 experiments", agent="a")
    workspace = Path((await client.request(p.Status(goal_id=goal_id))).goals[0].goal.workspace)
    await eventually(lambda: (workspace / "ran").exists(), timeout=60)

    assert in_goal_cgroup((workspace / "agent.cgroup").read_text(), runner, goal_id)
    assert int((workspace / "memory.limit").read_text()) == tree(runner).limits.memory_mb << 20
    rows = await ledger(client, goal_id)
    assert [row.exit_code for row in rows] == [0, 0]
    for row in rows:
        assert in_goal_cgroup(Path(row.log_path).read_text().strip(), runner, goal_id), row.log_path
    standbys = runner.campaigns.standbys._kept.get(goal_id)
    waiting = [standby.proc.pid for standby in standbys.ready] if standbys else []
    assert bool(waiting) == (sandbox == "bwrap")  # standbys keep only for sandboxed goals
    for pid in waiting:
        for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            assert in_goal_cgroup(Path(f"/proc/{proc.pid}/cgroup").read_text(), runner, goal_id)
    agent = (await client.request(p.Status(goal_id=goal_id))).goals[0].goal.agent_pid
    assert agent in tree(runner).members(goal_id)  # the agent's sandbox, as the runner started it
    assert os.getpid() not in tree(runner).members(goal_id)


ESCAPE_ATTEMPTS = """
for file in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/*/*/cgroup.procs \
    /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/*/pids.max; do
  [ -e "$file" ] && { echo 0 > "$file"; } 2>/dev/null && echo "wrote $file" >> escaped
done
cat /proc/self/cgroup > after.cgroup
touch tried
sleep 600
"""


async def test_a_sandboxed_agent_cannot_leave_its_cgroup_or_lift_its_limits(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", ESCAPE_ATTEMPTS)})
    client = await connect(runner)
    goal_id = await submit(client, "leave", agent="a")
    workspace = Path((await client.request(p.Status(goal_id=goal_id))).goals[0].goal.workspace)
    await eventually(lambda: (workspace / "tried").exists(), timeout=60)
    assert not (workspace / "escaped").exists(), (workspace / "escaped").read_text()
    assert in_goal_cgroup((workspace / "after.cgroup").read_text(), runner, goal_id)
    assert cgroup_file(runner, goal_id, "pids", "pids.max").read_text().strip() == str(
        runner.settings.goal_pids
    )


# The agent and its run each leave a process behind in a session of its own (setsid, after a
# double fork): no process group or session kill reaches those.
ESCAPING = """
setsid -f sh -c 'echo $$ > agent-escaped; exec sleep 600'
goaltender experiment -d escape -- python -c '
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("run-escaped", "w").write(str(os.getpid()))
        time.sleep(600)
    os._exit(0)
time.sleep(600)
'
"""


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_stop_kills_every_process_of_the_goal_even_one_that_left_its_session(
    start_runner, connect, tmp_path, sandbox
):
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", ESCAPING)}, sandbox=sandbox)
    client = await connect(runner)
    goal_id = await submit(client, "escape, max 1 experiments", agent="a")
    workspace = Path((await client.request(p.Status(goal_id=goal_id))).goals[0].goal.workspace)
    await eventually(lambda: (workspace / "agent-escaped").exists() and (workspace / "run-escaped").exists())
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    sessions = {status.goal.agent_pid, status.running.pid}
    members = processes(tree(runner).members(goal_id))
    escaped = [member for member in members if os.getsid(member.pid) not in sessions]
    assert escaped, "the agent and its run each left a process in a session of its own"

    await client.request(p.Stop(goal_id=goal_id, by="ana"))
    assert not [member for member in members if alive(member)]
    assert not any(path.exists() for path in tree(runner).goal_dirs(goal_id))


LINGERING = """
[ -e escaped.pid ] || setsid -f sh -c 'echo $$ > escaped.pid; exec sleep 600'
touch "started-$$"
sleep 600
"""


async def test_a_restart_clears_the_cgroups_a_killed_runner_left_and_a_stop_removes_its_own(
    tmp_path, short_dir
):
    """SIGKILL the runner while its (unsandboxed) goal left a process in a session of its own: the
    next start kills it and makes the goal a new cgroup; a clean stop removes the runner's cgroups."""
    home = tmp_path / "home"
    agent = write_agent(tmp_path, "a.sh", LINGERING)
    env = {
        **os.environ,
        "GOALTENDER_HOME": str(home),
        "GOALTENDER_SOCKET": str(short_dir / "runner.sock"),
        "GOALTENDER_AGENTS": json.dumps({"a": agent}),
        "GOALTENDER_DEFAULT_AGENT": "a",
        "GOALTENDER_SANDBOX": "none",
        "GOALTENDER_STOP_GRACE_S": "1",
    }
    settings = RunnerSettings(home=home)
    planned = plan(settings)
    assert isinstance(planned, Tree)
    runner = Daemon("runner", env, tmp_path)
    await runner.start()
    try:
        from test_recovery import connect_when_up

        client = await connect_when_up(short_dir / "runner.sock")
        goal_id = await submit(client, "linger", agent="a")
        await client.close()
        workspace = home / "workspaces"
        pid_file = await eventually(lambda: next(workspace.glob("*/escaped.pid"), None))
        [escaped] = processes({int(await eventually(lambda: pid_file.read_text().strip()))})
        assert escaped.pid in planned.members(goal_id)
        runner.kill()
        await runner.killed()
        assert alive(escaped)  # nothing the runner did reached it

        await runner.start()
        client = await connect_when_up(short_dir / "runner.sock")
        await eventually(lambda: len(list(pid_file.parent.glob("started-*"))) == 2, timeout=60)
        assert not alive(escaped)
        resumed = processes(planned.members(goal_id))
        assert resumed and escaped not in resumed  # the resumed agent, in a new cgroup of the goal
        await client.close()
        await runner.stop()
        assert runner.proc is not None and runner.proc.returncode == 0
        assert not [member for member in resumed if alive(member)]
        assert not any(parent.exists() for parent in planned.parents.values())
    finally:
        await runner.stop()


def test_bad_limits_are_one_configuration_line(tmp_path, short_dir):
    for env, says in [
        ({"GOALTENDER_GOAL_PIDS": "3"}, "GOALTENDER_GOAL_PIDS: Input should be greater than or equal to 16"),
        ({"GOALTENDER_GOAL_MEMORY_MB": "lots"}, "GOALTENDER_GOAL_MEMORY_MB: Input should be a valid integer"),
        (
            {"GOALTENDER_GOAL_CPU_WEIGHT": "0"},
            "GOALTENDER_GOAL_CPU_WEIGHT: Input should be greater than or equal to 1",
        ),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "goaltender.cli", "--socket", str(short_dir / "r.sock"), "runner"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "GOALTENDER_HOME": str(tmp_path / "home"), **env},
        )
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith("goaltender: bad configuration: ") and says in line, line


def test_the_default_memory_limit_leaves_the_box_room(tmp_path):
    total = psutil.virtual_memory().total >> 20
    planned = plan(RunnerSettings(home=tmp_path))
    assert isinstance(planned, Tree)
    assert planned.limits.memory_mb == total - max(1024, total // 10)
    assert (planned.limits.pids, planned.limits.cpu_weight) == (8192, 100)


async def test_without_cgroups_the_runner_says_so_once_and_doctor_says_how(short_dir):
    """As an unprivileged user on this box (no cgroup it may write): goals run without limits, the
    runner says so once, and `goaltender doctor` says how to turn them on."""
    nobody = pwd.getpwnam("nobody")
    home = short_dir / "home"  # pytest's own directories are root's alone
    home.mkdir()
    for directory in (home, short_dir):
        os.chown(directory, nobody.pw_uid, nobody.pw_gid)
    # Only what nobody may run: this venv's interpreter lies under /root, closed to it.
    agent = write_agent(short_dir, "a.sh", "cat /proc/self/cgroup > cgroup\n")
    env = {
        **os.environ,
        "HOME": str(home),
        "GOALTENDER_HOME": str(home),
        "GOALTENDER_SOCKET": str(short_dir / "runner.sock"),
        "GOALTENDER_AGENTS": json.dumps({"a": agent}),
        "GOALTENDER_DEFAULT_AGENT": "a",
        "GOALTENDER_OPERATORS": "0",  # this test's user
        "GOALTENDER_SANDBOX": "none",  # unprivileged bubblewrap is another matter
    }
    as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    runner = subprocess.Popen(
        [*as_nobody, sys.executable, "-m", "goaltender.cli", "runner"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        from test_recovery import connect_when_up

        client = await connect_when_up(short_dir / "runner.sock")
        goal_id = await submit(client, "where am I", agent="a")
        await eventually(lambda: ended(client, goal_id), timeout=60)
        goal = (await client.request(p.Status(goal_id=goal_id))).goals[0].goal
        assert goal.state == "finished", goal.end_reason
        assert "goaltender-" not in (Path(goal.workspace) / "cgroup").read_text()  # in the runner's own
        await client.close()
        doctor = subprocess.run(
            [*as_nobody, sys.executable, "-m", "goaltender.cli", "doctor"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        runner.send_signal(signal.SIGTERM)
        output, _ = runner.communicate(timeout=60)
    off = [line for line in output.splitlines() if "per-goal limits are off" in line]
    assert len(off) == 1 and "Delegate=yes" in off[0], output
    assert "limits: off (cgroup v" in output
    [line] = [row for row in doctor.stdout.splitlines() if row[5:].startswith("limits: ")]
    assert line.startswith(f"warn limits: the runner (pid {runner.pid}) runs goals without limits: cgroup v")
    assert "fix: run the runner as a systemd service with Delegate=yes" in line


# Any word an agent may put in a command (no NUL: the protocol refuses it), `--` and options too.
WORDS = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20), max_size=8
)
# Any environment an unsandboxed run may ask for, but the dynamic loader's: LD_PRELOAD runs code
# in the joining shell itself (a sandboxed run's environment is inside bwrap's options, never
# the shell's; an unsandboxed one could leave its cgroup as the runner's user anyway).
ENVIRONMENTS = st.dictionaries(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
        lambda name: not name.startswith("LD_")
    ),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20),
    max_size=6,
)
# Shell builtins only, whatever PATH the environment holds: its cgroups, a NUL, then its words.
PROBE = 'while IFS= read -r l; do printf "%s\\n" "$l"; done < /proc/self/cgroup; printf "\\0"; for w; do printf "%s\\0" "$w"; done'


def test_any_command_and_environment_start_in_the_goals_cgroup_as_given(tmp_path_factory):
    """What an agent chooses of a command and (unsandboxed) its environment neither keeps it
    from joining its goal's cgroup nor reaches it changed."""
    limits = GoalCgroups(RunnerSettings(home=tmp_path_factory.mktemp("home")))
    limits.start()
    assert limits.tree is not None, limits.problem
    files = limits.join(1)
    suffix = f"/{runner_id(limits.settings)}/goal-1"
    wanted = ["0::"] if limits.tree.version == 2 else [f":{c}:" for c in limits.tree.parents]
    try:

        @settings(max_examples=40, deadline=None)
        @given(WORDS, ENVIRONMENTS)
        def check(argv: list[str], env: dict[str, str]) -> None:
            command = joined(files, ["/bin/sh", "-c", PROBE, "probe", *argv])
            done = subprocess.run(command, env=env, capture_output=True, timeout=30)
            assert done.returncode == 0, done.stderr
            cgroups, _, words = os.fsdecode(done.stdout).partition("\0")
            assert words.split("\0")[:-1] == argv
            for part in wanted:
                [line] = [line for line in cgroups.splitlines() if part in line]
                assert line.endswith(suffix), line

        check()
    finally:
        asyncio.run(limits.close())
