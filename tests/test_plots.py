from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from PIL import Image

from goaltender.display.plots import campaign_figure, curves_figure, plot_campaign, plot_curves
from goaltender.storage.records import Experiment, ExperimentStatus

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def exp(
    index: int, status: ExperimentStatus, value: float | None, metric: str = "exact_accuracy"
) -> Experiment:
    return Experiment(
        id=index,
        goal_id=1,
        index=index,
        description=f"experiment {index}",
        command=["python", "train.py"],
        params={"train_size": 256 * index},
        status=status,
        metric_name=metric,
        metric_value=value,
    )


def assert_png(path: Path) -> None:
    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        w, h = im.size
        assert w > 0 and h > 0
        # 8x4.5 in at 110 dpi, give or take tight layout rounding
        assert 800 <= w <= 960 and 450 <= h <= 540
    # no temp files left next to it
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


MANY = [
    exp(1, "keep", 0.625),
    exp(2, "keep", 0.75),
    exp(3, "crash", None),
    exp(4, "keep", 0.875),
    exp(5, "discard", 0.8125),
    exp(6, "discard", 0.84),
]


def test_plot_campaign_many(tmp_path: Path) -> None:
    out = plot_campaign(MANY, "exact_accuracy", tmp_path / "campaign.png", target=0.9, title="Star count")
    assert out == tmp_path / "campaign.png"
    assert_png(out)


def test_campaign_figure_marks_best_and_uses_percent() -> None:
    fig = campaign_figure(MANY, "exact_accuracy", target=0.9)
    ax = fig.axes[0]
    assert any("best 87.5%" in t and "#4" in t for t in texts(fig))
    assert "%" in ax.get_ylabel()
    labels = ax.get_legend_handles_labels()[1]
    assert {"keep", "discard", "best so far", "best"} <= set(labels)
    assert any(lab.startswith("crash") for lab in labels)
    assert any(lab.startswith("target 90") for lab in labels)
    # the y tick labels are percentages
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and all(t.endswith("%") for t in ticks)


def test_interrupted_runs_are_told_apart_from_crashes() -> None:
    fig = campaign_figure([*MANY, exp(7, "interrupted", None)], "exact_accuracy")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "interrupted (not counted)" in labels and "crash / no metric" in labels
    only = campaign_figure([exp(1, "keep", 0.5), exp(2, "interrupted", None)], "exact_accuracy")
    assert not any(lab.startswith("crash") for lab in only.axes[0].get_legend_handles_labels()[1])


def test_campaign_frontier_is_running_best() -> None:
    fig = campaign_figure(MANY, "exact_accuracy")
    ax = fig.axes[0]
    (frontier,) = [line for line in ax.get_lines() if line.get_label() == "best so far"]
    # step(where="post") draws from the original points; check the data we passed
    ys = list(frontier.get_ydata())
    assert ys == [0.625, 0.75, 0.875, 0.875, 0.875]
    assert list(frontier.get_xdata()) == [1, 2, 4, 5, 6]


def test_campaign_minimize_non_fraction(tmp_path: Path) -> None:
    rows = [
        exp(1, "keep", 2.5, "val_loss"),
        exp(2, "keep", 1.25, "val_loss"),
        exp(3, "discard", 1.75, "val_loss"),
    ]
    fig = campaign_figure(rows, "val_loss", direction="minimize")
    assert any("best 1.25" in t and "#2" in t for t in texts(fig))
    assert "%" not in fig.axes[0].get_ylabel()
    assert_png(plot_campaign(rows, "val_loss", tmp_path / "loss.png", direction="minimize"))


def test_fraction_loss_is_not_percent() -> None:
    rows = [exp(1, "keep", 0.4, "val_loss"), exp(2, "keep", 0.3, "val_loss")]
    fig = campaign_figure(rows, "val_loss", direction="minimize")
    assert "%" not in fig.axes[0].get_ylabel()
    assert any("best 0.3 " in t for t in texts(fig))


def test_unnamed_fraction_is_percent() -> None:
    rows = [exp(1, "keep", 0.4, "f1"), exp(2, "keep", 0.5, "f1")]
    fig = campaign_figure(rows, "f1")
    assert fig.axes[0].get_ylabel() == "f1 (%)"
    assert any("best 50.0%" in t for t in texts(fig))


def test_plot_campaign_one(tmp_path: Path) -> None:
    rows = [exp(1, "keep", 0.5)]
    fig = campaign_figure(rows, "exact_accuracy")
    assert any("best 50.0%" in t for t in texts(fig))
    assert_png(plot_campaign(rows, "exact_accuracy", tmp_path / "one.png"))


def test_plot_campaign_zero(tmp_path: Path) -> None:
    fig = campaign_figure([], "exact_accuracy", target=0.9)
    assert "no experiments yet" in texts(fig)
    assert_png(plot_campaign([], "exact_accuracy", tmp_path / "sub" / "zero.png"))


def test_plot_campaign_only_crashes(tmp_path: Path) -> None:
    rows = [exp(1, "crash", None), exp(2, "crash", None)]
    fig = campaign_figure(rows, "exact_accuracy")
    assert not any(t.startswith("best") for t in texts(fig))
    assert_png(plot_campaign(rows, "exact_accuracy", tmp_path / "crashes.png"))


def test_plot_campaign_overwrites_atomically(tmp_path: Path) -> None:
    path = tmp_path / "c.png"
    path.write_bytes(b"old")
    plot_campaign(MANY, "exact_accuracy", path)
    assert_png(path)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_saved_file_is_not_private(tmp_path: Path) -> None:
    path = plot_campaign(MANY[:2], "exact_accuracy", tmp_path / "m.png")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_plot_curves(tmp_path: Path) -> None:
    series = {
        "#1 train_size=256": [(float(s * 10), 1.0 / (s + 1)) for s in range(20)],
        "#2 train_size=2048": [(None, 0.9), (None, 0.5), (None, 0.3)],
        "#3 empty": [],
    }
    fig = curves_figure(series, ylabel="train loss", title="Training loss")
    ax = fig.axes[0]
    assert ax.get_title(loc="left") == "Training loss"
    assert ax.get_xlabel() == "step"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"#1 train_size=256", "#2 train_size=2048"}
    assert list(lines["#2 train_size=2048"].get_xdata()) == [0.0, 1.0, 2.0]
    assert list(lines["#1 train_size=256"].get_xdata())[:3] == [0.0, 10.0, 20.0]

    out = plot_curves(series, tmp_path / "curves.png", ylabel="train loss", title="Training loss")
    assert out == tmp_path / "curves.png"
    assert_png(out)


def test_plot_curves_empty_and_index_only(tmp_path: Path) -> None:
    fig = curves_figure({}, ylabel="accuracy", title="nothing")
    assert "no data yet" in texts(fig)
    assert_png(plot_curves({}, tmp_path / "empty.png", ylabel="accuracy", title="nothing"))

    fig = curves_figure({"a": [(None, 0.2), (None, 0.4)]}, ylabel="val accuracy", title="acc")
    assert fig.axes[0].get_xlabel() == "point"
