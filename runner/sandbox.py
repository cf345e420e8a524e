"""Where agents and experiments run: in a bubblewrap sandbox each (GOALTENDER_SANDBOX=bwrap, the
default), or unsandboxed (GOALTENDER_SANDBOX=none, which lets them control every goal).

An agent's only way to the runner is its goal's socket (runner/trust.py); the sandbox makes sure
it has no other. What a sandbox shows is the runner's decision alone, made from the goal (and the
GPUs a run was granted): nothing an agent asks for — its experiment's environment above all —
changes a mount. The machine is read-only; the runner's home (runner.db, the operator socket, the
other goals' workspaces, caches and sockets, the logs) is an empty tmpfs; /run is an empty tmpfs
too (no docker or session sockets; the resolver's directory is put back), and so are the runner
user's credentials (~/.ssh, ~/.aws, ~/.netrc and the like), every file GOALTENDER_SECRETS names and
every file a secret-named variable that is not granted points at. Put back: the goal's workspace
and its own caches (read-write), its socket at SANDBOX_SOCKET, the goal's own /tmp (a directory on
the big disk, shared by the goal's agent and experiments), and read-only: the shared hub cache, the
runner's own code and Python, the configured agent command's files, the command policy, the box's
skill folder and the NeMo RL checkout ($NEMO_RL_DIR). A run sees the GPUs it was granted, no
others; an agent sees none. The sandbox has its own pid namespace, drops every capability and dies
with the runner.

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
import functools
import glob
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import goaltender
from goaltender.runner.agent_env import SANDBOX_SOCKET, runner_bin_directories
from goaltender.runner.config import RunnerSettings
from goaltender.runner.goal_network import GoalNetworks
from goaltender.runner.limits import GoalCgroups
from goaltender.runner.secrets import SECRET_WORDS
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
# pid 1 inside: runs the command with default signal handling and waits for it (see above). Its
# `env` by its real path: the command's PATH is the agent's to choose.
_INIT = [
    "/bin/sh",
    "-c",
    '"$0" --default-signal "$@" & wait $!',
    os.path.realpath(shutil.which("env") or "/usr/bin/env"),
]
# Where a user's credentials live, under the runner user's home: hidden in every sandbox. (Codex's
# own login, ~/.codex, is not: the Codex agent is given it, as a granted key.)
CREDENTIALS = (
    ".ssh", ".gnupg", ".netrc", ".git-credentials", ".aws", ".azure", ".config/gcloud", ".config/gh",
    ".config/hub", ".config/rclone", ".docker", ".kube", ".cache/huggingface", ".huggingface",
    ".pypirc", ".npmrc", ".yarnrc", ".databrickscfg", ".boto", ".s3cfg", ".vault-token",
    ".password-store", ".local/share/keyrings", ".cargo/credentials", ".cargo/credentials.toml",
    ".bash_history", ".zsh_history", ".python_history", ".psql_history", ".mysql_history",
)  # fmt: skip


_GPU_NODE = re.compile(r"/dev/nvidia[0-9]+")  # one GPU's node; the rest are the driver's


class SandboxError(OSError):
    """A sandboxed process cannot be started (bwrap missing or unusable, a NUL in its options)."""


class Sandbox:
    def __init__(
        self,
        settings: RunnerSettings,
        gpu_minors: dict[int, int] | None = None,
        limits: GoalCgroups | None = None,
    ):
        """`gpu_minors`: each GPU's NVML index -> its device's minor number (/dev/nvidiaN).
        `limits`: each goal's cgroup, which its every process joins (runner/limits.py)."""
        self.settings = settings
        self.gpu_minors = gpu_minors or {}
        self.limits = limits
        self.networks = GoalNetworks(settings)
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
        if problem := self.networks.problem():
            return problem
        probe = [self._env, "--ignore-signal=TERM", self._bwrap, "--ro-bind", "/", "/", "--dev", "/dev"]
        probe += [
            "--proc",
            "/proc",
            "--unshare-pid",
            "--as-pid-1",
            "--die-with-parent",
            "--",
            *_INIT,
            "/bin/true",
        ]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap does not run here ({exc}): {INSTALL_HINT}"
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
            return f"bubblewrap cannot make a sandbox here ({why}): {INSTALL_HINT}"
        return None

    async def open_goal(self, goal_id: int) -> None:
        """What the goal's sandboxes share, made as it starts: its network."""
        if self.enabled:
            if problem := self.problem():
                raise SandboxError(problem)
            await self.networks.open(goal_id)

    def launch(
        self,
        goal: Goal,
        command: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        agent: bool = False,
        gpus: tuple[int, ...] = (),
    ) -> Launch:
        """How to start `command` for `goal`: in its sandbox, or as it is with GOALTENDER_SANDBOX=none.
        `agent`: the configured agent command, whose own files are made visible. `gpus`: the NVML
        indices of the GPUs it was granted, the only ones it sees. Either way in the goal's cgroup,
        when there are limits."""
        cgroup = self.limits.join(goal.id) if self.limits is not None else ()
        if not self.enabled:
            return Launch(command, cwd, env, cgroup=cgroup)
        if problem := self.problem():
            raise SandboxError(problem)
        options = self._mounts(goal, command if agent else [], gpus)
        options += ["--chdir", str(cwd), "--clearenv"]
        for name, value in self.environment(env).items():
            options += ["--setenv", name, value]
        options += ["--unshare-pid", "--as-pid-1", "--die-with-parent", "--cap-drop", "ALL"]
        options += self.networks.user_words(goal.id)
        if any("\0" in word for word in [*options, *command]):
            raise SandboxError("a NUL byte in the command, its environment or its directory")
        enter, network_fds = self.networks.entry(goal.id)  # the goal's network namespace, first
        options_fd = os.memfd_create("goaltender-bwrap-args")
        with os.fdopen(os.dup(options_fd), "wb") as f:
            f.write(b"".join(os.fsencode(word) + b"\0" for word in options))
        os.lseek(options_fd, 0, os.SEEK_SET)
        argv = [*enter, self._env, "--ignore-signal=TERM", self._bwrap, "--args", str(options_fd), "--"]
        return Launch(
            argv=[*argv, *_INIT, *command],
            cwd=Path(goal.workspace),
            env={"PATH": os.environ.get("PATH", os.defpath)},  # bwrap's own; the command's is in the options
            pass_fds=(options_fd, *network_fds),
            signals_as_codes=True,
            cgroup=cgroup,
        )

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """The environment a command given `env` finds in its sandbox: its /tmp is the goal's."""
        return env | {"TMPDIR": "/tmp"} if self.enabled else env

    def mounts(self, goal: Goal, gpus: tuple[int, ...] = ()) -> list[str]:
        """What an experiment's sandbox shows it (a standby's must be its run's; runner/standby.py)."""
        return self._mounts(goal, [], gpus) if self.enabled else []

    def remove_goal_files(self, goal_id: int) -> None:
        """The goal has ended: its /tmp and its caches go."""
        shutil.rmtree(self.settings.goal_tmp(goal_id), ignore_errors=True)
        shutil.rmtree(self.settings.goal_cache(goal_id), ignore_errors=True)

    def _mounts(self, goal: Goal, agent_command: list[str], gpus: tuple[int, ...]) -> list[str]:
        settings = self.settings
        home = settings.home.resolve()
        credentials = hidden_credentials(settings)
        hidden = [home, Path("/tmp"), Path("/run"), *credentials]
        tmp = settings.goal_tmp(goal.id)
        tmp.mkdir(mode=0o700, parents=True, exist_ok=True)

        args = ["--ro-bind", "/", "/", "--dev", "/dev"]
        for device in self.gpu_devices(gpus):
            args += ["--dev-bind", device, device]
        args += ["--perms", "1777", "--tmpfs", "/dev/shm", "--proc", "/proc", "--tmpfs", "/run"]
        resolv_conf = Path(os.path.realpath("/etc/resolv.conf"))
        resolver = resolv_conf.parent
        if _under(resolver, [Path("/run")]) and resolver != Path("/run"):
            args += ["--ro-bind", str(resolver), str(resolver)]
        if (own_resolver := self.networks.resolver()) is not None:  # the box's is on its loopback
            args += ["--ro-bind", str(own_resolver), str(resolv_conf)]
        # Applied parents first, whatever their kind: a bind inside a hidden directory (a goal's
        # workspace in the home) shows through it, and a hidden directory inside a readable one
        # (a demo's home in its checkout under /tmp) stays hidden. At one depth, hiding goes last.
        mounts: list[tuple[Path, bool, list[str]]] = []  # (where, hides, bwrap's words)
        mounts.append(
            (SANDBOX_SOCKET, False, ["--bind", str(settings.agent_socket(goal.id)), str(SANDBOX_SOCKET)])
        )
        mounts.append((Path("/tmp"), True, ["--bind", str(tmp), "/tmp"]))
        mounts.append((home, True, ["--tmpfs", str(home)]))
        for path in credentials:
            cover = ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
            mounts.append((path, True, cover))
        writable = [Path(goal.workspace).resolve(), settings.goal_cache(goal.id).resolve()]
        for path in dict.fromkeys(writable):
            mounts.append((path, False, ["--bind", str(path), str(path)]))
        readable = [settings.home / "command-policy.toml", settings.home / "command-policy.json"]
        readable.append(settings.skill_folder)  # the box's skills: agents read them, only the runner writes
        readable.append(settings.hub_cache)  # models and data sets: only the runner's fetch writes
        readable += [Path(word) for word in agent_command if word.startswith("/")]
        readable += nemo_rl_checkout(home)
        for path in dict.fromkeys(p.resolve() for p in readable if p.exists()):
            if _under(path, hidden) and not _under(path, writable):
                mounts.append((path, False, ["--ro-bind", str(path), str(path)]))
        for path in runner_install():
            if _under(path, [*hidden, *writable]):  # shown, and never writable: the runner runs it
                mounts.append((path, False, ["--ro-bind", str(path), str(path)]))
        operator_socket = settings.socket_path.resolve()
        if operator_socket.exists() and not _under(operator_socket, hidden):
            # Wherever it lives: nothing answers.
            mounts.append((operator_socket, True, ["--ro-bind", "/dev/null", str(operator_socket)]))
        for _, _, words in sorted(mounts, key=lambda mount: (len(mount[0].parts), mount[1])):
            args += words
        for path in [home, *credentials]:  # covered, not a scratch space: its binds stay as they are
            if path.is_dir():
                args += ["--remount-ro", str(path)]
        return args

    def gpu_devices(self, gpus: tuple[int, ...]) -> list[str]:
        """The device nodes a run granted `gpus` (NVML indices) needs: theirs and the driver's
        shared ones (nvidiactl, nvidia-uvm, …); none without a GPU."""
        if not gpus:
            return []
        found = sorted(glob.glob("/dev/nvidia*"))
        own = {f"/dev/nvidia{self.gpu_minors.get(index, index)}" for index in gpus}
        return [device for device in found if not _GPU_NODE.fullmatch(device) or device in own]


@functools.cache
def runner_install() -> tuple[Path, ...]:
    """The runner's own Python and code, which agents and runs use too (their PATH finds its
    `python` and `goaltender` first: runner/agent_env.py): its venv, the interpreter that venv
    links to, its interpreter's and scripts' directories, and the goaltender package; resolved,
    once (each launch asks)."""
    own = [Path(sys.prefix), Path(sys.base_prefix), *map(Path, runner_bin_directories())]
    return tuple(dict.fromkeys(p.resolve() for p in [*own, Path(goaltender.__file__).parent] if p.exists()))


def hidden_credentials(settings: RunnerSettings) -> list[Path]:
    """What no sandbox shows: the runner user's credentials, the files GOALTENDER_SECRETS names, and
    files named by a secret-looking variable of the runner's that goals are not granted
    (GOOGLE_APPLICATION_CREDENTIALS=/etc/key.json). Only what exists: there is nothing to cover else,
    and the machine is read-only in the sandbox, so nothing can be put there."""
    user_home = Path.home()
    paths = [user_home / name for name in CREDENTIALS]
    paths += [Path(entry).expanduser() for entry in settings.secrets if "/" in entry]
    for name, value in os.environ.items():
        upper = name.upper()
        named = any(word in upper for word in SECRET_WORDS) and name not in settings.grants
        if named and value.startswith(("/", "~")) and "\n" not in value and len(value) < 4096:
            paths.append(Path(value).expanduser())
    found = []
    for path in paths:
        try:
            if path.exists() or path.is_symlink():
                found.append(path.resolve())
        except (OSError, RuntimeError, ValueError):
            continue
    return [path for path in dict.fromkeys(found) if path != Path("/")]


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


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)
