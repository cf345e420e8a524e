"""Agents and experiments find the runner's own `python` and `goaltender` whatever PATH the runner
was started with: from a venv that is not activated (`.venv/bin/goaltender demo`, a systemd unit's
ExecStart, a wheel's console script), PATH=/usr/bin:/bin has neither. The real runner (in this
process, or started by its console script), the real sandbox, a shell-script agent."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from daemons import Daemon
from helpers import BIN, events_until_report, eventually, submit, write_agent

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner.agent_env import runner_bin_directories, runner_first_path
from goaltender.runner.supervisor import spawn, wait_process

BARE_PATH = "/usr/bin:/bin"  # a service's, or a shell's without the venv activated

# Every probe writes what it found into the workspace; each experiment's ledger row says whether
# its `python` imported goaltender (a crash: it did not).
AGENT = """
command -v goaltender > goaltender.where
command -v python > python.where
goaltender status --help > verb.out 2>&1; echo "verb rc=$?" >> agent.out
python -c 'import goaltender; print(goaltender.__file__)' > import.out 2>&1
echo "import rc=$?" >> agent.out
touch "$(dirname "$(command -v python)")/agent-was-here" 2>/dev/null; echo "venv write rc=$?" >> agent.out
goaltender experiment -d "the agent's PATH" --metric ok -- python -c 'import goaltender; print("ok: 1")'
# Without PATH the CLI asks for none: the run gets the runner's, as every run of a built-in agent does.
env -u PATH "$(command -v goaltender)" experiment -d "the runner's PATH" --metric exact_accuracy \\
    --eval 'python -m goaltender.environments.star_count.evaluate' -- \\
    python -m goaltender.environments.star_count.workload --train-size 64 --hidden 8 --iters 5 --no-cache
goaltender report "both runs imported goaltender"
"""


async def ledger_and_workspace(client: RunnerClient, goal_id: int) -> tuple[list, Path]:
    events = await events_until_report(client, goal_id, timeout=120)
    assert events[-1].data.end_reason == "the agent finished", events[-1].data.end_reason
    summary = await client.request(p.Summary(goal_id=goal_id))
    return summary.ledger, Path(summary.status.goal.workspace)


def assert_found_the_install(ledger: list, workspace: Path, bin_dir: Path) -> None:
    """The agent, its `goaltender` verb, its `python` and both runs used the install in `bin_dir`."""
    said = (workspace / "agent.out").read_text()
    assert "verb rc=0" in said, (workspace / "verb.out").read_text()
    assert "import rc=0" in said, (workspace / "import.out").read_text()
    assert (workspace / "goaltender.where").read_text().strip() == str(bin_dir / "goaltender")
    assert (workspace / "python.where").read_text().strip() == str(bin_dir / "python")
    imported = Path((workspace / "import.out").read_text().strip())
    assert imported.is_relative_to(bin_dir.parent), imported  # the venv's goaltender, not another
    assert "venv write rc=1" in said  # the sandbox shows the install read-only
    assert not (bin_dir / "agent-was-here").exists()

    agents_run, runners_run = ledger
    assert (agents_run.status, agents_run.metric_value) == ("keep", 1.0), agents_run.note
    assert runners_run.status != "crash", (runners_run.note, Path(runners_run.log_path).read_text()[-2000:])
    assert runners_run.verified and runners_run.metric_name == "exact_accuracy"  # the eval ran too


def test_the_runners_directories_come_first_once_and_the_rest_of_path_after():
    own = os.pathsep.join(runner_bin_directories())
    assert runner_bin_directories()[0] == BIN  # as invoked: the venv's bin, not the base interpreter's
    assert runner_first_path(f"/usr/bin:{BIN}:/bin:/usr/bin") == f"{own}:/usr/bin:/bin"
    assert runner_first_path(None) == f"{own}:{os.defpath}"  # unset: what execvp would search
    assert runner_first_path("") == own  # not the working directory, as an empty entry would be


async def test_a_runner_from_a_venv_not_activated_gives_agents_and_runs_its_python_and_verbs(
    start_runner, connect, tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", BARE_PATH)  # this process is the runner: `.venv/bin/goaltender demo`
    runner = await start_runner(agents={"probe": write_agent(tmp_path, "probe.sh", AGENT)})
    client = await connect(runner)
    goal_id = await submit(client, "find the install, max 3 experiments", agent="probe")
    ledger, workspace = await ledger_and_workspace(client, goal_id)
    assert_found_the_install(ledger, workspace, Path(BIN))


async def test_a_runner_started_by_its_console_script_with_a_bare_path(tmp_path, short_dir):
    """As a systemd unit starts it: `<venv>/bin/goaltender runner`, PATH=/usr/bin:/bin and nothing
    else of this test's environment. The venv is this test run's, or GOALTENDER_TEST_INSTALL's
    (`make check-wheel` names the venv it installed the wheel into)."""
    install = Path(os.environ.get("GOALTENDER_TEST_INSTALL") or Path(BIN).parent)
    socket = short_dir / "runner.sock"
    env = {
        "PATH": BARE_PATH,
        "HOME": str(Path.home()),
        "GOALTENDER_HOME": str(tmp_path / "home"),
        "GOALTENDER_SOCKET": str(socket),
        "GOALTENDER_AGENTS": json.dumps({"probe": write_agent(tmp_path, "probe.sh", AGENT)}),
        "GOALTENDER_DEFAULT_AGENT": "probe",
        "GOALTENDER_MIN_FREE_MB": "64",
        "GOALTENDER_STOP_GRACE_S": "1",
    }
    runner = Daemon("runner", env, tmp_path, program=[str(install / "bin" / "goaltender")], cwd=tmp_path)
    await runner.start()
    try:
        await runner.logged("listening on", timeout=60)
        client = await RunnerClient.connect_unix(socket, client="test")
        try:
            goal_id = await submit(client, "find the install, max 3 experiments")
            ledger, workspace = await ledger_and_workspace(client, goal_id)
        finally:
            await client.close()
        assert_found_the_install(ledger, workspace, install / "bin")
    finally:
        await runner.stop()
    assert "Traceback" not in runner.log.read_text()


async def test_the_runners_venv_stays_read_only_in_a_sandbox_that_may_write_around_it(
    start_runner, connect, tmp_path
):
    """Agents and runs use the runner's venv; none may change it, not even a goal whose workspace
    held it (the runner runs that code next)."""
    runner = await start_runner(agents={"hold": write_agent(tmp_path, "hold.sh", "sleep 300\n")})
    client = await connect(runner)
    goal_id = await submit(client, "hold, max 1 experiments", agent="hold")
    goal = await eventually(lambda: _running(runner, goal_id))
    venv = Path(sys.prefix)
    around = goal.model_copy(update={"workspace": str(venv.parent)})  # writable, the venv inside
    probe = ["/bin/sh", "-c", ': > "$1/agent-was-here" && echo wrote', "probe", str(venv / "bin")]
    workspace = Path(goal.workspace)
    launch = runner.campaigns.sandbox.launch(around, probe, cwd=venv.parent, env={"PATH": BARE_PATH})
    try:
        proc = spawn(launch, log_path=workspace / "probe.log", beneath=workspace)
        status, _ = await wait_process(proc)
    finally:
        launch.close()
        written = venv / "bin" / "agent-was-here"
        planted = written.exists()
        written.unlink(missing_ok=True)
    said = (workspace / "probe.log").read_text()
    assert not planted and launch.exit_code(status) != 0 and "Read-only file system" in said, said


async def _running(runner, goal_id: int):
    goal = await runner.store.get_goal(goal_id)
    return goal.state == "running" and goal
