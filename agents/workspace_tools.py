"""The built-in agent's workspace tools: a shell, file reading and editing, listings, the skills.

Every shell command passes the command policy (policy.py) first and every path outside the
workspace needs a person's approval (asked through the runner); approvals are remembered for
the session. A shell command runs as the leader of its own process group, its output going to a
file (a background job it leaves can write on, and the model can read the file later): a timeout
takes down the command and everything it started; a stop starts that at once, and `close()` ends
whatever is left, background jobs included, before the agent goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import psutil

from goaltender.agents import briefing
from goaltender.agents.bootstrap import agent_log
from goaltender.agents.policy import CommandPolicy, classify_command
from goaltender.agents.tool_output import cut_between, cut_shares, one_line, truncate_file, truncate_middle
from goaltender.agents.tool_schemas import EditFile, ListFiles, LoadSkill, ReadFile, Shell, Tool, WriteFile
from goaltender.protocol import messages as p
from goaltender.runner.supervisor import group_alive, group_members, terminate_group

log = agent_log("openai")

KILL_GRACE_S = 2.0  # SIGTERM to SIGKILL, for a shell command's process group
LISTING_CAP = 400
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

# (question, detail, kind) -> the person's decision, through the runner
Ask = Callable[[str, str, str], Awaitable[p.Approval]]


def decision(approval: p.Approval) -> str:
    """'approved by ana: go ahead', as the model is told it."""
    who = approval.decided_by or "nobody"
    return f"{approval.state} by {who}" + (f": {approval.comment}" if approval.comment else "")


def inside(path: Path, roots: Iterable[Path]) -> bool:
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
        *,
        ask: Ask,
        shell_timeout_s: float,
        output_limit: int,
        secrets: Sequence[str] = (),
    ):
        self.workspace = workspace.resolve()
        self.secrets = secrets  # redacted before output is cut, so no piece survives at the cut
        self.policy = policy
        self.ask = ask
        self.shell_timeout_s = shell_timeout_s
        self.output_limit = output_limit
        self.writable = [self.workspace, *(Path(w).expanduser().resolve() for w in policy.writable_paths)]
        self.readable = [*self.writable, *(Path(r).expanduser().resolve() for r in policy.readable_paths)]
        self.approved_commands: set[str] = set()
        self.approved_paths: set[tuple[str, Path]] = set()
        self.shell_groups: set[int] = set()  # one per shell command run, led by its bash
        self._ending: set[asyncio.Future[None]] = set()  # groups of commands cut off by a stop
        self.loaded_skills: list[str] = []

    # ---- what needs a person ----

    def is_own_pid(self, pid: int) -> bool:
        """Did one of this agent's shell commands start the process? Then it may kill it."""
        try:
            return os.getpgid(pid) in self.shell_groups
        except (ProcessLookupError, PermissionError):
            return False

    async def gate_command(self, command: str, what: str = "shell") -> tuple[bool, str]:
        """(may run, a note for the tool result), after the policy and, if it says so, a person."""
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
            "command",
        )
        if approval.state == "approved":
            self.approved_commands.add(command)
            return True, f"(Approval asked because it {verdict.reason}: {decision(approval)}.)\n"
        return False, (
            f"Not run: the command was {decision(approval)}. It needed approval because it "
            f"{verdict.reason}. Do not retry it as is; adapt your plan."
        )

    async def gate_path(self, raw: str, mode: str) -> tuple[Path, str | None]:
        """The resolved path, and None if the tool may go on, else the reason it may not."""
        path = resolve_path(raw, self.workspace)
        roots = self.readable if mode == "read" else self.writable
        if inside(path, roots) or (mode, path) in self.approved_paths:
            return path, None
        approval = await self.ask(
            f"Allow the agent to {mode} a file outside its workspace: {path}?",
            f"The {mode}_file tool was called with {raw!r}, which is outside {self.workspace}.",
            "command",
        )
        if approval.state == "approved":
            self.approved_paths.add((mode, path))
            return path, None
        return path, (
            f"Refused: {path} is outside the workspace and the request to {mode} it was {decision(approval)}."
        )

    # ---- the tools ----

    def tools(self) -> list[Tool[Any]]:
        return [
            Tool("shell", Shell, self.shell),
            Tool("read_file", ReadFile, self.read_file),
            Tool("write_file", WriteFile, self.write_file),
            Tool("edit_file", EditFile, self.edit_file),
            Tool("list_files", ListFiles, self.list_files),
            Tool("load_skill", LoadSkill, self.load_skill),
        ]

    async def shell(self, args: Shell) -> str:
        ok, note = await self.gate_command(args.command)
        if not ok:
            return note
        limit = min(args.timeout_s or self.shell_timeout_s, self.shell_timeout_s)
        log_path = self.workspace / ".agent" / "shell" / f"{len(self.shell_groups) + 1:04d}.log"
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
                # A group of its own, so a timeout can end this command and what it started; the
                # agent's session still holds it, so the runner's stop ends it with the agent.
                process_group=0,
            )
        self.shell_groups.add(proc.pid)
        timed_out = await self._wait(proc, limit)
        lingering = await asyncio.to_thread(_holders, proc.pid, log_path)
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
        room = max(100, self.output_limit - len(head.encode()) - 120)  # the cut marker fits too
        output = truncate_file(log_path, room, self.secrets) or "(no output)"
        if not lingering:
            log_path.unlink(missing_ok=True)
        return f"{head}\n{output}"

    async def _wait(self, proc: asyncio.subprocess.Process, limit: float) -> bool:
        """Wait for the command; past `limit`, or when cancelled, end its process group. Returns
        whether it timed out."""
        try:
            await asyncio.wait_for(proc.wait(), limit)
            return False
        except TimeoutError:
            await terminate_group(proc.pid, grace_s=KILL_GRACE_S)
            await proc.wait()
            return True
        except asyncio.CancelledError:
            # Stopped: the group goes down while the agent hands in its report; close() waits.
            self._ending.add(asyncio.ensure_future(terminate_group(proc.pid, grace_s=KILL_GRACE_S)))
            raise

    async def read_file(self, args: ReadFile) -> str:
        resolved, refused = await self.gate_path(args.path, "read")
        if refused:
            return refused
        return await asyncio.to_thread(self._read_lines, resolved, max(1, args.offset), max(1, args.limit))

    def _read_lines(self, path: Path, start: int, count: int) -> str:
        """Lines start.. of a regular file, read only as far as they go; cut in the middle to fit."""
        # O_NONBLOCK: opening a named pipe must not wait for a writer (it is refused just below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            return f"error: {path} is {_file_kind(mode)}, not a regular file; read_file reads files only"
        with os.fdopen(fd, "rb") as f:
            if b"\0" in f.read(8192):
                return f"{path} is a binary file ({os.fstat(f.fileno()).st_size:,} bytes)."
            f.seek(0)
            limit = self.output_limit - 100
            lines = _read_range(f, start, count, *cut_shares(limit, self.secrets))
        text = lines.text(limit, self.secrets)
        if lines.at_end and start == 1 and lines.last == lines.total:
            header = ""
        elif lines.at_end:
            header = f"[lines {start}-{lines.last} of {lines.total}]\n" if lines.last >= start else ""
            text = text or f"(no lines from {start}: the file has {lines.total})"
        else:
            header = f"[lines {start}-{lines.last}; the file goes on: offset={lines.last + 1} reads on]\n"
        if lines.size > limit:
            text += "\n[read fewer lines with offset/limit]"
        return header + text or "(empty file)"

    async def write_file(self, args: WriteFile) -> str:
        resolved, refused = await self.gate_path(args.path, "write")
        if refused:
            return refused
        resolved.parent.mkdir(parents=True, exist_ok=True)
        resolved.write_text(args.content)
        return f"wrote {len(args.content.encode()):,} bytes to {resolved}"

    async def edit_file(self, args: EditFile) -> str:
        resolved, refused = await self.gate_path(args.path, "write")
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
        resolved, refused = await self.gate_path(args.path, "read")
        if refused:
            return refused
        if not resolved.is_dir():
            return f"error: {resolved} is not a directory"
        lines = _listing(resolved, max(1, args.depth), [*self.readable, resolved])
        if len(lines) >= LISTING_CAP:
            lines.append(f"[listing capped at {LISTING_CAP} entries]")
        return f"{resolved}:\n" + ("\n".join(lines) or "(empty)")

    async def load_skill(self, args: LoadSkill) -> str:
        try:
            text = briefing.load_skill(args.name)
        except KeyError as exc:
            return f"error: {exc.args[0]}"
        self.loaded_skills.append(args.name)
        return text

    async def close(self) -> None:
        """End every shell command still running and the background jobs they left."""
        live = [pgid for pgid in self.shell_groups if group_alive(pgid)]
        await asyncio.gather(*self._ending, *(terminate_group(pgid, grace_s=KILL_GRACE_S) for pgid in live))


@dataclass
class _Range:
    """Lines read from a file: the range's first and last bytes (all of it when short), its size."""

    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    size: int = 0
    last: int = 0  # the number of the last line in the range (start - 1: none)
    total: int = 0  # lines in the file, when at_end
    at_end: bool = False

    def text(self, limit: int, secrets: Sequence[str]) -> str:
        if self.size == len(self.head) + len(self.tail):
            return truncate_middle(bytes(self.head + self.tail), limit, secrets)
        return cut_between(bytes(self.head), bytes(self.tail), self.size, limit, secrets)


def _read_range(f: BinaryIO, start: int, count: int, head_room: int, tail_room: int) -> _Range:
    """Lines start..start+count-1, keeping the first `head_room` and the last `tail_room` bytes;
    reads no further than the line after the range (to know whether the file goes on)."""
    got = _Range(last=start - 1)
    number, open_line = 1, False  # the line the next byte belongs to; has it begun?
    while chunk := f.read(1 << 16):
        for piece in chunk.splitlines(keepends=True):
            if number >= start + count:
                return got
            if number >= start:
                got.size += len(piece)
                room = max(0, head_room - len(got.head))
                got.head += piece[:room]
                got.tail += piece[room:]
                if len(got.tail) > 2 * tail_room:
                    del got.tail[: len(got.tail) - tail_room]
                got.last = number
            open_line = not piece.endswith((b"\n", b"\r"))
            number += not open_line
    got.at_end, got.total = True, number - 1 + open_line
    return got


def _file_kind(mode: int) -> str:
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)), "a device or special file")


def _listing(
    directory: Path, depth: int, roots: list[Path], level: int = 0, lines: list[str] | None = None
) -> list[str]:
    """Directories first, then files with their sizes, indented by level; SKIP_DIRS not entered,
    nor a symlink out of `roots` (the directory listed, and where the agent may read): listing
    there needs a person, like reading there."""
    lines = [] if lines is None else lines
    indent = "  " * level
    try:
        entries = sorted(directory.iterdir(), key=lambda e: (not e.is_dir(), e.name))
    except OSError as exc:
        lines.append(f"{indent}(cannot list: {exc})")
        return lines
    for entry in entries:
        if len(lines) >= LISTING_CAP:
            break
        if entry.is_symlink() and not inside(target := entry.resolve(), roots):
            lines.append(
                f"{indent}{entry.name} -> {target} (outside the workspace: listing or reading it asks first)"
            )
        elif entry.is_dir():
            lines.append(f"{indent}{entry.name}/")
            if entry.name not in SKIP_DIRS and level + 1 < depth:
                _listing(entry, depth, roots, level + 1, lines)
        else:
            with contextlib.suppress(OSError):
                lines.append(f"{indent}{entry.name}  ({entry.stat().st_size:,} bytes)")
    return lines


def _holders(pgid: int, path: Path) -> list[int]:
    """The processes of a shell command's group that still have its output file open: the
    background jobs it left running."""
    target, holders = os.path.realpath(path), []
    for pid in group_members(pgid):
        try:
            if any(os.path.realpath(f.path) == target for f in psutil.Process(pid).open_files()):
                holders.append(pid)
        except psutil.Error:
            continue
    return holders
