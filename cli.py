"""`goaltender`: run the runner or the demo, drive goals, and — for agents — the research verbs."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

from goaltender.runner import protocol as p
from goaltender.runner.budget import parse_duration
from goaltender.runner.client import RunnerClient, RunnerUnavailable, socket_from_env
from goaltender.runner.report import format_params
from goaltender.storage.records import MetricPoint

EXIT_OK = 0
EXIT_NO = 1  # rejected approval, crashed experiment
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

Operators (and the Slack bot) drive goals: submit, status, summary, steer, budget,
                                          pause, resume, stop, approve, reject, events,
                                          log, audit
Agents report from inside a goal:         milestone, metrics, experiment, ask, inbox,
                                          diary, report
Operators are the users the runner allows (GOALTENDER_OPERATORS; default: its own user);
the runner knows them by the socket's peer uid. Agent verbs read GOALTENDER_GOAL_ID and
GOALTENDER_SOCKET (the goal's own socket, which serves the agent verbs only) from the
environment the runner gives them."""

EXIT_CODES = """\
exit codes: 0 ok / approved / experiment ran (keep or discard); 1 rejected / experiment crashed;
2 bad arguments; 3 approval expired; 4 runner unreachable or request refused; 5 budget used up"""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args) or EXIT_OK
    except RunnerUnavailable as exc:
        print(f"goaltender: {exc}", file=sys.stderr)
        return EXIT_RUNNER
    except p.ProtocolError as exc:
        print(f"goaltender: the runner refused: {exc.error.message}", file=sys.stderr)
        return EXIT_BUDGET if exc.error.code == "budget_exhausted" else EXIT_RUNNER
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `goaltender events | head`: the reader has gone, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goaltender",
        description=DESCRIPTION,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--socket", type=Path, help="runner socket (default: $GOALTENDER_SOCKET or ~/.goaltender)"
    )
    sub = parser.add_subparsers(metavar="command")

    def command(
        name: str, func: Callable, help: str, description: str | None = None
    ) -> argparse.ArgumentParser:
        cmd = sub.add_parser(
            name,
            help=help,
            description=textwrap.dedent(description or help),
            epilog=EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
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
    cmd.add_argument("--socket", type=Path, default=argparse.SUPPRESS, help="the runner socket")
    cmd.add_argument("--home", type=Path, help="state directory (default: $GOALTENDER_HOME or ~/.goaltender)")

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
    cmd.add_argument(
        "--dir", type=Path, default=Path("goaltender-demo"), help="where state, plots and logs go"
    )
    cmd.add_argument(
        "--agent",
        choices=["sweep", "openai", "codex"],
        default="sweep",
        help="sweep (no model needed), or an LLM agent on the endpoint in OPENAI_BASE_URL / "
        "OPENAI_API_KEY with model GOALTENDER_MODEL",
    )

    command(
        "bot",
        cmd_bot,
        "run the Slack bot: /goal, goal threads, approvals, steering, digests",
        """\
        Run the Slack bot. It needs SLACK_BOT_TOKEN (xoxb-…) and SLACK_APP_TOKEN (xapp-…) from an
        app created from manifest.yml, and reaches the runners listed in its config (default: the
        local runner socket). With GOALTENDER_SLACK_MODE=http it serves /slack/events on
        GOALTENDER_HTTP_PORT instead of Socket Mode and needs SLACK_SIGNING_SECRET, not the app
        token.""",
    )

    # -- people --
    cmd = command("submit", cmd_submit, "submit a goal, e.g. 'reach 90%% accuracy, budget 2h'")
    cmd.add_argument("text")
    cmd.add_argument("--owner", default=os.environ.get("USER"), help="default: $USER, else who you are")
    cmd.add_argument("--agent", help="agent to run the goal (default: the runner's default)")

    cmd = command("status", cmd_status, "show goals: state, budgets used, best result")
    cmd.add_argument("goal_id", nargs="?", type=int)

    cmd = command("summary", cmd_summary, "print a goal's summary and ledger (markdown)")
    cmd.add_argument("goal_id", type=int)

    cmd = command("steer", cmd_steer, "send a steering message to a goal's agent (its inbox)")
    cmd.add_argument("goal_id", type=int)
    cmd.add_argument("text")
    cmd.add_argument("--author", help="whom you speak for (recorded as AUTHOR via cli (uid N))")

    cmd = command("budget", cmd_budget, "change a goal's budget: '+2h', 'max 10 experiments', 'gpu-hours 8'")
    cmd.add_argument("goal_id", type=int)
    cmd.add_argument("change")

    for name, func, help in (
        ("pause", cmd_pause, "pause a goal: the running experiment finishes, no new one starts"),
        ("resume", cmd_resume, "resume a paused goal"),
        ("stop", cmd_stop, "stop a goal: end its agent and experiments, write the final report"),
    ):
        cmd = command(name, func, help)
        cmd.add_argument("goal_id", type=int)
        if name == "stop":
            cmd.add_argument("--reason", default="")

    for name, func in (("approve", cmd_approve), ("reject", cmd_reject)):
        cmd = command(name, func, f"{name} a pending approval prompt")
        cmd.add_argument("approval_id", type=int)
        cmd.add_argument("--comment")

    cmd = command("audit", cmd_audit, "print the audit trail: control actions and refused attempts, and who")
    cmd.add_argument("goal_id", nargs="?", type=int, help="only this goal's entries")
    cmd.add_argument("--limit", type=int, default=200, help="the newest N entries (default 200)")

    cmd = command("events", cmd_events, "print the event log (optionally follow it)")
    cmd.add_argument("--since", type=int, default=0)
    cmd.add_argument("--goal", type=int, dest="goal_id")
    cmd.add_argument("--follow", "-f", action="store_true")

    cmd = command("log", cmd_log, "print an experiment's log")
    cmd.add_argument("experiment_id", type=int)
    cmd.add_argument("--offset", type=int, default=0)

    # -- agent verbs --
    def goal_arg(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--goal", type=int, dest="goal_id", help="goal id (default: $GOALTENDER_GOAL_ID)")

    cmd = command("milestone", cmd_milestone, "report a milestone to the goal's thread")
    cmd.add_argument("title", help="one line: what happened")
    cmd.add_argument("text", nargs="?", default="", help="details (markdown)")
    goal_arg(cmd)

    cmd = command(
        "metrics",
        cmd_metrics,
        "log metric values",
        "log metric values: goaltender metrics loss=0.31 acc=0.82 --step 100",
    )
    cmd.add_argument("values", nargs="+", metavar="NAME=VALUE")
    cmd.add_argument("--step", type=float)
    cmd.add_argument("--experiment", type=int, dest="experiment_id")
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
    cmd.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    goal_arg(cmd)

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
    read.add_argument("--last", type=int, default=20, help="how many entries")
    goal_arg(read)
    goal_arg(cmd)

    cmd = command("report", cmd_report, "hand in your words for the final report (findings, next steps)")
    cmd.add_argument("text", nargs="?", help="markdown text (or use --file)")
    cmd.add_argument("--file", type=Path)
    goal_arg(cmd)
    return parser


# ---- plumbing ----


def _run(args: argparse.Namespace, body: Callable[[RunnerClient], Awaitable[int | None]]) -> int:
    async def go() -> int | None:
        path = args.socket or socket_from_env()
        async with await RunnerClient.connect_unix(path, client=f"cli:{args.func.__name__[4:]}") as runner:
            return await body(runner)

    return asyncio.run(go()) or EXIT_OK


def _goal_id(args: argparse.Namespace) -> int:
    if args.goal_id is not None:
        return args.goal_id
    if value := os.environ.get("GOALTENDER_GOAL_ID"):
        return int(value)
    raise SystemExit(
        "goaltender: no goal: pass --goal N or set GOALTENDER_GOAL_ID (the runner sets it for agents)"
    )


def _duration(text: str | None) -> float | None:
    if text is None:
        return None
    seconds = parse_duration(text)
    if seconds is None:
        try:
            return float(text)
        except ValueError:
            raise SystemExit(f"goaltender: not a duration: {text!r} (try 90s, 10m, 2h)") from None
    return seconds


def _key_values(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"goaltender: expected NAME=VALUE, got {item!r}")
        pairs[key] = value
    return pairs


def _number_or_text(value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _print_status(status: p.GoalStatus) -> None:
    goal = status.goal
    print(f"goal #{goal.id} [{goal.state}] {goal.text}")
    print(f"  agent {goal.agent}, owner {goal.owner}; {status.stop_status}")
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
    from goaltender.bot.app import main as bot_main

    bot_main()
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from goaltender.demo import run_demo

    return run_demo(args.goal, directory=args.dir, yes=args.yes, agent=args.agent)


def cmd_submit(args):
    async def body(runner: RunnerClient):
        reply = await runner.call(
            p.SubmitGoal, p.GoalReply, text=args.text, owner=args.owner, agent=args.agent
        )
        _print_status(reply.status)

    return _run(args, body)


def cmd_status(args):
    async def body(runner: RunnerClient):
        reply = await runner.call(p.Status, p.StatusReply, goal_id=args.goal_id)
        for status in reply.goals:
            _print_status(status)
        if not reply.goals:
            print("no goals yet; submit one with: goaltender submit 'your goal, budget 1h'")

    return _run(args, body)


def cmd_summary(args):
    async def body(runner: RunnerClient):
        print((await runner.call(p.Summary, p.SummaryReply, goal_id=args.goal_id)).text)

    return _run(args, body)


def _done(kind: type[p.Request], **fields_from_args: str):
    def cmd(args):
        async def body(runner: RunnerClient):
            fields = {field: getattr(args, attr) for field, attr in fields_from_args.items()}
            print((await runner.call(kind, p.Done, **fields)).message)

        return _run(args, body)

    cmd.__name__ = f"cmd_{kind.model_fields['type'].default}"
    return cmd


cmd_steer = _done(p.Steer, goal_id="goal_id", text="text", author="author")
cmd_budget = _done(p.ChangeBudget, goal_id="goal_id", change="change")
cmd_pause = _done(p.Pause, goal_id="goal_id")
cmd_resume = _done(p.Resume, goal_id="goal_id")
cmd_stop = _done(p.Stop, goal_id="goal_id", reason="reason")


def _decide(approve: bool):
    def cmd(args):
        async def body(runner: RunnerClient):
            reply = await runner.call(
                p.Decide,
                p.DecisionReply,
                approval_id=args.approval_id,
                approve=approve,
                comment=args.comment,
            )
            print(f"approval #{reply.approval.id} {reply.approval.state}")

        return _run(args, body)

    cmd.__name__ = "cmd_approve" if approve else "cmd_reject"
    return cmd


cmd_approve = _decide(True)
cmd_reject = _decide(False)


def cmd_audit(args):
    async def body(runner: RunnerClient):
        reply = await runner.call(p.Audit, p.AuditReply, goal_id=args.goal_id, limit=args.limit)
        for e in reply.entries:
            goal = f"goal #{e.goal_id}" if e.goal_id is not None else "-"
            print(f"{e.ts:%Y-%m-%d %H:%M:%S}  {e.actor}  {e.action}  {goal}  {e.outcome}  {e.detail}")
        if not reply.entries:
            print("(no entries)")

    return _run(args, body)


def cmd_events(args):
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
    async def body(runner: RunnerClient):
        offset = args.offset
        while True:
            reply = await runner.call(p.GetLog, p.LogReply, experiment_id=args.experiment_id, offset=offset)
            sys.stdout.write(reply.text)
            offset = reply.next_offset
            if reply.eof:
                return

    return _run(args, body)


def cmd_milestone(args):
    async def body(runner: RunnerClient):
        reply = await runner.call(
            p.ReportMilestone, p.Done, goal_id=_goal_id(args), title=args.title, text=args.text
        )
        print(reply.message)

    return _run(args, body)


def cmd_metrics(args):
    values = _key_values(args.values)
    try:
        points = [MetricPoint(name=k, value=float(v), step=args.step) for k, v in values.items()]
    except ValueError as exc:
        raise SystemExit(f"goaltender: metric values must be numbers: {exc}") from None

    async def body(runner: RunnerClient):
        reply = await runner.call(
            p.LogMetrics, p.Done, goal_id=_goal_id(args), points=points, experiment_id=args.experiment_id
        )
        print(reply.message)

    return _run(args, body)


def cmd_experiment(args):
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit(
            "goaltender: give the command after --, e.g. goaltender experiment -d '...' -- python train.py"
        )
    params = {k: _number_or_text(v) for k, v in _key_values(args.param).items()}

    async def body(runner: RunnerClient):
        reply = await runner.call(
            p.RunExperiment,
            p.ExperimentReply,
            goal_id=_goal_id(args),
            command=command,
            description=args.description,
            params=params,
            metric=args.metric,
            direction="minimize" if args.minimize else ("maximize" if args.metric else None),
            timeout_s=_duration(args.timeout),
            cwd=os.getcwd(),
            env=dict(os.environ),  # what the agent exported reaches its experiment
            eval_command=shlex.split(args.eval_command) if args.eval_command else None,
        )
        e = reply.experiment
        how = " (verified by the runner)" if e.verified else " (reported)"
        value = f"{e.metric_name} = {e.metric_value:.4g}{how}" if e.metric_value is not None else "no metric"
        best = " (new best)" if reply.new_best else ""
        print(f"experiment #{e.index}: {e.status}{best} — {value}; {e.wall_seconds or 0:.1f}s wall")
        if e.note:
            print(f"  note: {e.note}")
        if e.params:
            print(f"  config: {format_params(e.params)}")
        for name, metric in sorted(e.metrics.items()):
            print(f"  {name}: {metric:g}")
        print(f"  log: {e.log_path}")
        print(f"  {reply.stop_status}")
        return EXIT_NO if e.status == "crash" else EXIT_OK

    return _run(args, body)


def cmd_ask(args):
    async def body(runner: RunnerClient):
        reply = await runner.call(
            p.Ask,
            p.DecisionReply,
            goal_id=_goal_id(args),
            question=args.question,
            detail=args.detail,
            kind=args.kind,
            timeout_s=_duration(args.timeout),
        )
        a = reply.approval
        print(f"{a.state} by {a.decided_by}" + (f": {a.comment}" if a.comment else ""))
        return {"approved": EXIT_OK, "rejected": EXIT_NO}.get(a.state, EXIT_EXPIRED)

    return _run(args, body)


def cmd_inbox(args):
    async def body(runner: RunnerClient):
        reply = await runner.call(p.ReadInbox, p.InboxReply, goal_id=_goal_id(args), all=args.all)
        if not reply.messages:
            print("(no new messages)")
        for m in reply.messages:
            print(f"[{m.created_at:%Y-%m-%d %H:%M:%S}] {m.author}: {m.text}")

    return _run(args, body)


def cmd_diary(args):
    kind = "handoff" if args.handoff else None

    async def body(runner: RunnerClient):
        if args.action == "write":
            text = sys.stdin.read() if args.text in (None, "-") else args.text
            done = await runner.call(
                p.WriteDiary, p.Done, goal_id=_goal_id(args), text=text, kind=kind or "note"
            )
            print(done.message)
            return
        diary = await runner.call(
            p.ReadDiary, p.DiaryReply, goal_id=_goal_id(args), last=args.last, kind=kind
        )
        if not diary.entries:
            print("(the diary is empty)")
        for e in diary.entries:
            print(f"--- {e.ts:%Y-%m-%d %H:%M:%S} {e.kind}\n{e.text}")

    return _run(args, body)


def cmd_report(args):
    text = args.file.read_text() if args.file else args.text
    if not text:
        raise SystemExit("goaltender: give the report text, or --file report.md")

    async def body(runner: RunnerClient):
        print((await runner.call(p.SubmitReport, p.Done, goal_id=_goal_id(args), text=text)).message)

    return _run(args, body)


if __name__ == "__main__":
    sys.exit(main())
