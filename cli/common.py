"""What every command shares: exit codes, UsageError, the Command base, the parser (argparse's, with
a cheaper formatter), argument types, the plain-terminal wrapper, and reading the goal and text
files. The standard library alone, and only what a quick agent verb pays for anyway: no pathlib,
typing, shutil or textwrap at import (tests/test_cli_speed.py)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from goaltender.display.plain import clean

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

EXIT_OK = 0
EXIT_NO = 1  # rejected approval, crashed experiment, failed fetch
EXIT_USAGE = 2  # argparse's own code for bad arguments
EXIT_EXPIRED = 3  # approval expired without a decision
EXIT_RUNNER = 4  # runner unreachable, or it refused the request
EXIT_BUDGET = 5  # experiment refused: a budget is used up

EXIT_CODES = """\
exit codes: 0 ok / approved / experiment ran (keep or discard); 1 rejected / experiment crashed /
fetch failed; 2 bad arguments; 3 approval expired; 4 runner unreachable or request refused;
5 budget used up"""

LARGEST_ID = 2**63 - 1  # ids are SQLite integers
MAX_DAYS = 100_000  # as protocol/messages.py Prune (273 years: a date before year 1 cannot be)


class UsageError(Exception):
    """Bad input on the command line: said in one line on stderr, exit code 2 (as argparse does).

    Found before the runner is asked, so the same input gets the same answer with or without one."""


class Command:
    """One verb: the arguments its parser takes, beside what it does. The table in
    commands/__init__.py names it (with the one-line summary `goaltender --help` lists) and imports
    its module only when it runs; `description` is what `goaltender VERB --help` says (default: the
    summary)."""

    description = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The verb's own arguments: none unless it says."""

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


# ---- the parser ----


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's, as every verb builds it and few show it: without shutil and textwrap (a
    fifteenth of a quick verb's start-up), as argparse makes a formatter for every argument.
    The width is the terminal's as shutil.get_terminal_size() tells it; descriptions, written
    indented, are dedented when shown."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ):
        super().__init__(prog, indent_increment, max_help_position, width or _columns() - 2)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return super()._fill_text(textwrap.dedent(text), width, indent)


class Parser(argparse.ArgumentParser):
    """argparse's, with Formatter; its subparsers are made of this class too."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(**kwargs)


def _columns() -> int:
    """The terminal's width: $COLUMNS, else the width of stdout's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


# ---- argument types (argparse says what is wrong, naming the type by its __name__) ----


def _int_in(text: str, low: int, high: int, not_one: str, outside: str) -> int:
    """`text` as a whole number from `low` to `high`; argparse's error, in these words, when not."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{not_one}: {text[:40]!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text[:40]} {outside}")
    return value


def whole_number(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to the largest id."""

    def whole(text: str) -> int:
        return _int_in(
            text, low, LARGEST_ID, "not a whole number", f"is out of range: use {low} to {LARGEST_ID}"
        )

    whole.__name__ = "id" if low else "count"
    return whole


ID = whole_number(1)
COUNT = whole_number(0)


def port(text: str) -> int:
    """An argparse type: a TCP port (1 to 65535)."""
    return _int_in(text, 1, 65535, "not a port number", "is not a port: use 1 to 65535")


def days(text: str) -> int:
    """An argparse type: a number of days (1 to MAX_DAYS)."""
    return _int_in(
        text, 1, MAX_DAYS, "not a whole number of days", f"is out of range: use 1 to {MAX_DAYS} days"
    )


def finite(text: str) -> float:
    """An argparse type: a finite number (not nan or inf: the runner records numbers as JSON)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text[:40]!r}")
    return value


finite.__name__ = "number"


def path(text: str) -> Path:
    """An argparse type: a path (pathlib imported when a command takes one, not before)."""
    from pathlib import Path

    return Path(text)


def goal_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--goal", type=ID, dest="goal_id", help="goal id (default: $GOALTENDER_GOAL_ID)")


def goal_id(args: argparse.Namespace) -> int:
    """--goal, else GOALTENDER_GOAL_ID (the runner sets it for agents)."""
    if args.goal_id is not None:
        return int(args.goal_id)
    if value := os.environ.get("GOALTENDER_GOAL_ID"):
        try:
            return ID(value)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"GOALTENDER_GOAL_ID is not a goal id ({exc}); pass --goal N") from None
    raise UsageError("no goal: pass --goal N or set GOALTENDER_GOAL_ID (the runner sets it for agents)")


# ---- text in and out ----


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text_arguments(args: argparse.Namespace) -> None:
    """Every text argument is UTF-8: the runner takes JSON text (a path may be any bytes: not checked).

    Python hands undecodable argv bytes over as lone surrogates; they could never be sent."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and not is_utf8(text):
                shown = text.encode("utf-8", "surrogateescape")[:40]
                raise UsageError(f"{name.replace('_', ' ')}: {shown!r} is not UTF-8; the runner takes text")


def read_text(read: Callable[[], bytes], what: str) -> str:
    """Text from a file or stdin, which must be UTF-8 (the runner takes text)."""
    try:
        data = read()
    except (OSError, ValueError) as exc:  # ValueError: a path with a NUL in it
        raise UsageError(f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_file_or_stdin(name: str) -> str:
    """The text of file `name`, or of stdin for `-`."""
    if name == "-":
        return read_text(sys.stdin.buffer.read, "stdin")
    return read_text(path(name).read_bytes, name)


class PlainTerminal:
    """A terminal's stream that shows text without its control characters (display/plain.py)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(clean(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def plain_terminal() -> None:
    """What the runner sends back (goal texts, agents' questions, notes and reports, Slack users'
    messages, runs' logs) reaches a terminal without control characters, which it would obey; piped
    or redirected, output stays exact, as ls's does."""
    for name in ("stdout", "stderr"):
        try:
            shown = getattr(sys, name).isatty()
        except (AttributeError, ValueError):  # none, or closed
            shown = False
        if shown:
            setattr(sys, name, PlainTerminal(getattr(sys, name)))
