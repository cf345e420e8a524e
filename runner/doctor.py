"""`goaltender doctor`: checks a GPU box is ready for campaigns, one line each.

Each check is a small function of the box (`Box`: the runner's settings, the environment, the
NVML reader, timeouts) that returns a `Verdict`: ok, warn or fail, what it saw, and the fix;
`CHECKS`, a table, names them. The checks run side by side (each waits at most a few seconds on the network), are printed in the
order of `CHECKS`, and everything shown passes through the runner's redactor: keys and tokens are
said to be set, never shown. `goaltender doctor` exits 1 when any check fails, else 0 (with
`--strict`, 1 when any warns too): a `fail` is a box not ready, so a service may gate its start on
the exit code; a `warn` is what some goals do without, e.g. the hub on a box with no way out to it
and no mirror configured (goals use what is cached).

What is looked at is what agents and experiments will get: the caches as `agent_env.cache_routing`
routes them (each goal's own, and the shared hub cache), the model endpoint's variables as the LLM agents read them, the runner's own sandbox
probe. A check that cannot be made (a crash in it) is a fail that says so, not a traceback.

One module past 600 lines on purpose: it is the table and a dozen checks of a dozen lines or so,
independent of each other, with the few helpers they share (an HTTP GET without redirects, a
subprocess with a timeout, the hub's and NeMo RL's paths). Split by area, the table would import
from every part and each part back from it, for no check that reads any easier.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import getpass
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable
from goaltender.protocol.quick_client import operator_problem
from goaltender.runner.agent_env import CACHE_DIRS
from goaltender.runner.config import RunnerSettings
from goaltender.runner.goal_network import INSTALL_HINT as NETWORK_HINT
from goaltender.runner.gpus import Gpu, Gpus, NoDriver, read_all_gpus
from goaltender.runner.limits import ENABLE_HINT, GoalCgroups, plan
from goaltender.runner.operators import user_name
from goaltender.runner.sandbox import INSTALL_HINT, UNSAFE_WARNING, Sandbox
from goaltender.runner.secrets import Redactor, url_shown
from goaltender.selftest import FIX as FIX_INTERPRETER
from goaltender.selftest import engine_bugs, misread_samples
from goaltender.training.nemo_rl import worker_venvs

Status = Literal["ok", "warn", "fail"]

NEMO_RL_TAG = "v0.7.0"  # the NeMo RL release whose Gym submodule is nemo-gym 0.4.0
NEMO_GYM_VERSION = "0.4.0"
GYM_PYTHON = (3, 12)  # nemo-gym 0.4.0's Requires-Python
NEMO_RL_REPO = "https://github.com/NVIDIA-NeMo/RL"
HUB_PROBE_MODEL = "openai-community/gpt2"  # public and small: any hub or mirror answers for it
DEFAULT_HUB = "https://huggingface.co"
DEFAULT_MODEL_ENDPOINT = "https://api.openai.com/v1"  # the LLM agents' default (agents/openai_agent.py)
TRUTHY = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Verdict:
    """What one check found: its status, what it saw, and what to do about it."""

    status: Status
    detail: str
    fix: str = ""
    snippet: str = ""
    """More lines shown beneath the line (the bot's entry for this runner)."""


def ok(detail: str, fix: str = "", snippet: str = "") -> Verdict:
    return Verdict("ok", detail, fix, snippet)


def warn(detail: str, fix: str, snippet: str = "") -> Verdict:
    return Verdict("warn", detail, fix, snippet)


def fail(detail: str, fix: str, snippet: str = "") -> Verdict:
    return Verdict("fail", detail, fix, snippet)


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's output: a check's name and its verdict."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    snippet: str = ""

    def text(self) -> str:
        line = f"{self.status:<4} {self.name}: {self.detail}"
        if self.fix and self.status != "ok":
            line += f" — fix: {self.fix}"
        return line + "".join(f"\n       {row}" for row in self.snippet.splitlines())


# ---- the box ----


@dataclass
class Box:
    """What the checks look at: `doctor()` builds it from this process's environment, tests
    build their own."""

    settings: RunnerSettings
    env: Mapping[str, str]
    read_gpus: Callable[[], Gpus] = read_all_gpus
    timeout_s: float = 5.0
    ssh_port: int = 22
    user_home: Path = field(default_factory=Path.home)
    default_hub: str = DEFAULT_HUB  # the hub when HF_ENDPOINT names no mirror

    @property
    def big_disk(self) -> Path:
        return _existing(self.settings.home)

    @property
    def small_disk(self) -> Path | None:
        """HOME's filesystem when it is not the big disk's (None: one disk for both)."""
        home = _existing(self.user_home)
        return None if _same_filesystem(home, self.big_disk) else home

    def on_small_disk(self, path: Path) -> bool:
        return self.small_disk is not None and _same_filesystem(_existing(path), self.small_disk)


Check = Callable[[Box], Verdict]

# ---- the checks ----


def check_python(box: Box) -> Verdict:
    version = ".".join(map(str, sys.version_info[:3]))
    detail = f"Python {version} ({sys.executable}), goaltender {_goaltender_version()}"
    if misread := misread_samples():  # the runner and the bot refuse to start on it
        return fail(f"{detail} misreads budgets: {'; '.join(misread[:2])}", FIX_INTERPRETER)
    if bugs := engine_bugs():
        return warn(
            f"{detail}: its re module has CPython {', '.join(bugs)} (possessive quantifiers mis-match); "
            "goaltender does not use them and reads budgets right here, code a goal's agent writes may",
            FIX_INTERPRETER,
        )
    return ok(detail + "; nemo-gym runs in a Python 3.12 venv of its own (nemo-gym below)")


def check_gpu(box: Box) -> Verdict:
    try:
        gpus = box.read_gpus()
    except NoDriver as exc:
        return _cpu_only(f"no NVIDIA driver ({exc})")
    except Exception as exc:  # NVML started but a query failed: a driver in trouble
        return fail(f"NVML error: {exc}", "run nvidia-smi to see what the driver says")
    if not gpus.devices:
        return _cpu_only(f"driver {gpus.driver} sees no GPU")
    names = ", ".join(
        f"{count} × {name} ({mib:,} MiB)" for (name, mib), count in _counted(gpus.devices).items()
    )
    detail = f"{len(gpus.devices)} GPU{'s' if len(gpus.devices) > 1 else ''}: {names}; driver {gpus.driver}, CUDA {gpus.cuda}"
    if (visible := box.env.get("CUDA_VISIBLE_DEVICES")) is not None:
        detail += f"; CUDA_VISIBLE_DEVICES={visible} limits what the runner uses"
    return ok(detail)


def _cpu_only(why: str) -> Verdict:
    return warn(
        f"{why}: CPU only, experiments are charged CPU-hours",
        "install the NVIDIA driver if this box has GPUs (nvidia-smi should list them)",
    )


def check_disk(box: Box) -> Verdict:
    if (elsewhere := _another_users_home(box)) is not None:
        return elsewhere
    home = box.settings.home
    usage = shutil.disk_usage(box.big_disk)
    detail = f"{_size(usage.free)} free of {_size(usage.total)} on {home}'s disk"
    minimum = box.settings.min_free_mb
    if usage.free / 2**20 < minimum:
        return fail(
            f"{detail}, under GOALTENDER_MIN_FREE_MB ({minimum:g}): no experiment would start",
            "free space on that disk, or put GOALTENDER_HOME on a bigger one",
        )
    if box.small_disk is None:
        return warn(
            f"{detail}, the same filesystem as HOME ({box.user_home})",
            "if that is the small disk, put GOALTENDER_HOME on the big disk (state, workspaces and caches go there)",
        )
    return ok(f"{detail}; HOME ({box.user_home}) is on another filesystem")


def check_caches(box: Box) -> Verdict:
    if (elsewhere := _another_users_home(box)) is not None:
        return elsewhere
    goals, hub = box.settings.cache_dir / "goals", box.settings.hub_cache_in(box.env)
    if unwritable := [str(path) for path in (goals, hub) if not _writable(path)]:
        return fail(
            f"not writable: {', '.join(unwritable)}",
            "make them writable for the runner's user, or unset HF_HUB_CACHE and HF_HOME so the hub "
            "cache goes under $GOALTENDER_HOME/cache",
        )
    boxes = [var for var in ("HF_HUB_CACHE", "HF_HOME") if var in box.env]
    if boxes and box.on_small_disk(hub):
        return warn(
            f"the box sets {boxes[0]}={box.env[boxes[0]]}: the hub cache {hub} is on the small disk (HOME's)",
            f"unset {' and '.join(boxes)} (the hub cache goes under $GOALTENDER_HOME/cache) or point it at the big disk",
        )
    return ok(
        f"each goal's own caches ({len(CACHE_DIRS)} variables) under {goals}, removed with the goal; "
        f"the hub cache {hub}{' as the box sets it' if boxes else ''}, shared, read-only to goals"
    )


def check_nemo_rl(box: Box) -> Verdict:
    checkout = _nemo_rl_dir(box)
    clone = _clone_command(box)
    if checkout is None:
        return warn(
            "no checkout configured (NEMO_RL_DIR); needed for NeMo RL campaigns only",
            f"{clone}, then export NEMO_RL_DIR={box.settings.home / 'nemo-rl'}",
        )
    if not checkout.is_dir():
        return warn(f"NEMO_RL_DIR={checkout} does not exist", clone)
    if not (checkout / "examples" / "run_sft.py").is_file():
        return warn(f"{checkout} is not a NeMo RL checkout (no examples/run_sft.py)", clone)
    described = _run([_tool("git", box), "-C", str(checkout), "describe", "--tags", "--always"], box)
    if described is None:
        return warn(f"{checkout} is not a git checkout (git describe failed)", clone)
    detail = f"{checkout} at {described}"
    pin = f"git -C {checkout} checkout {NEMO_RL_TAG} && git -C {checkout} submodule update --init --recursive"
    if described != NEMO_RL_TAG:
        return warn(
            f"{detail}: Goaltender's Gym pairing is {NEMO_RL_TAG} (nemo-gym {NEMO_GYM_VERSION})",
            pin,
        )
    gym = checkout / "3rdparty" / "Gym-workspace" / "Gym"
    if not gym.is_dir() or not any(gym.iterdir()):
        return warn(f"{detail}, without its Gym submodule", pin)
    return ok(f"{detail}, examples/run_sft.py and the Gym submodule present")


def check_nemo_rl_venv(box: Box) -> Verdict:
    checkout = _nemo_rl_dir(box)
    if checkout is None or not (checkout / "examples" / "run_sft.py").is_file():
        return warn("not checked: no NeMo RL checkout", "see nemo-rl above")
    uv_version = _run([_tool("uv", box), "--version"], box)
    if uv_version is None:
        return warn("uv is not on PATH (NeMo RL runs everything through uv run)", "pip install uv")
    # Built here, not in a run: the sandbox shows the checkout read-only.
    sync = f"cd {checkout} && uv sync (the Python comes from .python-version)"
    venv = checkout / ".venv"
    installed = _run([str(venv / "bin" / "python"), "-c", VENV_PROBE], box)
    if installed is None:
        return warn(f"{uv_version}; no venv in {venv}", sync)
    python, _, nemo_rl = installed.partition(" ")
    if not nemo_rl:
        return warn(f"{uv_version}; {venv} (Python {python}) has no nemo-rl installed", sync)
    workers = _worker_venvs(box)
    if workers is None:
        where = "worker venvs in each goal's cache (built on its first run)"
    else:
        built = f"{sum(1 for _ in workers.iterdir())} built" if workers.is_dir() else "built on first run"
        where = f"worker venvs in {workers} ({built})"
    workers = workers or box.settings.cache_dir
    detail = f"{uv_version}; nemo-rl {nemo_rl} in {venv} (Python {python}); {where}"
    if box.on_small_disk(workers):
        return warn(
            f"{detail}: on the small disk (HOME's)",
            f"export NEMO_RL_VENV_DIR={worker_venvs(box.settings.cache_dir)}",
        )
    return ok(detail)


VENV_PROBE = """import importlib.metadata, platform
try:
    nemo_rl = importlib.metadata.version("nemo-rl")
except importlib.metadata.PackageNotFoundError:
    nemo_rl = ""
print(platform.python_version(), nemo_rl)
"""


GYM_PROBE = """\
import importlib.metadata, json, platform
found = {"python": platform.python_version()}
try:
    import nemo_gym
    found["version"] = importlib.metadata.version("nemo-gym")
except Exception as exc:
    found["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(found))
"""


def check_nemo_gym(box: Box) -> Verdict:
    venv = _gym_venv(box)
    build = "make gym-venv (nemo-gym 0.4.0 in a Python 3.12 venv; or point GOALTENDER_GYM_VENV at one)"
    python = venv / "bin" / "python"
    if not python.exists():
        return warn(f"no venv at {venv}; needed for Gym environments only", build)
    # Importing nemo_gym points HF_HOME at <cwd>/cache: give it a directory of its own to point at.
    with tempfile.TemporaryDirectory(prefix="goaltender-doctor-") as cwd:
        output = _run([str(python), "-c", GYM_PROBE], box, cwd=cwd, timeout=max(box.timeout_s, 60.0))
    try:
        found = json.loads(output or "")
    except json.JSONDecodeError:
        return fail(f"{python} does not run", build)
    where = f"Python {found['python']} at {venv}"
    if tuple(int(part) for part in found["python"].split(".")[:2]) < GYM_PYTHON:
        return fail(f"{where}: nemo-gym needs Python 3.12+", build)
    if "error" in found:
        return fail(f"{where}: import nemo_gym fails ({found['error'][:200]})", build)
    detail = f"nemo-gym {found['version']} on {where}"
    if found["version"] != NEMO_GYM_VERSION:
        return warn(f"{detail}: NeMo RL {NEMO_RL_TAG} pairs with {NEMO_GYM_VERSION}", build)
    return ok(f"{detail} (pairs with NeMo RL {NEMO_RL_TAG})")


def check_hub(box: Box) -> Verdict:
    token = _hub_token(box)
    if box.env.get("HF_HUB_OFFLINE", "").strip().lower() in TRUTHY:
        hub_cache = _hub_cache(box)
        models = len(list(hub_cache.glob("models--*"))) if hub_cache.is_dir() else 0
        detail = f"offline mode (HF_HUB_OFFLINE): {models} model{'s' * (models != 1)} cached in {hub_cache}; {token}"
        if not models:
            return warn(
                detail,
                "download the models first (goaltender fetch MODEL) where the hub is reachable",
            )
        return ok(detail)
    mirror = box.env.get("HF_ENDPOINT")
    endpoint = mirror or box.default_hub
    url, login = _without_login(f"{endpoint.rstrip('/')}/api/models/{HUB_PROBE_MODEL}")
    token_var = _hub_token_var(box)
    # As huggingface_hub sends them: the address's user:password as basic auth, else the token.
    if login is not None:
        headers = {"Authorization": "Basic " + base64.b64encode(login.encode()).decode("ascii")}
    else:
        headers = {"Authorization": f"Bearer {box.env[token_var]}"} if token_var else {}
    fix = "set HF_ENDPOINT to a mirror this box reaches, or HF_HUB_OFFLINE=1 with the models already in the cache"
    try:
        status, _ = _http_get(url, headers, box.timeout_s)
    except OSError as exc:
        if mirror is None and _no_network(exc):  # a closed box, not a broken set-up: goals still run
            return warn(
                f"no way out to {url_shown(endpoint)} from this box ({_reason(exc)}): goals fetch only "
                f"what is cached; {token}",
                "if the box is offline by design, set HF_HUB_OFFLINE=1 with the models cached (goaltender "
                f"fetch where the hub is reachable); else open the way to {url_shown(endpoint)}, or set "
                "HF_ENDPOINT to a mirror",
            )
        return fail(f"cannot reach {url_shown(endpoint)} ({_reason(exc)}); {token}", fix)
    if status in (401, 403):
        return _hub_refused(url_shown(endpoint), status, login is not None, bool(headers))
    if status >= 500:
        return fail(f"{url_shown(endpoint)} answers HTTP {status}; {token}", fix)
    return ok(f"{url_shown(endpoint)} answers (HTTP {status}); {token}")


def _hub_refused(endpoint: str, status: int, with_login: bool, with_token: bool) -> Verdict:
    if with_login:
        return fail(
            f"{endpoint} refused the user:password@ in HF_ENDPOINT's address (HTTP {status}; not shown)",
            "correct the login in HF_ENDPOINT's address",
        )
    if with_token:
        return fail(
            f"{endpoint} refused the token (HTTP {status})", "set HF_TOKEN to a token the hub accepts"
        )
    return fail(
        f"{endpoint} wants a login (HTTP {status}); no HF_TOKEN is set and HF_ENDPOINT's address has no "
        "user:password@",
        "give it the login it wants: user:password@ in HF_ENDPOINT's address, or a token in HF_TOKEN",
    )


def _without_login(url: str) -> tuple[str, str | None]:
    """`url` without its user:password@, and that login decoded ("user:password"), if it had one:
    urllib would take it for part of the host name."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    login = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
    return url_shown(url), login


def _no_network(exc: OSError) -> bool:
    """Whether `exc` says this box has no way out (no name resolution, no route, nothing
    answering, or silence), rather than a hub answering wrongly (a TLS failure, say)."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror | TimeoutError | ConnectionRefusedError):
        return True
    return getattr(reason, "errno", None) in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN)


def check_model_endpoint(box: Box) -> Verdict:
    base_var = _first_set(box.env, "GOALTENDER_OPENAI_BASE_URL", "OPENAI_BASE_URL")
    key_var = _first_set(box.env, "GOALTENDER_OPENAI_API_KEY", "OPENAI_API_KEY")
    setup = "set OPENAI_BASE_URL (vLLM, NIM, OpenAI, …), OPENAI_API_KEY and GOALTENDER_MODEL"
    if base_var is None and key_var is None:
        return warn(
            "not configured: the openai and codex agents need one (the sweep agent does not)",
            setup,
        )
    base = box.env[base_var] if base_var else DEFAULT_MODEL_ENDPOINT
    headers = {"Authorization": f"Bearer {box.env[key_var]}"} if key_var else {}
    key = f"{key_var} set (not shown)" if key_var else "no key"
    try:
        status, body = _http_get(f"{base.rstrip('/')}/models", headers, box.timeout_s)
    except OSError as exc:
        return fail(
            f"cannot reach {url_shown(base)} ({_reason(exc)})",
            "start the model server, or correct OPENAI_BASE_URL",
        )
    if status in (401, 403):
        return fail(
            f"{url_shown(base)} refused the key (HTTP {status}; {key})",
            "set OPENAI_API_KEY to a key the endpoint accepts",
        )
    models = _model_ids(body) if status == 200 else None
    if models is None:
        return fail(
            f"{url_shown(base)}/models answers HTTP {status}: {_excerpt(body)}",
            "check the endpoint serves the OpenAI API at that URL",
        )
    detail = f"{url_shown(base)} serves {len(models)} model{'s' * (len(models) != 1)}: {', '.join(models[:5])}{' …' * (len(models) > 5)}; {key}"
    chosen = box.env.get("GOALTENDER_MODEL")
    if key_var and key_var not in box.settings.grants:
        return warn(
            f"{detail}; {key_var} is not granted to agents",
            f"add {key_var} to GOALTENDER_GRANTS",
        )
    if not chosen:
        return warn(f"{detail}; GOALTENDER_MODEL is not set", "set GOALTENDER_MODEL to one of them")
    if chosen not in models:
        return warn(
            f"{detail}; GOALTENDER_MODEL={chosen} is not among them",
            "set GOALTENDER_MODEL to one of them",
        )
    return ok(f"{detail}; GOALTENDER_MODEL={chosen}")


def check_runner(box: Box) -> Verdict:
    path = box.settings.socket_path
    start = "start it: goaltender runner (under systemd or tmux), with this GOALTENDER_HOME"
    try:
        there = path.exists()
    except PermissionError:  # a directory above it keeps this account out: not an operator
        return fail(*operator_problem(path))
    if not there:
        if (lost := _lost_database(box)) is not None:  # it stopped for that, and starts wait for you
            return fail(f"not running: it stopped because {lost}", f"do as it says, then {start}")
        return warn(f"not running (no socket at {path})", start)

    async def hello() -> tuple[str | None, str | None]:
        runner = await asyncio.wait_for(RunnerClient.connect_unix(path, client="doctor"), box.timeout_s)
        await runner.close()
        return runner.runner_name, runner.runner_id

    try:
        name, runner_id = asyncio.run(hello())
    except TimeoutError:
        return fail(
            f"no answer to hello on {path} within {box.timeout_s:g}s",
            f"restart the runner; {start}",
        )
    except RunnerUnavailable as exc:
        if isinstance(exc.__cause__, PermissionError):
            return fail(*operator_problem(path))
        return fail(str(exc), start)
    except p.ProtocolError as exc:
        if exc.error.code == "forbidden":  # the socket let it in, the runner's list does not
            return fail(exc.error.message, operator_problem(path)[1])
        return fail(f"{path} does not answer as a runner ({exc})", f"restart the runner; {start}")
    except OSError as exc:  # something listens there, but not a runner that says hello
        return fail(
            f"{path} does not answer as a runner ({type(exc).__name__}: {exc})",
            f"restart the runner; {start}",
        )
    # Its database's identity: another one (a fresh runner.db) is another runner's goals to the bot.
    return ok(f"{name} answers on {path}" + (f" (database {runner_id})" if runner_id else ""))


def _another_users_home(box: Box) -> Verdict | None:
    """Doctor run by an account other than the runner's (an operator, say) cannot judge the home:
    a warning saying whose it is, instead of a misleading "not writable"."""
    home = box.settings.home
    try:
        owner = home.stat().st_uid
    except FileNotFoundError:
        return None
    except PermissionError:
        owner = None
    if owner == os.getuid():
        return None
    whose = f"user {user_name(owner)}'s" if owner is not None else "another user's"
    return warn(
        f"not checked: {home} is {whose}, and doctor runs as {_user()}",
        "run goaltender doctor as the runner's user to check the home; from this account the "
        "`runner` line says whether it reaches the runner",
    )


def _lost_database(box: Box) -> str | None:
    """What the runner said when it stopped because runner.db was lost under it, if it did."""
    try:
        said = box.settings.lost_marker.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"runner.db was lost ({box.settings.lost_marker}: {exc.strerror})"
    return said[0].lower() + said[1:] if said else f"runner.db was lost ({box.settings.lost_marker})"


# slirp4netns opens it, as the runner's user, for each goal's way out (crw-rw-rw- on stock systems).
TUN_DEVICE = Path("/dev/net/tun")
TUN_FIX = (
    f"chmod 666 {TUN_DEVICE} (some containers make it root's alone), or GOALTENDER_SANDBOX_NETWORK=none "
    "for goals that need no network (docs/deploy.md, 'When the hardening is in the way')"
)


def tun_problem() -> str | None:
    """Why this account cannot open the TUN device, if it cannot: every goal would fail at its start
    with `slirp4netns failed: open("/dev/net/tun")`. Opening it alone makes no interface."""
    try:
        os.close(os.open(TUN_DEVICE, os.O_RDWR))
    except OSError as exc:
        return f"{_user()} cannot open {TUN_DEVICE} ({exc.strerror}): every goal would fail at its start, slirp4netns needs it"
    return None


def check_sandbox(box: Box) -> Verdict:
    if box.settings.sandbox == "none":
        return warn(UNSAFE_WARNING, "install bubblewrap and unset GOALTENDER_SANDBOX")
    if problem := Sandbox(box.settings).problem():
        hint = NETWORK_HINT if NETWORK_HINT in problem else INSTALL_HINT
        return fail(problem.removesuffix(f": {hint}"), hint)
    version = _run([_tool("bwrap", box), "--version"], box) or "bwrap"
    network = box.settings.sandbox_network
    if network == "isolated":
        if problem := tun_problem():
            return fail(problem, TUN_FIX)
        slirp = (_run([_tool("slirp4netns", box), "--version"], box) or "slirp4netns").splitlines()[0]
        return ok(f"{version} makes sandboxes here; each goal's network is its own, out through {slirp}")
    if network == "none":
        return ok(f"{version} makes sandboxes here; each goal's network is its own loopback, no way out")
    return ok(f"{version} makes sandboxes here; they share the box's network, its loopback services too")


def check_limits(box: Box) -> Verdict:
    """Per-goal limits (runner/limits.py) as the running runner found them at its start (it may
    run elsewhere: a systemd service's cgroup is not this shell's), else as one started here would."""
    status = _runner_limits(box.settings)
    if status is not None:
        said = f"the runner (pid {status['pid']})"
        if status.get("on"):
            return ok(f"{said} holds each goal to {status['detail']}")
        return warn(f"{said} runs goals without limits: {status['detail']}", ENABLE_HINT)
    planned = plan(box.settings)
    if isinstance(planned, str):
        return warn(f"a runner started here would run goals without limits: {planned}", ENABLE_HINT)
    held = planned.limits.text(planned.parents)
    return ok(f"a runner started here would hold each goal to {held}, in {planned.describe()}")


def check_ssh(box: Box) -> Verdict:
    snippet = _bot_entry(box)
    check_from_bot = "then, on the bot's machine, goaltender bot --check"
    try:
        with socket.create_connection(("localhost", box.ssh_port), timeout=box.timeout_s) as conn:
            banner = conn.recv(256).decode(errors="replace").strip() or "no banner"
    except OSError as exc:
        return warn(
            f"nothing answers on localhost:{box.ssh_port} ({_reason(exc)}): a bot elsewhere cannot reach this runner",
            f"apt install openssh-server (or run the bot on this box, on the local socket); {check_from_bot}",
            snippet,
        )
    client = _run(["ssh", "-V"], box, stderr=True)
    detail = (
        f"sshd answers on localhost:{box.ssh_port} ({banner[:60]}); ssh client {client or 'not installed'}"
    )
    return ok(
        f"{detail}; the bot's entry below (its key must be in {_user()}'s authorized_keys: {check_from_bot})",
        snippet=snippet,
    )


CHECKS: dict[str, Check] = {
    "python": check_python,
    "gpu": check_gpu,
    "disk": check_disk,
    "caches": check_caches,
    "nemo-rl": check_nemo_rl,
    "nemo-rl venv": check_nemo_rl_venv,
    "nemo-gym": check_nemo_gym,
    "hub": check_hub,
    "model": check_model_endpoint,
    "runner": check_runner,
    "sandbox": check_sandbox,
    "limits": check_limits,
    "ssh": check_ssh,
}


def run_checks(box: Box, checks: Mapping[str, Check] = CHECKS) -> list[Finding]:
    """Every check, side by side (they wait on the network and on subprocesses), in table order;
    what they say passes through the runner's redactor."""
    redactor = Redactor.from_settings(box.settings, box.env)
    with ThreadPoolExecutor(max_workers=len(checks)) as pool:
        verdicts = list(pool.map(lambda check: _guarded(check, box), checks.values()))
    return [
        Finding(name, v.status, redactor.redact(v.detail), redactor.redact(v.fix), redactor.redact(v.snippet))
        for name, v in zip(checks, verdicts, strict=True)
    ]


def doctor(
    socket_path: Path | None = None, *, as_json: bool = False, ssh_port: int = 22, strict: bool = False
) -> tuple[str, int]:
    """`goaltender doctor`'s output and exit code (1 when a check fails; `strict`: or warns)."""
    try:
        settings = RunnerSettings(socket=socket_path) if socket_path else RunnerSettings()
    except Exception as exc:  # a bad GOALTENDER_* variable or config file: nothing else can be checked
        fix = "correct the GOALTENDER_* variables or the GOALTENDER_CONFIG file"
        findings = [Finding("config", "fail", _one_line(str(exc)), fix)]
    else:
        findings = run_checks(Box(settings, dict(os.environ), ssh_port=ssh_port))
    failing = ("fail", "warn") if strict else ("fail",)
    code = 1 if any(f.status in failing for f in findings) else 0
    if as_json:
        return json.dumps([asdict(f) for f in findings], indent=2) + "\n", code
    counts = {status: sum(f.status == status for f in findings) for status in ("ok", "warn", "fail")}
    tally = ", ".join(f"{n} {status}" for status, n in counts.items())
    return "".join(f.text() + "\n" for f in findings) + f"doctor: {tally}\n", code


# ---- helpers ----


def _guarded(check: Check, box: Box) -> Verdict:
    try:
        return check(box)
    except PermissionError as exc:  # doctor run by an account other than the runner's
        return fail(
            f"user {_user()} may not look at {exc.filename or 'the runner home'} ({exc.strerror})",
            "run goaltender doctor as the runner's user to check this; from another account only "
            "the `runner` line tells (whether this account is an operator)",
        )
    except Exception as exc:  # a check that cannot be made is a failed check, not a traceback
        return fail(f"the check itself failed: {type(exc).__name__}: {exc}", "report this as a bug")


def _runner_limits(settings: RunnerSettings) -> dict[str, Any] | None:
    """What the runner of this home wrote of its limits at its start, if it still runs."""
    try:
        status = json.loads(GoalCgroups(settings).status_file.read_text())
        running = isinstance(status, dict) and psutil.pid_exists(int(status["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return status if running else None


def _existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (what the runner would create it on)."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _same_filesystem(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


def _writable(path: Path) -> bool:
    """Whether a file can be made there (or where the runner would create the directory); tried,
    not inferred from modes, which say yes to root on a read-only filesystem."""
    try:
        with tempfile.TemporaryFile(dir=_existing(path)):
            return True
    except OSError:
        return False


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB") else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _counted(devices: list[Gpu]) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for gpu in devices:
        counts[gpu.name, gpu.memory_mib] = counts.get((gpu.name, gpu.memory_mib), 0) + 1
    return counts


def _goaltender_version() -> str:
    try:
        return importlib.metadata.version("goaltender")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _tool(name: str, box: Box) -> str:
    return shutil.which(name, path=box.env.get("PATH")) or name


def _run(
    argv: list[str], box: Box, *, cwd: str | None = None, timeout: float | None = None, stderr: bool = False
) -> str | None:
    """A command's first output line (stderr's with `stderr`), None when it cannot run or fails."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, cwd=cwd, env=dict(box.env), timeout=timeout or box.timeout_s
        )
    except (OSError, subprocess.SubprocessError):
        return None
    output = (done.stderr if stderr else done.stdout).strip()
    return output.splitlines()[0] if done.returncode == 0 and output else None


def _nemo_rl_dir(box: Box) -> Path | None:
    value = box.env.get("NEMO_RL_DIR")
    return Path(value).expanduser() if value else None


def _worker_venvs(box: Box) -> Path | None:
    """Where NeMo RL builds its per-worker venvs in a run: NEMO_RL_VENV_DIR as the box sets it;
    None: in the goal's own cache, where `goaltender nemo-rl` points it (training/nemo_rl.py)."""
    value = box.env.get("NEMO_RL_VENV_DIR")
    return Path(value).expanduser() if value else None


def _clone_command(box: Box) -> str:
    return f"git clone --recursive --branch {NEMO_RL_TAG} {NEMO_RL_REPO} {box.settings.home / 'nemo-rl'}"


def _gym_venv(box: Box) -> Path:
    """Where `make gym-venv` builds it (environments/star_count/gym_venv.sh), or GOALTENDER_GYM_VENV."""
    if value := box.env.get("GOALTENDER_GYM_VENV"):
        return Path(value).expanduser()
    cache = Path(box.env.get("XDG_CACHE_HOME") or box.user_home / ".cache")
    return cache / "goaltender" / f"nemo-gym-{NEMO_GYM_VERSION}-py3.12"


def _hub_token_var(box: Box) -> str | None:
    return _first_set(box.env, "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def _hub_token(box: Box) -> str:
    if var := _hub_token_var(box):
        granted = (
            "" if var in box.settings.grants else ", not granted to agents (add it to GOALTENDER_GRANTS)"
        )
        return f"{var} set (not shown){granted}"
    return "no HF_TOKEN (gated models need one)"


def _hub_cache(box: Box) -> Path:
    return box.settings.hub_cache_in(box.env)


def _first_set(env: Mapping[str, str], *names: str) -> str | None:
    return next((name for name in names if env.get(name, "").strip()), None)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect is an answer: following it would carry the Authorization header to another host.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _http_get(url: str, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    """GET `url`: (status, the start of the body). OSError when there is no answer at all."""
    opener = urllib.request.build_opener(_NoRedirects)
    request = urllib.request.Request(url, headers={"User-Agent": "goaltender-doctor", **headers})
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read(1_000_000)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(2000)
    except ValueError as exc:  # not a URL at all
        raise OSError(f"not a URL: {exc}") from exc


def _model_ids(body: bytes) -> list[str] | None:
    try:
        data = json.loads(body)["data"]
        return sorted(str(model["id"]) for model in data)
    except (ValueError, KeyError, TypeError):
        return None


def _reason(exc: OSError) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return _one_line(str(getattr(reason, "strerror", None) or reason))


def _excerpt(body: bytes) -> str:
    return _one_line(body.decode(errors="replace"))[:200] or "(empty body)"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _bot_entry(box: Box) -> str:
    """The runner entry the bot needs for this box (GOALTENDER_RUNNERS on the bot's machine)."""
    host_key = Path("/etc/ssh/ssh_host_ed25519_key.pub")
    try:
        known_hosts = " ".join(host_key.read_text().split()[:2])
    except OSError:
        known_hosts = "<this box's host key line, e.g. /etc/ssh/ssh_host_ed25519_key.pub>"
    entry = {
        "name": box.settings.name,
        "host": _host_name(),
        "port": box.ssh_port,
        "username": _user(),
        "client_key": "<the bot's private key file>",
        "known_hosts": known_hosts,
        "remote_socket": str(box.settings.socket_path),
        "mode": "attach",
    }
    forced = shlex.join(
        [_goaltender_command(), "runner", "attach", "--socket", str(box.settings.socket_path)]
    )
    return (
        f"bot side: GOALTENDER_RUNNERS='[{json.dumps(entry)}]'\n"
        f"box side, in ~{_user()}/.ssh/authorized_keys (the key can do nothing else; docs/deploy.md): "
        f'command="{forced}",restrict <the bot\'s public key line>'
    )


def _goaltender_command() -> str:
    """This install's `goaltender` as a forced command may run it (sshd's PATH is short)."""
    beside = Path(sys.executable).parent / "goaltender"
    return str(beside) if beside.exists() else shutil.which("goaltender") or "goaltender"


def _host_name() -> str:
    """How another machine may name this one (a fully qualified name if the resolver has one)."""
    name = socket.getfqdn()
    return os.uname().nodename if name.startswith("localhost") else name


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a bare container)
        return str(os.getuid())
