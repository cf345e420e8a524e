"""The operators' verbs: people (and the Slack bot) driving goals on a runner: submit, status,
summary, steer, budget, pause / resume / stop, approve / reject, audit, prune, events, disk-usage,
log, and the skill folder's history (skills log, skills revert).

Each talks to the runner through a RunnerClient (talk.run()) and checks its input with the
protocol's models first (talk.checked()); both are imported when the verb runs, not with this
module, so that `goaltender status --help` costs no more than argparse."""

from __future__ import annotations

import argparse
import codecs
import os
import sys

from goaltender.cli import talk
from goaltender.cli.common import COUNT, EXIT_NO, EXIT_OK, ID, Command, PlainTerminal, days

TYPE_CHECKING = False  # mypy reads it as True; importing typing is a tenth of Python's start-up
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from goaltender.protocol import messages as p
    from goaltender.protocol.client import RunnerClient


def print_status(status: p.GoalStatus) -> None:
    goal = status.goal
    print(f"goal #{goal.id} [{goal.state}] {goal.text}")
    print(f"  agent {goal.agent}, owner {goal.owner}; {status.stop_status}")
    if goal.end_reason and not goal.active:  # a goal that failed at its start says why here alone
        print(f"  ended: {' / '.join(line for line in goal.end_reason.splitlines() if line.strip())}")
    if status.best:
        print(f"  best: #{status.best.index} {status.best.metric_name} = {status.best.metric_value:.4g}")
    for approval in status.pending_approvals:
        print(f"  waiting for approval #{approval.id}: {approval.question}")


class Submit(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("text")
        parser.add_argument(
            "--owner", default=os.environ.get("USER"), help="default: $USER, else who you are"
        )
        parser.add_argument("--agent", help="agent to run the goal (default: the runner's default)")

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(p.SubmitGoal, text=args.text, owner=args.owner, agent=args.agent)
        talk.check_goal_words(args.text)

        async def body(runner: RunnerClient) -> None:
            reply = await runner.request(request)
            print_status(reply.status)

        return talk.run(args, body)


class Status(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal_id", nargs="?", type=ID)
        parser.add_argument("--all", action="store_true", help="finished goals too, newest --limit of them")
        parser.add_argument(
            "--limit", type=int, default=20, help="with --all: how many goals (default 20, at most 200)"
        )
        parser.add_argument(
            "--before", type=ID, help="with --all: goals with ids under this one (the next page)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        if args.goal_id is not None:
            request = talk.checked(p.Status, goal_id=args.goal_id)
        elif args.all:  # history, a page at a time: every goal in one reply would outgrow a line
            request = talk.checked(p.Status, limit=args.limit, before=args.before)
        else:
            request = talk.checked(p.Status, active_only=True)

        async def body(runner: RunnerClient) -> None:
            reply = await runner.request(request)
            for status in reply.goals:
                print_status(status)
            if not reply.goals:
                what = (
                    "no goals yet"
                    if args.all or args.goal_id
                    else "no active goals (--all shows finished ones)"
                )
                print(f"{what}; submit one with: goaltender submit 'your goal, budget 1h'")
            elif args.all and args.goal_id is None and len(reply.goals) == args.limit:
                print(f"(older goals: goaltender status --all --before {reply.goals[0].goal.id})")

        return talk.run(args, body)


class Summary(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal_id", type=ID)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(p.Summary, goal_id=args.goal_id)

        async def body(runner: RunnerClient) -> None:
            print((await runner.request(request)).text)

        return talk.run(args, body)


class DoneRequest(Command):
    """A verb that sends one request the runner answers with `done`, and prints its message:
    `request` is the request's type, `fields` its fields (each the argument of the same name)."""

    request = ""
    fields: tuple[str, ...] = ()

    def check(self, args: argparse.Namespace) -> None:
        """What to refuse before the runner is asked, beyond what the model refuses."""

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        self.check(args)
        kind = p.REQUEST_MODELS[self.request]
        made = talk.checked(kind, **{field: getattr(args, field) for field in self.fields})

        async def body(runner: RunnerClient) -> None:
            print((await runner.request(made, p.Done)).message)

        return talk.run(args, body)


class Steer(DoneRequest):
    request = "steer"
    fields = ("goal_id", "text", "author")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal_id", type=ID)
        parser.add_argument("text")
        parser.add_argument("--author", help="whom you speak for (recorded as AUTHOR via cli (uid N))")

    def check(self, args: argparse.Namespace) -> None:
        talk.check_budget_words(args.text)  # the runner applies budget words in a steer too


class Budget(DoneRequest):
    request = "change_budget"
    fields = ("goal_id", "change")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal_id", type=ID)
        parser.add_argument("change")

    def check(self, args: argparse.Namespace) -> None:
        talk.check_budget_words(args.change)


class Pause(DoneRequest):
    request = "pause"
    fields = ("goal_id",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal_id", type=ID)


class Resume(Pause):
    request = "resume"


class Stop(DoneRequest):
    request = "stop"
    fields = ("goal_id", "reason")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal_id", type=ID)
        parser.add_argument("--reason", default="")


class Approve(Command):
    approve = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("approval_id", type=ID)
        parser.add_argument("--comment")

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(
            p.Decide, approval_id=args.approval_id, approve=self.approve, comment=args.comment
        )

        async def body(runner: RunnerClient) -> None:
            reply = await runner.request(request)
            print(f"approval #{reply.approval.id} {reply.approval.state}")

        return talk.run(args, body)


class Reject(Approve):
    approve = False


class Audit(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal_id", nargs="?", type=ID, help="only this goal's entries")
        parser.add_argument("--limit", type=COUNT, default=200, help="the newest N entries (default 200)")

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(p.Audit, goal_id=args.goal_id, limit=args.limit)

        async def body(runner: RunnerClient) -> None:
            reply = await runner.request(request)
            for e in reply.entries:
                goal = f"goal #{e.goal_id}" if e.goal_id is not None else "-"
                print(f"{e.ts:%Y-%m-%d %H:%M:%S}  {e.actor}  {e.action}  {goal}  {e.outcome}  {e.detail}")
            if not reply.entries:
                print("(no entries)")

        return talk.run(args, body)


class Prune(Command):
    description = """\
        Goals that ended more than GOALTENDER_RETENTION_DAYS (default 90) days ago lose their
        events and their runs' logs (the best run's log, the ledger, diary, audit trail and final
        report are kept), and bot.db its delivered posts (each goal's card is kept). The runner and
        the bot also do this by themselves once a day. A running runner is asked to do it."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
        parser.add_argument("--days", type=days, help="this many days instead of the setting")

    def run(self, args: argparse.Namespace) -> int:
        """runner.db through the runner when it runs (another process writing its file would stop
        it), else here; bot.db here (SQLite lets the bot and this write it in turn)."""
        from goaltender import lifecycle
        from goaltender.protocol.quick_client import RunnerUnavailable, encode, exchange

        try:
            request = encode({"type": "prune", "days": args.days, "dry_run": args.dry_run})
            replies = exchange(talk.socket(args), talk.client(args), [request], expect="pruned")
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


class Events(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--since", type=COUNT, default=0)
        parser.add_argument("--goal", type=ID, dest="goal_id")
        parser.add_argument("--follow", "-f", action="store_true")

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        talk.checked(p.Subscribe, since=args.since, goal_id=args.goal_id)

        async def body(runner: RunnerClient) -> None:
            head = await runner.subscribe(since=args.since, goal_id=args.goal_id)
            if head <= args.since and not args.follow:
                return
            async for event in runner.events():
                print(event.model_dump_json(), flush=True)
                if event.seq >= head and not args.follow:
                    return

        return talk.run(args, body)


class DiskUsage(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("goal_id", nargs="?", type=ID, help="only this goal (an agent: its own)")

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p
        from goaltender.runner.report import format_bytes

        request = talk.checked(p.DiskUsage, goal_id=args.goal_id)  # an agent is answered for its own goal

        async def body(runner: RunnerClient) -> None:
            reply = await runner.request(request)
            for goal in reply.goals:
                print(f"goal #{goal.goal_id} ({goal.state}): {format_bytes(goal.total)}")
                for line in goal.lines:
                    print(f"  {line}")
            print(f"{format_bytes(reply.free)} free on the runner's disk")

        return talk.run(args, body)


class Log(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("experiment_id", type=ID)
        parser.add_argument("--offset", type=COUNT, default=0)

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        talk.checked(p.GetLog, experiment_id=args.experiment_id, offset=args.offset)
        shown = isinstance(sys.stdout, PlainTerminal)  # shown, not saved: decoded and cleaned as it comes
        return talk.run(args, _shown_log(args) if shown else _saved_log(args))


def _shown_log(args: argparse.Namespace) -> Callable[[RunnerClient], Awaitable[None]]:
    async def body(runner: RunnerClient) -> None:
        out = sys.stdout
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        held = ""  # a chunk's last CR, which may be half of a CRLF
        async for reply in runner.fetch_log(args.experiment_id, args.offset):
            text = held + decoder.decode(reply.data)
            held = "\r" if text.endswith("\r") else ""
            out.write(text[: len(text) - len(held)])
        out.write(held + decoder.decode(b"", final=True))
        out.flush()

    return body


def _saved_log(args: argparse.Namespace) -> Callable[[RunnerClient], Awaitable[None]]:
    async def body(runner: RunnerClient) -> None:
        async for reply in runner.fetch_log(args.experiment_id, args.offset):  # requests pipelined
            sys.stdout.buffer.write(reply.data)
        sys.stdout.buffer.flush()

    return body


class SkillsLog(Command):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--limit", type=COUNT, default=20, help="how many commits (default 20)")

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(p.SkillLog, limit=args.limit)

        async def body(runner: RunnerClient) -> None:
            for c in (await runner.request(request)).commits:
                print(f"{c.commit}  {c.at:%Y-%m-%d %H:%M}  {c.subject}")

        return talk.run(args, body)


class SkillsRevert(Command):
    description = "undo one commit of the skill folder with a new one (audited)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("commit", help="the commit's hash (from `goaltender skills log`)")

    def run(self, args: argparse.Namespace) -> int:
        from goaltender.protocol import messages as p

        request = talk.checked(p.RevertSkill, commit=args.commit)

        async def body(runner: RunnerClient) -> None:
            print((await runner.request(request)).message)

        return talk.run(args, body)
