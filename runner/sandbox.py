"""Where agents and experiments run: in a bubblewrap sandbox each (GOALTENDER_SANDBOX=bwrap, the
default), or unsandboxed (GOALTENDER_SANDBOX=none, which lets them control every goal).

An agent's only way to the runner is its goal's socket (runner/trust.py); the sandbox makes sure
it has no other. The machine is read-only; the runner's home (runner.db, the operator socket, the
other goals' workspaces and sockets, the logs) is an empty tmpfs; /run is an empty tmpfs too (no
docker or session sockets; the resolver's directory is put back), and so is ~/.ssh (no `ssh
localhost goaltender approve`). Put back: the goal's workspace and the caches (read-write), its
socket at SANDBOX_SOCKET, the goal's own /tmp (a directory on the big disk, shared by the goal's
agent and experiments), the GPUs, and read-only: the runner's own code and Python, the configured
agent command's files, the command policy, the box's skill folder and the NeMo RL checkout
($NEMO_RL_DIR). The network stays. The sandbox has its own pid namespace, drops every capability
and dies with the runner.

Process supervision sees through it. `env --ignore-signal=TERM bwrap … sh -c 'env
--default-signal "$@" & wait $!'`: bwrap leads the process group as before, and ignores the
runner's SIGTERM, which the command (in the same group, signals back to default) gets, so it has
the grace period to finish (bwrap dying first would take the sandbox down at once); `sh` is pid 1
(--as-pid-1) and waits for the command, so wait4 on bwrap still reports the command's CPU time and
peak RSS; when pid 1 exits, the kernel ends whatever the command left in the sandbox. SIGKILL of
the group ends it all at once. bwrap reports a death by signal N as exit code 128 + N.

bwrap's options, the command's environment included, go through a memfd (--args): an agent
chooses its experiment's environment, and an `LD_PRELOAD` there must reach the sandboxed command
only, never bwrap itself, which runs outside; and they stay out of `ps`. A NUL byte in anything
would split an option in two, so it is refused.
"""

from __future__ import annotations

import compileall
import glob
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import goaltender
from goaltender.runner.agent_env import CACHE_DIRS, SANDBOX_SOCKET
from goaltender.runner.config import RunnerSettings
from goaltender.runner.limits import GoalCgroups
from goaltender.runner.supervisor import Launch
from goaltender.storage.records import Goal

log = logging.getLogger("goaltender.runner")

INSTALL_HINT = (
    "install bubblewrap (apt install bubblewrap) or set GOALTENDER_SANDBOX=none to run agents "
    "unsandboxed, which lets them control every goal"
)
UNSAFE_WARNING = (
    "GOALTENDER_SANDBOX=none: agents and experiments run unsandboxed; they can reach the operator "
    "socket and runner.db, which lets them control every goal on this runner"
)
# pid 1 inside: runs the command with default signal handling and waits for it (see above).
_INIT = ["/bin/sh", "-c", 'env --default-signal "$@" & wait $!', "goaltender-sandbox"]


class SandboxError(OSError):
    """A sandboxed process cannot be started (bwrap missing or unusable, a NUL in its options)."""


class Sandbox:
    def __init__(self, settings: RunnerSettings, limits: GoalCgroups | None = None):
        self.settings = settings
        self.limits = limits  # each goal's cgroup, which its every process joins (runner/limits.py)
        self.enabled = settings.sandbox == "bwrap"
        self._checked = False
        self._problem: str | None = None
        self._bwrap = shutil.which("bwrap") or "bwrap"
        self._env = shutil.which("env") or "/usr/bin/env"

    def problem(self) -> str | None:
        """Why sandboxed processes cannot start on this machine (None: they can). Checked once."""
        if self.enabled and not self._checked:
            self._checked = True
            self._problem = self._probe()
        return self._problem

    def _probe(self) -> str | None:
        if shutil.which("bwrap") is None:
            return f"the agent sandbox needs bubblewrap, which is not installed: {INSTALL_HINT}"
        probe = [self._env, "--ignore-signal=TERM", self._bwrap, "--ro-bind", "/", "/", "--dev", "/dev"]
        probe += ["--proc", "/proc", "--unshare-pid", "--as-pid-1", "--die-with-parent", "--", *_INIT, "true"]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap does not run here ({exc}): {INSTALL_HINT}"
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
            return f"bubblewrap cannot make a sandbox here ({why}): {INSTALL_HINT}"
        return None

    def launch(
        self, goal: Goal, command: list[str], *, cwd: Path, env: dict[str, str], agent: bool = False
    ) -> Launch:
        """How to start `command` for `goal`: in its sandbox, or as it is with GOALTENDER_SANDBOX=none.
        `agent`: the configured agent command, whose own files are made visible. Either way in
        the goal's cgroup, when there are limits."""
        cgroup = self.limits.join(goal.id) if self.limits is not None else ()
        if not self.enabled:
            return Launch(command, cwd, env, cgroup=cgroup)
        if problem := self.problem():
            raise SandboxError(problem)
        options = self._mounts(goal, command if agent else [], env)
        options += ["--chdir", str(cwd), "--clearenv"]
        for name, value in self.environment(env).items():
            options += ["--setenv", name, value]
        options += ["--unshare-pid", "--as-pid-1", "--die-with-parent", "--cap-drop", "ALL"]
        if any("\0" in word for word in [*options, *command]):
            raise SandboxError("a NUL byte in the command, its environment or its directory")
        options_fd = os.memfd_create("goaltender-bwrap-args")
        with os.fdopen(os.dup(options_fd), "wb") as f:
            f.write(b"".join(os.fsencode(word) + b"\0" for word in options))
        os.lseek(options_fd, 0, os.SEEK_SET)
        argv = [self._env, "--ignore-signal=TERM", self._bwrap, "--args", str(options_fd), "--"]
        return Launch(
            argv=[*argv, *_INIT, *command],
            cwd=Path(goal.workspace),
            env={"PATH": os.environ.get("PATH", os.defpath)},  # bwrap's own; the command's is in the options
            pass_fds=(options_fd,),
            signals_as_codes=True,
            cgroup=cgroup,
        )

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """The environment a command given `env` finds in its sandbox: its /tmp is the goal's."""
        return env | {"TMPDIR": "/tmp"} if self.enabled else env

    def mounts(self, goal: Goal, env: dict[str, str]) -> list[str]:
        """What an experiment's sandbox shows it (a standby's must be its run's; runner/standby.py)."""
        return self._mounts(goal, [], env) if self.enabled else []

    def remove_goal_files(self, goal_id: int) -> None:
        """The goal has ended: its /tmp goes."""
        shutil.rmtree(self.settings.goal_tmp(goal_id), ignore_errors=True)

    def _mounts(self, goal: Goal, agent_command: list[str], env: dict[str, str]) -> list[str]:
        settings = self.settings
        home = settings.home.resolve()
        ssh = Path.home().resolve() / ".ssh"
        hidden = [home, Path("/tmp"), Path("/run"), ssh]
        tmp = settings.goal_tmp(goal.id)
        tmp.mkdir(mode=0o700, parents=True, exist_ok=True)

        args = ["--ro-bind", "/", "/", "--dev", "/dev"]
        for device in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", device, device]
        args += ["--perms", "1777", "--tmpfs", "/dev/shm", "--proc", "/proc", "--tmpfs", "/run"]
        resolver = Path(os.path.realpath("/etc/resolv.conf")).parent
        if _under(resolver, [Path("/run")]) and resolver != Path("/run"):
            args += ["--ro-bind", str(resolver), str(resolver)]
        # Applied parents first, whatever their kind: a bind inside a hidden directory (a goal's
        # workspace in the home) shows through it, and a hidden directory inside a readable one
        # (a demo's home in its checkout under /tmp) stays hidden. At one depth, hiding goes last.
        mounts: list[tuple[Path, bool, list[str]]] = []  # (where, hides, bwrap's words)
        mounts.append(
            (SANDBOX_SOCKET, False, ["--bind", str(settings.agent_socket(goal.id)), str(SANDBOX_SOCKET)])
        )
        mounts.append((Path("/tmp"), True, ["--bind", str(tmp), "/tmp"]))
        if ssh.is_dir():
            mounts.append((ssh, True, ["--tmpfs", str(ssh)]))
        mounts.append((home, True, ["--tmpfs", str(home)]))
        writable = [Path(goal.workspace).resolve(), settings.cache_dir.resolve()]
        for var in CACHE_DIRS:  # caches the box keeps elsewhere (not containing the home)
            if (value := env.get(var)) and not _under(home, [Path(value).resolve()]) and _made(Path(value)):
                writable.append(Path(value).resolve())
        for path in dict.fromkeys(writable):
            mounts.append((path, False, ["--bind", str(path), str(path)]))
        readable = [settings.home / "command-policy.toml", settings.home / "command-policy.json"]
        readable.append(settings.skill_folder)  # the box's skills: agents read them, only the runner writes
        readable += [Path(sys.prefix), Path(goaltender.__file__).parent]
        readable += [Path(word) for word in agent_command if word.startswith("/")]
        readable += nemo_rl_checkout(home)
        for path in dict.fromkeys(p.resolve() for p in readable if p.exists()):
            if _under(path, hidden) and not _under(path, writable):
                mounts.append((path, False, ["--ro-bind", str(path), str(path)]))
        operator_socket = settings.socket_path.resolve()
        if operator_socket.exists() and not _under(operator_socket, hidden):
            # Wherever it lives: nothing answers.
            mounts.append((operator_socket, True, ["--ro-bind", "/dev/null", str(operator_socket)]))
        for _, _, words in sorted(mounts, key=lambda mount: (len(mount[0].parts), mount[1])):
            args += words
        return args


def compile_package() -> None:
    """Write the bytecode of the runner's own package where it is missing or stale. Sandboxed
    processes import it read-only, so on an editable install the modules only they import (the
    agents, the workloads, the evaluations) were compiled anew at every start: ~0.1 s of an
    agent's. A wheel's install compiled them already; an install the runner cannot write is left be."""
    root = Path(goaltender.__file__).parent
    try:
        compileall.compile_dir(root, maxlevels=0, quiet=2)
        for package in sorted(init.parent for init in root.glob("*/__init__.py")):
            compileall.compile_dir(package, quiet=2)
    except OSError as exc:
        log.debug("the runner's package is not compiled (%s): sandboxed imports compile it each time", exc)


def nemo_rl_checkout(home: Path) -> list[Path]:
    """The box's NeMo RL checkout (`goaltender nemo-rl` runs it), wherever it lies, say under the
    home. From the runner's own environment, never the one an agent asks for its experiment: that
    would let it name ~/.ssh. Nothing that holds the home."""
    value = os.environ.get("NEMO_RL_DIR", "")
    checkout = Path(value).resolve() if value.startswith("/") else None
    return [checkout] if checkout is not None and not _under(home, [checkout]) else []


def _made(directory: Path) -> bool:
    """Is `directory` there, made now if need be? A cache the box configured but nobody has made
    yet must still be shared: unbound, its path would land in the goal's private /tmp or fail."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return False
    return directory.is_dir()


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)
