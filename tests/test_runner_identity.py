"""A runner knows its own database: runner.db removed, renamed over or written over while the runner
runs stops it (nothing acknowledged after, what it held saved); a database restored from an earlier
copy never hands out a goal id, workspace, approval id or event seq twice; its identity (made with
runner.db) is in the welcome. Real runner processes, real SQLite files.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import eventually, submit, write_agent

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable
from goaltender.storage.db import Database
from goaltender.storage.high_water import FILE as HIGH_WATER
from goaltender.storage.runner_schema import MIGRATIONS
from goaltender.storage.runner_store import RunnerStore

LOST_MARKER = "database-lost.txt"  # RunnerSettings.lost_marker
STOPS_WITHIN_S = 60  # generous: the runner ends its agents before it exits


def runner_process(home: Path, socket: Path, agent: list[str]) -> subprocess.Popen:
    """`goaltender runner` on `home`, its output in <home>/../runner-<n>.log (stopped() reads it)."""
    env = {
        **os.environ,
        "GOALTENDER_AGENTS": json.dumps({"idle": agent}),
        "GOALTENDER_DEFAULT_AGENT": "idle",
        "GOALTENDER_STOP_GRACE_S": "1",
        "GOALTENDER_MIN_FREE_MB": "64",
    }
    log = home.parent / f"runner-{len(list(home.parent.glob('runner-*.log')))}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "goaltender.cli", "--socket", str(socket), "runner", "--home", str(home)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc.args = log  # where its output goes, for stopped()
    return proc


async def connect_when_up(socket: Path) -> RunnerClient:
    async def connected():
        try:
            return await RunnerClient.connect_unix(socket, client="test")
        except RunnerUnavailable:
            return None

    return await eventually(connected, timeout=30, interval=0.1)


async def stopped(proc: subprocess.Popen) -> tuple[int, str]:
    """The runner's exit code and the last line it wrote."""
    code = await asyncio.to_thread(proc.wait, timeout=STOPS_WITHIN_S)
    return code, Path(proc.args).read_text().strip().splitlines()[-1]


def goals_in(path: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT id, text FROM goals ORDER BY id").fetchall()
    finally:
        conn.close()


def copy_of(db: Path, to: Path) -> Path:
    """A consistent copy of a live database, as `sqlite3 runner.db .backup` makes one."""
    source, target = sqlite3.connect(db), sqlite3.connect(to)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return to


def rename_over(db: Path) -> None:
    other = copy_of(db, db.with_name("other.db"))
    os.replace(other, db)


LOSSES: dict[str, tuple[Callable[[Path], None], str]] = {
    "removed": (lambda db: db.unlink(), "runner.db was removed"),
    "renamed over": (rename_over, "runner.db was replaced by another file"),
    "its -wal removed": (lambda db: Path(f"{db}-wal").unlink(), "runner.db-wal was removed"),
}


@pytest.mark.parametrize("loss", list(LOSSES))
async def test_runner_db_lost_under_a_running_runner_stops_it(tmp_path, short_dir, loss):
    """The runner went on acknowledging writes into a file nobody would read again: a goal
    submitted after runner.db was removed was accepted, and gone at the next start."""
    lose, what = LOSSES[loss]
    home, socket = tmp_path / "home", short_dir / "runner.sock"
    agent = write_agent(tmp_path, "idle.sh", "sleep 300\n")
    proc = runner_process(home, socket, agent)
    try:
        client = await connect_when_up(socket)
        first = await submit(client, "the goal before, budget 1h")
        db = home / "runner.db"
        lose(db)
        with pytest.raises((RunnerUnavailable, ConnectionError)):  # refused, never acknowledged
            await submit(client, "a goal after, budget 1h")
        await client.close()
        code, line = await stopped(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert code == 1
    [saved] = home.glob("runner.db.lost-*")
    marker = home / LOST_MARKER
    assert line == (
        f"goaltender runner: stopped: {home}/{what} while the runner ran; nothing written after that was "
        f"acknowledged. What it held is saved as {saved}. To start again, move {saved} to {db} to go on where "
        f"it stopped, or put the database it should use at {db} (none: a new, empty one), then remove {marker}"
    )
    assert goals_in(saved) == [(first, "the goal before, budget 1h")]
    if (
        loss == "renamed over"
    ):  # the file put there is untouched, and none of the runner's -wal is left to apply to it
        assert goals_in(db) == [(first, "the goal before, budget 1h")]
        assert not Path(f"{db}-wal").exists()

    # Restarted by systemd, it waits for the operator; told how, it goes on where it stopped.
    again = runner_process(home, socket, agent)
    code, line = await stopped(again)
    assert code == 1 and line.startswith("goaltender runner: cannot start: the runner stopped earlier: ")
    assert f"(this start waits until {marker} is removed)" in line
    for sidecar in ("-wal", "-shm"):
        Path(f"{db}{sidecar}").unlink(missing_ok=True)
    os.replace(saved, db)
    marker.unlink()
    resumed = runner_process(home, socket, agent)
    try:
        client = await connect_when_up(socket)
        status = await client.request(p.Status())
        assert [s.goal.id for s in status.goals] == [first]
        assert status.goals[0].goal.state == "running"
        await client.close()
    finally:
        resumed.terminate()
        resumed.wait(timeout=STOPS_WITHIN_S)


async def test_runner_db_written_over_in_place_stops_it_and_leaves_the_choice(tmp_path, short_dir):
    """`cp backup.db runner.db` keeps the file's inode: the runner wrote on, and its checkpoint at
    shutdown wrote its pages into the copied-in file."""
    home, socket = tmp_path / "home", short_dir / "runner.sock"
    agent = write_agent(tmp_path, "idle.sh", "sleep 300\n")
    proc = runner_process(home, socket, agent)
    db = home / "runner.db"
    try:
        client = await connect_when_up(socket)
        first = await submit(client, "the goal before, budget 1h")
        backup = copy_of(db, tmp_path / "backup.db")
        await submit(client, "the goal after the backup, budget 1h")
        shutil.copyfile(backup, db)
        with pytest.raises((RunnerUnavailable, ConnectionError)):
            await submit(client, "a goal after the copy, budget 1h")
        await client.close()
        code, line = await stopped(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert code == 1
    [wal] = home.glob("runner.db-wal.lost-*")
    [shm] = home.glob("runner.db-shm.lost-*")
    marker = home / LOST_MARKER
    assert line == (
        f"goaltender runner: stopped: {db} was written over in place by another program while the runner ran; "
        "nothing written after that was acknowledged. Nothing is saved (what the runner sees is the copy mixed "
        f"with its own writes); its own -wal and -shm, its writes since its last checkpoint, are set aside as {wal} "
        f"and {shm} (put them back beside it only if nothing was copied over it). To start again, put the database "
        f"it should use at {db} (none: a new, empty one), then remove {marker}"
    )
    # Nothing was written into the copied-in file, and nothing is left beside it to be applied to it.
    assert db.read_bytes() == backup.read_bytes()
    assert not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists()
    assert goals_in(db) == [(first, "the goal before, budget 1h")]

    # The operator keeps the copied-in backup: it goes on from there, with new ids.
    marker.unlink()
    again = runner_process(home, socket, agent)
    try:
        client = await connect_when_up(socket)
        assert await submit(client, "a goal on the restored copy, budget 1h") == first + 2
        await client.close()
    finally:
        again.terminate()
        again.wait(timeout=STOPS_WITHIN_S)


@pytest.mark.parametrize("high_water", ["kept", "lost too"])
async def test_a_restored_database_never_hands_out_an_id_twice(start_runner, connect, tmp_path, high_water):
    """A runner.db copied back from a backup numbered its next goal as the first goal made after the
    backup: it got that goal's workspace and its run logs, and (in Slack) its thread."""
    agent = write_agent(tmp_path, "asks.sh", 'goaltender ask "go on?" --timeout 300 >/dev/null\nsleep 300\n')
    runner = await start_runner(agents={"asks": agent}, default_agent="asks")
    client = await connect(runner)
    first = await submit(client, "before the backup, budget 1h")
    await eventually(lambda: pending_approvals(client))
    backup = copy_of(runner.settings.db_path, tmp_path / "backup.db")
    later = [await submit(client, f"after the backup {n}, budget 1h") for n in (1, 2)]
    asked = await eventually(lambda: pending_approvals(client, count=3))
    (runner.settings.workspaces / f"goal-{later[-1]}" / "run.log").write_text("acc: 0.99\n")
    seq_before, runner_id = await runner.store.head_seq(), runner.store.runner_id
    await runner.close()

    db = runner.settings.db_path
    for sidecar in ("-wal", "-shm"):
        Path(f"{db}{sidecar}").unlink(missing_ok=True)
    shutil.copyfile(backup, db)
    if high_water == "lost too":
        (runner.settings.home / HIGH_WATER).unlink()
    restored = await start_runner(
        **{"agents": {"asks": agent}, "default_agent": "asks", "home": runner.settings.home}
    )
    client = await connect(restored)
    assert restored.store.runner_id == runner_id  # the same database, restored
    assert [s.goal.id for s in (await client.request(p.Status())).goals] == [first]

    workspace = restored.settings.workspaces / f"goal-{later[-1] + 1}"
    assert not workspace.exists()
    new = await submit(client, "after the restore, budget 1h")
    assert new == later[-1] + 1  # above every goal this home has had: not #2 again
    assert workspace.is_dir() and not (workspace / "run.log").exists()  # not the old goal's workspace
    if high_water == "kept":  # the events and approvals are numbered above the lost ones too
        head = await client.subscribe(since=0)
        assert head >= seq_before
        approvals = await eventually(lambda: pending_approvals(client, count=2))
        assert approvals[-1] > max(asked)
        events = await restored.store.events_since(0, limit=10_000)
        assert min(e.seq for e in events if e.goal_id == new) > seq_before


async def pending_approvals(client: RunnerClient, count: int = 1) -> list[int] | None:
    status = await client.request(p.Status())
    found = sorted(a.id for s in status.goals for a in s.pending_approvals)
    return found if len(found) >= count else None


async def test_the_welcome_names_the_database_to_a_client_that_asks(
    start_runner, connect, tmp_path, short_dir
):
    runner = await start_runner()
    client = await connect(runner)
    assert client.runner_id == runner.store.runner_id and len(client.runner_id) == 32
    # A client that predates the identity does not ask: its welcome is the line it knows.
    reader, writer = await asyncio.open_unix_connection(str(runner.settings.socket_path))
    writer.write(b'{"id": 1, "type": "hello", "version": 1, "client": "old"}\n')
    welcome = json.loads(await reader.readline())
    writer.close()
    assert welcome == {"id": 1, "type": "welcome", "version": 1, "runner": "test-runner"}

    # Another runner.db (a fresh one) is another database.
    other = await start_runner(home=tmp_path / "other-home", socket=short_dir / "other.sock")
    assert other.store.runner_id != runner.store.runner_id


async def test_an_existing_database_is_given_an_identity_once(tmp_path):
    path = tmp_path / "runner.db"
    db = await Database.open(path, MIGRATIONS[:10])  # as a runner before identities left it
    await db.close()
    store = await RunnerStore.open(path)
    made = store.runner_id
    await store.close()
    store = await RunnerStore.open(path)
    assert store.runner_id == made and len(made) == 32
    await store.close()


async def test_a_client_says_hello_again_to_a_runner_that_predates_identities(short_dir):
    """A runner from before `identity` refuses the field as any unknown one (bad_request): the
    client says hello again without it, and knows no identity."""
    hellos: list[dict] = []

    async def older_runner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            hello = json.loads(line)
            hellos.append(hello)
            if "identity" in hello:  # as that runner's Hello model (extra fields forbidden) answers
                reply = {"id": hello["id"], "type": "error", "code": "bad_request"}
                reply["message"] = "invalid hello: identity: Extra inputs are not permitted"
            else:
                reply = {"id": hello["id"], "type": "welcome", "version": 1, "runner": "old"}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()

    server = await asyncio.start_unix_server(older_runner, path=str(short_dir / "old.sock"))
    try:
        client = await RunnerClient.connect_unix(short_dir / "old.sock", client="test")
        assert (client.runner_name, client.runner_id) == ("old", None)
        assert [("identity" in hello) for hello in hellos] == [True, False]
        await client.close()
    finally:
        server.close()
