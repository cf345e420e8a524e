"""The box's verbs: its long-running processes (runner, bot, demo), its set-up and checks (service,
doctor, preflight), its data (fetch, backup, restore). Each imports what it runs when it runs it:
`goaltender fetch` is also run by agents and by the runner, a process each."""

from __future__ import annotations

import argparse
import json
import os
import sys

from goaltender.cli import talk
from goaltender.cli.common import (
    COUNT,
    EXIT_NO,
    EXIT_OK,
    EXIT_USAGE,
    Command,
    UsageError,
    goal_argument,
    goal_id,
    path,
    port,
)

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from typing import Any

    from goaltender.protocol.client import RunnerClient
    from goaltender.protocol.fetch_spec import FetchSpec
    from goaltender.storage.records import HubFetch


class Runner(Command):
    description = """\
        goaltender runner          start the runner daemon in the foreground
        goaltender runner attach   bridge stdin/stdout to a running runner's socket (for SSH hosts
                                   whose sshd forbids stream forwarding: the bot runs this command)"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("action", nargs="?", choices=["attach"], help="attach: the stdio bridge")
        parser.add_argument("--socket", type=path, default=argparse.SUPPRESS, help="the runner socket")
        parser.add_argument(
            "--home", type=path, help="state directory (default: $GOALTENDER_HOME or ~/.goaltender)"
        )

    def run(self, args: argparse.Namespace) -> int:
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


class Demo(Command):
    description = """\
        Start a local runner, submit a goal, and print the goal's thread as it would
        appear in Slack: milestones, ledger rows, approval prompts (answered here), plots
        (PNG files) and the final report. Needs no Slack, no GPU and no model endpoint."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal", nargs="?", help="the goal's text (default: the star-count campaign)")
        parser.add_argument("--yes", action="store_true", help="approve every prompt (for scripts)")
        parser.add_argument(
            "--dir", type=path, default="goaltender-demo", help="where state, plots and logs go"
        )
        parser.add_argument(
            "--agent",
            choices=["sweep", "openai", "codex"],
            default="sweep",
            help="sweep (no model needed), or an LLM agent on the endpoint in OPENAI_BASE_URL / "
            "OPENAI_API_KEY with model GOALTENDER_MODEL",
        )

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.demo import run_demo
        from goaltender.protocol import messages as p

        talk.require_sound_interpreter()  # its runner runs in this process: the default goal's `budget 3m` too
        if args.goal is not None:
            talk.checked(p.SubmitGoal, text=args.goal)
            talk.check_goal_words(args.goal)
        return run_demo(args.goal, directory=args.dir, yes=args.yes, agent=args.agent)


class Bot(Command):
    description = """\
        Run the Slack bot. It needs SLACK_BOT_TOKEN (xoxb-…) and SLACK_APP_TOKEN (xapp-…) from an
        app created from manifest.yml, and reaches the runners listed in its config (default: the
        local runner socket). With GOALTENDER_SLACK_MODE=http it serves /slack/events on
        GOALTENDER_HTTP_PORT instead of Socket Mode and needs SLACK_SIGNING_SECRET, not the app
        token. With --check it checks instead and exits: the tokens (auth.test), each runner,
        and bot.db's writes waiting or parked; exit 1 when something is wrong."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--check", action="store_true", help="check tokens, runners and the outbox, then exit"
        )

    def run(self, args: argparse.Namespace) -> int:
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


class Doctor(Command):
    description = """\
        Check this GPU box, one line each (ok / warn / fail, with the fix): Python, GPUs and driver
        (NVML), free space on GOALTENDER_HOME's disk, cache routing, the NeMo RL checkout
        (NEMO_RL_DIR) and its venv, the nemo-gym venv (GOALTENDER_GYM_VENV), the hub or its
        mirror (or offline mode), the model endpoint, the runner and its sandbox, sshd for the
        bot. Keys and tokens are never shown. Exit 1 when a check fails, else 0: a service may
        gate its start on it (a hub out of reach with no mirror configured only warns)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the findings as a JSON list")
        parser.add_argument("--strict", action="store_true", help="exit 1 when a check warns, too")
        parser.add_argument(
            "--ssh-port", type=port, default=22, help="the port the bot reaches sshd on (default 22)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.runner.doctor import doctor

        text, code = doctor(args.socket, as_json=args.json, ssh_port=args.ssh_port, strict=args.strict)
        sys.stdout.write(text)
        return code


class Service(Command):
    description = """\
        goaltender service install   write goaltender-runner.service and goaltender-bot.service
                                     (/etc/systemd/system; --user: ~/.config/systemd/user), the
                                     environment files that are missing (/etc/goaltender/
                                     goaltender.env and bot.env, from the examples), the home;
                                     then systemctl daemon-reload, and say what to run next
        goaltender service show runner|bot   print a unit as install would write it"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("action", choices=["install", "show"])
        parser.add_argument("service", nargs="?", choices=["runner", "bot"], help="show: which unit")
        parser.add_argument(
            "--user", action="store_true", help="a user service (systemctl --user), not a system one"
        )
        parser.add_argument(
            "--as",
            dest="account",
            metavar="USER",
            help="the user a system service runs as (default: $SUDO_USER, else you)",
        )
        parser.add_argument("--home", type=path, help="GOALTENDER_HOME (default: ~USER/.goaltender)")
        parser.add_argument("--unit-dir", type=path, help="where the units go (default: systemd's folder)")
        parser.add_argument(
            "--env-dir", type=path, help="where the environment files go (default: /etc/goaltender)"
        )

    def run(self, args: argparse.Namespace) -> int:
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


class Preflight(Command):
    description = """\
        Count each example's tokens (the model's processor when installed and local, else an
        estimate) and print one line per file: n, max, p95, over-limit count. Exit 1, naming the
        worst, when any example has >= --max-seq-len tokens: NeMo RL would train on it with zero
        loss and no warning. --drop writes NAME.filtered.jsonl without them instead."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from goaltender.environments import preflight

        preflight.add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.environments import preflight

        return preflight.run(args)


class Backup(Command):
    description = """\
        Copies each database on this box (runner.db in GOALTENDER_HOME, bot.db at GOALTENDER_DB or
        in the home) into a new directory named by the time, with SQLite's online backup API: the
        copy is the database as one commit left it, even while the runner and the bot write."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--to", type=path, help="where the dated directory goes (default: $GOALTENDER_HOME/backups)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from goaltender import lifecycle

        try:
            lines = lifecycle.backup(args.to)
        except (lifecycle.NothingThere, FileExistsError, OSError) as exc:
            print(f"goaltender backup: {exc}", file=sys.stderr)
            return EXIT_NO
        print("\n".join(lines))
        return EXIT_OK


class Restore(Command):
    description = """\
        BACKUP is a directory `goaltender backup` wrote (each database in it is restored) or one
        .db file. The runner (or the bot) must be stopped; what was at the database's path is
        set aside as <name>.before-restore-<time>, never deleted."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("backup", type=path, help="a backup directory, or a runner.db or bot.db copy")
        parser.add_argument("--only", choices=["runner", "bot"], help="restore this database alone")

    def run(self, args: argparse.Namespace) -> int:
        from goaltender import lifecycle

        try:
            lines = lifecycle.restore(args.backup, args.only)
        except (lifecycle.RestoreRefused, OSError) as exc:
            print(f"goaltender restore: {exc}", file=sys.stderr)
            return EXIT_NO
        print("\n".join(lines))
        return EXIT_OK


class Fetch(Command):
    description = """\
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
        environment's HF_* variables. Exit 1 when the fetch fails, saying why in one line."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("repo", help="owner/name on the hub")
        parser.add_argument("--revision", help="a branch, tag or commit (default: main)")
        parser.add_argument("--type", dest="repo_type", choices=["model", "dataset"], default="model")
        parser.add_argument(
            "--include",
            action="extend",
            nargs="+",
            default=[],
            metavar="PATTERN",
            help="only the files these globs match, e.g. '*.json' '*.safetensors' (default: every file)",
        )
        goal_argument(parser)
        # The runner's own download for a goal (runner/fetches.py): never a goal's, and results as
        # JSON lines on stdout; `--keep-free` bytes stay free on the cache's disk.
        parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--keep-free", type=COUNT, default=0, help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol.fetch_spec import FetchSpec, spec_problem

        spec = FetchSpec(args.repo, args.repo_type, args.revision, tuple(args.include))
        if problem := spec_problem(spec):
            raise UsageError(problem)
        if args.json:
            return _fetch_for_the_runner(spec, args.keep_free)
        if args.goal_id is None and "GOALTENDER_GOAL_ID" not in os.environ:
            return _fetch_here(spec)
        return _fetch_through_the_runner(args, spec)


def _fetch_through_the_runner(args: argparse.Namespace, spec: FetchSpec) -> int:
    """Inside a goal: the runner downloads, outside the sandbox, and records it."""
    from goaltender.protocol import messages as p

    request = talk.checked(
        p.Fetch,
        goal_id=goal_id(args),
        repo=spec.repo,
        repo_type=spec.repo_type,
        revision=spec.revision,
        include=list(spec.include),
    )

    async def body(runner: RunnerClient) -> int:
        reply = await runner.request(request)
        if reply.fetch is None:
            print(f"goaltender: {reply.failure}", file=sys.stderr)
            return EXIT_NO
        _print_fetch(reply.fetch, reply.message)
        return EXIT_OK

    return talk.run(args, body)


def _redacted_output() -> None:
    """What this download process prints is redacted first (a mirror's URL may carry a password,
    and the library's retry lines quote it): before huggingface_hub is imported, so that its log
    handler writes through it."""
    from goaltender.runner.secrets import Redactor, redact_output

    redact_output(Redactor.from_environment())


def _fetch_here(spec: FetchSpec) -> int:
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


def _fetch_for_the_runner(spec: FetchSpec, keep_free: int) -> int:
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
