"""The words between the Codex agent, Codex and people: the prompts Codex's turns start with, how
its messages are read (is the goal done? what is the report?), and its approval requests as
questions for people."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DONE_MARKER = "GOAL COMPLETE"
_DONE = re.compile(r"\bgoal complete\b|\bnothing (?:more|else|left) to do\b|\ball done\b", re.I)


def says_done(text: str) -> bool:
    """Does the message end the campaign? The brief asks for a final `GOAL COMPLETE` line."""
    tail = "\n".join(text.strip().splitlines()[-3:])
    return bool(_DONE.search(tail))


def report_text(text: str) -> str:
    """The message without its `GOAL COMPLETE` line: Codex's words for the final report."""
    lines = [line for line in text.strip().splitlines() if line.strip(" *`_#.").upper() != DONE_MARKER]
    return "\n".join(lines).strip()


def first_line(text: str, limit: int = 160) -> str:
    """The first non-empty line, without Markdown heading or emphasis marks: a milestone title."""
    line = next((s.strip() for s in text.strip().splitlines() if s.strip()), "")
    line = line.strip("#* ")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def clip(text: str, limit: int) -> str:
    """At most `limit` characters, saying how many were cut."""
    return text if len(text) <= limit else text[: limit - 20] + f"\n… ({len(text) - limit + 20} more chars)"


HOW_TO_FINISH = (
    "Commands you run may need a person's approval; if one is declined, take another route. People may "
    "send steering messages while you work: follow them. When the goal is met, or you cannot make more "
    "progress, reply with your final report (what you found, the best result, what to try next) and end "
    f"it with a line `{DONE_MARKER}`."
)


def first_prompt() -> str:
    """The first turn's words. The brief is not among them: it is AGENTS.md, which Codex reads
    itself and sends with its instructions (it was sent twice, ~5 KB of a ~55 KB first request)."""
    return (
        "Work toward the goal in AGENTS.md (above: the goal, its stop rule and budgets, how to work, "
        "the skills) now. Read the skills it names that fit the goal (`.agents/skills/<name>/SKILL.md`: "
        f"`autoresearch` always, `nemo-rl` for a training campaign) before the first run. {HOW_TO_FINISH}"
    )


def resume_prompt(brief: str) -> str:
    """A resumed thread's words: the brief as it is now (its ledger, the latest handoff), which
    the thread's history has only as it was when the thread started."""
    return (
        "The goaltender runner restarted and interrupted this session. The current brief, with the ledger "
        f"so far and the latest handoff, follows; pick up where you left off.\n\n{brief}\n---\n\n{HOW_TO_FINISH}"
    )


CONTINUE_PROMPT = (
    "Continue toward the goal (the runner enforces the budgets; check `goaltender inbox` for steering). "
    f"If the goal is met or you cannot make more progress, reply with your final report ending with `{DONE_MARKER}`."
)


# ---- why a turn failed ----

_NO_RESPONSES_API = re.compile(r"\b404\b.*?(\S*/responses)\b", re.S)
_MODEL = re.compile(r"\bmodel\b", re.I)


def turn_failure(error: str) -> str:
    """Why the goal fails when a Codex turn failed: Codex's error, and what to do about it where
    that is known. A 404 from /responses is a server without the Responses API (many local servers
    serve Chat Completions only), which Codex cannot work without."""
    said = f"the Codex turn failed: {error or 'no reason given'}"
    if (found := _NO_RESPONSES_API.search(error)) is None:
        return said
    if _MODEL.search(error):  # vLLM's 404 for a model it does not serve, on a path it has
        return f"the endpoint does not serve that model: set GOALTENDER_MODEL to one it lists. {said}"
    return (
        f"this endpoint has no Responses API ({found.group(1)} answered 404), which Codex needs: use "
        "the built-in agent, which speaks Chat Completions (`with openai` in the goal, `--agent "
        f"openai` on the command line). {said}"
    )


# ---- approval requests ----


def command_question(params: dict, workspace: Path) -> tuple[str, str, str]:
    """(question, detail, what) for a command Codex wants to run."""
    actions = [a.get("command", "") for a in params.get("commandActions") or [] if a.get("command")]
    shown = " ; ".join(actions) or params.get("command") or "(a command)"
    detail = [f"Command: {params.get('command') or shown}", f"In: {params.get('cwd') or workspace}"]
    if reason := params.get("reason"):
        detail.append(f"Reason: {reason}")
    if network := params.get("networkApprovalContext"):
        detail.append(f"Network: {json.dumps(network)}")
    return f"Codex wants to run: {clip(shown, 600)}", "\n".join(detail), shown


def file_question(params: dict, item: dict) -> tuple[str, str, str]:
    """(question, detail, what) for a file change (`item`, as Codex announced it) it wants to make."""
    changes = item.get("changes") or []
    paths = ", ".join(f"{c.get('path')} ({_change_kind(c.get('kind'))})" for c in changes)
    detail = []
    if reason := params.get("reason"):
        detail.append(f"Reason: {reason}")
    if root := params.get("grantRoot"):
        detail.append(f"Asks to write under: {root}")
    detail += [f"--- {c.get('path')}\n{c.get('diff', '')}" for c in changes]
    what = f"{len(changes)} file(s): {paths}" if changes else "files"
    return f"Codex wants to change {clip(what, 600)}", clip("\n".join(detail), 15_000), what


def permissions_question(params: dict) -> tuple[str, str, str]:
    """(question, detail, what) for more permissions Codex asks for."""
    wanted = params.get("permissions") or {}
    parts = []
    if (wanted.get("network") or {}).get("enabled"):
        parts.append("network access")
    fs = wanted.get("fileSystem") or {}
    for mode in ("write", "read"):
        if fs.get(mode):
            parts.append(f"{mode} access to {', '.join(map(str, fs[mode]))}")
    for entry in fs.get("entries") or []:
        parts.append(f"{entry.get('access')} access to {json.dumps(entry.get('path'))}")
    what = "; ".join(parts) or "more permissions"
    detail = (
        f"Reason: {params.get('reason') or '(none given)'}\nIn: {params.get('cwd')}\n{json.dumps(wanted)}"
    )
    return f"Codex asks for {clip(what, 600)}", detail, what


def _change_kind(kind: Any) -> str:
    return str(kind.get("type", kind)) if isinstance(kind, dict) else str(kind)
