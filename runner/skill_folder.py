"""The box's skill folder ($GOALTENDER_HOME/skills): the skills every agent on this box reads, kept
in a git repository so that each change is a commit naming its goal, its approver and why, and
any change can be reverted.

It is seeded from the skills that ship with goaltender on first use ("shipped skills <version>").
After that only the runner writes it: an agent proposes an edit (`goaltender skills edit`), a
person approves the diff, the runner applies and commits it; an operator reads the history and
reverts (`goaltender skills log|revert`). Agents see the folder read-only in their sandbox.

Everything here blocks (files, `git`): the daemon calls it in a thread, one change at a time.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent.parent / "skills"
MAX_SKILL_FILE = 64 * 1024  # bytes: a skill is instructions to read, not a place for data
MAX_DIFF_CHARS = 12_000  # of the diff shown to the approvers (the approval's detail)
SKILL_NAME = re.compile(r"[a-z0-9-]{1,64}")
FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")  # no leading dot: no .git, no ..
FRONT_NAME = re.compile(r"^name:\s*(.+?)\s*$", re.M)
_IDENTITY = ["-c", "user.name=goaltender runner", "-c", "user.email=runner@goaltender.invalid"]
_QUIET = ["-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", "-c", "init.defaultBranch=main"]


class SkillEditError(ValueError):
    """An edit or a revert the folder refuses; the message says why, for the one who asked."""


@dataclass(frozen=True)
class ProposedEdit:
    skill: str
    path: str  # inside the skill's folder: SKILL.md or references/<file>
    old: str | None  # the file as it was when proposed (None: a new file)
    new: str
    diff: str

    @property
    def where(self) -> str:
        return f"{self.skill}/{self.path}"


@dataclass(frozen=True)
class SkillCommit:
    commit: str  # short hash
    at: datetime
    subject: str


class SkillFolder:
    def __init__(self, root: Path, shipped: Path = SHIPPED):
        self.root = root
        self.shipped = shipped

    # ---- the repository ----

    def ensure(self) -> None:
        """Seed the folder from the shipped skills unless it is already a repository."""
        if (self.root / ".git").exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        if self.shipped.is_dir():
            shutil.copytree(
                self.shipped, self.root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        self._git("init", "--quiet")
        self._git("add", "--all")
        self._git("commit", "--quiet", "--allow-empty", "-m", f"shipped skills {_version()}")

    def _git(self, *args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *_IDENTITY, *_QUIET, *args],
                cwd=self.root,
                capture_output=True,
                text=True,
                timeout=60,
                env=_git_env(),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SkillEditError(f"git cannot run in {self.root}: {exc}") from exc
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise SkillEditError(
                f"git {args[0]} failed in {self.root}: {why[-1] if why else done.returncode}"
            )
        return done.stdout

    def head(self) -> str:
        return self._git("rev-parse", "--short", "HEAD").strip()

    # ---- edits ----

    def propose(self, skill: str, path: str, content: str) -> ProposedEdit:
        """The edit as a diff against the folder; SkillEditError when it may not be made."""
        target = self._target(skill, path)
        old = target.read_text() if target.is_file() else None
        if old is None and target.exists():
            raise SkillEditError(f"{skill}/{path} is not a file")
        check_content(skill, path, content)
        if old == content:
            raise SkillEditError(f"{skill}/{path} already says exactly this: nothing to change")
        return ProposedEdit(skill, path, old, content, unified_diff(f"{skill}/{path}", old, content))

    def _target(self, skill: str, path: str) -> Path:
        if not SKILL_NAME.fullmatch(skill):
            raise SkillEditError(f"{skill[:70]!r} is not a skill name: lower-case letters, digits and '-'")
        parts = path.split("/")
        if path.startswith("/") or ".." in parts or not all(FILE_NAME.fullmatch(part) for part in parts):
            raise SkillEditError(
                f"{path[:100]!r} is not a file of a skill: SKILL.md or references/<name>, "
                "no '..', no absolute path"
            )
        if not (path == "SKILL.md" or (len(parts) == 2 and parts[0] == "references")):
            raise SkillEditError(f"{path[:100]!r}: a skill edit changes SKILL.md or references/<name>")
        if not (self.root / skill).is_dir() and path != "SKILL.md":
            raise SkillEditError(f"there is no skill {skill!r} yet: a new skill starts with its SKILL.md")
        target = self.root / skill / path
        if not target.resolve().is_relative_to(self.root.resolve()):  # a link inside the folder
            raise SkillEditError(f"{skill}/{path} leads outside the skill folder")
        return target

    def apply(self, edit: ProposedEdit, message: str) -> str:
        """Write the approved edit and commit it; the commit's short hash. Refused when the file
        changed since the diff was shown: what was approved would no longer be what gets applied."""
        target = self._target(edit.skill, edit.path)
        now = target.read_text() if target.is_file() else None
        if now != edit.old:
            raise SkillEditError(
                f"{edit.where} changed since this edit was proposed; propose it again on the new text"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(edit.new)
        self._git("add", "--", f"{edit.skill}/{edit.path}")
        self._git("commit", "--quiet", "-m", message)
        return self.head()

    # ---- history ----

    def log(self, limit: int) -> list[SkillCommit]:
        out = self._git("log", f"--max-count={limit}", "--format=%h%x09%cI%x09%s")
        commits = []
        for line in out.splitlines():
            commit, at, subject = line.split("\t", 2)
            commits.append(SkillCommit(commit, datetime.fromisoformat(at), subject))
        return commits

    def revert(self, commit: str, by: str) -> tuple[str, str]:
        """Undo one commit with a new one naming who asked: (the new commit, the undone subject)."""
        if not re.fullmatch(r"[0-9a-f]{4,40}", commit):
            raise SkillEditError(f"{commit[:50]!r} is not a commit hash")
        try:
            full = self._git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").strip()
        except SkillEditError:
            raise SkillEditError(
                f"no commit {commit} in the skill folder (`goaltender skills log`)"
            ) from None
        if not self._git("rev-list", "--parents", "-n", "1", full).split()[1:]:
            raise SkillEditError(f"{commit} is the shipped skills themselves; revert the edits after it")
        subject = self._git("log", "-n", "1", "--format=%s", full).strip()
        try:
            self._git("revert", "--no-commit", full)
        except SkillEditError as exc:
            self._abort_revert()
            raise SkillEditError(
                f"{commit} cannot be reverted cleanly (later edits changed it): {exc}"
            ) from None
        if not self._git("status", "--porcelain"):
            raise SkillEditError(f"{commit} is undone already: reverting it changes nothing")
        self._git("commit", "--quiet", "-m", f"Revert {full[:7]}: {subject}\n\nreverted by {by}")
        return self.head(), subject

    def _abort_revert(self) -> None:
        try:
            self._git("revert", "--abort")
        except SkillEditError:
            self._git("reset", "--quiet", "--hard", "HEAD")  # no revert in progress: drop what it left


def check_content(skill: str, path: str, content: str) -> None:
    size = len(content.encode())
    if size > MAX_SKILL_FILE:
        raise SkillEditError(
            f"{skill}/{path} would be {size:,} bytes, over the {MAX_SKILL_FILE:,} a skill file may hold"
        )
    if "\0" in content:
        raise SkillEditError(f"{skill}/{path} must be text (it holds a NUL)")
    if path == "SKILL.md":  # else the agents' skill list would not show it, or under another name
        front = content.split("---")[1] if content.startswith("---") else ""
        named = FRONT_NAME.search(front)
        if not named or named.group(1).strip("\"'") != skill:
            raise SkillEditError(
                f"{skill}/SKILL.md must begin with front matter naming it: ---, name: {skill}, description: …, ---"
            )


def unified_diff(where: str, old: str | None, new: str) -> str:
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{where}" if old is not None else "/dev/null",
        tofile=f"b/{where}",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def diff_for_people(diff: str, limit: int = MAX_DIFF_CHARS) -> str:
    """The diff in a ```diff block, cut at whole lines when long, saying how much is left out."""
    if len(diff) > limit:
        shown = diff[:limit].rsplit("\n", 1)[0] + "\n"
        left = diff.count("\n") - shown.count("\n")
        return f"```diff\n{shown}```\n(diff truncated: {left} more lines not shown)"
    return f"```diff\n{diff}```"


def _git_env() -> dict[str, str]:
    # The box's own git config may sign, hook or template commits; none of it belongs here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return env | {"GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}


def _version() -> str:
    try:
        return metadata.version("goaltender")
    except metadata.PackageNotFoundError:
        return "(unknown version)"
