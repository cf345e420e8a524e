"""The runner daemon: what each protocol request does, and the daemon's life (start, serve, stop).

A Runner owns runner.db (the goals, the event log, the ledger), the goals' campaigns
(runner/campaign.py: agents and deadlines; experiments, approvals, the disk guard and stage gates
each in a module of its own) and the Unix sockets (runner/server.py: connections, the handshake,
the event stream). The handlers below answer what operators ask that changes goals; the reads
(status, summary, logs, series, artifacts, disk usage, audit) are runner/reads.py's and the agents'
verbs runner/agent_requests.py's. Each gets who asks: the server has already refused what that principal may not ask (runner/trust.py),
and names given in `by` / `author` / `owner` are recorded as that principal vouching for them.
`hello`, `subscribe` and `ack` belong to the connection and are answered by the server.

On a full disk every request is answered. Stop, pause and resume are carried out and answered at
once (runner/goal_records.py writes them when there is room, and the status shows them meanwhile); an
agent's milestone, metrics, diary entry, report or fetch record is taken and written in its goal's
order when there is room; what would change runner.db otherwise (a new goal, a steer, a budget, a
decision, an agent's question) is refused at once with `disk_full`, changing nothing.

Past 600 lines on purpose: the daemon's life (start with its home locked, serve, watch runner.db's
files, prune, stop in order) is one sequence whose steps undo each other on failure; apart, the
order that makes a stop safe would be spread over modules.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import fcntl
import functools
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from goaltender import readiness
from goaltender.protocol import messages as p
from goaltender.protocol.budget import (
    GoalTextError,
    apply_budget_change,
    explicit_budget,
    parse_goal_text,
)
from goaltender.runner import inputs
from goaltender.runner.agent_requests import AgentRequests
from goaltender.runner.campaign import Campaigns
from goaltender.runner.config import ConfigError, RunnerSettings
from goaltender.runner.logs import RUNNER_TEXT, configure_logging, say
from goaltender.runner.mlflow_mirror import MlflowMirror
from goaltender.runner.monitoring import MetricsEndpoint, MetricsUnavailable, runner_endpoint
from goaltender.runner.operators import Operators, open_socket_to
from goaltender.runner.reads import Reads
from goaltender.runner.sandbox import UNSAFE_WARNING, compile_package
from goaltender.runner.secrets import Redactor, redact_output
from goaltender.runner.server import Handler, Refused, SocketServer
from goaltender.runner.skill_folder import SkillEditError, SkillFolder
from goaltender.runner.stages import parse_stages
from goaltender.runner.trust import Principal
from goaltender.selftest import interpreter_problem
from goaltender.storage.db import UnusableDatabase, let_go_of_any
from goaltender.storage.db_files import Lost
from goaltender.storage.pruning import prune_runner
from goaltender.storage.records import (
    Budget,
    Goal,
    GoalState,
    utcnow,
)
from goaltender.storage.runner_store import RunnerStore
from goaltender.storage.space import DiskFull, is_disk_full, probe_after_failure

log = logging.getLogger("goaltender.runner")
T = TypeVar("T")
WRITTEN_LATER = "; the disk is full: runner.db records it when there is room"


def build_models() -> None:
    """Build every model of the package now. They defer it to their first use, which is what a
    CLI verb wants; the runner would pay it inside its first goal's campaign (~25 ms on 2 cores)."""
    waiting: list[type[BaseModel]] = [BaseModel]
    while waiting:
        for model in waiting.pop().__subclasses__():
            waiting.append(model)
            if model.__module__.startswith("goaltender.") and not model.__pydantic_complete__:
                model.model_rebuild()


class Runner:
    def __init__(self, settings: RunnerSettings, store: RunnerStore):
        self.settings = settings
        self.store = store
        self.handlers: dict[type[p.Request], Handler] = {
            # from the bot (or any operator client)
            p.SubmitGoal: self._on_submit_goal,
            p.Steer: self._on_steer,
            p.ChangeBudget: self._on_change_budget,
            p.Stop: self._on_stop,
            p.Pause: self._on_pause,
            p.Resume: self._on_resume,
            p.Decide: self._on_decide,
            p.Prune: self._on_prune,
            p.SkillLog: self._on_skill_log,
            p.RevertSkill: self._on_revert_skill,
            p.PutInput: self._on_put_input,
        }  # and the reads (runner/reads.py) and agents' verbs (runner/agent_requests.py), below
        self.server = SocketServer(
            settings.socket_path,
            settings.name,
            store,
            self.handlers,
            Redactor.from_settings(settings),
            operators=Operators.parse(settings.operators),
        )
        self.campaigns = Campaigns(settings, store, self.server)
        self.mirror = MlflowMirror.from_settings(settings, store, self.server.redactor)  # None: off
        self.skills = SkillFolder(settings.skill_folder)
        self._skills_lock = asyncio.Lock()  # one change of the skill folder at a time
        self.reads = Reads(store, self.campaigns, self.server.redactor)
        self.agent_requests = AgentRequests(
            settings, store, self.campaigns, self.skills, self._skills_lock, self.reads.status
        )
        self.handlers.update(self.reads.handlers())
        self.server.statuses_of = self.reads.statuses
        self.handlers.update(self.agent_requests.handlers())
        self._listening = False
        self._home_lock: int | None = None  # held while this runner runs: one runner per home
        self.lost: Lost | None = None
        """What became of runner.db's files, if they were removed or replaced while it ran."""
        self.stopped_because: str | None = None  # the line saying so, once the runner has closed
        store.db.on_lost = self._database_lost
        self._watching: asyncio.Task | None = None
        self._pruning: asyncio.Task | None = None  # the periodic prune (storage/pruning.py)
        self._prune_lock = asyncio.Lock()  # one prune at a time, periodic or asked for
        self.metrics: MetricsEndpoint | None = None
        """The Prometheus endpoint, while it serves (GOALTENDER_METRICS_PORT)."""

    # ---- life cycle ----

    @classmethod
    async def start(cls, settings: RunnerSettings) -> Runner:
        """Open runner.db, bind the socket, recover the goals, serve. Raises StartupFailed (with
        everything it opened closed again) when the home, the database or the disk will not do."""
        try:
            Operators.parse(settings.operators)  # a name with no account here: said before anything opens
        except ConfigError as exc:
            raise StartupFailed(str(exc)) from None
        try:
            settings.make_dirs()
            home_lock = _lock_home(settings)
        except OSError as exc:
            raise StartupFailed(startup_problem(settings, exc)) from exc
        if (stopped := _stopped_earlier(settings)) is not None:
            os.close(home_lock)
            raise StartupFailed(stopped)
        try:
            store = await RunnerStore.open(settings.db_path)
        except (OSError, sqlite3.Error) as exc:
            os.close(home_lock)
            raise StartupFailed(startup_problem(settings, exc)) from exc
        try:
            runner = cls(settings, store)
        except BaseException:
            await store.close()
            os.close(home_lock)
            raise
        runner._home_lock = home_lock
        try:
            await runner._start()
        except BaseException as exc:
            await runner._abandon()
            if runner.stopped_because is not None:  # runner.db was lost while it started
                raise StartupFailed(runner.stopped_because) from exc
            if isinstance(exc, OSError | sqlite3.Error | DiskFull | AlreadyServing):
                raise StartupFailed(startup_problem(settings, exc)) from exc
            raise
        return runner

    async def _start(self) -> None:
        settings = self.settings
        self._watching = asyncio.ensure_future(self._watch_database())
        if problem := self.campaigns.sandbox.problem():
            log.error("agents cannot start until this is fixed: %s", problem)
        elif not self.campaigns.sandbox.enabled:
            log.warning(UNSAFE_WARNING)
        await asyncio.to_thread(self.campaigns.limits.start)  # says once when limits are off
        await self._listen()
        await self._seed_skills()  # before any agent starts: they read the box's skills
        await asyncio.to_thread(compile_package)  # before any agent starts, too (runner/sandbox.py)
        build_models()  # before it serves, not inside its first goal
        await self.campaigns.recover()
        self.campaigns.disk.wait_for_space_on_writes()  # from now on a full disk pauses goals, not the runner
        if self.mirror:
            self.mirror.start()
        self._pruning = asyncio.ensure_future(self._prune_forever())
        await self.server.start_serving()
        self._serve_metrics()
        log.info(
            "runner %s (database %s) listening on %s (compute unit: %s; %d slots, GPUs %s; sandbox: %s; "
            "limits: %s; "
            "operators: %s)",
            settings.name,
            self.store.runner_id,
            settings.socket_path,
            self.campaigns.compute_unit,
            self.campaigns.slots.slots,
            ",".join(map(str, self.campaigns.slots.gpus)) or "none",
            settings.sandbox,
            self.campaigns.limits.text(),
            self.server.operators.describe(),
        )

    async def _listen(self) -> None:
        try:
            await self.server.listen()
        except RuntimeError as exc:  # another runner answers on the socket: it is not ours to remove
            raise AlreadyServing(str(exc)) from exc
        self._listening = True
        try:  # the operators other than this user get the kernel's leave to connect
            open_socket_to(self.server.operators, self.settings.socket_path, self.settings.home)
        except ConfigError as exc:
            raise StartupFailed(str(exc)) from None

    def _serve_metrics(self) -> None:
        endpoint = runner_endpoint(self)
        if endpoint is None:
            return
        try:
            endpoint.start()
        except MetricsUnavailable as exc:
            raise StartupFailed(str(exc)) from None
        self.metrics = endpoint

    async def _stop_metrics(self) -> None:
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)  # (it waits for the server's poll, up to 0.5 s)
            self.metrics = None

    async def _seed_skills(self) -> None:
        try:
            await asyncio.to_thread(self.skills.ensure)
        except (OSError, SkillEditError) as exc:  # agents read the shipped skills; edits are refused
            log.error("the box's skill folder %s cannot be made: %s", self.skills.root, exc)

    async def _watch_database(self) -> None:
        """Look at runner.db's files every few seconds, so that an idle runner notices too (every
        write looks before it begins and after it commits)."""
        while True:
            if self.store.db.check_files() is not None:
                return  # _database_lost has heard
            await asyncio.sleep(FILE_CHECK_S)

    def _database_lost(self, lost: Lost) -> None:
        """runner.db (or its -wal or -shm) is gone from under the runner: stop answering now (no
        write is acknowledged from here on); close() says what happened and what to do."""
        log.error("%s while the runner ran: stopping", lost)
        self.lost = lost
        self.server.close()  # serve_forever ends, and with it run_forever

    async def _abandon(self) -> None:
        """Undo a start that failed half-way: agents recovery started, the socket, the database
        (whose thread, left open, would keep the process from exiting)."""
        self._stop_watching()
        await self._stop_metrics()
        self.server.close()
        await self.campaigns.close()
        await self.server.audit.close()
        await self._close_mirror()
        if self.lost is not None:
            self.stopped_because = await self._give_up_database(self.lost)
        await self.store.close()
        if self._listening:
            self.server.remove_socket()
        self._unlock_home()

    async def serve_forever(self) -> None:
        await self.server.serve_forever()

    async def close(self) -> None:
        """Shut down: stop serving, leave goals as they are (a restart resumes them). After runner.db
        was lost, what the runner held is saved and the next start waits for the operator
        (`stopped_because` says so)."""
        self._stop_watching()
        await self._stop_metrics()
        self.server.close()
        await self.campaigns.close()  # from here on a write that finds the disk full fails
        await self.server.audit.close()
        await self._close_mirror()
        if self.lost is not None and self.stopped_because is None:
            self.stopped_because = await self._give_up_database(self.lost)
        await self.store.close()
        self.server.remove_socket()
        self._unlock_home()

    def _stop_watching(self) -> None:
        for task in (self._watching, self._pruning):
            if task is not None:
                task.cancel()

    # ---- retention ----

    async def _prune_forever(self) -> None:
        """Prune what goals that ended long ago left, now and then (the first time a minute after
        the start, so that a start is not slowed by it). A failed prune is logged; the next one
        tries again."""
        if not self.settings.retention_days:
            log.info("retention is off (GOALTENDER_RETENTION_DAYS=0): nothing is pruned")
            return
        await asyncio.sleep(min(FIRST_PRUNE_S, self.settings.prune_every_s))
        while True:
            try:
                for line in await self._prune(self.settings.retention_days, dry_run=False):
                    log.info("retention: %s", line)
            except DiskFull:
                log.warning("retention: the disk is full; the next prune tries again")
            except Exception:  # never ends the runner, nor this task: the next prune tries again
                if self.lost is not None:
                    return
                log.exception("retention: pruning failed; the next prune tries again")
            await asyncio.sleep(self.settings.prune_every_s)

    async def _prune(self, days: int, *, dry_run: bool) -> list[str]:
        async with self._prune_lock:
            with self.store.refuse_when_full():
                pruned = await prune_runner(self.store, days, dry_run=dry_run)
        return pruned.lines(str(self.settings.db_path))

    async def _on_prune(self, req: p.Prune, who: Principal) -> p.Reply:
        days = req.days or self.settings.retention_days
        if not days:
            return p.PruneReply(
                lines=[
                    "retention is off (GOALTENDER_RETENTION_DAYS=0): nothing pruned; name --days to prune once"
                ]
            )
        try:
            lines = await self._prune(days, dry_run=req.dry_run)
        except DiskFull as full:
            raise Refused("disk_full", f"{full}: nothing pruned; try again when there is room") from None
        return p.PruneReply(lines=lines)

    async def _give_up_database(self, lost: Lost) -> str:
        """Save what the lost database held (storage/db_files.py), and leave the line saying what
        happened where the next start finds it: that start waits until the operator has chosen."""
        done = await self.store.db.let_go()
        marker = self.settings.lost_marker
        db = self.settings.db_path
        where = f"move {done.saved} to {db} to go on where it stopped, or put" if done.saved else "put"
        line = (
            f"{lost} while the runner ran; nothing written after that was acknowledged. "
            f"{done.said[0].upper()}{done.said[1:]}. To start again, {where} the database it should use at "
            f"{db} (none: a new, empty one), then remove {marker}"
        )
        try:
            marker.write_text(line + "\n")
        except OSError as exc:
            log.error("cannot write %s (%s): the next start will not wait for you", marker, exc)
        return line

    def _unlock_home(self) -> None:
        if self._home_lock is not None:
            os.close(self._home_lock)
            self._home_lock = None

    async def _close_mirror(self) -> None:
        if self.mirror:
            await self.mirror.close()  # what it has not mirrored yet waits in the log for the next start

    # ---- writes someone waits on ----

    async def _now(self, write: Awaitable[T]) -> T:
        """`write` (a store call) done now; on a full disk refused (disk_full), changing nothing."""
        try:
            with self.store.refuse_when_full():
                return await write
        except DiskFull as full:
            raise Refused("disk_full", f"{full}: not written; try again when there is room") from None

    # ---- operator requests ----

    async def _on_submit_goal(self, req: p.SubmitGoal, who: Principal) -> p.Reply:
        if space := self.campaigns.disk.low_space():  # it could run no experiment
            raise Refused(
                "disk_full",
                f"no room for a new goal: disk full: {space}, under the {self.settings.min_free_mb:g} MB "
                "this runner keeps free (GOALTENDER_MIN_FREE_MB)",
            )
        # A client's name for the submission, per user: sent again, it finds the goal it made.
        key = None if req.key is None else f"{who.actor()}: {req.key}"
        if key is not None and (made := await self.store.goal_by_key(key)) is not None:
            return p.GoalReply(status=await self.reads.status(made.id))
        try:
            spec = parse_goal_text(req.text)
        except GoalTextError as exc:
            raise Refused("bad_request", str(exc)) from None
        named = next((word for word in spec.agent_words if word in self.settings.agents), None)
        agent = req.agent or spec.agent or named or self.settings.default_agent
        if agent not in self.settings.agents:
            raise Refused(
                "bad_request", f"unknown agent {agent!r}; this runner has: {', '.join(self.settings.agents)}"
            )
        stages = parse_stages(req.text)
        if stages and agent == "sweep":  # it runs experiments, never a stage's work
            raise Refused(
                "bad_request",
                "a staged goal needs an agent that can do each stage's work and pass its gates; the sweep "
                f"only runs experiments: say `with openai` or `with codex` (this runner has: "
                f"{', '.join(self.settings.agents)})",
            )
        if spec.executor is not None:
            self.campaigns.experiments.executors.check(spec.executor)
        budget = req.budget or explicit_budget(spec, utcnow(), self.settings.experiment_timeout_s)
        try:
            goal = await self._now(
                self.store.create_goal(
                    text=spec.text,
                    owner=_owner(req.owner, who),
                    agent=agent,
                    budget=budget,
                    metric=None,
                    direction="maximize",
                    target=spec.target,
                    workspace_root=self.settings.workspaces,
                    executor=spec.executor,
                    gpus_per_experiment=spec.gpus_per_experiment,
                    stages=stages,
                    submit_key=key,
                )
            )
        except sqlite3.IntegrityError:  # the same submission, sent twice at once: the first made it
            if key is None or (made := await self.store.goal_by_key(key)) is None:
                raise
            return p.GoalReply(status=await self.reads.status(made.id))
        await self.campaigns.start_agent(goal, resumed=False)
        return p.GoalReply(status=await self.reads.status(goal.id))

    async def _on_steer(self, req: p.Steer, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.active_goal(req.goal_id)
        author = who.said(req.author)
        try:
            change = apply_budget_change(goal.budget, req.text, utcnow())
        except GoalTextError as exc:  # refused whole: nothing half done, and whoever sent it hears why
            undelivered = "the message was not delivered (budget words in a steer change the budget)"
            raise Refused("bad_request", f"{exc}; {undelivered}") from None
        message = await self._now(self.store.add_inbox(goal.id, author, req.text))
        said = f"delivered to goal #{goal.id}'s inbox as message {message.id}"
        if change:
            await self._set_budget(goal, change[0], f"{author}: {change[1]}")
            said += f"; budget changed: {change[1]}"
        return p.Done(message=said)

    async def _set_budget(self, goal: Goal, budget: Budget, reason: str) -> None:
        self.campaigns.arm_deadline(await self._now(self.store.update_budget(goal.id, budget, reason)))

    async def _on_change_budget(self, req: p.ChangeBudget, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.active_goal(req.goal_id)
        try:
            change = apply_budget_change(goal.budget, req.change, utcnow())
        except GoalTextError as exc:
            raise Refused("bad_request", str(exc)) from None
        if change is None:
            raise Refused(
                "bad_request",
                f"no budget in {req.change!r}; try '+2h', 'max 10 experiments' or 'gpu-hours 8'",
            )
        await self._set_budget(goal, change[0], f"{who.said(req.by)}: {change[1]}")
        return p.Done(message=f"budget changed: {change[1]}")

    async def _on_stop(self, req: p.Stop, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.active_goal(req.goal_id)
        reason = f"stopped by {who.said(req.by)}" + (f": {req.reason.strip()}" if req.reason.strip() else "")
        if await self.campaigns.end_goal(goal.id, "stopped", reason):
            return p.Done(message=f"goal #{goal.id} {reason}; final report written")
        return p.Done(
            message=f"goal #{goal.id} {reason}: its agent and runs are stopped; the disk is full: "
            "runner.db records it (and the final report) when the disk has room"
        )

    async def _on_pause(self, req: p.Pause, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.active_goal(req.goal_id)
        for_disk = await self.campaigns.disk.paused_for_disk(goal.id)
        if goal.state == "paused" and not for_disk:
            return p.Done(message=f"goal #{goal.id} is already paused")
        self.campaigns.disk.forget_pause(goal.id)  # it no longer resumes by itself
        self.campaigns.holds.hold(goal.id)
        if for_disk:
            reason = f"paused by {who.said(req.by)} (it was paused for a full disk)"
            said = f"goal #{goal.id} {reason}; it stays paused until resumed"
        else:
            reason = f"paused by {who.said(req.by)}"
            said = f"goal #{goal.id} paused: the current experiment finishes, no new one starts"
        recorded = await self.campaigns.records.change_state(goal.id, "paused", reason)
        return p.Done(message=said + ("" if recorded else WRITTEN_LATER))

    async def _on_resume(self, req: p.Resume, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.active_goal(req.goal_id)
        if goal.state != "paused":
            return p.Done(message=f"goal #{goal.id} is not paused ({goal.state})")
        self.campaigns.disk.forget_pause(goal.id)  # resumed by hand, disk or not
        pending = await self.store.pending_approvals(goal.id)
        state: GoalState = "waiting_for_approval" if pending else "running"
        recorded = await self.campaigns.records.change_state(goal.id, state, f"resumed by {who.said(req.by)}")
        self.campaigns.holds.release(goal.id)
        return p.Done(message=f"goal #{goal.id} resumed" + ("" if recorded else WRITTEN_LATER))

    async def _on_decide(self, req: p.Decide, who: Principal) -> p.Reply:
        asked = await self.store.get_approval(req.approval_id)
        if asked is None:
            raise Refused("not_found", f"no approval #{req.approval_id}")
        state = "approved" if req.approve else "rejected"
        approval, decided_now = await self._now(
            self.store.decide_approval(asked.id, state=state, by=who.said(req.by), comment=req.comment)
        )
        if not decided_now:
            by = f" by {approval.decided_by}" if approval.decided_by else ""
            raise Refused("conflict", f"approval #{approval.id} was already {approval.state}{by}")
        self.campaigns.approvals.deliver(approval)
        return p.DecisionReply(approval=approval)

    async def _on_skill_log(self, req: p.SkillLog, who: Principal) -> p.Reply:
        try:
            commits = await asyncio.to_thread(self.skills.log, req.limit)
        except SkillEditError as exc:
            raise Refused("not_found", str(exc)) from None
        return p.SkillLogReply(commits=[p.SkillCommit(**vars(c)) for c in commits])

    async def _on_revert_skill(self, req: p.RevertSkill, who: Principal) -> p.Reply:
        async with self._skills_lock:
            try:
                # The skill folder's history is a record: it names who reverted as the audit trail does.
                commit, subject = await asyncio.to_thread(self.skills.revert, req.commit, who.actor(req.by))
            except SkillEditError as exc:
                raise Refused("bad_request", str(exc)) from None
        return p.Done(message=f"reverted {req.commit} ({subject}) as commit {commit}")

    async def _on_put_input(self, req: p.PutInput, who: Principal) -> p.Reply:
        goal = await self.campaigns.records.active_goal(req.goal_id)
        try:
            data = base64.b64decode(req.data, validate=True)
        except binascii.Error:
            raise Refused("bad_request", "data is not base64") from None
        cap = int(self.settings.max_input_mb * 1024 * 1024)
        put = functools.partial(
            inputs.put_chunk,
            Path(goal.workspace),
            req.name,
            offset=req.offset,
            data=data,
            size=req.size,
            cap=cap,
        )
        try:
            path = await asyncio.to_thread(put, last=req.last)
        except inputs.InputRefused as exc:
            raise Refused("bad_request", str(exc)) from None
        if path is None:
            return p.Done(message=f"{req.offset + len(data):,} of {req.size:,} bytes")
        author = who.said(req.by)
        kind = f", {req.mimetype}" if req.mimetype else ""
        text = f"{author} gave this goal a file: {path} ({req.size:,} bytes{kind}), in your workspace. Read it if it helps."
        await self._now(self.store.add_inbox(goal.id, author, text))
        return p.Done(message=str(path))


async def run_forever(settings: RunnerSettings) -> None:
    """Serve until SIGTERM or SIGINT; raises DatabaseGone when runner.db was lost meanwhile."""
    runner = await Runner.start(settings)
    serving = asyncio.ensure_future(runner.serve_forever())
    received: list[str] = []

    def shut_down(sig: signal.Signals) -> None:
        if not received:
            received.append(sig.name)
            readiness.stopping(f"shutting down ({sig.name}): ending goals' runs, recording them")
        serving.cancel()

    # SIGTERM (systemd, kill) shuts down in order: agents and runs are ended and recorded, and a
    # restart resumes the goals. SIGKILL is survived too, by the recovery at start.
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, shut_down, sig)
    readiness.ready(f"listening on {settings.socket_path}")
    try:
        await serving
    except asyncio.CancelledError:
        if runner.lost is None:
            log.info("runner %s shutting down (%s)", settings.name, ", ".join(received) or "cancelled")
    finally:
        await runner.close()
    if runner.stopped_because is not None:
        raise DatabaseGone(runner.stopped_because)


class AlreadyServing(Exception):
    """Another runner answers on this runner's socket."""


class DatabaseGone(Exception):
    """runner.db was removed or replaced while the runner ran; the message says what to do."""


HOME_LOCK = "runner.lock"
FIRST_PRUNE_S = 60.0  # the first periodic prune comes this long after the start
FILE_CHECK_S = 2.0  # how often an idle runner looks at runner.db's files


def _stopped_earlier(settings: RunnerSettings) -> str | None:
    """Why the last runner on this home stopped, if it was because runner.db was lost: whatever
    is at its path now is used only once the operator has said so (by removing the marker), not
    by the next restart systemd makes."""
    marker = settings.lost_marker
    try:
        said = marker.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        said = f"({exc})"
    return f"the runner stopped earlier: {said or 'runner.db was lost'} (this start waits until {marker} is removed)"


def _lock_home(settings: RunnerSettings) -> int:
    """Hold the home's lock (a descriptor, released when it is closed or the process dies), or
    raise StartupFailed: a second runner on the same home, on another socket, took the first's
    running goals for a restart's and killed their runs."""
    path = settings.home / HOME_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise StartupFailed(
            f"another runner uses the home {settings.home} ({holder}): one runner per home; stop it "
            "first, or give this one a GOALTENDER_HOME of its own"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, socket {settings.socket_path}\n".encode(), 0)
    return fd


class StartupFailed(Exception):
    """The runner cannot start; the message says why in one line, for whoever reads its stderr."""


EXIT_STARTUP_FAILED = 1  # non-zero, so that systemd (Restart=on-failure) and people notice


def startup_problem(settings: RunnerSettings, exc: BaseException) -> str:
    """What stops the runner, said so that the operator knows what to do."""
    db = settings.db_path
    if isinstance(exc, DiskFull):
        return f"disk full: {exc.space}"
    if is_disk_full(exc):
        return f"disk full: {probe_after_failure(settings.home)}"
    if isinstance(exc, UnusableDatabase):
        return str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and exc.sqlite_errorcode in _NOT_A_DATABASE:
        return (
            f"{db} is not a usable SQLite database ({exc}): move it aside to start with an empty one, "
            "or restore it from a backup"
        )
    if isinstance(exc, sqlite3.Error):
        return f"cannot use {db}: {exc}"
    if isinstance(exc, OSError):
        where = Path(exc.filename) if exc.filename else settings.home
        what = "the runner's home " if where == settings.home else ""
        return f"cannot write {what}{where}: {exc.strerror or exc}"
    return str(exc)


_NOT_A_DATABASE = (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)


def main(settings: RunnerSettings | None = None) -> None:
    settings = settings or RunnerSettings()
    # The runner's log, and what libraries log or warn in its process, is redacted as what it sends is.
    redact_output(Redactor.from_settings(settings))
    configure_logging(settings.log_format, RUNNER_TEXT)
    try:
        if problem := interpreter_problem():  # it would misread goals' budgets: refuse them all
            raise StartupFailed(problem)
        if settings.default_agent not in settings.agents:  # else each goal that names none is refused
            raise StartupFailed(
                f"GOALTENDER_DEFAULT_AGENT is {settings.default_agent!r}, which is none of this runner's "
                f"agents ({', '.join(settings.agents)}; GOALTENDER_AGENTS sets them)"
            )
        asyncio.run(run_forever(settings))
    except StartupFailed as failed:
        say(f"goaltender runner: cannot start: {' '.join(str(failed).split())}", settings.log_format)
        _exit(EXIT_STARTUP_FAILED)
    except DatabaseGone as gone:
        say(f"goaltender runner: stopped: {' '.join(str(gone).split())}", settings.log_format)
        _exit(EXIT_STARTUP_FAILED)


def _exit(code: int) -> None:
    if not let_go_of_any():
        sys.exit(code)
    # Not a normal exit: that closes the database connection let go of, which would write its -wal
    # into the file it has open, after a copy in place the copied-in one (storage/db_files.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _owner(claimed: p.Actor | None, who: Principal) -> str:
    """A goal's owner as its records name them: a Person by name, a plain claim as given, else the
    operator who submitted it."""
    if isinstance(claimed, p.Person):
        return claimed.said()
    return claimed or who.actor()
