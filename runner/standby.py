"""Standby interpreters: each running goal's next Python processes, started before they are asked for.

A short experiment's run and its eval spend much of their time starting: the sandbox, the
interpreter, and imports (numpy alone is 0.1-0.2 s). So while a goal runs, the runner keeps two
processes ready for it, sandboxed as its experiments are (the same mounts and environment), with
GOALTENDER_PRELOAD's modules imported, waiting on a socket (runner/standby_process.py). A command
that fits (the runner's own interpreter as `python -m module …` or `python script.py …`, in the
same environment but for LATE_VARIABLES) is handed to one: its argv, working directory and late
variables, and its log as stdout and stderr. From then on it is that run's process, supervised as
any other: its own process group and sandbox, the timeout, wait4's CPU time and peak RSS (the
imports done while it waited included). Anything else starts cold, as before; so does a command
that would find another `python` on its PATH in the sandbox, a module of a preloaded name in its
directory, or a preloaded module whose file was changed since (the standby execs it then).

Only sandboxed (GOALTENDER_SANDBOX=bwrap): a sandbox dies with the runner, so no run that started
before its experiment's record can outlive a restart unkilled.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from goaltender.runner.agent_env import goal_environment
from goaltender.runner.config import RunnerSettings
from goaltender.runner.sandbox import Sandbox
from goaltender.runner.supervisor import Launch, open_beneath, wait_process
from goaltender.storage.records import Goal

if TYPE_CHECKING:
    from goaltender.runner.executors import Job

log = logging.getLogger("goaltender.runner")

# Known only when a run starts: its experiment, its seed, its GPUs, and what the agent's shell
# keeps for itself (its directories, its depth, the command's path), which changes as the agent
# moves about. They are set in the standby's environment at hand-off, so a preloaded module must
# not read them on import (numpy, torch and the like read CUDA_VISIBLE_DEVICES when CUDA starts).
LATE_VARIABLES = frozenset(
    {
        "GOALTENDER_EXPERIMENT_ID",
        "GOALTENDER_EXPERIMENT_DIR",
        "GOALTENDER_SEED",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    }
)
PROCESS_FILE = Path(__file__).with_name("standby_process.py")
# Runs standby_process.py in a namespace of its own: nothing of it in sys.modules or __main__. Its
# code comes from the import system's own loader (in every interpreter, and importing nothing), so
# from its cached bytecode: compiling it anew was ~1.5 ms of every standby's start.
LOADER = (
    "import sys;p=sys.argv[1];n='goaltender_standby';"
    "exec(sys.modules['_frozen_importlib_external'].SourceFileLoader(n,p).get_code(n),{'__name__':n})"
)
MAX_ORDER = 64 << 10  # bytes: sent at once into the socket's buffer, so the hand-off never blocks
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclasses.dataclass
class Standby:
    """One goal's waiting interpreter."""

    goal_id: int
    proc: subprocess.Popen
    launch: Launch
    channel: socket.socket  # the runner's end: `r` comes up it when warm, the hand-off goes down
    mounts: list[str]  # its sandbox
    warm: bool = False  # its preload is done
    loop: asyncio.AbstractEventLoop | None = None  # watching the channel for `r` while set

    def unwatch(self) -> None:
        if self.loop is not None:
            self.loop.remove_reader(self.channel.fileno())
            self.loop = None

    def hand_off(self, job: Job) -> subprocess.Popen:
        """Make it the job's process: argv, working directory, late variables, log (opened as
        a run's log is). Raises OSError when it cannot take it (it died meanwhile)."""
        order = {
            "argv": job.command,
            "cwd": str(job.cwd),
            "env": {name: job.env.get(name) for name in sorted(LATE_VARIABLES)},
        }
        data = json.dumps(order).encode()
        data = struct.pack("!I", len(data)) + data
        self.unwatch()
        logged = open_beneath(Path(job.goal.workspace), job.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            if self.proc.poll() is not None:
                raise ProcessLookupError(f"the standby exited ({self.proc.returncode})")
            if socket.send_fds(self.channel, [data], [logged]) != len(data):
                raise BlockingIOError("the hand-off did not fit the standby's socket")
        finally:
            os.close(logged)
            self.channel.close()
        return self.proc

    def kill(self) -> None:
        self.unwatch()
        self.channel.close()
        if self.proc.returncode is None:  # not reaped, so its pid is still its own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)


@dataclasses.dataclass
class _Kept:
    """A goal's standbys, and the environment they are made in."""

    goal: Goal
    env: dict[str, str]  # late variables aside
    ready: list[Standby] = dataclasses.field(default_factory=list)  # oldest first


class Standbys:
    """Standbys for every goal that keeps them, from its agent's start to its end: two, so that a
    run's eval finds one warm, and so does the next run. They warm one at a time (each starts when
    the one before has imported its modules), and a standby taken is replaced once its process has
    ended: on a small box a warming standby takes CPU from whatever runs, the agent's start or a
    training run. Unless it was the last (a run took the one still warming): then its replacement
    starts at once, or the run's eval would wait for one to warm after the run. They are made in
    the environment of the goal's last Python run (at first, the goal's own): an agent's
    `goaltender experiment` passes on what its shell exported, the same from one run to the next."""

    PER_GOAL = 2

    def __init__(self, sandbox: Sandbox, settings: RunnerSettings):
        self.sandbox = sandbox
        self.settings = settings
        self.enabled = settings.standby and sandbox.enabled
        self.interpreter = os.path.abspath(sys.executable)
        self._kept: dict[int, _Kept] = {}
        self._discarding: set[asyncio.Task] = set()

    def keep(self, goal: Goal) -> None:
        """Keep standbys for `goal` until `drop`."""
        if self.enabled:
            self._kept[goal.id] = _Kept(goal, self._early(goal_environment(self.settings, goal)))
            self.refill(goal)

    def take(self, job: Job) -> Standby | None:
        """A standby of the goal's that can run `job`, or None: then the job starts cold, and the
        goal's next standbys are made in its environment."""
        kept = self._kept.get(job.goal.id)
        if kept is None or not self._python(job.command, job.env):
            return None
        early = self._early(job.env)
        if early != kept.env:
            kept.env = early
            for standby in kept.ready:
                self.release(standby)
            kept.ready.clear()
            return None
        mounts = self.sandbox.mounts(job.goal, job.devices)
        fitting = [s for s in kept.ready if s.proc.poll() is None and s.mounts == mounts]
        if not fitting:
            return None
        standby = next((s for s in fitting if s.warm), fitting[0])  # a warming one beats a cold start
        kept.ready.remove(standby)
        if not kept.ready:  # else this run's eval, or the next run, would wait for one to warm
            # Started once this one has its job: a sandbox's spawn holds the runner ~6 ms.
            asyncio.get_running_loop().call_soon(self.refill, job.goal)
        return standby

    def refill(self, goal: Goal) -> None:
        """Start the goal's next standby, if it keeps fewer than PER_GOAL and none is warming."""
        kept = self._kept.get(goal.id)
        if kept is None:
            return
        for standby in [s for s in kept.ready if s.proc.poll() is not None]:
            kept.ready.remove(standby)
            self.release(standby)
        warming = not all(s.warm for s in kept.ready)
        if len(kept.ready) < self.PER_GOAL and not warming and (made := self._started(goal, kept.env)):
            kept.ready.append(made)

    def _signalled(self, standby: Standby) -> None:
        """Its channel is readable: `r`, its preload is done (the next may start); else it died."""
        try:
            said = standby.channel.recv(1)
        except BlockingIOError:
            return
        except OSError:
            said = b""
        standby.unwatch()
        kept = self._kept.get(standby.goal_id)
        if said == b"r":
            standby.warm = True
        elif kept is not None and standby in kept.ready:
            kept.ready.remove(standby)
            self.release(standby)
        if kept is not None:
            self.refill(kept.goal)

    def release(self, standby: Standby) -> None:
        """A standby that will run nothing: killed and reaped in the background."""
        task = asyncio.ensure_future(discard(standby))
        self._discarding.add(task)
        task.add_done_callback(self._discarding.discard)

    async def drop(self, goal_id: int) -> None:
        """The goal ended: its standbys go."""
        if (kept := self._kept.pop(goal_id, None)) is not None:
            for standby in kept.ready:
                await discard(standby)

    async def close(self) -> None:
        for goal_id in list(self._kept):
            await self.drop(goal_id)
        await asyncio.gather(*self._discarding, return_exceptions=True)

    def _early(self, env: dict[str, str]) -> dict[str, str]:
        """What of `env` a standby must have been started with: all its sandbox shows but the late
        variables."""
        return {k: v for k, v in self.sandbox.environment(env).items() if k not in LATE_VARIABLES}

    def _python(self, argv: list[str], env: dict[str, str]) -> bool:
        """Is `argv` this interpreter (as sys.executable names it) as `python -m module …` or
        `python script.py …`, with an order that fits the socket at once?"""
        if len(argv) < 2 or (argv[1] == "-m" and (len(argv) < 3 or not _MODULE.fullmatch(argv[2]))):
            return False
        if argv[1] != "-m" and argv[1].startswith("-"):
            return False  # interpreter options: only a fresh interpreter takes those
        if len(json.dumps(argv)) > MAX_ORDER // 2:
            return False
        # As found here; the standby finds it again in the sandbox, whose /tmp is not this one.
        found = shutil.which(argv[0], path=env.get("PATH", os.defpath))
        return found is not None and os.path.abspath(found) == self.interpreter

    def _started(self, goal: Goal, env: dict[str, str]) -> Standby | None:
        ours, theirs = socket.socketpair()
        command = [self.interpreter, "-c", LOADER, str(PROCESS_FILE), str(theirs.fileno())]
        command += [name for name in self.settings.preload if _MODULE.fullmatch(name)]
        try:
            launch = self.sandbox.launch(goal, command, cwd=Path(goal.workspace), env=env)
            launch = dataclasses.replace(launch, pass_fds=(*launch.pass_fds, theirs.detach()))
            try:
                proc = subprocess.Popen(
                    launch.command,
                    cwd=launch.cwd,
                    env=launch.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    pass_fds=launch.pass_fds,
                )
            finally:
                launch.close()
        except OSError as exc:  # its runs start cold; the sandbox says why when they do
            log.debug("goal #%d: no standby interpreter (%s)", goal.id, exc)
            ours.close()
            theirs.close()
            return None
        ours.setblocking(False)
        standby = Standby(goal.id, proc, launch, ours, self.sandbox.mounts(goal))
        standby.loop = asyncio.get_running_loop()
        standby.loop.add_reader(ours.fileno(), self._signalled, standby)
        return standby


async def discard(standby: Standby) -> None:
    """Kill a standby (its process group) and reap it."""
    standby.kill()
    with contextlib.suppress(ChildProcessError):
        await wait_process(standby.proc)
