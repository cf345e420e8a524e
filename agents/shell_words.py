"""Shell text split into the simple commands that will run, for the command policy (policy.py).

Not a shell parser: enough of bash's syntax to find each simple command (its words, and where its
output is redirected), the command substitutions that run too, and the heredoc bodies that are
only data.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection
from dataclasses import dataclass, field

# Stands for a command substitution in the outer command's words: its value cannot be known.
SUBSTITUTED = "__SUBST__"
# Stands for a process substitution, `<(...)` or `>(...)`: bash passes a /dev/fd path.
PROCESS_FILE = "/dev/fd/63"

FORK_BOMB = re.compile(r":\s*\(\s*\)\s*\{\s*:\s*\|\s*:\s*&\s*\}")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1[^\n]*\n(.*?)^\s*\2\s*$", re.S | re.M)
_OPERATOR_CHARS = frozenset("();<>|&")


@dataclass
class SimpleCommand:
    words: list[str] = field(default_factory=list)
    writes_to: list[str] = field(default_factory=list)  # the targets of its output redirections


def without_data(text: str) -> str:
    """The text with line continuations joined and heredoc bodies dropped (they are data), but for
    the substitutions in an unquoted one (`<<EOF`, not `<<'EOF'`): those run."""

    def body(m: re.Match[str]) -> str:
        ran = [] if m.group(1) else substitutions(m.group(3))
        return f"<<{m.group(2)}\n" + "".join(f": $({command})\n" for command in ran)

    return _HEREDOC.sub(body, text.replace("\\\n", " "))


def substitutions(text: str) -> list[str]:
    """The commands inside `$(...)`, backticks, `<(...)` and `>(...)`: they run too. Those inside
    them are found when these are checked in turn."""
    return _lift_substitutions(text)[1]


def _lift_substitutions(text: str) -> tuple[str, list[str]]:
    """(the text with each outermost substitution replaced by what stands for it, the commands
    inside them). Quote-aware: nothing in single quotes runs (it may be a `bash -c` text, checked
    as a whole); `$(...)` and backticks in double quotes do."""
    out: list[str] = []
    inner: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
        elif ch == "\\":
            out.append(text[i : i + 2])
            i += 2
            continue
        elif ch in "'\"" and quote in ("", ch):
            quote = ch if not quote else ""
        elif text.startswith("$(", i) or (not quote and text.startswith(("<(", ">("), i)):
            end = _closing_paren(text, i + 2)
            inner.append(text[i + 2 : end])
            # `$(...)` is part of its word (`MODEL=$(...)` is an assignment); `<(...)` is a word of its own
            out.append(SUBSTITUTED if ch == "$" else f" {PROCESS_FILE} ")
            i = end + 1
            continue
        elif ch == "`":
            end = text.find("`", i + 1)
            end = len(text) if end < 0 else end
            inner.append(text[i + 1 : end])
            out.append(SUBSTITUTED)
            i = end + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out), inner


def _closing_paren(text: str, start: int) -> int:
    """Index of the `)` closing a `(` just before `start` (quotes skipped); len(text) if none."""
    depth, quote, i = 1, "", start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"':
                i += 1
        elif ch == "\\":
            i += 1
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(text)


def simple_commands(text: str) -> list[SimpleCommand]:
    """Each simple command of `text`, substitutions standing in as SUBSTITUTED (or PROCESS_FILE).
    ValueError when the text cannot be lexed (an unbalanced quote, say)."""
    text = _lift_substitutions(text)[0]
    lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    commands = [SimpleCommand()]
    i = 0
    while i < len(tokens):
        token, current = tokens[i], commands[-1]
        if not (token and set(token) <= _OPERATOR_CHARS):
            current.words.append(token)
        elif "<" in token or ">" in token:
            target = tokens[i + 1] if i + 1 < len(tokens) else ""
            if current.words and current.words[-1].isdigit():
                current.words.pop()  # `2>` names a file descriptor, not an argument
            if ">" in token and not (token.endswith("&") and (target.isdigit() or target == "-")):
                current.writes_to.append(target)
            i += 1  # the target is consumed with its operator
        else:
            commands.append(SimpleCommand())
        i += 1
    return commands


def options_and_args(args: list[str], with_value: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """(options, positional arguments); an option in `with_value` takes the next word with it."""
    options: list[str] = []
    positional: list[str] = []
    i = 0
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
