"""The built-in agent's tools: their JSON schemas, the command policy, output truncation.

Everything here is pure (no runner, no model, no event loop) so it can be unit-tested on its own;
`openai_agent.py` wires it to the runner and the model.

The command policy sorts a shell command into allow / ask / deny before it runs:

- **deny** never runs: `rm -rf /` (or home, or a top-level directory), `mkfs`, `dd` onto a device,
  shutdown/reboot, a fork bomb, and whatever the policy file's `deny` patterns match.
- **ask** goes to a person first (runner Ask, kind="command"): sudo and friends, deleting or
  writing outside the workspace, package installs, network fetches and pushes, killing processes
  the agent did not start, system configuration, `eval`, and the file's `ask` patterns.
- **allow** is everything else, and whatever the file's `allow` patterns match (an allow pattern
  overrides the built-in ask rules, never a deny).

It is a guard against accidents, not a sandbox: a program the agent writes can still do anything
its user may do. The policy file (JSON or TOML, named by GOALTENDER_COMMAND_POLICY, which may also
hold the JSON inline) looks like:

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
import shlex
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Action = Literal["allow", "ask", "deny"]
_RANK = {"allow": 0, "ask": 1, "deny": 2}


# ---- output truncation ----


def truncate_middle(text: str | bytes, limit: int) -> str:
    """Keep the head and the tail of `text` (tails hold the errors), at most ~`limit` bytes in all,
    with a marker saying how much was cut from the middle."""
    data = text.encode(errors="replace") if isinstance(text, str) else text
    if len(data) <= limit:
        return data.decode(errors="replace")
    return _render(data[: limit * 2 // 5], data[len(data) - (limit - limit * 2 // 5) :], len(data))


def _render(head: bytes, tail: bytes, total: int) -> str:
    cut = total - len(head) - len(tail)
    marker = f"\n[... {cut:,} bytes cut from the middle of {total:,} bytes of output ...]\n"
    return head.decode(errors="replace") + marker + tail.decode(errors="replace")


def truncate_file(path: Path, limit: int) -> str:
    """truncate_middle over a file's bytes, reading only the head and the tail it keeps."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        if size <= limit:
            return f.read().decode(errors="replace")
        head = f.read(limit * 2 // 5)
        f.seek(size - (limit - len(head)))
        return _render(head, f.read(), size)


# ---- secrets ----

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)


def secret_values(environ: dict[str, str]) -> list[str]:
    """Values of environment variables that look like secrets (long enough to be worth hiding)."""
    return sorted(
        {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= 8 and v != "EMPTY"},
        key=len,
        reverse=True,
    )


def redact(text: str, secrets: Iterable[str]) -> str:
    for value in secrets:
        text = text.replace(value, "[redacted]")
    return text


# ---- the command policy ----


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
        known = {f for f in cls.__dataclass_fields__}
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
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        return cls.from_dict(data)


DEFAULT_POLICY = CommandPolicy()

# Words that only shape how the real command runs: skipped to find it.
_KEYWORDS = {
    "if",
    "then",
    "else",
    "elif",
    "fi",
    "do",
    "done",
    "while",
    "until",
    "case",
    "esac",
    "!",
    "{",
    "}",
    "time",
}
_WRAPPERS: dict[str, tuple[set[str], int]] = {
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
}
_PRIVILEGE = {"sudo", "su", "doas", "pkexec", "runuser"}
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh"}
_INSTALLS: dict[str, set[str] | None] = {
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
_UV_INSTALLS = {"add", "remove", "sync", "tool", "pip", "python"}
_NETWORK_ALWAYS = {
    "curl", "wget", "aria2c", "axel", "scp", "sftp", "ssh", "nc", "ncat", "netcat", "telnet",
    "ftp", "lftp", "gsutil", "gcloud", "aws", "az", "s3cmd", "rclone", "kaggle", "modelscope",
}  # fmt: skip
_NETWORK_SUB = {
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
_KILL_BY_NAME = {"pkill", "killall", "killall5", "skill", "slay"}
_SYSTEM = {
    "systemctl", "service", "crontab", "mount", "umount", "chroot", "iptables", "nft", "ufw",
    "useradd", "userdel", "usermod", "groupadd", "passwd", "chpasswd", "visudo", "modprobe",
    "insmod", "rmmod", "sysctl", "swapoff", "swapon", "nvidia-smi-reset",
}  # fmt: skip
_MACHINE_DOWN = {"shutdown", "reboot", "halt", "poweroff"}
_DISK_WIPE = re.compile(r"^(mkfs(\..+)?|fdisk|sfdisk|parted|wipefs|mkswap)$")
_DELETE = {"rm", "rmdir", "unlink", "shred", "srm"}
_WRITE_ALL_ARGS = {"touch", "mkdir", "tee", "truncate", "mv", "shred"}
_WRITE_LAST_ARG = {"cp", "ln", "install", "rsync"}
_MODE_FIRST = {"chmod", "chown", "chgrp"}
_DEV_OK = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/zero", "/dev/fd/", "/dev/shm/")
_FORK_BOMB = re.compile(r":\s*\(\s*\)\s*\{\s*:\s*\|\s*:\s*&\s*\}")
_SUBSTITUTION = re.compile(r"\$\(([^()]*)\)|`([^`]*)`")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1[^\n]*\n(.*?)^\s*\2\s*$", re.S | re.M)
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


@dataclass
class _Context:
    workspace: str
    writable: list[str]
    is_own_pid: Callable[[int], bool]
    base: str | None  # the directory relative paths resolve against (None: unknown after `cd $X`)
    verdicts: list[Verdict] = field(default_factory=list)
    depth: int = 0

    def ask(self, reason: str) -> None:
        self.verdicts.append(Verdict("ask", reason))

    def deny(self, reason: str) -> None:
        self.verdicts.append(Verdict("deny", reason))


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
    ctx = _Context(
        workspace=ws,
        writable=[ws, *(os.path.normpath(os.path.expanduser(w)) for w in policy.writable_paths)],
        is_own_pid=is_own_pid,
        base=ws,
    )
    _classify_text(command, ctx)
    builtin = _combine(ctx.verdicts)
    if builtin.action == "deny":
        return builtin
    for pattern in policy.ask:
        if re.search(pattern, command):
            return Verdict("ask", f"matches the policy's ask rule {pattern!r}")
    for pattern in policy.allow:
        if re.search(pattern, command):
            return Verdict("allow", f"matches the policy's allow rule {pattern!r}")
    return builtin if policy.builtin_rules else Verdict("allow")


def _combine(verdicts: list[Verdict]) -> Verdict:
    if not verdicts:
        return Verdict("allow")
    worst = max(_RANK[v.action] for v in verdicts)
    action: Action = next(a for a, r in _RANK.items() if r == worst)
    reasons = list(dict.fromkeys(v.reason for v in verdicts if _RANK[v.action] == worst and v.reason))
    return Verdict(action, "; ".join(reasons))


def _classify_text(text: str, ctx: _Context) -> None:
    if ctx.depth > 5:
        ctx.ask("commands nested too deeply to check")
        return
    if _FORK_BOMB.search(text):
        ctx.deny("a fork bomb")
        return
    text = text.replace("\\\n", " ")
    # Heredoc bodies are data, not commands.
    text = _HEREDOC.sub(lambda m: f"<<{m.group(2)}\n", text)
    # Command substitutions run too: check them on their own (the outer text keeps a placeholder).
    for m in _SUBSTITUTION.finditer(text):
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        _nested(inner, ctx)
    text = _SUBSTITUTION.sub(" __SUBST__ ", text)
    lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as exc:
        ctx.ask(f"could not parse the command ({exc})")
        return
    words: list[str] = []
    redirects: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token and all(c in "();<>|&" for c in token):
            if "<" in token or ">" in token:
                target = tokens[i + 1] if i + 1 < len(tokens) else ""
                if words and words[-1].isdigit():
                    words.pop()  # `2>` names a file descriptor, not an argument
                if ">" in token and not (token.endswith("&") and (target.isdigit() or target == "-")):
                    redirects.append((token, target))
                i += 2
                continue
            _simple(words, redirects, ctx)
            words, redirects = [], []
        else:
            words.append(token)
        i += 1
    _simple(words, redirects, ctx)


def _nested(text: str, ctx: _Context) -> None:
    inner = _Context(ctx.workspace, ctx.writable, ctx.is_own_pid, ctx.base, ctx.verdicts, ctx.depth + 1)
    _classify_text(text, inner)


def _options_and_args(args: list[str], with_value: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    options, positional, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positional += args[i + 1 :]
            break
        if arg.startswith("-") and arg != "-":
            options.append(arg)
            if arg in with_value and i + 1 < len(args):
                options.append(args[i + 1])
                i += 1
        else:
            positional.append(arg)
        i += 1
    return options, positional


def _resolve(word: str, base: str | None) -> str | None:
    """The absolute path a word names, or None when it cannot be known (variables, `cd $X`)."""
    if "$" in word or "__SUBST__" in word or "`" in word:
        return None
    if word.startswith("~"):
        word = os.path.expanduser(word)
        if word.startswith("~"):
            return None
    if not os.path.isabs(word):
        if base is None:
            return None
        word = os.path.join(base, word)
    return os.path.normpath(word)


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _outside(word: str, ctx: _Context, roots: list[str]) -> str | None:
    """The path `word` names when it is outside `roots` (or unknowable), else None."""
    if word.startswith(_DEV_OK) or word in ("/dev/null", "-"):
        return None
    path = _resolve(word, ctx.base)
    if path is None:
        return word
    return None if _under(path, roots) else path


def _simple(words: list[str], redirects: list[tuple[str, str]], ctx: _Context) -> None:
    for _op, target in redirects:
        if (where := _outside(target, ctx, ctx.writable)) is not None:
            ctx.ask(f"writes outside the workspace ({where})")
    while words and (words[0] in _KEYWORDS or _ASSIGNMENT.match(words[0])):
        words = words[1:]
    if not words:
        return
    if words[0] == "for" or words[0] == "select":
        return  # `for x in a b c` names values, not a command; the loop body comes after `do`
    name = os.path.basename(words[0].lstrip("\\"))
    args = words[1:]

    if name in _WRAPPERS:
        with_value, positional_before = _WRAPPERS[name]
        rest = list(args)
        while rest and (rest[0].startswith("-") or (name == "env" and _ASSIGNMENT.match(rest[0]))):
            option = rest.pop(0)
            if option in with_value and rest:
                rest.pop(0)
        rest = rest[positional_before:]
        if name == "xargs" and rest and os.path.basename(rest[0]) in _DELETE | _KILL_BY_NAME | {"kill"}:
            ctx.ask(f"xargs {rest[0]}: acts on names read from its input, which cannot be checked")
        if rest:
            _simple(rest, [], ctx)
        return
    if name in _PRIVILEGE:
        ctx.ask(f"runs as another user ({name})")
        _, rest = _options_and_args(args, {"-u", "-g", "-C", "-p", "-c"})
        if name != "su" and rest:
            _simple(rest, [], ctx)
        return
    if name in _SHELLS or name in ("eval", "source", "."):
        if name in ("eval",):
            ctx.ask("eval: what it runs cannot be checked before it runs")
            return
        if "-c" in args and args.index("-c") + 1 < len(args):
            _nested(args[args.index("-c") + 1], ctx)
        elif args and name in _SHELLS:
            script = _resolve(args[0], ctx.base)
            if script is None or not _under(script, ctx.writable):
                ctx.ask(f"runs a script from outside the workspace ({args[0]})")
        return
    if name == "cd":
        target = args[0] if args else "~"
        ctx.base = None if target == "-" else _resolve(target, ctx.base)
        return
    if re.fullmatch(r"python[\d.]*", name) and len(args) >= 2 and args[0] == "-m":
        module = args[1]
        if module in ("pip", "pip3") or module.startswith("pip."):
            _simple(["pip", *args[2:]], [], ctx)
        elif module in ("huggingface_hub.commands.huggingface_cli", "huggingface_hub"):
            _simple(["huggingface-cli", *args[2:]], [], ctx)
        return
    if name == "uv":
        options, positional = _options_and_args(args)
        if positional[:1] == ["run"]:
            _, inner = _options_and_args(
                positional[1:], {"--with", "--python", "-p", "--project", "--directory"}
            )
            if inner:
                _simple(inner, [], ctx)
        elif (
            positional[:1] == ["pip"]
            and positional[1:2]
            and positional[1] in {"install", "uninstall", "sync"}
        ):
            ctx.ask(f"installs or removes packages (uv pip {positional[1]})")
        elif positional[:1] and positional[0] in _UV_INSTALLS - {"pip"}:
            ctx.ask(f"installs or removes packages (uv {positional[0]})")
        return

    # ---- the checks ----
    if name in _MACHINE_DOWN or (name in ("init", "telinit") and args[:1] in (["0"], ["6"])):
        ctx.deny(f"{name} would take the machine down")
        return
    if _DISK_WIPE.match(name):
        ctx.deny(f"{name} formats or repartitions disks")
        return
    if name == "dd":
        for arg in args:
            if arg.startswith("of="):
                target = arg[3:]
                if target.startswith("/dev/") and not target.startswith(_DEV_OK):
                    ctx.deny(f"dd onto a device ({target})")
                elif (where := _outside(target, ctx, ctx.writable)) is not None:
                    ctx.ask(f"writes outside the workspace ({where})")
        return
    if name in _INSTALLS:
        subcommands = _INSTALLS[name]
        _, positional = _options_and_args(args)
        first = positional[0] if positional else ""
        if subcommands is None:
            ctx.ask(f"installs or fetches packages ({name})")
        elif first in subcommands or any(a in subcommands for a in args if a.startswith("-")):
            ctx.ask(f"installs or removes packages ({name} {first or args[0]})".rstrip())
        return
    if name in _NETWORK_ALWAYS:
        ctx.ask(f"uses the network ({name})")
        return
    if name in _NETWORK_SUB:
        _, positional = _options_and_args(args, {"-C", "-c"})
        if positional and positional[0] in _NETWORK_SUB[name]:
            ctx.ask(f"uses the network ({name} {positional[0]})")
        return
    if name == "rsync":
        _, positional = _options_and_args(args)
        if any(re.match(r"^[\w.@-]+:", a) or a.startswith("rsync://") for a in positional):
            ctx.ask("uses the network (rsync to or from another host)")
    if name == "kill":
        _check_kill(args, ctx)
        return
    if name in _KILL_BY_NAME:
        ctx.ask(f"{name} kills processes by name, which may hit processes the agent did not start")
        return
    if name in _SYSTEM:
        ctx.ask(f"changes system configuration ({name})")
        return

    if name in _DELETE:
        options, positional = _options_and_args(args)
        recursive = any(
            o in ("-r", "-R", "--recursive") or (not o.startswith("--") and "r" in o.lower()) for o in options
        )
        home = os.path.normpath(os.path.expanduser("~"))
        for arg in positional:
            path = _resolve(arg, ctx.base)
            if recursive and path is not None and (path.count("/") <= 1 or path in (home, home + "/*")):
                ctx.deny(f"recursive delete of {path}")
            elif recursive and arg.rstrip("/") in ("~", "$HOME", "${HOME}", "/*", "~/*"):
                ctx.deny(f"recursive delete of {arg}")
            elif (where := _outside(arg, ctx, ctx.writable)) is not None:
                ctx.ask(f"deletes outside the workspace ({where})")
        return
    if name == "find" and any(a in ("-delete", "-exec", "-execdir", "-ok") for a in args):
        if "-delete" in args or any(
            os.path.basename(args[i + 1]) in _DELETE | {"mv", "chmod", "chown"}
            for i, a in enumerate(args[:-1])
            if a in ("-exec", "-execdir", "-ok")
        ):
            starts = []
            for arg in args:
                if arg.startswith(("-", "(", "!")):
                    break
                starts.append(arg)
            for arg in starts or ["."]:
                if (where := _outside(arg, ctx, ctx.writable)) is not None:
                    ctx.ask(f"find deletes or changes files outside the workspace ({where})")
        return
    if name in _WRITE_ALL_ARGS or name in _WRITE_LAST_ARG or name in _MODE_FIRST:
        with_value = {"-t", "--target-directory", "-s", "--size", "-m", "--mode", "-o", "-g", "-e"}
        options, positional = _options_and_args(args, with_value)
        if name in _MODE_FIRST:
            positional = positional[1:]
        elif name in _WRITE_LAST_ARG:
            targets = [
                options[i + 1] for i, o in enumerate(options[:-1]) if o in ("-t", "--target-directory")
            ]
            positional = targets or positional[-1:]
            if name == "rsync":
                positional = [a for a in positional if not re.match(r"^[\w.@-]+:", a)]
        elif name == "ln" and len(positional) == 1:
            positional = ["."]
        for arg in positional:
            if (where := _outside(arg, ctx, ctx.writable)) is not None:
                ctx.ask(f"{name} writes outside the workspace ({where})")
        return
    if name in ("sed", "perl") and any(a.startswith("-i") or a == "--in-place" for a in args):
        options, positional = _options_and_args(args, {"-e", "-f"})
        files = positional if ("-e" in options or "-f" in options) else positional[1:]
        for arg in files:
            if (where := _outside(arg, ctx, ctx.writable)) is not None:
                ctx.ask(f"{name} -i edits a file outside the workspace ({where})")
        return
    if name in ("tar", "unzip"):
        for i, arg in enumerate(args[:-1]):
            extract_to = (name == "tar" and arg in ("-C", "--directory")) or (name == "unzip" and arg == "-d")
            if extract_to and (where := _outside(args[i + 1], ctx, ctx.writable)) is not None:
                ctx.ask(f"{name} extracts outside the workspace ({where})")


def _check_kill(args: list[str], ctx: _Context) -> None:
    if "-l" in args or "-L" in args:
        return
    _, targets = _options_and_args(args, {"-s", "-n"})
    for target in targets:
        if target.startswith("%") or target in ("$!", "${!}"):
            continue  # a job of this same shell
        if target.lstrip("-").isdigit():
            pid = int(target)
            if pid <= 0 or not ctx.is_own_pid(pid):
                ctx.ask(f"kill {target}: not a process this agent started")
        else:
            ctx.ask(f"kill {target}: which process cannot be checked before it runs")


# ---- file paths ----


def inside(path: Path, roots: Iterable[Path]) -> bool:
    """Is the (resolved) path one of `roots` or under one of them?"""
    return any(path == root or root in path.parents for root in roots)


def resolve_path(raw: str, workspace: Path) -> Path:
    """A tool's path argument, relative to the workspace, symlinks resolved."""
    path = Path(raw).expanduser()
    return (path if path.is_absolute() else workspace / path).resolve()


# ---- tool schemas (Chat Completions function tools) ----


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str] | None = None) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required or [],
                "additionalProperties": False,
            },
        },
    }


_STR = {"type": "string"}
_NUM = {"type": "number"}
_INT = {"type": "integer"}


def tool_specs(with_eval_command: bool = False) -> list[dict]:
    experiment_props: dict[str, Any] = {
        "command": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
            "description": "the command: an argv list, or a string run with bash -c",
        },
        "description": {**_STR, "description": "the hypothesis this run tests"},
        "params": {"type": "object", "description": "the config values this run uses, for the ledger"},
        "metric": {**_STR, "description": "headline metric name, printed by the run as `name: value`"},
        "direction": {"type": "string", "enum": ["maximize", "minimize"]},
        "timeout_s": {**_NUM, "description": "per-run time limit in seconds"},
    }
    if with_eval_command:
        experiment_props["eval_command"] = {
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
            "description": "run by the runner after a successful run to measure the metric on held-out "
            "data (it finds the run's files in $GOALTENDER_EXPERIMENT_DIR)",
        }
    return [
        _tool(
            "shell",
            "Run a bash command in the workspace and return its exit code and output (head and tail "
            "kept when long). Risky commands (sudo, installs, network, deleting or writing outside the "
            "workspace, killing processes you did not start) wait for a person's approval first. "
            "Use run_experiment, not shell, for experiments.",
            {"command": _STR, "timeout_s": {**_NUM, "description": "seconds before it is killed"}},
            ["command"],
        ),
        _tool(
            "read_file",
            "Read a text file (paths relative to the workspace).",
            {
                "path": _STR,
                "offset": {**_INT, "description": "first line to read, 1-based"},
                "limit": {**_INT, "description": "how many lines"},
            },
            ["path"],
        ),
        _tool(
            "write_file",
            "Create or overwrite a file with the given content (parent directories are created).",
            {"path": _STR, "content": _STR},
            ["path", "content"],
        ),
        _tool(
            "edit_file",
            "Replace an exact string in a file; it must occur exactly once (include surrounding lines).",
            {"path": _STR, "old_string": _STR, "new_string": _STR},
            ["path", "old_string", "new_string"],
        ),
        _tool(
            "list_files",
            "List files under a directory of the workspace, with sizes.",
            {"path": _STR, "depth": {**_INT, "description": "how deep to recurse (default 2)"}},
        ),
        _tool(
            "load_skill",
            "Load a skill's instructions (SKILL.md) by name; the brief lists the skills.",
            {"name": _STR},
            ["name"],
        ),
        _tool(
            "run_experiment",
            "Run one experiment under the runner's supervision: its own log, live metrics, a timeout, "
            "resource accounting and a ledger row (keep = new best, discard, crash). One hypothesis per "
            "run. Returns when the run has finished. The runner refuses runs past the budget.",
            experiment_props,
            ["command", "description"],
        ),
        _tool(
            "milestone",
            "Post a milestone to the goal's thread (plans, new bests, findings, changes of direction).",
            {"title": _STR, "text": _STR},
            ["title"],
        ),
        _tool(
            "log_metrics",
            "Log metric points to the goal's series.",
            {
                "metrics": {"type": "object", "description": "metric name -> number"},
                "step": _NUM,
                "experiment_id": _INT,
            },
            ["metrics"],
        ),
        _tool(
            "ask_approval",
            "Ask the people for approval and wait for their decision (costly or risky steps).",
            {
                "question": _STR,
                "detail": {**_STR, "description": "cost, risk, plan: what they need to decide"},
                "kind": {**_STR, "description": "cost | command | generic"},
            },
            ["question"],
        ),
        _tool("read_inbox", "Read steering messages from people that have not been seen yet.", {}),
        _tool(
            "write_diary",
            "Write to the durable diary. A handoff (handoff=true) is what a restarted or compacted "
            "session is given: current best, what was tried, what is next, constraints from people.",
            {"text": _STR, "handoff": {"type": "boolean"}},
            ["text"],
        ),
        _tool(
            "read_diary",
            "Read the latest diary entries.",
            {"last": _INT, "handoff_only": {"type": "boolean"}},
        ),
        _tool(
            "submit_report",
            "Store your words for the final report (what was learnt, the best config, what to try "
            "next). Calling it again replaces the text.",
            {"text": _STR},
            ["text"],
        ),
        _tool(
            "finish",
            "Declare the campaign done (stop rule met, budget used, or nothing left worth trying). "
            "`summary` becomes the final report's text from you. Ends the session.",
            {"summary": _STR},
            ["summary"],
        ),
    ]
