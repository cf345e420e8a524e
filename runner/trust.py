"""Who is on a connection, and what they may ask: no name a client claims is trusted on its own.

- An **operator** is a connection on the operator socket from a configured account, or a member of
  a configured group (the socket's peer credentials, SO_PEERCRED; `GOALTENDER_OPERATORS`, default:
  the runner's own user; runner/operators.py). Any other uid is refused at hello. An operator may
  make every request; the people it acts for (`by`, `author`, `owner`: the bot's Slack user, a
  protocol Person) are recorded in the audit trail as "<kind:id (name)> via <client> (uid N)", so
  the record says who vouched for them; the text the runner writes for people and agents (a steer's
  author, "stopped by …") names them by name only.
- The **agent of goal N** is any connection on goal N's own socket (settings.agent_socket): the
  capability the runner hands to that goal's agent and experiments, and to nothing else. It may use
  the agent verbs and read its own goal, and nothing more: deciding approvals, budgets, steering,
  stopping, submitting and the audit trail belong to people. Whatever names it gives, it is
  recorded as "agent of goal N".
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass
from typing import TypeVar

from goaltender.protocol import messages as p
from goaltender.runner.operators import Operators, user_name
from goaltender.storage.runner_store import RunnerStore

R = TypeVar("R", bound=p.Request)


@dataclass(frozen=True)
class Principal:
    """The authenticated party on one connection: an operator (by uid) or the agent of one goal."""

    uid: int | None = None  # operators: the peer's uid
    goal_id: int | None = None  # agents: the goal whose socket this connection came in on
    client: str = "anonymous"  # the name given at hello (only ever part of a record)

    @property
    def is_agent(self) -> bool:
        return self.goal_id is not None

    def actor(self, claimed: p.Actor | None = None) -> str:
        """Who to record as acting (the audit trail's exact form); `claimed` is whom an operator
        says it acts for."""
        if self.goal_id is not None:
            return f"agent of goal {self.goal_id}"
        if isinstance(claimed, p.Person):
            return f"{claimed.record()} via {self.client} (uid {self.uid})"
        if claimed:
            return f"{claimed} via {self.client} (uid {self.uid})"
        return f"uid {self.uid} ({user_name(self.uid)})"

    def said(self, claimed: p.Actor | None = None) -> str:
        """Who acted, as text people and agents read (a steer's author, "stopped by …"): a Person
        by their name; an older client's plain claim as the audit trail has it."""
        if isinstance(claimed, p.Person) and self.goal_id is None:
            return claimed.said()
        return self.actor(claimed)

    def cursor_name(self) -> str:
        """Where `ack` keeps this client's position: an agent cannot move another client's."""
        return self.client if self.goal_id is None else f"{self.client} (agent of goal {self.goal_id})"


def peer_uid(writer: asyncio.StreamWriter) -> int | None:
    """The uid of the process at the other end of a Unix socket, as the kernel saw it connect."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def hello_refusal(principal: Principal, operators: Operators) -> str | None:
    """Why this connection may not use the operator socket (None: it may)."""
    if principal.is_agent or operators.admits(principal.uid):
        return None
    return (
        f"uid {principal.uid} ({user_name(principal.uid)}) is not an operator of this runner; "
        f"operators: {operators.describe()} (the runner's GOALTENDER_OPERATORS)"
    )


# ---- what an agent may ask ----

# Derived from each request's contract (protocol/messages.py: Request.sender, Request.people_do).
AGENT_VERBS: frozenset[type[p.Request]] = frozenset(
    m for m in p.REQUEST_MODELS.values() if m.sender == "agent"
)
GOAL_READS: frozenset[type[p.Request]] = frozenset(m for m in p.REQUEST_MODELS.values() if m.sender == "read")
CONNECTION_REQUESTS: frozenset[type[p.Request]] = frozenset(
    m for m in p.REQUEST_MODELS.values() if m.sender == "connection"
)
PEOPLE_ONLY: dict[type[p.Request], str] = {
    m: m.people_do for m in p.REQUEST_MODELS.values() if m.sender == "operator"
}


async def agent_refusal(principal: Principal, request: p.Request, store: RunnerStore) -> str | None:
    """Why the agent on this connection may not make `request` (None: it may)."""
    goal = principal.goal_id
    if goal is None or type(request) in CONNECTION_REQUESTS:
        return None
    if (people := PEOPLE_ONLY.get(type(request))) is not None:
        return f"an agent cannot {people}"
    if type(request) not in AGENT_VERBS | GOAL_READS:
        return f"an agent cannot make {request.type!r} requests"
    named = await goal_named(request, store)
    if named is not None and named != goal:
        return (
            f"this connection belongs to goal #{goal}'s agent: it acts on goal #{goal} only, "
            f"and {request.type} names goal #{named}"
        )
    return None


async def goal_named(request: p.Request, store: RunnerStore) -> int | None:
    """The goal a request acts on, when it names one (directly, or through an approval or run)."""
    if isinstance(request, p.Decide):
        approval = await store.get_approval(request.approval_id)
        return approval.goal_id if approval else None
    if isinstance(request, p.GetLog | p.GetArtifact):
        experiment = await store.get_experiment(request.experiment_id)
        return experiment.goal_id if experiment else None  # no such run: the handler says so
    goal_id = getattr(request, "goal_id", None)
    return goal_id if isinstance(goal_id, int) else None


def scoped(principal: Principal, request: R) -> R:
    """An agent asking about every goal (status, subscribe) gets its own."""
    asks_all = (
        type(request) in (p.Status, p.Subscribe, p.DiskUsage) and getattr(request, "goal_id", None) is None
    )
    if principal.goal_id is not None and asks_all:
        return request.model_copy(update={"goal_id": principal.goal_id})
    return request
