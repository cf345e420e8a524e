"""Context compaction for the built-in agent, as pure functions over Chat Completions messages.

When the conversation nears the model's window, the agent keeps the latest turns verbatim and
replaces the older ones by a recap: one line per step (what the model said, each tool call and
its result, each message from a person), under the runner's ledger. The brief in the system
message is rebuilt separately (openai_agent.py), so the goal and the latest handoff survive.
"""

from __future__ import annotations

import json
from typing import Any

from goaltender.agents.output import one_line, truncate_middle

Message = dict[str, Any]
Group = list[Message]

COMPACT_NOTE = "[Context compacted"


def estimate_tokens(obj: Any) -> int:
    """A rough token count (~4 characters a token) of anything JSON can hold."""
    return len(json.dumps(obj, ensure_ascii=False)) // 4 + 1


def turn_groups(history: list[Message]) -> list[Group]:
    """Messages grouped so that a tool result never leaves its assistant call: each group starts
    at a user or assistant message."""
    groups: list[Group] = []
    for message in history:
        if message["role"] == "tool" and groups:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def split_history(groups: list[Group], tail_tokens: int) -> tuple[list[Group], list[Group]]:
    """(older groups to recap, latest groups to keep verbatim within `tail_tokens`). When even the
    last group is over the budget, it is kept with its long contents cut down."""
    keep: list[Group] = []
    used = 0
    for group in reversed(groups):
        cost = estimate_tokens(group)
        if used + cost > tail_tokens:
            break
        keep.insert(0, group)
        used += cost
    if not keep and groups:
        keep = [shrink(groups[-1], tail_tokens * 4)]
    return groups[: len(groups) - len(keep)], keep


def shrink(group: Group, budget_chars: int) -> Group:
    """The group with each long text content cut to its share of `budget_chars`."""
    share = max(200, budget_chars // max(1, len(group)))
    shrunk = []
    for message in group:
        if isinstance(message.get("content"), str) and len(message["content"]) > share:
            message = {**message, "content": truncate_middle(message["content"], share)}
        shrunk.append(message)
    return shrunk


def recap_lines(group: Group) -> list[str]:
    """One group of turns as recap lines: a person's message, an instruction, or what the model
    said and each tool call with its result."""
    first = group[0]
    if first["role"] == "user":
        content = first.get("content") or ""
        if content.startswith("Message from "):
            return [f"- {one_line(content, 600)}"]
        return [f"- (instruction) {one_line(content, 200)}"]
    lines = []
    if first.get("content"):
        lines.append(f"- you said: {one_line(first['content'], 400)}")
    results = {m.get("tool_call_id"): m.get("content", "") for m in group[1:]}
    for call in first.get("tool_calls") or []:
        fn = call["function"]
        result = one_line(results.get(call["id"], "(no result)"), 360)
        lines.append(f"- {fn['name']}({one_line(fn['arguments'], 240)}) → {result}")
    return lines


def recap_text(lines: list[str], *, ledger: str | None, turn: int, compaction: int, window: int) -> str:
    """The user message that stands in for the older turns: the ledger, then the recap lines
    (the oldest dropped first when they pass ~20% of the window)."""
    budget = window * 4 // 5  # ~20% of the window, in characters
    lines = list(lines)
    omitted = 0
    while lines and sum(len(line) + 1 for line in lines) > budget:
        lines.pop(0)
        omitted += 1
    head = (
        f"{COMPACT_NOTE} at turn {turn} (#{compaction}): the older part of this "
        "conversation was replaced by the recap below. The system message holds the current "
        "brief: goal, stop rule, budgets, skills, steering and your latest diary handoff.]"
    )
    ledger_text = truncate_middle(ledger, window * 4 // 7) if ledger else "(no experiments yet)"
    body = [
        head,
        "",
        "## Ledger (from the runner)",
        "",
        ledger_text,
        "",
        "## Earlier steps (oldest first)",
        "",
    ]
    if omitted:
        body.append(f"({omitted} earlier steps omitted)")
    body += lines or ["(none)"]
    body += ["", "Go on from the latest step; write a diary handoff if yours is out of date."]
    return "\n".join(body)
