"""Typed records: what goes into runner.db and comes out of it, and what the protocol carries."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError


def utcnow() -> datetime:
    return datetime.now(UTC)


AGENT_LOG = "agent.log"  # in a goal's workspace, from its agent's start: the goal has run


class Record(BaseModel):
    # Schemas are built on first use: a CLI verb (a process each) needs few of these (issue 13).
    model_config = ConfigDict(extra="forbid", defer_build=True)


GoalState = Literal[
    "submitted", "accepted", "running", "waiting_for_approval", "paused", "finished", "stopped", "failed"
]
TERMINAL_STATES: frozenset[str] = frozenset({"finished", "stopped", "failed"})


class Budget(Record):
    """Hard limits the runner enforces, whatever the agent believes."""

    deadline: datetime | None = None  # absolute, fixed at acceptance
    wall_seconds: float | None = None  # what was asked, kept for display
    compute_hours: float | None = None  # GPU-hours on a GPU box, CPU-hours elsewhere
    max_experiments: int | None = None  # attempted, not successful
    max_tokens: int | None = None  # the LLM agent's input + output tokens, as it meters them
    experiment_timeout_s: float | None = None
    # The default stop rule (none given): baseline + 3 experiments, then ask before going on.
    ask_to_continue: bool = False


TOKEN_METRICS = ("agent/input_tokens", "agent/output_tokens")  # what the built-in agents meter


def tokens_used(series: dict[str, list[float]]) -> int:
    """What an agent has spent (Budget.max_tokens), from its cumulative token counters
    (TOKEN_METRICS) point by point: an agent started again (a resume) counts from zero, so a
    drop starts a new tally."""
    total = 0.0
    for values in series.values():
        last = 0.0
        for value in values:
            total += value - last if value >= last else value
            last = value
    return int(total)


class Goal(Record):
    id: int
    text: str
    owner: str = "unknown"
    agent: str = "sweep"
    state: GoalState = "submitted"
    budget: Budget = Field(default_factory=Budget)
    metric: str | None = None
    direction: Literal["maximize", "minimize"] = "maximize"
    target: float | None = None
    workspace: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    accepted_at: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str | None = None
    agent_pid: int | None = None
    # Its experiments' defaults ("via slurm", "2 GPUs each" in its text); else the box's.
    executor: Literal["local", "ray", "slurm"] | None = None
    gpus_per_experiment: int | None = None
    # Staged goals ("stages: plan, implement, campaign"): each stage ends at a gate the humans
    # approve (runner/stages.py); experiments wait for the stage named "campaign", if there is one.
    stages: list[str] = Field(default_factory=list)
    stage: int = 0  # index into stages
    # Why no experiment may start (a cross-check disagreement not yet decided, or rejected).
    blocked: str | None = None

    @property
    def stage_name(self) -> str | None:
        return self.stages[self.stage] if self.stage < len(self.stages) else None

    @property
    def active(self) -> bool:
        return self.state not in TERMINAL_STATES


ExperimentStatus = Literal["queued", "running", "keep", "discard", "crash", "interrupted"]
"""`queued`: admitted, waiting for a slot or GPUs on its box (its note says where it stands).
`crash`: the run failed, timed out, or was killed with its goal. `interrupted`: the runner cut it
short itself (it crashed or shut down while the run ran, or the disk was full): no fault of the
run's, so it does not count against max experiments, and the agent may run it again."""


class Experiment(Record):
    """One ledger row: an attempted experiment."""

    id: int
    goal_id: int
    index: int  # 1-based attempted count within the goal
    description: str
    command: list[str]
    params: dict[str, Any] = Field(default_factory=dict)
    status: ExperimentStatus = "running"
    metric_name: str | None = None
    metric_value: float | None = None
    # True when the runner measured metric_value itself with the experiment's eval command;
    # False when the number is only what the experiment reported ("reported").
    verified: bool = False
    eval_command: list[str] | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    started_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None
    wall_seconds: float | None = None
    cpu_seconds: float | None = None
    compute_hours: float | None = None
    peak_rss_mb: float | None = None
    exit_code: int | None = None
    log_path: str = ""
    pid: int | None = None
    note: str | None = None
    # Where it ran: the executor (local, ray, slurm), the box or cluster, the engine's job id.
    executor: str = "local"
    host: str | None = None
    job_id: str | None = None
    gpus: int = 0  # GPUs assigned: GPU-hours are wall time × this
    devices: str | None = None  # CUDA_VISIBLE_DEVICES it ran with, when this box assigned GPUs
    queued_seconds: float | None = None  # how long it waited for a slot
    peak_gpu_memory_mb: float | None = None  # of its GPUs together, as NVML sampled them
    gpu_utilization: float | None = None  # mean percent busy of its GPUs while it ran
    # How far metric_value can be trusted (runner/noise.py): its interval, how it was found, and
    # whether its gain over the best before it lies inside it (a keep that is not yet a finding).
    interval_low: float | None = None
    interval_high: float | None = None
    interval_how: str | None = None
    within_noise: bool = False
    repeats: int = 1  # seeds it ran (--repeat); metric_value is their mean

    @property
    def counted(self) -> bool:
        """Does it count against max experiments (as attempted)? Not when it was interrupted."""
        return self.status != "interrupted"

    @property
    def finished(self) -> bool:
        return self.status not in ("queued", "running")

    @property
    def where(self) -> str:
        """ "slurm job 42 on ci", "local on gpu-box-1 (GPUs 0,1)": for the card and the ledger."""
        place = (
            self.executor
            if self.job_id is None or self.executor == "local"
            else f"{self.executor} job {self.job_id}"
        )
        if self.host:
            place += f" on {self.host}"
        if self.devices:
            place += f" (GPU{'s' if ',' in self.devices else ''} {self.devices})"
        return place


class MetricPoint(Record):
    # Finite: JSON has no NaN or infinity (they would be stored as null, and not read back).
    name: str
    value: FiniteFloat
    step: FiniteFloat | None = None


class Curves(Record):
    """Training curves a milestone shows: series of one experiment of its goal, which whoever renders
    the milestone fetches (get_series) and draws, with one step marked (e.g. the best checkpoint)."""

    experiment_id: int = Field(ge=1, le=2**63 - 1)
    series: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(min_length=1, max_length=4)
    mark_step: FiniteFloat | None = None


class Approval(Record):
    id: int
    goal_id: int
    kind: str = "generic"  # cost | continue | command | generic
    question: str
    detail: str = ""
    state: Literal["pending", "approved", "rejected", "expired"] = "pending"
    requested_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime
    decided_by: str | None = None
    decided_at: datetime | None = None
    comment: str | None = None


class InboxMessage(Record):
    id: int
    goal_id: int
    author: str
    text: str
    created_at: datetime = Field(default_factory=utcnow)
    read_at: datetime | None = None


class AuditEntry(Record):
    """One control action (or a refused attempt at any request), with who made it, as the runner
    authenticated them: "slack:U123 via goaltender-bot (uid 1000)", "uid 1000 (ana)", "agent of goal 3"."""

    id: int
    ts: datetime = Field(default_factory=utcnow)
    actor: str
    action: str  # submit, approve, reject, steer, budget, stop, pause, resume; or the refused request's type
    goal_id: int | None = None
    outcome: Literal["done", "refused"]
    detail: str = ""


class DiaryEntry(Record):
    id: int
    goal_id: int
    ts: datetime = Field(default_factory=utcnow)
    kind: Literal["note", "handoff"] = "note"
    text: str


class HubFetch(Record):
    """A model or data set `goaltender fetch` put in the hub cache for a goal: which repo, at which
    commit (the revision asked for resolved), where it lies and how big it is. Reported by the
    goal's agent, as its metrics are."""

    repo: str = Field(min_length=1, max_length=200)
    repo_type: Literal["model", "dataset"] = "model"
    revision: str = Field(default="main", max_length=200)  # as asked: a branch, tag or commit
    commit: str = Field(min_length=1, max_length=64)  # what it resolved to
    path: str = Field(max_length=4096)  # the snapshot's directory in the cache
    files: int = Field(ge=0, le=10_000_000)
    bytes: int = Field(ge=0, le=2**62)
    downloaded_bytes: int = Field(default=0, ge=0, le=2**62)  # 0: all of it came from the cache


# ---- event payloads: the union the event log stores and subscribers receive ----


class GoalAccepted(Record):
    kind: Literal["goal_accepted"] = "goal_accepted"
    goal: Goal


class GoalStateChanged(Record):
    kind: Literal["goal_state"] = "goal_state"
    state: GoalState
    reason: str = ""


class StageChanged(Record):
    """A staged goal passed a gate: the humans approved its stage, the next one starts."""

    kind: Literal["stage_changed"] = "stage_changed"
    stage: int
    name: str
    of: int
    reason: str = ""


def _unfolded(folded: bool) -> bool:
    return not folded


# Posts past their goal's rate (runner/folding.py) are logged whole, marked folded: shown in no post
# of their own, but counted in the goal's next PostsFolded. Unfolded, the key is left out, so that
# the log reads as before; a client that predates folding finds a folded one unreadable, and skips
# it rather than post it.
Folded = Annotated[bool, Field(exclude_if=_unfolded)]


class MilestoneReported(Record):
    kind: Literal["milestone"] = "milestone"
    title: str
    text: str = ""
    curves: Curves | None = None
    folded: Folded = False


class MetricsLogged(Record):
    kind: Literal["metrics"] = "metrics"
    experiment_id: int | None = None
    points: list[MetricPoint]


class ExperimentStarted(Record):
    kind: Literal["experiment_started"] = "experiment_started"
    experiment: Experiment


class ExperimentQueued(Record):
    """It waits for a slot on its box: sent again whenever its place in the queue changes."""

    kind: Literal["experiment_queued"] = "experiment_queued"
    experiment: Experiment
    waiting: str  # "waiting for a GPU, 2 ahead"


class ExperimentFinished(Record):
    kind: Literal["experiment_finished"] = "experiment_finished"
    experiment: Experiment
    new_best: bool = False


class ApprovalRequested(Record):
    kind: Literal["approval_requested"] = "approval_requested"
    approval: Approval


class ApprovalDecided(Record):
    kind: Literal["approval_decided"] = "approval_decided"
    approval: Approval


class SteerReceived(Record):
    kind: Literal["steer"] = "steer"
    message: InboxMessage


class BudgetChanged(Record):
    kind: Literal["budget_changed"] = "budget_changed"
    budget: Budget
    reason: str


class FinalReport(Record):
    kind: Literal["report"] = "report"
    end_reason: str
    text: str  # markdown
    best: Experiment | None = None


class HubFetched(Record):
    kind: Literal["hub_fetched"] = "hub_fetched"
    fetch: HubFetch
    folded: Folded = False


class PostsFolded(Record):
    """The goal's posts folded since its last PostsFolded (runner/folding.py), shown as one post:
    how many of each kind, the titles of the first and of the latest (the ones between are only
    counted), and the seqs they span in the log, where each is whole."""

    kind: Literal["posts_folded"] = "posts_folded"
    milestones: int = Field(ge=0)
    fetches: int = Field(default=0, ge=0)
    first_seq: int
    last_seq: int
    titles: list[str]  # the first ones folded, oldest first
    latest_titles: list[str] = Field(default_factory=list)  # the last ones, oldest first

    @property
    def count(self) -> int:
        return self.milestones + self.fetches

    @property
    def unnamed(self) -> int:
        """Folded posts between `titles` and `latest_titles`, counted but not named."""
        return self.count - len(self.titles) - len(self.latest_titles)


class UnreadableEvent(Record):
    """Delivered in place of a logged event that no longer reads back into its model (written by
    an older runner, or holding a value its model now refuses): same seq, goal and time, so a
    subscriber sees the event was there, can ack past it and never stalls on it."""

    kind: Literal["unreadable"] = "unreadable"
    stored_kind: str  # the kind the row was logged as
    reason: str


EventData = Annotated[
    GoalAccepted
    | GoalStateChanged
    | StageChanged
    | MilestoneReported
    | MetricsLogged
    | ExperimentQueued
    | ExperimentStarted
    | ExperimentFinished
    | ApprovalRequested
    | ApprovalDecided
    | SteerReceived
    | BudgetChanged
    | FinalReport
    | HubFetched
    | PostsFolded
    | UnreadableEvent,
    Field(discriminator="kind"),
]


class Event(Record):
    seq: int
    goal_id: int | None
    ts: datetime
    data: EventData


def stored_time(ts: bytes) -> datetime:
    """A logged event's time as stored; when none can be read, now (when it was found unreadable)."""
    try:
        return datetime.fromisoformat(ts.decode())
    except ValueError:  # (UnicodeDecodeError is one)
        return utcnow()


def first_problem(exc: ValidationError | UnicodeDecodeError) -> str:
    """Why a logged event does not read back, for its UnreadableEvent."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8: {exc}"
    err = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in err["loc"]) or "data"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {err['msg']}{more}"
