"""Context compaction for the built-in agent, as pure functions over Chat Completions messages.

When the conversation nears the model's window, the latest turns stay verbatim and the older
ones are replaced by a recap: one line per step (what the model said, each tool call with its
result, each message from a person) under the runner's ledger. The brief in the system message
is rebuilt by the agent, so the goal and the latest diary handoff survive every compaction.
"""

from __future__ import annotations

import json
from typing import Any

from goaltender.agents.tool_output import one_line, truncate_middle

Message = dict[str, Any]

COMPACT_NOTE = "[Context compacted"


def estimate_tokens(obj: Any) -> int:
    """A rough token count (~4 characters a token) of anything JSON can hold."""
    return len(json.dumps(obj, ensure_ascii=False)) // 4 + 1


def turn_groups(history: list[Message]) -> list[list[Message]]:
    """Messages grouped so that a tool result never leaves its assistant call: each group starts
    at a user or assistant message."""
    groups: list[list[Message]] = []
    for message in history:
        if message["role"] == "tool" and groups:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def compact(history: list[Message], budget: int) -> tuple[list[str], list[Message], int]:
    """Split `history` (no system message, no earlier recap) into recap lines for the older turns
    and the latest turns kept verbatim, up to `budget` tokens. When not even the latest turn fits,
    it is cut (texts and tool-call arguments); when even that does not fit (or `budget` is 0), it
    is recapped too. Returns (lines, kept messages, turns recapped)."""
    groups = turn_groups(history)
    kept: list[list[Message]] = []
    used = 0
    for group in reversed(groups):
        used += estimate_tokens(group)
        if used > budget:
            break
        kept.insert(0, group)
    if not kept and groups and budget > 0:
        latest = shrink(groups[-1], budget * 4)
        if estimate_tokens(latest) <= budget:
            kept = [latest]  # the latest turn stays, cut to fit
        # else: too many parts to fit even cut (hundreds of tool calls): it is recapped as well
    older = groups[: len(groups) - len(kept)]
    lines = [line for group in older for line in recap_lines(group)]
    return lines, [message for group in kept for message in group], len(older)


def shrink(group: list[Message], budget_chars: int) -> list[Message]:
    """The group with each long text and each long tool call's arguments cut in the middle, to fit
    ~`budget_chars` in all (each part keeps at least 200 characters)."""
    parts = sum(1 + len(m.get("tool_calls") or []) for m in group)
    share = max(200, budget_chars // max(1, parts))
    return [_shrink_message(m, share) for m in group]


def _shrink_message(message: Message, share: int) -> Message:
    shrunk = dict(message)
    if isinstance(message.get("content"), str) and len(message["content"]) > share:
        shrunk["content"] = truncate_middle(message["content"], share)
    if message.get("tool_calls"):
        shrunk["tool_calls"] = [_shrink_call(call, share) for call in message["tool_calls"]]
    return shrunk


def _shrink_call(call: Message, share: int) -> Message:
    """The call with its arguments cut, still a JSON object (endpoints refuse anything else)."""
    arguments = call["function"]["arguments"]
    if len(arguments) <= share:
        return call
    # Half the share: escaping the quotes of the cut text may grow it.
    cut = json.dumps({"arguments_cut_to_fit_the_context": truncate_middle(arguments, share // 2)})
    return {**call, "function": {**call["function"], "arguments": cut}}


def recap_lines(group: list[Message]) -> list[str]:
    """One turn in a line or a few: a person's message, or what the model said and called."""
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
        name, arguments = call["function"]["name"], one_line(call["function"]["arguments"], 240)
        result = one_line(results.get(call["id"], "(no result)"), 360)
        lines.append(f"- {name}({arguments}) → {result}")
    return lines


def recap_text(
    lines: list[str], ledger: str | None, *, turn: int, compactions: int, budget_chars: int
) -> str:
    """The message that stands for the older turns: the runner's ledger (at most half of
    `budget_chars`), then the latest recap lines that fit the rest (`ledger` None: no experiments
    yet)."""
    budget = max(400, budget_chars)
    ledger_text = truncate_middle(ledger, budget // 2) if ledger is not None else "(no experiments yet)"
    room = budget - len(ledger_text) - 600  # the note around them
    lines = list(lines)
    omitted = 0
    while lines and sum(len(line) + 1 for line in lines) > room:
        lines.pop(0)
        omitted += 1
    body = [
        f"{COMPACT_NOTE} at turn {turn} (#{compactions}): the older part of this conversation was "
        "replaced by the recap below. The system message holds the current brief: goal, stop rule, "
        "budgets, skills, steering and your latest diary handoff.]",
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
