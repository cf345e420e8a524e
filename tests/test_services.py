"""The runner and the bot as systemd services (services.py, readiness.py, deploy/).

The units `goaltender service install` writes pass `systemd-analyze verify` without a word (in CI,
GOALTENDER_REQUIRE_ENGINES=1, a missing systemd-analyze fails the test rather than skipping it).
The environment file examples, every setting uncommented and read as systemd reads them, are
settings the runner and the bot accept. And each daemon, a real subprocess, tells a real
notification socket (a datagram socket the test binds, as systemd does) READY=1 once it serves
and STOPPING=1 on SIGTERM, then exits 0 with one line saying so: the bot's unsent posts stay in
bot.db and the runner's events while it was down reach the thread after its restart; a restarted
runner resumes its goal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from daemons import Daemon
from helpers import eventually, submit, write_agent
from test_bot_faults import GATED_AGENT, Goal, bot_env, both_steps_arrive_once
from test_recovery import connect_when_up

from goaltender.bot.config import BotSettings
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner.config import RunnerSettings
from goaltender.services import DEPLOY, Layout, hidden_by_private_tmp
from goaltender.storage.bot_store import BotStore

GOALTENDER = [sys.executable, "-m", "goaltender.cli"]


class NotifySocket:
    """What systemd listens on for a Type=notify service: a Unix datagram socket."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.notes: list[list[str]] = []  # each datagram's lines

    def received(self) -> list[list[str]]:
        while True:
            try:
                self.notes.append(self.sock.recv(4096).decode().splitlines())
            except BlockingIOError:
                return self.notes

    async def wait_for(self, line: str, count: int = 1, timeout: float = 60) -> list[str]:
        """The `count`th datagram holding `line`."""

        def found() -> list[str] | None:
            holding = [note for note in self.received() if line in note]
            return holding[count - 1] if len(holding) >= count else None

        return await eventually(found, timeout)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(short_dir):
    notes = NotifySocket(short_dir / "notify.sock")
    yield notes
    notes.close()


def shutdown_lines(daemon: Daemon) -> list[str]:
    return [line for line in daemon.lines() if "shutting down" in line]


# ---- the units ----


def install(tmp_path: Path, *words: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GOALTENDER, "service", "install", "--unit-dir", str(tmp_path / "units"),
         "--env-dir", str(tmp_path / "env"), "--home", str(tmp_path / "home"), *words],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        reason = "systemd-analyze is not installed (apt install systemd)"
        if os.environ.get("GOALTENDER_REQUIRE_ENGINES") == "1":
            pytest.fail(f"{reason}; GOALTENDER_REQUIRE_ENGINES=1 (CI) needs it")
        pytest.skip(reason)
    return found


@pytest.mark.parametrize("mode", ["system", "user"])
def test_the_installed_units_pass_systemd_analyze_verify(tmp_path, mode):
    analyze = systemd_analyze()
    done = install(tmp_path, *(["--user"] if mode == "user" else []))
    assert done.returncode == 0, done.stderr
    units = sorted((tmp_path / "units").glob("*.service"))
    assert [u.name for u in units] == ["goaltender-bot.service", "goaltender-runner.service"]
    # verify needs no running systemd; a user manager's checks want a runtime directory.
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    command = [analyze, *(["--user"] if mode == "user" else []), "verify", "--man=no", *map(str, units)]
    checked = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    # verify exits 0 on an unknown key or a value it ignores, and says so: nothing must be said.
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")

    runner, bot = units[1].read_text(), units[0].read_text()
    executable = str(Path(sys.executable).parent / "goaltender")
    assert f"ExecStart={executable} runner" in runner and f"ExecStart={executable} bot" in bot
    for unit in (runner, bot):
        assert "Type=notify" in unit and "Restart=on-failure" in unit
        assert f'Environment="GOALTENDER_HOME={tmp_path / "home"}"' in unit
        assert re.search(r"@[A-Z_]+@", unit) is None
        assert ("User=" in unit) == (mode == "system")
    assert "Delegate=yes" in runner and "Delegate=" not in bot
    # What would break the sandboxes is never set on the runner.
    for setting in ("RestrictNamespaces", "PrivateUsers", "ProtectControlGroups", "PrivateDevices",
                    "ProtectClock", "ProtectKernelTunables", "SystemCallFilter", "ProtectHome"):  # fmt: skip
        assert f"\n{setting}=" not in runner, setting
    assert f"EnvironmentFile=-{tmp_path / 'env'}/bot.env" in bot
    assert "bot.env" not in runner  # the Slack tokens are the bot's alone


def test_install_writes_env_files_once_privately_and_says_what_next(tmp_path):
    first = install(tmp_path)
    assert first.returncode == 0, first.stderr
    env_dir = tmp_path / "env"
    for name in ("goaltender.env", "bot.env"):
        assert (env_dir / name).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "home").is_dir()
    assert "systemctl enable --now goaltender-runner.service" in first.stdout
    (env_dir / "bot.env").write_text("SLACK_BOT_TOKEN=xoxb-mine\n")
    again = install(tmp_path)
    assert again.returncode == 0, again.stderr
    assert (env_dir / "bot.env").read_text() == "SLACK_BOT_TOKEN=xoxb-mine\n"  # an operator's file is kept
    assert f"kept {env_dir / 'bot.env'} (it exists)" in again.stdout


def test_a_path_a_unit_would_misread_is_refused_in_one_line(tmp_path):
    done = install(tmp_path, "--home", str(tmp_path / "my home"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "spaces, quotes, %, $" in done.stderr, done.stderr
    assert not (tmp_path / "units").exists()


def example_settings(name: str) -> dict[str, str]:
    """Every NAME=value of an example, uncommented, as systemd's EnvironmentFile= reads it: for
    the quoting the examples use ('single' quotes, nothing escaped), POSIX shell words."""
    found = {}
    for line in (DEPLOY / name).read_text().splitlines():
        if match := re.fullmatch(r"#?([A-Z][A-Z0-9_]*)=(.*)", line):
            [value] = shlex.split(match[2]) or [""]
            found[match[1]] = value
    return found


def test_every_example_setting_as_systemd_reads_it_is_accepted(monkeypatch):
    settings = example_settings("goaltender.env.example") | example_settings("bot.env.example")
    assert len(settings) >= 15, settings
    # A JSON value unquoted would lose its double quotes to systemd: the examples quote them all.
    for line in (DEPLOY / "goaltender.env.example").read_text().splitlines():
        if re.fullmatch(r"#?[A-Z_]+=[\[{].*", line):
            pytest.fail(f"a JSON value without single quotes: {line}")
    for name in list(os.environ):
        if name.startswith(("GOALTENDER_", "SLACK_")):
            monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    bot = BotSettings()
    runner = RunnerSettings()
    assert bot.goal_channels == ["C0123ABCD"] and bot.runners[0].host == "gpu1.lab"
    assert bot.roles["C0123ABCD"].controllers == ["U0BEN5678"]
    assert runner.executors == ["slurm"] and runner.goal_pids == 8192


# ---- readiness and SIGTERM ----

LONG_AGENT = """
echo "${NOTIFY_SOCKET-unset}" > "$GOALTENDER_WORKSPACE/notify-socket"
date +%s%N >> "$GOALTENDER_WORKSPACE/started"
sleep 600
"""


async def test_the_runner_is_ready_when_it_answers_and_a_sigterm_ends_it_cleanly(tmp_path, short_dir, notify):
    sock = short_dir / "runner.sock"
    env = {
        **os.environ,
        "GOALTENDER_HOME": str(tmp_path / "home"),
        "GOALTENDER_SOCKET": str(sock),
        "GOALTENDER_AGENTS": json.dumps({"long": write_agent(tmp_path, "long.sh", LONG_AGENT)}),
        "GOALTENDER_DEFAULT_AGENT": "long",
        "GOALTENDER_STOP_GRACE_S": "1",
        "GOALTENDER_MIN_FREE_MB": "64",
        "NOTIFY_SOCKET": str(notify.path),
    }
    env.pop("GOALTENDER_CONFIG", None)
    runner = Daemon("runner", env, tmp_path)
    await runner.start()
    try:
        ready = await notify.wait_for("READY=1")
        assert f"STATUS=listening on {sock}" in ready
        # Ready means answering: one try connects (no waiting for the socket).
        client = await RunnerClient.connect_unix(sock, client="test")
        goal_id = await submit(client, "go on until stopped")
        started = tmp_path / "home" / "workspaces" / f"goal-{goal_id}" / "started"
        await eventually(started.exists, 60)
        await client.close()
        # Only the runner speaks to systemd: its agents are not given the socket.
        assert (started.parent / "notify-socket").read_text() == "unset\n"

        assert runner.proc is not None
        runner.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(runner.proc.wait(), 60) == 0
        stopping = await notify.wait_for("STOPPING=1")
        assert any(line.startswith("STATUS=shutting down (SIGTERM)") for line in stopping)
        [said] = shutdown_lines(runner)
        assert said.endswith(" shutting down (SIGTERM)") and "goaltender.runner INFO runner " in said
        assert "Traceback" not in runner.log.read_text()

        # Nothing lost: the restarted runner resumes the goal (its agent starts again).
        await runner.start()
        await notify.wait_for("READY=1", count=2)
        client = await connect_when_up(sock)
        await eventually(lambda: len(started.read_text().split()) == 2, 60)
        # Resumed before the runner was ready, the agent was not given the socket either.
        assert (started.parent / "notify-socket").read_text() == "unset\n"
        [status] = (await client.request(p.Status(goal_id=goal_id))).goals
        assert status.goal.state == "running"
        await client.close()
    finally:
        await runner.stop()


async def test_the_bot_is_ready_once_connected_and_a_sigterm_keeps_what_slack_has_not_taken(
    fake, start_runner, tmp_path, notify
):
    agent = write_agent(tmp_path, "gated.sh", GATED_AGENT)
    runner = await start_runner(agents={"gated": agent}, default_agent="gated")
    home = tmp_path / "bot-home"
    env = bot_env(fake, home, runner.settings.socket_path, NOTIFY_SOCKET=str(notify.path))
    bot = Daemon("bot", env, tmp_path)
    await bot.start()
    try:
        ready = await notify.wait_for("READY=1")
        # Ready means serving: Slack took the tokens and the Socket Mode connection is up.
        assert fake.live_connections and "Slack: connected as" in bot.log.read_text()
        assert any(line.startswith("STATUS=connected to Slack as") for line in ready)
        await bot.wait_linked()
        goal = await Goal.open(fake, runner)

        # Slack holds the first milestone's post back; the bot is stopped while it waits.
        fake.rate_limit("chat.postMessage", times=1, retry_after=10)
        goal.step("first")
        await bot.logged("slack write", "rate limited")
        assert bot.proc is not None
        bot.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(bot.proc.wait(), 60) == 0
        stopping = await notify.wait_for("STOPPING=1")
        assert "STATUS=shutting down (SIGTERM)" in stopping
        [said] = shutdown_lines(bot)
        assert "bot shutting down (SIGTERM)" in said
        assert "Traceback" not in bot.log.read_text()
        store = await BotStore.open(home / "bot.db")
        try:
            assert await store.pending_count() >= 1  # the held post waits in bot.db
        finally:
            await store.close()
        assert not [m for m in goal.replies() if "Step first" in m.text]

        # While the bot is down the agent goes on: its next milestone waits in the runner's log.
        goal.step("second")
        await bot.start()
        await notify.wait_for("READY=1", count=2)
        await both_steps_arrive_once(goal)
    finally:
        await bot.stop()


# ---- the runner as its unit runs it ----

LOOKING_AGENT = """
{{
  echo "uid $(id -u)"
  grep NoNewPrivs /proc/self/status
  test -e {db} && echo "runner.db visible" || echo "runner.db hidden"
}} > "$GOALTENDER_WORKSPACE/seen"
sleep 600
"""


def as_the_unit_runs_it(command: list[str]) -> list[str]:
    """`command` as the runner's system unit runs it, as far as a box without systemd as PID 1
    can: a user's (nobody's) with no_new_privs (NoNewPrivileges=yes), in a mount namespace of its
    own where /usr and /etc are read-only (ProtectSystem=full)."""
    nobody = pwd.getpwnam("nobody")
    drop = [
        "setpriv",
        f"--reuid={nobody.pw_uid}",
        f"--regid={nobody.pw_gid}",
        "--clear-groups",
        "--no-new-privs",
    ]
    protect = 'mount -o bind,ro /usr /usr && mount -o bind,ro /etc /etc && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", protect, "sh", *drop, *command]


def tun_is_everyones() -> bool:
    """slirp4netns, run as the runner's user, opens /dev/net/tun: 0666 on stock systems."""
    return os.stat("/dev/net/tun").st_mode & 0o006 == 0o006


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to another user and read-only mounts need root")
async def test_the_sandbox_works_under_the_runner_units_hardening(short_dir, notify):
    """NoNewPrivileges=yes, a user that is not root, ProtectSystem=full: sandboxed agents still run
    (unprivileged bwrap, its user namespace, the goal's network namespace), see no runner.db, and
    carry no_new_privs themselves. Where the user cannot open /dev/net/tun (this test box's is
    root's alone), an isolated goal fails saying slirp4netns could not, and a goal without a
    network still runs."""
    nobody = pwd.getpwnam("nobody")
    home = short_dir / "home"
    home.mkdir()
    for directory in (home, short_dir):
        os.chown(directory, nobody.pw_uid, nobody.pw_gid)
    agent = write_agent(short_dir, "look.sh", LOOKING_AGENT.format(db=home / "runner.db"))
    sock = short_dir / "runner.sock"
    env = {
        **os.environ,
        "HOME": str(home),
        "GOALTENDER_HOME": str(home),
        "GOALTENDER_SOCKET": str(sock),
        "GOALTENDER_AGENTS": json.dumps({"look": agent}),
        "GOALTENDER_DEFAULT_AGENT": "look",
        "GOALTENDER_OPERATORS": "0",  # this test's user
        "GOALTENDER_STOP_GRACE_S": "1",
        "GOALTENDER_MIN_FREE_MB": "64",
        "NOTIFY_SOCKET": str(notify.path),
    }
    env.pop("GOALTENDER_CONFIG", None)
    os.chmod(notify.path, 0o666)  # systemd's socket takes notes from the service's user

    async def run_goal(network: str, starts: int) -> tuple[str, str]:
        """A goal on a runner with this network mode: its state and what its agent saw."""
        runner = await asyncio.create_subprocess_exec(
            *as_the_unit_runs_it([sys.executable, "-m", "goaltender.cli", "runner"]),
            env={**env, "GOALTENDER_SANDBOX_NETWORK": network},
            stdout=subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await notify.wait_for("READY=1", count=starts)
            client = await RunnerClient.connect_unix(sock, client="test")
            goal_id = await submit(client, f"look around ({network})")
            seen = home / "workspaces" / f"goal-{goal_id}" / "seen"

            async def settled() -> p.GoalStatus | None:
                [status] = (await client.request(p.Status(goal_id=goal_id))).goals
                return status if status.goal.state == "failed" or seen.exists() else None

            status = await eventually(settled, 60)
            await eventually(lambda: not seen.exists() or seen.read_text().count("\n") == 3, 30)
            await client.close()
        finally:
            runner.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(runner.communicate(), 60)
        assert runner.returncode == 0, err.decode()[-3000:]
        said = seen.read_text() if seen.exists() else status.goal.end_reason or ""
        return status.goal.state, said

    if tun_is_everyones():
        state, seen = await run_goal("isolated", 1)
    else:
        state, said = await run_goal("isolated", 1)
        assert state == "failed" and 'slirp4netns failed: open("/dev/net/tun")' in said, said
        state, seen = await run_goal("none", 2)
    assert state == "running"
    assert seen.splitlines() == [f"uid {nobody.pw_uid}", "NoNewPrivs:\t1", "runner.db hidden"]


@pytest.mark.parametrize("user_mode", [False, True])
def test_a_system_service_is_warned_of_paths_its_private_tmp_would_hide(user_mode):
    # Found deploying from a clone in /var/tmp: systemd's fresh /var/tmp has no venv (203/EXEC).
    layout = Layout(
        user_mode=user_mode, account="ml", group="ml", home=Path("/tmp/goaltender"),
        executable=Path("/var/tmp/checkout/.venv/bin/goaltender"), unit_dir=Path("/etc/systemd/system"),
        env_dir=Path("/etc/goaltender"),
    )  # fmt: skip
    warned = hidden_by_private_tmp(layout)
    if user_mode:  # a user service has no PrivateTmp=
        assert warned == []
        return
    assert any(
        line.startswith("warning: goaltender is /var/tmp/checkout/.venv/bin/goaltender, under /var/tmp")
        for line in warned
    ), warned
    assert any(line.startswith("warning: the home is /tmp/goaltender, under /tmp") for line in warned), warned
    layout = dataclasses.replace(
        layout, home=Path("/srv/goaltender"), executable=Path("/opt/goaltender/bin/goaltender")
    )
    assert [
        line for line in hidden_by_private_tmp(layout) if "goaltender is" in line or "home is" in line
    ] == []


def test_the_bot_without_tokens_says_where_a_service_keeps_them(tmp_path):
    # Found on a day-one walkthrough: it said `export SLACK_BOT_TOKEN=…`, a shell's way, not the unit's.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GOALTENDER_"))}
    env["GOALTENDER_HOME"] = str(tmp_path / "home")
    done = subprocess.run([*GOALTENDER, "bot"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2, done.stderr  # RestartPreventExitStatus=2: systemd does not loop
    assert "SLACK_BOT_TOKEN and SLACK_APP_TOKEN are not set" in done.stderr
    assert "/etc/goaltender/bot.env" in done.stderr.splitlines()[-1], done.stderr
