"""Block Kit for the team's views of goals (pure functions, no I/O): `/goal list`, `/goal show N`,
a goal's `summary` and `audit` in its thread, `/goal audit`, and the App Home tab. Laid out over
bot/render.py's helpers and display.facts, as the thread's messages are.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from goaltender.bot.render import (
    EMOJI,
    Payload,
    context,
    escape,
    markdown_to_mrkdwn,
    payload,
    people,
    section,
    sections,
    status_card,
    user_ref,
)
from goaltender.display.facts import (
    STATE_EMOJI,
    budget_line,
    format_duration,
    format_metric,
    state_label,
)
from goaltender.protocol.messages import GoalStatus
from goaltender.storage.bot_audit import SlackAuditEntry
from goaltender.storage.records import AuditEntry, DiaryEntry, Experiment, utcnow

HOME_MAX_BLOCKS = 100  # a Home tab view holds up to 100 blocks
AUDIT_MARK = {
    "done": ":white_check_mark:",
    "refused": ":no_entry:",
    "held": ":hourglass_flowing_sand:",
    "failed": ":warning:",
}


@dataclass(frozen=True)
class GoalLine:
    """One goal as a list shows it: its status (live, or the last seen), where, and links."""

    runner: str
    status: GoalStatus
    link: str | None = None  # the card's permalink
    stale: bool = False  # the runner is unreachable: the last status seen


@dataclass(frozen=True)
class Waiting:
    """Something waiting for a person to decide: a runner approval or a budget increase."""

    goal_id: int
    question: str  # mrkdwn, escaped
    since: datetime
    link: str | None = None


def _name(line: GoalLine) -> str:
    name = f"Goal #{line.status.goal.id}"
    return f"<{line.link}|{name}>" if line.link else name


def _best(status: GoalStatus) -> str:
    best = status.best
    if best is None or best.metric_value is None:
        return "no result yet"
    metric = best.metric_name or status.goal.metric or "metric"
    return f"best #{best.index} {escape(metric)} *{format_metric(metric, best.metric_value)}*"


def goal_line(line: GoalLine, now: datetime, *, owner: bool = True) -> str:
    """`• Goal #3 on gpu1: *running* — owner @ana — tune the lr` + budget used and best."""
    goal = line.status.goal
    emoji = STATE_EMOJI.get(goal.state, EMOJI["goal_accepted"])
    stale = f" (runner *{escape(line.runner)}* unreachable; last known)" if line.stale else ""
    who = f" — owner {user_ref(goal.owner)}" if owner else ""
    budget = budget_line(
        goal, attempted=line.status.attempted, compute_hours_used=line.status.compute_hours_used, now=now
    )
    return (
        f"{emoji} {_name(line)} on {escape(line.runner)}: *{state_label(goal.state)}*{stale}{who} — "
        f"{escape(goal.text[:120])}\n      {budget} · {_best(line.status)}"
    )


def goal_list(lines: list[GoalLine], now: datetime | None = None) -> Payload:
    """`/goal list`: this channel's active goals."""
    now = now or utcnow()
    if not lines:
        text = "No active goals in this channel. Start one with `/goal <what to achieve>`."
        return payload(text, [section(text)])
    blocks = [section(f"*Active goals in this channel* ({len(lines)})")]
    blocks += sections("\n".join(goal_line(line, now) for line in lines))
    blocks.append(
        context("`/goal show <n>` shows one goal's card; reply `summary` in a goal's thread for its story.")
    )
    return payload(f"{len(lines)} active goal(s) in this channel", blocks)


def goal_shown(line: GoalLine) -> Payload:
    """`/goal show N`: the goal's card, with a link to its thread."""
    card = status_card(line.status, line.runner, runner_down="unreachable" if line.stale else None)
    where = (
        f"<{line.link}|Open goal #{line.status.goal.id}'s thread>"
        if line.link
        else "Its thread is in this channel."
    )
    return payload(card["text"], [*card["blocks"], context(where)])


def diary_text(text: str) -> str:
    """A diary entry as a person reads it: an agent's JSON handoff, alone or after a label (the sweep
    writes `sweep state: {...}`), becomes `- key: value` lines in words; anything else is kept."""
    label, brace, rest = text.partition("{")
    if not brace or (label.strip() and not label.rstrip().endswith(":")):
        return text
    try:
        data = json.loads(brace + rest)
    except ValueError:
        return text
    if not isinstance(data, dict):
        return text
    lines = [f"{label.strip().rstrip(':')}:"] if label.strip() else []
    lines += [f"- {str(key).replace('_', ' ')}: {_in_words(value)}" for key, value in data.items()]
    return "\n".join(lines)


def _in_words(value: object) -> str:
    """`{"index": 2, "config": {"lr": 0.003}}` -> `index 2, config lr=0.003`; `[]` -> `none`."""
    if isinstance(value, dict):
        if not value:
            return "none"
        if all(not isinstance(v, dict | list) for v in value.values()):
            return " ".join(f"{k}={v}" for k, v in value.items())
        return ", ".join(f"{str(k).replace('_', ' ')} {_in_words(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_in_words(v) for v in value) if value else "none"
    return str(value)


def goal_summary(
    status: GoalStatus,
    ledger: list[Experiment],
    milestones: list[tuple[str, datetime]],
    diary: DiaryEntry | None,
    now: datetime | None = None,
) -> Payload:
    """`summary` in a goal's thread: what happened so far, from the ledger, milestones and diary."""
    now = now or utcnow()
    goal = status.goal
    head = f"{EMOJI['report']} *Goal #{goal.id} so far* · *{state_label(goal.state)}* · owner {user_ref(goal.owner)}"
    budget = budget_line(
        goal, attempted=status.attempted, compute_hours_used=status.compute_hours_used, now=now
    )
    lines = [head, f">{escape(goal.text[:300])}", f"{budget} · {_best(status)}"]
    if goal.end_reason:
        lines.append(f"ended: {people(goal.end_reason.splitlines()[0][:300])}")
    finished = [e for e in ledger if e.finished]
    counts = Counter(e.status for e in finished)
    tally = ", ".join(f"{n} {kind}" for kind, n in counts.most_common())
    lines.append(f"*Experiments*: {len(finished)} finished" + (f" ({tally})" if tally else ""))
    for e in finished[-5:]:
        metric = (
            f" {escape(e.metric_name or 'metric')} {format_metric(e.metric_name, e.metric_value)}"
            if e.metric_value is not None
            else ""
        )
        lines.append(
            f"    {EMOJI.get(e.status, '•')} #{e.index} {e.status}{metric} — {escape(e.description[:100])}"
        )
    if status.running is not None:
        lines.append(
            f"{EMOJI['running']} running now: #{status.running.index} {escape(status.running.description[:200])}"
        )
    blocks = sections("\n".join(lines))
    if milestones:
        marks = [
            f"• {escape(title[:200])} _({format_duration((now - at).total_seconds())} ago)_"
            for title, at in milestones
        ]
        blocks += sections("*Milestones*\n" + "\n".join(marks))
    if diary is not None:
        what = "latest handoff" if diary.kind == "handoff" else "latest diary note"
        text = diary_text(diary.text)
        text = text if len(text) <= 1500 else text[:1500] + " …"
        ago = format_duration((now - diary.ts).total_seconds())
        blocks += sections(f"*The agent's {what}* _({ago} ago)_\n{markdown_to_mrkdwn(text)}")
    for approval in status.pending_approvals[:5]:
        blocks.append(
            section(
                f"{EMOJI['approval_requested']} waiting for approval #{approval.id}: {escape(approval.question[:300])}"
            )
        )
    blocks.append(
        context("From the runner's ledger, milestones and the agent's diary; the agent was not interrupted.")
    )
    return payload(f"Goal #{goal.id} so far: {state_label(goal.state)}", blocks, "summary")


def _audit_line(entry: AuditEntry | SlackAuditEntry, *, in_channel: bool = False) -> str:
    """`✅ 05 Mar 10:02:03 @ana *stop* done — stopped`; among a goal's, `in Slack` marks the bot's
    part, and a channel's name their goal."""
    mark = AUDIT_MARK.get(entry.outcome, "•")
    where = " _in Slack_" if isinstance(entry, SlackAuditEntry) and not in_channel else ""
    goal = in_channel and entry.goal_id is not None
    which = f" goal #{entry.goal_id}" if goal else ""
    said = f" — {people(entry.detail[:200], typed=True)}" if entry.detail else ""
    return (
        f"{mark} `{entry.ts:%d %b %H:%M:%S}` {user_ref(entry.actor)} *{escape(entry.action)}*{which} "
        f"{entry.outcome}{where}{said}"
    )


def goal_audit(
    goal_id: int,
    runner: str,
    ours: list[SlackAuditEntry],
    theirs: list[AuditEntry] | None,
    last: int = 20,
) -> Payload:
    """`audit` in a goal's thread: the runner's trail and the bot's (decisions made in Slack), by
    time, newest last; `theirs` None when the runner did not answer (said, with the bot's part)."""
    both: list[AuditEntry | SlackAuditEntry] = [*ours, *(theirs or [])]
    entries = sorted(both, key=lambda e: e.ts)[-last:]
    lines = [f"*Audit trail of goal #{goal_id}* (the last {last} actions, newest last)"]
    lines += [_audit_line(e) for e in entries] or ["Nothing recorded yet."]
    blocks = sections("\n".join(lines))
    if theirs is None:
        blocks.append(
            section(
                f":warning: Runner *{escape(runner)}* did not answer: only the decisions made in Slack are "
                "shown. Ask again soon for the runner's part."
            )
        )
    blocks.append(
        context(
            "Times in UTC. The runner's trail (runner.db) and the decisions made in Slack (bot.db, "
            "_in Slack_); `goaltender audit <goal>` on the runner's box prints its part in full."
        )
    )
    return payload(f"Audit trail of goal #{goal_id}: {len(entries)} entries", blocks, "audit trail")


def channel_audit(entries: list[SlackAuditEntry]) -> Payload:
    """`/goal audit`: what was decided in Slack in this channel (roles, refusals, held budgets)."""
    lines = ["*Decided in Slack in this channel* (newest last)"]
    lines += [_audit_line(e, in_channel=True) for e in entries] or ["Nothing recorded yet."]
    blocks = sections("\n".join(lines))
    blocks.append(
        context("Times in UTC. Reply `audit` in a goal's thread for its whole trail, the runner's too.")
    )
    return payload(f"{len(entries)} audit entries in this channel", blocks, "audit trail")


def home(user: str, mine: list[GoalLine], waiting: list[Waiting], now: datetime | None = None) -> dict:
    """The App Home tab: the user's goals and their state, and what waits for the user to decide."""
    now = now or utcnow()
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": "Goaltender"}},
        section(f"*Waiting for you* ({len(waiting)})"),
    ]
    if waiting:
        for item in waiting[:20]:
            label = f"#{item.goal_id}: {item.question}"
            linked = f"<{item.link}|{label}>" if item.link else label
            asked = format_duration((now - item.since).total_seconds())
            blocks.append(section(f"{EMOJI['approval_requested']} {linked} _(waiting {asked})_"))
    else:
        blocks.append(context("Nothing waits for your decision."))
    blocks += [{"type": "divider"}, section(f"*Your goals* ({len(mine)})")]
    if mine:
        blocks += [section(goal_line(line, now, owner=False)) for line in mine[:40]]
    else:
        blocks.append(
            context("You have no goals yet. Start one in a channel with `/goal <what to achieve>`.")
        )
    blocks.append(context(f"For {user_ref(user)} · updated {now:%H:%M} UTC · reopen this tab to refresh"))
    return {"type": "home", "blocks": blocks[:HOME_MAX_BLOCKS]}
