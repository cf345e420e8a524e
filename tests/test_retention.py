"""Checkpoint retention (runner/retention.py) on real directories: which checkpoints it keeps (best by
training_info.json or the ledger, either direction; the latest; running and queued experiments'),
that it frees exactly what it removes, and that links the agent plants never lead it outside the
workspace. A property test over random goals checks the rules hold together."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goaltender.runner.retention import prune_checkpoints
from goaltender.storage.records import Experiment

WEIGHTS = 4096  # bytes of each checkpoint's weights file


def experiment(index: int, status: str = "keep", value: float | None = None, **fields: Any) -> Experiment:
    values: dict[str, Any] = {
        "id": index,
        "goal_id": 1,
        "index": index,
        "description": f"run {index}",
        "command": ["x"],
        "metric_value": value,
        "metric_name": "accuracy",
        **fields,
    }
    if status == "queued":  # not (yet) a ledger status; the policy leaves it alone all the same
        return Experiment.model_construct(status="queued", **values)
    return Experiment(status=status, **values)


def checkpoint(
    workspace: Path, index: int, step: int, info: dict[str, Any] | None = None, name: str = ""
) -> Path:
    """A checkpoint as NeMo RL leaves it: weights, and training_info.json with the save state."""
    path = workspace / "experiments" / f"{index:03d}" / "checkpoints" / (name or f"step_{step}")
    (path / "policy" / "weights").mkdir(parents=True)
    (path / "policy" / "weights" / "model.safetensors").write_bytes(b"\0" * WEIGHTS)
    (path / "training_info.json").write_text(json.dumps({"step": step, "epoch": 0, **(info or {})}))
    return path


def size(path: Path) -> int:
    """Bytes of everything but directories (a link to a directory counts as the link)."""
    entries = [Path(d) / name for d, dirs, files in os.walk(path) for name in dirs + files]
    return sum(e.lstat().st_size for e in entries if e.is_symlink() or not e.is_dir())


def names(paths: list[Path]) -> list[str]:
    return [f"{p.parent.parent.name}/{p.name}" for p in paths]


def test_keeps_the_best_by_the_ledger_and_the_latest(tmp_path):
    ws = tmp_path / "ws"
    values = {1: 0.5, 2: 0.9, 3: 0.7, 4: 0.6, 5: 0.1}
    paths = {i: checkpoint(ws, i, 100) for i in values}
    experiments = [experiment(i, value=v) for i, v in values.items()]
    expected = size(paths[1]) + size(paths[4])
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=2)
    assert names(pruned.removed) == ["001/step_100", "004/step_100"]
    assert sorted(names(pruned.kept)) == ["002/step_100", "003/step_100", "005/step_100"]
    assert pruned.freed_bytes == expected
    assert not paths[1].exists() and not paths[4].exists() and paths[5].exists()
    assert pruned.text() == (
        "freed 8.2 kB: 2 checkpoints of experiments #1, #4; "
        "kept the best 2 (#2 step_100, #3 step_100) and the latest (#5 step_100)"
    )
    again = prune_checkpoints(ws, experiments, direction="maximize", keep_best=2)
    assert again.removed == [] and again.freed_bytes == 0
    assert again.text().startswith("no checkpoint to remove; kept the best 2")


def test_training_info_metric_ranks_checkpoints_within_a_run(tmp_path):
    ws = tmp_path / "ws"
    accuracy = {40: 0.61, 80: 0.74, 120: 0.70, 160: 0.55}
    for step, value in accuracy.items():
        checkpoint(ws, 1, step, {"val:accuracy": value})
    checkpoint(ws, 2, 40, {"val:accuracy": 0.72})
    # The ledger holds each run's best; training_info.json tells its checkpoints apart.
    experiments = [
        experiment(1, value=0.74, metric_name="validation/accuracy"),
        experiment(2, value=0.72, metric_name="validation/accuracy"),
    ]
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=2)
    assert pruned.best == ["#1 step_80", "#2 step_40"]
    assert pruned.latest == "#2 step_40"
    assert sorted(names(pruned.removed)) == ["001/step_120", "001/step_160", "001/step_40"]
    assert pruned.text().endswith("kept the best 2 (#1 step_80, #2 step_40, the latest among them)")


def test_a_bare_metric_name_finds_its_val_key(tmp_path):
    ws = tmp_path / "ws"
    for step, value in {10: 0.3, 20: 0.8, 30: 0.5}.items():
        checkpoint(ws, 1, step, {"val:accuracy": value})
    checkpoint(ws, 2, 10)  # no metric in training_info.json: the ledger's value
    experiments = [experiment(1, value=0.8), experiment(2, value=0.4)]
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=1)
    assert pruned.best == ["#1 step_20"]
    assert sorted(names(pruned.removed)) == ["001/step_10", "001/step_30"]


def test_minimize_keeps_the_lowest_val_loss(tmp_path):
    ws = tmp_path / "ws"
    for step, loss in {50: 1.9, 100: 1.2, 150: 1.4, 200: 1.6}.items():
        checkpoint(ws, 3, step, {"val:val_loss": loss})
    experiments = [experiment(3, value=1.2, metric_name="validation/val_loss")]
    pruned = prune_checkpoints(ws, experiments, direction="minimize", keep_best=2)
    assert pruned.best == ["#3 step_100", "#3 step_150"]
    assert pruned.latest == "#3 step_200"
    assert names(pruned.removed) == ["003/step_50"]


def test_unscored_and_crashed_rank_last(tmp_path):
    ws = tmp_path / "ws"
    for i in (1, 2, 3, 4):
        checkpoint(ws, i, 10)
    experiments = [
        experiment(1, status="crash", value=0.99),  # a crash's number is no verdict
        experiment(2, value=0.2),
        experiment(3, status="discard", value=None),
        experiment(4, value=0.1),
    ]
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=1)
    assert pruned.best == ["#2 step_10"] and pruned.latest == "#4 step_10"
    assert sorted(names(pruned.removed)) == ["001/step_10", "003/step_10"]


def test_the_named_best_step_wins_a_ledger_tie(tmp_path):
    ws = tmp_path / "ws"
    for step in (10, 20, 30):
        checkpoint(ws, 1, step)
    checkpoint(ws, 2, 5)
    experiments = [experiment(1, value=0.9, metrics={"best_checkpoint_step": 20.0}), experiment(2, value=0.1)]
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=1)
    assert pruned.best == ["#1 step_20"]
    assert sorted(names(pruned.removed)) == ["001/step_10", "001/step_30"]


def test_running_queued_and_unfinished_checkpoints_are_untouched(tmp_path):
    ws = tmp_path / "ws"
    running = [checkpoint(ws, 2, s) for s in (10, 20)]
    queued = checkpoint(ws, 3, 10)
    unfinished = checkpoint(ws, 1, 30, name="tmp_step_30")
    old = checkpoint(ws, 1, 10)
    kept = checkpoint(ws, 1, 20)
    experiments = [
        experiment(1, value=0.5),
        experiment(2, status="running", value=None),
        experiment(3, status="queued", value=None),
    ]
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=1)
    assert pruned.removed == [old]
    assert all(p.exists() for p in [*running, queued, unfinished, kept])


def test_keep_best_zero_keeps_everything(tmp_path):
    ws = tmp_path / "ws"
    paths = [checkpoint(ws, i, 10) for i in (1, 2, 3)]
    experiments = [experiment(i, value=float(i)) for i in (1, 2, 3)]
    for off in (0, -1):
        pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=off)
        assert pruned.removed == [] and pruned.freed_bytes == 0
        assert pruned.text() == "checkpoint retention is off: every checkpoint kept"
    assert all(p.exists() for p in paths)


def outside_dir(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    (outside / "checkpoints" / "step_1").mkdir(parents=True)
    (outside / "precious").write_bytes(b"x" * 100)
    (outside / "checkpoints" / "step_1" / "precious").write_bytes(b"y" * 100)
    return outside


def test_a_link_planted_as_a_checkpoint_is_not_followed(tmp_path):
    ws = tmp_path / "ws"
    outside = outside_dir(tmp_path)
    checkpoint(ws, 1, 10)
    checkpoint(ws, 2, 10)
    link = ws / "experiments" / "001" / "checkpoints" / "step_5"
    link.symlink_to(outside)
    experiments = [experiment(1, value=0.1), experiment(2, value=0.9)]
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=1)
    assert names(pruned.removed) == ["001/step_10"]
    assert link in pruned.skipped and link.is_symlink()
    assert (outside / "precious").read_bytes() == b"x" * 100


def test_a_linked_experiment_or_checkpoints_dir_is_skipped(tmp_path):
    ws = tmp_path / "ws"
    outside = outside_dir(tmp_path)
    checkpoint(ws, 1, 10)
    (ws / "experiments" / "005").symlink_to(outside)  # experiments/005/checkpoints/step_1 lies outside
    (ws / "experiments" / "006").mkdir()
    (ws / "experiments" / "006" / "checkpoints").symlink_to(outside / "checkpoints")
    experiments = [experiment(1, value=0.9), experiment(5, value=0.1), experiment(6, value=0.2)]
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=1)
    assert pruned.removed == [] and pruned.freed_bytes == 0
    assert ws / "experiments" / "005" / "checkpoints" in pruned.skipped
    assert ws / "experiments" / "006" / "checkpoints" in pruned.skipped
    assert (outside / "checkpoints" / "step_1" / "precious").exists()


def test_links_inside_a_removed_checkpoint_are_removed_not_followed(tmp_path):
    ws = tmp_path / "ws"
    outside = outside_dir(tmp_path)
    doomed = checkpoint(ws, 1, 10)
    (doomed / "policy" / "escape").symlink_to(outside)
    (doomed / "policy" / "file_link").symlink_to(outside / "precious")
    checkpoint(ws, 2, 10)
    expected = size(doomed)  # the links count as links (their own few bytes)
    pruned = prune_checkpoints(
        ws, [experiment(1, value=0.1), experiment(2, value=0.9)], direction="maximize", keep_best=1
    )
    assert pruned.removed == [doomed] and pruned.freed_bytes == expected
    assert (outside / "precious").exists() and (outside / "checkpoints" / "step_1" / "precious").exists()


def test_a_fifo_as_training_info_does_not_hang(tmp_path):
    ws = tmp_path / "ws"
    path = checkpoint(ws, 1, 10)
    (path / "training_info.json").unlink()
    os.mkfifo(path / "training_info.json")
    checkpoint(ws, 2, 10)
    pruned = prune_checkpoints(
        ws, [experiment(1, value=0.1), experiment(2, value=0.9)], direction="maximize", keep_best=1
    )
    assert pruned.removed == [path]


def test_a_poisoned_training_info_scores_nothing(tmp_path):
    """training_info.json is the agent's to write: an integer past any float (OverflowError), one
    past int()'s digit limit (ValueError) or nesting past the recursion limit (RecursionError)
    raised out of the pruning after every run of its goal. Such a checkpoint is merely unscored."""
    ws = tmp_path / "ws"
    poisons = [
        '{"val:accuracy": 1' + "0" * 400 + "}",
        '{"val:accuracy": ' + "9" * 5000 + "}",
        '{"val:accuracy": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ]
    for index, poison in enumerate(poisons, start=1):
        (checkpoint(ws, index, 10) / "training_info.json").write_text(poison)
    checkpoint(ws, 4, 10, {"val:accuracy": 0.5})
    experiments = [experiment(i, value=None, metric_name="validation/accuracy") for i in (1, 2, 3)]
    experiments.append(experiment(4, value=0.5, metric_name="validation/accuracy"))
    pruned = prune_checkpoints(ws, experiments, direction="maximize", keep_best=1)
    assert pruned.best == ["#4 step_10"]
    assert sorted(names(pruned.removed)) == ["001/step_10", "002/step_10", "003/step_10"]


def test_no_workspace_or_no_checkpoints(tmp_path):
    pruned = prune_checkpoints(
        tmp_path / "missing", [experiment(1, value=1.0)], direction="maximize", keep_best=2
    )
    assert pruned.removed == [] and pruned.text() == "no checkpoint to remove"
    (tmp_path / "ws" / "experiments" / "001").mkdir(parents=True)
    pruned = prune_checkpoints(tmp_path / "ws", [experiment(1, value=1.0)], direction="maximize", keep_best=2)
    assert pruned.removed == [] and pruned.skipped == []


# ---- the rules together, over random goals ----

STATUSES = ["keep", "discard", "crash", "interrupted", "running", "queued"]
run_strategy = st.tuples(
    st.sampled_from(STATUSES),
    st.one_of(st.none(), st.floats(-10, 10)),  # the ledger's value
    st.dictionaries(
        st.integers(1, 6), st.one_of(st.none(), st.floats(-10, 10)), max_size=4
    ),  # step → info value
    st.booleans(),  # a link planted among its checkpoints
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=st.lists(run_strategy, max_size=6),
    direction=st.sampled_from(["maximize", "minimize"]),
    keep_best=st.integers(1, 4),
)
def test_the_rules_hold_for_random_goals(runs, direction, keep_best):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = root / "ws"
        outside = outside_dir(root)
        experiments, active, candidates, scores = [], [], [], {}
        for index, (status, value, steps, link) in enumerate(runs, start=1):
            e = experiment(index, status=status, value=value, metric_name="validation/accuracy")
            experiments.append(e)
            for step, info_value in steps.items():
                info = {} if info_value is None else {"val:accuracy": info_value}
                path = checkpoint(ws, index, step, info)
                if status in ("running", "queued"):
                    active.append(path)
                    continue
                candidates.append((index, step, path))
                ledger = None if status == "crash" else value
                scores[path] = info_value if info_value is not None else ledger
            if link:
                base = ws / "experiments" / f"{index:03d}" / "checkpoints"
                base.mkdir(parents=True, exist_ok=True)
                (base / "step_99").symlink_to(outside)
            (ws / "experiments" / f"{index:03d}" / "checkpoints" / "tmp_step_7").mkdir(
                parents=True, exist_ok=True
            )
        before = {path: size(path) for _, _, path in candidates}

        pruned = prune_checkpoints(ws, experiments, direction=direction, keep_best=keep_best)

        assert (outside / "precious").exists() and (outside / "checkpoints" / "step_1" / "precious").exists()
        assert all(path.exists() for path in active)
        assert all(p.is_dir() for p in ws.glob("experiments/*/checkpoints/tmp_step_7"))
        assert all(p.is_symlink() for p in ws.glob("experiments/*/checkpoints/step_99"))
        for path in pruned.removed:
            assert path.is_relative_to(ws / "experiments") and not path.exists()
        assert set(pruned.removed) | set(pruned.kept) == {path for _, _, path in candidates}
        assert len(pruned.kept) >= min(keep_best, len(candidates))
        if candidates:
            latest = max(candidates, key=lambda c: (c[0], c[1]))[2]
            assert latest in pruned.kept
        # Nothing removed outranks a kept best one (scored beats unscored; then by direction).
        sign = 1 if direction == "maximize" else -1
        kept_best = [
            path
            for path in pruned.kept
            if f"#{path.parent.parent.name.lstrip('0')} {path.name}" in pruned.best
        ]
        for removed in pruned.removed:
            for kept in kept_best:
                r, k = scores[removed], scores[kept]
                assert r is None or (k is not None and sign * k >= sign * r)
        assert pruned.freed_bytes == sum(before[path] for path in pruned.removed)
        again = prune_checkpoints(ws, experiments, direction=direction, keep_best=keep_best)
        assert again.removed == [] and again.freed_bytes == 0
