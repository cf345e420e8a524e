"""The agents' verbs, run from inside a goal (GOALTENDER_GOAL_ID and the goal's own socket in the
environment): milestone, metrics, experiment, nemo-rl, ask, stage-done, cross-check, inbox, diary,
report, skills edit.

Each is a process of its own, paid on every milestone and metric, so this module imports the
standard library's lightest and protocol/quick_client.py alone: milestone, metrics, diary write and
report send plain JSON through it (no pydantic, no asyncio; tests/test_cli_quick.py). The verbs that
wait on the runner (experiment, ask, …) import the protocol and the asyncio client when they run."""

from __future__ import annotations

import argparse
import json
import os
import sys

from goaltender.cli import talk
from goaltender.cli.common import (
    COUNT,
    EXIT_EXPIRED,
    EXIT_NO,
    EXIT_OK,
    ID,
    Command,
    UsageError,
    finite,
    goal_argument,
    goal_id,
    is_utf8,
    path,
    read_file_or_stdin,
    read_text,
    whole_number,
)
from goaltender.protocol.quick_client import encode

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import Any

    from goaltender.protocol import messages as p
    from goaltender.protocol.client import RunnerClient


def _decided(approval: p.Approval) -> str:
    """`approved by NAME: comment`, as the verbs that wait for a person print it."""
    return f"{approval.state} by {approval.decided_by}" + (
        f": {approval.comment}" if approval.comment else ""
    )


DECIDED_EXIT = {"approved": EXIT_OK, "rejected": EXIT_NO}  # else expired


# ---- the quick verbs: plain JSON through protocol/quick_client.py ----


class Milestone(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("title", help="one line: what happened")
        parser.add_argument("text", nargs="?", default="", help="details (markdown)")
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        milestone = {"type": "milestone", "goal_id": goal_id(args), "title": args.title, "text": args.text}
        return talk.say_done(args, milestone | {"curves": None})


class Metrics(Command):
    description = """\
        log metric values: goaltender metrics loss=0.31 acc=0.82 --step 100
        or many at once, as JSON lines: goaltender metrics --file - < points.jsonl
        where each line is {"name": "loss", "value": 0.31, "step": 100} (step optional)"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("values", nargs="*", metavar="NAME=VALUE")
        parser.add_argument(
            "--file", help="JSON lines of points, one {name, value, step} per line (- for stdin)"
        )
        parser.add_argument("--step", type=finite)
        parser.add_argument("--experiment", type=ID, dest="experiment_id")
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        if bool(args.values) == bool(args.file):
            raise UsageError("give NAME=VALUE pairs or --file FILE (JSON lines), one or the other")
        from goaltender.cli.metric_points import metric_requests, metric_value, points_from_lines

        if args.file:
            points = points_from_lines(read_file_or_stdin(args.file), step=args.step)
        else:
            points = [
                encode({"name": k, "value": metric_value(k, v), "step": args.step})
                for k, v in _key_values(args.values).items()
            ]
        # Sent together, answered in order: one round trip, however many requests.
        replies = talk.send(args, metric_requests(goal_id(args), args.experiment_id, points))
        if len(replies) == 1:
            print(replies[0]["message"])
        else:
            print(f"{len(points)} metric point(s) logged in {len(replies)} requests")
        return EXIT_OK


class Diary(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="write|read", required=True)
        write = actions.add_parser("write", help="add an entry: goaltender diary write [--handoff] TEXT")
        write.add_argument("text", nargs="?", help="the entry (or - for stdin)")
        write.add_argument("--handoff", action="store_true", help="a handoff: everything needed to resume")
        goal_argument(write)
        read = actions.add_parser(
            "read", help="print recent entries: goaltender diary read [--handoff] [--last N]"
        )
        read.add_argument("--handoff", action="store_true", help="only handoffs")
        read.add_argument("--last", type=COUNT, default=20, help="how many entries")
        goal_argument(read)
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        if args.action == "write":
            text = read_file_or_stdin("-") if args.text in (None, "-") else args.text
            kind = "handoff" if args.handoff else "note"
            return talk.say_done(
                args, {"type": "write_diary", "goal_id": goal_id(args), "text": text, "kind": kind}
            )
        return self.read(args)

    def read(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        kind = "handoff" if args.handoff else None
        request = talk.checked(p.ReadDiary, goal_id=goal_id(args), last=args.last, kind=kind)

        async def body(runner: RunnerClient) -> None:
            diary = await runner.request(request)
            if not diary.entries:
                print("(the diary is empty)")
            for e in diary.entries:
                print(f"--- {e.ts:%Y-%m-%d %H:%M:%S} {e.kind}\n{e.text}")

        return talk.run(args, body)


class Report(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("text", nargs="?", help="markdown text (or use --file)")
        parser.add_argument("--file", type=path)
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        text = read_text(args.file.read_bytes, str(args.file)) if args.file else args.text
        if not text:
            raise UsageError("give the report text, or --file report.md")
        return talk.say_done(args, {"type": "submit_report", "goal_id": goal_id(args), "text": text})


# ---- the arguments' words ----


def _key_values(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"expected NAME=VALUE, got {item[:60]!r}")
        pairs[key] = value
    return pairs


# ---- experiments ----


def _placement_arguments(parser: argparse.ArgumentParser) -> None:
    """Where an experiment runs, and on how many GPUs (defaults: the goal's, then the box's)."""
    parser.add_argument(
        "--gpus",
        type=COUNT,
        help="GPUs it needs; it waits in the box's fair queue until they are free (default: the "
        "goal's, else GOALTENDER_GPUS_PER_EXPERIMENT, else 1 on a box with GPUs)",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "ray", "slurm"),
        help="run it on this box (local), as a Ray job or as a Slurm job (default: the goal's, else "
        "GOALTENDER_EXECUTOR)",
    )


class Experiment(Command):
    description = """\
        Run one experiment under supervision and record it in the ledger:

          goaltender experiment -d "lr 3e-4: faster convergence?" --param lr=3e-4 \\
              --metric val_accuracy -- python train.py --lr 3e-4

        The runner starts COMMAND in its own process group, captures its output to
        experiments/NNN/run.log in the goal's workspace, reads metrics from it as it runs
        (JSON lines such as {"step": 10, "loss": 0.5} are series; a final `name: value`
        line is the run's summary), enforces the per-experiment timeout and the goal's
        budgets, accounts wall time and compute, and writes a ledger row: keep (new best
        on --metric), discard (no better) or crash (failed, timed out, or no metric).
        The row is printed when the run ends; the command's own output stays in the log."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-d", "--description", required=True, help="the hypothesis this run tests")
        parser.add_argument(
            "--param", action="append", default=[], metavar="K=V", help="a config value to record"
        )
        parser.add_argument("--metric", help="headline metric name (default: the goal's)")
        parser.add_argument("--minimize", action="store_true", help="lower is better for --metric")
        parser.add_argument(
            "--timeout", help="per-run time limit, e.g. 10m (the goal's limit may be tighter)"
        )
        parser.add_argument(
            "--eval",
            dest="eval_command",
            help="a command the runner runs itself after a successful run to measure --metric on the "
            "held-out split (it finds the run's files in $GOALTENDER_EXPERIMENT_DIR); without it the "
            "metric is marked 'reported'",
        )
        _placement_arguments(parser)
        parser.add_argument(
            "--repeat",
            type=whole_number(1),
            default=1,
            help="run it (and --eval) N times with GOALTENDER_SEED=0..N-1; the row holds the mean ± sd",
        )
        parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            raise UsageError(
                "give the command after --, e.g. goaltender experiment -d '...' -- python train.py"
            )
        request = talk.checked(
            p.RunExperiment,
            goal_id=goal_id(args),
            command=command,
            description=args.description,
            params={k: _number_or_text(v) for k, v in _key_values(args.param).items()},
            metric=args.metric,
            direction="minimize" if args.minimize else ("maximize" if args.metric else None),
            timeout_s=talk.duration(args.timeout),
            cwd=_working_directory(),
            env=_environment(),  # what the agent exported reaches its experiment
            eval_command=_split(args.eval_command) if args.eval_command else None,
            gpus=args.gpus,
            executor=args.executor,
            repeat=args.repeat,
        )
        return talk.run(args, _experiment_body(request))


class NemoRL(Command):
    description = """\
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
        (--eval-metric, default the goal's metric), e.g. held-out exact_accuracy."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from goaltender.training.launch import add_recipe_parsers

        def recipe_arguments(recipe: argparse.ArgumentParser) -> None:
            _placement_arguments(recipe)
            goal_argument(recipe)

        add_recipe_parsers(parser, recipe_arguments)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p
        from goaltender.training.launch import LaunchError, plan

        goal = goal_id(args)
        cwd = _working_directory()
        overrides = args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides
        try:
            run = plan(
                args.recipe,
                args.config,
                overrides,
                cwd=path(cwd),
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
        request = talk.checked(
            p.RunExperiment,
            goal_id=goal,
            command=run.command(),
            description=args.description or run.description(),
            params=run.params(),
            metric=metric,
            direction=direction,
            timeout_s=talk.duration(args.timeout),
            cwd=cwd,
            env=_environment(),
            eval_command=run.eval_command,
            gpus=args.gpus,
            executor=args.executor,
        )
        return talk.run(args, _experiment_body(request))


def _experiment_body(request: p.RunExperiment) -> Callable[[RunnerClient], Awaitable[int]]:
    """Run the experiment and print its ledger row."""
    from goaltender.display.params import format_params

    async def body(runner: RunnerClient) -> int:
        reply = await runner.request(request)
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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _number_or_text(value: str) -> Any:
    """A --param value: JSON when it is (3e-4, true, [64, 64]), else the text as given.

    NaN and Infinity stay text: JSON has no such numbers."""
    try:
        return json.loads(value, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # not JSON, too many digits, nested too deep
        return value


def _working_directory() -> str:
    cwd = os.getcwd()
    if not is_utf8(cwd):
        raise UsageError("this directory's path is not UTF-8; run the experiment from one whose path is")
    return cwd


def _environment() -> dict[str, str]:
    """The environment for an experiment, without variables that are not UTF-8 (named on stderr)."""
    env = {}
    for name, value in os.environ.items():
        if is_utf8(name) and is_utf8(value):
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


# ---- verbs that wait for a person ----


class Ask(Command):
    description = """\
        Ask for approval and block until a person decides or the prompt expires.
        Exit code 0: approved; 1: rejected; 3: expired (treat as rejected).
        The decider's name and comment are printed."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("question")
        parser.add_argument("--detail", default="", help="context for the decision (cost, risk, plan)")
        parser.add_argument("--timeout", help="how long to wait, e.g. 30m (default: the runner's)")
        parser.add_argument("--kind", default="generic", help="cost | command | generic")
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(
            p.Ask,
            goal_id=goal_id(args),
            question=args.question,
            detail=args.detail,
            kind=args.kind,
            timeout_s=talk.duration(args.timeout),
        )

        async def body(runner: RunnerClient) -> int:
            approval = (await runner.request(request)).approval
            print(_decided(approval))
            return DECIDED_EXIT.get(approval.state, EXIT_EXPIRED)

        return talk.run(args, body)


class StageDone(Command):
    description = """\
        A staged goal (`stages: plan, implement, campaign` in its words) passes a gate
        between stages: this posts the stage's summary (and --attach DOC, e.g. the plan)
        in the thread and waits for a person to decide. Exit code 0: approved, the next
        stage has started (it is printed); 1: rejected (the comment says why); 3: expired.
        Experiments start in the stage named `campaign`."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("summary", nargs="?", help="what the stage did and found (or --file)")
        parser.add_argument("--file", type=path, help="the summary, from a file")
        parser.add_argument("--attach", type=path, help="a document for the humans to review, e.g. plan.md")
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        summary = read_text(args.file.read_bytes, str(args.file)) if args.file else args.summary
        if not summary:
            raise UsageError("give the stage's summary, or --file summary.md")
        document = read_text(args.attach.read_bytes, str(args.attach)) if args.attach else None
        request = talk.checked(
            p.StageDone,
            goal_id=goal_id(args),
            summary=summary,
            document=document,
            document_name=args.attach.name if args.attach else None,
        )

        async def body(runner: RunnerClient) -> int:
            reply = await runner.request(request)
            print(_decided(reply.approval))
            if reply.approval.state == "approved":
                print(f"stage {reply.goal.stage + 1}/{len(reply.goal.stages)}: {reply.goal.stage_name}")
            return DECIDED_EXIT.get(reply.approval.state, EXIT_EXPIRED)

        return talk.run(args, body)


class CrossCheck(Command):
    description = """\
        Runs A, then B, in the goal's sandbox, on the same toy input; each prints
        `name: value` lines (the numbers a paper's equations give on a toy batch, say).
        Every number either printed must agree within --rtol/--atol. A disagreement is
        posted as an approval prompt with the table, and the goal's experiments wait until
        a person decides: exit code 0 when they agree or a person lets it pass, 1 when the
        disagreement stands (fix the implementations and cross-check again)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-d", "--description", required=True, help="what is compared, on what input")
        parser.add_argument("--a", required=True, dest="a", help="implementation A's command (one string)")
        parser.add_argument("--b", required=True, dest="b", help="implementation B's command (one string)")
        parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
        parser.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance (default 1e-8)")
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(
            p.CrossCheck,
            goal_id=goal_id(args),
            description=args.description,
            a=_split(args.a, "--a"),
            b=_split(args.b, "--b"),
            rtol=args.rtol,
            atol=args.atol,
            cwd=_working_directory(),
            env=_environment(),
        )

        async def body(runner: RunnerClient) -> int:
            reply = await runner.request(request)
            if reply.differing == 0:
                print(f"agreed: {reply.compared} numbers")
            else:
                print(f"{reply.differing} of {reply.compared} numbers differ:\n{reply.table}")
                if reply.approval is not None:
                    print(_decided(reply.approval))
            print("logs: " + ", ".join(reply.logs))
            return EXIT_OK if reply.agreed else EXIT_NO

        return talk.run(args, body)


class Inbox(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--all", action="store_true", help="include messages already read")
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(p.ReadInbox, goal_id=goal_id(args), all=args.all)

        async def body(runner: RunnerClient) -> None:
            reply = await runner.request(request)
            if not reply.messages:
                print("(no new messages)")
            for m in reply.messages:
                print(f"[{m.created_at:%Y-%m-%d %H:%M:%S}] {m.author}: {m.text}")

        return talk.run(args, body)


class SkillsEdit(Command):
    description = """\
        Propose new content for a skill file in the box's skill folder: what you learned, for
        the next goals' agents. The runner shows the humans the diff and waits for a decision.

          goaltender skills edit --skill autoresearch --file new-SKILL.md --why "…"
          goaltender skills edit --skill nemo-rl --path references/oom.md --file oom.md

        --file is the whole new text (- for stdin) of SKILL.md, or of --path references/NAME;
        a new skill (a new name of lower-case letters, digits and -) starts with its SKILL.md.
        Exit code 0: approved and applied (the commit is printed); 1: rejected, or approved but
        no longer applicable; 3: expired. Nothing is written without a person's approval.
        (`goaltender skill-edit`, its old name, still works.)"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--skill", required=True, help="the skill's name, e.g. autoresearch")
        parser.add_argument("--path", default="SKILL.md", help="SKILL.md (default) or references/NAME")
        parser.add_argument("--file", required=True, help="the file's proposed new content (- for stdin)")
        parser.add_argument("--why", default="", help="what you learned that makes this edit worth it")
        parser.add_argument(
            "--timeout", help="how long to wait for a decision, e.g. 30m (default: the runner's)"
        )
        goal_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        content = read_file_or_stdin(args.file)
        request = talk.checked(
            p.SkillEdit,
            goal_id=goal_id(args),
            skill=args.skill,
            path=args.path,
            content=content,
            why=args.why,
            timeout_s=talk.duration(args.timeout),
        )

        async def body(runner: RunnerClient) -> int:
            reply = await runner.request(request)
            print(_decided(reply.approval))
            print(reply.message)
            if reply.approval.state == "approved":
                return EXIT_OK if reply.commit else EXIT_NO
            return EXIT_NO if reply.approval.state == "rejected" else EXIT_EXPIRED

        return talk.run(args, body)
