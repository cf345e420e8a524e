"""The command policy: allow / ask / deny for a shell command the built-in agent is about to run.

- **deny** never runs: `rm -rf /` (or home, or a top-level directory), `mkfs`, `dd` onto a device,
  shutdown/reboot, a fork bomb, and whatever the policy file's `deny` patterns match.
- **ask** goes to a person first (runner Ask, kind="command"): sudo and friends, deleting or
  writing outside the workspace, package installs, network fetches and pushes, killing processes
  the agent did not start, system configuration, `eval`, and the file's `ask` patterns.
- **allow** is everything else, and whatever the file's `allow` patterns match (an allow pattern
  overrides the built-in ask rules, never a deny).

Each simple command of the text (shell_syntax.py finds them) is looked up by name in CHECKS, a
table of small checkers, one per command family; wrappers (`sudo`, `timeout`, `bash -c`, ...)
check the command they run in turn. It is a guard against accidents, not a sandbox: a program the
agent writes can still do anything its user may do. The policy file (JSON or TOML, named by
GOALTENDER_COMMAND_POLICY, which may also hold the JSON inline) looks like:

    deny = ["docker\\s+rm"]          # regexes, searched in the whole command
    ask = ["git\\s+push"]
    allow = ["^curl\\s+-s\\s+http://localhost"]
    writable_paths = ["/scratch"]    # writing here needs no approval
    readable_paths = ["/data"]       # the file tools may read here without asking
    builtin_rules = true             # false: only the file's rules (and the deny list) apply
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from goaltender.agents.shell_syntax import (
    FORK_BOMB,
    PLACEHOLDER,
    options_and_args,
    simple_commands,
    substitutions,
    without_data,
)

Action = Literal["allow", "ask", "deny"]
_RANK: dict[Action, int] = {"allow": 0, "ask": 1, "deny": 2}
_MAX_DEPTH = 5  # nested shells and substitutions deeper than this are not followed


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str = ""


@dataclass
class CommandPolicy:
    allow: list[str] = field(default_factory=list)
    ask: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    writable_paths: list[str] = field(default_factory=list)
    readable_paths: list[str] = field(default_factory=list)
    builtin_rules: bool = True

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommandPolicy:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(
                f"unknown command-policy keys: {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
            )
        policy = cls(**data)
        for pattern in [*policy.allow, *policy.ask, *policy.deny]:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad command-policy pattern {pattern!r}: {exc}") from exc
        return policy

    @classmethod
    def load(cls, spec: str | None, home: Path | None = None) -> CommandPolicy:
        """`spec`: inline JSON, or the path of a .json / .toml file. Without one, a
        command-policy.toml / .json in `home` (GOALTENDER_HOME) if present, else the defaults."""
        if spec is None and home is not None:
            for name in ("command-policy.toml", "command-policy.json"):
                if (home / name).is_file():
                    spec = str(home / name)
                    break
        if not spec or not spec.strip():
            return cls()
        spec = spec.strip()
        if spec.startswith("{"):
            return cls.from_dict(json.loads(spec))
        path = Path(spec).expanduser()
        text = path.read_text()
        return cls.from_dict(tomllib.loads(text) if path.suffix == ".toml" else json.loads(text))


def classify_command(
    command: str,
    workspace: str | Path,
    policy: CommandPolicy | None = None,
    is_own_pid: Callable[[int], bool] = lambda pid: False,
) -> Verdict:
    """allow / ask / deny for a shell command about to run in `workspace`, with the reason."""
    policy = policy or CommandPolicy()
    command = command.strip()
    if not command:
        return Verdict("allow")
    for pattern in policy.deny:
        if re.search(pattern, command):
            return Verdict("deny", f"matches the policy's deny rule {pattern!r}")
    ws = os.path.normpath(str(workspace))
    writable = [ws, *(os.path.normpath(os.path.expanduser(w)) for w in policy.writable_paths)]
    scan = Scan(writable=writable, is_own_pid=is_own_pid, base=ws)
    scan.text(command)
    builtin = _worst(scan.verdicts)
    if builtin.action == "deny":
        return builtin
    for pattern in policy.ask:
        if re.search(pattern, command):
            return Verdict("ask", f"matches the policy's ask rule {pattern!r}")
    for pattern in policy.allow:
        if re.search(pattern, command):
            return Verdict("allow", f"matches the policy's allow rule {pattern!r}")
    return builtin if policy.builtin_rules else Verdict("allow")


def _worst(verdicts: list[Verdict]) -> Verdict:
    """The most severe action found, with every reason given for it."""
    if not verdicts:
        return Verdict("allow")
    action = max((v.action for v in verdicts), key=_RANK.__getitem__)
    reasons = dict.fromkeys(v.reason for v in verdicts if v.action == action and v.reason)
    return Verdict(action, "; ".join(reasons))


# ---- walking the command line ----

# Words that only shape how the real command runs: skipped to find it.
_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "case", "esac", "!", "{", "}", "time"}  # fmt: skip
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_DEVICES_OK = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/zero", "/dev/fd/", "/dev/shm/")


@dataclass
class Scan:
    """One command line being checked: where relative paths point, and the verdicts so far."""

    writable: list[str]
    is_own_pid: Callable[[int], bool]
    base: str | None  # the directory relative paths resolve against (None: unknown after `cd $X`)
    verdicts: list[Verdict] = field(default_factory=list)
    depth: int = 0

    def ask(self, reason: str) -> None:
        self.verdicts.append(Verdict("ask", reason))

    def deny(self, reason: str) -> None:
        self.verdicts.append(Verdict("deny", reason))

    def text(self, text: str) -> None:
        """Check shell text: its command substitutions, then each simple command in turn."""
        if self.depth > _MAX_DEPTH:
            self.ask("commands nested too deeply to check")
            return
        if FORK_BOMB.search(text):
            self.deny("a fork bomb")
            return
        text = without_data(text)
        for inner in substitutions(text):
            self.nested(inner)
        try:
            commands = simple_commands(text)
        except ValueError as exc:
            self.ask(f"could not parse the command ({exc})")
            return
        for command in commands:
            self.command(command.words, command.writes_to)

    def nested(self, text: str) -> None:
        """Check text another shell runs: its `cd` does not move this one."""
        Scan(self.writable, self.is_own_pid, self.base, self.verdicts, self.depth + 1).text(text)

    def command(self, words: list[str], writes_to: Iterable[str] = ()) -> None:
        """Check one simple command: its output redirections, then its checker, found by name."""
        for target in writes_to:
            if (where := self.outside(target)) is not None:
                self.ask(f"writes outside the workspace ({where})")
        while words and (words[0] in _KEYWORDS or _ASSIGNMENT.match(words[0])):
            words = words[1:]
        if not words or words[0] in ("for", "select"):
            return  # `for x in a b c` names values, not a command; the loop body comes after `do`
        name = os.path.basename(words[0].lstrip("\\"))
        if check := CHECKS.get(_family_name(name)):
            check(self, name, words[1:])

    def resolve(self, word: str) -> str | None:
        """The absolute path a word names, or None when it cannot be known (variables, `cd $X`)."""
        if "$" in word or PLACEHOLDER in word or "`" in word:
            return None
        if word.startswith("~"):
            word = os.path.expanduser(word)
            if word.startswith("~"):
                return None
        if not os.path.isabs(word):
            if self.base is None:
                return None
            word = os.path.join(self.base, word)
        return os.path.normpath(word)

    def outside(self, word: str) -> str | None:
        """The path `word` names when it is outside the writable roots (or unknowable), else None."""
        if word.startswith(_DEVICES_OK) or word in ("/dev/null", "-"):
            return None
        path = self.resolve(word)
        if path is None:
            return word
        return None if _under(path, self.writable) else path

    def check_writes(self, words: Iterable[str], what: str) -> None:
        """Ask about each word naming a path outside the workspace: "<what> (<path>)"."""
        for word in words:
            if (where := self.outside(word)) is not None:
                self.ask(f"{what} ({where})")


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _family_name(name: str) -> str:
    """The name CHECKS knows a command by: `python3.11` is `python`, `mkfs.ext4` is `mkfs`."""
    if re.fullmatch(r"python[\d.]*", name):
        return "python"
    return "mkfs" if name.startswith("mkfs.") else name


# ---- the checkers: one per command family ----

Checker = Callable[[Scan, str, list[str]], None]

# name: (options that take a value, positional words before the command)
_WRAPPERS: dict[str, tuple[set[str], int]] = {
    "env": ({"-u", "--unset", "-C", "--chdir"}, 0),
    "nohup": (set(), 0),
    "nice": ({"-n", "--adjustment"}, 0),
    "ionice": ({"-c", "-n", "--class", "--classdata"}, 0),
    "timeout": ({"-s", "-k", "--signal", "--kill-after"}, 1),
    "stdbuf": ({"-i", "-o", "-e"}, 0),
    "taskset": (set(), 1),
    "exec": ({"-a"}, 0),
    "command": (set(), 0),
    "builtin": (set(), 0),
    "setsid": (set(), 0),
    "unbuffer": (set(), 0),
    "watch": ({"-n", "--interval"}, 0),
    "xargs": ({"-n", "-I", "-i", "-d", "-P", "-L", "-s", "-a", "-E", "--max-args", "--max-procs"}, 0),
}
_DELETE = {"rm", "rmdir", "unlink", "shred", "srm"}
_KILL_BY_NAME = {"pkill", "killall", "killall5", "skill", "slay"}


def _wrapped(name: str, args: list[str]) -> list[str]:
    """The command a wrapper runs: its words after the wrapper's options (and positionals)."""
    with_value, positional_before = _WRAPPERS[name]
    rest = list(args)
    while rest and (rest[0].startswith("-") or (name == "env" and _ASSIGNMENT.match(rest[0]))):
        option = rest.pop(0)
        if option in with_value and rest:
            rest.pop(0)
    return rest[positional_before:]


def run_wrapped(scan: Scan, name: str, args: list[str]) -> None:
    """env, nohup, timeout, ...: the command they run is what counts."""
    if rest := _wrapped(name, args):
        scan.command(rest)


def xargs(scan: Scan, name: str, args: list[str]) -> None:
    """xargs runs its command on names read from its input: deleting or killing those is unknowable."""
    rest = _wrapped(name, args)
    if rest and os.path.basename(rest[0]) in _DELETE | _KILL_BY_NAME | {"kill"}:
        scan.ask(f"xargs {rest[0]}: acts on names read from its input, which cannot be checked")
    if rest:
        scan.command(rest)


def run_as_other_user(scan: Scan, name: str, args: list[str]) -> None:
    """sudo, su, doas, ...: always asked; the command they run is checked too (su takes none)."""
    scan.ask(f"runs as another user ({name})")
    _, rest = options_and_args(args, {"-u", "-g", "-C", "-p", "-c"})
    if name != "su" and rest:
        scan.command(rest)


def nested_shell(scan: Scan, name: str, args: list[str]) -> None:
    """bash -c '...' is checked as shell text; a script is fine inside the workspace only."""
    if "-c" in args and args.index("-c") + 1 < len(args):
        scan.nested(args[args.index("-c") + 1])
    elif args:
        script = scan.resolve(args[0])
        if script is None or not _under(script, scan.writable):
            scan.ask(f"runs a script from outside the workspace ({args[0]})")


def evaluate(scan: Scan, name: str, args: list[str]) -> None:
    """eval builds its command at run time."""
    scan.ask("eval: what it runs cannot be checked before it runs")


def change_directory(scan: Scan, name: str, args: list[str]) -> None:
    """cd moves where the later relative paths of this command line point."""
    target = args[0] if args else "~"
    scan.base = None if target == "-" else scan.resolve(target)


def python_module(scan: Scan, name: str, args: list[str]) -> None:
    """python -m pip / huggingface_hub: checked as pip / huggingface-cli."""
    if len(args) < 2 or args[0] != "-m":
        return
    module = args[1]
    if module in ("pip", "pip3") or module.startswith("pip."):
        scan.command(["pip", *args[2:]])
    elif module in ("huggingface_hub.commands.huggingface_cli", "huggingface_hub"):
        scan.command(["huggingface-cli", *args[2:]])


_UV_INSTALLS = {"add", "remove", "sync", "tool", "python"}


def uv(scan: Scan, name: str, args: list[str]) -> None:
    """uv run checks the command it runs; uv add / sync / pip install change packages."""
    _, positional = options_and_args(args)
    first = positional[0] if positional else ""
    if first == "run":
        _, inner = options_and_args(positional[1:], {"--with", "--python", "-p", "--project", "--directory"})
        if inner:
            scan.command(inner)
    elif first == "pip" and positional[1:2] and positional[1] in {"install", "uninstall", "sync"}:
        scan.ask(f"installs or removes packages (uv pip {positional[1]})")
    elif first in _UV_INSTALLS:
        scan.ask(f"installs or removes packages (uv {first})")


def take_machine_down(scan: Scan, name: str, args: list[str]) -> None:
    """shutdown, reboot, halt, poweroff."""
    scan.deny(f"{name} would take the machine down")


def change_runlevel(scan: Scan, name: str, args: list[str]) -> None:
    """init 0 / init 6 halt or reboot."""
    if args[:1] in (["0"], ["6"]):
        take_machine_down(scan, name, args)


def wipe_disk(scan: Scan, name: str, args: list[str]) -> None:
    """mkfs, fdisk, parted, ..."""
    scan.deny(f"{name} formats or repartitions disks")


def write_with_dd(scan: Scan, name: str, args: list[str]) -> None:
    """dd of=<device> is denied; of=<file outside the workspace> is asked."""
    for arg in args:
        if not arg.startswith("of="):
            continue
        target = arg[3:]
        if target.startswith("/dev/") and not target.startswith(_DEVICES_OK):
            scan.deny(f"dd onto a device ({target})")
        else:
            scan.check_writes([target], "writes outside the workspace")


# name: subcommands that install/remove (None: every use)
_INSTALLS: dict[str, set[str] | None] = {
    "pip": {"install", "uninstall", "download"},
    "pip3": {"install", "uninstall", "download"},
    "pipx": {"install", "uninstall", "run", "inject", "upgrade"},
    "apt": {"install", "remove", "purge", "upgrade", "full-upgrade", "dist-upgrade", "autoremove", "update"},
    "apt-get": {"install", "remove", "purge", "upgrade", "dist-upgrade", "autoremove", "update", "build-dep"},
    "aptitude": {"install", "remove", "purge", "upgrade", "update"},
    "yum": {"install", "remove", "erase", "update", "upgrade", "reinstall"},
    "dnf": {"install", "remove", "erase", "update", "upgrade", "reinstall"},
    "zypper": {"install", "in", "remove", "rm", "update", "up"},
    "apk": {"add", "del", "upgrade", "update"},
    "brew": {"install", "uninstall", "upgrade", "reinstall", "tap"},
    "snap": {"install", "remove", "refresh"},
    "pacman": None,
    "dpkg": {"-i", "--install", "-r", "--remove", "-P", "--purge"},
    "rpm": {"-i", "-U", "-e", "--install", "--upgrade", "--erase"},
    "npm": {"install", "i", "ci", "add", "uninstall", "remove", "rm", "update", "upgrade", "exec"},
    "pnpm": {"install", "i", "add", "remove", "rm", "update", "up", "dlx"},
    "yarn": {"install", "add", "remove", "upgrade", "dlx"},
    "bun": {"install", "i", "add", "remove", "update", "x"},
    "npx": None,
    "bunx": None,
    "uvx": None,
    "conda": {"install", "create", "remove", "uninstall", "update", "upgrade", "env"},
    "mamba": {"install", "create", "remove", "uninstall", "update", "upgrade", "env"},
    "micromamba": {"install", "create", "remove", "uninstall", "update", "upgrade", "env"},
    "poetry": {"add", "install", "remove", "update", "self"},
    "pdm": {"add", "install", "remove", "update", "sync"},
    "cargo": {"install", "uninstall"},
    "go": {"install", "get"},
    "gem": {"install", "uninstall", "update"},
}


def install_packages(scan: Scan, name: str, args: list[str]) -> None:
    """Package managers: their install / remove / update subcommands (or options) are asked."""
    subcommands = _INSTALLS[name]
    _, positional = options_and_args(args)
    first = positional[0] if positional else ""
    if subcommands is None:
        scan.ask(f"installs or fetches packages ({name})")
    elif first in subcommands or any(a in subcommands for a in args if a.startswith("-")):
        scan.ask(f"installs or removes packages ({name} {first or args[0]})".rstrip())


_NETWORK_ALWAYS = {
    "curl", "wget", "aria2c", "axel", "scp", "sftp", "ssh", "nc", "ncat", "netcat", "telnet",
    "ftp", "lftp", "gsutil", "gcloud", "aws", "az", "s3cmd", "rclone", "kaggle", "modelscope",
}  # fmt: skip
_NETWORK_SUBCOMMANDS = {
    "git": {"clone", "fetch", "pull", "push", "ls-remote", "submodule", "remote"},
    "huggingface-cli": {
        "download",
        "upload",
        "login",
        "repo",
        "lfs-enable-largefiles",
        "upload-large-folder",
    },
    "hf": {"download", "upload", "auth", "repo", "upload-large-folder", "jobs"},
    "docker": {"pull", "push", "run", "build", "login", "compose"},
    "podman": {"pull", "push", "run", "build", "login"},
    "ollama": {"pull", "push", "run"},
    "wandb": {"sync", "login", "artifact"},
}
_REMOTE = re.compile(r"^[\w.@-]+:")  # host:path


def use_network(scan: Scan, name: str, args: list[str]) -> None:
    """curl, wget, ssh, cloud CLIs: every use goes over the network."""
    scan.ask(f"uses the network ({name})")


def use_network_subcommand(scan: Scan, name: str, args: list[str]) -> None:
    """git clone / push, hf download, docker pull, ...: only these subcommands use the network."""
    _, positional = options_and_args(args, {"-C", "-c"})
    if positional and positional[0] in _NETWORK_SUBCOMMANDS[name]:
        scan.ask(f"uses the network ({name} {positional[0]})")


def rsync(scan: Scan, name: str, args: list[str]) -> None:
    """rsync to or from another host uses the network; its local target may be outside."""
    _, positional = options_and_args(args)
    if any(_REMOTE.match(a) or a.startswith("rsync://") for a in positional):
        scan.ask("uses the network (rsync to or from another host)")
    write_last_arg(scan, name, args)


def kill(scan: Scan, name: str, args: list[str]) -> None:
    """kill is fine for the agent's own processes and jobs; any other target is asked."""
    if "-l" in args or "-L" in args:
        return
    _, targets = options_and_args(args, {"-s", "-n"})
    for target in targets:
        if target.startswith("%") or target in ("$!", "${!}"):
            continue  # a job of this same shell
        if target.lstrip("-").isdigit():
            pid = int(target)
            if pid <= 0 or not scan.is_own_pid(pid):
                scan.ask(f"kill {target}: not a process this agent started")
        else:
            scan.ask(f"kill {target}: which process cannot be checked before it runs")


def kill_by_name(scan: Scan, name: str, args: list[str]) -> None:
    """pkill, killall: a name may match processes the agent did not start."""
    scan.ask(f"{name} kills processes by name, which may hit processes the agent did not start")


_SYSTEM = {
    "systemctl", "service", "crontab", "mount", "umount", "chroot", "iptables", "nft", "ufw",
    "useradd", "userdel", "usermod", "groupadd", "passwd", "chpasswd", "visudo", "modprobe",
    "insmod", "rmmod", "sysctl", "swapoff", "swapon", "nvidia-smi-reset",
}  # fmt: skip


def configure_system(scan: Scan, name: str, args: list[str]) -> None:
    """systemctl, mount, iptables, useradd, sysctl, ..."""
    scan.ask(f"changes system configuration ({name})")


def delete(scan: Scan, name: str, args: list[str]) -> None:
    """rm and friends: recursive deletes of / , top-level directories or home are denied; deletes
    outside the workspace are asked."""
    options, positional = options_and_args(args)
    recursive = any(
        o in ("-r", "-R", "--recursive") or (not o.startswith("--") and "r" in o.lower()) for o in options
    )
    home = os.path.normpath(os.path.expanduser("~"))
    for arg in positional:
        path = scan.resolve(arg)
        if recursive and path is not None and (path.count("/") <= 1 or path in (home, home + "/*")):
            scan.deny(f"recursive delete of {path}")
        elif recursive and arg.rstrip("/") in ("~", "$HOME", "${HOME}", "/*", "~/*"):
            scan.deny(f"recursive delete of {arg}")
        else:
            scan.check_writes([arg], "deletes outside the workspace")


def find(scan: Scan, name: str, args: list[str]) -> None:
    """find -delete, or -exec rm / mv / chmod, is asked when it starts outside the workspace."""
    runs = {args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-exec", "-execdir", "-ok")}
    changes = "-delete" in args or any(
        os.path.basename(r) in _DELETE | {"mv", "chmod", "chown"} for r in runs
    )
    if not changes:
        return
    starts = []
    for arg in args:
        if arg.startswith(("-", "(", "!")):
            break
        starts.append(arg)
    scan.check_writes(starts or ["."], "find deletes or changes files outside the workspace")


_WRITE_OPTIONS = {"-t", "--target-directory", "-s", "--size", "-m", "--mode", "-o", "-g", "-e"}


def write_every_arg(scan: Scan, name: str, args: list[str]) -> None:
    """touch, mkdir, tee, truncate, mv: every path they are given is written."""
    _, positional = options_and_args(args, _WRITE_OPTIONS)
    scan.check_writes(positional, f"{name} writes outside the workspace")


def write_last_arg(scan: Scan, name: str, args: list[str]) -> None:
    """cp, ln, install, rsync: the target (-t, or the last path) is written."""
    options, positional = options_and_args(args, _WRITE_OPTIONS)
    targets = [options[i + 1] for i, o in enumerate(options[:-1]) if o in ("-t", "--target-directory")]
    targets = targets or positional[-1:]
    if name == "rsync":
        targets = [a for a in targets if not _REMOTE.match(a)]
    scan.check_writes(targets, f"{name} writes outside the workspace")


def change_mode(scan: Scan, name: str, args: list[str]) -> None:
    """chmod, chown, chgrp: the paths after the mode or owner are changed."""
    _, positional = options_and_args(args, _WRITE_OPTIONS)
    scan.check_writes(positional[1:], f"{name} writes outside the workspace")


def edit_in_place(scan: Scan, name: str, args: list[str]) -> None:
    """sed -i, perl -i: the files they edit."""
    if not any(a.startswith("-i") or a == "--in-place" for a in args):
        return
    options, positional = options_and_args(args, {"-e", "-f"})
    files = positional if ("-e" in options or "-f" in options) else positional[1:]
    scan.check_writes(files, f"{name} -i edits a file outside the workspace")


def extract(scan: Scan, name: str, args: list[str]) -> None:
    """tar -C, unzip -d: where the archive is extracted."""
    flags = ("-C", "--directory") if name == "tar" else ("-d",)
    targets = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in flags]
    scan.check_writes(targets, f"{name} extracts outside the workspace")


_FAMILIES: list[tuple[Iterable[str], Checker]] = [
    (set(_WRAPPERS) - {"xargs"}, run_wrapped),
    ({"xargs"}, xargs),
    ({"sudo", "su", "doas", "pkexec", "runuser"}, run_as_other_user),
    ({"sh", "bash", "zsh", "dash", "ksh"}, nested_shell),
    ({"eval"}, evaluate),
    ({"cd"}, change_directory),
    ({"python"}, python_module),
    ({"uv"}, uv),
    ({"shutdown", "reboot", "halt", "poweroff"}, take_machine_down),
    ({"init", "telinit"}, change_runlevel),
    ({"mkfs", "fdisk", "sfdisk", "parted", "wipefs", "mkswap"}, wipe_disk),
    ({"dd"}, write_with_dd),
    (_INSTALLS, install_packages),
    (_NETWORK_ALWAYS, use_network),
    (_NETWORK_SUBCOMMANDS, use_network_subcommand),
    ({"rsync"}, rsync),
    ({"kill"}, kill),
    (_KILL_BY_NAME, kill_by_name),
    (_SYSTEM, configure_system),
    (_DELETE, delete),
    ({"find"}, find),
    ({"touch", "mkdir", "tee", "truncate", "mv"}, write_every_arg),
    ({"cp", "ln", "install"}, write_last_arg),
    ({"chmod", "chown", "chgrp"}, change_mode),
    ({"sed", "perl"}, edit_in_place),
    ({"tar", "unzip"}, extract),
]
# Command name -> its checker. Commands without one are allowed.
CHECKS: dict[str, Checker] = {name: check for names, check in _FAMILIES for name in names}
