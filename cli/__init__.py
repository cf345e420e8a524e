"""`goaltender`: run the runner or the demo, drive goals, and — for agents — the research verbs.

The entry point: main() finds the verb in argv, builds that verb's parser alone (from the table in
commands/__init__.py, which imports the verb's module then and not before), runs it, and turns what
went wrong into one line and an exit code. Each verb's parser and `run()` are in its audience's
module: commands/box.py, commands/operator.py, commands/agent.py. Shared pieces: common.py (exit
codes, UsageError, argument types, the parser) and talk.py (reaching the runner)."""

from __future__ import annotations

import argparse
import os
import sys

from goaltender.cli.commands import ALIASES, COMMANDS, GROUPS, CommandInfo
from goaltender.cli.common import (
    EXIT_BUDGET,
    EXIT_CODES,
    EXIT_EXPIRED,
    EXIT_NO,
    EXIT_OK,
    EXIT_RUNNER,
    EXIT_USAGE,
    Parser,
    UsageError,
    check_text_arguments,
    path,
    plain_terminal,
)
from goaltender.protocol.quick_client import RunnerRefused, RunnerUnavailable

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from goaltender.cli.common import Command

__all__ = [
    "EXIT_BUDGET",
    "EXIT_EXPIRED",
    "EXIT_NO",
    "EXIT_OK",
    "EXIT_RUNNER",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

DESCRIPTION = """\
Goaltender runs ML research goals as budgeted campaigns on this machine and reports
every step (milestones, experiment rows, approval prompts, plots, a final report).

  goaltender demo                 watch a whole campaign end to end, no Slack needed
  goaltender runner               start the runner daemon (one per GPU box)
  goaltender bot                  run the Slack bot (tokens from an app made from manifest.yml)
  goaltender fetch OWNER/NAME     a model or data set from the hub (or a mirror) into the cache
  goaltender doctor               check this box is ready for campaigns, one line each
  goaltender service install      run the runner and the bot as systemd services

Operators (and the Slack bot) drive goals: submit, status, summary, steer, budget,
                                          pause, resume, stop, approve, reject, events,
                                          log, audit, disk-usage, skills log|revert
Agents report from inside a goal:         milestone, metrics, experiment, nemo-rl, ask,
                                          inbox, diary, report, skills edit
Operators are the users and @groups the runner allows (GOALTENDER_OPERATORS; default: its own
user; docs/deploy.md); the runner knows them by the socket's peer uid. Agent verbs read GOALTENDER_GOAL_ID and
GOALTENDER_SOCKET (the goal's own socket, which serves the agent verbs only) from the
environment the runner gives them."""

OWN_DISPLAY = {"demo", "runner", "bot"}  # long-running: they style their own output, and clean what they show

LISTING = ""  # build_parser(LISTING): every verb named (for --help), none of their arguments


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verb = _verb_in(argv)
    if verb not in OWN_DISPLAY:
        plain_terminal()
    parser = build_parser(only=LISTING if verb is None else verb)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        check_text_arguments(args)
        return args.func(args)
    except UsageError as exc:
        print(f"goaltender: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RunnerRefused as exc:
        print(f"goaltender: the runner refused: {exc.message}", file=sys.stderr)
        return EXIT_BUDGET if exc.code == "budget_exhausted" else EXIT_RUNNER
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `goaltender events | head`: the reader has gone, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except RunnerUnavailable as exc:
        print(f"goaltender: {exc}", file=sys.stderr)
        return EXIT_RUNNER
    except Exception as exc:
        from goaltender.runner.config import settings_problem  # on this path only: it imports pydantic

        if (problem := settings_problem(exc)) is None:
            raise
        print(f"goaltender: {problem}", file=sys.stderr)
        return EXIT_USAGE


def _verb_in(argv: list[str]) -> str | None:
    """The verb `argv` names (the first word that is no option), as far as can be told cheaply."""
    words = iter(argv)
    for word in words:
        if word == "--socket":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb, or, when `only` names one (or a group, or an old name), of that one
    alone; LISTING: every verb named, none built. A name that is no verb gets the whole parser, whose
    error lists them."""
    if only == LISTING:
        return _listing()
    if only is not None:
        only = ALIASES.get(only, only)
        names = [name for name in COMMANDS if only in (name, name.partition(" ")[0])]
        if names:
            return _parser(names)
    return _parser(list(COMMANDS))


def _top() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = Parser(prog="goaltender", description=DESCRIPTION, epilog=EXIT_CODES)
    parser.add_argument(
        "--socket", type=path, help="runner socket (default: $GOALTENDER_SOCKET or ~/.goaltender)"
    )
    return parser, parser.add_subparsers(metavar="command")


def _listing() -> argparse.ArgumentParser:
    """Every verb with its summary (`goaltender --help`), without building any: no -h of their own
    (a third of each one's cost) and no module of theirs imported."""
    parser, verbs = _top()
    for name, info in COMMANDS.items():
        group = name.partition(" ")[0]
        if group in GROUPS:
            if group not in verbs.choices:
                verbs.add_parser(group, help=GROUPS[group].summary, add_help=False)
        else:
            verbs.add_parser(name, help=info.summary, add_help=False)
    return parser


def _parser(names: list[str]) -> argparse.ArgumentParser:
    """The parser with verbs `names` built (in the table's order), and the old names of those."""
    parser, verbs = _top()
    built: dict[str, argparse.ArgumentParser] = {}
    groups: dict[str, argparse._SubParsersAction] = {}
    for name in names:
        info = COMMANDS[name]
        group, _, word = name.partition(" ")
        where = verbs
        if word:
            if group not in groups:
                groups[group] = _group_parser(verbs, group)
            where = groups[group]
        command = _command(info)
        sub = where.add_parser(
            word or name,
            help=info.summary,
            description=command.description or info.summary.replace("%%", "%"),
            epilog=EXIT_CODES,
        )
        sub.set_defaults(func=command.run, verb=name)
        command.add_arguments(sub)
        built[name] = sub
    for alias, name in ALIASES.items():  # accepted, not listed: no help of their own
        if name in built:
            verbs.choices[alias] = built[name]
    return parser


def _group_parser(verbs: argparse._SubParsersAction, group: str) -> argparse._SubParsersAction:
    info = GROUPS[group]
    parser = verbs.add_parser(group, help=info.summary, description=info.description, epilog=EXIT_CODES)
    words = [name.partition(" ")[2] for name in COMMANDS if name.partition(" ")[0] == group]
    return parser.add_subparsers(dest="action", metavar="|".join(words), required=True)


def _command(info: CommandInfo) -> Command:
    """The verb's Command, its module imported now (by __import__: importlib is a module more)."""
    name = f"goaltender.cli.commands.{info.module}"
    __import__(name)
    command: Command = getattr(sys.modules[name], info.class_name)()
    return command
