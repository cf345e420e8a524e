"""Per-goal limits with the kernel's own tools: each goal's processes in a cgroup of their own.

Every process of a goal (its agent, its runs and evals, its standby interpreters; sandboxed or
not) runs in the goal's cgroup, held to GOALTENDER_GOAL_PIDS processes (threads count),
GOALTENDER_GOAL_MEMORY_MB of memory (swap included) and a CPU weight (GOALTENDER_GOAL_CPU_WEIGHT:
when the CPU is short, goals share it in proportion). A fork bomb meets its own goal's process
limit (its forks fail), a run that allocates without bound its memory limit (the kernel's OOM
killer picks a process of that goal); nothing else on the box notices. All goals together are held
to the box's memory less its reserve as well, so the runner and the system keep room whatever the
goals do at once.

Where the cgroups are depends on the kernel and the runner's place in it (`plan`):
- cgroup v2 with the controllers (Debian 12, Ubuntu 22.04 and later): in the runner's own
  delegated cgroup (a systemd service with Delegate=yes), as <own>/goaltender-<id>/goal-N. A
  cgroup that holds processes cannot give controllers to its children, so the runner first moves
  itself (and whatever else is in <own>) to the leaf <own>/runner. Not delegated but root: under
  the hierarchy's root, /sys/fs/cgroup/goaltender-<id>/goal-N.
- cgroup v1 or hybrid (the controllers on v1 hierarchies): in each of the pids, memory and cpu
  hierarchies, under the runner's own cgroup there: /sys/fs/cgroup/<controller>/<own>/
  goaltender-<id>/goal-N.
- none of that writable: limits are off; the runner says why once, `goaltender doctor` says how to
  turn them on (runner/doctor.py), from what the runner wrote at its start (<home>/limits.json).
<id> is the runner's name and a hash of its home, so two runners (or tests) never share a parent.
A runner's start clears what a runner of the same home left (killing whatever still runs there),
once recovery has measured it (runner/campaign.py, runner/experiments.py).

Joining is race-free: a process is in its goal's cgroup before it runs anything of its own.
`joined` puts `sh -c 'echo 0 > …/cgroup.procs; …; exec "$@"'` in front of the command (0 is the
writing process itself): the new process moves itself, then becomes the command, so the command
and everything it forks start inside. (preexec_fn would do the same from Python between fork and
exec, which is not safe in a runner with threads.) A process that cannot join does not start: the
shell exits 125 and says why in the process's log.

A goal's end kills what is left in its cgroup, whatever its process group or session (a
double-forked daemon included): cgroup.kill on v2, SIGKILL to every task until none is left on v1;
then the cgroup goes. The kernel counts a cgroup's OOM kills (memory.events, memory.oom_control)
and the forks its process limit refused (pids.events): a run or agent that died meanwhile says
which limit it met (`Counters`, `Usage.verdict`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from goaltender.runner.config import RunnerSettings

log = logging.getLogger("goaltender.runner")

CONTROLLERS = ("pids", "memory", "cpu")
MIB = 1 << 20
KILL_DEADLINE_S = 10.0  # a goal's cgroup is emptied and removed within this, or left for the next start
JOIN_FAILED = 125  # the exit code of a process that could not join its goal's cgroup
# The files to write come first, up to `--`; then the command. `for` walks a copy of the words.
_JOIN = (
    'for procs; do [ "$procs" = -- ] && break; echo 0 > "$procs" || '
    '{ echo "goaltender: cannot join the goal\'s cgroup ($procs)" >&2; exit '
    f'{JOIN_FAILED}; }}; shift; done; shift; exec "$@"'
)
ENABLE_HINT = (
    "run the runner as a systemd service with Delegate=yes (docs/deploy.md, Services), "
    "or as root on a box whose cgroup filesystem is writable"
)


def reserve_mb(total_mb: int) -> int:
    """What the runner and the system keep whatever the goals hold: max(1 GiB, 10% of memory)."""
    return max(1024, total_mb // 10)


def box_memory_mb() -> int:
    return psutil.virtual_memory().total // MIB


@dataclass(frozen=True)
class Limits:
    """What each goal may hold."""

    pids: int
    memory_mb: int
    cpu_weight: int  # cgroup v2's scale: 1-10000, 100 by default

    @classmethod
    def from_settings(cls, settings: RunnerSettings) -> Limits:
        total = box_memory_mb()
        memory = settings.goal_memory_mb or max(total - reserve_mb(total), 64)
        return cls(settings.goal_pids, memory, settings.goal_cpu_weight)

    def text(self, controllers: Iterable[str] = CONTROLLERS) -> str:
        """What a goal is held to, by the controllers that hold it."""
        said = {
            "pids": f"{self.pids} processes",
            "memory": f"{_size(self.memory_mb)} memory (swap included)",
            "cpu": f"CPU weight {self.cpu_weight}",
        }
        return ", ".join(said[c] for c in CONTROLLERS if c in controllers)


@dataclass(frozen=True)
class Counters:
    """What the kernel counted in a goal's cgroup so far: OOM kills, forks refused."""

    oom_kills: int = 0
    forks_refused: int = 0


@dataclass(frozen=True)
class Usage:
    """What a process of the goal met of its limits while it ran: the counters' growth."""

    limits: Limits
    oom_kills: int
    forks_refused: int

    def verdict(self, killed_by: int | None) -> list[str]:
        """What the goal's limits did while a process ran (`killed_by`: the signal that ended it,
        if one did): nothing, or a phrase for each limit met."""
        said = []
        memory = f"the goal's memory limit, {_size(self.limits.memory_mb)} (GOALTENDER_GOAL_MEMORY_MB)"
        if self.oom_kills and killed_by == signal.SIGKILL:
            said.append(f"killed by {memory}")
        elif self.oom_kills:
            said.append(f"{memory} killed {self.oom_kills} of the goal's processes meanwhile")
        if self.forks_refused:
            said.append(
                f"the goal's process limit, {self.limits.pids} (GOALTENDER_GOAL_PIDS), refused "
                f"{self.forks_refused} forks"
            )
        return said

    def explain(self, how: str, killed_by: int | None) -> str:
        """`how` a process ended ("exit code 1", "killed by signal 9"), with what the limits did:
        a death by the OOM killer is said as that."""
        said = self.verdict(killed_by)
        if self.oom_kills and killed_by == signal.SIGKILL:
            return "; ".join(said)  # the OOM killer's SIGKILL, said as that
        return "; ".join([how, *said])


# ---- the cgroup trees ----


class Tree:
    """A runner's cgroups in one kind of hierarchy: the parent(s) it owns, and a goal-N in each."""

    version = 0

    def __init__(self, parents: dict[str, Path], limits: Limits):
        self.parents = parents  # controller -> the runner's parent cgroup in its hierarchy
        self.limits = limits

    def goal_dirs(self, goal_id: int) -> list[Path]:
        return [parent / f"goal-{goal_id}" for parent in dict.fromkeys(self.parents.values())]

    def goals(self) -> set[int]:
        """Every goal that has a cgroup here (a runner before this one's too)."""
        found = set()
        for parent in dict.fromkeys(self.parents.values()):
            with contextlib.suppress(OSError):
                found |= {int(d.name[5:]) for d in parent.iterdir() if re.fullmatch(r"goal-\d+", d.name)}
        return found

    def members(self, goal_id: int) -> set[int]:
        found: set[int] = set()
        for directory in self.goal_dirs(goal_id):
            with contextlib.suppress(OSError):
                found |= {int(pid) for pid in (directory / "cgroup.procs").read_text().split()}
        return found

    def procs_files(self, goal_id: int) -> tuple[str, ...]:
        return tuple(str(d / "cgroup.procs") for d in self.goal_dirs(goal_id))

    def describe(self) -> str:
        where = ", ".join(sorted({str(p) for p in self.parents.values()}))
        return f"cgroup v{self.version} ({', '.join(self.parents)}) under {where}"

    def prepare(self) -> None:
        raise NotImplementedError

    def make(self, goal_id: int) -> None:
        raise NotImplementedError

    def counters(self, goal_id: int) -> Counters:
        raise NotImplementedError

    def kill(self, goal_id: int) -> None:
        """SIGKILL every task in the goal's cgroup (once: `end` repeats until it is empty)."""
        for pid in self.members(goal_id) - {os.getpid()}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, goal_id: int) -> bool:
        """Remove the goal's cgroup; whether it is gone (a cgroup with tasks cannot be removed)."""
        gone = True
        for directory in self.goal_dirs(goal_id):
            try:
                directory.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                gone = False
        return gone

    def remove_parents(self) -> None:
        for parent in dict.fromkeys(self.parents.values()):
            with contextlib.suppress(OSError):
                parent.rmdir()


class V1Tree(Tree):
    """cgroup v1: a parent in each controller's hierarchy, under the runner's own cgroup there."""

    version = 1

    def prepare(self) -> None:
        for parent in dict.fromkeys(self.parents.values()):
            parent.mkdir(exist_ok=True)
        if memory := self.parents.get("memory"):
            _write(memory / "memory.limit_in_bytes", _all_goals_bytes())
        if cpu := self.parents.get("cpu"):
            # On v1 a cgroup weighs against each task beside it as one task would: all goals at the
            # default 1024 had one busy process's share of a loaded box between them. As one
            # busy process per core, they have what they had without cgroups.
            _write(cpu / "cpu.shares", min(1024 * (os.cpu_count() or 1), 262144))

    def make(self, goal_id: int) -> None:
        for controller, parent in self.parents.items():
            directory = parent / f"goal-{goal_id}"
            directory.mkdir(exist_ok=True)
            if controller == "pids":
                _write(directory / "pids.max", self.limits.pids)
            elif controller == "memory":
                _write(directory / "memory.limit_in_bytes", self.limits.memory_mb * MIB)
                if (swap := directory / "memory.memsw.limit_in_bytes").exists():
                    _write(swap, self.limits.memory_mb * MIB)  # memory and swap together
            elif controller == "cpu":
                _write(directory / "cpu.shares", max(2, self.limits.cpu_weight * 1024 // 100))

    def counters(self, goal_id: int) -> Counters:
        oom = forks = 0
        if memory := self.parents.get("memory"):
            oom = _field(memory / f"goal-{goal_id}" / "memory.oom_control", "oom_kill")
        if pids := self.parents.get("pids"):
            forks = _field(pids / f"goal-{goal_id}" / "pids.events", "max")
        return Counters(oom, forks)


class V2Tree(Tree):
    """cgroup v2: one parent, with the controllers given to its goal-N children. `base` is where
    the parent is made; `leaf`, when set, is where the processes of `base` move first."""

    version = 2

    def __init__(self, parents: dict[str, Path], limits: Limits, base: Path, leaf: Path | None):
        super().__init__(parents, limits)
        self.base = base
        self.leaf = leaf

    @property
    def parent(self) -> Path:
        return next(iter(self.parents.values()))

    def prepare(self) -> None:
        enable = " ".join(f"+{c}" for c in self.parents)
        if self.leaf is not None:
            self._move_to_leaf()
        try:
            _write(self.base / "cgroup.subtree_control", enable)
        except OSError as exc:
            # The root of a container's cgroup namespace holds its processes: to the leaf first,
            # as a delegated cgroup's (the hierarchy's true root never refuses so).
            if exc.errno != errno.EBUSY or self.leaf is not None:
                raise
            self.leaf = self.base / "runner"
            self._move_to_leaf()
            _write(self.base / "cgroup.subtree_control", enable)
        self.parent.mkdir(exist_ok=True)
        _write(self.parent / "cgroup.subtree_control", enable)
        _write(self.parent / "memory.max", _all_goals_bytes())

    def _move_to_leaf(self) -> None:
        assert self.leaf is not None
        self.leaf.mkdir(exist_ok=True)
        for pid in (self.base / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                _write(self.leaf / "cgroup.procs", pid)

    def make(self, goal_id: int) -> None:
        directory = self.parent / f"goal-{goal_id}"
        directory.mkdir(exist_ok=True)
        _write(directory / "pids.max", self.limits.pids)
        _write(directory / "memory.max", self.limits.memory_mb * MIB)
        if (swap := directory / "memory.swap.max").exists():
            _write(swap, 0)  # the memory limit is all it holds: swap included
        _write(directory / "cpu.weight", self.limits.cpu_weight)

    def counters(self, goal_id: int) -> Counters:
        directory = self.parent / f"goal-{goal_id}"
        return Counters(
            _field(directory / "memory.events", "oom_kill"), _field(directory / "pids.events", "max")
        )

    def kill(self, goal_id: int) -> None:
        try:
            _write(self.parent / f"goal-{goal_id}" / "cgroup.kill", 1)  # the kernel's own: race-free
        except OSError:  # before Linux 5.14 (or the cgroup is gone already)
            super().kill(goal_id)


# ---- finding where they go ----


@dataclass(frozen=True)
class _Mount:
    root: str  # the cgroup mounted there, as /proc/self/cgroup names it
    point: Path
    controllers: frozenset[str]  # a v1 hierarchy's; empty for v2 (its cgroup.controllers says)


def _mounts(mountinfo: str) -> tuple[_Mount | None, dict[str, _Mount]]:
    """The cgroup2 mount and each v1 controller's, from /proc/self/mountinfo."""
    v2: _Mount | None = None
    v1: dict[str, _Mount] = {}
    for line in mountinfo.splitlines():
        mine, _, theirs = line.partition(" - ")
        fields, kind = mine.split(), theirs.split()
        if len(fields) < 5 or len(kind) < 3:
            continue
        root, point = fields[3], Path(fields[4].replace("\\040", " "))
        if kind[0] == "cgroup2" and v2 is None:
            v2 = _Mount(root, point, frozenset())
        elif kind[0] == "cgroup":
            controllers = frozenset(kind[2].split(",")) & set(CONTROLLERS)
            for controller in controllers:
                v1.setdefault(controller, _Mount(root, point, controllers))
    return v2, v1


def _own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """The runner's cgroup in each hierarchy, from /proc/self/cgroup: controller -> path, and
    "" -> its v2 path."""
    own = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                own[controller] = parts[2]
    return own


def _inside(mount: _Mount, path: str) -> Path | None:
    """Where the cgroup `path` is under the mount (None: the mount does not show it)."""
    relative = os.path.relpath(path, mount.root)
    if relative.startswith(".."):
        return None
    return mount.point if relative == "." else mount.point / relative


def runner_id(settings: RunnerSettings) -> str:
    """The runner's parent cgroup's name: its name and a hash of its home (unique per home)."""
    digest = hashlib.sha256(str(settings.home.resolve()).encode()).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", settings.name)[:40]
    return f"goaltender-{name}-{digest}"


def plan(settings: RunnerSettings) -> Tree | str:
    """Where this runner's goal cgroups would go, or why there are none. Changes nothing."""
    try:
        v2, v1 = _mounts(Path("/proc/self/mountinfo").read_text())
        own = _own_cgroups(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        return f"the kernel's cgroup files cannot be read ({exc})"
    limits = Limits.from_settings(settings)
    name = runner_id(settings)
    if v2 is not None and "" in own and (planned := _plan_v2(v2, own[""], name, limits)) is not None:
        return planned
    if found := {c: v1[c] for c in CONTROLLERS if c in v1 and c in own}:
        return _plan_v1(found, own, name, limits)
    if v2 is not None and "" in own:
        return "no cgroup controllers (pids, memory, cpu) are available to this runner"
    return "this kernel mounts no cgroup filesystem"


def _plan_v2(mount: _Mount, own_path: str, name: str, limits: Limits) -> V2Tree | str | None:
    """None when the v2 hierarchy has none of the controllers (hybrid: they are on v1)."""
    root = mount.point
    available = set(_read(root / "cgroup.controllers").split()) & set(CONTROLLERS)
    if not available:
        return None
    controllers = [c for c in CONTROLLERS if c in available]
    own = _inside(mount, own_path)
    if own is not None and own != root and _delegated(own):
        base, leaf = own, own / "runner"
    elif os.geteuid() == 0 and os.access(root / "cgroup.subtree_control", os.W_OK):
        base, leaf = root, None  # the hierarchy's root may hold processes and still delegate
    else:
        where = own or own_path
        return f"cgroup v2: the runner's cgroup {where} is not delegated to it, and it is not root"
    parent = base / name
    return V2Tree(dict.fromkeys(controllers, parent), limits, base, leaf)


def _plan_v1(mounts: dict[str, _Mount], own: dict[str, str], name: str, limits: Limits) -> V1Tree | str:
    parents = {}
    for controller, mount in mounts.items():
        directory = _inside(mount, own[controller])
        if directory is None or not os.access(directory, os.W_OK):
            where = directory or own[controller]
            return f"cgroup v1: the runner's {controller} cgroup {where} is not writable by it"
        parents[controller] = directory / name
    return V1Tree(parents, limits)


def _delegated(directory: Path) -> bool:
    """Is the cgroup v2 `directory` this runner's to divide? systemd marks a unit's delegated
    cgroup (Delegate=yes) with an extended attribute (v251+), and gives it to a non-root service's
    user; older systemd answers `systemctl show`."""
    for attribute in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(directory, attribute) == b"1":
                return True
    control = directory / "cgroup.subtree_control"
    if os.geteuid() != 0:
        return os.access(control, os.W_OK) and os.access(directory / "cgroup.procs", os.W_OK)
    if not directory.name.endswith((".service", ".scope")) or shutil.which("systemctl") is None:
        return False
    try:
        shown = subprocess.run(
            ["systemctl", "show", "--property=Delegate", "--value", directory.name],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return shown.stdout.strip() == "yes"


# ---- the runner's side ----


class GoalCgroups:
    """This runner's goal cgroups: made as a goal's first process starts, emptied and removed
    at its end. Off (every method a no-op) until `start` finds the kernel's tools usable."""

    def __init__(self, settings: RunnerSettings):
        self.settings = settings
        self.tree: Tree | None = None
        self.problem: str | None = None  # why limits are off, once `start` has looked
        self._ended: set[int] = set()

    @property
    def status_file(self) -> Path:
        return self.settings.home / "limits.json"

    def start(self) -> None:
        """Find where goal cgroups go and make the runner's parent there; say once if that fails."""
        planned = plan(self.settings)
        if isinstance(planned, str):
            self.problem = planned
        else:
            try:
                planned.prepare()
            except OSError as exc:
                self.problem = f"{planned.describe()} cannot be set up ({exc})"
            else:
                self.tree = planned
        if self.problem is not None:
            log.warning("per-goal limits are off: %s; to turn them on, %s", self.problem, ENABLE_HINT)
        self._write_status()

    def text(self) -> str:
        if self.tree is None:
            return f"off ({self.problem or 'not started'})"
        return f"{self.tree.limits.text(self.tree.parents)} per goal, in {self.tree.describe()}"

    def _write_status(self) -> None:
        """What `goaltender doctor` reports of this runner (it may run elsewhere: another cgroup)."""
        detail = self.problem if self.tree is None else self.text()
        status: dict[str, object] = {"on": self.tree is not None, "detail": detail, "pid": os.getpid()}
        if self.tree is not None:
            status["limits"] = asdict(self.tree.limits)
        with contextlib.suppress(OSError):
            temporary = self.status_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(status) + "\n")
            temporary.replace(self.status_file)

    def join(self, goal_id: int) -> tuple[str, ...]:
        """The files a process of the goal writes itself into (`joined`), its cgroup made if need
        be; none when limits are off. Raises OSError when the cgroup cannot be made, or the goal
        has ended: its process must not start outside."""
        if self.tree is None:
            return ()
        if goal_id in self._ended:
            raise OSError(f"goal #{goal_id} has ended: no more processes start in its cgroup")
        self.tree.make(goal_id)
        return self.tree.procs_files(goal_id)

    def counters(self, goal_id: int) -> Counters:
        return self.tree.counters(goal_id) if self.tree is not None else Counters()

    def usage(self, goal_id: int, before: Counters) -> Usage | None:
        """What the goal's limits did since `before` (None: limits are off)."""
        if self.tree is None:
            return None
        now = self.counters(goal_id)
        return Usage(
            self.tree.limits, now.oom_kills - before.oom_kills, now.forks_refused - before.forks_refused
        )

    async def clear_stale(self) -> None:
        """At start: the cgroups a runner of this home left (its processes killed)."""
        if self.tree is not None:
            for goal_id in sorted(self.tree.goals()):
                await self._empty(goal_id)

    async def end(self, goal_id: int) -> None:
        """The goal has ended: whatever is left in its cgroup is killed, and the cgroup goes."""
        self._ended.add(goal_id)
        await self._empty(goal_id)

    async def close(self) -> None:
        """The runner stops (its goals' processes are stopped): their cgroups go, and its parent."""
        if self.tree is not None:
            for goal_id in sorted(self.tree.goals()):
                await self._empty(goal_id)
            self.tree.remove_parents()

    async def _empty(self, goal_id: int) -> None:
        tree = self.tree
        if tree is None:
            return
        deadline = time.monotonic() + KILL_DEADLINE_S
        while True:
            tree.kill(goal_id)
            if tree.remove(goal_id):
                return
            if time.monotonic() > deadline:
                log.warning("goal #%d's cgroup is not empty yet: left for the next start", goal_id)
                return
            await asyncio.sleep(0.02)  # SIGKILLed tasks leave the cgroup as they exit


def joined(procs_files: tuple[str, ...], argv: list[str]) -> list[str]:
    """`argv`, run by a process that first writes itself into each of `procs_files`."""
    if not procs_files:
        return argv
    return ["/bin/sh", "-c", _JOIN, "goaltender-cgroup", *procs_files, "--", *argv]


# ---- helpers ----


def _all_goals_bytes() -> int:
    total = box_memory_mb()
    return max(total - reserve_mb(total), 64) * MIB


def _write(path: Path, value: object) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _field(path: Path, name: str) -> int:
    """A counter of a flat-keyed cgroup file (`name value` lines); 0 when absent."""
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _size(mb: int) -> str:
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb} MB"
