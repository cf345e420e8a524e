"""A goal's sandbox is the runner's decision alone: nothing a goal's agent controls widens it.

Through the real runner, CLI and bubblewrap: goal A's experiment asks for an environment whose
cache variables point at every goal's sockets, goal B's workspace, the skill folder, /etc, /root
and the host's /proc (they had been bound read-write wherever they pointed, and made on the host),
then tries to act as goal B and to write in each place. Then a property test: for any environment
an agent asks for, what a real sandbox of the goal shows, and lets it write, is the same. And the
credentials and secret files of the runner's user, other goals' caches and GPUs are not in it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import string
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import eventually, submit, write_agent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_box_slots import gpu_box  # noqa: F401 (a fixture)

from goaltender.protocol import messages as p
from goaltender.runner.agent_env import CACHE_DIRS, experiment_environment
from goaltender.runner.supervisor import spawn, wait_process
from goaltender.storage.records import MilestoneReported

VICTIM = "goaltender milestone 'B is working'\nsleep 300\n"

# Goal A's run: every cache variable aimed somewhere it must not reach, then an attempt on each.
ESCAPE = """\
for target in "$HF_HOME" "$XDG_CACHE_HOME" "$TORCH_HOME" "$PIP_CACHE_DIR" "$TRITON_CACHE_DIR" \
    "$UV_CACHE_DIR" "$RAY_TMPDIR" "$MPLCONFIGDIR" "$CUDA_CACHE_PATH" "$GOALTENDER_CACHE_DIR"; do
  if touch "$target/{planted}" 2>/dev/null; then echo "wrote $target"; else echo "refused $target"; fi
done
export GOALTENDER_GOAL_ID={b}  # B's own socket would take B's requests from it
out=$(GOALTENDER_SOCKET="$HF_HOME/goal-{b}.sock" goaltender milestone "posted as B" 2>&1); echo "as-B rc=$? $out"
out=$(goaltender --socket "$HF_HOME/goal-{b}.sock" report "B failed" 2>&1); echo "report-B rc=$? $out"
echo 'acc: 1'
"""


def attacker(b: int, home: Path, b_workspace: Path, skills: Path, nowhere: Path, planted: str) -> str:
    aimed = {
        "HF_HOME": home / "agents",  # every goal's socket
        "XDG_CACHE_HOME": b_workspace,
        "TORCH_HOME": skills,
        "PIP_CACHE_DIR": Path("/etc"),
        "TRITON_CACHE_DIR": Path("/root"),
        "UV_CACHE_DIR": Path("/proc"),
        "RAY_TMPDIR": home,
        "MPLCONFIGDIR": home / "cache",
        "CUDA_CACHE_PATH": nowhere,  # made on the host, as the runner's user, before
        "GOALTENDER_CACHE_DIR": Path("/usr/lib"),
    }
    exports = "".join(f"export {var}={path}\n" for var, path in aimed.items())
    script = "cat > escape.sh <<'EOF'\n" + ESCAPE.format(b=b, planted=planted) + "EOF\n"
    return script + exports + "goaltender experiment -d escape --metric acc -- sh escape.sh\n"


async def test_an_experiments_environment_widens_nothing(start_runner, connect, tmp_path):
    nowhere = Path(tempfile.mkdtemp(prefix="gt-", dir="/var/tmp")) / "made" / "by-runner"
    planted = f"planted-{os.getpid()}-{nowhere.parent.parent.name}"
    runner = await start_runner(
        agents={"victim": write_agent(tmp_path, "victim.sh", VICTIM), "attacker": [str(tmp_path / "a.sh")]}
    )
    operator = await connect(runner)
    b = await submit(operator, "victim, max 1 experiments", agent="victim")
    b_goal = await runner.store.get_goal(b)
    await eventually(lambda: settings_socket(runner, b).exists())
    skills = runner.settings.skill_folder
    skills.mkdir(parents=True, exist_ok=True)
    write_agent(
        tmp_path, "a.sh", attacker(b, runner.settings.home, Path(b_goal.workspace), skills, nowhere, planted)
    )
    a = await submit(operator, "escape, max 1 experiments", agent="attacker")
    await eventually(lambda: _ended(runner, a), timeout=60)
    [row] = (await operator.request(p.Summary(goal_id=a))).ledger
    said = Path(row.log_path).read_text()

    assert said.count("refused ") == len(CACHE_DIRS) and "wrote" not in said, said
    assert "as-B rc=4" in said and "report-B rc=4" in said, said
    events = await runner.store.events_since(0, goal_id=b)
    titles = [e.data.title for e in events if isinstance(e.data, MilestoneReported)]
    assert titles == ["B is working"] and await runner.store.agent_report(b) is None
    for place in (
        runner.settings.home / "agents",
        Path(b_goal.workspace),
        skills,
        Path("/etc"),
        Path("/root"),
    ):
        assert not (place / planted).exists(), place
    assert not nowhere.exists() and not nowhere.parent.exists()
    shutil.rmtree(nowhere.parent.parent)


def settings_socket(runner, goal_id: int) -> Path:
    return runner.settings.agent_socket(goal_id)


async def _ended(runner, goal_id: int):
    goal = await runner.store.get_goal(goal_id)
    return goal.state in ("finished", "failed", "stopped") and goal


# ---- the property: any requested environment, the same sandbox ----

# Each line: a path, whether it exists in the sandbox, whether a file can be made in it.
PROBE = r"""
for place in "$@"; do
  if [ -e "$place" ]; then seen=1; else seen=0; fi
  if ( : > "$place/.probe-$$" ) 2>/dev/null; then rm -f "$place/.probe-$$"; wrote=1; else wrote=0; fi
  printf '%s %s %s\n' "$place" "$seen" "$wrote"
done
"""

_NAMES = st.sampled_from(
    [*CACHE_DIRS, "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HOME", "TMPDIR", "LD_PRELOAD", "PATH_EXTRA"]
) | st.text(alphabet=string.ascii_uppercase + "_", min_size=1, max_size=12)


async def _sandbox_view(runner, goal, places: list[Path], requested: dict[str, str]) -> str:
    """What a real sandbox of `goal`, started with `requested` as an experiment's environment,
    sees of `places`."""
    sandbox = runner.campaigns.sandbox
    experiment = (await runner.store.experiments(goal.id))[0]
    env = experiment_environment(runner.settings, goal, experiment, requested)
    workspace = Path(goal.workspace)
    probe = ["/bin/sh", "-c", PROBE, "probe", *map(str, places)]  # its PATH is the request's
    launch = sandbox.launch(goal, probe, cwd=workspace, env=env)
    log = workspace / "probe.log"
    log.unlink(missing_ok=True)
    proc = spawn(launch, log_path=log, beneath=workspace)
    status, _ = await wait_process(proc)
    said = log.read_text()
    assert launch.exit_code(status) == 0, said
    # The probe's lines only: what else it printed (ld.so on an LD_PRELOAD it asked for) aside.
    return "\n".join(line for line in said.splitlines() if line.split(" ")[0] in map(str, places))


@pytest.fixture
async def probed_goal(start_runner, connect, tmp_path):
    """A running goal with one experiment in its ledger, and the places a probe looks at."""
    agent = write_agent(tmp_path, "a.sh", "goaltender experiment -d one -- true\nsleep 300\n")
    runner = await start_runner(agents={"a": agent, "other": write_agent(tmp_path, "o.sh", "sleep 300\n")})
    client = await connect(runner)
    other = await runner.store.get_goal(await submit(client, "other, max 1 experiments", agent="other"))
    goal_id = await submit(client, "probed, max 1 experiments", agent="a")
    await eventually(lambda: runner.store.experiments(goal_id))
    goal = await runner.store.get_goal(goal_id)
    home = runner.settings.home
    places = [
        Path(goal.workspace),
        runner.settings.goal_cache(goal_id) / "pip",
        runner.settings.hub_cache,
        home,
        home / "agents",
        home / "cache",
        Path(other.workspace),
        runner.settings.goal_cache(other.id),
        runner.settings.skill_folder,
        Path("/etc"),
        Path("/root"),
        Path("/usr/lib"),
        Path.home() / ".ssh",
    ]
    runner.settings.hub_cache.mkdir(parents=True, exist_ok=True)
    runner.settings.skill_folder.mkdir(parents=True, exist_ok=True)
    return runner, goal, places


async def test_any_requested_environment_gets_the_same_sandbox(probed_goal):
    runner, goal, places = probed_goal
    expected = await _sandbox_view(runner, goal, places, {})
    rows = map(str.split, expected.splitlines())
    seen = {Path(place): (flag == "1", wrote == "1") for place, flag, wrote in rows}
    assert list(seen) == places
    own_workspace, own_cache, hub, home, agents, cache, other, other_cache, skills = places[:9]
    assert seen[own_workspace] == (True, True) and seen[own_cache] == (True, True)
    assert seen[hub] == (True, False) and seen[skills] == (True, False)
    for hidden in (agents, other, other_cache):
        assert seen[hidden] == (False, False), hidden
    assert not seen[cache][1]  # there only as the way to its own cache and the hub's
    assert not seen[home][1] and all(not wrote for _, wrote in (seen[p] for p in places[9:]))
    assert not seen[Path.home() / ".ssh"][0] or not any(Path("/proc/self/root").glob(".ssh/*"))

    aimed = [str(place) for place in places] + ["/proc", "/", "relative/path", "/var/tmp/gt-never-made/x"]
    values = st.sampled_from(aimed) | st.text(max_size=30).filter(lambda v: "\0" not in v)
    envs = st.dictionaries(_NAMES, values, max_size=8)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(envs)
    def same_view(requested: dict[str, str]) -> None:
        view = asyncio.run_coroutine_threadsafe(_sandbox_view(runner, goal, places, requested), loop).result()
        assert view == expected, requested

    loop = asyncio.get_running_loop()
    await asyncio.to_thread(same_view)
    assert not Path("/var/tmp/gt-never-made").exists()  # nothing a request names is made on the host


async def test_credentials_and_secret_files_are_not_in_a_sandbox(
    start_runner, connect, tmp_path, monkeypatch
):
    """The runner user's ~/.ssh-like files, a file GOALTENDER_SECRETS names and one a secret-named
    variable points at are covered; a granted one's file stays readable. (Under /var/tmp: the
    sandbox's /tmp is the goal's own.)"""
    where = Path(tempfile.mkdtemp(prefix="gt-", dir="/var/tmp"))
    try:
        await _look_for_keys(start_runner, connect, tmp_path, monkeypatch, where)
    finally:
        shutil.rmtree(where)


async def _look_for_keys(start_runner, connect, tmp_path, monkeypatch, where: Path) -> None:
    secret_file = where / "deploy.key"
    secret_file.write_text("deploy-key-0123456789\n")
    credentials = where / "gcp.json"
    credentials.write_text('{"private_key": "gcp-0123456789"}\n')
    granted = where / "granted.json"
    granted.write_text("granted-file\n")
    fake_home = where / "user"
    (fake_home / ".aws").mkdir(parents=True)
    (fake_home / ".aws" / "credentials").write_text("aws-0123456789\n")
    (fake_home / ".netrc").write_text("machine x password netrc-0123456789\n")
    monkeypatch.setenv("HOME", str(fake_home))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
    monkeypatch.setenv("MY_TOKEN_FILE", str(granted))
    script = (
        f"for f in {secret_file} {credentials} {granted} {fake_home}/.aws/credentials {fake_home}/.netrc; do\n"
        '  printf "%s=%s\\n" "$f" "$(cat "$f" 2>/dev/null | head -c 40)" >> seen.txt\n'
        "done\n"
    )
    runner = await start_runner(
        agents={"a": write_agent(tmp_path, "a.sh", script)},
        secrets=[str(secret_file)],
        grants=["MY_TOKEN_FILE"],
    )
    client = await connect(runner)
    goal = await submit(client, "look for keys, max 1 experiments", agent="a")
    done = await eventually(lambda: _ended(runner, goal))
    seen = dict(line.split("=", 1) for line in (Path(done.workspace) / "seen.txt").read_text().splitlines())
    assert seen == {
        str(secret_file): "",
        str(credentials): "",
        str(granted): "granted-file",
        f"{fake_home}/.aws/credentials": "",
        f"{fake_home}/.netrc": "",
    }


async def test_a_run_sees_only_the_gpus_it_was_granted(start_runner, connect, tmp_path, gpu_box):  # noqa: F811
    """Two fake GPUs whose device nodes are real (mknod, minors no driver uses): a 1-GPU run's
    sandbox holds its own node and the driver's shared ones, not the other GPU's; the agent's holds
    none."""
    if os.getuid() != 0:
        pytest.skip("making device nodes needs root")
    minors = (231, 232)
    nodes = [Path(f"/dev/nvidia{m}") for m in minors] + [Path("/dev/nvidia-gt-test-ctl")]
    for number, node in enumerate(nodes):
        if not node.exists():
            os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(195, 230 + number))
    try:
        gpu_box([{"name": "Fake GPU", "memory_mib": 1024, "minor": m} for m in minors])
        run = "ls -d /dev/nvidia* > run-devices.txt; echo $CUDA_VISIBLE_DEVICES > run-cuda.txt"
        script = (
            "ls -d /dev/nvidia* > agent-devices.txt 2>/dev/null\n"
            f"goaltender experiment -d gpu --gpus 1 -- sh -c '{run}'\n"
        )
        runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)})
        client = await connect(runner)
        goal = await submit(client, "gpus, max 1 experiments", agent="a")
        done = await eventually(lambda: _ended(runner, goal))
        workspace = Path(done.workspace)
        assert (workspace / "run-cuda.txt").exists(), (workspace / "agent.log").read_text()
        index = int((workspace / "run-cuda.txt").read_text())
        mine, other = f"/dev/nvidia{minors[index]}", f"/dev/nvidia{minors[1 - index]}"
        run_devices = (workspace / "run-devices.txt").read_text().split()
        assert mine in run_devices and other not in run_devices and str(nodes[2]) in run_devices
        assert not (workspace / "agent-devices.txt").read_text().split()
    finally:
        for node in nodes:
            node.unlink(missing_ok=True)


async def test_remote_executors_only_where_an_operator_allows_them(start_runner, connect, tmp_path):
    """A remote executor runs a goal's commands outside its sandbox: an agent cannot pick one, nor a
    submitter, unless the runner's operator allows it (GOALTENDER_EXECUTORS)."""
    script = (
        "goaltender experiment -d out --executor ray -- true > ray.out 2>&1; echo $? > ray.rc\n"
        "goaltender experiment -d out --executor slurm -- true > slurm.out 2>&1; echo $? > slurm.rc\n"
    )
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", script)})
    client = await connect(runner)
    with pytest.raises(p.ProtocolError, match="may not use the slurm executor") as refused:
        await submit(client, "on the cluster via slurm, max 1 experiments", agent="a")
    assert refused.value.error.code == "forbidden" and "GOALTENDER_EXECUTORS" in str(refused.value)
    goal = await submit(client, "here, max 2 experiments", agent="a")
    done = await eventually(lambda: _ended(runner, goal))
    workspace = Path(done.workspace)
    for engine in ("ray", "slurm"):
        assert (workspace / f"{engine}.rc").read_text() == "4\n"
        said = (workspace / f"{engine}.out").read_text()
        assert f"may not use the {engine} executor" in said and "allowed here: local" in said, said
    assert await runner.store.experiments(goal) == []  # nothing started, nothing counted


# ---- the network: a namespace per goal ----

# Tries each target (host:port, or @name for an abstract Unix socket); prints "target ok|refused".
REACH = r"""
import socket, sys
for target in sys.argv[1:]:
    try:
        if target.startswith("@"):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect("\0" + target[1:])
        else:
            host, port = target.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"hello\n")
            assert s.recv(16) == b"hello\n"
        print(target, "ok")
    except OSError as exc:
        print(target, "refused", type(exc).__name__)
"""


async def _echo_server(host: str) -> asyncio.Server:
    async def echo(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, host, 0)


def _outside_address() -> str | None:
    """An address of this machine's that is not loopback: where a goal's way out leads back in."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


async def test_a_goal_reaches_the_outside_but_not_the_boxs_loopback(
    start_runner, connect, tmp_path, monkeypatch
):
    """Goal A's agent and its experiment share the goal's own loopback (a server the agent starts,
    the run reaches); neither reaches a service on the box's loopback (the runner's own Ray
    dashboard included), nor an abstract socket, nor goal B's loopback; the box's ports the runner
    allows (its model endpoint, GOALTENDER_SANDBOX_PORTS) are relayed; the way out (here: back in,
    through this machine's own address) works."""
    private = await _echo_server("127.0.0.1")  # say, the Ray dashboard the runner submits jobs to
    allowed = await _echo_server("127.0.0.1")
    named = await _echo_server("127.0.0.1")
    outside_host = _outside_address()
    outside = await _echo_server("0.0.0.0") if outside_host else None
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0gt-test-{os.getpid()}")
    abstract.listen()
    port = {server: server.sockets[0].getsockname()[1] for server in (private, allowed, named)}
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://localhost:{port[named]}/v1")  # the model endpoint
    monkeypatch.setenv("GOALTENDER_RAY_ADDRESS", f"http://127.0.0.1:{port[private]}")  # the runner's own
    targets = [
        f"127.0.0.1:{port[private]}",
        f"127.0.0.1:{port[allowed]}",
        f"localhost:{port[named]}",
        f"@gt-test-{os.getpid()}",
        "127.0.0.1:47001",  # the goal's own server
    ]
    if outside is not None:
        targets.append(f"{outside_host}:{outside.sockets[0].getsockname()[1]}")
    own_server = (
        "cat > reach.py <<'EOF'\n" + REACH + "EOF\n"
        "cat > serve.py <<'EOF'\n"
        "import socket\ns = socket.create_server(('127.0.0.1', 47001))\n"
        "while True:\n    c, _ = s.accept(); c.sendall(c.recv(16)); c.close()\nEOF\n"
        "python serve.py &\n"
        "until python -c \"import socket; socket.create_connection(('127.0.0.1', 47001))\" 2>/dev/null; do sleep 0.1; done\n"
    )
    agent = own_server + (
        f"python reach.py {' '.join(targets)} > agent-reach.txt\n"
        f"goaltender experiment -d reach -- python reach.py {' '.join(targets)}\n"
        "touch done\nsleep 300\n"
    )
    other = "cat > reach.py <<'EOF'\n" + REACH + "EOF\npython reach.py 127.0.0.1:47001 > reach.txt\n"
    try:
        runner = await start_runner(
            agents={"a": write_agent(tmp_path, "a.sh", agent), "b": write_agent(tmp_path, "b.sh", other)},
            sandbox_ports=[port[allowed]],
        )
        client = await connect(runner)
        a = await runner.store.get_goal(await submit(client, "reach, max 1 experiments", agent="a"))
        await eventually(lambda: (Path(a.workspace) / "done").exists(), timeout=60)
        b_id = await submit(client, "reach A, max 1 experiments", agent="b")
        b = await eventually(lambda: _ended(runner, b_id))
        [row] = await runner.store.experiments(a.id)
        expected = {
            f"127.0.0.1:{port[private]}": "refused",
            f"127.0.0.1:{port[allowed]}": "ok",
            f"localhost:{port[named]}": "ok",
            f"@gt-test-{os.getpid()}": "refused",
            "127.0.0.1:47001": "ok",
        }
        if outside is not None:
            expected[targets[-1]] = "ok"
        for said in ((Path(a.workspace) / "agent-reach.txt").read_text(), Path(row.log_path).read_text()):
            outcome = {line.split()[0]: line.split()[1] for line in said.splitlines() if line.strip()}
            assert outcome == expected, said
        assert (Path(b.workspace) / "reach.txt").read_text().split()[1] == "refused"  # A's loopback is A's
    finally:
        abstract.close()
        for server in (private, allowed, named, outside):
            if server is not None:
                server.close()


async def test_a_runner_without_slirp4netns_fails_goals_clearly(start_runner, connect, tmp_path, monkeypatch):
    """Isolated networks are the default: without slirp4netns a goal fails saying what to install
    or which setting trades the isolation away; GOALTENDER_SANDBOX_NETWORK=none needs no way out."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bwrap", "nsenter"):
        (tools / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{tools}")
    agent = write_agent(tmp_path, "a.sh", "goaltender milestone 'in a sandbox'\n")
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal = await submit(client, "no way out, max 1 experiments", agent="a")
    failed = await eventually(lambda: _ended(runner, goal))
    assert failed.state == "failed" and "install slirp4netns (apt install slirp4netns)" in failed.end_reason
    assert "GOALTENDER_SANDBOX_NETWORK=host" in failed.end_reason
    await runner.close()
    runner = await start_runner(agents={"a": agent}, sandbox_network="none")
    client = await connect(runner)
    goal = await submit(client, "no network at all, max 1 experiments", agent="a")
    done = await eventually(lambda: _ended(runner, goal))
    assert done.state == "finished", done.end_reason


async def test_a_goal_that_fills_its_disk_cap_stops_alone(start_runner, connect, tmp_path):
    """Goal A's run writes past the goal's disk cap: it is stopped and A pauses, saying what it
    holds; goal B's runs and an operator's status go on; A's agent writing on while paused ends A."""
    fill = "goaltender experiment -d fill -- sh -c 'dd if=/dev/zero of=fill bs=1M count=40 2>/dev/null; sleep 300'\n"
    more = "dd if=/dev/zero of=more bs=1M count=60 2>/dev/null\nsleep 300\n"
    steady = "goaltender experiment -d ok --metric acc -- sh -c 'echo acc: 1'\n" * 3
    runner = await start_runner(
        agents={"a": write_agent(tmp_path, "a.sh", fill + more), "b": write_agent(tmp_path, "b.sh", steady)},
        goal_disk_gb=0.02,  # 20 MB; past it by 16 MB more while paused, it ends
        goal_disk_check_s=0.2,
    )
    client = await connect(runner)
    a = await submit(client, "fill the disk, max 2 experiments", agent="a")
    b = await submit(client, "steady, max 3 experiments", agent="b")
    [row] = await eventually(lambda: _finished_rows(runner, a), timeout=60)
    assert row.status == "crash" and "over its disk cap of 20.0 MB" in row.note, row.note
    ended = await eventually(lambda: _ended(runner, a), timeout=60)
    assert ended.state == "failed" and "while paused for it" in ended.end_reason, ended.end_reason
    events = await runner.store.events_since(0, goal_id=a)
    paused = [e.data.reason for e in events if getattr(e.data, "state", None) == "paused"]
    assert paused and "over its disk cap" in paused[0] and "goaltender disk-usage" in paused[0]
    done_b = await eventually(lambda: _ended(runner, b), timeout=60)
    rows_b = await runner.store.experiments(b)
    assert done_b.state == "finished" and [r.status for r in rows_b] == ["keep", "discard", "discard"]
    asked = time.monotonic()
    status = await client.request(p.Status())
    answered = time.monotonic() - asked
    assert {g.goal.id for g in status.goals} >= {a, b}
    print(  # measured, not asserted: `pytest -s -k disk_cap` (docs/runner.md, each goal's disk cap)
        f"\ndisk fill: goal A's run stopped at {row.wall_seconds:.2f} s, A ended; goal B's runs took "
        f"{', '.join(f'{r.wall_seconds:.2f}' for r in rows_b)} s; a status answered in {answered * 1000:.0f} ms"
    )


async def _finished_rows(runner, goal_id: int):
    rows = await runner.store.experiments(goal_id)
    return rows if rows and all(r.finished for r in rows) else None
