"""A full disk pauses goals instead of killing the runner or leaving rows open.

The disk is real: the runner process runs in bubblewrap with its home on a small tmpfs (`bwrap
--size N --tmpfs HOME`, no root needed), so SQLite and the experiments get a true ENOSPC. An
experiment fills that disk; the test frees it again by deleting the filler through
/proc/<runner pid>/root, the runner's view of its mount namespace. Agents and experiments run
unsandboxed here (GOALTENDER_SANDBOX=none): the sandbox is not what is under test, and the runner
in its own mount namespace keeps this simple.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers import events_until_report, eventually, submit, vouched, write_agent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_recovery import TESTS, alive, connect_when_up

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner import disk_guard, goal_records
from goaltender.runner.trust import user_name
from goaltender.storage.records import ExperimentFinished, GoalStateChanged, MilestoneReported
from goaltender.storage.space import FreeSpace

MB = 1024 * 1024
DISK_MB = 48  # the home's tmpfs
MIN_FREE_MB = 8  # GOALTENDER_MIN_FREE_MB: below it no experiment starts


def start_runner_on_small_disk(
    tmp_path: Path, socket: Path, agent: list[str], **settings: str
) -> subprocess.Popen:
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "GOALTENDER_AGENTS": json.dumps({"a": agent}),
        "GOALTENDER_DEFAULT_AGENT": "a",
        "GOALTENDER_SANDBOX": "none",
        "GOALTENDER_MIN_FREE_MB": str(MIN_FREE_MB),
        "GOALTENDER_DISK_CHECK_S": "0.2",
        "GOALTENDER_STOP_GRACE_S": "1",
        "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        **settings,  # more GOALTENDER_* variables
    }
    small_home = ["bwrap", "--dev-bind", "/", "/", "--size", str(DISK_MB * MB), "--tmpfs", str(home), "--"]
    runner = [sys.executable, "-m", "goaltender.cli", "--socket", str(socket), "runner", "--home", str(home)]
    log = open(tmp_path / "runner.log", "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [*small_home, *runner], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def runner_process(bwrap: subprocess.Popen) -> psutil.Process:
    return next(
        proc
        for proc in psutil.Process(bwrap.pid).children(recursive=True)
        if "goaltender.cli" in proc.cmdline()
    )


def runner_view(bwrap: subprocess.Popen, path: Path) -> Path:
    """`path` as the runner (inside bwrap's mount namespace) sees it."""
    return Path(f"/proc/{runner_process(bwrap).pid}/root") / path.relative_to("/")


def fill_leaving(mb: int) -> str:
    """An experiment that prints its score, then fills the disk up to `mb` MB free, and exits 0."""
    code = f"""
import shutil
print("score: 1", flush=True)
room = shutil.disk_usage(".").free - {mb * MB}
with open("filler", "wb", buffering=0) as filler:
    try:
        while room > 0:
            room -= filler.write(b"\\0" * min(room, 1 << 20))
    except OSError:
        pass  # no space left: what it was for
"""
    return f"python -c {shlex.quote(code)}"


def goal_states(events) -> list[GoalStateChanged]:
    return [e.data for e in events if isinstance(e.data, GoalStateChanged)]


async def stop(bwrap: subprocess.Popen) -> None:
    """SIGTERM the runner's whole group (bwrap does not pass a signal on to the runner it wraps,
    which would outlive the test), then reap bwrap. A runner still shutting down after that is
    killed: one that hung (waiting for room that never came) outlived its tests."""
    runner: psutil.Process | None = None
    with contextlib.suppress(psutil.Error, StopIteration):
        runner = runner_process(bwrap)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(bwrap.pid, signal.SIGTERM)
    try:
        await asyncio.to_thread(bwrap.wait, 30)
    except subprocess.TimeoutExpired:
        os.killpg(bwrap.pid, signal.SIGKILL)
        bwrap.wait()
    if runner is not None:
        try:
            await asyncio.to_thread(runner.wait, 30)
        except psutil.TimeoutExpired:
            runner.kill()
        except psutil.NoSuchProcess:
            pass


async def test_a_run_that_ends_on_a_full_disk_is_closed_once_there_is_room(tmp_path, short_dir):
    out = tmp_path / "agent.out"
    agent = write_agent(
        tmp_path,
        "a.sh",
        f"goaltender experiment -d fills --metric score -- {fill_leaving(0)}\n"
        f'echo "first rc=$?" >> {out}\n'
        f"goaltender experiment -d after --metric score -- python -c 'print(\"score: 2\")'\n"
        f'echo "second rc=$?" >> {out}\n',
    )
    socket = short_dir / "runner.sock"
    runner = start_runner_on_small_disk(tmp_path, socket, agent)
    try:
        client = await connect_when_up(socket)
        goal_id = await submit(client, "fill the disk, max 3 experiments", agent="a")
        runner_log = tmp_path / "runner.log"
        await eventually(lambda: "goals pause, writes wait until there is room" in runner_log.read_text(), 30)

        # The disk is full and the run has ended; the runner is alive and answers, the row waits
        # to be closed (it cannot be written yet).
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        assert status.running is not None and status.running.index == 1
        await eventually(lambda: not alive(status.running.pid))
        workspace = Path(status.goal.workspace)
        assert psutil.disk_usage(str(runner_view(runner, workspace))).free < MB

        runner_view(runner, workspace / "filler").unlink()  # room again
        events = await events_until_report(client, goal_id, timeout=60)
    finally:
        await stop(runner)

    rows = [e.data.experiment for e in events if isinstance(e.data, ExperimentFinished)]
    assert [(r.index, r.status, r.metric_value) for r in rows] == [(1, "keep", 1.0), (2, "keep", 2.0)]
    assert rows[0].wall_seconds is not None and rows[0].cpu_seconds is not None
    states = goal_states(events)
    paused = next(s for s in states if s.state == "paused")
    assert paused.reason.startswith("disk full: ") and f"MB free on {tmp_path / 'home'}" in paused.reason
    resumed = states[states.index(paused) + 1]
    assert resumed.state == "running" and resumed.reason.startswith("resumed: disk space is back (")
    assert states[-1].state == "finished"
    assert out.read_text() == "first rc=0\nsecond rc=0\n"


async def test_no_experiment_starts_below_the_free_space_floor(tmp_path, short_dir):
    out, err = tmp_path / "agent.out", tmp_path / "agent.err"
    agent = write_agent(
        tmp_path,
        "a.sh",
        f"goaltender experiment -d fills --metric score -- {fill_leaving(MIN_FREE_MB // 2)}\n"
        f"goaltender experiment -d refused --metric score -- python -c 'print(\"score: 2\")' 2>> {err}\n"
        f'echo "refused rc=$?" >> {out}\n'
        # The goal is paused now: this one waits until there is room, then runs.
        f"goaltender experiment -d later --metric score -- python -c 'print(\"score: 3\")'\n"
        f'echo "later rc=$?" >> {out}\n',
    )
    socket = short_dir / "runner.sock"
    runner = start_runner_on_small_disk(tmp_path, socket, agent)
    try:
        client = await connect_when_up(socket)
        goal_id = await submit(client, "fill the disk, max 3 experiments", agent="a")

        async def paused():
            status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
            return status if status.goal.state == "paused" and status.running is None else None

        # The second run is refused at its start; or, when the runner's disk watch saw the disk
        # fill while the first still ran, the goal paused then and the second waits for room.
        status = await eventually(lambda: paused_status(client, goal_id), 30)
        runner_view(runner, Path(status.goal.workspace) / "filler").unlink()  # room again
        events = await events_until_report(client, goal_id, timeout=60)
    finally:
        await stop(runner)

    refused = out.read_text().startswith("refused rc=4")
    if refused:
        said = err.read_text()
        assert "the runner refused: experiment not started: disk full: " in said
        assert f"under the {MIN_FREE_MB} MB this runner keeps free (GOALTENDER_MIN_FREE_MB)" in said

    rows = [e.data.experiment for e in events if isinstance(e.data, ExperimentFinished)]
    second = [] if refused else [("refused", 2.0)]
    assert [(r.description, r.metric_value) for r in rows] == [("fills", 1.0), *second, ("later", 3.0)]
    states = goal_states(events)
    paused = next(s for s in states if s.state == "paused")
    assert (
        paused.reason.startswith("disk full: ")
        and "no new experiment starts until there is room" in paused.reason
    )
    assert states[states.index(paused) + 1].reason.startswith("resumed: disk space is back (")
    assert out.read_text() == ("refused rc=4\n" if refused else "refused rc=0\n") + "later rc=0\n"


def fill_and_hold(marker: Path) -> str:
    """An experiment that fills the disk to its last byte, says so (`marker`, outside the small
    disk), and keeps it full: it never ends on its own."""
    code = f"""
import pathlib, shutil, time
with open("filler", "wb", buffering=0) as filler:
    try:
        while True:
            filler.write(b"\\0" * (1 << 20))
    except OSError:
        pass
    try:
        while True:
            filler.write(b"\\0" * 4096)
    except OSError:
        pass
pathlib.Path({str(marker)!r}).touch()
time.sleep(3600)
"""
    return f"python -c {shlex.quote(code)}"


async def goaltender(socket: Path, *args: str) -> tuple[int, str, str]:
    """The operator's CLI against the runner's socket: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "goaltender"),
        *args,
        env={**os.environ, "GOALTENDER_SOCKET": str(socket)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)  # generous: a hang fails, not a slow box
    return proc.returncode or 0, out.decode(), err.decode()


def runner_db(bwrap: subprocess.Popen, home: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """What `sql` finds in runner.db as the runner has written it: in a copy of the file and its
    log (SQLite, opened beside the runner through /proc, resolves the path to this namespace's).
    A commit the copy cut in two is not there: SQLite checks the log's frames."""
    copy = home.parent / "runner-db-copy"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    for name in ("runner.db", "runner.db-wal"):
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(runner_view(bwrap, home / name), copy / name)
    with contextlib.closing(sqlite3.connect(copy / "runner.db")) as db:
        return db.execute(sql, params).fetchall()


AUDIT = "SELECT action, goal_id, outcome, detail FROM audit ORDER BY id"


@contextlib.asynccontextmanager
async def hog_on_a_small_disk(tmp_path: Path, short_dir: Path):
    """A runner on the small disk whose goal's run fills it and keeps it full: (the runner's
    process, a client, the goal's id, the socket), once the disk is full; the runner stopped after."""
    filled = tmp_path / "filled"
    agent = write_agent(
        tmp_path, "a.sh", f"goaltender experiment -d hog --metric score -- {fill_and_hold(filled)}\n"
    )
    socket = short_dir / "runner.sock"
    runner = start_runner_on_small_disk(tmp_path, socket, agent)
    try:
        client = await connect_when_up(socket)
        goal_id = await submit(client, "fill the disk and keep it full, max 3 experiments", agent="a")
        await eventually(filled.exists, 30)
        yield runner, client, goal_id, socket
    finally:
        await stop(runner)


async def paused_status(client, goal_id: int) -> p.GoalStatus | None:
    """The goal's status, once it shows paused (a predicate for `eventually`)."""
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    return status if status.goal.state == "paused" else None


async def test_a_run_that_keeps_the_disk_full_is_stopped_by_an_operator(tmp_path, short_dir):
    async with hog_on_a_small_disk(tmp_path, short_dir) as (runner, client, goal_id, socket):
        # Paused for the disk, as its status shows, though runner.db cannot say so yet.
        status = await eventually(lambda: paused_status(client, goal_id), 30)
        workspace = Path(status.goal.workspace)
        assert psutil.disk_usage(str(runner_view(runner, workspace))).free < MB
        started = runner_process(runner).children(recursive=True)
        assert status.running is not None and status.running.pid in [proc.pid for proc in started]

        # A refusal is answered at once (it used to wait on its audit entry).
        with pytest.raises(p.ProtocolError) as refused:
            await asyncio.wait_for(submit(client, "another, max 1 experiments", agent="a"), 60)
        assert refused.value.error.code == "disk_full"

        code, out, err = await goaltender(socket, "stop", str(goal_id), "--reason", "hogs the disk")
        assert code == 0, err
        assert out.startswith(f"goal #{goal_id} stopped by ")
        assert "runner.db records it (and the final report) when the disk has room" in out
        # The agent and the run (process groups) are gone, and the status says the goal stopped.
        await eventually(lambda: not any(alive(proc.pid) for proc in started), 30)
        stopped = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        assert stopped.goal.state == "stopped" and stopped.goal.end_reason.endswith(": hogs the disk")

        runner_view(runner, workspace / "filler").unlink()  # room again
        events = await events_until_report(client, goal_id, timeout=60)
        home = tmp_path / "home"
        audit = await eventually(
            lambda: (rows := runner_db(runner, home, AUDIT)) and rows[-1][0] == "stop" and rows, 30
        )
        [(state,)] = runner_db(runner, home, "SELECT state FROM goals WHERE id = ?", (goal_id,))

    assert state == "stopped"
    assert [(action, goal, outcome) for action, goal, outcome, _ in audit] == [
        ("submit", goal_id, "done"),
        ("submit", None, "refused"),
        ("stop", goal_id, "done"),
    ]
    assert audit[1][3].startswith("disk_full: no room for a new goal: disk full: ")
    states = goal_states(events)
    assert [s.state for s in states] == ["running", "paused", "stopped"]
    assert states[1].reason.startswith("disk full: ")
    assert states[2].reason.endswith(": hogs the disk")
    run = next(e.data.experiment for e in events if isinstance(e.data, ExperimentFinished))
    assert run.status == "crash" and run.note.startswith("ended with the goal: stopped by ")


async def test_a_runner_stopped_on_a_full_disk_exits_and_says_what_it_could_not_write(tmp_path, short_dir):
    async with hog_on_a_small_disk(tmp_path, short_dir) as (runner, _client, goal_id, socket):
        code, out, err = await goaltender(socket, "stop", str(goal_id))
        assert code == 0 and "when the disk has room" in out, err
        process = runner_process(runner)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGTERM)
        await asyncio.to_thread(process.wait, 60)  # it used to wait for room, forever

    said = (tmp_path / "runner.log").read_text()
    me = f"uid {os.getuid()} ({user_name(os.getuid())})"
    unwritten = [
        f"goal #{goal_id}: its end (stopped: stopped by {me}) is not in runner.db: the disk was still full",
        f"experiment #1's row is not closed (crash: ended with the goal: stopped by {me})",
        "audit: not recorded: runner.db had no room when the runner stopped: ",
    ]
    assert all(line in said for line in unwritten), said[-3000:]
    assert f" stop goal #{goal_id} done by {me}: goal #{goal_id} stopped by {me}" in said


async def test_a_pause_on_a_full_disk_holds_once_there_is_room(tmp_path, short_dir):
    async with hog_on_a_small_disk(tmp_path, short_dir) as (runner, client, goal_id, socket):
        status = await eventually(lambda: paused_status(client, goal_id), 30)  # for the disk
        code, out, err = await goaltender(socket, "pause", str(goal_id))
        assert code == 0, err
        me = f"uid {os.getuid()} ({user_name(os.getuid())})"
        assert out == (
            f"goal #{goal_id} paused by {me} (it was paused for a full disk); it stays paused until "
            "resumed; the disk is full: runner.db records it when there is room\n"
        )
        runner_view(runner, Path(status.goal.workspace) / "filler").unlink()  # room again

        # Written once there is room, and kept: room alone no longer resumes it.
        written = "SELECT state, paused_for_disk FROM goals"
        await eventually(lambda: runner_db(runner, tmp_path / "home", written) == [("paused", 0)], 30)
        assert await paused_status(client, goal_id)
        code, out, err = await goaltender(socket, "resume", str(goal_id))
        assert code == 0 and out == f"goal #{goal_id} resumed\n", err
        code, _, err = await goaltender(socket, "stop", str(goal_id))
        assert code == 0, err
        events = await events_until_report(client, goal_id, timeout=60)

    reasons = [(s.state, s.reason.split(" by ")[0]) for s in goal_states(events)]
    assert [state for state, _ in reasons] == ["running", "paused", "paused", "running", "stopped"]
    assert reasons[1][1].startswith("disk full: ") and reasons[2][1] == "paused"
    assert reasons[3][1] == "resumed"


async def test_an_agent_write_on_a_full_disk_is_taken_and_its_question_refused(tmp_path, short_dir):
    filled, out, err = tmp_path / "filled", tmp_path / "agent.out", tmp_path / "agent.err"
    agent = write_agent(
        tmp_path,
        "a.sh",
        f"goaltender experiment -d hog --metric score -- {fill_and_hold(filled)} &\n"
        f"until [ -e {filled} ]; do sleep 0.1; done\n"
        # Its stdout (agent.log) is on the full disk too: what it is told goes to one that is not.
        f"goaltender milestone 'on a full disk' 'said while the disk is full' >> {out} 2>> {err}\n"
        f'echo "milestone rc=$?" >> {out}\n'
        f"goaltender ask 'may I?' >> {out} 2>> {err}\n"  # no room to ask: refused, not left waiting
        f'echo "ask rc=$?" >> {out}\n'
        "wait\n",
    )
    socket = short_dir / "runner.sock"
    runner = start_runner_on_small_disk(tmp_path, socket, agent)
    try:
        client = await connect_when_up(socket)
        goal_id = await submit(client, "fill the disk and keep it full, max 3 experiments", agent="a")
        await eventually(lambda: out.exists() and "ask rc=" in out.read_text(), 60)
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        runner_view(runner, Path(status.goal.workspace) / "filler").unlink()  # room again
        code, _, stop_err = await goaltender(socket, "stop", str(goal_id))
        assert code == 0, stop_err
        events = await events_until_report(client, goal_id, timeout=60)
    finally:
        await stop(runner)

    assert out.read_text() == (
        "milestone taken: the disk is full; it is written in order when there is room\nmilestone rc=0\n"
        "ask rc=4\n"
    )
    refused = err.read_text()
    assert refused.startswith("goaltender: the runner refused: disk full: ") and refused.endswith(
        ": the question was not asked; try again when there is room\n"
    )
    # Written once there was room, before the goal's end.
    said = [
        e.data.title if isinstance(e.data, MilestoneReported) else e.data.state
        for e in events
        if isinstance(e.data, MilestoneReported | GoalStateChanged)
    ]
    assert said.count("on a full disk") == 1 and "paused" in said
    assert said.index("running") < said.index("on a full disk") < said.index("stopped") == len(said) - 1


def fill(path: Path) -> None:
    """Fill the disk `path` is on to its last byte, with `path`."""
    with open(path, "wb", buffering=0) as ballast:
        for size in (MB, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    ballast.write(b"\0" * size)


MILESTONES = "SELECT data FROM events WHERE kind = 'milestone' ORDER BY seq"


def milestones(bwrap: subprocess.Popen, home: Path) -> list[tuple[str, str]]:
    """(title, text) of each milestone in runner.db, read as the runner reads them (SQLite's JSON
    functions end a text at a NUL)."""
    said = [json.loads(data) for (data,) in runner_db(bwrap, home, MILESTONES)]
    return [(milestone["title"], milestone["text"]) for milestone in said]


async def test_what_an_agent_sends_on_a_full_disk_is_answered_and_kept_in_order(tmp_path, short_dir):
    """Whatever an agent sends while the disk is full (milestones saying anything, requests it may
    not make), each gets its reply, and once there is room runner.db has every milestone it was
    told was taken, in the order sent, and every refusal in the audit trail, in order. Past
    WAITING_WRITES_MOST writes waiting, a milestone is refused (disk_full), and the rest still kept.
    Its inbox is read all the same."""
    socket, home = short_dir / "runner.sock", tmp_path / "home"
    runner = start_runner_on_small_disk(tmp_path, socket, write_agent(tmp_path, "a.sh", "sleep 3600\n"))
    try:
        client = await connect_when_up(socket)
        goal_id = await submit(client, "wait, max 1 experiments", agent="a")
        agent_socket = runner_view(runner, home / "agents" / f"goal-{goal_id}.sock")
        await eventually(agent_socket.exists, 30)
        agent = await RunnerClient.connect_unix(agent_socket, client="agent")
        ballast = runner_view(runner, home / "ballast")
        loop = asyncio.get_running_loop()
        rounds = itertools.count()
        held: list[str] = []  # replies that said the disk was full: the case under test did happen

        def on_loop(coro, timeout: float = 90):
            return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

        async def send(asks: list[tuple[str, str] | None]) -> list[p.Reply]:
            replies: list[p.Reply] = []
            for ask in asks:
                try:
                    if ask is None:
                        await asyncio.wait_for(agent.request(p.Stop(goal_id=goal_id)), 60)
                    else:
                        title, text = ask
                        replies.append(
                            await asyncio.wait_for(
                                agent.request(p.ReportMilestone(goal_id=goal_id, title=title, text=text)),
                                60,
                            )
                        )
                        continue
                except p.ProtocolError as refused:
                    replies.append(refused.error)
            return replies

        def kept(said_count: int, refusals: int):
            async def check():
                said = milestones(runner, home)
                audit = runner_db(runner, home, AUDIT)
                return len(said) >= said_count and len(audit) >= refusals and (said, audit)

            return on_loop(eventually(check, 60))

        @settings(
            max_examples=8,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(st.lists(st.none() | st.text(max_size=300), min_size=1, max_size=20))
        def answered_and_kept(asks: list[str | None]) -> None:
            # A text is a milestone saying it; None a request an agent may not make (stop).
            round_ = next(rounds)
            before = kept(0, 0)
            sent = [None if text is None else (f"round {round_} #{i}", text) for i, text in enumerate(asks)]
            fill(ballast)
            replies = on_loop(send(sent))
            ballast.unlink()  # room again
            told = [ask for ask in sent if ask is not None]
            said, audit = kept(len(before[0]) + len(told), len(before[1]) + asks.count(None))
            for ask, reply in zip(sent, replies, strict=True):
                if ask is None:
                    assert isinstance(reply, p.Error) and reply.code == "forbidden"
                else:
                    assert isinstance(reply, p.Done) and reply.message.startswith(
                        ("milestone logged (event ", "milestone taken: the disk is full")
                    ), reply
                    held.extend([reply.message] if "taken" in reply.message else [])
            assert said[len(before[0]) :] == told
            refusals = audit[len(before[1]) :]
            assert [(action, goal, outcome) for action, goal, outcome, _ in refusals] == [
                ("stop", goal_id, "refused")
            ] * asks.count(None)

        await asyncio.to_thread(answered_and_kept)
        assert held

        # Past the most a goal may have waiting, refused, and the ones taken still kept.
        before = len(milestones(runner, home))
        fill(ballast)
        many = [("many", str(i)) for i in range(goal_records.WAITING_WRITES_MOST + 5)]
        replies = await send(many)
        ballast.unlink()
        taken = [reply for reply in replies if isinstance(reply, p.Done)]
        refused = [reply for reply in replies if isinstance(reply, p.Error)]
        assert refused and all(reply.code == "disk_full" for reply in refused)
        assert refused[0].message.endswith("writes waiting for room already; try again when there is room")
        assert len(taken) < len(many)
        await eventually(lambda: len(milestones(runner, home)) == before + len(taken), 60)

        # Its inbox: a message is given once, unmarked on a full disk, and marked once there is room.
        await client.request(p.Steer(goal_id=goal_id, text="try a smaller lr", author="ana"))
        fill(ballast)
        inbox = await agent.request(p.ReadInbox(goal_id=goal_id))
        assert [m.text for m in inbox.messages] == ["try a smaller lr"]
        assert (await agent.request(p.ReadInbox(goal_id=goal_id))).messages == []
        unread = "SELECT COUNT(*) FROM inbox WHERE read_at IS NULL"
        assert runner_db(runner, home, unread) == [(1,)]
        ballast.unlink()

        async def read_when_there_is_room():
            messages = (await agent.request(p.ReadInbox(goal_id=goal_id))).messages
            assert messages == []  # given already
            return runner_db(runner, home, unread) == [(0,)]

        await eventually(read_when_there_is_room, 30)
        await agent.close()
    finally:
        await stop(runner)


async def test_milestones_folded_on_a_full_disk_are_kept_and_shown_once(tmp_path, short_dir):
    """Past its rate on a full disk, a goal's milestones are taken and told they are folded
    (runner/folding.py); once there is room runner.db has every one in the order sent, marked as
    its reply said, and each folded one in exactly one PostsFolded after it (those wait in the
    goal's queue of writes too)."""
    socket, home = short_dir / "runner.sock", tmp_path / "home"
    agent = write_agent(tmp_path, "a.sh", "sleep 3600\n")
    rate = {"GOALTENDER_MILESTONE_BURST": "2", "GOALTENDER_MILESTONES_PER_MINUTE": "600"}
    runner = start_runner_on_small_disk(tmp_path, socket, agent, **rate)
    try:
        client = await connect_when_up(socket)
        goal_id = await submit(client, "wait, max 1 experiments", agent="a")
        agent_socket = runner_view(runner, home / "agents" / f"goal-{goal_id}.sock")
        await eventually(agent_socket.exists, 30)
        agent_client = await RunnerClient.connect_unix(agent_socket, client="agent")
        ballast = runner_view(runner, home / "ballast")
        fill(ballast)
        replies = [
            await agent_client.request(p.ReportMilestone(goal_id=goal_id, title=f"m{i}", text=""))
            for i in range(12)
        ]
        ballast.unlink()  # room again
        await agent_client.close()

        def logged() -> list[tuple[int, str, dict]] | None:
            rows = runner_db(
                runner, home, "SELECT seq, kind, data FROM events WHERE goal_id = ? ORDER BY seq", (goal_id,)
            )
            events = [(seq, kind, json.loads(data)) for seq, kind, data in rows]
            said = [data for _, kind, data in events if kind == "milestone" and data["title"].startswith("m")]
            folded = sum(data.get("folded", False) for data in said)
            shown = sum(data["milestones"] for _, kind, data in events if kind == "posts_folded")
            return events if len(said) == 12 and folded and shown == folded else None

        events = await eventually(logged, 60)
    finally:
        await stop(runner)

    assert all(reply.message.startswith("milestone taken: the disk is full") for reply in replies), replies
    told_folded = ["; folded: goal #" in reply.message for reply in replies]
    said = [
        (seq, data) for seq, kind, data in events if kind == "milestone" and data["title"].startswith("m")
    ]
    assert [data["title"] for _, data in said] == [f"m{i}" for i in range(12)]  # in the order sent
    assert [data.get("folded", False) for _, data in said] == told_folded and told_folded[:3] == [
        False,
        False,
        True,
    ]
    folded = [seq for seq, data in said if data.get("folded")]
    counted = []
    for seq, kind, data in events:
        if kind == "posts_folded":
            covers = [s for s in folded if data["first_seq"] <= s <= data["last_seq"]]
            assert len(covers) == data["milestones"] and covers[-1] < seq
            counted += covers
    assert counted == folded  # each folded milestone shown once


# ---- the same rules with a stand-in for the free-space probe (in-process runners) ----


def low_disk(monkeypatch, free_mb: float) -> dict[str, float]:
    """Make the runner's free-space probe report `free_mb` (change the returned dict's "mb")."""
    disk = {"mb": free_mb}
    monkeypatch.setattr(disk_guard, "free_space", lambda path: FreeSpace(path, int(disk["mb"] * MB)))
    return disk


# Sandboxed, the agent writes in its workspace only: agent.out is there. It starts when told.
TWO_RUNS = """
until goaltender inbox --all | grep -q go; do sleep 0.1; done
goaltender experiment -d first --metric score -- python -c 'print("score: 1")'
echo "first rc=$?" >> agent.out
goaltender experiment -d second --metric score -- python -c 'print("score: 2")'
echo "second rc=$?" >> agent.out
"""


def said(runner, goal_id: int) -> str:
    out = runner.settings.workspaces / f"goal-{goal_id}" / "agent.out"
    return out.read_text() if out.exists() else ""


async def start_on_a_low_disk(client, disk: dict[str, float]) -> int:
    """Submit a TWO_RUNS goal while there is room, then let the disk run low and the agent go."""
    goal_id = await submit(client, "two runs, max 3 experiments", agent="a")
    disk["mb"] = 1
    await client.request(p.Steer(goal_id=goal_id, text="go"))
    return goal_id


async def test_a_disk_pause_outlives_a_restart(start_runner, connect, tmp_path, monkeypatch):
    disk = low_disk(monkeypatch, 100)
    options = {
        "agents": {"a": write_agent(tmp_path, "a.sh", TWO_RUNS)},
        "min_free_mb": MIN_FREE_MB,
        "disk_check_s": 0.1,
    }
    runner = await start_runner(**options)
    client = await connect(runner)
    goal_id = await start_on_a_low_disk(client, disk)
    await eventually(lambda: "first rc=4" in said(runner, goal_id))
    await runner.close()

    disk["mb"] = 100  # room again while the runner was down
    runner = await start_runner(**options)
    client = await connect(runner)
    events = await events_until_report(client, goal_id)
    states = goal_states(events)
    paused = next(s for s in states if s.state == "paused")
    assert paused.reason == (
        f"disk full: 1 MB free on {runner.settings.home}, under the {MIN_FREE_MB} MB this runner keeps "
        "free (GOALTENDER_MIN_FREE_MB); no new experiment starts until there is room"
    )
    assert (
        states[states.index(paused) + 1].reason
        == f"resumed: disk space is back (100 MB free on {runner.settings.home})"
    )
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert [(e.description, e.status) for e in summary.ledger] == [("first", "keep"), ("second", "keep")]
    assert summary.status.goal.state == "finished"


async def test_a_person_takes_over_a_disk_pause(start_runner, connect, tmp_path, monkeypatch):
    disk = low_disk(monkeypatch, 100)
    agents = {"a": write_agent(tmp_path, "a.sh", TWO_RUNS)}
    runner = await start_runner(agents=agents, min_free_mb=MIN_FREE_MB, disk_check_s=0.1)
    client = await connect(runner)
    goal_id = await start_on_a_low_disk(client, disk)
    await eventually(lambda: "first rc=4" in said(runner, goal_id))

    done = await client.request(p.Pause(goal_id=goal_id, by="ana"))
    assert done.message.endswith("(it was paused for a full disk); it stays paused until resumed")
    assert not await runner.store.paused_for_disk(goal_id)  # room alone no longer resumes it
    disk["mb"] = 100
    await client.request(p.Resume(goal_id=goal_id, by="ana"))
    events = await events_until_report(client, goal_id)

    reasons = [s.reason for s in goal_states(events)]
    assert not any(reason.startswith("resumed: disk space") for reason in reasons)
    assert f"resumed by {vouched('ana')}" in reasons
    assert said(runner, goal_id) == "first rc=4\nsecond rc=0\n"


async def test_no_new_goal_on_a_full_disk(start_runner, connect, tmp_path, monkeypatch):
    low_disk(monkeypatch, 3)
    runner = await start_runner(min_free_mb=MIN_FREE_MB)
    client = await connect(runner)
    with pytest.raises(p.ProtocolError) as refused:
        await submit(client, "anything, max 1 experiments")
    assert refused.value.error.code == "disk_full"
    assert refused.value.error.message.startswith(
        f"no room for a new goal: disk full: 3 MB free on {runner.settings.home}"
    )
    assert (await client.request(p.Status())).goals == []
