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

FORK_BOMB = re.compile(r":\s*\(\s*\)\s*\{\s*:\s*\|\s*:\s*&\s*\}")
_SUBSTITUTION = re.compile(r"\$\(([^()]*)\)|`([^`]*)`")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1[^\n]*\n(.*?)^\s*\2\s*$", re.S | re.M)
_OPERATOR_CHARS = frozenset("();<>|&")


@dataclass
class SimpleCommand:
    words: list[str] = field(default_factory=list)
    writes_to: list[str] = field(default_factory=list)  # the targets of its output redirections


def without_data(text: str) -> str:
    """The text with line continuations joined and heredoc bodies dropped (they are data)."""
    return _HEREDOC.sub(lambda m: f"<<{m.group(2)}\n", text.replace("\\\n", " "))


def substitutions(text: str) -> list[str]:
    """The commands inside `$(...)` and backticks: they run too."""
    return [m.group(1) if m.group(1) is not None else m.group(2) for m in _SUBSTITUTION.finditer(text)]


def simple_commands(text: str) -> list[SimpleCommand]:
    """Each simple command of `text`, substitutions standing in as SUBSTITUTED. ValueError when
    the text cannot be lexed (an unbalanced quote, say)."""
    text = _SUBSTITUTION.sub(f" {SUBSTITUTED} ", text)
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
