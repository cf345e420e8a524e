"""Each goal's network: a namespace of its own, shared by its agent and its experiments.

GOALTENDER_SANDBOX_NETWORK says what a goal's sandboxes reach:

- `isolated` (the default): the goal's own network namespace. Its loopback is the goal's (a server
  one experiment starts, another reaches at localhost), the outside world is reached through
  slirp4netns (user-mode TCP/IP, as rootless podman does), and the box's own loopback services
  (a Ray dashboard, a database, any local daemon) and abstract Unix sockets are not there — but
  for the loopback ports the runner allows: those its variables for services goals use name
  (GOAL_SERVICES: the model endpoint, OPENAI_BASE_URL=http://127.0.0.1:8080/v1; HF_ENDPOINT; a
  proxy) and GOALTENDER_SANDBOX_PORTS; never its own (the Ray dashboard it submits jobs to). The
  runner relays those: a listener inside the namespace, a connection to the box's port outside.
- `none`: the goal's own namespace with its loopback only: no way out.
- `host`: the box's network, as it is (its loopback and abstract sockets included).

How: a holder process — bwrap with a network namespace of its own, running `sleep` once bwrap has
set the namespace up (it says so on its stdout) — keeps the namespace for the goal's life, and dies
with the runner. slirp4netns joins the namespace to give it a way out. When the runner allows
ports, a short-lived helper enters the namespace, makes their listeners there and hands them to the
runner over a socketpair (SCM_RIGHTS): a listening socket stays in the namespace it was made in.
Each sandboxed process enters the namespace with nsenter (an exec, so the sandbox's pid is still the
one the runner supervises): with the namespace's own user namespace when it has one (an
unprivileged runner's bwrap makes one), by its descriptor. Opening a goal's network costs a bwrap,
a slirp4netns and (with ports) a Python start: tens of milliseconds at a goal's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from goaltender.runner.config import RunnerSettings

log = logging.getLogger("goaltender.runner")

NS_GET_USERNS = 0xB701  # ioctl: the user namespace that owns a namespace (linux/nsfs.h)
SLIRP_DNS = "10.0.2.3"  # slirp4netns's resolver, which asks the box's
OPEN_TIMEOUT_S = 30.0
# The runner's variables naming services its goals use: a loopback port one names is relayed into
# their namespaces. Never the runner's own (GOALTENDER_RAY_ADDRESS: Ray's job API would run a goal's
# commands outside its sandbox; the MLflow mirror's store).
GOAL_SERVICES = (
    "OPENAI_BASE_URL", "GOALTENDER_OPENAI_BASE_URL", "OPENAI_API_BASE",  # the model endpoint
    "HF_ENDPOINT",  # a hub mirror libraries in runs may read
    "MLFLOW_TRACKING_URI", "WANDB_BASE_URL",  # trackers a run logs to itself
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",  # a box's proxy
)  # fmt: skip
INSTALL_HINT = (
    "install slirp4netns (apt install slirp4netns), or set GOALTENDER_SANDBOX_NETWORK=host (sandboxes "
    "then reach the box's loopback services and abstract sockets) or none (no network)"
)

# The holder, once bwrap has set up the namespace (its loopback up): it says so, then waits.
HOLDER = [
    "/bin/sh",
    "-c",
    'echo ready && exec "$0" infinity',
    os.path.realpath(shutil.which("sleep") or "/bin/sleep"),
]
# Inside the goal's namespace, for a moment: listeners for the allowed ports, handed to the runner.
LISTENER = """
import socket, sys
channel = socket.socket(fileno=int(sys.argv[1]))
listeners = []
for port in map(int, sys.argv[2:]):
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            listener = socket.socket(family, socket.SOCK_STREAM)
            listener.bind((host, port))
            listener.listen(128)
        except OSError:
            continue
        listeners.append(listener)
socket.send_fds(channel, [b"ready"], [l.fileno() for l in listeners])
"""


class NetworkError(OSError):
    """A goal's network cannot be made (slirp4netns or nsenter missing, bwrap failing)."""


def allowed_ports(settings: RunnerSettings, env: Mapping[str, str]) -> list[int]:
    """The box's loopback ports a goal may reach: those the runner's GOAL_SERVICES variables name
    (OPENAI_BASE_URL=http://127.0.0.1:8080/v1), and GOALTENDER_SANDBOX_PORTS."""
    ports = set(settings.sandbox_ports)
    for name in GOAL_SERVICES:
        if (value := env.get(name)) and (port := _loopback_port(value)):
            ports.add(port)
    return sorted(ports)


def _loopback_port(value: str) -> int | None:
    try:
        url = urllib.parse.urlsplit(value.strip())
        host, port = url.hostname, url.port
    except ValueError:
        return None
    if host is None:
        return None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return None
    if not loopback:
        return None
    return port or {"http": 80, "https": 443}.get(url.scheme)


def resolver_text(resolv_conf: str) -> str | None:
    """What an isolated namespace's /etc/resolv.conf must say: None when the box's resolvers are
    reachable from it as they are, else slirp4netns's resolver (a loopback stub, such as
    systemd-resolved's 127.0.0.53, is the box's own loopback)."""
    servers = [line.split()[1] for line in resolv_conf.splitlines() if line.split()[:1] == ["nameserver"]
               and len(line.split()) > 1]  # fmt: skip
    if servers and not any(_is_loopback(server) for server in servers):
        return None
    kept = [line for line in resolv_conf.splitlines() if line.split()[:1] != ["nameserver"]]
    return "\n".join([f"nameserver {SLIRP_DNS}", *kept]) + "\n"


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


@dataclass
class _Network:
    """One goal's namespace and what keeps it: the holder, the way out, the relays."""

    holder: subprocess.Popen
    net_fd: int | None  # None once closed
    user_fd: int | None  # the namespace's own user namespace; None: ours (a root runner)
    slirp: subprocess.Popen | None = None
    slirp_exit: int | None = None  # closed: slirp4netns exits
    relays: list[asyncio.Server] = field(default_factory=list)

    def close(self) -> None:
        for relay in self.relays:
            relay.close()
        # Once: a second close would close whatever took the descriptors' numbers since.
        fds, self.net_fd, self.user_fd, self.slirp_exit = (
            (self.net_fd, self.user_fd, self.slirp_exit),
            None,
            None,
            None,
        )
        for fd in fds:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for proc in (self.holder, self.slirp):
            # One that failed to start was reaped, its output read, already: reading it again would
            # raise, hiding why the network could not be made.
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.communicate()  # reaped, its pipes closed


class GoalNetworks:
    """The goals' networks, opened as a goal starts and closed as it ends."""

    def __init__(self, settings: RunnerSettings):
        self.settings = settings
        self.mode = settings.sandbox_network
        self._networks: dict[int, _Network] = {}
        self._opening: dict[int, asyncio.Task[_Network]] = {}
        self._nsenter = shutil.which("nsenter") or "nsenter"
        self._bwrap = shutil.which("bwrap") or "bwrap"
        self._resolver: Path | None = None

    @property
    def isolated(self) -> bool:
        return self.mode != "host"

    def problem(self) -> str | None:
        """Why goals' networks cannot be made here (None: they can)."""
        if not self.isolated:
            return None
        if shutil.which("nsenter") is None:
            return "the goals' networks need nsenter (util-linux), which is not installed"
        if self.mode == "isolated" and shutil.which("slirp4netns") is None:
            return f"the goals' isolated networks need slirp4netns, which is not installed: {INSTALL_HINT}"
        return None

    async def open(self, goal_id: int) -> None:
        """The goal's network, made if it has none (a restart makes it anew)."""
        if not self.isolated or goal_id in self._networks:
            return
        task = self._opening.get(goal_id)
        if task is None:
            task = self._opening[goal_id] = asyncio.ensure_future(self._open(goal_id))
        try:
            network = await asyncio.shield(task)
        finally:
            self._opening.pop(goal_id, None)
        self._networks.setdefault(goal_id, network)

    def close(self, goal_id: int) -> None:
        if (network := self._networks.pop(goal_id, None)) is not None:
            network.close()

    def close_all(self) -> None:
        for goal_id in list(self._networks):
            self.close(goal_id)

    def entry(self, goal_id: int) -> tuple[list[str], tuple[int, ...]]:
        """How a process enters the goal's network: the words before its command, and the
        descriptors it must inherit for them (its own copies, which Launch.close closes). An
        unprivileged runner's enters the namespace's user namespace too, where it is uid 0:
        the sandbox maps it back (`user_words`)."""
        if not self.isolated:
            return [], ()
        network = self._networks.get(goal_id)
        if network is None:
            raise NetworkError(f"goal #{goal_id} has no network (it is not running)")
        return self._entry(network)

    def _entry(self, network: _Network) -> tuple[list[str], tuple[int, ...]]:
        if network.net_fd is None:
            raise NetworkError("the goal's network is closed (it ended)")
        net = os.dup(network.net_fd)
        words = [self._nsenter, f"--net=/proc/self/fd/{net}"]
        fds = [net]
        if network.user_fd is not None:
            user = os.dup(network.user_fd)
            words[1:1] = [f"--user=/proc/self/fd/{user}", "--preserve-credentials"]
            fds.append(user)
        return [*words, "--"], tuple(fds)

    def user_words(self, goal_id: int) -> list[str]:
        """bwrap's words that keep the sandbox's uid and gid the runner's own, where entering the
        goal's network made them 0 (an unprivileged runner's)."""
        network = self._networks.get(goal_id)
        if network is None or network.user_fd is None:
            return []
        return ["--unshare-user", "--uid", str(os.getuid()), "--gid", str(os.getgid())]

    def resolver(self) -> Path | None:
        """A resolv.conf for isolated sandboxes, when the box's own resolver is on its loopback."""
        if self.mode != "isolated":
            return None
        if self._resolver is None:
            try:
                text = resolver_text(Path("/etc/resolv.conf").read_text())
            except OSError:
                text = f"nameserver {SLIRP_DNS}\n"
            if text is None:
                return None
            self._resolver = self.settings.home / "sandbox-resolv.conf"
            self._resolver.write_text(text)
        return self._resolver

    async def _open(self, goal_id: int) -> _Network:
        if problem := self.problem():
            raise NetworkError(problem)
        ports = allowed_ports(self.settings, os.environ)
        network = await asyncio.to_thread(self._hold)
        try:
            outside = asyncio.to_thread(self._way_out, network) if self.mode == "isolated" else _nothing()
            _, listeners = await asyncio.gather(outside, asyncio.to_thread(self._listen, network, ports))
            for listener in listeners:
                port = listener.getsockname()[1]
                host = "::1" if listener.family == socket.AF_INET6 else "127.0.0.1"
                relay = await asyncio.start_server(partial(_relay, host, port), sock=listener)
                network.relays.append(relay)
        except BaseException:
            network.close()
            raise
        log.info("goal #%d: its own network (%s; the box's ports it reaches: %s)", goal_id, self.mode,
                 ", ".join(map(str, ports)) or "none")  # fmt: skip
        return network

    def _hold(self) -> _Network:
        """Start the holder; its namespace's descriptors once it is set up."""
        info_r, info_w = os.pipe()
        argv = [self._bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-net", "--die-with-parent"]
        argv += ["--info-fd", str(info_w), "--", *HOLDER]
        try:
            holder = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(info_w,),
                start_new_session=True,
            )
        except OSError as exc:
            os.close(info_r)
            raise NetworkError(f"the goal's network could not be made: {exc}") from exc
        finally:
            os.close(info_w)
        assert holder.stdout is not None
        try:
            pid = _child_pid(info_r)
            if holder.stdout.readline() != b"ready\n":  # set up: its loopback is up
                raise OSError("the holder ended before it was ready")
            net_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError, KeyError) as exc:
            holder.kill()
            _, err = holder.communicate()
            why = err.decode(errors="replace").strip()[-300:] or str(exc)
            raise NetworkError(f"the goal's network could not be made: bwrap: {why}") from exc
        user_fd: int | None = fcntl.ioctl(net_fd, NS_GET_USERNS)
        if user_fd is not None and os.fstat(user_fd).st_ino == os.stat("/proc/self/ns/user").st_ino:
            os.close(user_fd)  # ours: a root runner enters the network namespace alone
            user_fd = None
        if user_fd is not None:
            os.set_inheritable(user_fd, False)
        return _Network(holder, net_fd, user_fd)

    def _listen(self, network: _Network, ports: list[int]) -> list[socket.socket]:
        """Listeners for the allowed ports, made inside the namespace by a helper that enters it."""
        if not ports:
            return []
        ours, theirs = socket.socketpair()
        words, fds = self._entry(network)
        argv = [*words, sys.executable, "-I", "-S", "-c", LISTENER, str(theirs.fileno()), *map(str, ports)]
        try:
            helper = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(), *fds),
            )  # fmt: skip
        except OSError as exc:
            raise NetworkError(f"the goal's allowed ports could not be opened: {exc}") from exc
        finally:
            theirs.close()
            for fd in fds:
                os.close(fd)
        try:
            ours.settimeout(OPEN_TIMEOUT_S)
            message, received, _, _ = socket.recv_fds(ours, 16, 2 * len(ports))
        except OSError as exc:
            helper.kill()
            raise NetworkError(f"the goal's allowed ports could not be opened: {exc}") from exc
        finally:
            ours.close()
        _, err = helper.communicate()
        if message != b"ready":
            for fd in received:
                os.close(fd)
            why = err.decode(errors="replace").strip()[-300:] or f"exit code {helper.returncode}"
            raise NetworkError(f"the goal's allowed ports could not be opened: {why}")
        return [socket.socket(fileno=fd) for fd in received]

    def _way_out(self, network: _Network) -> None:
        """slirp4netns into the namespace: a tap device, an address, a default route, a resolver;
        never the box's loopback."""
        if network.net_fd is None:
            raise NetworkError("the goal's network is closed (it ended)")
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        argv = ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback"]
        argv += [f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", "--netns-type=path"]
        fds = [ready_w, exit_r, network.net_fd]
        if network.user_fd is not None:
            argv.append(f"--userns-path=/proc/self/fd/{network.user_fd}")
            fds.append(network.user_fd)
        argv += [f"/proc/self/fd/{network.net_fd}", "tap0"]
        try:
            network.slirp = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=tuple(fds),
                start_new_session=True,
            )
        except OSError as exc:
            raise NetworkError(f"slirp4netns could not start: {exc}: {INSTALL_HINT}") from exc
        finally:
            os.close(ready_w)
            os.close(exit_r)
        network.slirp_exit = exit_w
        with os.fdopen(ready_r, "rb") as ready:
            said = ready.read(1)
        if said != b"1":
            network.slirp.kill()
            _, err = network.slirp.communicate()
            raise NetworkError(f"slirp4netns failed: {err.decode(errors='replace').strip()[:300]}")


def _child_pid(info_fd: int) -> int:
    """The pid bwrap's --info-fd names (its JSON read whole: bwrap may keep the pipe open)."""
    said = b""
    with os.fdopen(info_fd, "rb", buffering=0) as info:
        while chunk := info.read(4096):
            said += chunk
            with contextlib.suppress(ValueError):
                return int(json.loads(said)["child-pid"])
    return int(json.loads(said)["child-pid"])


async def _nothing() -> None:
    return None


async def _relay(host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A connection to an allowed port inside a goal's namespace, relayed to the box's."""
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()
