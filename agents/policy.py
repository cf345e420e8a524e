"""The command policy: allow / ask / deny for a shell command the built-in agent is about to run.

- **deny** never runs: `rm -rf /` (or home, or a top-level directory), `mkfs`, `dd` onto a device,
  shutdown/reboot, a fork bomb, the runner's control verbs (`goaltender approve`, `reject`,
  `steer`, `budget`, `stop`, `pause`, `resume`, `submit`, `audit`: people decide those, and the
  goal's socket refuses them anyway), setting the runner's own variables (GOALTENDER_SOCKET,
  GOALTENDER_GOAL_ID, ...) or `goaltender --socket`, pointing a cache variable outside the workspace
  and the goal's caches (the sandbox binds nothing by them; the attempt is refused all the same),
  and whatever the policy file's `deny` patterns match.
- **ask** goes to a person first (runner Ask, kind="command"): sudo and friends, deleting or
  writing outside the workspace, package installs, network fetches and pushes, killing processes
  the agent did not start, system configuration, and the file's `ask` patterns; and whatever it
  cannot tell before it runs: `eval`, a shell reading commands from its input (`... | sh`,
  `bash -s`, a heredoc), a command named by a variable (`$c`, `$'...'`). (Not `goaltender fetch`:
  the runner downloads from the box's hub into the shared cache, and records it.)
- **allow** is everything else, and whatever the file's `allow` patterns match (an allow pattern
  overrides the built-in ask rules, never a deny).

Each simple command of the text (shell_words.py finds them, with those in `$(...)`, backticks and
`<(...)`) is looked up by name in CHECKS, a table of small checkers, one per command family;
wrappers (`timeout`, `sudo`, `bash -lc`, `env -S`, `flock`, `find -exec`, ...) check the command
they run in turn. It is a guard against accidents, not a sandbox: a program the
agent writes can still do anything its user may do. The policy file (JSON or TOML, named by
GOALTENDER_COMMAND_POLICY, which may also hold the JSON inline) looks like:

    deny = ["docker\\s+rm"]          # regexes, searched in the whole command
    ask = ["git\\s+push"]
    allow = ["^curl\\s+-s\\s+http://localhost"]
    writable_paths = ["/scratch"]    # writing here needs no approval
    readable_paths = ["/data"]       # the file tools may read here without asking
    builtin_rules = true             # false: only the file's rules (and the deny list) apply

One module past 600 lines on purpose: CHECKS and its checkers are one table, and the walker and the
checkers call each other (a wrapper's checker walks the command it runs; `bash -c` walks a whole
text), so apart they would import each other. Each checker is a few lines and reads on its own.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from goaltender.agents.shell_words import (
    FORK_BOMB,
    SUBSTITUTED,
    options_and_args,
    simple_commands,
    substitutions,
    without_data,
)

Action = Literal["allow", "ask", "deny"]
_RANK: dict[Action, int] = {"allow": 0, "ask": 1, "deny": 2}
_MAX_DEPTH = 5  # shells in shells in substitutions ... deeper than this are not followed


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
        if unknown := set(data) - known:
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
            spec = next(
                (
                    str(home / n)
                    for n in ("command-policy.toml", "command-policy.json")
                    if (home / n).is_file()
                ),
                None,
            )
        if not spec or not spec.strip():
            return cls()
        spec = spec.strip()
        if spec.startswith("{"):
            return cls.from_dict(json.loads(spec))
        path = Path(spec).expanduser()
        text = path.read_text()
        return cls.from_dict(tomllib.loads(text) if path.suffix == ".toml" else json.loads(text))


DEFAULT_POLICY = CommandPolicy()


def classify_command(
    command: str,
    workspace: str | Path,
    policy: CommandPolicy = DEFAULT_POLICY,
    is_own_pid: Callable[[int], bool] = lambda pid: False,
) -> Verdict:
    """allow / ask / deny for a shell command about to run in `workspace`, with the reason."""
    command = command.strip()
    if not command:
        return Verdict("allow")
    for pattern in policy.deny:
        if re.search(pattern, command):
            return Verdict("deny", f"matches the policy's deny rule {pattern!r}")
    ws = os.path.normpath(str(workspace))
    scope = Scope(
        writable=[ws, *(os.path.normpath(os.path.expanduser(w)) for w in policy.writable_paths)],
        is_own_pid=is_own_pid,
        base=ws,
    )
    check_text(command, scope)
    builtin = _worst(scope.verdicts)
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
    """The strictest action, with every reason given for it (in order, once each)."""
    if not verdicts:
        return Verdict("allow")
    action = max((v.action for v in verdicts), key=_RANK.__getitem__)
    reasons = dict.fromkeys(v.reason for v in verdicts if v.action == action and v.reason)
    return Verdict(action, "; ".join(reasons))


# ---- walking the text ----


@dataclass
class Scope:
    """Where the commands run and what they may write; the verdicts found so far."""

    writable: list[str]
    is_own_pid: Callable[[int], bool]
    base: str | None  # the directory relative paths resolve against (None: unknown after `cd $X`)
    verdicts: list[Verdict] = field(default_factory=list)
    pushed: tuple[str | None, ...] = ()  # pushd's stack: where popd goes back to
    depth: int = 0

    def ask(self, reason: str) -> None:
        self.verdicts.append(Verdict("ask", reason))

    def deny(self, reason: str) -> None:
        self.verdicts.append(Verdict("deny", reason))

    def nested(self) -> Scope:
        """A scope for commands run by a command (same verdicts; a `cd` in there stays there)."""
        return replace(self, depth=self.depth + 1)

    def outside(self, word: str) -> str | None:
        """The path `word` names when it is outside the writable roots (or unknowable), else None."""
        if word.startswith(HARMLESS_DEVICES) or word == "-":
            return None
        path = resolve(word, self.base)
        if path is None:
            return word
        return None if under(path, self.writable) else path

    def ask_if_outside(self, words: Iterable[str], what: str) -> None:
        """Ask, saying `what (path)`, for each word naming a path outside the writable roots."""
        for word in words:
            if (where := self.outside(word)) is not None:
                self.ask(f"{what} ({where})")


def check_text(text: str, scope: Scope) -> None:
    if scope.depth > _MAX_DEPTH:
        scope.ask("commands nested too deeply to check")
        return
    if FORK_BOMB.search(text):
        scope.deny("a fork bomb")
        return
    text = without_data(text)
    for inner in substitutions(text):
        check_text(inner, scope.nested())
    try:
        commands = simple_commands(text)
    except ValueError as exc:
        scope.ask(f"could not parse the command ({exc})")
        return
    for command in commands:
        scope.ask_if_outside(command.writes_to, "writes outside the workspace")
        check_words(command.words, scope)


def check_words(words: list[str], scope: Scope) -> None:
    """One simple command: its name picks the checker."""
    while words and (words[0] in _KEYWORDS or _ASSIGNMENT.match(words[0])):
        guard_assignment(words[0], scope)
        words = words[1:]
    if not words or words[0] in ("for", "select"):
        return  # `for x in a b c` names values, not a command; the loop body comes after `do`
    if _unknowable(words[0]):
        scope.ask(f"runs a command named by a variable or substitution ({words[0]}), unknown until it runs")
        return
    name = os.path.basename(words[0].lstrip("\\"))
    if checker := checker_for(name):
        checker(name, words[1:], scope)


def _unknowable(word: str) -> bool:
    """`$c`, `${PY}`, `$'\\x63url'` (ANSI-C quoting lexes as `$...`), `$(...)`: not a name we can read."""
    return "$" in word or SUBSTITUTED in word or "`" in word


def resolve(word: str, base: str | None) -> str | None:
    """The absolute path a word names, or None when it cannot be known (variables, `cd $X`)."""
    if _unknowable(word):
        return None
    if word.startswith("~"):
        word = os.path.expanduser(word)
        if word.startswith("~"):
            return None
    if not os.path.isabs(word):
        if base is None:
            return None
        word = os.path.join(base, word)
    path = os.path.normpath(word)
    return "/" + path.lstrip("/") if path.startswith("//") else path  # `//` is `/` on Linux


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


# ---- the command families ----

# Words that only shape how the real command runs: skipped to find it.
_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "case", "esac", "!", "{", "}", "time"}  # fmt: skip
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
HARMLESS_DEVICES = (
    "/dev/null",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/tty",
    "/dev/zero",
    "/dev/fd/",
    "/dev/shm/",
)
WRAPPERS: dict[str, tuple[set[str], int]] = {
    # name: (options that take a value, positional words before the command)
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
    "coproc": (set(), 0),
    "chrt": ({"-T", "-P", "-D", "--sched-runtime", "--sched-period", "--sched-deadline"}, 1),
}
_ENV_SPLIT = ("-S", "--split-string")  # env -S 'cmd args': one word split into the command
PRIVILEGE = {"sudo", "su", "doas", "pkexec", "runuser"}
SHELLS = {"sh", "bash", "zsh", "dash", "ksh"}
INSTALLS: dict[str, set[str] | None] = {
    # name: subcommands that install/remove (None: every use)
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
UV_INSTALLS = {"add", "remove", "sync", "tool", "python"}
NETWORK_TOOLS = {
    "curl", "wget", "aria2c", "axel", "scp", "sftp", "ssh", "nc", "ncat", "netcat", "telnet",
    "ftp", "lftp", "gsutil", "gcloud", "aws", "az", "s3cmd", "rclone", "kaggle", "modelscope",
}  # fmt: skip
NETWORK_SUBCOMMANDS = {
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
KILLS_BY_NAME = {"pkill", "killall", "killall5", "skill", "slay"}
SYSTEM_TOOLS = {
    "systemctl", "service", "crontab", "mount", "umount", "chroot", "iptables", "nft", "ufw",
    "useradd", "userdel", "usermod", "groupadd", "passwd", "chpasswd", "visudo", "modprobe",
    "insmod", "rmmod", "sysctl", "swapoff", "swapon", "nvidia-smi-reset",
}  # fmt: skip
MACHINE_DOWN = {"shutdown", "reboot", "halt", "poweroff", "init", "telinit"}
CONTROL_VERBS = {
    "approve",
    "reject",
    "steer",
    "budget",
    "stop",
    "pause",
    "resume",
    "submit",
    "audit",
    "skills",
}
AGENT_VERBS_OF_CONTROL_GROUPS = {("skills", "edit")}  # an agent proposes; a person approves the diff
DISK_TOOLS = {"mkfs", "fdisk", "sfdisk", "parted", "wipefs", "mkswap"}
DELETES = {"rm", "rmdir", "unlink", "shred", "srm"}
WRITES_EVERY_ARG = {"touch", "mkdir", "tee", "truncate", "mv"}
WRITES_TARGET = {"cp", "ln", "install"}
CHANGES_MODE = {"chmod", "chown", "chgrp"}
_WRITE_OPTIONS_WITH_VALUE = {"-t", "--target-directory", "-s", "--size", "-m", "--mode", "-o", "-g", "-e"}
_REMOTE = re.compile(r"^[\w.@-]+:")  # host:path


def run_wrapped(name: str, args: list[str], scope: Scope) -> None:
    """env, nohup, timeout, xargs, ...: the command they run is checked."""
    with_value, positional_before = WRAPPERS[name]
    rest = list(args)
    while rest and (rest[0].startswith("-") or (name == "env" and _ASSIGNMENT.match(rest[0]))):
        option = rest.pop(0)
        if name == "env" and _ASSIGNMENT.match(option):
            guard_assignment(option, scope)
        if name == "env" and (split := _env_split(option, rest)) is not None:
            # Checked as shell text: stricter than env's own splitting, never laxer.
            check_text(" ".join([split, *map(shlex.quote, rest)]), scope.nested())
            return
        if option in with_value and rest:
            rest.pop(0)
    rest = rest[positional_before:]
    if name == "coproc" and rest[1:2] == ["{"]:
        rest = rest[1:]  # `coproc NAME { cmd; }`: NAME names the coprocess
    if name == "xargs" and rest and os.path.basename(rest[0]) in DELETES | KILLS_BY_NAME | {"kill"}:
        scope.ask(f"xargs {rest[0]}: acts on names read from its input, which cannot be checked")
    check_words(rest, scope)


def _env_split(option: str, rest: list[str]) -> str | None:
    """The string of `env -S STR` / `-SSTR` / `--split-string[=]STR` (taken from `rest`), else None."""
    for flag in _ENV_SPLIT:
        if option == flag:
            return rest.pop(0) if rest else ""
        if option.startswith(flag + "=") or (flag == "-S" and option.startswith("-S")):
            return option[len(flag) :].removeprefix("=")
    return None


def guard_flock(name: str, args: list[str], scope: Scope) -> None:
    """`flock [options] LOCK command ...` or `flock [options] LOCK -c 'command'`: the command is
    checked."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ("-w", "--wait", "--timeout", "-E", "--conflict-exit-code") else 1
    rest = args[i + 1 :]  # after the lock file (or descriptor)
    if rest[:1] in (["-c"], ["--command"]):
        check_text(" ".join(rest[1:2]), scope.nested())
    else:
        check_words(rest, scope)


def guard_privilege(name: str, args: list[str], scope: Scope) -> None:
    scope.ask(f"runs as another user ({name})")
    _, rest = options_and_args(args, {"-u", "-g", "-C", "-p", "-c"})
    if name != "su":
        check_words(rest, scope)


def guard_nested_shell(name: str, args: list[str], scope: Scope) -> None:
    """`bash -c '...'` (`-lc`, `-ec`, `-c --`, ...) is checked like the outer text; a script must
    come from the workspace; commands read from the input (`... | sh`, `bash -s`, a heredoc) ask."""
    if name not in SHELLS:  # source, .
        if args:
            _script_from_workspace(args[0], scope)
        return
    flags, positional = _shell_flags(args)
    if "c" in flags:
        if positional:
            check_text(positional[0], scope.nested())
    elif "s" in flags or not positional:
        scope.ask(f"{name} runs commands read from its input, which cannot be checked")
    else:
        _script_from_workspace(positional[0], scope)


def _script_from_workspace(word: str, scope: Scope) -> None:
    script = resolve(word, scope.base)
    if script is None or not under(script, scope.writable):
        scope.ask(f"runs a script from outside the workspace ({word})")


_SHELL_OPTIONS_WITH_VALUE = {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}


def _shell_flags(args: list[str]) -> tuple[set[str], list[str]]:
    """(the short flags given, e.g. {"l", "c"} for `-lc`; the words after the options)."""
    flags: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--", "-"):
            i += 1
            break
        if arg in _SHELL_OPTIONS_WITH_VALUE:
            i += 2
        elif arg.startswith("--"):
            i += 1  # --login, --norc, ...
        elif len(arg) > 1 and arg[0] in "-+":
            flags.update(arg[1:] if arg[0] == "-" else "")
            i += 1
        else:
            break
    return flags, args[i:]


def guard_eval(name: str, args: list[str], scope: Scope) -> None:
    scope.ask("eval: what it runs cannot be checked before it runs")


def follow_cd(name: str, args: list[str], scope: Scope) -> None:
    """Not a risk: it moves where the next commands' relative paths point."""
    target = args[0] if args else "~"
    scope.base = None if target == "-" else resolve(target, scope.base)


def follow_pushd(name: str, args: list[str], scope: Scope) -> None:
    """pushd DIR is cd DIR that popd undoes; other forms (rotations, -n) leave the place unknown."""
    if name == "popd":
        scope.base, scope.pushed = (scope.pushed[-1], scope.pushed[:-1]) if scope.pushed else (None, ())
    elif len(args) == 1 and not args[0].startswith(("-", "+")):
        scope.pushed += (scope.base,)
        scope.base = resolve(args[0], scope.base)
    else:
        scope.base = None


def guard_python_module(name: str, args: list[str], scope: Scope) -> None:
    """`python -m pip ...` (also `-u -m pip`, `-mpip`) is pip; `python -m huggingface_hub ...` is
    huggingface-cli; `python -m goaltender.cli ...` is goaltender."""
    found = _python_module(args)
    if found is None:
        return
    module, rest = found
    if module in ("pip", "pip3") or module.startswith("pip."):
        check_words(["pip", *rest], scope)
    elif module in ("goaltender", "goaltender.cli"):
        check_words(["goaltender", *rest], scope)
    elif module in ("huggingface_hub.commands.huggingface_cli", "huggingface_hub"):
        check_words(["huggingface-cli", *rest], scope)


def _python_module(args: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) of `python [options] -m MODULE ...`; None for a script or `-c`.
    Short options may be combined (`-um pip`, `-mpip`); -X and -W take a value."""
    i = 0
    while i < len(args) and args[i].startswith("-") and not args[i].startswith("--") and args[i] != "-":
        arg = args[i]
        for j, flag in enumerate(arg[1:], start=1):
            if flag == "c":
                return None
            if flag in "mXW":
                value, i = (
                    (arg[j + 1 :], i + 1)
                    if arg[j + 1 :]
                    else (args[i + 1] if i + 1 < len(args) else "", i + 2)
                )
                if flag == "m":
                    return value, args[i:]
                break
        else:
            i += 1
    return None


def guard_uv(name: str, args: list[str], scope: Scope) -> None:
    _, positional = options_and_args(args)
    if positional[:1] == ["run"]:
        _, inner = options_and_args(positional[1:], {"--with", "--python", "-p", "--project", "--directory"})
        check_words(inner, scope)
    elif positional[:1] == ["pip"] and positional[1:2] and positional[1] in {"install", "uninstall", "sync"}:
        scope.ask(f"installs or removes packages (uv pip {positional[1]})")
    elif positional[:1] and positional[0] in UV_INSTALLS:
        scope.ask(f"installs or removes packages (uv {positional[0]})")


# The runner's own variables lead an agent to its goal's socket: set by the runner, never by it.
RUNNER_VARIABLES = {"GOALTENDER_SOCKET", "GOALTENDER_GOAL_ID", "GOALTENDER_HOME", "GOALTENDER_WORKSPACE"}
# Caches the runner routes into the goal's own cache (runner/agent_env.py), and the shared hub's.
CACHE_VARIABLES = {
    "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "TORCH_HOME", "TRITON_CACHE_DIR", "PIP_CACHE_DIR",
    "UV_CACHE_DIR", "RAY_TMPDIR", "MPLCONFIGDIR", "CUDA_CACHE_PATH", "GOALTENDER_CACHE_DIR",
}  # fmt: skip


def guard_assignment(word: str, scope: Scope) -> None:
    """`NAME=value` (before a command, or to export/declare/env): the runner's variables are not the
    agent's to set, and a cache goes in the workspace or the goal's own caches. Redirecting them was
    how an agent reached other goals' sockets through its experiment's environment; the sandbox
    binds nothing by them now, and the policy refuses the attempt outright."""
    name, _, value = word.partition("=")
    if name in RUNNER_VARIABLES:
        scope.deny(f"sets {name}, which the runner sets: it leads to the goal's own socket")
    elif name in CACHE_VARIABLES:
        path = resolve(os.path.expandvars(value), scope.base)
        caches = [
            os.path.dirname(os.environ[var])
            for var in ("XDG_CACHE_HOME", "PIP_CACHE_DIR")
            if var in os.environ
        ]
        if path is None:
            scope.ask(f"points {name} at {value}, unknown until it runs")
        elif not under(path, [*scope.writable, *caches, "/tmp"]):
            scope.deny(
                f"points {name} outside the workspace and the goal's caches ({path}): the goal's caches "
                "are where the runner put them"
            )


def guard_declaration(name: str, args: list[str], scope: Scope) -> None:
    """export, declare, typeset, local, readonly: their `NAME=value` words are assignments."""
    for arg in args:
        if _ASSIGNMENT.match(arg):
            guard_assignment(arg, scope)


def guard_control_verb(name: str, args: list[str], scope: Scope) -> None:
    """The agent verbs are the agent's; deciding, steering, budgets, stopping belong to people."""
    options, positional = options_and_args(args, {"--socket"})
    if any(option == "--socket" or option.startswith("--socket=") for option in options):
        scope.deny("`goaltender --socket`: an agent speaks to the runner through its goal's socket only")
    if (
        positional
        and positional[0] in CONTROL_VERBS
        and tuple(positional[:2]) not in AGENT_VERBS_OF_CONTROL_GROUPS
    ):
        scope.deny(
            f"`goaltender {positional[0]}` is for people, not agents: a person decides approvals, "
            "budgets, steering and stops (in the goal's thread); the runner refuses it from an agent"
        )
    if positional[:1] == ["nemo-rl"] and (trainer := _option_value(args, "--trainer")) is not None:
        check_text(trainer, scope.nested())  # the command the run starts instead of NeMo RL's


def _option_value(args: list[str], option: str) -> str | None:
    """The value of `--option VALUE` or `--option=VALUE` (before any `--`)."""
    for i, arg in enumerate(args[: args.index("--") if "--" in args else len(args)]):
        if arg == option and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(option + "="):
            return arg.partition("=")[2]
    return None


def guard_machine_down(name: str, args: list[str], scope: Scope) -> None:
    if name not in ("init", "telinit") or args[:1] in (["0"], ["6"]):
        scope.deny(f"{name} would take the machine down")


def guard_disk_wipe(name: str, args: list[str], scope: Scope) -> None:
    scope.deny(f"{name} formats or repartitions disks")


def guard_dd(name: str, args: list[str], scope: Scope) -> None:
    for target in (arg[3:] for arg in args if arg.startswith("of=")):
        if target.startswith("/dev/") and not target.startswith(HARMLESS_DEVICES):
            scope.deny(f"dd onto a device ({target})")
        else:
            scope.ask_if_outside([target], "writes outside the workspace")


def guard_package_install(name: str, args: list[str], scope: Scope) -> None:
    subcommands = INSTALLS[_PIP_NAME.sub("pip", name)]
    if subcommands is None:
        scope.ask(f"installs or fetches packages ({name})")
        return
    _, positional = options_and_args(args)
    first = positional[0] if positional else ""
    if first in subcommands or any(a in subcommands for a in args if a.startswith("-")):
        scope.ask(f"installs or removes packages ({name} {first or args[0]})".rstrip())


def guard_network(name: str, args: list[str], scope: Scope) -> None:
    scope.ask(f"uses the network ({name})")


def guard_network_subcommand(name: str, args: list[str], scope: Scope) -> None:
    """git clone, docker pull, hf download, ...: the subcommand says whether it goes online."""
    _, positional = options_and_args(args, {"-C", "-c"})
    if positional and positional[0] in NETWORK_SUBCOMMANDS[name]:
        scope.ask(f"uses the network ({name} {positional[0]})")


def guard_rsync(name: str, args: list[str], scope: Scope) -> None:
    _, positional = options_and_args(args)
    if any(_REMOTE.match(a) or a.startswith("rsync://") for a in positional):
        scope.ask("uses the network (rsync to or from another host)")
    local = [target for target in _copy_targets(args, target_option=False) if not _REMOTE.match(target)]
    scope.ask_if_outside(local, f"{name} writes outside the workspace")


def guard_kill(name: str, args: list[str], scope: Scope) -> None:
    """Killing a process this agent started is fine; any other needs a person."""
    if "-l" in args or "-L" in args:
        return
    _, targets = options_and_args(args, {"-s", "-n"})
    for target in targets:
        if target.startswith("%") or target in ("$!", "${!}"):
            continue  # a job of this same shell
        if not target.lstrip("-").isdigit():
            scope.ask(f"kill {target}: which process cannot be checked before it runs")
        elif int(target) <= 0 or not scope.is_own_pid(int(target)):
            scope.ask(f"kill {target}: not a process this agent started")


def guard_kill_by_name(name: str, args: list[str], scope: Scope) -> None:
    scope.ask(f"{name} kills processes by name, which may hit processes the agent did not start")


def guard_system_config(name: str, args: list[str], scope: Scope) -> None:
    scope.ask(f"changes system configuration ({name})")


def guard_delete(name: str, args: list[str], scope: Scope) -> None:
    """A recursive delete of /, home or a top-level directory is refused; outside the workspace asks."""
    options, positional = options_and_args(args)
    recursive = any(
        o in ("-r", "-R", "--recursive") or (not o.startswith("--") and "r" in o.lower()) for o in options
    )
    home = os.path.normpath(os.path.expanduser("~"))
    for arg in positional:
        path = resolve(arg, scope.base)
        if recursive and path is not None and (path.count("/") <= 1 or path in (home, home + "/*")):
            scope.deny(f"recursive delete of {path}")
        elif recursive and arg.rstrip("/") in ("~", "$HOME", "${HOME}", "/*", "~/*"):
            scope.deny(f"recursive delete of {arg}")
        else:
            scope.ask_if_outside([arg], "deletes outside the workspace")


def guard_find(name: str, args: list[str], scope: Scope) -> None:
    """The commands of `-exec`/`-execdir`/`-ok` are checked; `find -delete` or `-exec rm` (mv,
    chmod, ...) outside the workspace asks."""
    for i, arg in enumerate(args):
        if arg in ("-exec", "-execdir", "-ok", "-okdir"):
            inner = args[i + 1 :]
            end = next((j for j, word in enumerate(inner) if word in (";", "+")), len(inner))
            check_words(inner[:end], scope.nested())
    changes = "-delete" in args or any(
        os.path.basename(args[i + 1]) in DELETES | {"mv", "chmod", "chown"}
        for i, a in enumerate(args[:-1])
        if a in ("-exec", "-execdir", "-ok")
    )
    if not changes:
        return
    starts = []
    for arg in args:
        if arg.startswith(("-", "(", "!")):
            break
        starts.append(arg)
    scope.ask_if_outside(starts or ["."], "find deletes or changes files outside the workspace")


def guard_write_args(name: str, args: list[str], scope: Scope) -> None:
    """touch, mkdir, tee, ...: every argument is written."""
    _, positional = options_and_args(args, _WRITE_OPTIONS_WITH_VALUE)
    scope.ask_if_outside(positional, f"{name} writes outside the workspace")


def guard_copy_target(name: str, args: list[str], scope: Scope) -> None:
    """cp, ln, install: the target (-t, or the last argument) is written."""
    scope.ask_if_outside(_copy_targets(args), f"{name} writes outside the workspace")


def _copy_targets(args: list[str], target_option: bool = True) -> list[str]:
    """The target directory (`-t DIR`, `-tDIR`, `-rt DIR`, `--target-directory[=]DIR`), else the
    last argument. rsync's -t is not a target (it keeps times): `target_option` False."""
    _, positional = options_and_args(args, _WRITE_OPTIONS_WITH_VALUE)
    options = args[: args.index("--")] if "--" in args else args
    named = [
        target
        for i, option in enumerate(options)
        if option.startswith("-") and (target := _target_of(option, options[i + 1 : i + 2]))
    ]
    return named if named and target_option else positional[-1:]


def _target_of(option: str, following: list[str]) -> str | None:
    name, has_value, value = option.partition("=")
    if len(name) > 3 and "--target-directory".startswith(name):  # GNU takes unique prefixes
        return value if has_value else (following[0] if following else None)
    if not option.startswith("--") and "t" in option[1:]:
        attached = option[option.index("t", 1) + 1 :]
        return attached or (following[0] if following else None)
    return None


def guard_mode_change(name: str, args: list[str], scope: Scope) -> None:
    """chmod, chown, chgrp: the files after the mode (or owner) are changed."""
    _, positional = options_and_args(args, _WRITE_OPTIONS_WITH_VALUE)
    scope.ask_if_outside(positional[1:], f"{name} writes outside the workspace")


def guard_in_place_edit(name: str, args: list[str], scope: Scope) -> None:
    """sed -i, perl -i: the files they edit."""
    if not any(a.startswith("-i") or a == "--in-place" for a in args):
        return
    options, positional = options_and_args(args, {"-e", "-f"})
    files = positional if ("-e" in options or "-f" in options) else positional[1:]  # else: the script
    scope.ask_if_outside(files, f"{name} -i edits a file outside the workspace")


def guard_extract(name: str, args: list[str], scope: Scope) -> None:
    """tar -C, unzip -d: where the archive is extracted."""
    flags = ("-C", "--directory") if name == "tar" else ("-d",)
    targets = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in flags]
    scope.ask_if_outside(targets, f"{name} extracts outside the workspace")


Checker = Callable[[str, list[str], Scope], None]

CHECKS: dict[str, Checker] = {
    **dict.fromkeys(WRAPPERS, run_wrapped),
    **dict.fromkeys(PRIVILEGE, guard_privilege),
    **dict.fromkeys([*SHELLS, "source", "."], guard_nested_shell),
    "eval": guard_eval,
    "cd": follow_cd,
    "pushd": follow_pushd,
    "popd": follow_pushd,
    "flock": guard_flock,
    "uv": guard_uv,
    "goaltender": guard_control_verb,
    **dict.fromkeys(["export", "declare", "typeset", "local", "readonly"], guard_declaration),
    **dict.fromkeys(MACHINE_DOWN, guard_machine_down),
    **dict.fromkeys(DISK_TOOLS, guard_disk_wipe),
    "dd": guard_dd,
    **dict.fromkeys(INSTALLS, guard_package_install),
    **dict.fromkeys(NETWORK_TOOLS, guard_network),
    **dict.fromkeys(NETWORK_SUBCOMMANDS, guard_network_subcommand),
    "rsync": guard_rsync,
    "kill": guard_kill,
    **dict.fromkeys(KILLS_BY_NAME, guard_kill_by_name),
    **dict.fromkeys(SYSTEM_TOOLS, guard_system_config),
    **dict.fromkeys(DELETES, guard_delete),
    "find": guard_find,
    **dict.fromkeys(WRITES_EVERY_ARG, guard_write_args),
    **dict.fromkeys(WRITES_TARGET, guard_copy_target),
    **dict.fromkeys(CHANGES_MODE, guard_mode_change),
    "sed": guard_in_place_edit,
    "perl": guard_in_place_edit,
    "tar": guard_extract,
    "unzip": guard_extract,
}
# Families whose names vary: mkfs.ext4, python3.11, ...
_NAME_PATTERNS: list[tuple[re.Pattern[str], Checker]] = [
    (re.compile(r"mkfs\..+"), guard_disk_wipe),
    (re.compile(r"python[\d.]*"), guard_python_module),
    (re.compile(r"pip3?\.[\d.]+"), guard_package_install),  # pip3.11
]
_PIP_NAME = re.compile(r"^pip3?\.[\d.]+$")


def checker_for(name: str) -> Checker | None:
    if checker := CHECKS.get(name):
        return checker
    return next((checker for pattern, checker in _NAME_PATTERNS if pattern.fullmatch(name)), None)
