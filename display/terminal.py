"""The goal's thread in a terminal: events rendered the way the Slack thread reads them.

``ConsoleThread.render(event)`` is pure (event in, text out); ``show(event)`` prints it. Each
message is a header line -- time, speaker, an emoji per kind, a one-line summary -- followed by
an indented body. ``render_card`` draws the root status card with text budget bars. The facts
shown (emoji, numbers, costs, budgets) come from ``display.facts``, as Slack's do; this module
only lays them out and colours them.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, TextIO

from goaltender.display.facts import (
    EMOJI,
    STATE_EMOJI,
    BudgetBar,
    approval_verdict,
    budget_bars,
    budget_summary,
    clock,
    crash_text,
    experiment_cost,
    folded_summary,
    folded_titles,
    format_bar,
    format_metric,
    format_params,
    interval_text,
    noise_mark,
    objective,
    reported_mark,
    state_label,
)
from goaltender.display.plain import clean
from goaltender.runner.report import fetch_summary
from goaltender.storage.records import (
    Approval,
    ApprovalDecided,
    ApprovalRequested,
    BudgetChanged,
    Event,
    Experiment,
    ExperimentFinished,
    ExperimentQueued,
    ExperimentStarted,
    FinalReport,
    GoalAccepted,
    GoalStateChanged,
    HubFetched,
    MetricsLogged,
    MilestoneReported,
    PostsFolded,
    SteerReceived,
)

if TYPE_CHECKING:
    from goaltender.protocol.messages import GoalStatus

__all__ = ["ConsoleThread"]

WIDTH = 100
INDENT = "    "
SPEAKER = "goaltender"
FOLDED_ROOM = 2000  # characters of folded posts' titles shown in their one message

DEFAULT_APPROVAL_HINT = "Answer at the prompt: y = approve, n = reject; anything after it is your comment."

_ANSI = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def _visible_len(text: str) -> int:
    return len(_ANSI_RE.sub("", text))


def _wrap(text: str, indent: str = INDENT, width: int = WIDTH) -> list[str]:
    """Wrap each line of ``text`` to ``width``, keeping blank lines and list-style hanging indents."""
    out: list[str] = []
    for raw in clean(text).split("\n"):
        line = raw.rstrip()
        if not line.strip():
            out.append("")
            continue
        lead = line[: len(line) - len(line.lstrip())]
        stripped = line.lstrip()
        m = re.match(r"([-*•]|\d+[.)])\s+", stripped)
        hang = " " * (len(m.group(0)) if m else 0)
        out.extend(
            textwrap.wrap(
                stripped,
                width=width,
                initial_indent=indent + lead,
                subsequent_indent=indent + lead + hang,
                break_long_words=True,
                break_on_hyphens=False,
            )
            or [indent]
        )
    while out and not out[-1]:
        out.pop()
    return out


# ---- the thread ----


class ConsoleThread:
    """Prints a goal's events as a chat thread.

    ``color=None`` enables ANSI colour when ``stream`` is a TTY and ``NO_COLOR`` is unset.
    ``approval_hint`` is the "how to answer" line under approval prompts (``{id}`` is filled in).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        color: bool | None = None,
        *,
        width: int = WIDTH,
        speaker: str = SPEAKER,
        approval_hint: str = DEFAULT_APPROVAL_HINT,
    ) -> None:
        self._stream = stream
        if color is None:
            target = self.stream
            isatty = getattr(target, "isatty", None)
            color = bool(isatty and isatty()) and not os.environ.get("NO_COLOR")
        self.color = color
        self.width = width
        self.speaker = speaker
        self.approval_hint = approval_hint

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    # -- styling --

    def _c(self, text: str, *styles: str) -> str:
        if not self.color or not styles or not text:
            return text
        codes = ";".join(_ANSI[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def _status_style(self, status: str) -> str:
        return {"keep": "green", "discard": "dim", "crash": "red", "running": "cyan"}.get(status, "cyan")

    def _state_style(self, state: str) -> str:
        return {
            "running": "green",
            "accepted": "cyan",
            "waiting_for_approval": "yellow",
            "paused": "yellow",
            "finished": "green",
            "stopped": "yellow",
            "failed": "red",
        }.get(state, "cyan")

    # -- message assembly --

    def _header(self, ts: datetime, emoji: str, summary: str) -> str:
        time_part = self._c(clock(ts), "dim")
        return f"{time_part}  {self._c(self.speaker, 'bold')}  {emoji} {summary}"

    def _prefix_len(self) -> int:
        # time (8) + 2 + speaker + 2 + emoji (2 columns on most terminals) + 1
        return 8 + 2 + len(self.speaker) + 2 + 2 + 1

    def _fit(self, lead: str, title: str, *styles: str) -> tuple[str, list[str]]:
        """``lead`` + ``title`` as the header summary; what doesn't fit continues in the body."""
        title = " ".join(clean(title).split())
        room = self.width - self._prefix_len() - _visible_len(lead)
        if len(title) <= room:
            return lead + self._c(title, *styles), []
        chunks = textwrap.wrap(title, width=max(20, room), break_on_hyphens=False)
        rest = " ".join(chunks[1:])
        return lead + self._c(chunks[0], *styles), self._body(rest, *styles)

    def _message(self, ts: datetime, emoji: str, summary: str, body: Iterable[str] = ()) -> str:
        lines = [self._header(ts, emoji, summary)]
        lines.extend(body)
        return "\n".join(lines)

    def _body(self, text: str | None, *styles: str) -> list[str]:
        if not text:
            return []
        return [self._c(line, *styles) if line else line for line in _wrap(text, width=self.width)]

    # -- public API --

    def render(self, event: Event) -> str:
        """The text block for one event; "" for events the thread doesn't show."""
        data = event.data
        ts = event.ts
        if isinstance(data, GoalAccepted):
            return self._render_accepted(ts, data)
        if isinstance(data, GoalStateChanged):
            return self._render_state(ts, data)
        if isinstance(data, MilestoneReported | HubFetched) and data.folded:
            return ""  # past the goal's rate: its PostsFolded shows it
        if isinstance(data, PostsFolded):
            lines, _ = folded_titles(data, FOLDED_ROOM)
            return self._message(
                ts, EMOJI["posts_folded"], folded_summary(data), self._body("\n".join(lines))
            )
        if isinstance(data, MilestoneReported):
            summary, body = self._fit("", data.title, "bold")
            return self._message(ts, EMOJI["milestone"], summary, body + self._body(data.text))
        if isinstance(data, MetricsLogged):
            return ""
        if isinstance(data, ExperimentQueued):
            summary = f"{self._c(f'#{data.experiment.index}', 'bold')} queued: {clean(data.waiting)}"
            return self._message(ts, EMOJI["queued"], summary, [])
        if isinstance(data, ExperimentStarted):
            return self._render_started(ts, data.experiment)
        if isinstance(data, ExperimentFinished):
            return self._render_finished(ts, data.experiment, new_best=data.new_best)
        if isinstance(data, ApprovalRequested):
            return self._render_approval_requested(ts, data.approval)
        if isinstance(data, ApprovalDecided):
            return self._render_approval_decided(ts, data.approval)
        if isinstance(data, SteerReceived):
            msg = data.message
            summary = f"Steer from {self._c(clean(msg.author), 'bold')}"
            return self._message(ts, EMOJI["steer"], summary, self._body(msg.text))
        if isinstance(data, BudgetChanged):
            summary = f"Budget changed: {clean(data.reason)}" if data.reason else "Budget changed"
            return self._message(
                ts, EMOJI["budget_changed"], summary, self._body(f"now: {budget_summary(data.budget)}")
            )
        if isinstance(data, FinalReport):
            return self._render_report(ts, data)
        if isinstance(data, HubFetched):
            summary = f"Fetched {clean(fetch_summary(data.fetch, short_commit=True))}"
            return self._message(ts, EMOJI["hub_fetched"], summary)
        return ""

    def show(self, event: Event) -> str:
        """Render ``event``, print it (followed by a blank line) and flush; returns the text."""
        text = self.render(event)
        if text:
            self.write(text)
        return text

    def write(self, text: str) -> None:
        """Print a rendered block (a message or a card) as its own paragraph of the thread."""
        stream = self.stream
        stream.write(text.rstrip("\n") + "\n\n")
        stream.flush()

    def render_card(self, status: GoalStatus, *, now: datetime) -> str:
        """The root status card: state, budget bars, best result, agent. Drawn from the runner's
        status whole, as Slack's card is (bot/render.py): a figure passed one by one was left out
        (the agent's tokens, whose bar then read 0)."""
        goal, best = status.goal, status.best
        b = goal.budget
        state = self._c(state_label(goal.state), "bold", self._state_style(goal.state))
        emoji = STATE_EMOJI.get(goal.state, EMOJI["goal_accepted"])
        title = f"{emoji} Goal #{goal.id}  [{state}]  agent: {goal.agent}  owner: {clean(goal.owner)}"
        lines = [self._c("─" * min(self.width, 60), "dim"), title]
        text_lines = _wrap(goal.text, indent=INDENT, width=self.width)
        if len(text_lines) > 3:
            text_lines = [*text_lines[:2], text_lines[2][: self.width - 2].rstrip() + " …"]
        lines.extend(text_lines)

        label_w = 12
        for bar in budget_bars(
            goal,
            attempted=status.attempted,
            compute_hours_used=status.compute_hours_used,
            tokens_used=status.tokens_used,
            now=now,
        ):
            lines.append(self._bar_line(bar, label_w))
        metric = goal.metric or (best.metric_name if best else None) or "metric"
        if best is not None and best.metric_value is not None:
            best_text = (
                f"#{best.index} {best.metric_name or metric} "
                f"{self._c(format_metric(best.metric_name or metric, best.metric_value), 'bold')}"
            )
        else:
            best_text = "none yet"
        lines.append(f"{INDENT}{'best':<{label_w}} {best_text}  ({objective(goal, metric)})")
        if goal.end_reason:
            lines.extend(_wrap(f"ended: {goal.end_reason}", indent=INDENT, width=self.width))
        elif goal.state == "running" and b.ask_to_continue:
            lines.append(f"{INDENT}{self._c('asks before going past baseline + 3 experiments', 'dim')}")
        lines.append(self._c("─" * min(self.width, 60), "dim"))
        return "\n".join(lines)

    # -- per-kind renderers --

    def _bar_line(self, bar: BudgetBar, label_w: int) -> str:
        head = f"{INDENT}{bar.label:<{label_w}} "
        if bar.fraction is None:
            return f"{head}{bar.used} {self._c('(no limit)', 'dim')}"
        style = "green" if bar.fraction < 0.75 else "yellow" if bar.fraction < 1.0 else "red"
        over = f" {self._c('over budget', 'red', 'bold')}" if bar.over else ""
        return f"{head}{self._c(format_bar(bar.fraction), style)} {bar.used}{bar.sep}{bar.total}{over}"

    def _render_accepted(self, ts: datetime, data: GoalAccepted) -> str:
        g = data.goal
        summary = self._c(f"Goal #{g.id} accepted", "bold")
        body = self._body(g.text)
        facts = [f"owner: {clean(g.owner)}", f"agent: {g.agent}"]
        if g.metric:
            facts.append(f"metric: {g.metric} {objective(g)}")
        body += self._body(" · ".join(facts), "dim")
        body += self._body(f"budget: {budget_summary(g.budget)}", "dim")
        return self._message(ts, EMOJI["goal_accepted"], summary, body)

    def _render_state(self, ts: datetime, data: GoalStateChanged) -> str:
        state = state_label(data.state)
        summary = f"Goal is now {self._c(state, 'bold', self._state_style(data.state))}"
        return self._message(
            ts, STATE_EMOJI.get(data.state, EMOJI["goal_state"]), summary, self._body(data.reason)
        )

    def _render_started(self, ts: datetime, e: Experiment) -> str:
        emoji = EMOJI["experiment_started"]
        summary = f"{self._c(f'#{e.index}', 'bold')} started"
        room = self.width - self._prefix_len() - len(f"#{e.index} started") - 2
        body: list[str] = []
        if e.params:
            params = format_params(e.params)
            if len(params) <= room:
                summary += f"  {params}"
            else:
                body += self._body(f"params: {params}")
        body += self._body(e.description)
        if e.command:
            cmd = " ".join(clean(c) for c in e.command)
            limit = self.width - len(INDENT) - 2
            if len(cmd) > limit:
                cmd = cmd[: limit - 1] + "…"
            body.append(self._c(f"{INDENT}$ {cmd}", "dim"))
        return self._message(ts, emoji, summary, body)

    def _render_finished(self, ts: datetime, e: Experiment, *, new_best: bool) -> str:
        emoji = EMOJI.get(e.status, EMOJI["running"])
        parts_plain: list[str] = [f"#{e.index} {e.status}"]
        parts: list[str] = [
            f"{self._c(f'#{e.index}', 'bold')} {self._c(e.status, self._status_style(e.status))}"
        ]
        if e.metric_value is not None:
            name = e.metric_name or "metric"
            value = format_metric(name, e.metric_value)
            best = " (best)" if new_best else ""
            how = f" {reported_mark(e)}" if reported_mark(e) else ""
            how += f" [{interval_text(e)}]" if interval_text(e) else ""
            how += f" {noise_mark(e)}" if noise_mark(e) else ""
            parts_plain.append(f"{name} {value}{how}{best}")
            parts.append(
                f"{name} {self._c(value, 'bold')}{self._c(how, 'dim')}{self._c(best, 'yellow', 'bold')}"
            )
        elif e.status == "crash":
            parts_plain.append(crash_text(e))
            parts.append(self._c(crash_text(e), "red"))
        tail = experiment_cost(e)

        # Fit the params between the metric and the costs; the full list goes to the body if cut.
        body: list[str] = []
        fixed = len("  ".join(parts_plain + tail)) + 2
        room = self.width - self._prefix_len() - fixed
        if e.params:
            full = format_params(e.params)
            if len(full) <= room:
                params = full
            else:
                params = format_params(e.params, max_len=room) if room >= 16 else ""
                body += self._body(f"params: {full}", "dim")
            if params:
                parts.append(params)
        parts.extend(self._c(t, "dim") for t in tail)
        summary = "  ".join(parts)

        body = self._body(e.description) + body
        if e.note:
            note = self._body(f"note: {e.note}", "red" if e.status == "crash" else "dim")
            body += note if len(note) <= 8 else [*note[:3], f"{INDENT}…", *note[-4:]]
        return self._message(ts, emoji, summary, body)

    def _render_approval_requested(self, ts: datetime, a: Approval) -> str:
        lead = self._c("Approval needed", "bold", "yellow") + ": "
        summary, body = self._fit(lead, a.question, "bold")
        body += self._body(a.detail)
        body += self._body(f"approval #{a.id} · {a.kind} · expires {clock(a.expires_at)}", "dim")
        body += self._body(self.approval_hint.replace("{id}", str(a.id)), "cyan")
        return self._message(ts, EMOJI["approval_requested"], summary, body)

    def _render_approval_decided(self, ts: datetime, a: Approval) -> str:
        emoji, verdict = approval_verdict(a)
        who = self._c(clean(a.decided_by) if a.decided_by else "someone", "bold")
        style = {"approved": "green", "rejected": "red", "expired": "yellow"}.get(a.state)
        summary = self._c(verdict, "bold", style) if style else verdict
        if a.state in ("approved", "rejected"):
            summary += f" by {who}"
        summary += f"  (approval #{a.id})"
        body: list[str] = []
        if a.comment:
            body += self._body(f"“{clean(a.comment)}”")
        body += self._body(f"re: {a.question}", "dim")
        return self._message(ts, emoji, summary, body)

    def _render_report(self, ts: datetime, data: FinalReport) -> str:
        summary = f"{self._c('Final report', 'bold')} — {clean(data.end_reason)}"
        lines = [self._header(ts, EMOJI["report"], summary)]
        if data.best is not None and data.best.metric_value is not None:
            b = data.best
            name = b.metric_name or "metric"
            lines.extend(
                self._body(f"best: #{b.index} {name} {format_metric(name, b.metric_value)} — {b.description}")
            )
        lines.append("")
        # The report's markdown as is (its ledger table must keep its columns aligned).
        lines.append(clean(data.text).rstrip("\n"))
        return "\n".join(lines)
