"""Runner events and goal status -> Slack Block Kit payloads (pure functions, no I/O).

Every function returns a payload for chat.postMessage / chat.update: ``{"text": fallback,
"blocks": [...]}``, within Slack's limits: section text <= 3,000 characters (longer text is split
over several sections), at most 50 blocks, and about 11,000 characters of block text in all (a
longer report is cut, with a note saying so). The facts shown (emoji, numbers, costs, budgets)
come from ``display.facts``, as the terminal's do; this module only lays them out as Block Kit.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from goaltender.display.facts import (
    EMOJI,
    STATE_EMOJI,
    BudgetBar,
    approval_verdict,
    budget_bars,
    budget_summary,
    crash_text,
    experiment_cost,
    folded_summary,
    folded_titles,
    format_bar,
    format_metric,
    format_params,
    goal_ended_before,
    interval_text,
    noise_mark,
    objective,
    reported_mark,
    state_label,
    stopped_by_person,
)
from goaltender.protocol.messages import GoalStatus, SummaryReply
from goaltender.runner.report import best_checkpoint, error_classes, fetch_summary
from goaltender.storage.records import (
    Approval,
    BudgetChanged,
    Experiment,
    ExperimentFinished,
    FinalReport,
    GoalStateChanged,
    HubFetched,
    InboxMessage,
    MilestoneReported,
    PostsFolded,
    StageChanged,
    utcnow,
)

Payload = dict[str, Any]

SECTION_MAX = 3000
MAX_BLOCKS = 50
MAX_TOTAL = 11_000  # Slack refuses messages whose blocks add up to ~13k characters
FALLBACK_MAX = 3000
CUT_NOTE_MAX = 200  # room for fit()'s "truncated here" note
APPROVE_REACTIONS = frozenset({"white_check_mark", "heavy_check_mark", "+1", "thumbsup"})
REJECT_REACTIONS = frozenset({"x", "-1", "thumbsdown"})
APPROVAL_HINT = "Or react on this message: :white_check_mark: / :+1: approves, :x: / :-1: rejects."


# ---- text helpers ----


def escape(text: str) -> str:
    """Escape the three characters mrkdwn treats as markup (&, <, >)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_date(when: datetime) -> str:
    """A moment as Slack shows it in each reader's own zone ("Dec 7 14:05"; "Today at 14:05"), with a
    UTC fallback for clients that cannot: `<!date^UNIX^{date_short_pretty} {time}|2026-12-07 14:05 UTC>`."""
    utc = when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    return f"<!date^{int(utc.timestamp())}^{{date_short_pretty}} {{time}}|{utc:%Y-%m-%d %H:%M} UTC>"


# A file system path (a runner's socket, a workspace): said to operators in logs, never to a channel.
_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)*[\w.@+-]+")


def no_paths(text: str) -> str:
    """`cannot connect to /run/goaltender/runner.sock: refused` -> `cannot connect to its socket: refused`."""
    return _PATH.sub("its socket" if ".sock" in text else "a path on the server", text)


# How people appear in what the runner records: `U123` (older records), `slack:U123` (what the bot
# sent before it sent Persons), `slack:U123 (Alice) via goaltender-bot (uid 0)` (the runner's audit
# form; older ones have no name). CLI operators are
# anything else ("alice via goaltender (uid 1000)"), shown as plain text.
_ACTOR = re.compile(r"(?:slack:)?([UW][A-Z0-9]{2,})(?:(?: \([^()]*\))? via [^\s()]+ \(uid \d+\))?")
# Where runner-written text names who acted: at its very start ("stopped by slack:U1 via … (uid 0):
# enough", "paused by U0BOB" in older records, "slack:U1: deadline +2h", "the goal ended: stopped by
# …"). Only there: what follows (a stop reason, an agent's output) may hold id-like words (UNET3,
# slack:U0DAN) that must not ping anyone. A bare id needs a digit, so that UPDATED stays a word.
_LEADING_ACTOR = re.compile(
    r"^((?:the goal ended: )?(?:(?:stopped|paused|resumed|approved|rejected) by )?)"
    r"(?:slack:([UW][A-Z0-9]{2,})|(?<= by )([UW](?=[A-Z0-9]*[0-9])[A-Z0-9]{4,}))"
    r"(?: via [^\s()]+ \(uid \d+\))?(?=$|[\s:;,.)])"
)
# A person as Slack sends them in what someone typed (`<@U123>`, `<@U123|ana>`).
_TYPED_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
# An actor as the bot and the runner write them anywhere in an audit detail ("request #1 by slack:U1").
_ACTOR_IN_TEXT = re.compile(r"\bslack:([UW][A-Z0-9]{2,})(?:(?: \([^()]*\))? via [^\s()]+ \(uid \d+\))?")


# The names the runner now records people by ("stopped by Alice"): Slack users the bot has looked
# up (bot/people.py), name -> id, so that Slack shows them as mentions again. A name two people
# share maps to None and stays plain text.
KNOWN_NAMES: dict[str, str | None] = {}
_LEADING_VERB = re.compile(r"^((?:the goal ended: )?(?:(?:stopped|paused|resumed|approved|rejected) by )?)")


def learn_name(name: str, user: str) -> None:
    """`name` is how the runner names Slack user `user` (from users.info)."""
    known = KNOWN_NAMES.get(name, user)
    KNOWN_NAMES[name] = user if known == user else None


def slack_user(who: str | None) -> str | None:
    """The Slack user id a recorded actor names (`U123`, `slack:U123`, `slack:U123 via … (uid N)`,
    or a name the bot looked up); None for anyone else (a CLI operator, the bot itself)."""
    match = _ACTOR.fullmatch((who or "").strip())
    return match.group(1) if match else KNOWN_NAMES.get((who or "").strip())


def _leading_name(escaped: str) -> str:
    """A known person's name where runner-written text names who acted ("stopped by Alice: …",
    "Alice: deadline +2h"), as a mention (the text is already escaped)."""
    head = _LEADING_VERB.match(escaped)
    start = head.end() if head else 0
    for name in sorted((n for n, u in KNOWN_NAMES.items() if u), key=len, reverse=True):
        said = escape(name)
        rest = escaped[start + len(said) :]
        if escaped.startswith(said, start) and (not rest or rest[0] in " :;,.)"):
            return f"{escaped[:start]}<@{KNOWN_NAMES[name]}>{rest}"
    return escaped


def user_ref(who: str | None) -> str:
    """A person as Slack shows them: a Slack user as a mention, anyone else as plain text."""
    if not who:
        return "someone"
    if user := slack_user(who):
        return f"<@{user}>"
    return escape(who)


def people(text: str, *, typed: bool = False) -> str:
    """Text the runner wrote ("stopped by slack:U123 via goaltender-bot (uid 0): enough"),
    mrkdwn-escaped, with the person it records as acting (at its start) as a mention.

    `typed`: text only people and the bot wrote (an audit detail: "'stop now, <@U2>': refused",
    "request #1 by slack:U1"), where every `slack:U…` and every @-mention a person typed is a
    mention. Never for what agents write: that is escape()d only, so nothing in it pings anyone."""
    if not typed:
        said, found = _LEADING_ACTOR.subn(lambda m: f"{m[1]}<@{m[2] or m[3]}>", escape(text), count=1)
        return said if found else _leading_name(said)
    parts = _TYPED_MENTION.split(text)
    # split() puts the mentioned ids at odd positions
    return "".join(
        f"<@{part}>" if i % 2 else _ACTOR_IN_TEXT.sub(r"<@\1>", escape(part)) for i, part in enumerate(parts)
    )


def _inline(text: str) -> str:
    text = re.sub(r"\*\*(.+?)\*\*", r"*\1*", text)
    text = re.sub(r"__(.+?)__", r"*\1*", text)
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"<\2|\1>", text)
    return text


def markdown_to_mrkdwn(md: str) -> str:
    """Markdown (as the runner writes reports) -> Slack mrkdwn: headings and **bold** become *bold*,
    [text](url) becomes <url|text>, tables and fenced code go into code blocks."""
    out: list[str] = []
    table: list[str] = []
    in_code = False

    def flush_table() -> None:
        if table:
            out.append("```\n" + "\n".join(table) + "\n```")
            table.clear()

    for raw in escape(md.replace("\r\n", "\n")).split("\n"):
        line = raw.rstrip()
        if line.strip().startswith("```"):
            flush_table()
            in_code = not in_code
            out.append("```")
            continue
        if in_code:
            out.append(line)
            continue
        if line.lstrip().startswith("|"):
            table.append(line.strip())
            continue
        flush_table()
        if m := re.match(r"^\s*#{1,6}\s+(.*)$", line):
            out.append(f"*{_inline(m.group(1)).strip('*')}*")
        elif m := re.match(r"^(\s*)[-*+]\s+(.*)$", line):
            out.append(f"{m.group(1)}• {_inline(m.group(2))}")
        else:
            out.append(_inline(line))
    flush_table()
    if in_code:
        out.append("```")
    return "\n".join(out).strip("\n")


def _split(text: str, limit: int = SECTION_MAX) -> list[str]:
    """Split text into pieces of at most `limit` characters, at line breaks where possible, keeping
    ``` code blocks balanced in every piece."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    in_code = False
    for line in text.split("\n"):
        while len(line) > limit - 10:  # a single overlong line: cut it hard
            head, line = line[: limit - 10], line[limit - 10 :]
            if current:
                pieces.append(_close("\n".join(current), in_code))
                current, size = (["```"] if in_code else []), (4 if in_code else 0)
            pieces.append(head)
        if size + len(line) + 1 > limit - 4 and current:
            pieces.append(_close("\n".join(current), in_code))
            current, size = (["```"] if in_code else []), (4 if in_code else 0)
        current.append(line)
        size += len(line) + 1
        if line.strip().startswith("```"):
            in_code = not in_code
    if current and "\n".join(current).strip() not in ("", "```"):
        pieces.append("\n".join(current))
    return [p for p in pieces if p.strip()]


def _close(text: str, in_code: bool) -> str:
    return text + "\n```" if in_code else text


def section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:SECTION_MAX] or " "}}


def sections(text: str) -> list[dict]:
    return [section(piece) for piece in _split(text)]


def context(text: str) -> dict:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:SECTION_MAX] or " "}]}


def _block_chars(block: dict) -> int:
    if "text" in block and isinstance(block["text"], dict):
        return len(block["text"].get("text", ""))
    return sum(len(el.get("text", "")) for el in block.get("elements", []) if isinstance(el, dict))


def fit(
    blocks: list[dict],
    what: str = "message",
    *,
    max_blocks: int = MAX_BLOCKS,
    max_chars: int = MAX_TOTAL,
    full: str = "`goaltender summary <goal>`",
) -> list[dict]:
    """At most `max_blocks` blocks and `max_chars` characters; anything cut is noted at the end
    (the note is one of the blocks), saying where the full text is (`full`)."""
    kept: list[dict] = []
    total = 0
    for i, block in enumerate(blocks):
        chars = _block_chars(block)
        if len(kept) >= max_blocks - 1 or total + chars > max_chars:
            cut = len(blocks) - i
            kept.append(
                context(
                    f":scissors: {what} truncated here ({cut} more part{'s' if cut != 1 else ''} not shown; "
                    f"the full text is on the runner: {full})"
                )
            )
            return kept
        kept.append(block)
        total += chars
    return kept


def payload(text: str, blocks: list[dict], what: str = "message") -> Payload:
    """`text` is the notification text, which Slack parses as it does blocks: mrkdwn built as the
    blocks are (escape() on what people and agents wrote, user_ref() / people() for people)."""
    return {"text": _cut(text, FALLBACK_MAX), "blocks": fit(blocks, what)}


def _cut(text: str, limit: int) -> str:
    """At most `limit` characters, never ending inside an entity (`&am`) or a mention (`<@U1`)."""
    if len(text) <= limit:
        return text
    return re.sub(r"(?:&[a-z]*|<[^>]*)$", "", text[: limit - 1]) + "…"


# ---- the status card ----


def _bar(bar: BudgetBar) -> str:
    if bar.fraction is None:
        return f"`{bar.label:<11}` {bar.used} _(no limit)_"
    over = " *over budget*" if bar.over else ""
    return f"`{bar.label:<11} {format_bar(bar.fraction)}` {bar.used}{bar.sep}{bar.total}{over}"


def _metric_text(e: Experiment) -> str:
    name = e.metric_name or "metric"
    how = f" _({reported_mark(e)})_" if reported_mark(e) else ""
    trust = f" [{escape(interval_text(e))}]" if interval_text(e) else ""
    noisy = " :warning: _within noise_" if noise_mark(e) else ""
    return f"{escape(name)} *{format_metric(name, e.metric_value)}*{how}{trust}{noisy}"


def status_card(
    status: GoalStatus,
    runner: str,
    now: datetime | None = None,
    *,
    runner_down: str | None = None,
    runner_gone: str | None = None,
) -> Payload:
    """The goal's root message: state, budget bars, best result, runner, agent, pending approvals.

    `runner_down` (why the runner is unreachable) adds a warning: the card shows the last status seen.
    `runner_gone` (why the runner no longer has the goal: bot/databases.py) says so, for good."""
    now = now or utcnow()
    goal = status.goal
    state = state_label(goal.state)
    emoji = STATE_EMOJI.get(goal.state, EMOJI["goal_accepted"])
    head = f"{emoji} *Goal #{goal.id}* · *{state}* · owner {user_ref(goal.owner)}"
    text_lines = escape(goal.text)
    if len(text_lines) > 1500:
        text_lines = text_lines[:1500] + " …"
    bars = [
        _bar(bar)
        for bar in budget_bars(
            goal,
            attempted=status.attempted,
            compute_hours_used=status.compute_hours_used,
            now=now,
            tokens_used=status.tokens_used,
        )
    ]
    best = status.best
    if best is not None and best.metric_value is not None:
        best_text = f"*best* #{best.index} {_metric_text(best)}"
    else:
        best_text = "*best* none yet"
    best_text += f" ({objective(goal, goal.metric or (best.metric_name if best else None))})"
    blocks = [section(f"{head}\n>{text_lines}"), section("\n".join(bars) + "\n" + best_text)]
    if runner_down is not None:
        blocks.append(
            section(
                f":warning: *runner {escape(runner)} is unreachable* ({escape(no_paths(runner_down)[:300])}). "
                "This card shows its last known state; nothing is lost, and the thread catches up "
                "when the runner is back."
            )
        )
    if runner_gone is not None:
        blocks.append(
            section(
                f":warning: *This goal is no longer on runner {escape(runner)}*: {escape(runner_gone[:300])}. "
                "This card shows its last known state; the thread hears nothing more of it."
            )
        )
    if status.running is not None:
        r = status.running
        params = f" `{escape(format_params(r.params, 300))}`" if r.params else ""
        if r.status == "queued":
            # "waiting for a GPU, 2 ahead": the box's fair queue (runner/slots.py)
            where = f" · _{escape(r.note or 'waiting for a slot')}_"
        else:
            where = f" · {escape(r.where)}"
        blocks.append(
            section(f"{EMOJI[r.status]} {r.status} #{r.index}: {escape(r.description[:500])}{params}{where}")
        )
    for approval in status.pending_approvals[:5]:
        blocks.append(
            section(
                f"{EMOJI['approval_requested']} waiting for approval #{approval.id}: {escape(approval.question[:500])}"
            )
        )
    facts = [f"runner *{escape(runner)}*", f"agent *{escape(goal.agent)}*"]
    if goal.stages:
        facts.append(f"stage {goal.stage + 1}/{len(goal.stages)} *{escape(goal.stage_name or '')}*")
    if goal.blocked:
        facts.append(f":no_entry: {escape(goal.blocked[:200])}")
    if goal.budget.deadline is not None and goal.active:
        facts.append(f"deadline {slack_date(goal.budget.deadline)}")
    if goal.end_reason:
        facts.append(f"ended: {people(goal.end_reason.splitlines()[0][:300])}")
    elif status.stop_status:
        facts.append(escape(status.stop_status[:300]))
    blocks.append(context(" · ".join(facts)))
    fallback = f"Goal #{goal.id} ({state}): {escape(goal.text[:200])}"
    return payload(fallback, blocks)


def queued_card(queue_id: int, text: str, owner: str, runner: str | None, why: str) -> Payload:
    """The root message of a goal waiting for a runner (no runner could take it when asked)."""
    where = f"runner *{escape(runner)}*" if runner else "a runner"
    body = escape(text)
    if len(body) > 1500:
        body = body[:1500] + " …"
    blocks = [
        section(f":hourglass: *Queued goal* (q{queue_id}) · owner {user_ref(owner)}\n>{body}"),
        context(
            f"Waiting for {where}: {escape(no_paths(why)[:300])}. It is submitted as soon as one is back."
        ),
    ]
    return payload(f"Queued goal (waiting for {escape(runner or 'a runner')}): {escape(text[:200])}", blocks)


def queued_started(queue_id: int, text: str, owner: str, runner: str, goal_id: int) -> Payload:
    blocks = [
        section(
            f":arrow_forward: *Queued goal* (q{queue_id}) · owner {user_ref(owner)}\n>{escape(text[:1500])}"
        ),
        context(f"Started as *goal #{goal_id}* on runner *{escape(runner)}*: follow its card below."),
    ]
    return payload(f"Queued goal started as goal #{goal_id} on {escape(runner)}", blocks)


def queued_refused(queue_id: int, text: str, owner: str, runner: str, why: str) -> Payload:
    blocks = [
        section(f":x: *Queued goal* (q{queue_id}) · owner {user_ref(owner)}\n>{escape(text[:1500])}"),
        context(f"Runner *{escape(runner)}* refused it: {escape(why[:500])}. Fix it and run `/goal` again."),
    ]
    return payload(f"Queued goal refused by {escape(runner)}: {escape(why[:200])}", blocks)


def queued_stopped(queue_id: int, text: str, owner: str, by: str) -> Payload:
    """A queued goal someone stopped before any runner took it: it is never submitted."""
    blocks = [
        section(f":stop_sign: *Queued goal* (q{queue_id}) · owner {user_ref(owner)}\n>{escape(text[:1500])}"),
        context(f"Stopped by {user_ref(by)} before it started: it is never submitted."),
    ]
    return payload(f"Queued goal stopped by {user_ref(by)} before it started", blocks)


# ---- digests ----


def digest(title: str, active: list[str], approvals: list[str], finished: list[str], footer: str) -> Payload:
    """A channel digest: active goals, pending approvals (linked), goals finished since the last one."""
    blocks = [section(f"{EMOJI['report']} *{escape(title)}*")]
    for heading, lines, empty in (
        ("Active goals", active, "none"),
        ("Waiting for approval", approvals, "nothing"),
        ("Finished since the last digest", finished, "none"),
    ):
        body = "\n".join(lines) if lines else f"_{empty}_"
        blocks.extend(sections(f"*{heading}*\n{body}"))
    blocks.append(context(footer))
    counts = f"{len(active)} active, {len(approvals)} waiting for approval, {len(finished)} finished"
    return payload(f"{escape(title)}: {counts}", blocks, "digest")


# ---- thread messages ----


def stage_changed(data: StageChanged) -> Payload:
    """A staged goal passed its gate: the next stage starts."""
    text = f"{EMOJI['goal_state']} *Stage {data.stage + 1}/{data.of}: {escape(data.name)}*"
    if data.reason:
        text += f" ({people(data.reason)})"
    return payload(f"Stage {data.stage + 1}/{data.of}: {escape(data.name)}", sections(text))


def milestone(data: MilestoneReported) -> Payload:
    """An agent's milestone. Its words are escaped only: an id-like word in them (a model named
    UNET3, or "Steer from slack:U1" echoing a steer) pings nobody."""
    blocks = sections(f"{EMOJI['milestone']} *{escape(data.title)}*")
    if data.text:
        blocks += sections(markdown_to_mrkdwn(data.text))
    return payload(f"Milestone: {escape(data.title)}", blocks)


def posts_folded(data: PostsFolded) -> Payload:
    """A goal's posts folded past its rate (runner/folding.py), as one post: how many, and their
    titles (escaped only, as a milestone's), as many as fit one section; it says when some do not."""
    summary = folded_summary(data)
    lines, cut = folded_titles(data, SECTION_MAX - CUT_NOTE_MAX, escape)
    where = (
        f"events {data.first_seq}–{data.last_seq}"
        if data.first_seq != data.last_seq
        else f"event {data.first_seq}"
    )
    note = (
        f"Posted faster than this goal's rate allows, so shown here as one post; each is whole in the "
        f"runner's event log ({where})." + (" Titles cut to fit Slack." if cut else "")
    )
    blocks = sections(f"{EMOJI['posts_folded']} *{summary}*")
    if lines:
        blocks += sections("\n".join(lines))
    return payload(summary.capitalize(), [*blocks, context(note)])


def experiment_finished(data: ExperimentFinished) -> Payload:
    """A ledger row: keep/discard/crash, the metric, params, cost and note."""
    e = data.experiment
    stopped = stopped_by_person(e)
    emoji = STATE_EMOJI["stopped"] if stopped else EMOJI.get(e.status, EMOJI["running"])
    word = "stopped" if stopped else e.status
    parts = [f"{emoji} *#{e.index} {word}*"]
    if e.metric_value is not None:
        parts.append(_metric_text(e) + (" :trophy: *best*" if data.new_best else ""))
    elif stopped:
        parts.append(f"by {people(e.note.removeprefix('ended with the goal: '))}" if e.note else "")
    elif e.status == "crash":
        parts.append(crash_text(e))
    if cost := experiment_cost(e):
        parts.append(" · ".join(cost))
    parts.append(f"_{escape(e.where)}_")
    lines = ["  ".join(parts), escape(e.description[:1000])]
    if e.params:
        lines.append(f"`{escape(format_params(e.params, 1000))}`")
    blocks = sections("\n".join(lines))
    if e.note and not stopped:
        note = e.note if len(e.note) <= 1500 else e.note[:700] + "\n…\n" + e.note[-700:]
        blocks.append(context(f"note: {escape(note)}"))
    metric = (
        f" {e.metric_name} {format_metric(e.metric_name, e.metric_value)}"
        if e.metric_value is not None
        else ""
    )
    return payload(f"#{e.index} {word}{escape(metric)}", blocks)


def _decide_buttons(block_id: str, value: str, approve: str = "approve", reject: str = "reject") -> dict:
    """An actions block: Approve (action id `approve`) and Reject (`reject`), both carrying `value`."""
    return {
        "type": "actions",
        "block_id": block_id,
        "elements": [
            {
                "type": "button",
                "action_id": action_id,
                "text": {"type": "plain_text", "text": label},
                "style": style,
                "value": value,
            }
            for action_id, label, style in ((approve, "Approve", "primary"), (reject, "Reject", "danger"))
        ],
    }


def approval_prompt(approval: Approval, runner: str) -> Payload:
    """The question, its detail, Approve / Reject buttons (value "<runner>:<approval id>").

    The question, the buttons and the reaction hint always fit: only the detail (a plan, a diff:
    up to 20,000 characters) is cut, saying so, to leave them room within Slack's limits."""
    question = section(
        _cut(f"{EMOJI['approval_requested']} *Approval needed:* {escape(approval.question)}", SECTION_MAX)
    )
    decide = [
        _decide_buttons(f"approval-{approval.id}", f"{runner}:{approval.id}"),
        context(f"approval #{approval.id} · {escape(approval.kind)} · {APPROVAL_HINT}"),
    ]
    detail = sections(markdown_to_mrkdwn(approval.detail)) if approval.detail else []
    room = MAX_TOTAL - sum(_block_chars(b) for b in [question, *decide]) - CUT_NOTE_MAX
    detail = fit(
        detail,
        "detail",
        max_blocks=MAX_BLOCKS - 1 - len(decide),
        max_chars=room,
        full=f"`goaltender events --goal {approval.goal_id}`",
    )
    return payload(f"Approval needed: {escape(approval.question)}", [question, *detail, *decide])


def approval_decided(approval: Approval) -> Payload:
    """What the approval prompt becomes once decided: the question, who decided, their comment."""
    emoji, word = approval_verdict(approval)
    verdict = f"{emoji} *{word}*"
    if approval.state in ("approved", "rejected"):
        verdict += f" by {user_ref(approval.decided_by)}"
    blocks = sections(f"~Approval needed:~ {escape(approval.question)}\n{verdict}")
    if approval.comment and not goal_ended_before(approval):
        blocks += sections(f"> {people(approval.comment)}")
    blocks.append(context(f"approval #{approval.id}"))
    plain = {"approved": "Approved", "rejected": "Rejected", "expired": "Expired"}.get(
        approval.state, "Pending"
    )
    if goal_ended_before(approval):
        plain = word
    by = f" by {user_ref(approval.decided_by)}" if approval.decided_by and approval.state != "expired" else ""
    return payload(f"{plain}{by}: {escape(approval.question)}", blocks)


def budget_prompt(request_id: int, goal_id: int, change: str, requested_by: str, why: str) -> Payload:
    """A budget increase over the channel's limit, for a second person to decide (buttons
    `budget_approve` / `budget_reject`, value the request id)."""
    asked = f"{user_ref(requested_by)} asks to change goal #{goal_id}'s budget: `{escape(change[:500])}`"
    blocks = sections(f"{EMOJI['approval_requested']} *Budget increase needs a second person:* {asked}")
    blocks.append(
        context(f"It {escape(why)}. Nothing changes until someone else who controls the goal approves.")
    )
    blocks.append(_decide_buttons(f"budget-{request_id}", str(request_id), "budget_approve", "budget_reject"))
    blocks.append(context(f"budget request #{request_id} · {APPROVAL_HINT}"))
    return payload(f"Budget increase needs a second person: {escape(change[:200])}", blocks)


def budget_decided(
    request_id: int,
    goal_id: int,
    change: str,
    requested_by: str,
    state: str,
    by: str | None,
    error: str | None,
) -> Payload:
    """What a budget prompt becomes once decided: approved (and applied), rejected, or refused by the runner."""
    asked = f"{user_ref(requested_by)} asked to change goal #{goal_id}'s budget: `{escape(change[:500])}`"
    if state == "approved":
        verdict = f":white_check_mark: *Approved* by {user_ref(by)}; the runner applied it."
    elif state == "rejected":
        verdict = f":x: *Rejected* by {user_ref(by)}; the budget is unchanged."
    else:
        verdict = f":warning: Approved by {user_ref(by)}, but the runner refused it: {people(error or 'no reason given')}"
    blocks = sections(f"~Budget increase needs a second person:~ {asked}\n{verdict}")
    blocks.append(context(f"budget request #{request_id}"))
    return payload(f"Budget request {state}: {escape(change[:200])}", blocks)


def steer_ack(message: InboxMessage) -> Payload:
    text = message.text if len(message.text) <= 500 else message.text[:500] + "…"
    return payload(
        f"Steer from {user_ref(message.author)}: {escape(text)}",
        [
            context(
                f"{EMOJI['steer']} steer from {user_ref(message.author)} delivered to the agent: “{escape(text)}”"
            )
        ],
    )


def budget_changed(data: BudgetChanged) -> Payload:
    reason = f": {people(data.reason)}" if data.reason else ""
    return payload(
        f"Budget changed{reason}",
        sections(
            f"{EMOJI['budget_changed']} *Budget changed*{reason}\nnow: {budget_summary(data.budget, slack_date)}"
        ),
    )


def state_changed(goal_id: int, data: GoalStateChanged) -> Payload | None:
    """A thread note for state changes people act on (pause, resume, failure); None otherwise."""
    if (
        data.state == "paused"
        or data.state == "failed"
        or (data.state == "running" and data.reason.startswith("resumed"))
    ):
        state = state_label(data.state)
        emoji = STATE_EMOJI.get(data.state, EMOJI["goal_state"])
        reason = f" ({people(data.reason)})" if data.reason else ""
        return payload(
            f"Goal #{goal_id} is now {state}", [section(f"{emoji} Goal #{goal_id} is now *{state}*{reason}")]
        )
    return None


LEDGER_LINES = 10  # ledger rows shown in the report; all of them are in the attached file


def final_report(
    data: FinalReport, goal_id: int | None = None, summary: SummaryReply | None = None
) -> Payload:
    """The report laid out for Slack: one header, the end reason, the facts as fields, the last
    rows of the ledger one line each (the whole ledger is attached as a file: ledger_file()), and
    the agent's own words. Without the runner's ledger (`summary` None: it did not answer), the
    runner's markdown report is shown as it is, under the same one header."""
    title = f"{EMOJI['report']} Final report" + (f" — goal #{goal_id}" if goal_id is not None else "")
    reason = people(data.end_reason)
    blocks: list[dict] = [{"type": "header", "text": {"type": "plain_text", "text": title[:150]}}]
    blocks += sections(f"*Ended:* {reason}")
    if summary is None:
        blocks += sections(_report_body(data))
        return payload(f"Final report: {reason}", blocks, what="report")
    goal = summary.status.goal
    best = summary.status.best or data.best
    facts = [
        f"*Best*\n#{best.index} {_metric_text(best)}"
        if best and best.metric_value is not None
        else "*Best*\nnone"
    ]
    if goal.target is not None:
        reached = (
            best is not None
            and best.metric_value is not None
            and (
                best.metric_value >= goal.target
                if goal.direction == "maximize"
                else best.metric_value <= goal.target
            )
        )
        facts.append(
            f"*Target*\n{objective(goal, goal.metric).split(', target ')[-1]} — {'reached' if reached else 'not reached'}"
        )
    finished = [e for e in summary.ledger if e.finished]
    tally = Counter("stopped" if stopped_by_person(e) else e.status for e in finished)
    facts.append(
        f"*Experiments*\n{len(finished)}"
        + (f" ({', '.join(f'{n} {k}' for k, n in tally.most_common())})" if tally else "")
    )
    facts.append(f"*Compute*\n{summary.status.compute_hours_used:.4g} compute-h")
    if best is not None and best.params:
        facts.append(f"*Best config*\n`{escape(format_params(best.params, 300))}`")
    if best is not None:
        facts.append(f"*Best run*\n{escape(best.description[:300])}")
        if (checkpoint := best_checkpoint(best)) is not None:
            facts.append(f"*Best checkpoint*\n{escape(checkpoint[:500])}")
        if errors := error_classes(best):
            facts.append(f"*Errors of the best*\n{escape(errors[:500])}")
    blocks.append({"type": "section", "fields": [{"type": "mrkdwn", "text": f[:2000]} for f in facts]})
    if finished:
        shown = finished[-LEDGER_LINES:]
        more = len(finished) - len(shown)
        lines = [_ledger_line(e) for e in shown]
        head = "*Ledger*" + (f" (the last {len(shown)} of {len(finished)})" if more else "")
        blocks += sections(head + "\n" + "\n".join(lines))
        blocks.append(context(f"The whole ledger ({len(finished)} rows) is attached below as a CSV file."))
    if words := _agent_words(data.text):
        blocks += sections("*From the agent*\n" + markdown_to_mrkdwn(words))
    return payload(f"Final report: {reason}", blocks, what="report")


def _ledger_line(e: Experiment) -> str:
    """`✅ #3 keep · exact_accuracy 45.3% · 4.1s — wider model`: one ledger row, short."""
    stopped = stopped_by_person(e)
    emoji = STATE_EMOJI["stopped"] if stopped else EMOJI.get(e.status, "•")
    word = "stopped by a person" if stopped else e.status
    parts = [f"{emoji} #{e.index} {word}"]
    if e.metric_value is not None:
        parts.append(f"{escape(e.metric_name or 'metric')} {format_metric(e.metric_name, e.metric_value)}")
    elif e.status == "crash" and not stopped:
        parts.append(crash_text(e))
    if cost := experiment_cost(e):
        parts.append(cost[0])
    what = e.description if len(e.description) <= 120 else e.description[:119].rstrip() + "…"
    return " · ".join(parts) + f" — {escape(what)}"


def _agent_words(text: str) -> str:
    """What the agent wrote in its report (the runner's report's `## From the agent` part)."""
    _, found, words = text.partition("## From the agent")
    return words.strip() if found else ""


def ledger_file(goal_id: int, ledger: list[Experiment]) -> dict[str, str]:
    """The whole ledger as a CSV file for files_upload_v2's `file_uploads`: one row a run."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["#", "status", "metric", "value", "verified", "wall_s", "compute_h", "config", "description", "note"]
    )
    for e in ledger:
        writer.writerow(
            [
                e.index,
                "stopped" if stopped_by_person(e) else e.status,
                e.metric_name or "",
                "" if e.metric_value is None else f"{e.metric_value:.6g}",
                "yes" if e.verified else "no",
                "" if e.wall_seconds is None else f"{e.wall_seconds:.1f}",
                "" if e.compute_hours is None else f"{e.compute_hours:.6f}",
                format_params(e.params),
                e.description,
                e.note or "",
            ]
        )
    name = f"goal-{goal_id}-ledger.csv"
    return {"content": out.getvalue(), "filename": name, "title": f"Goal #{goal_id} ledger (all runs)"}


def _report_body(data: FinalReport) -> str:
    """The runner's report, escaped only (the agent's words are in it), without its own heading
    (it repeats the end reason the message says above it)."""
    body = markdown_to_mrkdwn(data.text)
    heading, newline, rest = body.partition("\n")
    return rest.strip("\n") if heading.startswith("*Goal #") and newline else body


def hub_fetched(data: HubFetched) -> Payload:
    """A model or data set the agent fetched from the hub, as recorded: repo, commit, size."""
    text = fetch_summary(data.fetch, short_commit=True)
    return payload(f"Fetched {escape(text)}", [context(f"{EMOJI['hub_fetched']} fetched {escape(text)}")])


def notice(text: str) -> Payload:
    """A plain bot line in a thread (command answers, errors); `text` is mrkdwn, already escaped."""
    return payload(text, sections(text))


def status_summary(status: GoalStatus, runner: str) -> Payload:
    """`status` in a thread: the card's content posted now, as a reply."""
    card = status_card(status, runner)
    return {"text": f"Status now: {card['text']}", "blocks": card["blocks"]}
