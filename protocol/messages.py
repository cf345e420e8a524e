"""The runner protocol: newline-delimited JSON over a Unix stream socket.

Every line is one message, a pydantic model below, told apart by `type`. A client opens with
`hello` (protocol version); requests carry an `id` that their reply echoes. `subscribe` streams
`event` messages (no id) from the durable, sequence-numbered event log. Lines are capped at
MAX_LINE bytes; large things (logs, metric series) are fetched by request, with offsets.

Each request carries its contract (Request): the reply that answers it (`class Stop(Request[Done])`,
so `await client.request(Stop(goal_id=3))` is a Done to mypy too), who may send it (`sender`) and
how the audit trail records it (`audited`); runner/trust.py and runner/audit.py derive their
tables from these.

Every request line gets exactly one reply: its answer, or an `error` saying what is wrong with it
(echoing its id when that is safe to echo). A line over MAX_LINE gets a last `error` and the
connection is closed, as the rest of it cannot be told from the next request. What a line may hold
at all (UTF-8, finite numbers, 64-bit integers, limited nesting) is protocol/wire.py's; the bounds of
each field are below. `internal` is only ever a bug in the runner, never the client's input.

One module past 600 lines on purpose: it is the protocol's vocabulary, read as one document (every
model is a few lines with its bounds; docs/protocol.md points into it), and `p.X` names any message
wherever it is used. Split into requests and replies, each request would import its reply from the
other half and every caller two modules for one exchange.
"""

from __future__ import annotations

import functools
import gc
import json
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from goaltender.protocol import wire
from goaltender.protocol.budget import MAX_COMPUTE_HOURS, MAX_DURATION_S, MAX_EXPERIMENTS
from goaltender.protocol.fetch_spec import MAX_PATTERN_CHARS, MAX_PATTERNS, MAX_REVISION_CHARS
from goaltender.protocol.quick_client import RunnerRefused
from goaltender.storage.records import (
    Approval,
    AuditEntry,
    Budget,
    Curves,
    DiaryEntry,
    Event,
    EventData,
    Experiment,
    Goal,
    HubFetch,
    InboxMessage,
    MetricPoint,
    UnreadableEvent,
    first_problem,
    stored_time,
)

PROTOCOL_VERSION = wire.PROTOCOL_VERSION
MAX_LINE = wire.MAX_LINE  # bytes, newline included
MAX_POINTS = wire.MAX_POINTS  # metric points in one log_metrics request

# ---- bounded values: every number a request carries fits SQLite and datetime arithmetic ----

Int64 = Annotated[int, Field(ge=wire.INT64_MIN, le=wire.INT64_MAX)]
RowId = Annotated[int, Field(ge=1, le=wire.INT64_MAX)]  # a goal, approval or experiment
Seq = Annotated[int, Field(ge=0, le=wire.INT64_MAX)]  # a position in the event log
Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S)]  # a timeout: as long as any time budget
RequestId = (
    Annotated[int, Field(strict=True, ge=wire.INT64_MIN, le=wire.INT64_MAX)]
    | Annotated[str, Field(strict=True, max_length=wire.MAX_ID_CHARS)]
)


def _no_nul(text: str) -> str:
    if "\0" in text:
        raise ValueError("contains a NUL character, which no command, path or variable may hold")
    return text


OsText = Annotated[str, AfterValidator(_no_nul)]  # passed to the OS: argv, paths, environment


def _said(text: str) -> str:
    if not text.strip():
        raise ValueError(BLANK)
    return text


BLANK = "is blank"  # problems() says what the field wants after it


# What people read: a goal, a steer, a milestone's title, an agent's question, a report. Blank, it
# reached the thread as an empty prompt ("Approval needed: ") or an empty message.
Words = Annotated[str, AfterValidator(_said)]


def _env_name(name: str) -> str:
    if not name or "=" in name:
        raise ValueError(f"{name[:40]!r} is not an environment variable name")
    return _no_nul(name)


EARLIEST_DEADLINE = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_DEADLINE = datetime(3000, 1, 1, tzinfo=UTC)


def _sensible_budget(budget: Budget) -> Budget:
    """An explicit budget the runner can compute with: a zoned deadline, and limits no larger than
    the goal text may ask for (protocol/budget.py)."""
    if budget.deadline is not None:
        if budget.deadline.tzinfo is None:
            raise ValueError("deadline needs a time zone (e.g. 2030-01-01T12:00:00Z)")
        if not EARLIEST_DEADLINE <= budget.deadline <= LATEST_DEADLINE:
            raise ValueError(f"deadline must lie between {EARLIEST_DEADLINE:%Y} and {LATEST_DEADLINE:%Y}")
    for name in ("wall_seconds", "experiment_timeout_s"):
        if (seconds := getattr(budget, name)) is not None and not 0 <= seconds <= MAX_DURATION_S:
            raise ValueError(f"{name} must be between 0 and {MAX_DURATION_S:.0f}")
    if budget.compute_hours is not None and not 0 <= budget.compute_hours <= MAX_COMPUTE_HOURS:
        raise ValueError(f"compute_hours must be between 0 and {MAX_COMPUTE_HOURS:g}")
    if budget.max_experiments is not None and not 0 <= budget.max_experiments <= MAX_EXPERIMENTS:
        raise ValueError(f"max_experiments must be between 0 and {MAX_EXPERIMENTS}")
    return budget


class Message(BaseModel):
    # Schemas are built on a model's first use, not at import: a CLI verb uses two or three of
    # these models, and building all of them cost most of its start-up (issue 13).
    model_config = ConfigDict(extra="forbid", defer_build=True)
    #: Fields added since the protocol's first version: left off the line while at their defaults,
    #: so a peer that predates them (and forbids fields it does not know) reads the line as before.
    added_fields: ClassVar[frozenset[str]] = frozenset()


# ---- replies and pushed messages from the runner (before the requests, which name them) ----

MAX_LOG_CHUNK = 512 * 1024  # bytes of a log in one get_log reply's JSON text
MAX_RAW_LOG_CHUNK = 4 * 1024 * 1024  # bytes of a log in one raw get_log reply (no line carries them)
#: The most bytes a raw reply may say follow its line: a chunk, grown by redaction's markers.
MAX_RAW_BYTES = 4 * MAX_RAW_LOG_CHUNK


class Reply(Message):
    id: RequestId | None = None
    type: str  # each reply narrows it to its own literal


class Welcome(Reply):
    type: Literal["welcome"] = "welcome"
    version: int = PROTOCOL_VERSION  # the version this connection speaks (protocol/versions.py)
    runner: str
    #: The runner's identity (made with its database; a runner with another database has another),
    #: sent to a hello that asks for it: the bot keys a runner's goals by it.
    runner_id: str | None = None
    added_fields = frozenset({"runner_id"})


class Done(Reply):
    """A request that needs no data back succeeded; `message` says what happened."""

    type: Literal["done"] = "done"
    message: str = ""


class GoalStatus(Message):
    goal: Goal
    attempted: int
    compute_hours_used: float
    tokens_used: int = 0  # the LLM agent's, as it meters them (Budget.max_tokens)
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


class StageReply(Reply):
    type: Literal["stage"] = "stage"
    approval: Approval
    goal: Goal  # in its next stage when approved


class CrossCheckReply(Reply):
    type: Literal["cross_check"] = "cross_check"
    agreed: bool  # every number agreed, or a person let the disagreement pass
    compared: int
    differing: int
    table: str  # the disagreements (markdown)
    logs: list[str]  # A's and B's logs
    approval: Approval | None = None  # the decision on a disagreement


class FetchReply(Reply):
    """A fetch's outcome: what is in the cache now (and its record), or why it is not."""

    type: Literal["fetched"] = "fetched"
    fetch: HubFetch | None = None  # None: it failed
    failure: str = ""  # why, in one line
    message: str = ""  # where it was recorded


class InboxReply(Reply):
    type: Literal["inbox"] = "inbox"
    messages: list[InboxMessage]


class DiaryReply(Reply):
    type: Literal["diary"] = "diary"
    entries: list[DiaryEntry]


class AuditReply(Reply):
    type: Literal["audit"] = "audit"
    entries: list[AuditEntry]


class PruneReply(Reply):
    type: Literal["pruned"] = "pruned"
    lines: list[str]  # what was (or would be) removed, for a person


class LogReply(Reply):
    type: Literal["log"] = "log"
    text: str
    offset: int
    next_offset: int
    eof: bool
    #: A raw reply (GetLog.raw): how many bytes of UTF-8 text follow this line; its `text` is
    #: empty, and the chunk is `data`.
    raw_bytes: int | None = Field(default=None, ge=0, le=MAX_RAW_BYTES)
    added_fields = frozenset({"raw_bytes"})
    #: A raw reply's bytes: read by the client, to send by the runner.
    _chunk: bytes | bytearray = PrivateAttr(default=b"")

    @property
    def data(self) -> bytes | bytearray:
        """The chunk as UTF-8, raw or not: what `goaltender log` writes out."""
        return self._chunk if self.raw_bytes is not None else self.text.encode()


class ArtifactReply(Reply):
    type: Literal["artifact"] = "artifact"
    name: str
    data: str  # base64 of the file's bytes


class SkillEditReply(Reply):
    type: Literal["skill_edit_result"] = "skill_edit_result"
    approval: Approval
    commit: str | None = None  # applied as this commit of the skill folder
    message: str


class SkillCommit(Message):
    commit: str  # short hash
    at: datetime
    subject: str


class SkillLogReply(Reply):
    type: Literal["skill_log"] = "skill_log"
    commits: list[SkillCommit]


class GoalDisk(Message):
    goal_id: int
    state: str
    total: int  # bytes
    lines: list[str]  # per experiment (checkpoints apart), newest first, then the rest


class DiskUsageReply(Reply):
    type: Literal["disk_usage"] = "disk_usage"
    free: int  # bytes free on the home's disk
    goals: list[GoalDisk]


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


#: The kinds of event that change what a goal's status shows (its card): its state, stage and
#: budget, its experiments, its approvals, its report. A `statuses` message comes before events
#: of these kinds when the subscriber asked for it.
CARD_KINDS = frozenset(
    {
        "goal_accepted",
        "goal_state",
        "stage_changed",
        "budget_changed",
        "experiment_queued",
        "experiment_started",
        "experiment_finished",
        "approval_requested",
        "approval_decided",
        "report",
    }
)


class Statuses(Reply):
    """The status of each goal the next events change the card of, as it stands when they are sent:
    after every event up to `through` (the last seq of those events), maybe later ones too."""

    type: Literal["statuses"] = "statuses"
    through: int
    goals: list[GoalStatus]


#: Bytes of events in one `events` line before redaction: a secret's marker may be longer than the
#: secret, so half of MAX_LINE leaves room (a line still over MAX_LINE is split, runner/server.py).
EVENT_BATCH_BYTES = MAX_LINE // 2
#: How the runner starts every `events` line (and redaction, re-encoding one, keeps it).
EVENT_BATCH_PREFIX = b'{"id":null,"type":"events","events":['


class EventBatch(Reply):
    """Several events, oldest first, in one line: what a `subscribe` with `batch` streams. The runner
    writes it from the events' stored JSON (checked when they were logged), through the Redactor;
    an event that no longer reads back arrives as an UnreadableEvent (batch_events)."""

    type: Literal["events"] = "events"
    events: list[Event]


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
    | Statuses
    | Done
    | GoalReply
    | StatusReply
    | SummaryReply
    | ExperimentReply
    | DecisionReply
    | StageReply
    | CrossCheckReply
    | FetchReply
    | InboxReply
    | DiaryReply
    | AuditReply
    | PruneReply
    | LogReply
    | DiskUsageReply
    | SeriesReply
    | ArtifactReply
    | SkillEditReply
    | SkillLogReply
    | Subscribed
    | EventMessage
    | EventBatch
    | Error,
    Field(discriminator="type"),
]


# ---- requests ----


#: Who may send a request (runner/trust.py enforces it; an operator may send every request):
#: "operator" — people only, through an operator client; "agent" — the goal's agent too (an agent
#: verb); "read" — the goal's agent too, of its own goal; "connection" — whoever holds the
#: connection (hello, ack).
Sender = Literal["operator", "agent", "read", "connection"]
SENDERS: tuple[Sender, ...] = ("operator", "agent", "read", "connection")

ReplyT = TypeVar("ReplyT", bound=Reply)
ReplyModel = type[Reply]  # named out here: in a request's body `type` is its field


class _ReplyOf:
    """What `Request[SomeReply]` is at run time: a base that leaves only Request among the bases
    and keeps SomeReply as the request's reply type. pydantic's generic models would build a model
    class for each request instead, paid by every CLI verb's start-up; mypy sees typing.Generic."""

    def __init__(self, base: type | None, reply: Any):
        self.base = base
        self.reply = reply

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (self.base,) if self.base is not None else ()


if TYPE_CHECKING:
    from typing import Generic as _GenericInReply
else:

    class _GenericInReply:
        def __class_getitem__(cls, reply: Any) -> _ReplyOf:
            return _ReplyOf(None, reply)


if TYPE_CHECKING:
    from pydantic._internal._model_construction import ModelMetaclass as _RequestClass
else:

    class _RequestClass(type(BaseModel)):
        def __call__(cls, /, **data: Any) -> Any:
            """A request built to be sent, without an id (RunnerClient.request numbers it): one the
            runner would refuse is refused here as it would be, a ProtocolError (`bad_request`,
            one line), so a caller handles bad input as one refused, never as pydantic's dump.
            Built with an id (cli.py's checks, tests), or read from a line (model_validate, which
            never comes here), a request is pydantic's as usual: an id is required."""
            if "id" in data:
                return super().__call__(**data)
            try:
                return super().__call__(id=0, **data)
            except ValidationError as exc:
                raise ProtocolError(invalid_request(cls, None, exc)) from None


class Request(Message, _GenericInReply[ReplyT], metaclass=_RequestClass):
    """A request, and its contract: the reply it gets (its type parameter, `reply_type`), who may
    send it (`sender`) and how the audit trail records it (`audited`). Every request declares
    them; a class that does not is refused when it is defined (`__pydantic_init_subclass__`)."""

    # NaN and infinities are refused on the wire (protocol/wire.py), and here too for requests made
    # in Python (the CLI), before they are sent.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)

    if TYPE_CHECKING:
        id: RequestId = 0  # built to be sent: the client numbers it (_RequestClass.__call__)
    else:
        id: RequestId  # the runner refuses a request line without one
    type: str  # each request narrows it to its own literal

    #: The reply model that answers it (an `error` apart): `class Stop(Request[Done])`.
    reply_type: ClassVar[ReplyModel]
    sender: ClassVar[Sender]
    #: For "operator" requests, what an agent that asks is told it cannot do ("an agent cannot …").
    people_do: ClassVar[str] = ""
    #: Its action in the audit trail (runner/audit.py): set for control actions, recorded done or
    #: refused; "" for the rest, recorded only when refused for who asked.
    audited: ClassVar[str] = ""

    if not TYPE_CHECKING:

        def __class_getitem__(cls, reply: Any) -> _ReplyOf:
            return _ReplyOf(cls, reply)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        replies = [
            base.reply for base in cls.__dict__.get("__orig_bases__", ()) if isinstance(base, _ReplyOf)
        ]
        if len(replies) != 1 or not (isinstance(replies[0], type) and issubclass(replies[0], Reply)):
            raise TypeError(
                f"{cls.__name__}: name its reply model, as in `class {cls.__name__}(Request[Done])`"
            )
        cls.reply_type = replies[0]
        if cls.__dict__.get("sender") not in SENDERS:
            raise TypeError(f"{cls.__name__}: say who may send it: sender = one of {', '.join(SENDERS)}")
        if (cls.sender == "operator") != bool(cls.people_do):
            raise TypeError(f"{cls.__name__}: people_do is what an agent is told, for operator requests only")

    def audit_action(self) -> str:
        """Its name in the audit trail."""
        return self.audited or self.type


# ---- requests from the bot (or any operator client) ----
# `by` / `author` / `owner` name whom an operator acts for: a Person (the bot: a Slack user, with
# the name Slack shows), or a plain name (older clients, the CLI's `--by`). The runner's audit
# trail records "<that> via <client> (uid N)" with the exact id; the text it writes for people
# and agents names the person by their name (Person.name). It never takes a name from an agent.


class Person(BaseModel):
    """Someone an operator client acts for: where they are known (`kind`, e.g. "slack"), their id
    there, and the name people know them by (None when it could not be looked up)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    kind: str = Field(min_length=1, max_length=40, pattern=r"^[a-z][a-z0-9_-]*$")
    id: str = Field(min_length=1, max_length=200)
    name: str | None = Field(default=None, max_length=200)

    def record(self) -> str:
        """The audit trail's form: the exact id, and the name ("slack:U123 (Alice)")."""
        who = f"{self.kind}:{self.id}"
        return f"{who} ({self.name})" if self.name else who

    def said(self) -> str:
        """How text for people and agents names them: their name ("a Slack user" without one)."""
        if self.name:
            return self.name
        return f"a {self.kind.capitalize()} user" if self.kind == "slack" else f"{self.kind} user {self.id}"


Actor = str | Person


class Hello(Request[Welcome]):
    type: Literal["hello"] = "hello"
    sender = "connection"
    version: Int64
    client: str = Field(default="anonymous", max_length=200)
    #: Ask for the runner's identity in the welcome (Welcome.runner_id); a runner that predates it
    #: refuses the field, and the client says hello again without it.
    identity: bool = False
    #: The oldest protocol version the client speaks, when older than `version` (protocol/versions.py):
    #: the runner answers at the newest version both speak.
    oldest: Int64 | None = None
    added_fields = frozenset({"identity", "oldest"})


class SubmitGoal(Request[GoalReply]):
    """A new goal. Budget phrases in `text` ("budget 5h", "max 20 experiments", ...) are honoured."""

    type: Literal["submit_goal"] = "submit_goal"
    sender = "operator"
    people_do = "submit goals: people do, with /goal in Slack or `goaltender submit` as an operator"
    audited = "submit"
    text: str = Field(min_length=1, max_length=4000)  # blank: refused by parse_goal_text, with an example
    owner: Actor | None = None  # default: the authenticated operator
    agent: str | None = None
    budget: Annotated[Budget, AfterValidator(_sensible_budget)] | None = None  # overrides the text
    #: The client's own name for this submission: sent again (its reply was lost with the link),
    #: it gets the goal the first made, not a second one. Per submitting user.
    key: str | None = Field(default=None, min_length=1, max_length=200)
    added_fields = frozenset({"key"})


class Steer(Request[Done]):
    type: Literal["steer"] = "steer"
    sender = "operator"
    people_do = (
        "steer goals: people do, by replying in the goal's thread or with `goaltender steer` as an operator"
    )
    audited = "steer"
    goal_id: RowId
    text: Words = Field(min_length=1, max_length=4000)
    author: Actor | None = None


class ChangeBudget(Request[Done]):
    """`change` is budget phrasing: "+2h", "budget 5h", "max 10 experiments", "gpu-hours 8"."""

    type: Literal["change_budget"] = "change_budget"
    sender = "operator"
    people_do = (
        "change budgets: people do, in the goal's thread (`budget +2h`) or with "
        "`goaltender budget` as an operator"
    )
    audited = "budget"
    goal_id: RowId
    change: Words = Field(min_length=1, max_length=200)
    by: Actor | None = None


class Stop(Request[Done]):
    type: Literal["stop"] = "stop"
    sender = "operator"
    people_do = "stop goals: people do, in the goal's thread or with `goaltender stop` as an operator"
    audited = "stop"
    goal_id: RowId
    by: Actor | None = None
    reason: str = ""


class Pause(Request[Done]):
    type: Literal["pause"] = "pause"
    sender = "operator"
    people_do = "pause goals: people do, in the goal's thread or with `goaltender pause` as an operator"
    audited = "pause"
    goal_id: RowId
    by: Actor | None = None


class Resume(Request[Done]):
    type: Literal["resume"] = "resume"
    sender = "operator"
    people_do = "resume goals: people do, in the goal's thread or with `goaltender resume` as an operator"
    audited = "resume"
    goal_id: RowId
    by: Actor | None = None


class Decide(Request[DecisionReply]):
    type: Literal["decide"] = "decide"
    sender = "operator"
    people_do = (
        "decide approvals: a person does, in the goal's thread or with `goaltender approve` as an operator"
    )
    audited = "decide"
    approval_id: RowId
    approve: bool
    by: Actor | None = None
    comment: str | None = None

    def audit_action(self) -> str:
        return "approve" if self.approve else "reject"


class Audit(Request[AuditReply]):
    """The audit trail, newest `limit` entries (of one goal, or all), oldest first. Operators only."""

    type: Literal["audit"] = "audit"
    sender = "operator"
    people_do = "read the audit trail: operators do, with `goaltender audit`"
    goal_id: RowId | None = None
    limit: int = Field(default=200, gt=0, le=10_000)


class Prune(Request[PruneReply]):
    """Prune the history of goals that ended `days` ago or more (default: the runner's retention,
    GOALTENDER_RETENTION_DAYS; storage/pruning.py); `dry_run` says what would go. Operators only."""

    type: Literal["prune"] = "prune"
    sender = "operator"
    people_do = "prune the runner's history: operators do, with `goaltender prune`"
    audited = "prune"
    days: int | None = Field(default=None, ge=1, le=100_000)
    dry_run: bool = False


STATUS_PAGE_MAX = 200  # goals per Status reply page: well under MAX_LINE, whatever their ledgers


class Status(Request[StatusReply]):
    type: Literal["status"] = "status"
    sender = "read"
    goal_id: RowId | None = None  # None: every goal
    active_only: bool = False  # only goals not yet finished, stopped or failed (cheap on a long history)
    # A page of history: the newest `limit` goals (with ids under `before`). Without a limit every
    # goal is listed, which on a long history makes a reply over MAX_LINE.
    limit: int | None = Field(default=None, gt=0, le=STATUS_PAGE_MAX)
    before: RowId | None = None


class Summary(Request[SummaryReply]):
    type: Literal["summary"] = "summary"
    sender = "read"
    goal_id: RowId


class Subscribe(Request[Subscribed]):
    type: Literal["subscribe"] = "subscribe"
    sender = "read"
    since: Seq = 0
    goal_id: RowId | None = None
    # Many events a line (`events` messages) rather than one `event` each. A runner older than
    # this field refuses the request (bad_request), and the client asks again without it; a client
    # that never sets it gets `event` messages as before.
    batch: bool = False
    # Before each batch of events, the status of every goal whose card they change (a `statuses`
    # message): a subscriber draws cards from the stream instead of asking per event. A runner
    # older than this field refuses it (bad_request), and the client asks again without it.
    statuses: bool = False
    added_fields = frozenset({"batch", "statuses"})


class Ack(Request[Done]):
    """The client has durably stored every event up to `seq` (kept per client name)."""

    type: Literal["ack"] = "ack"
    sender = "connection"
    seq: Seq


class GetLog(Request[LogReply]):
    """A chunk of an experiment's log: the bytes from `offset` (moved on to the first that starts a
    character, up to 3) to `offset + limit` (moved on likewise); the reply says where it began.

    With `raw`, the chunk is not JSON-encoded into the reply: its `text` is empty, and the chunk's
    text follows the reply's line as `raw_bytes` bytes of UTF-8, redacted just the same; `limit` may
    then go up to MAX_RAW_LOG_CHUNK. Neither side encodes or parses a log as JSON, which was most of
    a fetch's cost. A runner older than `raw` refuses it (bad_request), and the client asks again
    without it."""

    type: Literal["get_log"] = "get_log"
    sender = "read"
    experiment_id: RowId
    offset: Annotated[int, Field(ge=0, le=wire.INT64_MAX)] = 0
    limit: int = Field(default=64 * 1024, gt=0, le=MAX_RAW_LOG_CHUNK)
    raw: bool = False
    added_fields = frozenset({"raw"})

    @model_validator(mode="after")
    def _fits_a_line(self) -> GetLog:
        if not self.raw and self.limit > MAX_LOG_CHUNK:
            raise ValueError(f"limit: at most {MAX_LOG_CHUNK} bytes in a reply's text (raw replies: more)")
        return self


#: Points in one series reply: a longer series comes thinned evenly (its first and last kept), as
#: a plot would show it; it fits a line either way.
MAX_SERIES_POINTS = 20_000


class GetSeries(Request[SeriesReply]):
    type: Literal["get_series"] = "get_series"
    sender = "read"
    goal_id: RowId
    name: str = Field(max_length=200)  # echoed in the reply
    experiment_id: RowId | None = None


#: The files of an experiment's directory GetArtifact may read (what evaluations write for people).
Artifact = Literal["hard_cases.png", "errors.json"]
#: Bigger artifacts are refused: base64 of this many bytes still fits in one line (MAX_LINE).
MAX_ARTIFACT_BYTES = (MAX_LINE - 4096) * 3 // 4


class GetArtifact(Request[ArtifactReply]):
    """One file an experiment's evaluation wrote (e.g. the star-count gallery of hard cases)."""

    type: Literal["get_artifact"] = "get_artifact"
    sender = "read"
    experiment_id: RowId
    name: Artifact


class DiskUsage(Request[DiskUsageReply]):
    """What each goal's workspace holds on the big disk (one goal, or every goal)."""

    type: Literal["disk_usage"] = "disk_usage"
    sender = "read"
    goal_id: RowId | None = None


# ---- agent verbs (the `goaltender <verb>` CLI and the built-in agents' tools) ----


class ReportMilestone(Request[Done]):
    type: Literal["milestone"] = "milestone"
    sender = "agent"
    goal_id: RowId
    title: Words = Field(min_length=1, max_length=300)
    text: str = Field(default="", max_length=20_000)
    curves: Curves | None = None  # training curves to show with it (the bot draws them)


class LogMetrics(Request[Done]):
    type: Literal["log_metrics"] = "log_metrics"
    sender = "agent"
    goal_id: RowId
    points: list[MetricPoint] = Field(min_length=1, max_length=MAX_POINTS)
    experiment_id: RowId | None = None


class RunExperiment(Request[ExperimentReply]):
    """Run `command` under supervision; the reply comes when it has finished."""

    type: Literal["run_experiment"] = "run_experiment"
    sender = "agent"
    goal_id: RowId
    command: list[OsText] = Field(min_length=1)
    description: Words = Field(min_length=1, max_length=2000, description="the hypothesis this run tests")
    params: dict[str, Any] = Field(default_factory=dict)
    metric: str | None = None  # the headline metric; defaults to the goal's
    direction: Literal["maximize", "minimize"] | None = None
    timeout_s: Seconds | None = None
    cwd: OsText | None = None
    env: dict[Annotated[str, AfterValidator(_env_name)], OsText] = Field(default_factory=dict)
    # Run by the runner itself after a successful run (GOALTENDER_EXPERIMENT_DIR points at the
    # run's directory); its `metric: value` line becomes the verified headline.
    eval_command: list[OsText] | None = Field(default=None, min_length=1)
    # Where it runs and with how many GPUs; default: its goal's, else the box's.
    executor: Literal["local", "ray", "slurm"] | None = None
    gpus: int | None = Field(default=None, ge=0, le=1024)
    # Run it (and its eval) this many times, GOALTENDER_SEED=0, 1, …: the row holds their mean ± sd.
    repeat: int = Field(default=1, ge=1, le=20)


class Ask(Request[DecisionReply]):
    """Ask the humans; the reply comes when someone decides or the prompt expires (= rejected)."""

    type: Literal["ask"] = "ask"
    sender = "agent"
    goal_id: RowId
    question: Words = Field(min_length=1, max_length=3000)
    detail: str = Field(default="", max_length=20_000)
    kind: str = "generic"
    timeout_s: Seconds | None = None


class StageDone(Request[StageReply]):
    """The agent ends its goal's stage: the humans are asked; the reply comes with their decision."""

    type: Literal["stage_done"] = "stage_done"
    sender = "agent"
    goal_id: RowId
    summary: Words = Field(min_length=1, max_length=20_000)
    document: str | None = Field(default=None, max_length=200_000)  # the plan, say
    document_name: str | None = Field(default=None, max_length=200)


class CrossCheck(Request[CrossCheckReply]):
    """Run two implementations on the same toy input and compare every number both print."""

    type: Literal["cross_check"] = "cross_check"
    sender = "agent"
    goal_id: RowId
    description: Words = Field(min_length=1, max_length=2000)
    a: list[OsText] = Field(min_length=1)
    b: list[OsText] = Field(min_length=1)
    rtol: float = Field(default=1e-5, ge=0, le=1)
    atol: float = Field(default=1e-8, ge=0)
    cwd: OsText | None = None
    env: dict[Annotated[str, AfterValidator(_env_name)], OsText] = Field(default_factory=dict)


class ReadInbox(Request[InboxReply]):
    type: Literal["read_inbox"] = "read_inbox"
    sender = "agent"
    goal_id: RowId
    all: bool = False


class WriteDiary(Request[Done]):
    type: Literal["write_diary"] = "write_diary"
    sender = "agent"
    goal_id: RowId
    text: Words = Field(min_length=1, max_length=50_000)
    kind: Literal["note", "handoff"] = "note"


class ReadDiary(Request[DiaryReply]):
    type: Literal["read_diary"] = "read_diary"
    sender = "agent"
    goal_id: RowId
    last: int = Field(default=20, gt=0, le=1000)
    kind: Literal["note", "handoff"] | None = None


class SubmitReport(Request[Done]):
    """The agent's own words for the final report (what was learnt, what to try next)."""

    type: Literal["submit_report"] = "submit_report"
    sender = "agent"
    goal_id: RowId
    text: Words = Field(min_length=1, max_length=50_000)


class Fetch(Request[FetchReply]):
    """Bring a model or data set from the hub into the shared hub cache, and record it in the
    goal's ledger. The runner downloads it itself, outside every sandbox (the cache is read-only
    in them; runner/fetches.py), posting milestones as a big download goes; the reply comes when
    it is there, or says in one line why not."""

    type: Literal["fetch"] = "fetch"
    sender = "agent"
    goal_id: RowId
    repo: OsText = Field(min_length=1, max_length=200)  # owner/name; checked as the hub checks it
    repo_type: Literal["model", "dataset"] = "model"
    revision: OsText | None = Field(default=None, max_length=MAX_REVISION_CHARS)
    include: list[Annotated[OsText, Field(max_length=MAX_PATTERN_CHARS)]] = Field(
        default_factory=list, max_length=MAX_PATTERNS
    )


# ---- the box's skill folder (runner/skill_folder.py) ----
MAX_SKILL_EDIT_CHARS = 256_000  # the runner refuses a skill file over 64 KB itself, saying so


class SkillEdit(Request[SkillEditReply]):
    """An agent proposes new content for one file of a skill (SKILL.md or references/<name>) in the
    box's skill folder. The humans see the diff; the reply comes with their decision, and an
    approved edit is applied and committed by then (`commit`)."""

    type: Literal["skill_edit"] = "skill_edit"
    sender = "agent"
    goal_id: RowId
    skill: str = Field(min_length=1, max_length=64)
    path: OsText = Field(default="SKILL.md", min_length=1, max_length=300)
    content: str = Field(max_length=MAX_SKILL_EDIT_CHARS)
    why: str = Field(default="", max_length=2000)
    timeout_s: Seconds | None = None


class SkillLog(Request[SkillLogReply]):
    """The skill folder's history, newest first. Operators only."""

    type: Literal["skill_log"] = "skill_log"
    sender = "operator"
    people_do = "read the skill folder's history: operators do, with `goaltender skills log`"
    limit: int = Field(default=20, gt=0, le=1000)


class RevertSkill(Request[Done]):
    """Undo one commit of the skill folder with a new commit. Operators only; audited."""

    type: Literal["revert_skill"] = "revert_skill"
    sender = "operator"
    people_do = "revert skill edits: operators do, with `goaltender skills revert COMMIT`"
    audited = "skill revert"
    commit: str = Field(pattern=r"^[0-9a-f]{4,40}$")
    by: Actor | None = None


INPUT_CHUNK = 512 * 1024  # bytes of a file in one PutInput (base64 makes it ~700 kB of a line)


class PutInput(Request[Done]):
    """A chunk of a file for a goal's agent (runner/inputs.py): written into its workspace's
    `inputs/` under a safe name; the last chunk makes it whole and tells the agent in its inbox.
    `size`: the whole file's bytes; `data`: this chunk, base64. Operators only; audited."""

    type: Literal["put_input"] = "put_input"
    sender = "operator"
    people_do = "give goals files: people do, by attaching them in the goal's thread"
    audited = "input file"
    goal_id: RowId
    name: str = Field(min_length=1, max_length=255)
    size: int = Field(ge=1, le=wire.INT64_MAX)
    offset: int = Field(default=0, ge=0, le=wire.INT64_MAX)
    data: str = Field(max_length=(INPUT_CHUNK * 4) // 3 + 4)
    last: bool = True
    mimetype: str | None = Field(default=None, max_length=200)
    by: Actor | None = None


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
    | Prune
    | SkillLog
    | RevertSkill
    | PutInput
    | SkillEdit
    | Status
    | Summary
    | Subscribe
    | Ack
    | GetLog
    | GetSeries
    | GetArtifact
    | ReportMilestone
    | LogMetrics
    | RunExperiment
    | Ask
    | StageDone
    | CrossCheck
    | ReadInbox
    | WriteDiary
    | ReadDiary
    | SubmitReport
    | Fetch,
    Field(discriminator="type"),
]


# Each message is validated by the model its `type` names (read first), so only the models in use
# are ever built; the whole union is built only for a reply of a type this client does not know.
REQUEST_MODELS: dict[str, type[Request]] = {
    m.model_fields["type"].default: m for m in Request.__subclasses__()
}
REPLY_MODELS: dict[str, type[Reply]] = {m.model_fields["type"].default: m for m in Reply.__subclasses__()}
REQUEST_TYPES = frozenset(REQUEST_MODELS)


@functools.cache
def _replies() -> TypeAdapter[AnyReply]:
    return TypeAdapter(AnyReply)


class ProtocolError(RunnerRefused):
    """Raised by the client when the runner answers a request with an `error` message."""

    def __init__(self, error: Error):
        super().__init__(error.code, error.message)
        self.error = error


def encode(message: Message) -> bytes:
    # A message whose newer fields are at their defaults is the very line an older peer knows.
    fields = type(message).model_fields
    exclude = {name for name in message.added_fields if getattr(message, name) == fields[name].default}
    return message.model_dump_json(exclude_none=False, exclude=exclude or None).encode() + b"\n"


def parse_request(line: bytes) -> AnyRequest | Error:
    """Decode one request line, or describe what is wrong with it (echoing the id when it can)."""
    try:
        raw = wire.decode_object(line)
    except wire.LineRefused as refused:
        return Error(id=refused.request_id, code="bad_json", message=refused.message)
    request_id = wire.safe_id(raw.get("id"))
    kind = raw.get("type")
    if not isinstance(kind, str):
        what = "missing" if kind is None else wire.json_type(kind)
        return Error(
            id=request_id,
            code="bad_request",
            message=f"`type` must be a string naming the request, not {what}",
        )
    if kind not in REQUEST_TYPES:
        known = ", ".join(sorted(REQUEST_TYPES))
        return Error(
            id=request_id, code="unknown_type", message=f"unknown type {kind[:40]!r}; known: {known}"
        )
    model = REQUEST_MODELS[kind]
    try:
        return cast(AnyRequest, model.model_validate(raw))
    except ValidationError as exc:
        return invalid_request(model, request_id, exc)


def invalid_request(model: type[Request], request_id: Any, exc: ValidationError) -> Error:
    """The `bad_request` error for a request that does not validate: what the runner replies, and
    what a client says of a request it could not even build (RunnerClient.call)."""
    kind = model.model_fields["type"].default
    return Error(id=request_id, code="bad_request", message=f"invalid {kind}: {problems(exc, model)}")


MAX_PROBLEMS = 5  # fields named; the reply stays a short line whatever was sent
_EMPTY = {"string_too_short", "too_short"}  # of a minimum length of 1


def problems(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """pydantic's complaints as people read them, on one line: the first problem of each field
    (`description: is empty: give the hypothesis this run tests; timeout_s: Input should be a valid
    number`), without pydantic's input echo, error codes or documentation URL."""
    firsts: dict[Any, str] = {}
    for err in exc.errors(include_url=False, include_input=False):
        field = err["loc"][0] if err["loc"] else None
        if field not in firsts:
            firsts[field] = f"{_where(err['loc'])}: {_plain(err, model, field)}"
    named = list(firsts.values())
    more = len(named) - MAX_PROBLEMS
    return "; ".join(named[:MAX_PROBLEMS] + ([f"and {more} more"] if more > 0 else []))


def _plain(err: Any, model: type[BaseModel] | None, field: Any) -> str:
    """One problem in plain words: an empty, blank or missing field says what it wants (its
    description), a validator's own words come without pydantic's 'Value error, '."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _EMPTY and ctx.get("min_length") == 1:
        said = "is empty"
    elif kind == "missing":
        said = "is missing"
    elif kind == "value_error" and str(ctx.get("error")) == BLANK:
        said = BLANK
    elif kind == "value_error":
        return str(ctx.get("error") or err["msg"])
    else:
        return str(err["msg"])
    wanted = model.model_fields.get(field) if model is not None and isinstance(field, str) else None
    if wanted is not None and wanted.description:
        return f"{said}: give {wanted.description}"
    return f"{said}: it must say something" if said == BLANK else said


def _where(loc: tuple[int | str, ...]) -> str:
    # Names in `loc` may be the client's own dict keys: shortened, as they are echoed.
    return ".".join(str(part)[:40] for part in loc) or "message"


_REPLY_TYPE = re.compile(rb'"type":"([a-z_]{1,40})"')


def parse_reply(line: bytes) -> AnyReply:
    """One reply line as its model; ValidationError when it is none this client knows."""
    # encode() writes `type` near the start, so its model is guessed without parsing the line; a
    # wrong guess fails (each model's `type` is a literal) and the whole union decides instead.
    found = _REPLY_TYPE.search(line, 0, 400)
    model = REPLY_MODELS.get(found.group(1).decode()) if found else None
    if model is not None:
        try:
            return cast(AnyReply, model.model_validate_json(line))
        except ValidationError:
            pass
    return _replies().validate_json(line)


def batch_events(line: bytes) -> list[Event]:
    """The events of one `events` line. Every event in it was valid JSON when the runner sent it;
    one that does not read back into its model (a row an older runner wrote, a kind this client
    does not know) becomes an UnreadableEvent with its seq, as the runner itself makes them for a
    single `event` (storage/runner_store.py), so a subscriber acks past it and never stalls."""
    # Thousands of models at once: the cyclic GC would walk the heap several times over meanwhile
    # (a third of a replay's time), and a batch makes no cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return EventBatch.model_validate_json(line).events
    except ValidationError:
        pass
    finally:
        if collecting:
            gc.enable()
    raw = json.loads(line)  # the whole line failing too (not JSON at all) drops the link: ValueError
    items = raw.get("events") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise ValueError("an `events` line without a list of events")
    return [_event_or_unreadable(item) for item in items]


@functools.cache
def _event_data() -> TypeAdapter[EventData]:
    return TypeAdapter(EventData)


def _event_or_unreadable(item: Any) -> Event:
    if not isinstance(item, dict) or not isinstance(seq := item.get("seq"), int) or isinstance(seq, bool):
        raise ValueError(f"an event without a seq in an `events` line: {str(item)[:100]}")
    goal_id = item.get("goal_id")
    goal_id = goal_id if isinstance(goal_id, int) and not isinstance(goal_id, bool) else None
    data = item.get("data")
    try:
        return Event(seq=seq, goal_id=goal_id, ts=item.get("ts"), data=_event_data().validate_python(data))
    except ValidationError as exc:
        kind = data.get("kind") if isinstance(data, dict) else None
        ts = item.get("ts")
        return Event(
            seq=seq,
            goal_id=goal_id,
            ts=stored_time(ts.encode() if isinstance(ts, str) else b""),
            data=UnreadableEvent(stored_kind=str(kind), reason=first_problem(exc)),
        )
