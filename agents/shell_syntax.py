"""Shell text split into what will run, for the command policy (policy.py) to judge.

Not a shell parser: enough of bash's syntax to find each simple command (its words and where its
output is redirected), the command substitutions that run too, and the heredoc bodies that are
only data. Text it cannot lex raises ValueError; the policy asks a person about that.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection
from dataclasses import dataclass, field

# Stands in for a command substitution in the outer command's words: its value is unknowable.
PLACEHOLDER = "__SUBST__"

FORK_BOMB = re.compile(r":\s*\(\s*\)\s*\{\s*:\s*\|\s*:\s*&\s*\}")
_SUBSTITUTION = re.compile(r"\$\(([^()]*)\)|`([^`]*)`")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1[^\n]*\n(.*?)^\s*\2\s*$", re.S | re.M)
_OPERATOR_CHARS = "();<>|&"


@dataclass
class SimpleCommand:
    words: list[str] = field(default_factory=list)
    writes_to: list[str] = field(default_factory=list)  # targets of its output redirections


def without_data(text: str) -> str:
    """The text with line continuations joined and heredoc bodies (data, not commands) dropped."""
    text = text.replace("\\\n", " ")
    return _HEREDOC.sub(lambda m: f"<<{m.group(2)}\n", text)


def substitutions(text: str) -> list[str]:
    """The commands inside $(...) and `...`: they run too."""
    return [m.group(1) if m.group(1) is not None else m.group(2) for m in _SUBSTITUTION.finditer(text)]


def simple_commands(text: str) -> list[SimpleCommand]:
    """The simple commands of `text` (substitutions replaced by PLACEHOLDER), split at ; & | ( )
    and newlines. ValueError when the text cannot be lexed (an unclosed quote)."""
    text = _SUBSTITUTION.sub(f" {PLACEHOLDER} ", text)
    lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    commands = [SimpleCommand()]
    i = 0
    while i < len(tokens):
        token, current = tokens[i], commands[-1]
        if not token or not all(c in _OPERATOR_CHARS for c in token):
            current.words.append(token)
        elif "<" in token or ">" in token:
            target = tokens[i + 1] if i + 1 < len(tokens) else ""
            if current.words and current.words[-1].isdigit():
                current.words.pop()  # `2>` names a file descriptor, not an argument
            duplicates_a_descriptor = token.endswith("&") and (target.isdigit() or target == "-")
            if ">" in token and not duplicates_a_descriptor:
                current.writes_to.append(target)
            i += 1  # the target is not a word of the command
        else:
            commands.append(SimpleCommand())
        i += 1
    return commands


def options_and_args(
    args: list[str], with_value: Collection[str] = frozenset()
) -> tuple[list[str], list[str]]:
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
