"""Links from the bot to its runners: one supervised, subscribed connection per runner.

`RunnerLink` keeps one runner subscribed for as long as it runs: connect (goaltender.bot.transports),
`subscribe(since=<the last seq the bot stored>)`, hand every event to the bot's callback,
acknowledge it, and on any drop reconnect with exponential backoff and jitter (reset only by a
session that lasted, so a runner that fails straight after subscribing is not hammered). Every
request has a deadline (`RunnerTarget.request_timeout`), and a link that has heard nothing for
`probe_interval` asks for a status: a runner that stops answering while SSH stays up is taken for
down, and the link connects again. Delivery is **at
least once**: an event whose callback had finished but whose seq the bot had not yet made durable
when the link dropped is delivered again after the reconnect. The callback makes it exactly-once by
storing the event and its seq in one transaction and ignoring a seq it already has; `load_cursor`
returns the highest stored seq.

Before it subscribes, a link tells `on_database` which database the runner runs on (its welcome's
identity): the bot keeps each database's goals apart (bot/databases.py). A runner whose event log
ends before the bot's cursor had its database restored from an earlier copy and numbers events
again: the link says so in the log, `on_rewind` moves the cursor back (bot/databases.py: to the
start, the events read before told apart by their time), and it subscribes again from there, so
none of the new events is skipped.
`RunnerPool` holds the links of every configured runner and picks one for a new goal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import datetime
from typing import TypeVar

from goaltender.bot.transports import LINK_ERRORS, RunnerTarget, error_reason, open_client
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable
from goaltender.storage.records import Event, utcnow

log = logging.getLogger("goaltender.bot.links")

R = TypeVar("R", bound=p.Reply)
EventCallback = Callable[[str, Event], Awaitable[None]]
CursorLoader = Callable[[str], Awaitable[int]]
ChangeCallback = Callable[[str, bool], Awaitable[None]]  # (runner name, up)
DatabaseCallback = Callable[[str, str], Awaitable[None]]  # (runner name, the identity of its database)
RewindCallback = Callable[[str, int], Awaitable[None]]  # (runner name, where its event log ends)


class UnknownRunner(LookupError):
    """No runner of that name is configured."""


class NoRunnerAvailable(RunnerUnavailable):
    """No configured runner is connected right now."""


class DatabaseReplaced(UnknownRunner):
    """A goal of a database its runner no longer runs on (bot/databases.py set it aside)."""


RETIRED = "@"  # between a runner's name and a database it ran on before (bot/databases.py)


STEADY_AFTER_S = 10.0  # a session up this long (or that delivered an event) resets the backoff
SLOW_REQUESTS = (p.Stop,)  # answered once the goal's processes have ended: target.stop_timeout


class RunnerLink:
    """Keeps one runner connected and subscribed; reconnects on any drop.

    `on_event(runner_name, event)` stores an event (the bot's job; it must be idempotent on
    (runner_name, event.seq)), and `load_cursor(runner_name)` returns the highest seq stored, which
    is where every (re)subscription resumes. After the callback returns, the link acknowledges the
    seq to the runner (acks are coalesced: one in flight, always the newest seq).
    `on_change(runner_name, up)`, if given, hears when the link comes up or goes down (once per
    change; the first failure to connect counts as going down).
    """

    def __init__(
        self,
        target: RunnerTarget,
        *,
        on_event: EventCallback,
        load_cursor: CursorLoader,
        on_change: ChangeCallback | None = None,
        on_database: DatabaseCallback | None = None,
        on_rewind: RewindCallback | None = None,
        client_name: str = "goaltender-bot",
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        steady_after: float = STEADY_AFTER_S,
    ):
        self.target = target
        self.name = target.name
        self.client_name = client_name
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.steady_after = steady_after
        self._on_event = on_event
        self._load_cursor = load_cursor
        self._on_change = on_change
        self._on_database = on_database
        self._on_rewind = on_rewind
        self._reported: bool | None = None  # the last state told to on_change
        self._change_tasks: set[asyncio.Task] = set()
        self._client: RunnerClient | None = None
        self._up = asyncio.Event()
        self._stop = asyncio.Event()
        self._failures = 0
        self._steady = False  # whether the last session lasted (see STEADY_AFTER_S)
        self._delivered = 0
        self._heard = 0.0  # monotonic time of the last reply or event from the runner
        self._hung: tuple[RunnerClient, str] | None = None  # a client given up on, and why
        self._closing: set[asyncio.Task] = set()
        self.last_error: str | None = None
        """Why the link last went down or failed to come up (kept after it recovers)."""
        self.connected_since: datetime | None = None
        """When the current session subscribed; None while the link is down."""
        self.runner_name: str | None = None
        """What the runner calls itself (its Welcome), once connected."""
        self.runner_id: str | None = None
        """The identity of the runner's database (its Welcome), once connected to a runner that says."""
        self.connects = 0
        """Successful subscriptions so far (1 + the number of reconnects)."""
        self.head: int | None = None
        """The runner's newest seq when the current session subscribed."""

    @property
    def healthy(self) -> bool:
        return self._client is not None

    def __repr__(self) -> str:
        state = "up" if self.healthy else f"down ({self.last_error or 'connecting'})"
        return f"<RunnerLink {self.target.describe()} {state}>"

    async def wait_healthy(self) -> None:
        """Wait until the link is subscribed (wrap it in asyncio.timeout to bound the wait)."""
        await self._up.wait()

    async def request(self, request: p.Request[R]) -> R:
        """Send one request on the current connection and return its reply (its `reply_type`).
        RunnerUnavailable when the link is down, or when the runner does not answer in time (the
        link then goes down and connects again)."""
        client = self._client
        if client is None:
            why = f" (last error: {self.last_error})" if self.last_error else " (still connecting)"
            raise RunnerUnavailable(f"runner {self.name} is not connected{why}")
        return await self._request(client, request)

    def pushed_status(self, goal_id: int, seq: int) -> p.GoalStatus | None:
        """The goal's status as the runner pushed it with event `seq` or later; None when it did
        not (an older runner, or the link has dropped since)."""
        client = self._client
        return client.pushed_status(goal_id, seq) if client is not None else None

    async def _request(self, client: RunnerClient, request: p.Request[R]) -> R:
        """`client.request` within the request's deadline; past it the client is given up on."""
        slow = isinstance(request, SLOW_REQUESTS)
        deadline = self.target.stop_timeout if slow else self.target.request_timeout
        try:
            async with asyncio.timeout(deadline):
                reply = await client.request(request)
        except TimeoutError:
            why = f"the runner did not answer a {type(request).__name__} request within {deadline:g}s"
            self._give_up(client, why)
            raise RunnerUnavailable(f"runner {self.name}: {why}") from None
        except p.ProtocolError:
            self._heard = time.monotonic()  # a refusal is an answer too
            raise
        self._heard = time.monotonic()
        return reply

    def _give_up(self, client: RunnerClient, why: str) -> None:
        """The runner left a request unanswered: mark the link down now (health says why) and close
        the client, which ends the session's event stream, so that run() connects again."""
        if self._client is not client:
            return  # that session has already ended
        self._client = None
        self._up.clear()
        self._hung = (client, why)
        self.last_error = why
        closing = asyncio.ensure_future(client.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def stop(self) -> None:
        """Make `run()` close the connection and return (for good: a stopped link stays stopped)."""
        self._stop.set()

    async def run(self) -> None:
        """Connect, subscribe and deliver events until `stop()`; reconnect after every drop."""
        while not self._stop.is_set():
            session = asyncio.ensure_future(self._session())
            stopping = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait({session, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                if not session.done():
                    session.cancel()
                await asyncio.gather(session, return_exceptions=True)  # (retrieves its exception)
            if self._stop.is_set():
                break
            exc = session.exception() if not session.cancelled() else asyncio.CancelledError()
            self._note_error(exc)
            if exc is not None and not isinstance(exc, LINK_ERRORS):
                log.error("runner %s: link failed", self.name, exc_info=exc)
            self._changed(False)
            if self._steady:
                self._failures = 0  # the link had worked: the backoff starts over
            delay = min(self.backoff_cap, self.backoff_base * 2**self._failures) * random.uniform(0.5, 1.0)
            self._failures += 1
            log.warning("runner %s: link down (%s); retrying in %.1fs", self.name, self.last_error, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):  # (not wait_for: see Outbox.run)
                    await self._stop.wait()
        await asyncio.gather(*self._closing, return_exceptions=True)  # clients given up on

    async def _session(self) -> None:
        self._steady = False
        client = await open_client(self.target, self.client_name)
        tasks: list[asyncio.Task] = []
        subscribed_at: float | None = None
        try:
            if client.runner_id is not None and self._on_database is not None:
                await self._on_database(self.name, client.runner_id)  # before the cursor: it may move
            since = await self._load_cursor(self.name)
            self.head = await self._subscribe(client, since)
            if self.head < since:
                log.warning(
                    "runner %s: its event log ends at seq %d, before the %d the bot has read: its database "
                    "was restored from an earlier copy, and it numbers its new events as ones already read; "
                    "reading its log again",
                    self.name,
                    self.head,
                    since,
                )
                if self._on_rewind is not None:
                    await self._on_rewind(self.name, self.head)  # where to read it from: the cursor
                since = await self._load_cursor(self.name) if self._on_rewind is not None else self.head
                # On a new connection: events the first subscription sent may be waiting on this one.
                await client.close()
                client = await open_client(self.target, self.client_name)
                self.head = await self._subscribe(client, since)
            self._delivered = since  # (of this runner's log: after a rewind or a switch, lower than before)
            self._client = client
            self.runner_name = client.runner_name
            self.runner_id = client.runner_id
            self.connected_since = utcnow()
            self.connects += 1
            subscribed_at = self._heard = time.monotonic()
            self._up.set()
            self._changed(True)
            log.info("runner %s: subscribed since seq %d (head %d)", self.name, since, self.head)
            ack_due = asyncio.Event()
            tasks.append(asyncio.ensure_future(self._ack_loop(client, ack_due)))
            tasks.append(asyncio.ensure_future(self._probe_loop(client)))
            async for event in client.events():
                self._heard = time.monotonic()
                await self._on_event(self.name, event)
                self._delivered = max(self._delivered, event.seq)
                self._steady = True
                ack_due.set()
        except Exception as exc:
            if self._hung is not None and self._hung[0] is client:
                hung = RunnerUnavailable(self._hung[1])  # why it was given up on, not how it closed
                self._note_error(hung)
                raise hung from exc
            self._note_error(exc)  # before `healthy` turns false, so a watcher sees both at once
            raise
        finally:
            self._hung = None
            if subscribed_at is not None and time.monotonic() - subscribed_at >= self.steady_after:
                self._steady = True
            self._client = None
            self._up.clear()
            self.connected_since = None
            for task in tasks:
                task.cancel()
            await client.close()

    async def _subscribe(self, client: RunnerClient, since: int) -> int:
        try:
            async with asyncio.timeout(self.target.request_timeout):
                # Statuses pushed before the events that change a card: no Status request per event.
                return await client.subscribe(since=since, statuses=True)
        except TimeoutError:
            raise RunnerUnavailable(
                f"the runner did not answer a Subscribe request within {self.target.request_timeout:g}s"
            ) from None

    def _changed(self, up: bool) -> None:
        if self._on_change is None or self._reported == up:
            return
        self._reported = up
        task = asyncio.ensure_future(self._on_change(self.name, up))
        self._change_tasks.add(task)
        task.add_done_callback(self._change_done)

    def _change_done(self, task: asyncio.Task) -> None:
        self._change_tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("runner %s: the link-change callback failed", self.name, exc_info=exc)

    def _note_error(self, exc: BaseException | None) -> None:
        error = error_reason(exc) if exc is not None else "the session ended"
        self.last_error = error.removeprefix(f"runner {self.name}: ")

    async def _ack_loop(self, client: RunnerClient, due: asyncio.Event) -> None:
        acked = 0
        while True:
            await due.wait()
            due.clear()
            seq = self._delivered
            if seq > acked:
                try:
                    await self._request(client, p.Ack(seq=seq))
                except (RunnerUnavailable, p.ProtocolError):
                    return  # the event loop notices the drop and reconnects
                acked = seq

    async def _probe_loop(self, client: RunnerClient) -> None:
        """Ask for a status whenever nothing has come from the runner for probe_interval: a runner
        that cannot answer it in time is given up on (see _request)."""
        interval = self.target.probe_interval
        while True:
            quiet = time.monotonic() - self._heard
            if quiet < interval:
                await asyncio.sleep(interval - quiet)
                continue
            try:
                await self._request(client, p.Status(limit=1))
            except p.ProtocolError:
                pass  # it answered: alive
            except RunnerUnavailable:
                return  # the session ends; run() connects again


# ---- several runners ----


class RunnerPool:
    """The links to every configured runner, and the choice of runner for a new goal."""

    def __init__(
        self,
        targets: Iterable[RunnerTarget],
        *,
        on_event: EventCallback,
        load_cursor: CursorLoader,
        on_change: ChangeCallback | None = None,
        on_database: DatabaseCallback | None = None,
        on_rewind: RewindCallback | None = None,
        client_name: str = "goaltender-bot",
        load_ttl: float = 5.0,
        status_timeout: float = 10.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ):
        self.links: dict[str, RunnerLink] = {}
        for target in targets:
            if target.name in self.links:
                raise ValueError(f"two runners are both named {target.name!r}")
            self.links[target.name] = RunnerLink(
                target,
                on_event=on_event,
                load_cursor=load_cursor,
                on_change=on_change,
                on_database=on_database,
                on_rewind=on_rewind,
                client_name=client_name,
                backoff_base=backoff_base,
                backoff_cap=backoff_cap,
            )
        if not self.links:
            raise ValueError("no runners are configured")
        self.load_ttl = load_ttl
        self.status_timeout = status_timeout
        self._loads: dict[str, tuple[float, int]] = {}  # name -> (monotonic time, active goals)

    def __getitem__(self, name: str) -> RunnerLink:
        try:
            return self.links[name]
        except KeyError:
            runner, _, runner_id = name.rpartition(RETIRED)
            if runner in self.links:  # a goal of a database the runner no longer runs on
                raise DatabaseReplaced(
                    f"runner {runner} no longer runs on the database this goal was on ({runner_id}): "
                    "the goal is not there any more"
                ) from None
            raise UnknownRunner(
                f"there is no runner called {name!r}; configured: {', '.join(self.links)}"
            ) from None

    def __iter__(self) -> Iterator[RunnerLink]:
        return iter(self.links.values())

    async def run(self) -> None:
        """Run every link until `stop()`."""
        await asyncio.gather(*(link.run() for link in self.links.values()))

    def stop(self) -> None:
        for link in self.links.values():
            link.stop()

    async def load(self, link: RunnerLink) -> int:
        """The runner's number of active (not finished/stopped/failed) goals, cached for load_ttl s."""
        cached = self._loads.get(link.name)
        if cached is not None and time.monotonic() - cached[0] < self.load_ttl:
            return cached[1]
        reply = await asyncio.wait_for(link.request(p.Status(active_only=True)), self.status_timeout)
        load = len(reply.goals)
        self._loads[link.name] = (time.monotonic(), load)
        return load

    async def pick(self, name: str | None = None) -> RunnerLink:
        """The named runner (connected or not: the caller queues while it is down), or else the
        connected runner with the fewest active goals (ties: by name)."""
        if name is not None:
            return self[name]
        healthy = [link for link in self.links.values() if link.healthy]
        loads = await asyncio.gather(*(self.load(link) for link in healthy), return_exceptions=True)
        problems = {
            link.name: error_reason(load)
            for link, load in zip(healthy, loads, strict=True)
            if isinstance(load, BaseException)
        }
        ranked = sorted(
            (load, link.name) for link, load in zip(healthy, loads, strict=True) if isinstance(load, int)
        )
        if not ranked:
            states = []
            for link in self.links.values():
                why = problems.get(link.name) or link.last_error or "still connecting"
                states.append(f"{link.name} ({why})")
            raise NoRunnerAvailable(f"no runner is available right now: {'; '.join(states)}")
        load, chosen = ranked[0]
        # Count the goal about to be submitted, so a burst of goals spreads over the runners.
        self._loads[chosen] = (self._loads.get(chosen, (time.monotonic(), 0))[0], load + 1)
        return self.links[chosen]
