"""What redaction adds to every message the runner sends, against encoding the message.

Every line `_Connection.send` writes is encoded (pydantic -> JSON) and then passed through the
runner's Redactor. The redactor here knows what a runner on a busy box would: eight secret values
(the bot's and the runner's tokens, keys, a password, a configured file) and every token shape. Each
figure is the median cost per message over a campaign-like mix of events (milestones, experiments
started and finished with their ledger rows, metric points, approvals) against the median cost of
encoding the same message, measured in the same run:

- clean: a message with no secret (the common case; it passes through byte-identical);
- leaked: the same message with a secret in its text (decoded, redacted, encoded again).

    python benchmarks/bench_redact.py [--n 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

from goaltender.protocol import messages as p
from goaltender.runner.secrets import Redactor
from goaltender.storage.records import (
    Approval,
    ApprovalRequested,
    Event,
    EventData,
    Experiment,
    ExperimentFinished,
    ExperimentStarted,
    MetricPoint,
    MetricsLogged,
    MilestoneReported,
    utcnow,
)

SECRETS = [
    ("SLACK_BOT_TOKEN", "xoxb-2048-7311-5E0aBcDeFgHiJkLmNoPqRsTu"),
    ("SLACK_APP_TOKEN", "xapp-1-A07311-5123456789-0a1b2c3d4e5f67890a1b2c3d4e5f6789"),
    ("OPENAI_API_KEY", "sk-proj-" + "Zx81_Qw-" * 20),
    ("HF_TOKEN", "hf_KpLmNoQrStUvWxYzAbCdEfGhIjKl012345"),
    ("WANDB_API_KEY", "0f1e2d3c4b5a69788796a5b4c3d2e1f001234567"),
    ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("PGPASSWORD", "correct horse battery staple"),
    ("service.token", "svc-5c1e8d0f-77aa-4b2e-9d1c-0e6b2f3a4c5d"),
]


def experiment(index: int, note: str = "") -> Experiment:
    now = utcnow()
    return Experiment(
        id=index,
        goal_id=1,
        index=index,
        description=f"lr {3e-4 * index:.1e}: does a larger step converge faster? {note}",
        command=["python", "train.py", "--lr", f"{3e-4 * index}", "--hidden", "64"],
        params={"lr": 3e-4 * index, "hidden": 64, "iters": 40, "train_size": 4000},
        status="keep",
        metric_name="exact_accuracy",
        metric_value=0.9 + index / 1000,
        metrics={"exact_accuracy": 0.9 + index / 1000, "reward": 0.95, "loss": 0.12},
        started_at=now,
        ended_at=now + timedelta(seconds=4),
        wall_seconds=4.1,
        cpu_seconds=7.9,
        compute_hours=0.002,
        peak_rss_mb=210.0,
        exit_code=0,
        log_path=f"/big-disk/goaltender/workspaces/goal-1/experiments/{index:03d}/run.log",
    )


def campaign(note: str = "") -> list[bytes]:
    """One campaign's worth of encoded events; `note` is put into every free-text field."""
    data: list[EventData] = []
    for i in range(1, 11):
        data.append(
            MilestoneReported(title=f"Run {i}: trying lr {3e-4 * i:.1e}", text=f"baseline was 0.90 {note}")
        )
        data.append(ExperimentStarted(experiment=experiment(i, note)))
        data.append(
            MetricsLogged(
                experiment_id=i, points=[MetricPoint(name="loss", value=0.5, step=s) for s in range(5)]
            )
        )
        data.append(ExperimentFinished(experiment=experiment(i, note), new_best=i % 3 == 0))
    now = utcnow()
    approval = Approval(
        id=1, goal_id=1, question=f"Run the 8-GPU sweep? {note}", detail="~6 GPU-hours", expires_at=now
    )
    data.append(ApprovalRequested(approval=approval))
    return [
        p.encode(p.EventMessage(event=Event(seq=i, goal_id=1, ts=now, data=d))) for i, d in enumerate(data)
    ]


def median_cost(work: Callable[[], object], repeat: int) -> float:
    """Median seconds of one call, over `repeat` timed batches of 20 calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(20):
            work()
        samples.append((time.perf_counter() - start) / 20)
    return statistics.median(samples)


def main(n: int) -> None:
    redactor = Redactor(SECRETS)
    clean, leaked = campaign(), campaign(f"(debug: HF_TOKEN={SECRETS[3][1]})")
    messages = [p.parse_reply(line) for line in clean]
    assert all(redactor.redact_line(line) is line for line in clean)
    assert all(SECRETS[3][1].encode() not in redactor.redact_line(line) for line in leaked)
    repeat = max(1, n // (20 * len(clean)))
    encode = sum(median_cost(lambda m=m: p.encode(m), repeat) for m in messages) / len(messages)
    rows = []
    for name, lines in (("clean", clean), ("leaked", leaked)):
        cost = sum(median_cost(lambda line=line: redactor.redact_line(line), repeat) for line in lines) / len(
            lines
        )
        rows.append((name, cost))
    size = sum(map(len, clean)) / len(clean)
    print(f"redaction per message, {len(SECRETS)} secrets + token shapes, {size:.0f}-byte lines on average")
    print(f"{'figure':44} {'redact (us)':>12} {'encode (us)':>12} {'ratio':>7}")
    for name, cost in rows:
        print(f"{f'{name} message':44} {cost * 1e6:12.2f} {encode * 1e6:12.2f} {cost / encode:7.2f}")
    print("baseline: p.encode(message), the JSON encode every message already pays")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    main(parser.parse_args().n)
