"""The runner daemon: goal sessions, budgets, supervised experiments, approvals, the event log,
served on a Unix socket (mode 0600) to the bot, the demo console and the agents."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

from goaltender.runner import protocol as p
from goaltender.runner.budget import (
    DEFAULT_BLOCK,
    apply_budget_change,
    check_new_experiment,
    experiment_timeout,
    explicit_budget,
    parse_goal_text,
    stop_status,
)
from goaltender.runner.config import RunnerSettings
from goaltender.runner.report import best_experiment, final_report, summary_text
from goaltender.runner.supervisor import (
    ProcessResult,
    kill_leftover_group,
    run_supervised,
    spawn,
    terminate_group,
    wait_process,
)
from goaltender.storage.records import (
    TERMINAL_STATES,
    Approval,
    Event,
    Experiment,
    Goal,
    MilestoneReported,
    utcnow,
)
from goaltender.storage.runner_store import RunnerStore

log = logging.getLogger("goaltender.runner")
STREAM_BATCH = 500  # events read from the log per query when streaming to a subscriber

# Caches and temp files go under the runner's home (the big disk), unless the box already says where.
ETIQUETTE_DIRS = {
    "XDG_CACHE_HOME": "xdg",
    "HF_HOME": "huggingface",
    "TORCH_HOME": "torch",
    "TRITON_CACHE_DIR": "triton",
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "RAY_TMPDIR": "ray",
    "MPLCONFIGDIR": "matplotlib",
    "GOALTENDER_CACHE_DIR": "goaltender",
}


class Runner:
    def __init__(self, settings: RunnerSettings, store: RunnerStore):
        self.settings = settings
        self.store = store
        self.store.on_event = self._on_event
        self._new_events = asyncio.Event()
        self._agents: dict[int, subprocess.Popen] = {}
        self._agent_watchers: dict[int, asyncio.Task] = {}
        self._experiments: dict[int, asyncio.Task] = {}  # experiment id -> supervising task
        self._experiment_goal: dict[int, int] = {}
        self._cancel_notes: dict[int, str] = {}
        self._approval_waiters: dict[int, asyncio.Future[Approval]] = {}
        self._deadline_timers: dict[int, asyncio.Task] = {}
        self._unpaused: dict[int, asyncio.Event] = {}
        self._goal_locks: dict[int, asyncio.Lock] = {}
        self._ending: set[int] = set()
        self._tasks: set[asyncio.Task] = set()
        self._connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self.gpus = _count_gpus() if settings.compute_unit != "cpu" else 0
        self.compute_unit = "gpu" if (settings.compute_unit == "gpu" or self.gpus) else "cpu"

    # ---- life cycle ----

    @classmethod
    async def start(cls, settings: RunnerSettings) -> Runner:
        settings.home.mkdir(parents=True, exist_ok=True)
        store = await RunnerStore.open(settings.db_path)
        runner = cls(settings, store)
        await runner._recover()
        await runner._listen()
        return runner

    async def _listen(self) -> None:
        path = self.settings.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            if await _socket_answers(path):
                raise RuntimeError(f"a runner is already serving {path}")
            path.unlink()
        old_umask = os.umask(0o177)  # the socket is born 0600: only this user may drive the runner
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(path), limit=p.MAX_LINE)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        log.info("runner %s listening on %s (compute unit: %s)", self.settings.name, path, self.compute_unit)

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        """Shut down: stop serving, leave goals as they are (a restart resumes them)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):  # clients see the runner go, as when its process exits
            conn.close()
        for task in [*self._tasks, *self._deadline_timers.values(), *self._agent_watchers.values()]:
            task.cancel()
        for proc in self._agents.values():
            await terminate_group(proc.pid, None, self.settings.stop_grace_s)
            proc.poll()  # reap it (its watcher was cancelled), so no zombie is left behind
        for experiment_id, task in list(self._experiments.items()):
            self._cancel_notes[experiment_id] = "interrupted: the runner shut down"
            task.cancel()
        await asyncio.gather(*self._experiments.values(), return_exceptions=True)
        await self.store.close()
        with contextlib.suppress(FileNotFoundError):
            self.settings.socket_path.unlink()

    def _spawn_task(self, coro: Awaitable) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_event(self, event: Event) -> None:
        # Wake every subscriber; each reads what it has not seen from the log itself.
        waiting, self._new_events = self._new_events, asyncio.Event()
        waiting.set()

    async def _recover(self) -> None:
        """After a crash or restart: nothing the log says is running may be left half-done."""
        for experiment in await self.store.running_experiments():
            killed = kill_leftover_group(experiment.pid, experiment.started_at.timestamp())
            note = "interrupted: the runner restarted while it ran" + (
                " (process group killed)" if killed else ""
            )
            await self.store.finish_experiment(
                experiment.id,
                status="crash",
                metric_value=None,
                metrics={},
                wall_seconds=None,
                cpu_seconds=None,
                compute_hours=None,
                peak_rss_mb=None,
                exit_code=None,
                note=note,
            )
        for approval in await self.store.pending_approvals():
            await self.store.decide_approval(
                approval.id,
                state="expired",
                by="runner",
                comment="the runner restarted; the agent will ask again",
            )
        for goal in await self.store.list_goals(active_only=True):
            kill_leftover_group(goal.agent_pid, goal.accepted_at.timestamp() if goal.accepted_at else None)
            self._unpaused[goal.id] = asyncio.Event()
            if goal.state != "paused":
                self._unpaused[goal.id].set()
            if goal.budget.deadline and utcnow() >= goal.budget.deadline:
                await self._end_goal(goal.id, "finished", "deadline reached while the runner was down")
                continue
            if goal.state == "waiting_for_approval":
                await self.store.set_goal_state(goal.id, "running", "the runner restarted")
            await self.store.append_event(
                goal.id,
                MilestoneReported(
                    title="Runner restarted",
                    text="Interrupted experiments are marked crash; the agent resumes from the ledger and diary.",
                ),
            )
            await self._start_agent(await self.store.get_goal(goal.id), resumed=True)

    # ---- connections ----

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(reader, writer)
        self._connections.add(conn)
        subscription: asyncio.Task | None = None
        try:
            while True:
                line = await conn.read_line()
                if line is None:
                    break
                if line is _TOO_LONG:
                    await conn.send(p.Error(code="line_too_long", message=f"line exceeds {p.MAX_LINE} bytes"))
                    continue
                request = p.parse_request(line)
                if isinstance(request, p.Error):
                    await conn.send(request)
                    continue
                if isinstance(request, p.Hello):
                    await conn.send(self._hello(request, conn))
                    continue
                if conn.client is None:
                    await conn.send(
                        p.Error(id=request.id, code="handshake_required", message="send hello first")
                    )
                    continue
                if isinstance(request, p.Ack):  # the client's durable position in the event log
                    await self.store.set_cursor(conn.client, request.seq)
                    await conn.send(p.Done(id=request.id, message=f"acked {request.seq}"))
                    continue
                if isinstance(request, p.Subscribe):
                    if subscription is not None:
                        subscription.cancel()
                    subscription = self._spawn_task(self._stream(conn, request))
                    continue
                self._spawn_task(self._answer(conn, request))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if subscription is not None:
                subscription.cancel()
            conn.close()
            self._connections.discard(conn)

    def _hello(self, hello: p.Hello, conn: _Connection) -> p.Reply:
        if hello.version != p.PROTOCOL_VERSION:
            return p.Error(
                id=hello.id,
                code="version_mismatch",
                message=f"runner speaks protocol {p.PROTOCOL_VERSION}, client sent {hello.version}",
            )
        conn.client = hello.client
        return p.Welcome(id=hello.id, runner=self.settings.name)

    async def _answer(self, conn: _Connection, request: p.Request) -> None:
        handler: Callable[[p.Request], Awaitable[p.Reply]] = getattr(self, f"_on_{request.type}")
        try:
            reply = await handler(request)
        except _Refused as refused:
            reply = p.Error(id=request.id, code=refused.code, message=str(refused))
        except Exception as exc:  # a bug must not take the daemon down with it
            log.exception("request %s failed", request.type)
            reply = p.Error(id=request.id, code="internal", message=f"{type(exc).__name__}: {exc}")
        reply.id = request.id
        with contextlib.suppress(ConnectionError):
            await conn.send(reply)

    async def _stream(self, conn: _Connection, request: p.Subscribe) -> None:
        await conn.send(p.Subscribed(id=request.id, head=await self.store.head_seq(request.goal_id)))
        last = request.since
        with contextlib.suppress(ConnectionError):
            while True:
                wake = self._new_events
                events = await self.store.events_since(last, limit=STREAM_BATCH, goal_id=request.goal_id)
                for event in events:
                    await conn.send(p.EventMessage(event=event))
                    last = event.seq
                if len(events) < STREAM_BATCH:  # caught up; `wake` predates the query, so no event is missed
                    await wake.wait()

    # ---- operator requests ----

    async def _on_submit_goal(self, req: p.SubmitGoal) -> p.Reply:
        spec = parse_goal_text(req.text)
        agent = req.agent or spec.agent or self.settings.default_agent
        if agent not in self.settings.agents:
            raise _Refused(
                "bad_request", f"unknown agent {agent!r}; this runner has: {', '.join(self.settings.agents)}"
            )
        budget = req.budget or explicit_budget(spec, utcnow(), self.settings.experiment_timeout_s)
        goal = await self.store.create_goal(
            text=spec.text,
            owner=req.owner,
            agent=agent,
            budget=budget,
            metric=None,
            direction="maximize",
            target=spec.target,
            workspace_root=self.settings.workspaces,
        )
        self._unpaused[goal.id] = asyncio.Event()
        self._unpaused[goal.id].set()
        await self._start_agent(goal, resumed=False)
        return p.GoalReply(status=await self._status(goal.id))

    async def _on_steer(self, req: p.Steer) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        message = await self.store.add_inbox(goal.id, req.author, req.text)
        said = f"delivered to goal #{goal.id}'s inbox as message {message.id}"
        if change := apply_budget_change(goal.budget, req.text, utcnow()):
            await self._set_budget(goal, change[0], f"{req.author}: {change[1]}")
            said += f"; budget changed: {change[1]}"
        return p.Done(message=said)

    async def _on_change_budget(self, req: p.ChangeBudget) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        change = apply_budget_change(goal.budget, req.change, utcnow())
        if change is None:
            raise _Refused(
                "bad_request",
                f"no budget in {req.change!r}; try '+2h', 'max 10 experiments' or 'gpu-hours 8'",
            )
        await self._set_budget(goal, change[0], f"{req.by}: {change[1]}")
        return p.Done(message=f"budget changed: {change[1]}")

    async def _on_stop(self, req: p.Stop) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        reason = f"stopped by {req.by}" + (f": {req.reason}" if req.reason else "")
        await self._end_goal(goal.id, "stopped", reason)
        return p.Done(message=f"goal #{goal.id} {reason}; final report written")

    async def _on_pause(self, req: p.Pause) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        if goal.state == "paused":
            return p.Done(message=f"goal #{goal.id} is already paused")
        self._unpaused.setdefault(goal.id, asyncio.Event()).clear()
        await self.store.set_goal_state(goal.id, "paused", f"paused by {req.by}")
        return p.Done(message=f"goal #{goal.id} paused: the current experiment finishes, no new one starts")

    async def _on_resume(self, req: p.Resume) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        if goal.state != "paused":
            return p.Done(message=f"goal #{goal.id} is not paused ({goal.state})")
        pending = await self.store.pending_approvals(goal.id)
        await self.store.set_goal_state(
            goal.id, "waiting_for_approval" if pending else "running", f"resumed by {req.by}"
        )
        self._unpaused.setdefault(goal.id, asyncio.Event()).set()
        return p.Done(message=f"goal #{goal.id} resumed")

    async def _on_decide(self, req: p.Decide) -> p.Reply:
        approval = await self.store.get_approval(req.approval_id)
        if approval is None:
            raise _Refused("not_found", f"no approval #{req.approval_id}")
        state = "approved" if req.approve else "rejected"
        approval, decided_now = await self.store.decide_approval(
            approval.id, state=state, by=req.by, comment=req.comment
        )
        if not decided_now:
            who = f" by {approval.decided_by}" if approval.decided_by else ""
            raise _Refused("conflict", f"approval #{approval.id} was already {approval.state}{who}")
        if (waiter := self._approval_waiters.get(approval.id)) and not waiter.done():
            waiter.set_result(approval)
        return p.DecisionReply(approval=approval)

    async def _on_status(self, req: p.Status) -> p.Reply:
        if req.goal_id is not None:
            await self._goal(req.goal_id)
            return p.StatusReply(goals=[await self._status(req.goal_id)])
        goals = await self.store.list_goals(active_only=req.active_only)
        return p.StatusReply(goals=[await self._status(g.id) for g in goals])

    async def _on_summary(self, req: p.Summary) -> p.Reply:
        goal = await self._goal(req.goal_id)
        experiments = await self.store.experiments(goal.id)
        status = await self._status(goal.id)
        text = summary_text(goal, experiments, status.compute_hours_used, utcnow(), goal.end_reason)
        return p.SummaryReply(status=status, ledger=experiments, text=text)

    async def _on_get_log(self, req: p.GetLog) -> p.Reply:
        experiment = await self.store.get_experiment(req.experiment_id)
        if experiment is None:
            raise _Refused("not_found", f"no experiment #{req.experiment_id}")
        try:
            with open(experiment.log_path, "rb") as f:
                f.seek(req.offset)
                data = f.read(req.limit)
                eof = f.read(1) == b""
        except FileNotFoundError:
            data, eof = b"", True
        return p.LogReply(
            text=data.decode(errors="replace"), offset=req.offset, next_offset=req.offset + len(data), eof=eof
        )

    async def _on_get_series(self, req: p.GetSeries) -> p.Reply:
        points = await self.store.metric_series(req.goal_id, req.name, req.experiment_id)
        return p.SeriesReply(name=req.name, points=points)

    # ---- agent verbs ----

    async def _on_milestone(self, req: p.ReportMilestone) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        event = await self.store.append_event(goal.id, MilestoneReported(title=req.title, text=req.text))
        return p.Done(message=f"milestone logged (event {event.seq})")

    async def _on_log_metrics(self, req: p.LogMetrics) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        await self.store.add_metrics(goal.id, req.experiment_id, req.points)
        return p.Done(message=f"{len(req.points)} metric point(s) logged")

    async def _on_read_inbox(self, req: p.ReadInbox) -> p.Reply:
        await self._goal(req.goal_id)
        return p.InboxReply(messages=await self.store.read_inbox(req.goal_id, unread_only=not req.all))

    async def _on_write_diary(self, req: p.WriteDiary) -> p.Reply:
        await self._goal(req.goal_id)
        entry = await self.store.write_diary(req.goal_id, req.kind, req.text)
        return p.Done(message=f"diary entry {entry.id} written ({entry.kind})")

    async def _on_read_diary(self, req: p.ReadDiary) -> p.Reply:
        await self._goal(req.goal_id)
        return p.DiaryReply(entries=await self.store.read_diary(req.goal_id, last=req.last, kind=req.kind))

    async def _on_submit_report(self, req: p.SubmitReport) -> p.Reply:
        await self._goal(req.goal_id)
        await self.store.set_agent_report(req.goal_id, req.text)
        return p.Done(message="report text stored; it goes into the final report")

    async def _on_ask(self, req: p.Ask) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        approval = await self._ask(goal, req.kind, req.question, req.detail, req.timeout_s)
        return p.DecisionReply(approval=approval)

    async def _on_run_experiment(self, req: p.RunExperiment) -> p.Reply:
        goal = await self._active_goal(req.goal_id)
        await self._unpaused.setdefault(goal.id, _set_event()).wait()
        async with self._goal_locks.setdefault(goal.id, asyncio.Lock()):
            goal = await self._active_goal(goal.id)
            attempted, compute_used = await self.store.usage(goal.id)
            check = check_new_experiment(goal.budget, attempted, compute_used, utcnow())
            if check.needs_continue_approval:
                approval = await self._ask(
                    goal,
                    "continue",
                    f"{check.reason}. Run {DEFAULT_BLOCK} more experiments?",
                    f"Next: {req.description}\nBest so far is in the ledger above; reject to end the campaign.",
                    None,
                )
                if approval.state != "approved":
                    raise _Refused("budget_exhausted", f"{check.reason}; continuing was {approval.state}")
                goal = await self._active_goal(goal.id)
                budget = goal.budget.model_copy(update={"max_experiments": attempted + DEFAULT_BLOCK})
                await self._set_budget(
                    goal, budget, f"{approval.decided_by}: {DEFAULT_BLOCK} more experiments"
                )
                goal = await self._active_goal(goal.id)
            elif not check.ok:
                raise _Refused("budget_exhausted", check.reason)
            metric = req.metric or goal.metric
            if metric and goal.metric is None:
                await self.store.set_goal_metric(goal.id, metric, req.direction or "maximize")
                goal = await self._goal(goal.id)
            experiment = await self.store.start_experiment(
                goal.id,
                description=req.description,
                command=req.command,
                params=req.params,
                metric_name=metric,
                experiments_dir=Path(goal.workspace) / "experiments",
                eval_command=req.eval_command,
            )
            task = asyncio.ensure_future(self._supervise(goal, experiment, req))
            self._experiments[experiment.id] = task
            self._experiment_goal[experiment.id] = goal.id
            task.add_done_callback(lambda _: self._forget_experiment(experiment.id))
        try:
            # Shielded: a client that hangs up does not take its experiment down with it.
            finished, new_best = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
            finished, new_best = await self.store.get_experiment(experiment.id), False
        attempted, compute_used = await self.store.usage(goal.id)
        goal = await self._goal(goal.id)
        return p.ExperimentReply(
            experiment=finished,
            new_best=new_best,
            stop_status=stop_status(goal.budget, attempted, compute_used, utcnow()),
        )

    # ---- the machinery ----

    def _forget_experiment(self, experiment_id: int) -> None:
        self._experiments.pop(experiment_id, None)
        self._experiment_goal.pop(experiment_id, None)

    async def _supervise(
        self, goal: Goal, experiment: Experiment, req: p.RunExperiment
    ) -> tuple[Experiment, bool]:
        log_path = Path(experiment.log_path)
        env = (
            self._environment(goal)
            | req.env
            | {
                "GOALTENDER_EXPERIMENT_ID": str(experiment.id),
                "GOALTENDER_EXPERIMENT_DIR": str(log_path.parent),
            }
        )
        timeout = experiment_timeout(goal.budget, req.timeout_s, utcnow())

        async def on_points(points):
            await self.store.add_metrics(goal.id, experiment.id, points)

        async def on_start(pid: int):
            await self.store.set_experiment_pid(experiment.id, pid)

        result: ProcessResult | None = None
        try:
            result = await run_supervised(
                req.command,
                cwd=Path(req.cwd or goal.workspace),
                env=env,
                log_path=log_path,
                timeout_s=timeout,
                on_points=on_points,
                on_start=on_start,
                grace_s=self.settings.stop_grace_s,
            )
        except asyncio.CancelledError:
            await self._finish(
                experiment, "crash", None, {}, None, self._cancel_notes.pop(experiment.id, "cancelled")
            )
            raise
        except OSError as exc:
            return await self._finish(experiment, "crash", None, {}, None, f"could not start: {exc}"), False
        metric, summary, verified = experiment.metric_name, result.summary, False
        # With an eval command the run need not print the metric: the evaluation measures it.
        status, note = _judge(result, timeout, None if req.eval_command else metric, summary)
        if status != "crash" and req.eval_command:
            # The runner measures the headline itself; the run's own numbers stay under `run/`.
            evaluation = await run_supervised(
                req.eval_command,
                cwd=Path(req.cwd or goal.workspace),
                env=env,
                log_path=log_path.parent / "eval.log",
                timeout_s=timeout,
                on_points=on_points,
                on_start=_nothing,
                grace_s=self.settings.stop_grace_s,
            )
            status, note = _judge(evaluation, timeout, metric, evaluation.summary, what="eval")
            summary = {**{f"run/{k}": v for k, v in result.summary.items()}, **evaluation.summary}
            result.wall_seconds += evaluation.wall_seconds
            result.cpu_seconds += evaluation.cpu_seconds
            verified = status != "crash"
        value = summary.get(metric) if metric and status != "crash" else None
        new_best = False
        if status == "keep" and value is not None:
            best = best_experiment(await self.store.experiments(goal.id), goal.direction)
            new_best = best is None or (
                value > best.metric_value if goal.direction == "maximize" else value < best.metric_value
            )
            status = "keep" if new_best else "discard"
        finished = await self._finish(experiment, status, value, summary, result, note, new_best, verified)
        return finished, new_best

    async def _finish(
        self,
        experiment: Experiment,
        status: str,
        value: float | None,
        metrics: dict,
        result: ProcessResult | None,
        note: str | None,
        new_best: bool = False,
        verified: bool = False,
    ) -> Experiment:
        compute = None
        if result is not None:
            compute = (
                result.wall_seconds * self.gpus if self.compute_unit == "gpu" else result.cpu_seconds
            ) / 3600
        return await self.store.finish_experiment(
            experiment.id,
            status=status,
            metric_value=value,
            metrics=metrics,
            wall_seconds=result.wall_seconds if result else None,
            cpu_seconds=result.cpu_seconds if result else None,
            compute_hours=compute,
            peak_rss_mb=result.peak_rss_mb if result else None,
            exit_code=result.exit_code if result else None,
            note=note,
            new_best=new_best,
            verified=verified,
        )

    async def _ask(
        self, goal: Goal, kind: str, question: str, detail: str, timeout_s: float | None
    ) -> Approval:
        timeout = timeout_s or self.settings.approval_timeout_s
        approval = await self.store.create_approval(
            goal.id,
            kind=kind,
            question=question,
            detail=detail,
            expires_at=utcnow() + timedelta(seconds=timeout),
        )
        waiter: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._approval_waiters[approval.id] = waiter
        await self.store.set_goal_state(goal.id, "waiting_for_approval", question, only_from={"running"})
        try:
            approval = await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            approval, _ = await self.store.decide_approval(
                approval.id, state="expired", by="runner", comment=f"no decision within {timeout:.0f}s"
            )
        finally:
            self._approval_waiters.pop(approval.id, None)
        if not await self.store.pending_approvals(goal.id):
            await self.store.set_goal_state(
                goal.id, "running", "approval answered", only_from={"waiting_for_approval"}
            )
        return approval

    def _environment(self, goal: Goal) -> dict[str, str]:
        env = dict(os.environ)
        for var, sub in ETIQUETTE_DIRS.items():
            if var not in env:
                path = self.settings.cache_dir / sub
                path.mkdir(parents=True, exist_ok=True)
                env[var] = str(path)
        env.update(
            GOALTENDER_SOCKET=str(self.settings.socket_path),
            GOALTENDER_GOAL_ID=str(goal.id),
            GOALTENDER_WORKSPACE=goal.workspace,
            GOALTENDER_HOME=str(self.settings.home),
            PYTHONUNBUFFERED="1",
        )
        return env

    async def _start_agent(self, goal: Goal, *, resumed: bool) -> None:
        workspace = Path(goal.workspace)
        workspace.mkdir(parents=True, exist_ok=True)
        env = self._environment(goal)
        if resumed:
            env["GOALTENDER_RESUMED"] = "1"
        command = self.settings.agents[goal.agent]
        try:
            proc = spawn(command, cwd=workspace, env=env, log_path=workspace / "agent.log")
        except OSError as exc:
            await self._end_goal(goal.id, "failed", f"could not start agent {goal.agent!r}: {exc}")
            return
        self._agents[goal.id] = proc
        await self.store.set_agent_pid(goal.id, proc.pid)
        if goal.state in ("accepted", "submitted"):
            await self.store.set_goal_state(goal.id, "running", f"agent {goal.agent} started")
        self._agent_watchers[goal.id] = self._spawn_task(self._watch_agent(goal.id, proc))
        self._arm_deadline(goal)

    async def _watch_agent(self, goal_id: int, proc: subprocess.Popen) -> None:
        status, _ = await wait_process(proc)
        self._agents.pop(goal_id, None)
        if goal_id in self._ending:
            return
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            await self._end_goal(goal_id, "finished", "the agent finished")
        else:
            goal = await self._goal(goal_id)
            tail = _tail_text(Path(goal.workspace) / "agent.log", 1500)
            await self._end_goal(goal_id, "failed", f"the agent exited with code {code}:\n{tail}")

    def _arm_deadline(self, goal: Goal) -> None:
        if old := self._deadline_timers.pop(goal.id, None):
            old.cancel()
        if goal.budget.deadline is None:
            return

        async def at_deadline():
            await asyncio.sleep(max(0.0, (goal.budget.deadline - utcnow()).total_seconds()))
            self._deadline_timers.pop(goal.id, None)
            await self._end_goal(goal.id, "finished", "deadline reached")

        self._deadline_timers[goal.id] = self._spawn_task(at_deadline())

    async def _set_budget(self, goal: Goal, budget, reason: str) -> None:
        goal = await self.store.update_budget(goal.id, budget, reason)
        self._arm_deadline(goal)

    async def _end_goal(self, goal_id: int, state: str, reason: str) -> None:
        """Stop the agent and the goal's experiments (process groups), settle approvals, enter a
        terminal state and write the final report. Idempotent."""
        if goal_id in self._ending:
            return
        self._ending.add(goal_id)
        timer = self._deadline_timers.pop(goal_id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        if (proc := self._agents.pop(goal_id, None)) is not None:
            # SIGTERM first: the agent may use the grace period to hand in its report.
            await terminate_group(proc.pid, None, self.settings.stop_grace_s)
        tasks = [t for eid, t in self._experiments.items() if self._experiment_goal.get(eid) == goal_id]
        for eid, task in list(self._experiments.items()):
            if self._experiment_goal.get(eid) == goal_id:
                self._cancel_notes[eid] = f"ended with the goal: {reason.splitlines()[0]}"
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for approval in await self.store.pending_approvals(goal_id):
            approval, _ = await self.store.decide_approval(
                approval.id, state="expired", by="runner", comment=f"the goal ended: {reason.splitlines()[0]}"
            )
            if (waiter := self._approval_waiters.get(approval.id)) and not waiter.done():
                waiter.set_result(approval)
        self._unpaused.setdefault(goal_id, asyncio.Event()).set()
        goal = await self.store.set_goal_state(goal_id, state, reason)
        goal = goal or await self._goal(goal_id)
        if not await self.store.has_report(goal_id):
            experiments = await self.store.experiments(goal_id)
            _, compute_used = await self.store.usage(goal_id)
            text = final_report(
                goal, experiments, compute_used, utcnow(), reason, await self.store.agent_report(goal_id)
            )
            await self.store.record_report(
                goal_id, end_reason=reason, text=text, best=best_experiment(experiments, goal.direction)
            )

    async def _goal(self, goal_id: int) -> Goal:
        goal = await self.store.get_goal(goal_id)
        if goal is None:
            raise _Refused("not_found", f"no goal #{goal_id}")
        return goal

    async def _active_goal(self, goal_id: int) -> Goal:
        goal = await self._goal(goal_id)
        if goal.state in TERMINAL_STATES or goal_id in self._ending:
            why = f" ({goal.end_reason.splitlines()[0]})" if goal.end_reason else ""
            raise _Refused(
                "conflict",
                f"goal #{goal_id} is {goal.state}{why}; it takes no more changes. Start a new goal.",
            )
        return goal

    async def _status(self, goal_id: int) -> p.GoalStatus:
        goal = await self._goal(goal_id)
        experiments = await self.store.experiments(goal_id)
        attempted, compute_used = len(experiments), sum(e.compute_hours or 0 for e in experiments)
        running = next((e for e in reversed(experiments) if e.status == "running"), None)
        return p.GoalStatus(
            goal=goal,
            attempted=attempted,
            compute_hours_used=compute_used,
            best=best_experiment(experiments, goal.direction),
            running=running,
            pending_approvals=await self.store.pending_approvals(goal_id),
            stop_status=stop_status(goal.budget, attempted, compute_used, utcnow()),
        )


def _judge(
    result: ProcessResult, timeout: float | None, metric: str | None, summary: dict, what: str = "run"
) -> tuple[str, str | None]:
    """keep (for now; the best-so-far comparison may make it discard) or crash, with the reason."""
    prefix = "" if what == "run" else f"{what}: "
    if result.timed_out:
        return "crash", f"{prefix}timeout after {timeout:.0f}s"
    if result.exit_code != 0:
        how = (
            f"exit code {result.exit_code}" if result.signal is None else f"killed by signal {result.signal}"
        )
        return "crash", prefix + how
    if metric and metric not in summary:
        return "crash", f"{prefix}no '{metric}: <value>' summary line in the output"
    return "keep", None


async def _nothing(*_) -> None:
    return None


class _Refused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


_TOO_LONG = b"\x00too-long"


class _Connection:
    """One client: capped line reads, serialised writes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.client: str | None = None
        self._write_lock = asyncio.Lock()

    async def read_line(self) -> bytes | None:
        """The next line; _TOO_LONG for an oversized line (skipped whole); None at EOF."""
        try:
            return await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None
        except asyncio.LimitOverrunError as exc:
            await self.reader.readexactly(exc.consumed)
            while True:  # discard the rest of the oversized line
                try:
                    await self.reader.readuntil(b"\n")
                    return _TOO_LONG
                except asyncio.LimitOverrunError as more:
                    await self.reader.readexactly(more.consumed)
                except asyncio.IncompleteReadError:
                    return None

    async def send(self, message: p.Message) -> None:
        async with self._write_lock:
            self.writer.write(p.encode(message))
            await self.writer.drain()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


async def _socket_answers(path: Path) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 2)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def _count_gpus() -> int:
    if visible := os.environ.get("CUDA_VISIBLE_DEVICES"):
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _tail_text(path: Path, limit: int) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except FileNotFoundError:
        return "(no agent.log)"
    return data.decode(errors="replace").strip()


async def run_forever(settings: RunnerSettings) -> None:
    runner = await Runner.start(settings)
    serving = asyncio.ensure_future(runner.serve_forever())
    # SIGTERM (systemd, kill) shuts down in order: agents and runs are ended and recorded, and a
    # restart resumes the goals. SIGKILL is survived too, by the recovery at start.
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, serving.cancel)
    try:
        await serving
    except asyncio.CancelledError:
        log.info("runner %s shutting down", settings.name)
    finally:
        await runner.close()


def main(settings: RunnerSettings | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr
    )
    asyncio.run(run_forever(settings or RunnerSettings()))
