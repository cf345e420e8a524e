"""Mirror goals, the ledger and its series to MLflow (the `mlflow` extra), where that is the team's
tracker. Off unless GOALTENDER_MLFLOW or GOALTENDER_MLFLOW_TRACKING_URI is set.

Here in runner/ rather than training/: it is part of the runner daemon, a reader of runner.db's
event log in the runner's own process, whatever ran the experiments (training/ holds what runs
inside an experiment).

What goes where: one MLflow experiment per goal, `goaltender/<runner>/goal-<id>`, tagged with the
goal's text, owner, agent and state; one run per ledger row, `#<index> <description>`, with the
row's params, its series as metric histories (with their steps), its own numbers under `ledger/`
(its metric, verified or reported, the other final values, wall and CPU seconds, compute-hours,
peak RSS), tags for its status, description, command, note and ids, and MLflow's status: FINISHED
(keep, discard), FAILED (crash), KILLED (interrupted). Text leaves the box through the runner's
redactor, as everything else the runner sends does: every name as well as every value (experiment
and run names, tags, params and metric keys; a key is redacted before it is made one MLflow takes).

It must never slow or break the runner, so:
- it follows the event log from a cursor of its own (runner.db's cursors table, CURSOR_NAME),
  woken by each commit; a restart resumes where it stopped;
- MLflow's client is synchronous: its calls run, in order, in one daemon thread of the mirror's;
- a failure is logged and tried again with backoff (the events wait in the log), never raised;
  what MLflow refuses outright (a 4xx: a name it will not take) is logged and skipped;
- mirroring twice adds nothing: a run is looked up by its `goaltender.experiment_id` tag before
  one is made, and a series point carries its event's time, so MLflow drops a point it has.

One module past 600 lines on purpose: the cursor, the worker thread and the mapping of events to
MLflow calls are one pipeline with one failure policy (above); the mapping is most of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import logging
import os
import posixpath
import queue
import re
import shlex
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from goaltender.runner.config import RunnerSettings
from goaltender.runner.secrets import Redactor, url_shown
from goaltender.storage.records import (
    Event,
    Experiment,
    ExperimentFinished,
    ExperimentStarted,
    Goal,
    GoalAccepted,
    GoalStateChanged,
    MetricPoint,
    MetricsLogged,
)
from goaltender.storage.runner_store import RunnerStore

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger("goaltender.runner.mlflow")
T = TypeVar("T")

CURSOR_NAME = "runner:mlflow-mirror"  # its position in runner.db's cursors table
EVENT_BATCH = 500
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
REPEAT_WARNING_S = 600.0  # a failure that goes on is logged again this often, not at every retry
IDLE_CHECK_S = 5.0  # the log is read again this often without a wake-up (a missed one costs no more)
PROBE_TIMEOUT_S = 5.0

# MLflow's limits (mlflow.utils.validation): names, values, and what one log_batch may carry.
MAX_KEY = 250
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
_BAD_KEY_CHARS = re.compile(r"[^\w\-. /:]")

RUN_STATUS = {"keep": "FINISHED", "discard": "FINISHED", "crash": "FAILED", "interrupted": "KILLED"}

Point = tuple[str, float, int, int]  # key, value, timestamp (ms), step


class MlflowMirror:
    """Follows the event log and replays it into MLflow, one step at a time, in the mirror's thread."""

    def __init__(self, store: RunnerStore, tracking_uri: str, runner_name: str, redactor: Redactor):
        self.store = store
        self.tracking_uri = tracking_uri
        self.runner_name = runner_name
        self.redactor = redactor
        self._thread = MirrorThread()
        self._writer: MlflowWriter | None = None  # made (and used) in the thread only
        self._reachable = False  # an http(s) server is probed until a step has gone through
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing_since: float | None = None
        self._warned_at = 0.0

    @classmethod
    def from_settings(
        cls, settings: RunnerSettings, store: RunnerStore, redactor: Redactor
    ) -> MlflowMirror | None:
        """The mirror the settings ask for; None when they ask for none, or MLflow is missing."""
        uri = settings.mlflow_uri
        if uri is None:
            return None
        if importlib.util.find_spec("mlflow") is None:
            log.error(
                "MLflow mirroring to %s is configured but mlflow-skinny is not installed "
                "(pip install 'goaltender[mlflow]'): goals run unmirrored",
                url_shown(uri),
            )
            return None
        return cls(store, uri, settings.name, redactor)

    def start(self) -> None:
        self._listen()
        self._task = asyncio.ensure_future(self._follow())
        log.info("mirroring goals, the ledger and series to MLflow at %s", url_shown(self.tracking_uri))

    async def close(self) -> None:
        """Stop following (a restart resumes from the cursor); a call under way is left to finish."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._thread.stop()

    def _listen(self) -> None:
        """Be woken by every commit, besides whoever the store already tells (the server)."""
        tell_others = self.store.on_event

        def on_event(event: Event) -> None:
            tell_others(event)
            self._wake.set()

        self.store.on_event = on_event

    # ---- following the log ----

    async def _follow(self) -> None:
        cursor = await self.store.cursor(CURSOR_NAME)
        while True:
            self._wake.clear()  # before reading: a commit after the read wakes the wait below
            try:
                events = await self.store.events_since(cursor, EVENT_BATCH)
                if events:
                    await self._mirror(events)
                    cursor = events[-1].seq
                    await self.store.set_cursor(CURSOR_NAME, cursor)
                    continue
            except Exception as exc:  # reading runner.db failed: the runner has its own say on that
                log.warning("MLflow mirror: cannot read runner.db (%s); trying again", one_line(exc))
                await asyncio.sleep(RETRY_MAX_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), IDLE_CHECK_S)

    async def _mirror(self, events: Sequence[Event]) -> None:
        for step in await self._steps(events):
            await self._apply(step)

    async def _apply(self, step: Step) -> None:
        """One step, tried until it goes through or MLflow refuses it."""
        delay = RETRY_FIRST_S
        while True:
            try:
                await self._thread.call(functools.partial(self._apply_here, step))
            except Refused as refused:
                log.warning("MLflow mirror: %s not mirrored: MLflow refused it: %s", step.what, refused)
                return
            except Exception as exc:
                self._note_failure(exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
            else:
                self._note_success()
                return

    def _apply_here(self, step: Step) -> None:
        """In the thread: connect if need be, then the step; a 4xx from MLflow becomes Refused."""
        if not self._reachable:
            probe(self.tracking_uri)
        if self._writer is None:
            self._writer = MlflowWriter.connect(self.tracking_uri)
        with refusals_named():
            step.apply(self._writer)
        self._reachable = True

    def _note_failure(self, exc: Exception, retry_in: float) -> None:
        self._reachable = False
        now = time.monotonic()
        first = self._failing_since is None
        if first:
            self._failing_since = now
        elif now - self._warned_at < REPEAT_WARNING_S:
            log.debug("MLflow mirror: still failing: %s", one_line(exc))
            return
        self._warned_at = now
        log.warning(
            "MLflow mirror: mirroring to %s is %s (%s); goals are not affected, their events wait "
            "in the log; trying again in %gs",
            url_shown(self.tracking_uri),
            "failing" if first else "still failing",
            one_line(exc),
            retry_in,
        )

    def _note_success(self) -> None:
        if self._failing_since is not None:
            log.info("MLflow mirror: mirroring to %s works again", url_shown(self.tracking_uri))
        self._failing_since = None

    # ---- events to steps ----

    async def _steps(self, events: Sequence[Event]) -> list[Step]:
        """What MLflow is to be told, in the order of the log; a row's consecutive series points
        go in one step (one log_batch)."""
        views = _Views(self.store, self.runner_name, self.redactor)
        steps: list[Step] = []
        for event in events:
            if event.goal_id is None or (goal := await views.goal(event.goal_id)) is None:
                continue
            data = event.data
            if isinstance(data, GoalAccepted):
                steps.append(EnsureGoal(goal))
            elif isinstance(data, GoalStateChanged):
                tags = {"goaltender.state": data.state, "goaltender.state_reason": data.reason}
                if metric := goal.tags.get("goaltender.metric"):  # known from the first row on
                    tags["goaltender.metric"] = metric
                steps.append(TagGoal(goal, views.texts(tags)))
            elif isinstance(data, ExperimentStarted):
                steps.append(StartRun(goal, views.row(data.experiment)))
            elif isinstance(data, ExperimentFinished):
                steps.append(finish_run(goal, views.row(data.experiment), data.experiment, views))
            elif isinstance(data, MetricsLogged) and data.experiment_id is not None:
                # (points logged for the goal rather than a row have no run to go to)
                row = await views.row_by_id(data.experiment_id)
                if row is not None:
                    _add_series(steps, goal, row, series_points(data.points, event.ts, self.redactor))
        return steps


class _Views:
    """What MLflow gets of goals and rows, redacted, each read from runner.db once per batch."""

    def __init__(self, store: RunnerStore, runner_name: str, redactor: Redactor):
        self.store = store
        self.runner_name = runner_name
        self.redactor = redactor
        self._goals: dict[int, GoalView | None] = {}
        self._rows: dict[int, RowView | None] = {}

    def texts(self, tags: dict[str, str]) -> dict[str, str]:
        return redacted_tags(tags, self.redactor)

    async def goal(self, goal_id: int) -> GoalView | None:
        if goal_id not in self._goals:
            goal = await self.store.get_goal(goal_id)
            self._goals[goal_id] = goal_view(goal, self.runner_name, self.redactor) if goal else None
        return self._goals[goal_id]

    def row(self, experiment: Experiment) -> RowView:
        return row_view(experiment, self.runner_name, self.redactor)

    async def row_by_id(self, experiment_id: int) -> RowView | None:
        if experiment_id not in self._rows:
            experiment = await self.store.get_experiment(experiment_id)
            self._rows[experiment_id] = self.row(experiment) if experiment else None
        return self._rows[experiment_id]


# ---- what MLflow gets ----


@dataclass(frozen=True)
class GoalView:
    goal_id: int
    name: str  # the MLflow experiment's
    owner: str
    tags: dict[str, str]


@dataclass(frozen=True)
class RowView:
    experiment_id: int
    run_name: str
    start_ms: int
    tags: dict[str, str]
    params: dict[str, str]


def goal_view(goal: Goal, runner_name: str, redactor: Redactor) -> GoalView:
    tags = {
        "mlflow.note.content": goal.text,  # the experiment's description in MLflow's UI
        "goaltender.goal": goal.text,
        "goaltender.goal_id": str(goal.id),
        "goaltender.owner": goal.owner,
        "goaltender.agent": goal.agent,
        "goaltender.runner": runner_name,
    }
    if goal.metric:
        tags["goaltender.metric"] = f"{goal.metric} ({goal.direction})"
    name = redactor.redact(f"goaltender/{runner_name}/goal-{goal.id}")
    return GoalView(goal.id, name, redactor.redact(goal.owner), redacted_tags(tags, redactor))


def row_view(row: Experiment, runner_name: str, redactor: Redactor) -> RowView:
    tags = {
        "goaltender.experiment_id": str(row.id),  # how the run is found again
        "goaltender.goal_id": str(row.goal_id),
        "goaltender.index": str(row.index),
        "goaltender.runner": runner_name,
        "goaltender.description": row.description,
        "mlflow.note.content": row.description,  # the run's description in MLflow's UI
        "goaltender.command": shlex.join(row.command),
        "goaltender.status": row.status,
    }
    if row.eval_command:
        tags["goaltender.eval_command"] = shlex.join(row.eval_command)
    if row.metric_name:
        tags["goaltender.metric"] = row.metric_name
    params = {mlflow_key(name, redactor): param_value(value, redactor) for name, value in row.params.items()}
    return RowView(
        experiment_id=row.id,
        run_name=redactor.redact(f"#{row.index} {row.description}")[:MAX_KEY],
        start_ms=millis(row.started_at),
        tags=redacted_tags(tags, redactor),
        params=params,
    )


def ledger_points(row: Experiment, redactor: Redactor) -> list[Point]:
    """The row's own numbers, under `ledger/` (apart from its series: NeMo RL's ledger metric is
    the best checkpoint's, not the last point of the series of the same name)."""
    numbers: dict[str, float | None] = dict(row.metrics)
    if row.metric_name:
        numbers[row.metric_name] = row.metric_value  # the verified one wins over what was printed
    numbers |= {
        "wall_seconds": row.wall_seconds,
        "cpu_seconds": row.cpu_seconds,
        "compute_hours": row.compute_hours,
        "peak_rss_mb": row.peak_rss_mb,
        "gpus": float(row.gpus),
        "queued_seconds": row.queued_seconds,
        "peak_gpu_memory_mb": row.peak_gpu_memory_mb,
        "gpu_utilization": row.gpu_utilization,
    }
    ended = millis(row.ended_at or row.started_at)
    return [
        (mlflow_key(f"ledger/{name}", redactor), float(value), ended, 0)
        for name, value in numbers.items()
        if value is not None
    ]


def finish_run(goal: GoalView, row: RowView, experiment: Experiment, views: _Views) -> FinishRun:
    tags = {
        "goaltender.status": experiment.status,
        "goaltender.verified": str(experiment.verified).lower(),
        "goaltender.where": experiment.where,  # executor, box or cluster, job id, GPUs
    }
    if experiment.note:
        tags["goaltender.note"] = experiment.note
    if experiment.exit_code is not None:
        tags["goaltender.exit_code"] = str(experiment.exit_code)
    return FinishRun(
        goal,
        row,
        points=ledger_points(experiment, views.redactor),
        tags=views.texts(tags),
        status=RUN_STATUS.get(experiment.status, "FINISHED"),
        end_ms=millis(experiment.ended_at) if experiment.ended_at else None,
    )


def series_points(points: Sequence[MetricPoint], ts: datetime, redactor: Redactor) -> list[Point]:
    """Series points at their event's time: the same event mirrored twice gives the same points,
    which MLflow keeps once. MLflow's steps are whole numbers: a fractional step is rounded, and
    a point without one is at step 0."""
    at = millis(ts)
    return [
        (mlflow_key(p.name, redactor), p.value, at, round(p.step) if p.step is not None else 0)
        for p in points
    ]


def _add_series(steps: list[Step], goal: GoalView, row: RowView, points: list[Point]) -> None:
    last = steps[-1] if steps else None
    if isinstance(last, LogSeries) and last.row.experiment_id == row.experiment_id:
        last.points.extend(points)
    else:
        steps.append(LogSeries(goal, row, points))


def mlflow_key(name: str, redactor: Redactor) -> str:
    """A name MLflow takes as a param or metric key: redacted first (a param or a metric named
    after a secret names the secret), then its characters, its length, and nothing that reads as
    another path (`a//b`, `../x`)."""
    key = _BAD_KEY_CHARS.sub("_", redactor.redact(name))[:MAX_KEY] or "_"
    normal = posixpath.normpath(key)
    if normal != key or normal == "." or normal.startswith(("..", "/")):
        key = key.replace("/", "_").replace(".", "_")
    return key


def redacted_tags(tags: dict[str, str], redactor: Redactor) -> dict[str, str]:
    return {key: redactor.redact(value)[:MAX_TAG_VALUE] for key, value in tags.items()}


def param_value(value: Any, redactor: Redactor) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return redactor.redact(text)[:MAX_PARAM_VALUE]


def millis(when: datetime) -> int:
    return int(when.timestamp() * 1000)


# ---- steps: what the thread does ----


class Step(Protocol):
    @property
    def what(self) -> str: ...

    def apply(self, writer: MlflowWriter) -> None: ...


@dataclass
class EnsureGoal:
    goal: GoalView

    @property
    def what(self) -> str:
        return f"goal #{self.goal.goal_id}"

    def apply(self, writer: MlflowWriter) -> None:
        writer.experiment_for(self.goal)


@dataclass
class TagGoal:
    goal: GoalView
    tags: dict[str, str]

    @property
    def what(self) -> str:
        return f"goal #{self.goal.goal_id}'s state"

    def apply(self, writer: MlflowWriter) -> None:
        writer.tag_goal(self.goal, self.tags)


@dataclass
class StartRun:
    goal: GoalView
    row: RowView

    @property
    def what(self) -> str:
        return f"experiment #{self.row.experiment_id} (goal #{self.goal.goal_id})"

    def apply(self, writer: MlflowWriter) -> None:
        writer.start_run(self.goal, self.row)


@dataclass
class LogSeries:
    goal: GoalView
    row: RowView
    points: list[Point] = field(default_factory=list)

    @property
    def what(self) -> str:
        return f"{len(self.points)} series point(s) of experiment #{self.row.experiment_id}"

    def apply(self, writer: MlflowWriter) -> None:
        writer.log_points(self.goal, self.row, self.points)


@dataclass
class FinishRun:
    goal: GoalView
    row: RowView
    points: list[Point]
    tags: dict[str, str]
    status: str
    end_ms: int | None

    @property
    def what(self) -> str:
        return f"the end of experiment #{self.row.experiment_id} (goal #{self.goal.goal_id})"

    def apply(self, writer: MlflowWriter) -> None:
        writer.finish_run(self)


# ---- the MLflow side (in the mirror's thread only) ----


class MlflowWriter:
    """MLflow experiments and runs for goals and rows, found again before any is made."""

    def __init__(self, client: MlflowClient, artifact_root: Path | None):
        self.client = client
        self.artifact_root = artifact_root
        self._experiments: dict[int, str | None] = {}  # goal id -> MLflow experiment id (None: deleted)
        self._runs: dict[int, str] = {}  # ledger row id -> MLflow run id

    @classmethod
    def connect(cls, tracking_uri: str) -> MlflowWriter:
        return cls(mlflow_client_class()(tracking_uri=tracking_uri), artifact_root(tracking_uri))

    def experiment_for(self, goal: GoalView) -> str | None:
        """The goal's MLflow experiment, made if missing; None if someone deleted it in MLflow
        (deliberately, so the goal is not mirrored again; said once)."""
        if goal.goal_id in self._experiments:
            return self._experiments[goal.goal_id]
        found = self.client.get_experiment_by_name(goal.name)
        if found is None:
            location = str(self.artifact_root / f"goal-{goal.goal_id}") if self.artifact_root else None
            experiment_id: str | None = self.client.create_experiment(
                goal.name, artifact_location=location, tags=goal.tags
            )
        elif found.lifecycle_stage == "deleted":
            self._experiments[goal.goal_id] = None
            raise Refused(f"its experiment {goal.name!r} was deleted in MLflow; the goal is left out")
        else:
            experiment_id = found.experiment_id
        self._experiments[goal.goal_id] = experiment_id
        return experiment_id

    def tag_goal(self, goal: GoalView, tags: dict[str, str]) -> None:
        if (experiment_id := self.experiment_for(goal)) is not None:
            for key, value in tags.items():
                self.client.set_experiment_tag(experiment_id, key, value)

    def run_for(self, goal: GoalView, row: RowView) -> str | None:
        """The row's run: known, found by its tag, or made (RUNNING, with its tags)."""
        if row.experiment_id in self._runs:
            return self._runs[row.experiment_id]
        if (experiment_id := self.experiment_for(goal)) is None:
            return None
        found = self.client.search_runs(
            [experiment_id],
            filter_string=f"tags.`goaltender.experiment_id` = '{row.experiment_id}'",
            max_results=1,
        )
        if found:
            run_id = found[0].info.run_id
        else:
            tags = {"mlflow.user": goal.owner, **row.tags}
            run = self.client.create_run(
                experiment_id, start_time=row.start_ms, tags=tags, run_name=row.run_name
            )
            run_id = run.info.run_id
        self._runs[row.experiment_id] = run_id
        return run_id

    def start_run(self, goal: GoalView, row: RowView) -> None:
        """The run, and its params (logged again with the same values if it was found: harmless)."""
        if (run_id := self.run_for(goal, row)) is not None:
            self._log(run_id, params=row.params)

    def log_points(self, goal: GoalView, row: RowView, points: list[Point]) -> None:
        if (run_id := self.run_for(goal, row)) is not None:
            self._log(run_id, points=points)

    def finish_run(self, finish: FinishRun) -> None:
        if (run_id := self.run_for(finish.goal, finish.row)) is not None:
            self._log(run_id, points=finish.points, tags=finish.tags)
            self.client.set_terminated(run_id, status=finish.status, end_time=finish.end_ms)

    def _log(
        self,
        run_id: str,
        *,
        points: Sequence[Point] = (),
        params: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        """log_batch within MLflow's limits per call."""
        from mlflow.entities import Metric, Param, RunTag

        metrics = [Metric(key, value, timestamp, step) for key, value, timestamp, step in points]
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])
        pairs = [Param(k, v) for k, v in (params or {}).items()]
        for start in range(0, len(pairs), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=pairs[start : start + MAX_PARAMS_TAGS_PER_BATCH])
        labels = [RunTag(k, v) for k, v in (tags or {}).items()]
        for start in range(0, len(labels), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, tags=labels[start : start + MAX_PARAMS_TAGS_PER_BATCH])


class Refused(Exception):
    """MLflow will not take this step, however often it is tried (a 4xx): it is skipped."""


@contextlib.contextmanager
def refusals_named() -> Any:
    """MLflow's 4xx answers (but 429, too many requests) as Refused; everything else is a failure
    to try again."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        status = exc.get_http_status_code()
        if 400 <= status < 500 and status != 429:
            raise Refused(one_line(exc)) from exc
        raise


def mlflow_client_class() -> type[MlflowClient]:
    """MLflow's client, imported with MLflow's usage telemetry off (it calls a server on the
    internet, and the runner may sit on a closed network) unless the operator set
    MLFLOW_DISABLE_TELEMETRY; the variable is removed again, so experiments see the runner's
    environment as it was."""
    ours = "MLFLOW_DISABLE_TELEMETRY" not in os.environ
    if ours:
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    try:
        from mlflow import MlflowClient
    finally:
        if ours:
            os.environ.pop("MLFLOW_DISABLE_TELEMETRY", None)
    return MlflowClient


def artifact_root(tracking_uri: str) -> Path | None:
    """For a SQLite store, artifacts go beside its file (MLflow's default is ./mlruns, wherever the
    runner was started); a server decides for itself."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlflow-artifacts"


def probe(tracking_uri: str) -> None:
    """An http(s) server that does not answer a connection fails in seconds, rather than after
    MLflow's own retries (minutes). Skipped where a proxy is in the way."""
    parts = urllib.parse.urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    if urllib.request.getproxies().get(parts.scheme) and not urllib.request.proxy_bypass(parts.hostname):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError(f"cannot reach {parts.hostname}:{port}: {exc.strerror or exc}") from None


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---- the thread ----


class MirrorThread:
    """One daemon thread for MLflow's synchronous client: calls run in order, off the event loop.
    A daemon, because a call hanging on an unreachable server must not hold up the runner's exit
    (concurrent.futures joins its workers at exit)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    async def call(self, fn: Callable[[], T]) -> T:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="goaltender-mlflow", daemon=True)
            self._thread.start()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.put((fn, future))
        return await future

    def stop(self) -> None:
        """The thread ends after the call it is in, if any."""
        if self._thread is not None:
            self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            try:
                outcome = functools.partial(_settle, future, fn(), None)
            except Exception as exc:
                outcome = functools.partial(_settle, future, None, exc)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for it
                future.get_loop().call_soon_threadsafe(outcome)


def _settle(future: asyncio.Future[Any], result: Any, error: Exception | None) -> None:
    if future.done():  # cancelled while the call ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
