"""The runner protocol: newline-delimited JSON over a Unix stream socket.

Every line is one message, a pydantic model below, told apart by `type`. A client opens with
`hello` (protocol version); requests carry an `id` that their reply echoes. `subscribe` streams
`event` messages (no id) from the durable, sequence-numbered event log. Lines are capped at
MAX_LINE bytes; large things (logs, metric series) are fetched by request, with offsets.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from goaltender.storage.records import (
    Approval,
    AuditEntry,
    Budget,
    DiaryEntry,
    Event,
    Experiment,
    Goal,
    InboxMessage,
    MetricPoint,
)

PROTOCOL_VERSION = 1
MAX_LINE = 1024 * 1024  # bytes, newline included

RequestId = int | str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Request(Message):
    id: RequestId
    type: str  # each request narrows it to its own literal


# ---- requests from the bot (or any operator client) ----
# `by` / `author` / `owner` name whom an operator acts for (the bot: "slack:U123"); the runner
# records "<that> via <client> (uid N)" and never takes a name from an agent.


class Hello(Request):
    type: Literal["hello"] = "hello"
    version: int
    client: str = "anonymous"


class SubmitGoal(Request):
    """A new goal. Budget phrases in `text` ("budget 5h", "max 20 experiments", ...) are honoured."""

    type: Literal["submit_goal"] = "submit_goal"
    text: str = Field(min_length=1, max_length=4000)
    owner: str | None = None  # default: the authenticated operator
    agent: str | None = None
    budget: Budget | None = None  # explicit budgets override phrases in the text


class Steer(Request):
    type: Literal["steer"] = "steer"
    goal_id: int
    text: str = Field(min_length=1, max_length=4000)
    author: str | None = None


class ChangeBudget(Request):
    """`change` is budget phrasing: "+2h", "budget 5h", "max 10 experiments", "gpu-hours 8"."""

    type: Literal["change_budget"] = "change_budget"
    goal_id: int
    change: str = Field(min_length=1, max_length=200)
    by: str | None = None


class Stop(Request):
    type: Literal["stop"] = "stop"
    goal_id: int
    by: str | None = None
    reason: str = ""


class Pause(Request):
    type: Literal["pause"] = "pause"
    goal_id: int
    by: str | None = None


class Resume(Request):
    type: Literal["resume"] = "resume"
    goal_id: int
    by: str | None = None


class Decide(Request):
    type: Literal["decide"] = "decide"
    approval_id: int
    approve: bool
    by: str | None = None
    comment: str | None = None


class Audit(Request):
    """The audit trail, newest `limit` entries (of one goal, or all), oldest first. Operators only."""

    type: Literal["audit"] = "audit"
    goal_id: int | None = None
    limit: int = Field(default=200, gt=0, le=10_000)


class Status(Request):
    type: Literal["status"] = "status"
    goal_id: int | None = None  # None: every goal
    active_only: bool = False  # only goals not yet finished, stopped or failed (cheap on a long history)


class Summary(Request):
    type: Literal["summary"] = "summary"
    goal_id: int


class Subscribe(Request):
    type: Literal["subscribe"] = "subscribe"
    since: int = Field(default=0, ge=0)
    goal_id: int | None = None


class Ack(Request):
    """The client has durably stored every event up to `seq` (kept per client name)."""

    type: Literal["ack"] = "ack"
    seq: int = Field(ge=0)


class GetLog(Request):
    type: Literal["get_log"] = "get_log"
    experiment_id: int
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=64 * 1024, gt=0, le=512 * 1024)


class GetSeries(Request):
    type: Literal["get_series"] = "get_series"
    goal_id: int
    name: str
    experiment_id: int | None = None


# ---- agent verbs (the `goaltender <verb>` CLI and the built-in agents' tools) ----


class ReportMilestone(Request):
    type: Literal["milestone"] = "milestone"
    goal_id: int
    title: str = Field(min_length=1, max_length=300)
    text: str = Field(default="", max_length=20_000)


class LogMetrics(Request):
    type: Literal["log_metrics"] = "log_metrics"
    goal_id: int
    points: list[MetricPoint] = Field(min_length=1, max_length=10_000)
    experiment_id: int | None = None


class RunExperiment(Request):
    """Run `command` under supervision; the reply comes when it has finished."""

    type: Literal["run_experiment"] = "run_experiment"
    goal_id: int
    command: list[str] = Field(min_length=1)
    description: str = Field(min_length=1, max_length=2000)
    params: dict[str, Any] = Field(default_factory=dict)
    metric: str | None = None  # the headline metric; defaults to the goal's
    direction: Literal["maximize", "minimize"] | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Run by the runner itself after a successful run (GOALTENDER_EXPERIMENT_DIR points at the
    # run's directory); its `metric: value` line becomes the verified headline.
    eval_command: list[str] | None = None


class Ask(Request):
    """Ask the humans; the reply comes when someone decides or the prompt expires (= rejected)."""

    type: Literal["ask"] = "ask"
    goal_id: int
    question: str = Field(min_length=1, max_length=3000)
    detail: str = Field(default="", max_length=20_000)
    kind: str = "generic"
    timeout_s: float | None = Field(default=None, gt=0)


class ReadInbox(Request):
    type: Literal["read_inbox"] = "read_inbox"
    goal_id: int
    all: bool = False


class WriteDiary(Request):
    type: Literal["write_diary"] = "write_diary"
    goal_id: int
    text: str = Field(min_length=1, max_length=50_000)
    kind: Literal["note", "handoff"] = "note"


class ReadDiary(Request):
    type: Literal["read_diary"] = "read_diary"
    goal_id: int
    last: int = Field(default=20, gt=0, le=1000)
    kind: Literal["note", "handoff"] | None = None


class SubmitReport(Request):
    """The agent's own words for the final report (what was learnt, what to try next)."""

    type: Literal["submit_report"] = "submit_report"
    goal_id: int
    text: str = Field(min_length=1, max_length=50_000)


AnyRequest = Annotated[
    Hello
    | SubmitGoal
    | Steer
    | ChangeBudget
    | Stop
    | Pause
    | Resume
    | Decide
    | Audit
    | Status
    | Summary
    | Subscribe
    | Ack
    | GetLog
    | GetSeries
    | ReportMilestone
    | LogMetrics
    | RunExperiment
    | Ask
    | ReadInbox
    | WriteDiary
    | ReadDiary
    | SubmitReport,
    Field(discriminator="type"),
]


# ---- replies and pushed messages from the runner ----


class Reply(Message):
    id: RequestId | None = None
    type: str  # each reply narrows it to its own literal


class Welcome(Reply):
    type: Literal["welcome"] = "welcome"
    version: int = PROTOCOL_VERSION
    runner: str


class Done(Reply):
    """A request that needs no data back succeeded; `message` says what happened."""

    type: Literal["done"] = "done"
    message: str = ""


class GoalStatus(Message):
    goal: Goal
    attempted: int
    compute_hours_used: float
    best: Experiment | None = None
    running: Experiment | None = None
    pending_approvals: list[Approval] = Field(default_factory=list)
    stop_status: str  # e.g. "stop rule not yet met: 3/10 attempted, 1m52s left"


class GoalReply(Reply):
    type: Literal["goal"] = "goal"
    status: GoalStatus


class StatusReply(Reply):
    type: Literal["status"] = "status"
    goals: list[GoalStatus]


class SummaryReply(Reply):
    type: Literal["summary"] = "summary"
    status: GoalStatus
    ledger: list[Experiment]
    text: str  # markdown


class ExperimentReply(Reply):
    type: Literal["experiment"] = "experiment"
    experiment: Experiment
    new_best: bool = False
    stop_status: str = ""


class DecisionReply(Reply):
    type: Literal["decision"] = "decision"
    approval: Approval


class InboxReply(Reply):
    type: Literal["inbox"] = "inbox"
    messages: list[InboxMessage]


class DiaryReply(Reply):
    type: Literal["diary"] = "diary"
    entries: list[DiaryEntry]


class AuditReply(Reply):
    type: Literal["audit"] = "audit"
    entries: list[AuditEntry]


class LogReply(Reply):
    type: Literal["log"] = "log"
    text: str
    offset: int
    next_offset: int
    eof: bool


class SeriesReply(Reply):
    type: Literal["series"] = "series"
    name: str
    points: list[tuple[float | None, float]]


class Subscribed(Reply):
    type: Literal["subscribed"] = "subscribed"
    head: int  # the newest seq (of the goal, when filtered) at the moment of subscribing


class EventMessage(Reply):
    type: Literal["event"] = "event"
    event: Event


ErrorCode = Literal[
    "bad_json",
    "bad_request",
    "unknown_type",
    "line_too_long",
    "handshake_required",
    "version_mismatch",
    "forbidden",  # not for this connection's principal; the message says who may
    "not_found",
    "conflict",
    "budget_exhausted",
    "disk_full",  # no room on the runner's disk: the goal is paused until there is
    "internal",
]


class Error(Reply):
    type: Literal["error"] = "error"
    code: ErrorCode
    message: str


AnyReply = Annotated[
    Welcome
    | Done
    | GoalReply
    | StatusReply
    | SummaryReply
    | ExperimentReply
    | DecisionReply
    | InboxReply
    | DiaryReply
    | AuditReply
    | LogReply
    | SeriesReply
    | Subscribed
    | EventMessage
    | Error,
    Field(discriminator="type"),
]

_requests: TypeAdapter[AnyRequest] = TypeAdapter(AnyRequest)
_replies: TypeAdapter[AnyReply] = TypeAdapter(AnyReply)
REQUEST_TYPES = frozenset(m.model_fields["type"].default for m in Request.__subclasses__())


class ProtocolError(Exception):
    """Raised by the client when the runner answers a request with an `error` message."""

    def __init__(self, error: Error):
        super().__init__(f"{error.code}: {error.message}")
        self.error = error


def encode(message: Message) -> bytes:
    return message.model_dump_json(exclude_none=False).encode() + b"\n"


def parse_request(line: bytes) -> AnyRequest | Error:
    """Decode one request line, or describe what is wrong with it (echoing the id when it can)."""
    try:
        raw = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Error(code="bad_json", message=f"not valid JSON: {exc}")
    if not isinstance(raw, dict):
        return Error(code="bad_json", message="a message must be a JSON object")
    request_id = raw.get("id") if isinstance(raw.get("id"), int | str) else None
    kind = raw.get("type")
    if kind not in REQUEST_TYPES:
        known = ", ".join(sorted(REQUEST_TYPES))
        return Error(id=request_id, code="unknown_type", message=f"unknown type {kind!r}; known: {known}")
    try:
        return _requests.validate_python(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or 'message'}: {err['msg']}" for err in exc.errors()
        )
        return Error(id=request_id, code="bad_request", message=f"invalid {kind}: {problems}")


def parse_reply(line: bytes) -> AnyReply:
    return _replies.validate_json(line)
