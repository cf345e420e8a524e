"""A goal's thread in Slack: runner events turned into writes to it, and its status card.

Each kind of event has one small function (the `WRITES` table) returning its post or edit; the
campaign plot comes with milestones and the final report, only when it shows something new since
the goal's last plot (a new run or a new best; a milestone that names training curves, as the
NeMo RL launcher's does, gets those instead); a milestone about runs right after a ledger row is
added to that row (an edit), so a run is at most its row and a plot; the final report comes with
one upload holding the whole ledger as CSV (and the plot when new); and events that change what
the card shows refresh it. An event's writes are stored
with its seq in one transaction, so each is made exactly once. A milestone or fetch the runner
folded past its goal's rate (runner/folding.py) gets no post and no plot: its PostsFolded shows it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goaltender.bot import queries, render
from goaltender.bot.databases import end_replay
from goaltender.bot.keys import ApprovalKey, CardKey, EventKey, OutboxKey, QueueKey
from goaltender.bot.links import RunnerPool, UnknownRunner
from goaltender.bot.outbox import Outbox, Payload, editing, in_thread, replacing
from goaltender.display import plots
from goaltender.protocol import messages as p
from goaltender.storage.bot_store import BotStore, OutboxKind, QueuedGoal, Thread
from goaltender.storage.records import (
    ApprovalDecided,
    ApprovalRequested,
    BudgetChanged,
    Curves,
    Event,
    ExperimentFinished,
    FinalReport,
    GoalStateChanged,
    HubFetched,
    MilestoneReported,
    PostsFolded,
    StageChanged,
    SteerReceived,
)

NAMES_A_RUN = re.compile(r"#\d+\b")
PLOTTED = (MilestoneReported,)  # and the final report: ThreadWriter._final_report


@dataclass(frozen=True)
class Write:
    """One write an event makes to its goal's thread: an outbox row, but for the channel."""

    kind: OutboxKind
    payload: Payload
    key: OutboxKey


@dataclass(frozen=True)
class EventInThread:
    """The event being rendered: which runner's, which goal's, and its seq."""

    runner: str
    goal_id: int
    seq: int

    @property
    def card(self) -> CardKey:
        return CardKey(self.runner, self.goal_id)

    def approval(self, approval_id: int) -> ApprovalKey:
        return ApprovalKey(self.runner, self.goal_id, approval_id)

    def post(self, payload: Payload | None, key: OutboxKey | None = None) -> list[Write]:
        """The event's post in the thread (none when the renderer has nothing to say)."""
        if payload is None:
            return []
        return [Write("post", in_thread(self.card, payload), key or EventKey(self.runner, self.seq, 0))]

    def edit(self, key: OutboxKey, payload: Payload) -> list[Write]:
        return [Write("update", editing(key, payload), EventKey(self.runner, self.seq, 0))]


WRITES: dict[type, Callable[[EventInThread, Any], list[Write]]] = {
    MilestoneReported: lambda event, data: event.post(None if data.folded else render.milestone(data)),
    ExperimentFinished: lambda event, data: event.post(render.experiment_finished(data)),
    ApprovalRequested: lambda event, data: event.post(
        render.approval_prompt(data.approval, event.runner), event.approval(data.approval.id)
    ),
    ApprovalDecided: lambda event, data: event.edit(
        event.approval(data.approval.id), render.approval_decided(data.approval)
    ),
    SteerReceived: lambda event, data: event.post(render.steer_ack(data.message)),
    StageChanged: lambda event, data: event.post(render.stage_changed(data)),
    BudgetChanged: lambda event, data: event.post(render.budget_changed(data)),
    GoalStateChanged: lambda event, data: event.post(render.state_changed(event.goal_id, data)),
    HubFetched: lambda event, data: event.post(None if data.folded else render.hub_fetched(data)),
    PostsFolded: lambda event, data: event.post(render.posts_folded(data)),
}
"""Event data type -> its post in the thread, or its edit of an earlier post."""


async def thread_at(outbox: Outbox, store: BotStore, channel: str, ts: str) -> Thread | None:
    """The goal thread whose card is the post at (channel, ts)."""
    root = await root_at(outbox, store, channel, ts)
    return root if isinstance(root, Thread) else None


async def root_at(outbox: Outbox, store: BotStore, channel: str, ts: str) -> Thread | QueuedGoal | None:
    """The goal thread, or the queued goal, whose card is the post at (channel, ts)."""
    match await outbox.posted_at(channel, ts):
        case CardKey(runner, goal_id):
            return await store.thread(runner, goal_id)
        case QueueKey(queue_id):
            return await store.queued_goal(queue_id)
    return None


class ThreadWriter:
    """Renders runner events into their goals' threads, and keeps the status cards current."""

    def __init__(
        self,
        store: BotStore,
        pool: RunnerPool,
        outbox: Outbox,
        plots_dir: Path,
        submitting: Callable[[str], asyncio.Lock],
    ):
        self.store = store
        self.pool = pool
        self.outbox = outbox
        self.plots_dir = plots_dir
        self._submitting = submitting
        # What each goal's last plot showed (runs finished, best run): a plot is uploaded only
        # when it has something new. In memory: after a restart one plot may repeat, once.
        self._plotted: dict[CardKey, tuple[int, int | None]] = {}
        # Each goal's last thread post when it is a ledger row (its key, its payload): a milestone
        # right after it is added to the row (an edit) instead of a post of its own.
        self._last_row: dict[CardKey, tuple[str, Payload]] = {}

    async def on_runner_event(self, runner: str, event: Event) -> None:
        """Render one runner event into outbox rows and store them with its seq (exactly once)."""
        seq, replay_until = await self.store.position(runner)
        if event.seq <= seq:
            return  # a redelivery after a reconnect: already rendered (record_event rechecks atomically)
        if replay_until is not None:  # the runner's log is read again after a restore (bot/databases.py)
            if event.ts <= replay_until:
                return  # read before the restore
            await end_replay(self.store, runner, event.seq)
        rows: list[tuple[str, OutboxKind, Payload, str | None]] = []
        thread = await self._thread(runner, event.goal_id)
        if thread is not None and await self._card_queued(runner, thread.goal_id):
            writes = await self._writes(EventInThread(runner, thread.goal_id, event.seq), event.data)
            rows = [(thread.channel, w.kind, w.payload, str(w.key)) for w in writes]
        if await self.store.record_event(runner, event.seq, rows, event.ts) and rows:
            self.outbox.notify()

    async def _thread(self, runner: str, goal_id: int | None) -> Thread | None:
        if goal_id is None:
            return None
        if (thread := await self.store.thread(runner, goal_id)) is not None:
            return thread
        async with self._submitting(runner):  # a goal being submitted right now gets its thread
            return await self.store.thread(runner, goal_id)

    async def _card_queued(self, runner: str, goal_id: int) -> bool:
        """Whether the goal's card is queued or posted: no thread to write to when it failed."""
        card = await self.store.outbox_by_key(str(CardKey(runner, goal_id)))
        return card is not None and card.state != "failed"

    async def _writes(self, event: EventInThread, data: Any) -> list[Write]:
        if isinstance(data, FinalReport):
            writes = await self._final_report(event, data)
        else:
            writes = self._onto_row(event, data) or [
                w for w in WRITES.get(type(data), _nothing)(event, data) if await self._target_queued(w)
            ]
            if (
                isinstance(data, PLOTTED)
                and not _folded(data)
                and (plot := await self._plot_for(event, data))
            ):
                writes.append(
                    Write("upload", in_thread(event.card, plot), EventKey(event.runner, event.seq, "plot"))
                )
        self._remember_row(event, data, writes)
        if isinstance(data, MilestoneReported):
            await self.store.set_milestone(event.runner, event.goal_id, data.title, event.seq)
        if data.kind in p.CARD_KINDS and (
            card := await self._card(event.runner, event.goal_id, self._pushed(event))
        ):
            # Not "<runner>:<seq>:card": that is goal <seq>'s card post (CardKey), which INSERT OR
            # IGNORE would then drop, sending that goal's thread into this one.
            writes.append(
                Write("update", replacing(event.card, card), EventKey(event.runner, event.seq, "card-update"))
            )
        return writes

    def _onto_row(self, event: EventInThread, data: Any) -> list[Write] | None:
        """A milestone about runs (it names one: "#3"), with no curves of its own, right after a
        ledger row: the row is edited to carry it, so a run that brings a new best is one post,
        not two ("#3 keep … best", "New best … #3"). Other milestones keep a post of their own."""
        last = self._last_row.get(event.card)
        if not isinstance(data, MilestoneReported) or data.folded or data.curves is not None or last is None:
            return None
        if not NAMES_A_RUN.search(f"{data.title}\n{data.text or ''}"):
            return None
        row_key, row = last
        merged = {
            "text": row["text"],
            "blocks": render.fit([*row["blocks"], *render.milestone(data)["blocks"]]),
        }
        self._last_row[event.card] = (row_key, merged)
        return [Write("update", {**merged, "ts_of": row_key}, EventKey(event.runner, event.seq, 0))]

    def _remember_row(self, event: EventInThread, data: Any, writes: list[Write]) -> None:
        """Which post is the thread's last: a row (a milestone may join it), or anything else."""
        posts = [w for w in writes if w.kind in ("post", "upload")]
        if isinstance(data, ExperimentFinished) and posts:
            self._last_row[event.card] = (str(posts[0].key), posts[0].payload)
        elif posts:
            self._last_row.pop(event.card, None)

    async def _final_report(self, event: EventInThread, data: FinalReport) -> list[Write]:
        """The report, then one upload: the ledger as a CSV file, with the plot when it shows
        anything new."""
        summary = await self._summary(event)
        post = event.post(render.final_report(data, event.goal_id, summary))
        if summary is None:
            return post
        files = [render.ledger_file(event.goal_id, summary.ledger)]
        if (plot := await self._plot(event, summary)) is not None:
            files.insert(0, {k: plot[k] for k in ("file", "filename", "title")})
        upload = {
            "file_uploads": files,
            "initial_comment": "The whole ledger" + (" and the plot" if len(files) > 1 else ""),
        }
        return [
            *post,
            Write("upload", in_thread(event.card, upload), EventKey(event.runner, event.seq, "plot")),
        ]

    async def _summary(self, event: EventInThread) -> p.SummaryReply | None:
        try:
            return await self.pool[event.runner].request(p.Summary(goal_id=event.goal_id))
        except (p.ProtocolError, UnknownRunner):
            return None
        # RunnerUnavailable passes: the link dropped mid-render, so the event is not recorded and
        # comes again after the reconnect (recording it now would lose its report's ledger for good).

    async def _target_queued(self, write: Write) -> bool:
        """An edit of a post never queued (a decision on a prompt this thread never showed)
        would wait for that post forever: it is left out."""
        target = write.payload.get("ts_of")
        return target is None or await self.store.outbox_by_key(target) is not None

    async def _card(self, runner: str, goal_id: int, pushed: p.GoalStatus | None = None) -> Payload | None:
        """The goal's card from its status as the runner pushed it with an event (else asked for:
        a runner that does not push, a runner back up), and that status remembered."""
        status = pushed or await queries.goal_status(self.pool, runner, goal_id)
        if status is None:
            return None
        await self.store.set_status(runner, goal_id, status.model_dump(mode="json"))
        return render.status_card(status, runner)

    def _pushed(self, event: EventInThread) -> p.GoalStatus | None:
        try:
            return self.pool[event.runner].pushed_status(event.goal_id, event.seq)
        except UnknownRunner:
            return None

    async def _plot_for(self, event: EventInThread, data: MilestoneReported | FinalReport) -> Payload | None:
        """A milestone naming training curves shows them; the others, and the report, the campaign."""
        if isinstance(data, MilestoneReported) and data.curves is not None:
            return await self._curves_plot(event, data.curves)
        return await self._plot(event)

    async def _curves_plot(self, event: EventInThread, curves: Curves) -> Payload | None:
        """One experiment's series (fetched from the runner) as a PNG, its marked step starred."""
        series = {}
        try:
            for name in curves.series:
                reply = await self.pool[event.runner].request(
                    p.GetSeries(goal_id=event.goal_id, name=name, experiment_id=curves.experiment_id)
                )
                if reply.points:
                    series[name] = reply.points
        except (p.ProtocolError, UnknownRunner):
            return None
        if not series:
            return None
        path = self.plots_dir / f"{event.runner}-goal-{event.goal_id}-{event.seq}-curves.png"
        title = f"Goal #{event.goal_id}: training curves"
        await asyncio.to_thread(plots.plot_training, series, path, title=title, mark_step=curves.mark_step)
        return {"file": str(path), "filename": path.name, "title": f"{title} ({', '.join(series)})"}

    async def _plot(self, event: EventInThread, summary: p.SummaryReply | None = None) -> Payload | None:
        """The goal's headline metric per experiment as a PNG (best marked), ready to upload; None
        when it would show nothing new since the goal's last plot (no new run, no new best)."""
        if summary is None and (summary := await self._summary(event)) is None:
            return None
        finished = [e for e in summary.ledger if e.finished]
        goal = summary.status.goal
        metric = goal.metric
        if not finished or metric is None:
            return None
        shows = (len(finished), summary.status.best.index if summary.status.best else None)
        if self._plotted.get(event.card) == shows:
            return None
        self._plotted[event.card] = shows
        path = self.plots_dir / f"{event.runner}-goal-{event.goal_id}-{event.seq}.png"
        await asyncio.to_thread(
            plots.plot_campaign,
            finished,
            metric,
            path,
            direction=goal.direction,
            target=goal.target,
            title=f"Goal #{event.goal_id}: {metric} per experiment",
        )
        best = summary.status.best
        comment = (
            f"best so far: #{best.index} {render.escape(metric)} {render.format_metric(metric, best.metric_value)}"
            if best
            else ""
        )
        return {
            "file": str(path),
            "filename": path.name,
            "title": f"Goal #{event.goal_id} — {metric}",
            "initial_comment": comment,
        }

    async def show_runner(self, runner: str, up: bool, why: str) -> None:
        """Refresh the cards of a runner's active goals: from the runner when it is back, or
        from the last status seen, saying it is unreachable (`why`), when it went down."""
        for thread in await self.store.threads(runner=runner):
            last = p.GoalStatus.model_validate(thread.status) if thread.status else None
            if last is not None and not last.goal.active:
                continue
            if up:
                card = await self._card(runner, thread.goal_id)
            elif last is not None:
                card = render.status_card(last, runner, runner_down=why)
            else:
                card = None
            if card is not None:
                card_key = CardKey(runner, thread.goal_id)
                await self.outbox.enqueue(thread.channel, "update", replacing(card_key, card))


def _nothing(event: EventInThread, data: Any) -> list[Write]:
    return []


def _folded(data: Any) -> bool:
    """Folded past its goal's rate: in the goal's next PostsFolded post, not in one of its own."""
    return bool(getattr(data, "folded", False))
