"""The second sweep workload (environments/text_sentiment.py): its reviews, its command line, and
the sweep agent reaching a target on it through a real runner with one bold opening move."""

from __future__ import annotations

import subprocess
import sys

from helpers import events_until_report, submit
from hypothesis import given
from hypothesis import strategies as st

from goaltender.environments import text_sentiment as ts
from goaltender.storage.records import ExperimentFinished

COMMAND = [sys.executable, "-m", "goaltender.environments.text_sentiment"]


def polarity_read_off(text: str) -> int:
    """The label as a reader works it out: each clause's word, flipped by a negation in it."""
    total = 0
    for clause in text.split(", and "):
        words = clause.split()
        sign = 1 if words[-1] in ts.POSITIVE else -1
        assert words[-1] in ts.POSITIVE + ts.NEGATIVE
        total += -sign if any(w in ts.NEGATORS for w in words) else sign
    return int(total > 0)


@given(st.integers(min_value=0, max_value=10**7))
def test_every_review_is_labelled_as_a_reader_would_read_it(seed):
    text, label = ts.review(seed)
    assert label == polarity_read_off(text)
    assert ts.review(seed) == (text, label)  # a seed is one review, always


@given(st.text(max_size=200), st.integers(1, 3), st.sampled_from([256, 4096]))
def test_features_fall_in_their_buckets_whatever_the_text(text, ngrams, buckets):
    assert all(0 <= f < buckets for f in ts.features(text, ngrams, buckets))


def test_unigrams_cannot_read_negation_and_trigrams_can():
    plain = {"train_size": 2000, "buckets": 4096, "epochs": 10, "lr": 0.03}
    unigrams = ts.run({**plain, "ngrams": 1}, emit=lambda line: None)["accuracy"]
    trigrams = ts.run({**plain, "ngrams": 3}, emit=lambda line: None)["accuracy"]
    assert unigrams < 0.7 < 0.85 < trigrams


def test_the_command_line_prints_progress_then_the_summary_and_refuses_bad_knobs():
    done = subprocess.run(
        [*COMMAND, "--train-size", "300", "--ngrams", "2", "--epochs", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == lines[0].strip() and lines[0].startswith('{"step": 1, "train_loss": ')
    summary = dict(line.split(": ", 1) for line in lines if not line.startswith("{"))
    assert 0.0 <= float(summary["accuracy"]) <= 1.0 and summary["n_heldout"] == "1000"
    assert summary["ngrams"] == "2" and summary["train_size"] == "300"
    bad = subprocess.run([*COMMAND, "--epochs", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--epochs must be >= 1" in bad.stderr


async def test_the_sweep_agent_reaches_its_target_on_it_opening_with_a_stride(start_runner, connect):
    agent = [
        sys.executable,
        "-m",
        "goaltender.agents.sweep",
        "--task",
        "goaltender.environments.text_sentiment:task",
    ]
    runner = await start_runner(agents={"sweep": agent})
    client = await connect(runner)
    goal_id = await submit(client, "sentiment to 95% accuracy, max 8 experiments", agent="sweep")
    events = await events_until_report(client, goal_id, timeout=180)
    rows = [e.data.experiment for e in events if isinstance(e.data, ExperimentFinished)]
    assert rows[0].description.startswith("baseline") and rows[0].params == ts.BASELINE
    assert rows[1].description.startswith("together, each a step its believed way: train_size 250 → 500")
    assert max(row.metric_value or 0 for row in rows) >= 0.95
    assert "target 0.95 reached" in events[-1].data.text
