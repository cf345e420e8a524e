"""Runner events and goal status -> Slack Block Kit payloads (pure functions, no I/O).

Every function returns a payload for chat.postMessage / chat.update: ``{"text": fallback,
"blocks": [...]}``, within Slack's limits (bot/mrkdwn.py: escaping, people, Markdown, sections
split and blocks cut to fit, with a note saying so). The facts shown (emoji, numbers, costs, budgets)
come from ``display.facts``, as the terminal's do; this module only lays them out as Block Kit.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from datetime import datetime

from goaltender.bot.mrkdwn import (
    MAX_BLOCKS,
    MAX_TOTAL,
    SECTION_MAX,
    Payload,
    block_chars,
    context,
    cut,
    escape,
    fit,
    markdown_to_mrkdwn,
    no_paths,
    payload,
    people,
    section,
    sections,
    slack_date,
    user_ref,
)
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

CUT_NOTE_MAX = 200  # room for fit()'s "truncated here" note
APPROVE_REACTIONS = frozenset({"white_check_mark", "heavy_check_mark", "+1", "thumbsup"})
REJECT_REACTIONS = frozenset({"x", "-1", "thumbsdown"})
APPROVAL_HINT = "Or react on this message: :white_check_mark: / :+1: approves, :x: / :-1: rejects."


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
    lines, some_cut = folded_titles(data, SECTION_MAX - CUT_NOTE_MAX, escape)
    where = (
        f"events {data.first_seq}–{data.last_seq}"
        if data.first_seq != data.last_seq
        else f"event {data.first_seq}"
    )
    note = (
        f"Posted faster than this goal's rate allows, so shown here as one post; each is whole in the "
        f"runner's event log ({where})." + (" Titles cut to fit Slack." if some_cut else "")
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
        cut(f"{EMOJI['approval_requested']} *Approval needed:* {escape(approval.question)}", SECTION_MAX)
    )
    decide = [
        _decide_buttons(f"approval-{approval.id}", f"{runner}:{approval.id}"),
        context(f"approval #{approval.id} · {escape(approval.kind)} · {APPROVAL_HINT}"),
    ]
    detail = sections(markdown_to_mrkdwn(approval.detail)) if approval.detail else []
    room = MAX_TOTAL - sum(block_chars(b) for b in [question, *decide]) - CUT_NOTE_MAX
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
