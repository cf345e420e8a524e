"""What a fetch asks for (a repo, its type, a revision, file patterns) and whether it is usable.

Light on purpose: a goal's `goaltender fetch` and the runner check a spec here before anything
is downloaded, and neither imports the download code (runner/hub.py, which imports
huggingface_hub's client with the environment it finds). The repo id is checked by
huggingface_hub's own validator; a revision must look like a branch, tag or commit (huggingface_hub
names a file in the cache after it, so no `..` or leading `/`), and patterns are plain text. The
runner passes a spec to its download process as arguments, never through a shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

RepoType = Literal["model", "dataset"]
MAX_REVISION_CHARS = 255
MAX_PATTERNS = 100
MAX_PATTERN_CHARS = 1000

# Branches, tags and commits as the hub names them: main, v1.0, refs/pr/1, a commit's hash.
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=/-]*", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class FetchSpec:
    repo: str
    repo_type: RepoType = "model"
    revision: str | None = None  # a branch, tag or commit; None: the hub's default, main
    include: tuple[str, ...] = ()  # glob patterns of the files wanted; none: every file

    @property
    def what(self) -> str:
        return f"{self.repo_type} {self.repo}"


class FetchFailed(Exception):
    """The fetch did not happen; the message says why in one line, and what to do."""


def spec_problem(spec: FetchSpec) -> str | None:
    """What makes `spec` unusable before the hub is asked (None: nothing)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # ~0.1 s: only when asked

    try:
        validate_repo_id(spec.repo)
    except HFValidationError:
        return f"not a repo id: {spec.repo[:80]!r} (expected owner/name, e.g. Qwen/Qwen3-0.6B)"
    return _revision_problem(spec.revision) or _patterns_problem(spec.include)


def _revision_problem(revision: str | None) -> str | None:
    if revision is None:
        return None
    if not revision.strip():
        return "the revision is empty"
    if (
        len(revision) > MAX_REVISION_CHARS
        or not _REVISION.fullmatch(revision)
        or ".." in revision
        or "//" in revision
        or revision.endswith("/")
    ):
        return f"not a revision: {revision[:80]!r} (a branch, tag or commit, e.g. main, v1.0 or refs/pr/1)"
    return None


def _patterns_problem(patterns: tuple[str, ...]) -> str | None:
    if len(patterns) > MAX_PATTERNS:
        return f"{len(patterns)} --include patterns: at most {MAX_PATTERNS}"
    for pattern in patterns:
        if not pattern.strip():
            return "an --include pattern is empty"
        # `--` alone: argparse takes it for the end of options, even as `--include=--`.
        if len(pattern) > MAX_PATTERN_CHARS or _CONTROL.search(pattern) or pattern == "--":
            return (
                f"not a file pattern: {pattern[:80]!r} (a glob such as '*.json', of at most "
                f"{MAX_PATTERN_CHARS} characters, without control characters)"
            )
    return None
