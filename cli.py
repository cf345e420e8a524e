"""`goaltender`: run the runner or the demo, drive goals, and — for agents — the research verbs."""

from __future__ import annotations

import argparse
import codecs
import json
import math
import os
import sys
from collections.abc import Awaitable, Callable

from goaltender.display.plain import clean
from goaltender.runner.quick_client import RunnerRefused, RunnerUnavailable, encode, exchange, socket_from_env
from goaltender.runner.wire import INT64_MAX, INT64_MIN, MAX_LINE, MAX_POINTS

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up


class _OnFirstUse:
    """The protocol module, imported when one of its names is first read."""

    def __getattr__(self, name: str) -> object:
        from goaltender.runner import protocol

        return getattr(protocol, name)


# Every agent verb is a process of its own, so this module imports only what each verb needs:
# the rest (asyncio and the client, budget words, reports, preflight, training; pathlib and
# importlib too, a sixth of a quick verb's start-up) is imported by the commands that use it
# (tests/test_cli_speed.py checks the heavy ones stay out). So is the protocol (pydantic): the
# hottest verbs talk through runner/quick_client.py with plain JSON (test_cli_quick.py).
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from goaltender.runner import protocol as p
    from goaltender.runner.client import RunnerClient
    from goaltender.storage.records import HubFetch
else:
    p = _OnFirstUse()

EXIT_OK = 0
EXIT_NO = 1  # rejected approval, crashed experiment, failed fetch
EXIT_USAGE = 2  # argparse's own code for bad arguments
EXIT_EXPIRED = 3  # approval expired without a decision
EXIT_RUNNER = 4  # runner unreachable, or it refused the request
EXIT_BUDGET = 5  # experiment refused: a budget is used up

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
                                          log, audit
Agents report from inside a goal:         milestone, metrics, experiment, nemo-rl, ask,
                                          inbox, diary, report
Operators are the users and @groups the runner allows (GOALTENDER_OPERATORS; default: its own
user; docs/deploy.md); the runner knows them by the socket's peer uid. Agent verbs read GOALTENDER_GOAL_ID and
GOALTENDER_SOCKET (the goal's own socket, which serves the agent verbs only) from the
environment the runner gives them."""

EXIT_CODES = """\
exit codes: 0 ok / approved / experiment ran (keep or discard); 1 rejected / experiment crashed /
fetch failed; 2 bad arguments; 3 approval expired; 4 runner unreachable or request refused;
5 budget used up"""

LARGEST_ID = 2**63 - 1  # ids are SQLite integers


OWN_DISPLAY = {"demo", "runner", "bot"}  # long-running: they style their own output, and clean what they show


class PlainTerminal:
    """A terminal's stream that shows text without its control characters (display/plain.py)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(clean(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _plain_terminal() -> None:
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


class UsageError(Exception):
    """Bad input on the command line: said in one line on stderr, exit code 2 (as argparse does).

    Found before the runner is asked, so the same input gets the same answer with or without one."""


def main(argv: list[str] | None = None) -> int:
    command = _command_in(sys.argv[1:] if argv is None else argv)
    if command not in OWN_DISPLAY:
        _plain_terminal()
    parser = build_parser(only=LISTING if command is None else command)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        _check_text_arguments(args)
        return args.func(args) or EXIT_OK
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


def _whole_number(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to the largest id (argparse says what is wrong)."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
        if not low <= value <= LARGEST_ID:
            raise argparse.ArgumentTypeError(f"{text[:40]} is out of range: use {low} to {LARGEST_ID}")
        return value

    whole.__name__ = "id" if low else "count"  # argparse names the type in its message
    return whole


ID = _whole_number(1)
COUNT = _whole_number(0)


def _port(text: str) -> int:
    """An argparse type: a TCP port (1 to 65535)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text[:40]!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text[:40]} is not a port: use 1 to 65535")
    return value


_port.__name__ = "port"

MAX_DAYS = 100_000  # as runner/protocol.py Prune (273 years: a date before year 1 cannot be)


def _days(text: str) -> int:
    """An argparse type: a number of days (1 to MAX_DAYS)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of days: {text[:40]!r}") from None
    if not 0 < value <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"{text[:40]} is out of range: use 1 to {MAX_DAYS} days")
    return value


_days.__name__ = "days"


def _finite(text: str) -> float:
    """An argparse type: a finite number (not nan or inf: the runner records numbers as JSON)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text[:40]!r}")
    return value


_finite.__name__ = "number"


def _command_in(argv: list[str]) -> str | None:
    """The command `argv` names (the first word that is no option), as far as can be told cheaply."""
    words = iter(argv)
    for word in words:
        if word == "--socket":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


class _Unused:
    """Stands in for the parser of a command not being run: its arguments are not built (each verb
    is a process of its own, and building all of them was a fifth of its start-up)."""

    def __getattr__(self, name: str) -> Callable[..., _Unused]:
        return lambda *args, **kwargs: self


class _Formatter(argparse.RawDescriptionHelpFormatter):
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


class _Parser(argparse.ArgumentParser):
    """argparse's, with _Formatter; its subparsers are made of this class too."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("formatter_class", _Formatter)
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


LISTING = ""  # build_parser(LISTING): every command named (for --help), none of their arguments


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, when `only` names one, of that one alone (a name that is
    no command gets the whole parser, whose error lists them)."""
    if only is not None:
        parser, built = _build_parser(only)
        if built or only == LISTING:
            return parser
    return _build_parser(None)[0]


def _build_parser(only: str | None) -> tuple[argparse.ArgumentParser, list[str]]:
    parser = _Parser(prog="goaltender", description=DESCRIPTION, epilog=EXIT_CODES)
    parser.add_argument(
        "--socket", type=_path, help="runner socket (default: $GOALTENDER_SOCKET or ~/.goaltender)"
    )
    sub = parser.add_subparsers(metavar="command")
    built: list[str] = []

    def command(
        name: str, func: Callable, help: str, description: str | None = None
    ) -> argparse.ArgumentParser:
        if only is not None and name != only:
            if only == LISTING:  # named in the list, never run: no -h of its own (a third of its cost)
                sub.add_parser(name, help=help, add_help=False)
            unused: Any = _Unused()
            return unused
        built.append(name)
        cmd = sub.add_parser(
            name, help=help, description=description or help.replace("%%", "%"), epilog=EXIT_CODES
        )
        cmd.set_defaults(func=func)
        return cmd

    # -- processes --
    cmd = command(
        "runner",
        cmd_runner,
        "start the runner daemon in the foreground",
        """\
        goaltender runner          start the runner daemon in the foreground
        goaltender runner attach   bridge stdin/stdout to a running runner's socket (for SSH hosts
                                   whose sshd forbids stream forwarding: the bot runs this command)""",
    )
    cmd.add_argument("action", nargs="?", choices=["attach"], help="attach: the stdio bridge")
    cmd.add_argument("--socket", type=_path, default=argparse.SUPPRESS, help="the runner socket")
    cmd.add_argument(
        "--home", type=_path, help="state directory (default: $GOALTENDER_HOME or ~/.goaltender)"
    )

    cmd = command(
        "demo",
        cmd_demo,
        "run a star-count campaign end to end in this terminal",
        """\
        Start a local runner, submit a goal, and print the goal's thread as it would
        appear in Slack: milestones, ledger rows, approval prompts (answered here), plots
        (PNG files) and the final report. Needs no Slack, no GPU and no model endpoint.""",
    )
    cmd.add_argument("goal", nargs="?", help="the goal's text (default: the star-count campaign)")
    cmd.add_argument("--yes", action="store_true", help="approve every prompt (for scripts)")
    cmd.add_argument("--dir", type=_path, default="goaltender-demo", help="where state, plots and logs go")
    cmd.add_argument(
        "--agent",
        choices=["sweep", "openai", "codex"],
        default="sweep",
        help="sweep (no model needed), or an LLM agent on the endpoint in OPENAI_BASE_URL / "
        "OPENAI_API_KEY with model GOALTENDER_MODEL",
    )

    cmd = command(
        "bot",
        cmd_bot,
        "run the Slack bot: /goal, goal threads, approvals, steering, digests",
        """\
        Run the Slack bot. It needs SLACK_BOT_TOKEN (xoxb-…) and SLACK_APP_TOKEN (xapp-…) from an
        app created from manifest.yml, and reaches the runners listed in its config (default: the
        local runner socket). With GOALTENDER_SLACK_MODE=http it serves /slack/events on
        GOALTENDER_HTTP_PORT instead of Socket Mode and needs SLACK_SIGNING_SECRET, not the app
        token. With --check it checks instead and exits: the tokens (auth.test), each runner,
        and bot.db's writes waiting or parked; exit 1 when something is wrong.""",
    )
    cmd.add_argument("--check", action="store_true", help="check tokens, runners and the outbox, then exit")

    cmd = command(
        "doctor",
        cmd_doctor,
        "check this box is ready for campaigns: GPUs, disk, caches, NeMo RL and Gym, hub, endpoint, SSH",
        """\
        Check this GPU box, one line each (ok / warn / fail, with the fix): Python, GPUs and driver
        (NVML), free space on GOALTENDER_HOME's disk, cache routing, the NeMo RL checkout
        (NEMO_RL_DIR) and its venv, the nemo-gym venv (GOALTENDER_GYM_VENV), the hub or its
        mirror (or offline mode), the model endpoint, the runner and its sandbox, sshd for the
        bot. Keys and tokens are never shown. Exit 1 when a check fails, else 0: a service may
        gate its start on it (a hub out of reach with no mirror configured only warns).""",
    )
    cmd.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    cmd.add_argument("--strict", action="store_true", help="exit 1 when a check warns, too")
    cmd.add_argument(
        "--ssh-port", type=_port, default=22, help="the port the bot reaches sshd on (default 22)"
    )

    cmd = command(
        "service",
        cmd_service,
        "write the runner's and the bot's systemd units (docs/deploy.md, Services)",
        """\
        goaltender service install   write goaltender-runner.service and goaltender-bot.service
                                     (/etc/systemd/system; --user: ~/.config/systemd/user), the
                                     environment files that are missing (/etc/goaltender/
                                     goaltender.env and bot.env, from the examples), the home;
                                     then systemctl daemon-reload, and say what to run next
        goaltender service show runner|bot   print a unit as install would write it""",
    )
    cmd.add_argument("action", choices=["install", "show"])
    cmd.add_argument("service", nargs="?", choices=["runner", "bot"], help="show: which unit")
    cmd.add_argument(
        "--user", action="store_true", help="a user service (systemctl --user), not a system one"
    )
    cmd.add_argument(
        "--as",
        dest="account",
        metavar="USER",
        help="the user a system service runs as (default: $SUDO_USER, else you)",
    )
    cmd.add_argument("--home", type=_path, help="GOALTENDER_HOME (default: ~USER/.goaltender)")
    cmd.add_argument("--unit-dir", type=_path, help="where the units go (default: systemd's folder)")
    cmd.add_argument(
        "--env-dir", type=_path, help="where the environment files go (default: /etc/goaltender)"
    )

    # -- data --
    cmd = command(
        "preflight",
        cmd_preflight,
        "count tokens per SFT example; refuse (or --drop) those NeMo RL would silently mask",
        """\
        Count each example's tokens (the model's processor when installed and local, else an
        estimate) and print one line per file: n, max, p95, over-limit count. Exit 1, naming the
        worst, when any example has >= --max-seq-len tokens: NeMo RL would train on it with zero
        loss and no warning. --drop writes NAME.filtered.jsonl without them instead.""",
    )
    _add_preflight_arguments(cmd)

    # -- people --
    cmd = command("submit", cmd_submit, "submit a goal, e.g. 'reach 90%% accuracy, budget 2h'")
    cmd.add_argument("text")
    cmd.add_argument("--owner", default=os.environ.get("USER"), help="default: $USER, else who you are")
    cmd.add_argument("--agent", help="agent to run the goal (default: the runner's default)")

    cmd = command(
        "status", cmd_status, "show goals: state, budgets used, best result (active ones, or --all)"
    )
    cmd.add_argument("goal_id", nargs="?", type=ID)
    cmd.add_argument("--all", action="store_true", help="finished goals too, newest --limit of them")
    cmd.add_argument(
        "--limit", type=int, default=20, help="with --all: how many goals (default 20, at most 200)"
    )
    cmd.add_argument("--before", type=ID, help="with --all: goals with ids under this one (the next page)")

    cmd = command("summary", cmd_summary, "print a goal's summary and ledger (markdown)")
    cmd.add_argument("goal_id", type=ID)

    cmd = command("steer", cmd_steer, "send a steering message to a goal's agent (its inbox)")
    cmd.add_argument("goal_id", type=ID)
    cmd.add_argument("text")
    cmd.add_argument("--author", help="whom you speak for (recorded as AUTHOR via cli (uid N))")

    cmd = command("budget", cmd_budget, "change a goal's budget: '+2h', 'max 10 experiments', 'gpu-hours 8'")
    cmd.add_argument("goal_id", type=ID)
    cmd.add_argument("change")

    for name, func, help in (
        ("pause", cmd_pause, "pause a goal: the running experiment finishes, no new one starts"),
        ("resume", cmd_resume, "resume a paused goal"),
        ("stop", cmd_stop, "stop a goal: end its agent and experiments, write the final report"),
    ):
        cmd = command(name, func, help)
        cmd.add_argument("goal_id", type=ID)
        if name == "stop":
            cmd.add_argument("--reason", default="")

    for name, func in (("approve", cmd_approve), ("reject", cmd_reject)):
        cmd = command(name, func, f"{name} a pending approval prompt")
        cmd.add_argument("approval_id", type=ID)
        cmd.add_argument("--comment")

    cmd = command("audit", cmd_audit, "print the audit trail: control actions and refused attempts, and who")
    cmd.add_argument("goal_id", nargs="?", type=ID, help="only this goal's entries")
    cmd.add_argument("--limit", type=COUNT, default=200, help="the newest N entries (default 200)")

    cmd = command(
        "backup",
        cmd_backup,
        "copy runner.db and bot.db, consistently, while the runner and the bot run",
        """\
        Copies each database on this box (runner.db in GOALTENDER_HOME, bot.db at GOALTENDER_DB or
        in the home) into a new directory named by the time, with SQLite's online backup API: the
        copy is the database as one commit left it, even while the runner and the bot write.""",
    )
    cmd.add_argument(
        "--to", type=_path, help="where the dated directory goes (default: $GOALTENDER_HOME/backups)"
    )

    cmd = command(
        "restore",
        cmd_restore,
        "put a backup of runner.db or bot.db back (the runner or the bot stopped)",
        """\
        BACKUP is a directory `goaltender backup` wrote (each database in it is restored) or one
        .db file. The runner (or the bot) must be stopped; what was at the database's path is
        set aside as <name>.before-restore-<time>, never deleted.""",
    )
    cmd.add_argument("backup", type=_path, help="a backup directory, or a runner.db or bot.db copy")
    cmd.add_argument("--only", choices=["runner", "bot"], help="restore this database alone")

    cmd = command(
        "prune",
        cmd_prune,
        "remove what goals that ended long ago left: events, run logs, delivered posts",
        """\
        Goals that ended more than GOALTENDER_RETENTION_DAYS (default 90) days ago lose their
        events and their runs' logs (the best run's log, the ledger, diary, audit trail and final
        report are kept), and bot.db its delivered posts (each goal's card is kept). The runner and
        the bot also do this by themselves once a day. A running runner is asked to do it.""",
    )
    cmd.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    cmd.add_argument("--days", type=_days, help="this many days instead of the setting")

    cmd = command("events", cmd_events, "print the event log (optionally follow it)")
    cmd.add_argument("--since", type=COUNT, default=0)
    cmd.add_argument("--goal", type=ID, dest="goal_id")
    cmd.add_argument("--follow", "-f", action="store_true")

    cmd = command("du", cmd_du, "what each goal's workspace holds on the big disk (checkpoints apart)")
    cmd.add_argument("goal_id", nargs="?", type=ID, help="only this goal (an agent: its own)")

    cmd = command("log", cmd_log, "print an experiment's log")
    cmd.add_argument("experiment_id", type=ID)
    cmd.add_argument("--offset", type=COUNT, default=0)

    # -- agent verbs --
    def goal_arg(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--goal", type=ID, dest="goal_id", help="goal id (default: $GOALTENDER_GOAL_ID)")

    cmd = command("milestone", cmd_milestone, "report a milestone to the goal's thread")
    cmd.add_argument("title", help="one line: what happened")
    cmd.add_argument("text", nargs="?", default="", help="details (markdown)")
    goal_arg(cmd)

    cmd = command(
        "metrics",
        cmd_metrics,
        "log metric values",
        """\
        log metric values: goaltender metrics loss=0.31 acc=0.82 --step 100
        or many at once, as JSON lines: goaltender metrics --file - < points.jsonl
        where each line is {"name": "loss", "value": 0.31, "step": 100} (step optional)""",
    )
    cmd.add_argument("values", nargs="*", metavar="NAME=VALUE")
    cmd.add_argument("--file", help="JSON lines of points, one {name, value, step} per line (- for stdin)")
    cmd.add_argument("--step", type=_finite)
    cmd.add_argument("--experiment", type=ID, dest="experiment_id")
    goal_arg(cmd)

    cmd = command(
        "experiment",
        cmd_experiment,
        "run one experiment under the runner's supervision",
        """\
        Run one experiment under supervision and record it in the ledger:

          goaltender experiment -d "lr 3e-4: faster convergence?" --param lr=3e-4 \\
              --metric val_accuracy -- python train.py --lr 3e-4

        The runner starts COMMAND in its own process group, captures its output to
        experiments/NNN/run.log in the goal's workspace, reads metrics from it as it runs
        (JSON lines such as {"step": 10, "loss": 0.5} are series; a final `name: value`
        line is the run's summary), enforces the per-experiment timeout and the goal's
        budgets, accounts wall time and compute, and writes a ledger row: keep (new best
        on --metric), discard (no better) or crash (failed, timed out, or no metric).
        The row is printed when the run ends; the command's own output stays in the log.""",
    )
    cmd.add_argument("-d", "--description", required=True, help="the hypothesis this run tests")
    cmd.add_argument("--param", action="append", default=[], metavar="K=V", help="a config value to record")
    cmd.add_argument("--metric", help="headline metric name (default: the goal's)")
    cmd.add_argument("--minimize", action="store_true", help="lower is better for --metric")
    cmd.add_argument("--timeout", help="per-run time limit, e.g. 10m (the goal's limit may be tighter)")
    cmd.add_argument(
        "--eval",
        dest="eval_command",
        help="a command the runner runs itself after a successful run to measure --metric on the "
        "held-out split (it finds the run's files in $GOALTENDER_EXPERIMENT_DIR); without it the "
        "metric is marked 'reported'",
    )
    placement_args(cmd)
    cmd.add_argument(
        "--repeat",
        type=_whole_number(1),
        default=1,
        help="run it (and --eval) N times with GOALTENDER_SEED=0..N-1; the row holds the mean ± sd",
    )
    cmd.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    goal_arg(cmd)

    cmd = command(
        "nemo-rl",
        cmd_nemo_rl,
        "train with NeMo RL (sft, grpo, …) as one supervised experiment",
        """\
        Run a NeMo RL recipe as one supervised experiment:

          goaltender nemo-rl sft --config sft.yaml -- policy.optimizer.kwargs.lr=1e-5

        The runner runs `uv run examples/run_sft.py --config … overrides` in the NeMo RL
        checkout ($NEMO_RL_DIR), with its logs and checkpoints in the experiment's directory and
        NeMo RL's venvs in the runner's cache. Its TensorBoard scalars (train/loss, validation/*,
        timing/*) become the experiment's series as they are written (without the `nemo` extra:
        read from its output). At the end the best checkpoint by --metric is named: the ledger
        row gets its value, the goal's thread the milestone "best checkpoint: step_N" with the
        training curves. With --eval CMD the runner then scores the run itself (CMD finds the
        checkpoints in $GOALTENDER_EXPERIMENT_DIR): the row's headline is what CMD prints
        (--eval-metric, default the goal's metric), e.g. held-out exact_accuracy.""",
    )
    if not isinstance(cmd, _Unused):
        from goaltender.training.launch import add_recipe_parsers

        def recipe_args(sub: argparse.ArgumentParser) -> None:
            placement_args(sub)
            goal_arg(sub)

        add_recipe_parsers(cmd, recipe_args)

    cmd = command(
        "ask",
        cmd_ask,
        "ask the humans for approval and wait for the answer",
        """\
        Ask for approval and block until a person decides or the prompt expires.
        Exit code 0: approved; 1: rejected; 3: expired (treat as rejected).
        The decider's name and comment are printed.""",
    )
    cmd.add_argument("question")
    cmd.add_argument("--detail", default="", help="context for the decision (cost, risk, plan)")
    cmd.add_argument("--timeout", help="how long to wait, e.g. 30m (default: the runner's)")
    cmd.add_argument("--kind", default="generic", help="cost | command | generic")
    goal_arg(cmd)

    cmd = command(
        "stage-done",
        cmd_stage_done,
        "end the goal's stage: the humans approve before the next one starts",
        """\
        A staged goal (`stages: plan, implement, campaign` in its words) passes a gate
        between stages: this posts the stage's summary (and --attach DOC, e.g. the plan)
        in the thread and waits for a person to decide. Exit code 0: approved, the next
        stage has started (it is printed); 1: rejected (the comment says why); 3: expired.
        Experiments start in the stage named `campaign`.""",
    )
    cmd.add_argument("summary", nargs="?", help="what the stage did and found (or --file)")
    cmd.add_argument("--file", type=_path, help="the summary, from a file")
    cmd.add_argument("--attach", type=_path, help="a document for the humans to review, e.g. plan.md")
    goal_arg(cmd)

    cmd = command(
        "cross-check",
        cmd_cross_check,
        "compare two independent implementations before any campaign",
        """\
        Runs A, then B, in the goal's sandbox, on the same toy input; each prints
        `name: value` lines (the numbers a paper's equations give on a toy batch, say).
        Every number either printed must agree within --rtol/--atol. A disagreement is
        posted as an approval prompt with the table, and the goal's experiments wait until
        a person decides: exit code 0 when they agree or a person lets it pass, 1 when the
        disagreement stands (fix the implementations and cross-check again).""",
    )
    cmd.add_argument("-d", "--description", required=True, help="what is compared, on what input")
    cmd.add_argument("--a", required=True, dest="a", help="implementation A's command (one string)")
    cmd.add_argument("--b", required=True, dest="b", help="implementation B's command (one string)")
    cmd.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    cmd.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance (default 1e-8)")
    goal_arg(cmd)

    cmd = command("inbox", cmd_inbox, "read steering messages from people (unread ones, then marked read)")
    cmd.add_argument("--all", action="store_true", help="include messages already read")
    goal_arg(cmd)

    cmd = command("diary", cmd_diary, "write or read the goal's diary (durable session memory)")
    actions = cmd.add_subparsers(dest="action", metavar="write|read", required=True)
    write = actions.add_parser("write", help="add an entry: goaltender diary write [--handoff] TEXT")
    write.add_argument("text", nargs="?", help="the entry (or - for stdin)")
    write.add_argument("--handoff", action="store_true", help="a handoff: everything needed to resume")
    goal_arg(write)
    read = actions.add_parser(
        "read", help="print recent entries: goaltender diary read [--handoff] [--last N]"
    )
    read.add_argument("--handoff", action="store_true", help="only handoffs")
    read.add_argument("--last", type=COUNT, default=20, help="how many entries")
    goal_arg(read)
    goal_arg(cmd)

    cmd = command("report", cmd_report, "hand in your words for the final report (findings, next steps)")
    cmd.add_argument("text", nargs="?", help="markdown text (or use --file)")
    cmd.add_argument("--file", type=_path)
    goal_arg(cmd)

    cmd = command(
        "fetch",
        cmd_fetch,
        "download a model or data set from the hub (or a mirror) into the cache",
        """\
        Download a model or data set from the Hugging Face hub into the hub cache; print
        where it is (first line), then the commit the revision resolved to and its size:

          MODEL_DIR=$(goaltender fetch Qwen/Qwen3-0.6B | head -n1)

        Inside a goal the runner downloads it: the hub cache ($HF_HUB_CACHE) is shared by
        every goal and read-only in their sandboxes, and only the runner writes it, with the
        box's hub settings (HF_ENDPOINT, HF_HUB_OFFLINE; HF_TOKEN when granted to goals, never
        printed), whatever this environment says. The fetch is recorded in the goal's ledger
        (repo, revision, the commit it resolved to), and a download of more than
        GOALTENDER_FETCH_MILESTONE_MB (default 100, the runner's) reports milestones as it
        goes. One download of a repo at a time: a second fetch waits for it, then finds the
        files cached. Outside a goal (an operator's shell) it downloads here, with this
        environment's HF_* variables. Exit 1 when the fetch fails, saying why in one line.""",
    )
    cmd.add_argument("repo", help="owner/name on the hub")
    cmd.add_argument("--revision", help="a branch, tag or commit (default: main)")
    cmd.add_argument("--type", dest="repo_type", choices=["model", "dataset"], default="model")
    cmd.add_argument(
        "--include",
        action="extend",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="only the files these globs match, e.g. '*.json' '*.safetensors' (default: every file)",
    )
    goal_arg(cmd)
    # The runner's own download for a goal (runner/fetches.py): never a goal's, and results as
    # JSON lines on stdout; `--keep-free` bytes stay free on the cache's disk.
    cmd.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    cmd.add_argument("--keep-free", type=COUNT, default=0, help=argparse.SUPPRESS)

    cmd = command(
        "skill-edit",
        cmd_skill_edit,
        "propose an edit to one of the box's skills; a person approves the diff",
        """\
        Propose new content for a skill file in the box's skill folder: what you learned, for
        the next goals' agents. The runner shows the humans the diff and waits for a decision.

          goaltender skill-edit --skill autoresearch --file new-SKILL.md --why "…"
          goaltender skill-edit --skill nemo-rl --path references/oom.md --file oom.md

        --file is the whole new text (- for stdin) of SKILL.md, or of --path references/NAME;
        a new skill (a new name of lower-case letters, digits and -) starts with its SKILL.md.
        Exit code 0: approved and applied (the commit is printed); 1: rejected, or approved but
        no longer applicable; 3: expired. Nothing is written without a person's approval.""",
    )
    cmd.add_argument("--skill", required=True, help="the skill's name, e.g. autoresearch")
    cmd.add_argument("--path", default="SKILL.md", help="SKILL.md (default) or references/NAME")
    cmd.add_argument("--file", required=True, help="the file's proposed new content (- for stdin)")
    cmd.add_argument("--why", default="", help="what you learned that makes this edit worth it")
    cmd.add_argument("--timeout", help="how long to wait for a decision, e.g. 30m (default: the runner's)")
    goal_arg(cmd)

    cmd = command(
        "skills",
        cmd_skills,
        "the box's skill folder: its history, and reverting an applied edit",
        """\
        goaltender skills log [--limit N]   the skill folder's commits, newest first
        goaltender skills revert COMMIT     undo one commit with a new one (audited)""",
    )
    actions = cmd.add_subparsers(dest="action", metavar="log|revert", required=True)
    log = actions.add_parser("log", help="the skill folder's commits, newest first")
    log.add_argument("--limit", type=COUNT, default=20, help="how many commits (default 20)")
    revert = actions.add_parser("revert", help="undo one commit of the skill folder")
    revert.add_argument("commit", help="the commit's hash (from `goaltender skills log`)")
    return parser, built


def _add_preflight_arguments(cmd: argparse.ArgumentParser) -> None:
    if isinstance(cmd, _Unused):
        return
    from goaltender.environments import preflight

    preflight.add_arguments(cmd)


# ---- plumbing ----


def _run(args: argparse.Namespace, body: Callable[[RunnerClient], Awaitable[int | None]]) -> int:
    import asyncio

    from goaltender.runner.client import RunnerClient

    async def go() -> int | None:
        async with await RunnerClient.connect_unix(_socket(args), client=_client(args)) as runner:
            return await body(runner)

    return asyncio.run(go()) or EXIT_OK


def _send(args: argparse.Namespace, requests: list[str]) -> list[dict[str, Any]]:
    """The `done` replies to `requests` (quick_client.encode() of what the protocol's models would
    send, without id), sent at once by the blocking client: no pydantic, no asyncio (issue 13).

    Input the runner could not take is only looked into when it refuses (or is not there): then the
    models say why, as _checked does for the other verbs, so it is still a usage error (exit 2)."""
    try:
        return exchange(_socket(args), _client(args), requests)
    except RunnerUnavailable:
        _check_requests(requests)
        raise
    except RunnerRefused as refused:
        if refused.code in ("bad_json", "bad_request", "line_too_long"):
            _check_requests(requests)
        raise


def _say_done(args: argparse.Namespace, request: dict[str, Any]) -> int:
    """Send one request answered by `done` (through _send), and print what the runner says."""
    print(_send(args, [encode(request)])[0]["message"])
    return EXIT_OK


def _check_requests(requests: list[str]) -> None:
    for request in requests:
        fields = json.loads(request)
        _checked(p.REQUEST_MODELS[fields.pop("type")], **fields)


def _path(text: str) -> Path:
    """An argparse type: a path."""
    from pathlib import Path

    return Path(text)


def _socket(args: argparse.Namespace) -> str | Path:
    return args.socket or socket_from_env()


def _client(args: argparse.Namespace) -> str:
    """How the runner's records name this client: cli:<the command>."""
    return f"cli:{args.func.__name__[4:]}"


def _check_text_arguments(args: argparse.Namespace) -> None:
    """Every text argument is UTF-8: the runner takes JSON text (a path may be any bytes: not checked).

    Python hands undecodable argv bytes over as lone surrogates; they could never be sent."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and not _is_utf8(text):
                shown = text.encode("utf-8", "surrogateescape")[:40]
                raise UsageError(f"{name.replace('_', ' ')}: {shown!r} is not UTF-8; the runner takes text")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _checked(kind: type[p.Request], /, **fields: Any) -> dict[str, Any]:
    """`fields`, once they make a `kind` request the runner could take; UsageError saying why not.

    Checked here, before connecting, so bad input never reaches the runner or prints a traceback."""
    from pydantic import ValidationError
    from pydantic_core import PydanticSerializationError

    try:
        size = len(p.encode(kind(id=0, **fields)))
    except ValidationError as exc:
        raise UsageError(p.problems(exc, kind)) from None
    except PydanticSerializationError as exc:
        raise UsageError(f"cannot send this to the runner: {exc}") from None
    if size > MAX_LINE:
        raise UsageError(f"too much to send: {size:,} bytes, over the runner's limit of {MAX_LINE:,}")
    return fields


def _goal_id(args: argparse.Namespace) -> int:
    if args.goal_id is not None:
        return args.goal_id
    if value := os.environ.get("GOALTENDER_GOAL_ID"):
        try:
            return ID(value)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"GOALTENDER_GOAL_ID is not a goal id ({exc}); pass --goal N") from None
    raise UsageError("no goal: pass --goal N or set GOALTENDER_GOAL_ID (the runner sets it for agents)")


def _duration(text: str | None) -> float | None:
    """`10m`, `2h`, `90` (seconds): from 1s to 365 days."""
    if text is None:
        return None
    from goaltender.runner.budget import GoalTextError, check_duration, parse_duration

    _require_sound_interpreter()
    seconds = parse_duration(text)
    if seconds is None:
        try:
            seconds = float(text)
        except ValueError:
            raise UsageError(f"not a duration: {text[:40]!r} (try 90s, 10m, 2h)") from None
    try:
        return check_duration(seconds, text, "a timeout", "`90s`, `10m` or `2h`")
    except GoalTextError as exc:
        raise UsageError(str(exc)) from None


def _key_values(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"expected NAME=VALUE, got {item[:60]!r}")
        pairs[key] = value
    return pairs


def _number_or_text(value: str) -> Any:
    """A --param value: JSON when it is (3e-4, true, [64, 64]), else the text as given.

    NaN and Infinity stay text: JSON has no such numbers."""
    try:
        return json.loads(value, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # not JSON, too many digits, nested too deep
        return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _require_sound_interpreter() -> None:
    """Refuse, in one line, to read budget words on a Python that misreads them (selftest.py)."""
    from goaltender.selftest import interpreter_problem

    if problem := interpreter_problem():
        raise UsageError(problem)


def _goal_words(text: str) -> None:
    """The runner would refuse these goal words (budget 0h, max 0 experiments): say so now."""
    from goaltender.runner.budget import GoalTextError, parse_goal_text

    _require_sound_interpreter()
    try:
        parse_goal_text(text)
    except GoalTextError as exc:
        raise UsageError(str(exc)) from None


def _budget_words(change: str) -> None:
    """Budget words that cannot be whatever the goal's budget (+0h, budget 0h), in a change or a
    steer (the runner applies those too): say so now."""
    from goaltender.runner.budget import GoalTextError, apply_budget_change
    from goaltender.storage.records import Budget, utcnow

    _require_sound_interpreter()
    try:
        apply_budget_change(Budget(), change, utcnow())
    except GoalTextError as exc:
        raise UsageError(str(exc)) from None


def _read_text(read: Callable[[], bytes], what: str) -> str:
    """Text from a file or stdin, which must be UTF-8 (the runner takes text)."""
    try:
        data = read()
    except (OSError, ValueError) as exc:  # ValueError: a path with a NUL in it
        raise UsageError(f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _print_status(status: p.GoalStatus) -> None:
    goal = status.goal
    print(f"goal #{goal.id} [{goal.state}] {goal.text}")
    print(f"  agent {goal.agent}, owner {goal.owner}; {status.stop_status}")
    if goal.end_reason and not goal.active:  # a goal that failed at its start says why here alone
        print(f"  ended: {' / '.join(line for line in goal.end_reason.splitlines() if line.strip())}")
    if status.best:
        print(f"  best: #{status.best.index} {status.best.metric_name} = {status.best.metric_value:.4g}")
    for approval in status.pending_approvals:
        print(f"  waiting for approval #{approval.id}: {approval.question}")


# ---- commands ----


def cmd_runner(args: argparse.Namespace) -> int:
    if args.action == "attach":
        from goaltender.runner.attach import run as attach

        if args.home and not args.socket:
            os.environ["GOALTENDER_HOME"] = str(args.home)
        return attach(args.socket)
    from goaltender.runner.config import RunnerSettings
    from goaltender.runner.daemon import main as runner_main

    overrides = {"home": args.home} if args.home else {}
    if args.socket:
        overrides["socket"] = args.socket
    runner_main(RunnerSettings(**overrides))
    return EXIT_OK


def cmd_bot(args: argparse.Namespace) -> int:
    from goaltender.selftest import interpreter_problem

    if problem := interpreter_problem():  # said before the bot's imports, which may warn at length
        print(f"goaltender bot: cannot start: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        import asyncio

        from goaltender.bot.config import BotSettings
        from goaltender.bot.health import check

        result = asyncio.run(check(BotSettings()))
        sys.stdout.write(result.text)
        return result.exit_code
    from goaltender.bot.app import main as bot_main

    bot_main()
    return EXIT_OK


def cmd_service(args: argparse.Namespace) -> int:
    from goaltender.services import Layout, ServiceError, install

    if (args.action == "show") != (args.service is not None):
        raise UsageError("service: `show` takes runner or bot; `install` writes both and takes neither")
    try:
        layout = Layout.choose(
            user_mode=args.user,
            account=args.account,
            home=args.home,
            unit_dir=args.unit_dir,
            env_dir=args.env_dir,
        )
    except ServiceError as exc:  # what was asked cannot be: bad input
        raise UsageError(f"service: {exc}") from None
    if args.action == "show":
        sys.stdout.write(layout.unit(args.service))
        return EXIT_OK
    try:
        print("\n".join(install(layout)))
    except ServiceError as exc:  # this machine would not have it (permissions, systemctl)
        print(f"goaltender service: {exc}", file=sys.stderr)
        return EXIT_NO
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from goaltender.runner.doctor import doctor

    text, code = doctor(args.socket, as_json=args.json, ssh_port=args.ssh_port, strict=args.strict)
    sys.stdout.write(text)
    return code


def cmd_demo(args: argparse.Namespace) -> int:
    from goaltender.demo import run_demo

    _require_sound_interpreter()  # its runner runs in this process: the default goal's `budget 3m` too
    if args.goal is not None:
        _checked(p.SubmitGoal, text=args.goal)
        _goal_words(args.goal)
    return run_demo(args.goal, directory=args.dir, yes=args.yes, agent=args.agent)


def cmd_preflight(args: argparse.Namespace) -> int:
    from goaltender.environments import preflight

    return preflight.run(args)


def cmd_submit(args):
    fields = _checked(p.SubmitGoal, text=args.text, owner=args.owner, agent=args.agent)
    _goal_words(args.text)

    async def body(runner: RunnerClient):
        reply = await runner.call(p.SubmitGoal, p.GoalReply, **fields)
        _print_status(reply.status)

    return _run(args, body)


def cmd_status(args):
    if args.goal_id is not None:
        fields = _checked(p.Status, goal_id=args.goal_id)
    elif args.all:  # history, a page at a time: every goal in one reply would outgrow a line
        fields = _checked(p.Status, limit=args.limit, before=args.before)
    else:
        fields = _checked(p.Status, active_only=True)

    async def body(runner: RunnerClient):
        reply = await runner.call(p.Status, p.StatusReply, **fields)
        for status in reply.goals:
            _print_status(status)
        if not reply.goals:
            what = (
                "no goals yet" if args.all or args.goal_id else "no active goals (--all shows finished ones)"
            )
            print(f"{what}; submit one with: goaltender submit 'your goal, budget 1h'")
        elif args.all and args.goal_id is None and len(reply.goals) == args.limit:
            print(f"(older goals: goaltender status --all --before {reply.goals[0].goal.id})")

    return _run(args, body)


def cmd_summary(args):
    fields = _checked(p.Summary, goal_id=args.goal_id)

    async def body(runner: RunnerClient):
        print((await runner.call(p.Summary, p.SummaryReply, **fields)).text)

    return _run(args, body)


def _done(
    request_type: str, check: Callable[[argparse.Namespace], None] | None = None, **fields_from_args: str
):
    """The command for a request answered by `done` (its model is looked up when it runs)."""

    def cmd(args):
        if check is not None:
            check(args)
        kind = p.REQUEST_MODELS[request_type]
        fields = _checked(kind, **{field: getattr(args, attr) for field, attr in fields_from_args.items()})

        async def body(runner: RunnerClient):
            print((await runner.call(kind, p.Done, **fields)).message)

        return _run(args, body)

    cmd.__name__ = f"cmd_{request_type}"
    return cmd


cmd_steer = _done(
    "steer", lambda args: _budget_words(args.text), goal_id="goal_id", text="text", author="author"
)
cmd_budget = _done(
    "change_budget", lambda args: _budget_words(args.change), goal_id="goal_id", change="change"
)
cmd_pause = _done("pause", goal_id="goal_id")
cmd_resume = _done("resume", goal_id="goal_id")
cmd_stop = _done("stop", goal_id="goal_id", reason="reason")


def _decide(approve: bool):
    def cmd(args):
        fields = _checked(p.Decide, approval_id=args.approval_id, approve=approve, comment=args.comment)

        async def body(runner: RunnerClient):
            reply = await runner.call(p.Decide, p.DecisionReply, **fields)
            print(f"approval #{reply.approval.id} {reply.approval.state}")

        return _run(args, body)

    cmd.__name__ = "cmd_approve" if approve else "cmd_reject"
    return cmd


cmd_approve = _decide(True)
cmd_reject = _decide(False)


def cmd_audit(args):
    fields = _checked(p.Audit, goal_id=args.goal_id, limit=args.limit)

    async def body(runner: RunnerClient):
        reply = await runner.call(p.Audit, p.AuditReply, **fields)
        for e in reply.entries:
            goal = f"goal #{e.goal_id}" if e.goal_id is not None else "-"
            print(f"{e.ts:%Y-%m-%d %H:%M:%S}  {e.actor}  {e.action}  {goal}  {e.outcome}  {e.detail}")
        if not reply.entries:
            print("(no entries)")

    return _run(args, body)


def cmd_backup(args: argparse.Namespace) -> int:
    from goaltender import lifecycle

    try:
        lines = lifecycle.backup(args.to)
    except (lifecycle.NothingThere, FileExistsError, OSError) as exc:
        print(f"goaltender backup: {exc}", file=sys.stderr)
        return EXIT_NO
    print("\n".join(lines))
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    from goaltender import lifecycle

    try:
        lines = lifecycle.restore(args.backup, args.only)
    except (lifecycle.RestoreRefused, OSError) as exc:
        print(f"goaltender restore: {exc}", file=sys.stderr)
        return EXIT_NO
    print("\n".join(lines))
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    """runner.db through the runner when it runs (another process writing its file would stop it),
    else here; bot.db here (SQLite lets the bot and this write it in turn)."""
    from goaltender import lifecycle

    try:
        request = encode({"type": "prune", "days": args.days, "dry_run": args.dry_run})
        replies = exchange(_socket(args), _client(args), [request], expect="pruned")
        lines = list(replies[0]["lines"])
    except RunnerUnavailable:
        lines = []
    try:
        if not lines:
            lines = lifecycle.prune_locally("runner", args.days, args.dry_run)
        lines += lifecycle.prune_locally("bot", args.days, args.dry_run)
    except lifecycle.RestoreRefused as exc:
        print(f"goaltender prune: {exc}", file=sys.stderr)
        return EXIT_NO
    print("\n".join(lines))
    return EXIT_OK


def cmd_du(args):
    from goaltender.runner.report import format_bytes

    fields = _checked(p.DiskUsage, goal_id=args.goal_id)  # an agent is answered for its own goal

    async def body(runner: RunnerClient):
        reply = await runner.call(p.DiskUsage, p.DiskUsageReply, **fields)
        for goal in reply.goals:
            print(f"goal #{goal.goal_id} ({goal.state}): {format_bytes(goal.total)}")
            for line in goal.lines:
                print(f"  {line}")
        print(f"{format_bytes(reply.free)} free on the runner's disk")

    return _run(args, body)


def cmd_events(args):
    _checked(p.Subscribe, since=args.since, goal_id=args.goal_id)

    async def body(runner: RunnerClient):
        head = await runner.subscribe(since=args.since, goal_id=args.goal_id)
        if head <= args.since and not args.follow:
            return
        async for event in runner.events():
            print(event.model_dump_json(), flush=True)
            if event.seq >= head and not args.follow:
                return

    return _run(args, body)


def cmd_log(args):
    _checked(p.GetLog, experiment_id=args.experiment_id, offset=args.offset)

    async def body(runner: RunnerClient):
        out = sys.stdout
        if isinstance(out, PlainTerminal):  # shown, not saved: decoded and cleaned as it comes
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            held = ""  # a chunk's last CR, which may be half of a CRLF
            async for reply in runner.fetch_log(args.experiment_id, args.offset):
                text = held + decoder.decode(reply.data)
                held = "\r" if text.endswith("\r") else ""
                out.write(text[: len(text) - len(held)])
            out.write(held + decoder.decode(b"", final=True))
            out.flush()
            return
        async for reply in runner.fetch_log(args.experiment_id, args.offset):  # requests pipelined
            sys.stdout.buffer.write(reply.data)
        sys.stdout.buffer.flush()

    return _run(args, body)


def cmd_milestone(args):
    milestone = {"type": "milestone", "goal_id": _goal_id(args), "title": args.title, "text": args.text}
    return _say_done(args, milestone | {"curves": None})


def cmd_metrics(args):
    if bool(args.values) == bool(args.file):
        raise UsageError("give NAME=VALUE pairs or --file FILE (JSON lines), one or the other")
    if args.file:
        points = _points_from_lines(_read_points_file(args.file), step=args.step)
    else:
        points = [
            encode({"name": k, "value": _metric_value(k, v), "step": args.step})
            for k, v in _key_values(args.values).items()
        ]
    # Sent together, answered in order: one round trip, however many requests.
    replies = _send(args, _metric_requests(_goal_id(args), args.experiment_id, points))
    if len(replies) == 1:
        print(replies[0]["message"])
    else:
        print(f"{len(points)} metric point(s) logged in {len(replies)} requests")


def _read_points_file(name: str) -> str:
    if name == "-":
        return _read_text(sys.stdin.buffer.read, "stdin")
    return _read_text(_path(name).read_bytes, name)


def _points_from_lines(text: str, step: float | None) -> list[str]:
    """The points of JSON lines `{"name": …, "value": …, "step": …}`, each as JSON text; blank lines
    are skipped. `step` (--step) is the step of lines that give none."""
    points = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            fields = _decode(line)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"line {number}: not a JSON object: {str(exc)[:80]}") from None
        if not isinstance(fields, dict):
            raise UsageError(f'line {number}: expected an object like {{"name": "loss", "value": 0.3}}')
        if "step" in fields or step is None:
            points.append(line if _is_plain_point(fields) else _validated_point(fields, number))
        else:
            fields["step"] = step
            points.append(encode(fields) if _is_plain_point(fields) else _validated_point(fields, number))
    if not points:
        raise UsageError("no points: the file has no JSON lines")
    return points


_JSON = json.JSONDecoder(parse_constant=_no_constant)  # one for every line: json.loads makes one a call


def _decode(line: str) -> Any:
    """`line` as json.loads reads it: most lines are one value with no blanks around, which
    raw_decode reads alone (a quarter faster on 10,000 lines)."""
    try:
        value, end = _JSON.raw_decode(line)
        if end == len(line):
            return value
    except ValueError:
        pass
    return _JSON.decode(line)  # blanks around the value, or the error saying what is wrong


def _is_plain_point(fields: dict[str, Any]) -> bool:
    """Whether `fields` are plainly a MetricPoint (a text name, finite numbers, nothing else). Such a
    line is sent as it came, for the runner to read the same point from it: most lines are, and
    neither pydantic nor encoding them again costs this process anything (issue 13)."""
    step = fields.get("step")
    return (
        len(fields) == 2 + ("step" in fields)
        and type(fields.get("name")) is str
        and _plain_number(fields.get("value"))
        and (step is None or _plain_number(step))
    )


def _plain_number(value: object) -> bool:
    # A JSON number: a finite float, or an integer the wire takes (bool is no number).
    return (type(value) is float and math.isfinite(value)) or (
        type(value) is int and INT64_MIN <= value <= INT64_MAX
    )


def _validated_point(fields: dict[str, Any], number: int) -> str:
    """A line that is no plain point, as MetricPoint makes it, or why it cannot."""
    from pydantic import ValidationError

    from goaltender.storage.records import MetricPoint

    try:
        return MetricPoint.model_validate(fields).model_dump_json()
    except ValidationError as exc:
        raise UsageError(f"line {number}: {p.problems(exc, MetricPoint)}") from None


def _metric_requests(goal_id: int, experiment_id: int | None, points: list[str]) -> list[str]:
    """log_metrics requests for `points` (JSON texts): at most MAX_POINTS each, each line within the
    runner's limit (a point too long alone still goes: the runner says why)."""
    from bisect import bisect_right
    from itertools import accumulate

    request = encode(
        {"type": "log_metrics", "goal_id": goal_id, "points": [], "experiment_id": experiment_id}
    )
    room = MAX_LINE - len(request) - 64 - MAX_POINTS  # and the id, the newline, a comma a point
    ends = list(accumulate(map(len, map(str.encode, points))))  # bytes up to each point's end
    chunks = []
    start = 0
    while start < len(points):
        fits = bisect_right(ends, (ends[start - 1] if start else 0) + room)
        stop = max(start + 1, min(fits, start + MAX_POINTS))
        chunks.append(points[start:stop])
        start = stop
    return [request.replace('"points":[]', f'"points":[{",".join(chunk)}]', 1) for chunk in chunks]


def _metric_value(name: str, text: str) -> float:
    try:
        return _finite(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"metric {name[:40]!r}: {exc}") from None


def placement_args(cmd: argparse.ArgumentParser) -> None:
    """Where an experiment runs, and on how many GPUs (defaults: the goal's, then the box's)."""
    cmd.add_argument(
        "--gpus",
        type=COUNT,
        help="GPUs it needs; it waits in the box's fair queue until they are free (default: the "
        "goal's, else GOALTENDER_GPUS_PER_EXPERIMENT, else 1 on a box with GPUs)",
    )
    cmd.add_argument(
        "--executor",
        choices=("local", "ray", "slurm"),
        help="run it on this box (local), as a Ray job or as a Slurm job (default: the goal's, else "
        "GOALTENDER_EXECUTOR)",
    )


def cmd_experiment(args):
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("give the command after --, e.g. goaltender experiment -d '...' -- python train.py")
    fields = _checked(
        p.RunExperiment,
        goal_id=_goal_id(args),
        command=command,
        description=args.description,
        params={k: _number_or_text(v) for k, v in _key_values(args.param).items()},
        metric=args.metric,
        direction="minimize" if args.minimize else ("maximize" if args.metric else None),
        timeout_s=_duration(args.timeout),
        cwd=_working_directory(),
        env=_environment(),  # what the agent exported reaches its experiment
        eval_command=_split(args.eval_command) if args.eval_command else None,
        gpus=args.gpus,
        executor=args.executor,
        repeat=args.repeat,
    )
    return _run(args, _experiment_body(fields))


def cmd_nemo_rl(args):
    from goaltender.training.launch import LaunchError, plan

    goal_id = _goal_id(args)
    cwd = _working_directory()
    overrides = args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides
    try:
        run = plan(
            args.recipe,
            args.config,
            overrides,
            cwd=_path(cwd),
            env=os.environ,
            checkout=args.checkout,
            script=args.script,
            trainer=args.trainer,
            metric=args.metric,
            direction="minimize" if args.minimize else ("maximize" if args.maximize else None),
            eval_command=args.eval_command,
            eval_metric=args.eval_metric,
        )
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    metric, direction = run.headline()
    fields = _checked(
        p.RunExperiment,
        goal_id=goal_id,
        command=run.command(),
        description=args.description or run.description(),
        params=run.params(),
        metric=metric,
        direction=direction,
        timeout_s=_duration(args.timeout),
        cwd=cwd,
        env=_environment(),
        eval_command=run.eval_command,
        gpus=args.gpus,
        executor=args.executor,
    )
    return _run(args, _experiment_body(fields))


def _experiment_body(fields: dict[str, Any]) -> Callable[[RunnerClient], Awaitable[int]]:
    """Run the experiment and print its ledger row."""
    from goaltender.display.params import format_params

    async def body(runner: RunnerClient) -> int:
        reply = await runner.call(p.RunExperiment, p.ExperimentReply, **fields)
        e = reply.experiment
        how = " (verified by the runner)" if e.verified else " (reported)"
        value = f"{e.metric_name} = {e.metric_value:.4g}{how}" if e.metric_value is not None else "no metric"
        best = " (new best)" if reply.new_best else ""
        print(f"experiment #{e.index}: {e.status}{best} — {value}; {e.wall_seconds or 0:.1f}s wall")
        print(
            f"  ran: {e.where}"
            + (f", after {e.queued_seconds:.1f}s in the queue" if e.queued_seconds else "")
        )
        if e.interval_low is not None and e.interval_high is not None:
            noisy = "; within noise: not yet a finding" if e.within_noise else ""
            print(f"  interval: {e.interval_low:.4g}–{e.interval_high:.4g} ({e.interval_how}){noisy}")
        if e.note:
            print(f"  note: {e.note}")
        if e.params:
            print(f"  config: {format_params(e.params)}")
        for name, metric in sorted(e.metrics.items()):
            print(f"  {name}: {metric:g}")
        print(f"  log: {e.log_path}")
        print(f"  {reply.stop_status}")
        return EXIT_NO if e.status in ("crash", "interrupted") else EXIT_OK

    return body


def _working_directory() -> str:
    cwd = os.getcwd()
    if not _is_utf8(cwd):
        raise UsageError("this directory's path is not UTF-8; run the experiment from one whose path is")
    return cwd


def _environment() -> dict[str, str]:
    """The environment for an experiment, without variables that are not UTF-8 (named on stderr)."""
    env = {}
    for name, value in os.environ.items():
        if _is_utf8(name) and _is_utf8(value):
            env[name] = value
        else:
            shown = name.encode("utf-8", "surrogateescape")[:40]
            print(f"goaltender: not passing {shown!r} to the experiment: not UTF-8", file=sys.stderr)
    return env


def _split(command: str, flag: str = "--eval") -> list[str]:
    import shlex

    try:
        return shlex.split(command)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"{flag}: {exc}") from None


def cmd_ask(args):
    fields = _checked(
        p.Ask,
        goal_id=_goal_id(args),
        question=args.question,
        detail=args.detail,
        kind=args.kind,
        timeout_s=_duration(args.timeout),
    )

    async def body(runner: RunnerClient):
        a = (await runner.call(p.Ask, p.DecisionReply, **fields)).approval
        print(f"{a.state} by {a.decided_by}" + (f": {a.comment}" if a.comment else ""))
        return {"approved": EXIT_OK, "rejected": EXIT_NO}.get(a.state, EXIT_EXPIRED)

    return _run(args, body)


def cmd_stage_done(args):
    summary = _read_text(args.file.read_bytes, str(args.file)) if args.file else args.summary
    if not summary:
        raise UsageError("give the stage's summary, or --file summary.md")
    document = _read_text(args.attach.read_bytes, str(args.attach)) if args.attach else None
    fields = _checked(
        p.StageDone,
        goal_id=_goal_id(args),
        summary=summary,
        document=document,
        document_name=args.attach.name if args.attach else None,
    )

    async def body(runner: RunnerClient):
        reply = await runner.call(p.StageDone, p.StageReply, **fields)
        a = reply.approval
        print(f"{a.state} by {a.decided_by}" + (f": {a.comment}" if a.comment else ""))
        if a.state == "approved":
            print(f"stage {reply.goal.stage + 1}/{len(reply.goal.stages)}: {reply.goal.stage_name}")
        return {"approved": EXIT_OK, "rejected": EXIT_NO}.get(a.state, EXIT_EXPIRED)

    return _run(args, body)


def cmd_cross_check(args):
    fields = _checked(
        p.CrossCheck,
        goal_id=_goal_id(args),
        description=args.description,
        a=_split(args.a, "--a"),
        b=_split(args.b, "--b"),
        rtol=args.rtol,
        atol=args.atol,
        cwd=_working_directory(),
        env=_environment(),
    )

    async def body(runner: RunnerClient):
        reply = await runner.call(p.CrossCheck, p.CrossCheckReply, **fields)
        if reply.differing == 0:
            print(f"agreed: {reply.compared} numbers")
        else:
            print(f"{reply.differing} of {reply.compared} numbers differ:\n{reply.table}")
            if reply.approval is not None:
                a = reply.approval
                print(f"{a.state} by {a.decided_by}" + (f": {a.comment}" if a.comment else ""))
        print("logs: " + ", ".join(reply.logs))
        return EXIT_OK if reply.agreed else EXIT_NO

    return _run(args, body)


def cmd_inbox(args):
    fields = _checked(p.ReadInbox, goal_id=_goal_id(args), all=args.all)

    async def body(runner: RunnerClient):
        reply = await runner.call(p.ReadInbox, p.InboxReply, **fields)
        if not reply.messages:
            print("(no new messages)")
        for m in reply.messages:
            print(f"[{m.created_at:%Y-%m-%d %H:%M:%S}] {m.author}: {m.text}")

    return _run(args, body)


def cmd_diary(args):
    kind = "handoff" if args.handoff else None
    if args.action == "write":
        text = _read_text(sys.stdin.buffer.read, "stdin") if args.text in (None, "-") else args.text
        return _say_done(
            args, {"type": "write_diary", "goal_id": _goal_id(args), "text": text, "kind": kind or "note"}
        )
    fields = _checked(p.ReadDiary, goal_id=_goal_id(args), last=args.last, kind=kind)

    async def body(runner: RunnerClient):
        diary = await runner.call(p.ReadDiary, p.DiaryReply, **fields)
        if not diary.entries:
            print("(the diary is empty)")
        for e in diary.entries:
            print(f"--- {e.ts:%Y-%m-%d %H:%M:%S} {e.kind}\n{e.text}")

    return _run(args, body)


def cmd_report(args):
    text = _read_text(args.file.read_bytes, str(args.file)) if args.file else args.text
    if not text:
        raise UsageError("give the report text, or --file report.md")
    return _say_done(args, {"type": "submit_report", "goal_id": _goal_id(args), "text": text})


def cmd_fetch(args):
    from goaltender.runner.fetch_spec import FetchSpec, spec_problem

    spec = FetchSpec(args.repo, args.repo_type, args.revision, tuple(args.include))
    if problem := spec_problem(spec):
        raise UsageError(problem)
    if args.json:
        return _fetch_for_the_runner(spec, args.keep_free)
    if args.goal_id is None and "GOALTENDER_GOAL_ID" not in os.environ:
        return _fetch_here(spec)
    # Inside a goal: the runner downloads, outside the sandbox, and records it.
    fields = _checked(
        p.Fetch,
        goal_id=_goal_id(args),
        repo=spec.repo,
        repo_type=spec.repo_type,
        revision=spec.revision,
        include=list(spec.include),
    )

    async def body(runner: RunnerClient):
        reply = await runner.call(p.Fetch, p.FetchReply, **fields)
        if reply.fetch is None:
            print(f"goaltender: {reply.failure}", file=sys.stderr)
            return EXIT_NO
        _print_fetch(reply.fetch, reply.message)
        return EXIT_OK

    return _run(args, body)


def _redacted_output() -> None:
    """What this download process prints is redacted first (a mirror's URL may carry a password,
    and the library's retry lines quote it): before huggingface_hub is imported, so that its log
    handler writes through it."""
    from goaltender.runner.secrets import Redactor, redact_output

    redact_output(Redactor.from_environment())


def _fetch_here(spec: Any) -> int:
    """An operator on the box: the download in this process, with this environment (huggingface_hub
    reads HF_ENDPOINT, HF_HUB_OFFLINE and HF_HUB_CACHE when it is imported), progress on stderr."""
    _redacted_output()
    from goaltender.runner import hub

    milestone_bytes = _milestone_bytes()
    try:
        fetch = hub.fetch(spec, _say_progress, milestone_bytes=milestone_bytes)
    except hub.FetchFailed as failed:
        print(f"goaltender: {failed}", file=sys.stderr)
        return EXIT_NO
    _print_fetch(fetch)
    return EXIT_OK


def _fetch_for_the_runner(spec: Any, keep_free: int) -> int:
    """The download the runner runs for a goal (runner/fetches.py), in the runner's hub
    environment: milestones and the outcome as JSON lines on stdout, which the runner reads."""
    _redacted_output()
    from goaltender.runner import hub

    def say(**line: Any) -> None:
        print(json.dumps(line), flush=True)

    def milestone(title: str, text: str) -> None:  # from the download's threads, one at a time
        say(milestone={"title": title, "text": text})

    milestone_bytes = _milestone_bytes()
    try:
        fetch = hub.fetch(spec, milestone, milestone_bytes=milestone_bytes, keep_free=keep_free)
    except hub.FetchFailed as failed:
        say(failed=str(failed))
        return EXIT_NO
    say(fetched=fetch.model_dump(mode="json"))
    return EXIT_OK


def _milestone_bytes() -> int:
    """GOALTENDER_FETCH_MILESTONE_MB: downloads from this size on report progress milestones."""
    text = os.environ.get("GOALTENDER_FETCH_MILESTONE_MB", "100")
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = -1.0
    if not 0 <= megabytes < 1e12:
        raise UsageError(f"GOALTENDER_FETCH_MILESTONE_MB is not a size in MB: {text[:40]!r}")
    return int(megabytes * 1000 * 1000)


def _say_progress(title: str, text: str) -> None:
    print(f"goaltender: {title}" + (f": {text}" if text else ""), file=sys.stderr, flush=True)


def _print_fetch(fetch: HubFetch, recorded: str = "") -> None:
    from goaltender.runner.report import fetch_summary

    print(fetch.path)
    print(fetch_summary(fetch) + (f"; {recorded}" if recorded else ""))


def cmd_skill_edit(args):
    if args.file == "-":
        content = _read_text(sys.stdin.buffer.read, "stdin")
    else:
        content = _read_text(_path(args.file).read_bytes, args.file)
    fields = _checked(
        p.SkillEdit,
        goal_id=_goal_id(args),
        skill=args.skill,
        path=args.path,
        content=content,
        why=args.why,
        timeout_s=_duration(args.timeout),
    )

    async def body(runner: RunnerClient):
        reply = await runner.call(p.SkillEdit, p.SkillEditReply, **fields)
        a = reply.approval
        print(f"{a.state} by {a.decided_by}" + (f": {a.comment}" if a.comment else ""))
        print(reply.message)
        if a.state == "approved":
            return EXIT_OK if reply.commit else EXIT_NO
        return EXIT_NO if a.state == "rejected" else EXIT_EXPIRED

    return _run(args, body)


def cmd_skills(args):
    if args.action == "log":
        fields = _checked(p.SkillLog, limit=args.limit)
    else:
        fields = _checked(p.RevertSkill, commit=args.commit)

    async def body(runner: RunnerClient):
        if args.action == "revert":
            print((await runner.call(p.RevertSkill, p.Done, **fields)).message)
            return
        for c in (await runner.call(p.SkillLog, p.SkillLogReply, **fields)).commits:
            print(f"{c.commit}  {c.at:%Y-%m-%d %H:%M}  {c.subject}")

    return _run(args, body)


if __name__ == "__main__":
    sys.exit(main())
