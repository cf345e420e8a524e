"""The built-in agent's workspace tools: shell, read / write / edit / list files, load a skill.

Each tool returns the text the model sees. A shell command runs once the command policy
(policy.py) allows it or a person approves it; a file outside the workspace (and the policy's
writable / readable paths) needs a person's approval too. Approvals are remembered for the session.

A shell command runs in a process group of its own with its output in a log file under
.agent/shell/: on a timeout or a stop the whole group gets SIGTERM, then SIGKILL (the runner's
terminate_group), so the command and everything it started end; a background job it leaves behind
may write on to its log, and its group is ended when the agent closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import psutil

from goaltender.agents import briefing
from goaltender.agents.output import one_line, truncate_file, truncate_middle
from goaltender.agents.policy import CommandPolicy, classify_command
from goaltender.agents.runner_tools import AskPerson, Handler, decision_text
from goaltender.agents.tool_specs import EditFile, ListFiles, LoadSkill, ReadFile, Shell, WriteFile
from goaltender.runner.supervisor import group_alive, group_members, terminate_group

log = logging.getLogger(__name__)

KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL for a shell command's process group
MAX_LISTED = 400
SKIP_DIRS = {
    ".git",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    ".agents",
    ".agent",
    ".mypy_cache",
    ".ruff_cache",
}


def inside(path: Path, roots: list[Path]) -> bool:
    """Is the (resolved) path one of `roots` or under one of them?"""
    return any(path == root or root in path.parents for root in roots)


def resolve_path(raw: str, workspace: Path) -> Path:
    """A tool's path argument, relative to the workspace, symlinks resolved."""
    path = Path(raw).expanduser()
    return (path if path.is_absolute() else workspace / path).resolve()


class WorkspaceTools:
    def __init__(
        self,
        workspace: Path,
        policy: CommandPolicy,
        ask: AskPerson,
        *,
        shell_timeout_s: float,
        output_limit: int,
    ):
        self.workspace = workspace.resolve()
        self.policy = policy
        self.ask = ask
        self.shell_timeout_s = shell_timeout_s
        self.output_limit = output_limit
        self.writable = [self.workspace, *(Path(w).expanduser().resolve() for w in policy.writable_paths)]
        self.readable = [*self.writable, *(Path(r).expanduser().resolve() for r in policy.readable_paths)]
        self.approved_commands: set[str] = set()
        self.approved_paths: set[tuple[str, Path]] = set()
        self.loaded_skills: list[str] = []
        self.shell_count = 0
        self.shell_groups: set[int] = set()  # process groups of shell commands, while they may live

    def handlers(self) -> dict[str, Handler]:
        return {
            "shell": self.shell,
            "read_file": self.read_file,
            "write_file": self.write_file,
            "edit_file": self.edit_file,
            "list_files": self.list_files,
            "load_skill": self.load_skill,
        }

    async def close(self) -> None:
        """End the background jobs shell commands left running."""
        await self._forget_ended_groups()
        await asyncio.gather(*(terminate_group(group, grace_s=KILL_GRACE_S) for group in self.shell_groups))
        self.shell_groups.clear()

    async def _forget_ended_groups(self) -> None:
        # An ended group's number may come back as someone else's: never treat that one as ours.
        groups = list(self.shell_groups)
        self.shell_groups -= {g for g in groups if not await asyncio.to_thread(group_alive, g)}

    # ---- gates ----

    def is_own_pid(self, pid: int) -> bool:
        """Did one of this agent's shell commands start the process?"""
        try:
            return pid != os.getpid() and os.getpgid(pid) in self.shell_groups
        except (ProcessLookupError, PermissionError):
            return False

    async def gate_command(self, command: str, what: str = "shell") -> tuple[bool, str]:
        """(may run, note for the tool result) after the policy and, if it says so, a person."""
        verdict = classify_command(command, self.workspace, self.policy, self.is_own_pid)
        if verdict.action == "allow" or command in self.approved_commands:
            return True, ""
        if verdict.action == "deny":
            log.info("denied: %r: %s", command, verdict.reason)
            return False, f"Denied by the command policy ({verdict.reason}); it was not run and will not be."
        log.info("asking before %s: %r: %s", what, command, verdict.reason)
        approval = await self.ask(
            f"Allow the agent to run: {one_line(command, 400)}",
            f"Command ({what}):\n{command}\n\nWhy it needs approval: {verdict.reason}\nWorkspace: {self.workspace}",
        )
        if approval.state == "approved":
            self.approved_commands.add(command)
            return True, f"(Approval asked because it {verdict.reason}: {decision_text(approval)}.)\n"
        return False, (
            f"Not run: the command was {decision_text(approval)}. It needed approval because it "
            f"{verdict.reason}. Do not retry it as is; adapt your plan."
        )

    async def _gate_path(self, raw: str, mode: str) -> tuple[Path, str | None]:
        """The resolved path, and None if the tool may go on, else the reason it may not."""
        path = resolve_path(raw, self.workspace)
        roots = self.readable if mode == "read" else self.writable
        if inside(path, roots) or (mode, path) in self.approved_paths:
            return path, None
        approval = await self.ask(
            f"Allow the agent to {mode} a file outside its workspace: {path}?",
            f"The {mode}_file tool was called with {raw!r}, which is outside {self.workspace}.",
        )
        if approval.state == "approved":
            self.approved_paths.add((mode, path))
            return path, None
        refused = f"the request to {mode} it was {decision_text(approval)}"
        return path, f"Refused: {path} is outside the workspace and {refused}."

    # ---- the tools ----

    async def shell(self, args: Shell) -> str:
        ok, note = await self.gate_command(args.command)
        if not ok:
            return note
        limit = min(args.timeout_s or self.shell_timeout_s, self.shell_timeout_s)
        await self._forget_ended_groups()
        # Output goes to a file, not a pipe: a background job the command leaves behind can write
        # on without blocking on a full pipe (or dying of SIGPIPE), and the model can read it later.
        self.shell_count += 1
        log_path = self.workspace / ".agent" / "shell" / f"{self.shell_count:04d}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                args.command,
                cwd=self.workspace,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                process_group=0,
            )
        self.shell_groups.add(proc.pid)
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), limit)
            except TimeoutError:
                timed_out = True
                await terminate_group(proc.pid, grace_s=KILL_GRACE_S)
                await proc.wait()
        except asyncio.CancelledError:
            await asyncio.shield(terminate_group(proc.pid, grace_s=KILL_GRACE_S))
            raise
        if left := await asyncio.to_thread(group_members, proc.pid):
            lingering = await asyncio.to_thread(_holding, left, log_path)
        else:
            self.shell_groups.discard(proc.pid)
            lingering = []
        head = note + (
            f"timed out after {limit:g}s: killed (exit code {proc.returncode})"
            if timed_out
            else f"exit code {proc.returncode}"
        )
        if lingering:
            head += (
                f" (background process {', '.join(map(str, lingering))} still running; its further output "
                f"goes to {log_path.relative_to(self.workspace)})"
            )
        room = max(100, self.output_limit - len(head.encode()) - 120)  # the marker fits too
        output = truncate_file(log_path, room) or "(no output)"
        if not lingering:
            log_path.unlink(missing_ok=True)
        return f"{head}\n{output}"

    async def read_file(self, args: ReadFile) -> str:
        resolved, refused = await self._gate_path(args.path, "read")
        if refused:
            return refused
        data = resolved.read_bytes()
        if b"\0" in data[:8192]:
            return f"{resolved} is a binary file ({len(data):,} bytes)."
        lines = data.decode(errors="replace").splitlines(keepends=True)
        start = max(1, 1 if args.offset is None else args.offset)
        chosen = lines[start - 1 : start - 1 + max(1, 2000 if args.limit is None else args.limit)]
        text = "".join(chosen)
        if start > 1 or start - 1 + len(chosen) < len(lines):
            text = f"[lines {start}-{start + len(chosen) - 1} of {len(lines)}]\n" + text
        if len(text.encode()) > self.output_limit:
            text = truncate_middle(text, self.output_limit - 100) + "\n[read fewer lines with offset/limit]"
        return text or "(empty file)"

    async def write_file(self, args: WriteFile) -> str:
        resolved, refused = await self._gate_path(args.path, "write")
        if refused:
            return refused
        resolved.parent.mkdir(parents=True, exist_ok=True)
        resolved.write_text(args.content)
        return f"wrote {len(args.content.encode()):,} bytes to {resolved}"

    async def edit_file(self, args: EditFile) -> str:
        resolved, refused = await self._gate_path(args.path, "write")
        if refused:
            return refused
        text = resolved.read_text()
        count = text.count(args.old_string) if args.old_string else 0
        if count != 1:
            return f"error: old_string occurs {count} times in {resolved}; it must occur exactly once " + (
                "(include more surrounding lines)" if count else "(check it against read_file)"
            )
        resolved.write_text(text.replace(args.old_string, args.new_string, 1))
        return f"edited {resolved}: replaced 1 occurrence"

    async def list_files(self, args: ListFiles) -> str:
        resolved, refused = await self._gate_path(args.path or ".", "read")
        if refused:
            return refused
        if not resolved.is_dir():
            return f"error: {resolved} is not a directory"
        lines = _listing(resolved, max(1, 2 if args.depth is None else args.depth))
        if len(lines) >= MAX_LISTED:
            lines.append(f"[listing capped at {MAX_LISTED} entries]")
        return f"{resolved}:\n" + ("\n".join(lines) or "(empty)")

    async def load_skill(self, args: LoadSkill) -> str:
        try:
            text = briefing.load_skill(args.name)
        except KeyError as exc:
            return f"error: {exc.args[0]}"
        self.loaded_skills.append(args.name)
        return text


def _listing(root: Path, depth: int) -> list[str]:
    """Indented entries (directories first, files with sizes), at most MAX_LISTED of them."""
    lines: list[str] = []

    def walk(directory: Path, level: int) -> None:
        indent = "  " * level
        try:
            entries = sorted(directory.iterdir(), key=lambda e: (not e.is_dir(), e.name))
        except OSError as exc:
            lines.append(f"{indent}(cannot list: {exc})")
            return
        for entry in entries:
            if len(lines) >= MAX_LISTED:
                return
            if entry.is_dir():
                lines.append(f"{indent}{entry.name}/")
                if entry.name not in SKIP_DIRS and level + 1 < depth:
                    walk(entry, level + 1)
            else:
                with contextlib.suppress(OSError):
                    lines.append(f"{indent}{entry.name}  ({entry.stat().st_size:,} bytes)")

    walk(root, 0)
    return lines


def _holding(pids: list[int], path: Path) -> list[int]:
    """Those of `pids` that have `path` open: the background jobs a shell command left running
    with their output in its log."""
    target, holders = os.path.realpath(path), []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if any(os.path.realpath(f.path) == target for f in psutil.Process(pid).open_files()):
                holders.append(pid)
    return holders
