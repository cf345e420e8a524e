"""protocol/budget.py: stop rules read from words, explicit budgets, and the arithmetic."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from goaltender.protocol.budget import (
    DEFAULT_BLOCK,
    GoalTextError,
    apply_budget_change,
    check_new_experiment,
    experiment_timeout,
    explicit_budget,
    parse_duration,
    parse_goal_text,
    stop_status,
)
from goaltender.runner.report import goal_stop_status
from goaltender.storage.records import Budget, Goal

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5h", 18000),
        ("1h30m", 5400),
        ("90 s", 90),
        ("2.5 hours", 9000),
        ("3m", 180),
        ("1d", 86400),
        ("soon", None),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_goal_text_reads_every_phrase():
    spec = parse_goal_text(
        "train Qwen3-VL-2B to 90% exact accuracy with SFT, budget 5h, gpu-hours 8, max 20 experiments, "
        "30m each, with sweep"
    )
    assert spec.wall_seconds == 5 * 3600
    assert spec.compute_hours == 8
    assert spec.max_experiments == 20
    assert spec.experiment_timeout_s == 1800
    assert spec.target == pytest.approx(0.9)
    assert spec.agent == "sweep"
    assert spec.has_stop_rule


def test_the_reference_campaigns_goal():
    """`/goal train Qwen3-VL-2B on star count with SFT to 95% exact accuracy, budget 5h`: a target,
    a 5h deadline, no agent ("with SFT" is none) and no metric name: goals carry no metric until
    the first experiment's --metric sets it (the brief says exact_accuracy)."""
    spec = parse_goal_text("train Qwen3-VL-2B on star count with SFT to 95% exact accuracy, budget 5h")
    assert spec.target == pytest.approx(0.95)
    assert spec.wall_seconds == 5 * 3600 and spec.has_stop_rule
    assert (spec.agent, spec.max_experiments, spec.compute_hours) == (None, None, None)
    assert not hasattr(spec, "metric")
    budget = explicit_budget(spec, NOW, default_timeout_s=None)
    assert budget.deadline == NOW + timedelta(hours=5) and not budget.ask_to_continue


def test_no_stop_rule_means_baseline_plus_three_then_ask():
    spec = parse_goal_text("make star count better")
    assert not spec.has_stop_rule
    budget = explicit_budget(spec, NOW, default_timeout_s=600)
    assert budget.max_experiments == DEFAULT_BLOCK == 4
    assert budget.ask_to_continue
    assert budget.deadline is None and budget.experiment_timeout_s == 600
    check = check_new_experiment(budget, attempted=4, compute_used=0, now=NOW)
    assert not check.ok and check.needs_continue_approval and "4/4" in check.reason


def test_deadline_is_fixed_at_acceptance():
    budget = explicit_budget(parse_goal_text("x, budget 2h"), NOW, None)
    assert budget.deadline == NOW + timedelta(hours=2)
    assert not budget.ask_to_continue
    assert check_new_experiment(budget, 0, 0, NOW + timedelta(hours=1, minutes=59)).ok
    late = check_new_experiment(budget, 0, 0, NOW + timedelta(hours=2))
    assert not late.ok and "deadline" in late.reason


def test_count_is_attempted_not_successful():
    budget = Budget(max_experiments=3)
    # Three attempts — whether they crashed or not — use the budget up.
    assert check_new_experiment(budget, 2, 0, NOW).ok
    check = check_new_experiment(budget, 3, 0, NOW)
    assert not check.ok and not check.needs_continue_approval and "3/3 attempted" in check.reason


def test_compute_budget():
    budget = Budget(compute_hours=1.5)
    assert check_new_experiment(budget, 0, 1.49, NOW).ok
    assert not check_new_experiment(budget, 0, 1.5, NOW).ok


def test_experiment_timeout_is_the_tightest_limit():
    budget = Budget(deadline=NOW + timedelta(minutes=10), experiment_timeout_s=3600)
    assert experiment_timeout(budget, None, NOW) == 600  # time left
    assert experiment_timeout(budget, 120, NOW) == 120  # asked for less
    assert experiment_timeout(Budget(experiment_timeout_s=300), None, NOW) == 300
    assert experiment_timeout(Budget(), None, NOW) is None


def test_an_ended_goals_stop_status_is_as_it_ended():
    """Its time left does not run on after it, nor run out: a goal that finished with 10 minutes
    left says so hours later, not "stop condition met (deadline)"."""
    ended = NOW - timedelta(hours=3)
    goal = Goal(
        id=1,
        text="t",
        state="finished",
        budget=Budget(deadline=ended + timedelta(minutes=10)),
        workspace="/w",
        created_at=ended,
        ended_at=ended,
    )
    assert (
        goal_stop_status(goal, 2, 0, None, NOW, tokens_used=0)
        == "stop condition not yet met: 2 attempted, 10m00s left"
    )
    running = goal.model_copy(update={"state": "running", "ended_at": None})
    assert goal_stop_status(running, 2, 0, None, NOW, tokens_used=0).startswith(
        "stop condition met (deadline)"
    )


def test_stop_status_line():
    budget = Budget(max_experiments=24, deadline=NOW + timedelta(hours=6, minutes=12))
    assert stop_status(budget, 17, 0, NOW) == "stop condition not yet met: 17/24 attempted, 6h12m left"
    assert stop_status(budget, 24, 0, NOW).startswith("stop condition met (experiment count): 24/24")


def test_a_token_budget_is_part_of_the_stop_status():
    """Issue 36: a goal ended by its token budget said "stop condition not yet met"."""
    budget = Budget(max_experiments=8, max_tokens=20_000)
    assert stop_status(budget, 3, 0, NOW, tokens_used=12_345) == (
        "stop condition not yet met: 3/8 attempted, 12.3k/20k tokens"
    )
    assert stop_status(budget, 3, 0, NOW, tokens_used=20_400) == (
        "stop condition met (tokens): 3/8 attempted, 20.4k/20k tokens"
    )
    assert "tokens" not in stop_status(Budget(max_experiments=8), 3, 0, NOW, tokens_used=5_000)


def test_budget_changes():
    budget = Budget(
        deadline=NOW + timedelta(hours=1), wall_seconds=3600, max_experiments=4, ask_to_continue=True
    )
    new, said = apply_budget_change(budget, "budget +2h", NOW)
    assert new.deadline == NOW + timedelta(hours=3) and "deadline +2h00m" in said
    new, said = apply_budget_change(budget, "+5 experiments", NOW)
    assert new.max_experiments == 9 and not new.ask_to_continue
    new, said = apply_budget_change(budget, "max 10 experiments", NOW)
    assert new.max_experiments == 10
    new, said = apply_budget_change(budget, "please use gpu-hours 8", NOW)
    assert new.compute_hours == 8
    assert apply_budget_change(budget, "focus on the dense scenes", NOW) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("x, budget 0h", "`budget 0h`: a time budget must be at least 1s"),
        ("x, budget 0m", "leave it out for no time limit"),
        ("x within 0s", "`within 0s`"),
        ("x, budget 99999999h", "at most 365 days"),
        ("x, budget 400d", "at most 365 days"),
        ("x, max 0 experiments", "an experiment count must be from 1 to 10,000"),
        ("x, max 10001 experiments", "from 1 to 10,000"),
        ("x, max 99999999999999999999999999999 experiments", "from 1 to 10,000"),
        ("x, 0s each", "a per-experiment timeout"),
        ("x, timeout 0m", "a per-experiment timeout"),
        ("x, gpu-hours 0", "compute-hours must be more than 0"),
        ("x, 99999999 gpu-hours", "at most 100,000"),
        ("reach 101% accuracy", "a percentage target is at most 100%"),
        ("x, target " + "9" * 400, "a target is a value of the goal's metric"),
        # A minus was read as no limit at all: the goal ran without the one it was given.
        ("reach 90%, budget -2h", "`budget -2h`: a budget or limit is never negative"),
        ("x within - 30 min", "`within - 30 min`: a budget"),
        ("x, max -3 experiments", "`max -3 experiments`: a budget"),
        ("x, up to -2 runs", "`up to -2 runs`"),
        ("x, gpu-hours -8", "`gpu-hours -8`"),
        ("x, -8 gpu-hours", "`-8 gpu-hours`"),
        ("x, timeout -5m", "`timeout -5m`"),
        ("x, -10m each", "`-10m each`"),
        ("x, max -2M tokens", "`max -2M tokens`"),
        ("   ", "a goal needs words"),
    ],
)
def test_zero_and_absurd_limits_are_refused_saying_what_is_accepted(text, says):
    with pytest.raises(GoalTextError, match=re.escape(says)):
        parse_goal_text(text)


def test_a_minus_that_is_no_limits_is_words():
    spec = parse_goal_text("push the loss from 2 to -3 (lr 1e-3, steps -5 to 5, 2h-3h runs), budget 2h")
    assert spec.wall_seconds == 7200 and spec.max_experiments is None and spec.experiment_timeout_s is None


def test_a_negative_budget_change_is_refused_not_ignored():
    with pytest.raises(GoalTextError, match="give the new one: `budget 1h`"):
        apply_budget_change(Budget(max_experiments=4), "budget -1h", NOW)


def test_limits_at_their_bounds_are_accepted():
    spec = parse_goal_text("x to 100%, budget 365d, 1s each, gpu-hours 100000, max 10000 experiments")
    assert spec.wall_seconds == 365 * 86400 and spec.experiment_timeout_s == 1
    assert spec.compute_hours == 100_000 and spec.max_experiments == 10_000 and spec.target == 1.0
    assert parse_goal_text("x, target 25 BLEU").target == 25  # a metric's value, not a share


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("budget +0h", "`budget +0h`: an extension must be at least 1s"),
        ("+99999999h", "at most 365 days"),
        ("+365d", "the time budget would be"),  # on top of the hour it has
        ("+0 experiments", "more experiments must be from 1"),
        ("+9999 experiments", "the experiment count (10,003 in all)"),
        ("budget 0h", "a time budget"),
        ("max 0 experiments", "an experiment count"),
        ("gpu-hours 0", "compute-hours"),
    ],
)
def test_budget_changes_that_cannot_be_are_refused(change, says):
    budget = Budget(deadline=NOW + timedelta(hours=1), wall_seconds=3600, max_experiments=4)
    with pytest.raises(GoalTextError, match=re.escape(says)):
        apply_budget_change(budget, change, NOW)


def test_a_target_in_steering_words_is_no_budget_change():
    # Steering text is read for budget phrases only: a share over 100% there is not refused.
    assert apply_budget_change(Budget(), "push throughput to 150% of the baseline", NOW) is None
