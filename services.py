"""The runner and the bot as systemd services: their units, written from the templates in
deploy/systemd/ with this box's paths, and the environment files beside them
(`goaltender service install`, `goaltender service show`).

A unit names the venv's own `goaltender` (so a service runs the code this command came from), the
user it runs as, and GOALTENDER_HOME. The templates' `#system: ` lines are kept for a system
service and dropped for a user one: a user's systemd cannot make the mount namespaces they ask
for without a user namespace of its own, which the runner's sandboxes would not survive.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import goaltender

DEPLOY = Path(goaltender.__file__).parent / "deploy"
SERVICES = ("runner", "bot")
ENV_FILES = {"goaltender.env": "goaltender.env.example", "bot.env": "bot.env.example"}
SYSTEM_ONLY = "#system: "
# What a unit file reads as itself: systemd expands %, $ and \ and splits words at spaces.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./+@:,=~-]+")
# A system unit's PrivateTmp=yes gives the service a /tmp and /var/tmp of its own, empty.
PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))


class ServiceError(Exception):
    """The units cannot be written as asked; the message says why, in one line."""


@dataclass(frozen=True)
class Layout:
    """Where and as whom the services run."""

    user_mode: bool  # a user service (systemctl --user), else a system one
    account: str  # the user the services run as
    group: str
    home: Path  # GOALTENDER_HOME
    executable: Path  # the venv's goaltender
    unit_dir: Path
    env_dir: Path

    @classmethod
    def choose(
        cls,
        *,
        user_mode: bool,
        account: str | None = None,
        home: Path | None = None,
        unit_dir: Path | None = None,
        env_dir: Path | None = None,
    ) -> Layout:
        """The layout asked for, its defaults filled in: the services run as `account` (default:
        whoever ran sudo, else this user), with GOALTENDER_HOME under that user's home."""
        if user_mode and account not in (None, _me()):
            raise ServiceError("a user service runs as its own user: --as is for system services")
        account = account or (None if user_mode else os.environ.get("SUDO_USER")) or _me()
        try:
            entry = pwd.getpwnam(account)
        except KeyError:
            raise ServiceError(f"no user {account!r} on this machine (--as)") from None
        config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        layout = cls(
            user_mode=user_mode,
            account=account,
            group=grp.getgrgid(entry.pw_gid).gr_name,
            home=Path(os.path.abspath(home or Path(entry.pw_dir) / ".goaltender")),
            executable=goaltender_executable(),
            unit_dir=unit_dir or (config / "systemd" / "user" if user_mode else Path("/etc/systemd/system")),
            env_dir=env_dir or (config / "goaltender" if user_mode else Path("/etc/goaltender")),
        )
        for what, path in (("the home", layout.home), ("goaltender", layout.executable),
                           ("the environment files' folder", layout.env_dir)):  # fmt: skip
            if not _PLAIN_PATH.fullmatch(str(path)):
                raise ServiceError(
                    f"{what} is {str(path)!r}, which a unit file would not read as written (spaces, quotes, "
                    "%, $ or \\): choose a path without them"
                )
        return layout

    def unit(self, service: str) -> str:
        """The unit file of `service` ("runner" or "bot") for this layout."""
        template = (DEPLOY / "systemd" / unit_name(service)).read_text()
        words = {
            "@USER@": self.account,
            "@GROUP@": self.group,
            "@HOME@": str(self.home),
            "@ENV_DIR@": str(self.env_dir),
            "@EXECUTABLE@": str(self.executable),
            "@WANTED_BY@": "default.target" if self.user_mode else "multi-user.target",
        }
        lines = []
        for line in template.splitlines():
            if line.startswith(SYSTEM_ONLY):
                if self.user_mode:
                    continue
                line = line.removeprefix(SYSTEM_ONLY)
            for word, value in words.items():
                line = line.replace(word, value)
            lines.append(line)
        text = "\n".join(lines) + "\n"
        left = re.findall(r"@[A-Z_]+@", text)
        assert not left, f"{unit_name(service)}: the template names {left}, which nothing fills in"
        return text


def unit_name(service: str) -> str:
    return f"goaltender-{service}.service"


def goaltender_executable() -> Path:
    """This venv's `goaltender` (not resolved: the venv's python is a link out of it)."""
    beside = Path(sys.executable).parent / "goaltender"
    if beside.is_file() and os.access(beside, os.X_OK):
        return Path(os.path.abspath(beside))
    found = shutil.which("goaltender")
    if found is None:
        raise ServiceError(
            f"no goaltender executable beside {sys.executable} or on PATH: install the package"
        )
    return Path(os.path.abspath(found))


def _me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def install(layout: Layout) -> list[str]:
    """Write both units, the environment files that are missing (from the examples, 0600) and the
    home; reload systemd where it runs. What was done, one line each, then what to run next."""
    said = hidden_by_private_tmp(layout)
    for directory in (layout.unit_dir, layout.env_dir):
        _make_directory(directory)
    for service in SERVICES:
        path = layout.unit_dir / unit_name(service)
        _write(path, layout.unit(service), 0o644)
        said.append(f"wrote {path}")
    for name, example in ENV_FILES.items():
        path = layout.env_dir / name
        if path.exists():
            said.append(f"kept {path} (it exists)")
            continue
        _write(path, (DEPLOY / example).read_text(), 0o600)
        said.append(f"wrote {path} from deploy/{example}: edit it")
    said.append(_make_home(layout))
    said.append(_reload(layout))
    said += next_steps(layout)
    return said


def hidden_by_private_tmp(layout: Layout) -> list[str]:
    """A warning for each path a system service needs that its private /tmp and /var/tmp would
    hide: the service would not find its program (status=203/EXEC) or would lose its home."""
    if layout.user_mode:
        return []
    code = Path(goaltender.__file__).resolve().parent  # an editable install's checkout
    needed = (("goaltender", layout.executable), ("its code", code), ("the home", layout.home))
    return [
        f"warning: {what} is {path}, under {tmp}, which the service will not see (PrivateTmp=yes "
        f"gives it a {tmp} of its own): install and keep the home elsewhere, e.g. /opt/goaltender, /srv"
        for what, path in needed
        for tmp in PRIVATE_TMP
        if path.is_relative_to(tmp)
    ]


def next_steps(layout: Layout) -> list[str]:
    ctl = "systemctl --user" if layout.user_mode else "sudo systemctl"
    journal = "journalctl --user" if layout.user_mode else "journalctl"
    steps = [
        "next:",
        f"  {ctl} enable --now {unit_name('runner')}   # on the GPU box",
        f"  {ctl} enable --now {unit_name('bot')}      # where the bot runs (tokens in {layout.env_dir}/bot.env)",
        f"  {ctl} status goaltender-runner goaltender-bot",
        f"  {journal} -u goaltender-runner -u goaltender-bot -f",
    ]
    if layout.user_mode:
        steps.append(f"  sudo loginctl enable-linger {layout.account}   # run them without a login session")
    return steps


def _make_directory(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServiceError(_cannot_write(path, exc)) from None


def _write(path: Path, text: str, mode: int) -> None:
    try:
        temporary = path.with_name(f".{path.name}.new")
        temporary.write_text(text)
        temporary.chmod(mode)
        temporary.replace(path)
    except OSError as exc:
        raise ServiceError(_cannot_write(path, exc)) from None


def _cannot_write(path: Path, exc: OSError) -> str:
    hint = " (a system service: run it with sudo, or add --user for a user service)" if os.getuid() else ""
    return f"cannot write {path}: {exc.strerror or exc}{hint}"


def _make_home(layout: Layout) -> str:
    """The home, made now (the bot's unit may write only there, so it must exist), its user's."""
    if layout.home.is_dir():
        return f"kept {layout.home} (GOALTENDER_HOME; it exists)"
    _make_directory(layout.home)
    layout.home.chmod(0o700)
    entry = pwd.getpwnam(layout.account)
    if os.getuid() == 0 and entry.pw_uid != 0:
        os.chown(layout.home, entry.pw_uid, entry.pw_gid)
    return f"made {layout.home} (GOALTENDER_HOME, {layout.account}'s)"


def _reload(layout: Layout) -> str:
    command = ["systemctl", *(["--user"] if layout.user_mode else []), "daemon-reload"]
    if not Path("/run/systemd/system").is_dir():  # sd_booted(3)'s test
        return f"systemd is not running here: run `{' '.join(command)}` where it is"
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise ServiceError(f"`{' '.join(command)}` failed: {why[0]}")
    return f"ran `{' '.join(command)}`"
