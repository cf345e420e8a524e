"""Operators by account or group (runner/operators.py): the accounts and groups GOALTENDER_OPERATORS
names reach the runner socket (POSIX ACL entries on it and the directories above it) and are let
in at hello; nobody else gets past the kernel, and whoever does not is told which name to add.
Real runners, real `goaltender` processes as other uids (setpriv), as in test_trust.py."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import BIN

from goaltender.runner.config import ConfigError
from goaltender.runner.daemon import StartupFailed
from goaltender.runner.operators import GROUP, USER, Operators, X, read_acl

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]  # in group nogroup (65534)
STRANGER = ["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups"]  # no account at all

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="runs goaltender as other uids: needs root")


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def _as(who: list[str], *args: str, env: dict[str, str] | None = None) -> Ran:
    proc = await asyncio.create_subprocess_exec(
        *who,
        f"{BIN}/goaltender",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


async def test_a_group_makes_its_members_operators(start_runner):
    runner = await start_runner(operators=["@nogroup"])
    socket = str(runner.settings.socket_path)
    member = await _as(NOBODY, "--socket", socket, "submit", "a member's goal, max 1 experiments")
    assert member.returncode == 0 and "goal #1" in member.stdout, member.stderr
    assert (await runner.store.get_goal(1)).owner == "uid 65534 (nobody)"
    # Neither the runner's own user (not named) nor an account outside the group is let in;
    # the outsider never gets past the kernel, and is told what to add.
    outsider = await _as(STRANGER, "--socket", socket, "status")
    assert outsider.returncode == 4
    assert "user 65533 (uid 65533) may not open the runner socket" in outsider.stderr
    assert "add 65533 to GOALTENDER_OPERATORS" in outsider.stderr
    # The modes stay as private as they were: the ACL alone names who may pass.
    assert runner.settings.socket_path.stat().st_mode & 0o077 == 0o060  # the ACL's mask shows as g
    acl = read_acl(runner.settings.socket_path)
    assert {key for key in acl if key[0] in (USER, GROUP)} == {(GROUP, 65534)}


async def test_a_removed_operator_loses_its_way_in(start_runner, tmp_path):
    home = tmp_path / "home"  # the socket where it is by default: in the runner's home
    runner = await start_runner(operators=["nobody"], socket=home / "runner.sock")
    socket = str(runner.settings.socket_path)
    assert (await _as(NOBODY, "--socket", socket, "status")).returncode == 0
    assert (USER, 65534) in read_acl(runner.settings.home)
    await runner.close()
    runner = await start_runner(socket=home / "runner.sock")  # the runner's own user again
    assert (USER, 65534) not in read_acl(runner.settings.home)
    refused = await _as(NOBODY, "--socket", socket, "status")
    assert refused.returncode == 4 and "may not open the runner socket" in refused.stderr


async def test_a_directory_the_runner_cannot_open_is_named(start_runner, tmp_path):
    """A directory above the socket that is not the runner user's and keeps an operator out: the
    runner does not start, and says which directory and the command that opens it."""
    shut = tmp_path / "shut"
    shut.mkdir(mode=0o700)
    os.chown(shut, 65533, 65533)
    with pytest.raises(StartupFailed) as failed:
        await start_runner(operators=["nobody"], socket=shut / "sock" / "runner.sock")
    said = str(failed.value)
    assert f"user nobody cannot pass through {shut}" in said
    assert f"setfacl -m u:nobody:x {shut}" in said


def test_unknown_names_are_said_plainly():
    with pytest.raises(ConfigError, match="there is no user named 'no-such-account'"):
        Operators.parse(["no-such-account"])
    with pytest.raises(ConfigError, match="there is no group named 'no-such-group'"):
        Operators.parse(["@no-such-group"])
    with pytest.raises(
        ConfigError, match=r"no user named 'nogroup' on this machine \(a group is written @nogroup\)"
    ):
        Operators.parse(["nogroup"])
    parsed = Operators.parse(["nobody", "@nogroup", "1234", "@4321"])
    assert parsed.uids == {65534, 1234} and parsed.gids == {65534, 4321}
    assert parsed.admits(65534) and parsed.admits(1234) and not parsed.admits(0)


async def test_doctor_from_another_account_says_what_to_add(start_runner):
    """An account that is no operator runs doctor: the runner line says which name to add, and
    nothing says "report this as a bug"."""
    runner = await start_runner()
    env = {"GOALTENDER_HOME": str(runner.settings.home), "HF_HUB_OFFLINE": "1"}
    socket = str(runner.settings.socket_path)
    ran = await _as(NOBODY, "--socket", socket, "doctor", env=env)
    assert ran.returncode == 1
    assert "bug" not in ran.stdout, ran.stdout
    [line] = [each for each in ran.stdout.splitlines() if each.startswith("fail runner:")]
    assert "user nobody (uid 65534) may not open the runner socket" in line
    assert "fix: on the runner, add nobody (or one of its groups: @nogroup) to GOALTENDER_OPERATORS" in line
    home = next(each for each in ran.stdout.splitlines() if each.split(":")[0].endswith(" disk"))
    assert "not checked" in home and "doctor runs as nobody" in home


def test_may_search_reads_modes_and_acls(tmp_path: Path):
    from goaltender.runner.operators import may_search, write_acl

    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    assert not may_search(directory, 65534, None)
    write_acl(directory, read_acl(directory) | {(USER, 65534): X})
    assert may_search(directory, 65534, None) and not may_search(directory, 65533, None)
    directory.chmod(0o700)  # chmod sets the mask: the named entry no longer counts
    assert not may_search(directory, 65534, None)
    directory.chmod(0o701)
    assert may_search(directory, 65533, None) and may_search(directory, None, 4242)
    # A matching group decides, as in the kernel: nobody's group (nogroup) has ---, so "other"'s x
    # is not nobody's.
    os.chown(directory, 0, 65534)
    assert not may_search(directory, 65534, None) and not may_search(directory, None, 65534)
    assert may_search(directory, 65533, None)
