from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest

from goaltender.display.facts import format_bar, format_duration, format_metric, format_params
from goaltender.display.terminal import ConsoleThread
from goaltender.protocol import messages as p
from goaltender.storage.records import (
    Approval,
    ApprovalDecided,
    ApprovalRequested,
    Budget,
    BudgetChanged,
    Event,
    Experiment,
    ExperimentFinished,
    ExperimentStarted,
    FinalReport,
    Goal,
    GoalAccepted,
    GoalStateChanged,
    InboxMessage,
    MetricPoint,
    MetricsLogged,
    MilestoneReported,
    SteerReceived,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
BUDGET = Budget(wall_seconds=180, max_experiments=8, compute_hours=0.5, experiment_timeout_s=60)


def goal(**kw) -> Goal:
    base = {
        "id": 1,
        "text": "Reach 90% exact accuracy on star-count",
        "owner": "alice",
        "agent": "sweep",
        "state": "running",
        "budget": BUDGET,
        "metric": "exact_accuracy",
        "target": 0.9,
        "accepted_at": T0,
    }
    base.update(kw)
    return Goal(**base)


def experiment(index: int = 3, status: str = "keep", value: float | None = 0.875, **kw) -> Experiment:
    base = {
        "id": index,
        "goal_id": 1,
        "index": index,
        "description": "bigger training set",
        "command": ["python", "train.py", "--train-size", "2048"],
        "params": {"train_size": 2048, "hidden": 64},
        "status": status,
        "metric_name": "exact_accuracy",
        "metric_value": value,
        "wall_seconds": 14.2,
        "cpu_seconds": 14.4,
        "compute_hours": 0.004,
        "peak_rss_mb": 312.0,
        "verified": True,  # measured by the runner's eval command
    }
    base.update(kw)
    return Experiment(**base)


def approval(**kw) -> Approval:
    base = {
        "id": 7,
        "goal_id": 1,
        "kind": "continue",
        "question": "Baseline + 3 done. Keep going?",
        "detail": "Remaining: 5 experiments, 1m28s.",
        "expires_at": T0 + timedelta(minutes=10),
    }
    base.update(kw)
    return Approval(**base)


def event(data, seq: int = 1) -> Event:
    return Event(seq=seq, goal_id=1, ts=T0 + timedelta(seconds=seq), data=data)


ALL_EVENTS = [
    GoalAccepted(goal=goal(state="accepted")),
    GoalStateChanged(state="running", reason="agent started"),
    MilestoneReported(title="Baseline done", text="baseline exact_accuracy 62.5%"),
    MetricsLogged(experiment_id=3, points=[MetricPoint(name="loss", value=0.5, step=1)]),
    ExperimentStarted(experiment=experiment(status="running", value=None)),
    ExperimentFinished(experiment=experiment(), new_best=True),
    ExperimentFinished(experiment=experiment(4, "discard", 0.8125)),
    ExperimentFinished(experiment=experiment(5, "crash", None, exit_code=1, note="CUDA out of memory")),
    ApprovalRequested(approval=approval()),
    ApprovalDecided(
        approval=approval(state="approved", decided_by="alice", comment="go ahead", decided_at=T0)
    ),
    ApprovalDecided(approval=approval(state="rejected", decided_by="bob", comment="too costly")),
    SteerReceived(message=InboxMessage(id=1, goal_id=1, author="carol", text="try hidden=128 too")),
    BudgetChanged(budget=BUDGET.model_copy(update={"max_experiments": 12}), reason="approved 4 more"),
    FinalReport(
        end_reason="target reached",
        text="# Report\n\n| # | status | exact_accuracy |\n|---|---|---|\n| 3 | keep | 87.5% |\n",
        best=experiment(),
    ),
]


def render(data, **kw) -> str:
    return ConsoleThread(stream=io.StringIO(), color=False, **kw).render(event(data))


# ---- helpers ----


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0.0s"),
        (14.2, "14.2s"),
        (59.99, "1m00s"),
        (92, "1m32s"),
        (180, "3m00s"),
        (3599.4, "59m59s"),
        (3600, "1h00m"),
        (2 * 3600 + 5 * 60 + 10, "2h05m"),
        (27 * 3600, "1d03h"),
        (-92, "-1m32s"),
    ],
)
def test_format_duration(seconds: float, expected: str) -> None:
    assert format_duration(seconds) == expected


def test_format_metric() -> None:
    assert format_metric("exact_accuracy", 0.875) == "87.5%"
    assert format_metric("val_acc", 0.5) == "50.0%"
    assert format_metric("accuracy", 87.5) == "87.5%"  # already a percentage
    assert format_metric("val_loss", 0.123456) == "0.1235"
    assert format_metric("reward", 1234.5678) == "1235"
    assert format_metric("exact_accuracy", None) == "—"
    assert format_metric(None, 2.0) == "2"


def test_format_params_truncates() -> None:
    params = {"train_size": 2048, "hidden": 64, "lr": 0.001, "dropout": 0.1}
    assert format_params(params) == "train_size=2048 hidden=64 lr=0.001 dropout=0.1"
    cut = format_params(params, max_len=30)
    assert len(cut) <= 30
    assert cut.endswith(" …")
    assert cut.startswith("train_size=2048")


@pytest.mark.parametrize(
    ("fraction", "bar"),
    [
        (0.0, "[----------]"),
        (92 / 180, "[#####-----]"),
        (3 / 8, "[###-------]"),
        (0.3, "[###-------]"),
        (0.7, "[#######---]"),
        (1.0, "[##########]"),
        (1.7, "[##########]"),
        (-1, "[----------]"),
    ],
)
def test_format_bar(fraction: float, bar: str) -> None:
    assert format_bar(fraction) == bar


# ---- events ----


def test_goal_accepted() -> None:
    text = render(ALL_EVENTS[0])
    assert "🎯" in text
    assert "goaltender" in text
    assert "Goal #1 accepted" in text
    assert "Reach 90% exact accuracy on star-count" in text
    assert "owner: alice" in text and "agent: sweep" in text
    assert "target 90.0%" in text
    assert "3m00s" in text and "≤8 experiments" in text and "0.5 compute-h" in text


def test_state_changed() -> None:
    text = render(GoalStateChanged(state="running", reason="agent started"))
    assert "▶️" in text and "running" in text and "agent started" in text
    text = render(GoalStateChanged(state="waiting_for_approval"))
    assert "waiting for approval" in text


def test_milestone() -> None:
    text = render(ALL_EVENTS[2])
    assert "🏁" in text and "Baseline done" in text and "62.5%" in text


def test_long_milestone_title_wraps() -> None:
    title = "A very long milestone title " * 8
    text = render(MilestoneReported(title=title.strip(), text="body"))
    assert all(len(line) <= 100 for line in text.splitlines())
    assert " ".join(text.split()).count("A very long milestone title") == 8


def test_metrics_not_shown() -> None:
    stream = io.StringIO()
    thread = ConsoleThread(stream=stream, color=False)
    assert thread.render(event(ALL_EVENTS[3])) == ""
    assert thread.show(event(ALL_EVENTS[3])) == ""
    assert stream.getvalue() == ""


def test_experiment_started() -> None:
    text = render(ALL_EVENTS[4])
    assert "🧪" in text and "#3 started" in text
    assert "train_size=2048 hidden=64" in text
    assert "bigger training set" in text
    assert "$ python train.py --train-size 2048" in text


def test_experiment_keep_row() -> None:
    text = render(ALL_EVENTS[5])
    first = text.splitlines()[0]
    assert "✅" in first
    assert "#3 keep" in first
    assert "exact_accuracy 87.5% (best)" in first
    assert "train_size=2048 hidden=64" in text  # in the header when they fit, else below it
    assert "14.2s" in first
    assert "0.004 compute-h" in first  # what the budget charges, as in Slack
    assert "bigger training set" in text
    assert len(first) <= 100


def test_experiment_discard_and_crash_rows() -> None:
    text = render(ALL_EVENTS[6])
    assert "➖" in text and "#4 discard" in text and "81.2%" in text and "(best)" not in text
    text = render(ALL_EVENTS[7])
    assert "💥" in text and "#5 crash" in text and "exit 1" in text
    assert "CUDA out of memory" in text


def test_experiment_row_long_params_go_to_body() -> None:
    params = {f"knob_{i}": i * 1000 for i in range(20)}
    text = render(ExperimentFinished(experiment=experiment(params=params)))
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert "…" in lines[0]
    assert "knob_19=19000" in text  # the full list is in the body
    assert any(line.strip().startswith("params:") for line in lines[1:])


def test_approval_requested() -> None:
    text = render(ALL_EVENTS[8])
    assert "🙋" in text
    assert "Baseline + 3 done. Keep going?" in text
    assert "Remaining: 5 experiments, 1m28s." in text
    assert "#7" in text
    assert "approve" in text and "reject" in text
    text = render(ALL_EVENTS[8], approval_hint="type `approve {id}`")
    assert "type `approve 7`" in text


def test_approval_decided() -> None:
    text = render(ALL_EVENTS[9])
    assert "👍" in text and "Approved by alice" in text and "go ahead" in text and "#7" in text
    text = render(ALL_EVENTS[10])
    assert "👎" in text and "Rejected by bob" in text and "too costly" in text
    text = render(ApprovalDecided(approval=approval(state="expired")))
    assert "Expired" in text


def test_steer() -> None:
    text = render(ALL_EVENTS[11])
    assert "💬" in text and "carol" in text and "try hidden=128 too" in text


def test_budget_changed() -> None:
    text = render(ALL_EVENTS[12])
    assert "📐" in text and "approved 4 more" in text and "≤12 experiments" in text


def test_final_report_text_as_is() -> None:
    report = ALL_EVENTS[13]
    text = render(report)
    assert "📋" in text and "target reached" in text
    assert report.text.rstrip("\n") in text  # the markdown table, untouched
    assert "#3 exact_accuracy 87.5%" in text


def test_no_ansi_without_color_and_lines_fit() -> None:
    thread = ConsoleThread(stream=io.StringIO(), color=False)
    for i, data in enumerate(ALL_EVENTS):
        text = thread.render(event(data, seq=i))
        assert "\x1b" not in text
        for line in text.splitlines():
            assert len(line) <= 100, line


def test_user_text_cannot_inject_escapes() -> None:
    msg = InboxMessage(id=1, goal_id=1, author="eve", text="\x1b[31mred\x1b[0m")
    text = render(SteerReceived(message=msg))
    assert "\x1b" not in text and "red" in text


def test_color_when_enabled() -> None:
    thread = ConsoleThread(stream=io.StringIO(), color=True)
    text = thread.render(event(ALL_EVENTS[5]))
    assert "\x1b[" in text
    assert "87.5%" in text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_color_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert ConsoleThread(stream=io.StringIO()).color is False
    assert ConsoleThread(stream=_Tty()).color is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert ConsoleThread(stream=_Tty()).color is False


def test_show_prints_and_flushes() -> None:
    stream = io.StringIO()
    thread = ConsoleThread(stream=stream, color=False)
    for i, data in enumerate(ALL_EVENTS):
        thread.show(event(data, seq=i))
    out = stream.getvalue()
    assert out.count("goaltender") >= len(ALL_EVENTS) - 1
    assert "#3 keep" in out and "Approved by alice" in out
    assert "\n\n" in out  # messages are separate paragraphs


def test_default_stream_is_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    ConsoleThread(color=False).show(event(ALL_EVENTS[11]))
    assert "try hidden=128 too" in capsys.readouterr().out


# ---- the status card ----


def status(g: Goal, *, attempted: int = 0, compute_hours_used: float = 0.0, **kw) -> p.GoalStatus:
    """The runner's status of `g`, as the demo's card is drawn from."""
    return p.GoalStatus(
        goal=g, attempted=attempted, compute_hours_used=compute_hours_used, stop_status="", **kw
    )


def test_render_card_bars() -> None:
    thread = ConsoleThread(stream=io.StringIO(), color=False)
    text = thread.render_card(
        status(goal(), attempted=3, compute_hours_used=0.125, best=experiment()),
        now=T0 + timedelta(seconds=92),
    )
    assert "\x1b" not in text
    assert "Goal #1" in text and "running" in text and "agent: sweep" in text
    assert "time         [#####-----] 1m32s / 3m00s" in text
    assert "experiments  [###-------] 3/8" in text
    assert "compute-h    [##--------] 0.125 / 0.5" in text
    assert "#3 exact_accuracy 87.5%" in text
    assert "target 90.0%" in text


def test_render_card_no_limits_over_budget_and_no_best() -> None:
    thread = ConsoleThread(stream=io.StringIO(), color=False)
    g = goal(budget=Budget(max_experiments=4), target=None)
    text = thread.render_card(status(g, attempted=5), now=T0 + timedelta(seconds=30))
    assert "30.0s (no limit)" in text
    assert "[##########] 5/4 over budget" in text
    assert "none yet" in text


def test_render_card_deadline_and_ended() -> None:
    thread = ConsoleThread(stream=io.StringIO(), color=False)
    g = goal(
        budget=Budget(deadline=T0 + timedelta(minutes=10)),
        state="finished",
        ended_at=T0 + timedelta(minutes=5),
        end_reason="target reached",
    )
    text = thread.render_card(status(g, attempted=2), now=T0 + timedelta(hours=1))
    assert "[#####-----] 5m00s / 10m00s" in text
    assert "finished" in text and "target reached" in text


def test_render_card_shows_the_tokens_the_agent_spent() -> None:
    """Issue 36: the tokens bar read 0 on every card, whatever the agent had spent."""
    thread = ConsoleThread(stream=io.StringIO(), color=False)
    g = goal(budget=Budget(max_tokens=20_000), state="finished", end_reason="token budget used")
    text = thread.render_card(status(g, tokens_used=12_345), now=T0)
    assert "tokens       [######----] 12.3k/20k" in text
    # No token budget: the bar is there once the agent has spent any, without a limit.
    text = thread.render_card(status(goal(), tokens_used=812), now=T0)
    assert "tokens       812 (no limit)" in text


def test_card_prints() -> None:
    stream = io.StringIO()
    thread = ConsoleThread(stream=stream, color=False)
    thread.write(thread.render_card(status(goal()), now=T0))
    assert "experiments  [----------] 0/8" in stream.getvalue()


def test_reported_metric_is_marked():
    text = render(ExperimentFinished(experiment=experiment(verified=False)))
    assert "exact_accuracy 87.5% reported" in text


@pytest.mark.parametrize(
    "row",
    [
        experiment(compute_hours=0.25, cpu_seconds=3.0),  # a GPU run: GPU-hours differ from CPU time
        experiment(compute_hours=None, cpu_seconds=36.0),
        experiment(status="crash", value=None, exit_code=137),
        experiment(verified=False),
    ],
)
def test_terminal_and_slack_show_the_same_facts(row: Experiment) -> None:
    """One set of facts, two renderers: a ledger row's metric, costs and crash reason agree."""
    from goaltender.bot import render as slack
    from goaltender.display.facts import crash_text, experiment_cost, reported_mark

    data = ExperimentFinished(experiment=row, new_best=False)
    terminal = render(data).splitlines()[0]
    posted = slack.experiment_finished(data)["blocks"][0]["text"]["text"]
    for fact in experiment_cost(row):
        assert fact in terminal and fact in posted
    if row.status == "crash":
        assert crash_text(row) in terminal and crash_text(row) in posted
    else:
        value = format_metric(row.metric_name, row.metric_value)
        assert value in terminal and value in posted
        assert (reported_mark(row) in terminal) and (reported_mark(row) in posted)
