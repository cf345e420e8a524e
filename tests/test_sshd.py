"""The bot reaches a runner through a real OpenSSH server (Debian's sshd on 127.0.0.1, a free
port) with a least-privilege key: `command="goaltender runner attach --socket …",restrict` in the
authorized_keys of an account the runner names an operator through a group. The runner runs as its
own account; the bot's transport (bot/transports.py, attach mode) → sshd → forced command →
runner drives a goal to its report. Also: the key runs nothing else, forwards nothing; an account
that is no operator is told which name to add; a changed host key is refused, saying why.

Needs root (it makes Unix accounts and runs sshd) and sshd (`apt-get install openssh-server`,
.ci/run does it): skipped without them, failed when GOALTENDER_REQUIRE_ENGINES=1 (CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest
from helpers import events_until_report, eventually, submit

from goaltender.bot.transports import HostKeyRejected, RunnerTarget, _ssh_connect, open_client
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable
from goaltender.runner import operators
from goaltender.storage.records import FinalReport

SSHD = "/usr/sbin/sshd"
SYSTEM_PYTHON = "/usr/bin/python3"  # the accounts cannot run this venv's when it lives under /root
LOCK_WAIT_S = 60  # useradd and friends refuse while another holds /etc/passwd's lock: tried again

AGENT = """#!/bin/sh
goaltender milestone "Plan" "reached through sshd"
goaltender report "done, over a forced command"
"""


def _require() -> None:
    missing = []
    if os.getuid() != 0:
        missing.append("root (to make Unix accounts and run sshd)")
    if not Path(SSHD).exists():
        missing.append(f"{SSHD} (apt-get install openssh-server)")
    if not Path(SYSTEM_PYTHON).exists():
        missing.append(SYSTEM_PYTHON)
    if missing:
        reason = "needs " + ", ".join(missing)
        if os.environ.get("GOALTENDER_REQUIRE_ENGINES") == "1":
            pytest.fail(f"{reason} (GOALTENDER_REQUIRE_ENGINES=1)")
        pytest.skip(reason)


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _accounts_tool(*argv: str, check: bool = True) -> None:
    """useradd, usermod, userdel, groupadd, groupdel: waiting while another test holds the lock."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        ran = subprocess.run(argv, capture_output=True, text=True)
        if ran.returncode == 0 or "lock" not in ran.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # a retry's pace, not a wait for something: the lock has no signal to wait on
    if check and ran.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {ran.stderr.strip()}")


@dataclass(frozen=True)
class Accounts:
    """The box's accounts and the operators' group, named afresh for each test (tests run side by
    side): the runner's, the bot's (an operator by the group), and one that is no operator."""

    runner: str
    bot: str
    outsider: str
    ops: str

    @classmethod
    def make(cls) -> Accounts:
        tag = f"gt{secrets.token_hex(3)}"
        made = cls(f"{tag}-runner", f"{tag}-bot", f"{tag}-outsider", f"{tag}-ops")
        _accounts_tool("groupadd", made.ops)
        for name, groups in ((made.runner, []), (made.bot, [made.ops]), (made.outsider, [])):
            joined = ["-G", ",".join(groups)] if groups else []
            _accounts_tool("useradd", "--create-home", "--shell", "/bin/sh", *joined, name)
            _accounts_tool("usermod", "-p", "*", name)  # no password, yet not locked: sshd lets a key in
        os.chmod(f"/home/{made.runner}", 0o700)  # as adduser makes homes on Debian 12
        return made

    def remove(self) -> None:
        for name in (self.runner, self.bot, self.outsider):
            _accounts_tool("userdel", "--force", "--remove", name, check=False)
        _accounts_tool("groupdel", self.ops, check=False)


def _let_accounts_through(places: list[Path], uids: list[int]) -> list[tuple[Path, operators.Entries]]:
    """Let the accounts read `places` (Python lists a package's folder) and pass through the
    directories above them, where these keep them out (a CI checkout under a 0700 directory);
    the ACLs as they were, to put back."""
    wanted: dict[Path, int] = {}
    for place in (place.resolve() for place in places):
        wanted |= {parent: operators.X for parent in place.parents if parent not in wanted}
        wanted[place] = operators.R | operators.X
    changed: list[tuple[Path, operators.Entries]] = []
    for directory, perm in sorted(wanted.items()):
        before = operators.read_acl(directory)
        mode = os.stat(directory).st_mode
        if perm == operators.X and all(operators.may_search(directory, uid, None) for uid in uids):
            continue
        if perm != operators.X and mode & 0o005 == 0o005:  # anyone may read and enter it already
            continue
        operators.write_acl(directory, before | {(operators.USER, uid): perm for uid in uids})
        changed.append((directory, before))
    return changed


def _python_for_accounts(shared: Path, account: str) -> Path:
    """A `goaltender` the accounts can run: the system Python with this venv's packages on its path
    (this venv's interpreter may be under /root, which only root may enter)."""
    version = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    if version != str(sys.version_info[:2]):  # this venv's compiled packages are for its own Python
        pytest.fail(f"{SYSTEM_PYTHON} is Python {version}, this venv's is {sys.version_info[:2]}")
    env = shared / "py"
    _sh(SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(env))
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    ours = sysconfig.get_path("purelib")
    (purelib / "goaltender-test.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    command = env / "bin" / "goaltender"
    command.write_text(f'#!/bin/sh\nexec {env}/bin/python -W ignore -m goaltender.cli "$@"\n')
    command.chmod(0o755)
    probe = subprocess.run(
        ["runuser", "-u", account, "--", str(command), "--help"], capture_output=True, text=True, cwd="/"
    )
    if probe.returncode != 0:
        pytest.fail(
            f"the test's accounts cannot run goaltender from {ours} (is this checkout readable?): {probe.stderr[-500:]}"
        )
    return command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Box:
    """The box: its accounts, its runner, and its sshd."""

    accounts: Accounts
    shared: Path  # readable by the accounts: the goaltender command, the agent
    private: Path  # root's: sshd's config and host keys, the bot's keys
    goaltender: Path
    port: int
    runner_socket: Path
    sshd: subprocess.Popen | None = None
    runner: asyncio.subprocess.Process | None = None

    def host_key(self, name: str = "host_ed25519") -> str:
        """A host key for sshd (made once); its public line, as the bot pins it."""
        key = self.private / name
        if not key.exists():
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        return " ".join(Path(f"{key}.pub").read_text().split()[:2])

    def start_sshd(self, host_key: str = "host_ed25519") -> None:
        self.host_key(host_key)
        config = self.private / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.private / host_key}",
                    "PidFile none",
                    "UsePAM no",  # no PAM session: the accounts' '*' password means "key only"
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "AuthorizedKeysFile .ssh/authorized_keys",
                    "StrictModes yes",  # the homes and .ssh are their owners' alone, as sshd wants
                    "PermitRootLogin no",
                    f"AllowUsers {self.accounts.runner} {self.accounts.bot} {self.accounts.outsider}",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege separation directory
        log = (self.private / "sshd.log").open("ab")
        self.sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log)

    async def sshd_answers(self) -> None:
        async def banner() -> bool:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                assert self.sshd is not None and self.sshd.poll() is None, self.sshd_log()
                return False
            line = await reader.readline()
            writer.close()
            return line.startswith(b"SSH-2.0-OpenSSH")

        await eventually(banner, 30)

    def stop_sshd(self) -> None:
        if self.sshd is not None and self.sshd.poll() is None:
            self.sshd.terminate()
            self.sshd.wait(10)

    def sshd_log(self) -> str:
        return (self.private / "sshd.log").read_text()[-3000:]

    def authorize(self, account: str, key_name: str) -> Path:
        """The account's authorized_keys gets a new key of the bot's, held to the forced command."""
        key = self.private / key_name
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        public = Path(f"{key}.pub").read_text().strip()
        forced = f"{self.goaltender} runner attach --socket {self.runner_socket}"
        ssh = Path(f"/home/{account}/.ssh")
        ssh.mkdir(mode=0o700, exist_ok=True)
        keys = ssh / "authorized_keys"
        keys.write_text(f'command="{forced}",restrict {public}\n')
        keys.chmod(0o600)
        owner = pwd.getpwnam(account)
        for path in (ssh, keys):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        return key

    def target(self, account: str, key: Path, **fields) -> RunnerTarget:
        return RunnerTarget(
            **{
                "name": "box",
                "host": "127.0.0.1",
                "port": self.port,
                "username": account,
                "client_key": key,
                "known_hosts": self.host_key(),
                "mode": "attach",
                "remote_socket": str(self.runner_socket),
                "connect_timeout": 30,
                **fields,
            }
        )


@pytest.fixture
async def box() -> AsyncIterator[Box]:
    _require()
    shared = Path(tempfile.mkdtemp(prefix="gt-sshd-", dir="/tmp"))
    private = Path(tempfile.mkdtemp(prefix="gt-sshd-root-", dir="/tmp"))
    shared.chmod(0o755)
    the_box: Box | None = None
    accounts: Accounts | None = None
    opened: list[tuple[Path, operators.Entries]] = []
    try:
        accounts = Accounts.make()
        runner = accounts.runner
        uids = [pwd.getpwnam(name).pw_uid for name in (runner, accounts.bot, accounts.outsider)]
        opened = _let_accounts_through(
            [Path(sysconfig.get_path("purelib")), Path(__file__).parent.parent], uids
        )
        goaltender = _python_for_accounts(shared, accounts.bot)
        agent = shared / "agent.sh"
        agent.write_text(AGENT)
        agent.chmod(0o755)
        home = Path(f"/home/{runner}/.goaltender")
        the_box = Box(accounts, shared, private, goaltender, _free_port(), home / "runner.sock")
        env = {
            "HOME": f"/home/{runner}",
            "PATH": f"{goaltender.parent}:/usr/bin:/bin",
            "GOALTENDER_OPERATORS": f"{runner},@{accounts.ops}",  # its own account, and the bot's by its group
            "GOALTENDER_AGENTS": json.dumps({"script": [str(agent)]}),
            "GOALTENDER_DEFAULT_AGENT": "script",
            "GOALTENDER_SANDBOX": "none",  # what this test is about is the way in, not the sandbox
            "GOALTENDER_MIN_FREE_MB": "64",
            "GOALTENDER_STOP_GRACE_S": "1",
        }
        with (private / "runner.log").open("wb") as log:
            the_box.runner = await asyncio.create_subprocess_exec(
                str(goaltender), "runner", env=env, stdout=log, stderr=log, user=runner, group=runner,
                extra_groups=[], cwd="/",
            )  # fmt: skip

        def listening() -> bool:
            assert the_box is not None and the_box.runner is not None
            assert the_box.runner.returncode is None, (private / "runner.log").read_text()[-3000:]
            return "listening on" in (private / "runner.log").read_text()

        await eventually(listening, 60)
        the_box.start_sshd()
        await the_box.sshd_answers()
        yield the_box
    finally:
        if the_box is not None:
            the_box.stop_sshd()
            if the_box.runner is not None and the_box.runner.returncode is None:
                the_box.runner.send_signal(signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(the_box.runner.wait(), 30)
                if the_box.runner.returncode is None:
                    the_box.runner.kill()
                    await the_box.runner.wait()
        for directory, acl in opened:
            operators.write_acl(directory, acl)
        if accounts is not None:
            accounts.remove()
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


async def test_a_goal_through_sshd_and_a_forced_command(box: Box):
    key = box.authorize(box.accounts.bot, "bot_ed25519")
    client = await open_client(box.target(box.accounts.bot, key), "goaltender-bot")
    try:
        goal_id = await submit(client, "count stars over ssh, max 1 experiments", owner="slack:U1")
        events = await events_until_report(client, goal_id, timeout=120)
    finally:
        await client.close()
    report = events[-1].data
    assert isinstance(report, FinalReport) and "done, over a forced command" in report.text
    milestones = [e.data for e in events if e.data.kind == "milestone"]
    assert any("reached through sshd" in str(m) for m in milestones)
    # The runner knows the bot's account (by the socket's peer uid) and whom it vouched for.
    bot_uid = pwd.getpwnam(box.accounts.bot).pw_uid
    operator = await open_client(box.target(box.accounts.bot, key), "auditor")
    try:
        entries = (await operator.request(p.Audit(goal_id=goal_id))).entries
    finally:
        await operator.close()
    assert any(e.actor == f"slack:U1 via goaltender-bot (uid {bot_uid})" for e in entries), entries


async def test_the_key_runs_the_bridge_and_nothing_else(box: Box):
    key = box.authorize(box.accounts.bot, "bot_ed25519")
    target = box.target(box.accounts.bot, key)
    conn = await _ssh_connect(target)
    try:
        # Whatever command the key asks for, sshd runs the bridge: a hello gets the runner's welcome.
        hello = json.dumps({"id": 1, "type": "hello", "version": p.PROTOCOL_VERSION, "client": "probe"})
        ran = await conn.run("cat /etc/shadow; id", input=hello + "\n", timeout=60)
        assert '"type":"welcome"' in str(ran.stdout) and "uid=" not in str(ran.stdout), ran
        # `restrict`: no forwarding, to the runner's socket or anywhere.
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.open_unix_connection(str(box.runner_socket))
    finally:
        conn.close()
    with pytest.raises(RunnerUnavailable, match=r'use mode = "attach"'):
        await open_client(box.target(box.accounts.bot, key, mode="streamlocal"), "goaltender-bot")


async def test_the_runners_own_account_with_a_forced_command(box: Box):
    """The simplest deployment: the bot's key in the runner account's own authorized_keys."""
    key = box.authorize(box.accounts.runner, "runner_ed25519")
    client = await open_client(box.target(box.accounts.runner, key), "goaltender-bot")
    try:
        assert client.runner_name
    finally:
        await client.close()


async def test_an_account_that_is_no_operator_is_told_what_to_add(box: Box):
    key = box.authorize(box.accounts.outsider, "outsider_ed25519")
    with pytest.raises(RunnerUnavailable) as refused:
        await open_client(box.target(box.accounts.outsider, key), "goaltender-bot")
    said = str(refused.value)
    print(said)  # as the bot logs it (pytest -s)
    outsider = box.accounts.outsider
    assert f"user {outsider}" in said and "may not open the runner socket" in said
    assert f"add {outsider}" in said and "GOALTENDER_OPERATORS" in said
    assert "bug" not in said


async def test_a_changed_host_key_is_refused(box: Box):
    key = box.authorize(box.accounts.bot, "bot_ed25519")
    pinned = box.target(box.accounts.bot, key)  # pins the key sshd has now
    box.stop_sshd()
    box.start_sshd(host_key="host_ed25519_new")  # the box "reinstalled": a new host key
    await box.sshd_answers()
    with pytest.raises(HostKeyRejected, match="does not match the pinned key") as refused:
        await open_client(pinned, "goaltender-bot")
    print(refused.value)  # as the bot logs it (pytest -s)
    assert "verify its new key out of band" in str(refused.value)
    # Pinned anew, the bot is let in again.
    client = await open_client(
        box.target(box.accounts.bot, key, known_hosts=box.host_key("host_ed25519_new")), "bot"
    )
    await client.close()
