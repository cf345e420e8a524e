"""A runner that cannot start says why and exits non-zero, at once: the real `goaltender runner`
process, so that systemd (or whoever watches it) sees the failure instead of a process that waits
forever with no socket.

The unwritable home and the full disk are real, made with bubblewrap (no root needed): a read-only
bind mount of the home, and a small tmpfs (`--size`) filled up before the runner starts on it.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from test_recovery import connect_when_up, start_runner_process

from goaltender.protocol import messages as p
from goaltender.runner.config import RunnerSettings
from goaltender.storage.runner_schema import MIGRATIONS

PROMPTLY_S = 30  # a hang fails here rather than at the suite's timeout


def start_and_fail(home: Path, socket: Path, *, around: list[str] | None = None) -> list[str]:
    """Run `goaltender runner`, expect it to exit 1, and return its stderr lines."""
    command = [sys.executable, "-m", "goaltender.cli", "--socket", str(socket), "runner", "--home", str(home)]
    done = subprocess.run(
        [*(around or []), *command], capture_output=True, text=True, timeout=PROMPTLY_S, env=os.environ
    )
    assert done.returncode == 1, done.stderr
    return done.stderr.splitlines()


def in_bwrap(*options: str) -> list[str]:
    return ["bwrap", "--dev-bind", "/", "/", *options, "--"]


def test_a_corrupt_database(tmp_path, short_dir):
    home = tmp_path / "home"
    home.mkdir()
    (home / "runner.db").write_bytes(b"not a database, whatever it was\n" * 500)
    assert start_and_fail(home, short_dir / "runner.sock") == [
        f"goaltender runner: cannot start: {home}/runner.db is not a usable SQLite database (file is "
        "not a database): move it aside to start with an empty one, or restore it from a backup"
    ]
    assert not (short_dir / "runner.sock").exists()


def test_a_database_from_a_newer_goaltender(tmp_path, short_dir):
    """It was opened as if it were this version's: the runner said it was listening, then every
    status and submit failed on rows it could not read. It stops at start, saying what to do."""
    home = tmp_path / "home"
    home.mkdir()
    newer = len(MIGRATIONS) + 1
    with sqlite3.connect(home / "runner.db") as db:
        db.execute(f"PRAGMA user_version={newer}")
    assert start_and_fail(home, short_dir / "runner.sock") == [
        f"goaltender runner: cannot start: {home}/runner.db is from a newer goaltender (schema version "
        f"{newer}; this one knows up to {len(MIGRATIONS)}): run that version, or restore a backup made with this one"
    ]
    # The bot's bot.db the same way (it opens it before it talks to Slack).
    bot_db = tmp_path / "bot.db"
    with sqlite3.connect(bot_db) as db:
        db.execute("PRAGMA user_version=999")
    env = {
        **os.environ,
        "GOALTENDER_DB": str(bot_db),
        "GOALTENDER_HOME": str(tmp_path),
        "SLACK_BOT_TOKEN": "xoxb-x",
        "SLACK_APP_TOKEN": "xapp-x",
    }
    done = subprocess.run(
        [sys.executable, "-m", "goaltender.cli", "bot"],
        capture_output=True,
        text=True,
        timeout=PROMPTLY_S,
        env=env,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"goaltender bot: cannot start: {bot_db} is from a newer goaltender (schema version 999;"
    )


def test_a_database_damaged_past_its_header(tmp_path, short_dir):
    """It opened, the runner said it was listening, and a status failed later with "database disk
    image is malformed". SQLite's quick_check finds it at start: one line, saying what to do."""
    home = tmp_path / "home"
    home.mkdir()
    with sqlite3.connect(home / "runner.db") as db:
        db.execute("CREATE TABLE filler (id INTEGER PRIMARY KEY, text TEXT)")
        db.executemany("INSERT INTO filler (text) VALUES (?)", [("x" * 200,) for _ in range(1000)])
    with open(home / "runner.db", "r+b") as f:
        f.seek(4096 * 9 + 16)  # inside a page of the table, well past the header
        f.write(b"\xff" * 64)
    [line] = start_and_fail(home, short_dir / "runner.sock")
    assert line.startswith(f"goaltender runner: cannot start: {home}/runner.db is damaged (")
    assert line.endswith(
        f"restore it from a backup, or salvage what is left with `sqlite3 {home}/runner.db .recover | sqlite3 recovered.db` and use that"
    )


def test_an_unwritable_home(tmp_path, short_dir):
    home = tmp_path / "home"
    home.mkdir()
    lines = start_and_fail(
        home, short_dir / "runner.sock", around=in_bwrap("--ro-bind", str(home), str(home))
    )
    assert lines == [
        f"goaltender runner: cannot start: cannot write the runner's home {home}: Read-only file system"
    ]


def test_a_full_disk(tmp_path, short_dir):
    home = tmp_path / "home"
    home.mkdir()
    # A 2 MB tmpfs as the home, filled before the runner starts on it.
    fill = f'head -c 4000000 /dev/zero > {home}/filler 2>/dev/null; exec "$@"'
    around = [*in_bwrap("--size", str(2 * 1024 * 1024), "--tmpfs", str(home)), "sh", "-c", fill, "sh"]
    assert start_and_fail(home, short_dir / "runner.sock", around=around) == [
        f"goaltender runner: cannot start: disk full: 0 MB free on {home}"
    ]


async def test_a_second_runner_on_the_same_socket(tmp_path, short_dir):
    socket = short_dir / "runner.sock"
    (tmp_path / "one").mkdir()
    first = start_runner_process(tmp_path / "one" / "home", socket)
    try:
        client = await connect_when_up(socket)
        lines = start_and_fail(tmp_path / "two", socket)
        assert lines[-1] == f"goaltender runner: cannot start: a runner is already serving {socket}"
        # The first runner's socket is left alone: it still answers.
        assert (await client.request(p.Status())).goals == []
        await client.close()
    finally:
        first.terminate()
        first.wait(timeout=20)


async def test_a_second_runner_on_the_same_home(tmp_path, short_dir):
    """On another socket it started, took the first's running goals for a restart's and killed
    their runs. It is refused, naming who holds the home; the first runs on, and once it has
    stopped the home is free again (its lock goes with it, a kill -9 too)."""
    home = tmp_path / "home"
    first = start_runner_process(home, short_dir / "one.sock")
    try:
        client = await connect_when_up(short_dir / "one.sock")
        lines = start_and_fail(home, short_dir / "two.sock")
        assert lines[-1].startswith(
            f"goaltender runner: cannot start: another runner uses the home {home} (pid {first.pid}"
        )
        assert not (short_dir / "two.sock").exists()
        assert (await client.request(p.Status())).goals == []
        await client.close()
    finally:
        first.kill()
        first.wait(timeout=20)
    second = start_runner_process(home, short_dir / "two.sock")
    try:
        client = await connect_when_up(short_dir / "two.sock")
        await client.close()
    finally:
        second.terminate()
        second.wait(timeout=20)


def test_a_relative_home_is_made_absolute(tmp_path, short_dir, monkeypatch):
    """With GOALTENDER_HOME=hrel every goal failed: the sandboxes could not find hrel/tmp/goal-1."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert RunnerSettings(home=Path("hrel")).goal_tmp(1) == tmp_path / "hrel" / "tmp" / "goal-1"
    assert RunnerSettings(home=Path("~/h"), socket=Path("s.sock")).socket_path == tmp_path / "s.sock"


def start_configured(
    home: Path, socket: Path, env: dict[str, str], command: str = "runner"
) -> subprocess.CompletedProcess:
    """`goaltender runner` (or another command) with `env` added to its environment."""
    argv = [sys.executable, "-m", "goaltender.cli", "--socket", str(socket), command]
    argv += ["--home", str(home)] if command == "runner" else ["--check"]
    environment = {**os.environ, **env}
    return subprocess.run(argv, capture_output=True, text=True, timeout=PROMPTLY_S, env=environment)


def test_a_bad_setting_is_named_with_what_it_held_not_a_traceback(tmp_path, short_dir):
    config = tmp_path / "goaltender.toml"
    config.write_text('min_free_mb = "plenty"\n')
    broken = tmp_path / "broken.toml"
    broken.write_text("min_free_mb = [\n")
    cases = [
        (
            {"GOALTENDER_MIN_FREE_MB": "-5"},
            "GOALTENDER_MIN_FREE_MB: Input should be greater than or equal to 0 (got '-5')",
        ),
        (
            {"GOALTENDER_SANDBOX": "docker"},
            "GOALTENDER_SANDBOX: Input should be 'bwrap' or 'none' (got 'docker')",
        ),
        (
            {"GOALTENDER_AGENTS": "{mine: [x]}"},
            "GOALTENDER_AGENTS is not the JSON it must be (Expecting property name",
        ),
        ({"GOALTENDER_CONFIG": str(config)}, f"min_free_mb in {config}: Input should be a valid number"),
        ({"GOALTENDER_CONFIG": str(broken)}, f"GOALTENDER_CONFIG {broken} is not TOML: Invalid value"),
        # A typo in the file's path used to run the runner on its defaults, the file unread.
        ({"GOALTENDER_CONFIG": str(tmp_path / "goaltender.tom")}, "GOALTENDER_CONFIG is "),
    ]
    for env, says in cases:
        done = start_configured(tmp_path / "home", short_dir / "runner.sock", env)
        assert done.returncode == 2, (env, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith("goaltender: ") and says in line, (env, line)
    # The bot reads its settings the same way.
    done = start_configured(
        tmp_path, short_dir / "runner.sock", {"GOALTENDER_RUNNERS": '[{"name": 1}]'}, "bot"
    )
    # Its last line (the SSH library may warn about its own crypto before it): no traceback.
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "goaltender: bad configuration: GOALTENDER_RUNNERS[0].name: Input should be a valid string (got '1')"
    ), done.stderr
    assert not (short_dir / "runner.sock").exists()


def test_a_setting_this_box_cannot_honour_stops_the_runner_at_start(tmp_path, short_dir):
    for env, says in [
        ({"GOALTENDER_OPERATORS": "no-such-user-here"}, "there is no user named 'no-such-user-here'"),
        # Each goal that names no agent would have been refused, the runner up and looking well.
        ({"GOALTENDER_DEFAULT_AGENT": "mine"}, "GOALTENDER_DEFAULT_AGENT is 'mine', which is none of"),
    ]:
        done = start_configured(tmp_path / "home", short_dir / "runner.sock", env)
        assert done.returncode == 1, (env, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith("goaltender runner: cannot start: ") and says in line, line
    assert not (short_dir / "runner.sock").exists()
