"""PNG charts of a campaign, readable at a glance, for any surface (terminal demo, Slack bot).

Every function takes plain data or records plus a destination path and returns the path; the
``*_figure`` helpers return the :class:`matplotlib.figure.Figure` instead, so callers (and tests)
can inspect or restyle it before saving. Nothing here touches pyplot's global state: figures are
built from ``Figure`` directly and rendered with the Agg canvas.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from goaltender.display.params import format_metric, is_percent_metric
from goaltender.storage.direction import better
from goaltender.storage.records import Experiment

__all__ = [
    "campaign_figure",
    "curves_figure",
    "plot_campaign",
    "plot_curves",
    "plot_training",
    "save_figure",
    "training_figure",
]

FIGSIZE = (8.0, 4.5)  # inches
DPI = 110

STATUS_STYLE: dict[str, dict[str, str]] = {
    "keep": {"color": "#2ca02c", "marker": "o", "label": "keep"},
    "discard": {"color": "#9a9a9a", "marker": "o", "label": "discard"},
    "running": {"color": "#1f77b4", "marker": "D", "label": "running"},
    "crash": {"color": "#d62728", "marker": "x", "label": "crash / no metric"},
    "interrupted": {"color": "#9a9a9a", "marker": "|", "label": "interrupted (not counted)"},
}
FRONTIER_COLOR = "#1f3b73"
BEST_COLOR = "#ff8c00"
TARGET_COLOR = "#7b3294"

# Names that are fractions but where "%" would mislead (a loss of 0.31 is not "31%").
_NOT_PERCENT_WORDS = ("loss", "error", "err", "mse", "mae", "rmse", "perplexity", "ppl", "nll", "time")


def _new_figure() -> Figure:
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)  # an explicit Agg canvas: no dependence on the configured backend
    return fig


def _style_axes(ax) -> None:
    ax.grid(True, color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _empty_note(ax, text: str) -> None:
    """A grey line in the middle of an empty chart, saying why it is empty."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=13, color="#777777")


def _use_percent(metric: str, values: Sequence[float]) -> bool:
    """Percent axis for accuracy-like metrics, or unnamed fractions that all lie in [0, 1]."""
    if is_percent_metric(metric):
        return not values or all(0.0 <= v <= 1.0 for v in values)
    lowered = metric.lower()
    if any(word in lowered for word in _NOT_PERCENT_WORDS):
        return False
    return bool(values) and all(0.0 <= v <= 1.0 for v in values)


def _percent_formatter(values: Sequence[float]) -> PercentFormatter:
    """Whole percents unless the values sit within a few points of each other."""
    span = (max(values) - min(values)) if values else 1.0
    return PercentFormatter(xmax=1.0, decimals=0 if span >= 0.04 else 1)


def _fmt_value(metric: str, value: float, percent: bool) -> str:
    if percent:
        return f"{value * 100:.1f}%"
    return format_metric(metric, value)


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as PNG atomically: a temp file in the same directory, then ``os.replace``."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # os.open with 0o666 (not mkstemp's 0o600) so the file gets the usual umask-derived mode.
    tmp_name = str(dest.parent / f".{dest.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI)
        os.replace(tmp_name, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    return dest


# ---- the campaign chart ----


def campaign_figure(
    experiments: Sequence[Experiment],
    metric: str,
    *,
    direction: Literal["maximize", "minimize"] = "maximize",
    target: float | None = None,
    title: str | None = None,
) -> Figure:
    """The headline metric per attempted experiment, coloured by status, with the best-so-far line."""
    fig = _new_figure()
    ax = fig.add_subplot(1, 1, 1)
    _style_axes(ax)

    rows = sorted(experiments, key=lambda e: e.index)
    # (experiment, value) for every row with a finite metric: the points of the chart.
    scored = [
        (e, float(e.metric_value))
        for e in rows
        if e.status != "crash" and e.metric_value is not None and math.isfinite(e.metric_value)
    ]
    scored_idx = {id(e) for e, _ in scored}
    crashed = [e for e in rows if id(e) not in scored_idx and e.finished]
    values = [v for _, v in scored]
    percent = _use_percent(metric, values + ([target] if target is not None else []))
    arrow = "↑" if direction == "maximize" else "↓"

    if title is None:
        title = f"{metric} per experiment ({arrow} {direction})"
    ax.set_title(title, fontsize=12, loc="left", fontweight="bold")
    ax.set_xlabel("experiment # (attempted)")
    ax.set_ylabel(f"{metric} (%)" if percent else metric)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    if percent:
        ax.yaxis.set_major_formatter(_percent_formatter(values + ([target] if target is not None else [])))

    if not rows:
        _empty_note(ax, "no experiments yet")
        ax.set_xlim(0.5, 5.5)
        if target is not None:
            ax.axhline(target, color=TARGET_COLOR, linestyle="--", linewidth=1.2)
            ax.set_ylim(*_padded_limits([target]))
        fig.tight_layout()
        return fig

    max_index = rows[-1].index
    ax.set_xlim(0.4, max(max_index, 5) + 0.6)  # a few empty slots read better than one lonely dot

    # Each headline's interval (runner/noise.py) as an error bar; a within-noise keep ringed.
    bars = [(e, v) for e, v in scored if e.interval_low is not None and e.interval_high is not None]
    if bars:
        ax.errorbar(
            [e.index for e, _ in bars],
            [v for _, v in bars],
            yerr=[
                [max(0.0, v - (e.interval_low or v)) for e, v in bars],
                [max(0.0, (e.interval_high or v) - v) for e, v in bars],
            ],
            fmt="none",
            ecolor="#9aa0a6",
            elinewidth=1.0,
            capsize=3,
            zorder=2,
        )
    noisy = [(e, v) for e, v in scored if e.within_noise]
    if noisy:
        ax.scatter(
            [e.index for e, _ in noisy],
            [v for _, v in noisy],
            s=150,
            facecolors="none",
            edgecolors="#e37400",
            linewidths=1.4,
            zorder=4,
            label="within noise",
        )

    # Scored points by status.
    for status in ("discard", "keep", "running"):
        pts = [(e, v) for e, v in scored if e.status == status]
        if not pts:
            continue
        style = STATUS_STYLE[status]
        ax.scatter(
            [e.index for e, _ in pts],
            [v for _, v in pts],
            s=46,
            color=style["color"],
            marker=style["marker"],
            edgecolors="white",
            linewidths=0.6,
            zorder=3,
            label=style["label"],
        )

    # Crashes (and other rows without a metric) sit on the bottom edge, x coordinates in data;
    # runs a runner crash cut short (not counted) beside them, in grey.
    for status in ("crash", "interrupted"):
        edge = [e for e in crashed if (e.status == "interrupted") == (status == "interrupted")]
        if not edge:
            continue
        style = STATUS_STYLE[status]
        ax.scatter(
            [e.index for e in edge],
            [0.035] * len(edge),
            transform=ax.get_xaxis_transform(),
            s=60,
            color=style["color"],
            marker=style["marker"],
            linewidths=2.0,
            zorder=4,
            clip_on=False,
            label=style["label"],
        )

    # Running-best frontier and the best point.
    best: tuple[Experiment, float] | None = None
    if scored:
        xs: list[float] = []
        ys: list[float] = []
        for e, v in scored:
            if best is None or better(v, best[1], direction):
                best = (e, v)
            xs.append(e.index)
            ys.append(best[1])
        if xs[-1] < max_index:  # carry the frontier to the last attempt
            xs.append(max_index)
            ys.append(ys[-1])
        ax.step(
            xs,
            ys,
            where="post",
            color=FRONTIER_COLOR,
            linewidth=1.8,
            alpha=0.85,
            zorder=2,
            label="best so far",
        )

    if target is not None:
        ax.axhline(
            target,
            color=TARGET_COLOR,
            linestyle="--",
            linewidth=1.2,
            zorder=1,
            label=f"target {_fmt_value(metric, target, percent)}",
        )

    limits_from = values + ([target] if target is not None else [])
    if limits_from:
        ax.set_ylim(*_padded_limits(limits_from))
    else:  # nothing scored: an empty band, the crash markers still show
        ax.set_yticks([])

    if best is not None:
        bx, by = best[0].index, best[1]
        ax.scatter(
            [bx],
            [by],
            s=190,
            marker="*",
            color=BEST_COLOR,
            edgecolors="black",
            linewidths=0.6,
            zorder=5,
            label="best",
        )
        # Put the label on the roomy side: above for maximize, below for minimize; away from edges.
        right_half = max_index > 1 and bx > (max_index + 1) / 2
        dy = 14 if direction == "maximize" else -16
        ax.annotate(
            f"best {_fmt_value(metric, by, percent)}  (#{bx})",
            xy=(bx, by),
            xytext=(-10 if right_half else 10, dy),
            textcoords="offset points",
            ha="right" if right_half else "left",
            va="bottom" if dy > 0 else "top",
            fontsize=10,
            fontweight="bold",
            color="black",
            bbox={"boxstyle": "round,pad=0.25", "fc": "#fff4e0", "ec": BEST_COLOR, "lw": 0.8},
            arrowprops={"arrowstyle": "-", "color": BEST_COLOR, "lw": 1.0},
            zorder=6,
            gid="best-annotation",
        )

    _legend(ax)
    fig.tight_layout()
    return fig


def _padded_limits(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    span = hi - lo
    if span <= 0:
        span = abs(hi) * 0.1 or 0.1
    # Room below for the crash strip, room above for the best-point label.
    return lo - 0.28 * span, hi + 0.25 * span


def _legend(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    order = ["keep", "discard", "running", STATUS_STYLE["crash"]["label"]]
    order += [STATUS_STYLE["interrupted"]["label"], "best so far", "best"]

    def rank(label: str) -> int:
        return order.index(label) if label in order else len(order)

    pairs = sorted(zip(handles, labels, strict=True), key=lambda hl: rank(hl[1]))
    ax.legend(
        [h for h, _ in pairs],
        [lab for _, lab in pairs],
        loc="best",
        fontsize=8.5,
        framealpha=0.9,
        ncol=2 if len(pairs) > 4 else 1,
    )


def plot_campaign(
    experiments: Sequence[Experiment],
    metric: str,
    path: str | os.PathLike[str],
    *,
    direction: Literal["maximize", "minimize"] = "maximize",
    target: float | None = None,
    title: str | None = None,
) -> Path:
    """Render :func:`campaign_figure` to a PNG at ``path`` (atomically) and return the path."""
    fig = campaign_figure(experiments, metric, direction=direction, target=target, title=title)
    return save_figure(fig, path)


# ---- training curves ----


def curves_figure(
    series: Mapping[str, Sequence[tuple[float | None, float]]],
    *,
    ylabel: str,
    title: str,
    xlabel: str | None = None,
) -> Figure:
    """One line per label; x is the step, or the point's index when the step is None.
    An `xlabel` names a whole-number x (e.g. "experiment"), ticked at integers."""
    fig = _new_figure()
    ax = fig.add_subplot(1, 1, 1)
    _style_axes(ax)
    ax.set_title(title, fontsize=12, loc="left", fontweight="bold")
    ax.set_ylabel(ylabel)

    all_values = [float(v) for pts in series.values() for _, v in pts if math.isfinite(v)]
    any_step = any(step is not None for pts in series.values() for step, _ in pts)
    ax.set_xlabel(xlabel or ("step" if any_step else "point"))
    percent = _use_percent(ylabel, all_values) and is_percent_metric(ylabel)
    if percent:
        ax.yaxis.set_major_formatter(_percent_formatter(all_values))

    drawn = [(label, pts) for label, pts in series.items() if pts]
    if not drawn:
        _empty_note(ax, "no data yet")
        fig.tight_layout()
        return fig

    cmap = colormaps["tab10" if len(drawn) <= 10 else "tab20"]
    for i, (label, pts) in enumerate(drawn):
        xs = [float(step) if step is not None else float(j) for j, (step, _) in enumerate(pts)]
        ys = [float(v) for _, v in pts]
        ax.plot(
            xs,
            ys,
            label=label,
            color=cmap(i % cmap.N),
            linewidth=1.6,
            marker="o" if len(pts) <= 30 else None,
            markersize=3.5,
        )
    if xlabel or not any_step:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(
        loc="best",
        fontsize=8.5 if len(drawn) <= 8 else 7,
        framealpha=0.9,
        ncol=1 if len(drawn) <= 6 else 2,
    )
    fig.tight_layout()
    return fig


def plot_curves(
    series: Mapping[str, Sequence[tuple[float | None, float]]],
    path: str | os.PathLike[str],
    *,
    ylabel: str,
    title: str,
    xlabel: str | None = None,
) -> Path:
    """Render :func:`curves_figure` to a PNG at ``path`` (atomically) and return the path."""
    return save_figure(curves_figure(series, ylabel=ylabel, title=title, xlabel=xlabel), path)


# ---- one run's training curves ----


def training_figure(
    series: Mapping[str, Sequence[tuple[float | None, float]]],
    *,
    title: str,
    mark_step: float | None = None,
    mark_label: str = "best checkpoint",
) -> Figure:
    """One panel per series, side by side (a loss and an accuracy share no axis), x the step.
    `mark_step` (the best checkpoint) is a dashed line in every panel and a star where a series
    has a value at that step, labelled in the last panel (the metric it was chosen by)."""
    fig = _new_figure()
    drawn = [(name, pts) for name, pts in series.items() if pts]
    if not drawn:
        _empty_note(fig.add_subplot(1, 1, 1), "no data yet")
        return fig
    cmap = colormaps["tab10"]
    for i, (name, pts) in enumerate(drawn):
        ax = fig.add_subplot(1, len(drawn), i + 1)
        _style_axes(ax)
        xs = [float(step) if step is not None else float(j) for j, (step, _) in enumerate(pts)]
        ys = [float(v) for _, v in pts]
        percent = is_percent_metric(name) and _use_percent(name, ys)
        ax.plot(xs, ys, color=cmap(i), linewidth=1.6, marker="o" if len(pts) <= 30 else None, markersize=3.5)
        ax.set_title(name, fontsize=10.5, loc="left")
        ax.set_xlabel("step")
        if percent:
            ax.yaxis.set_major_formatter(_percent_formatter(ys))
        ax.margins(y=0.15)  # room for the label
        if mark_step is not None:
            at = [y for x, y in zip(xs, ys, strict=True) if x == mark_step]
            _mark(ax, mark_step, at, name, percent, mark_label if i == len(drawn) - 1 else None)
    fig.suptitle(title, fontsize=12, x=0.01, ha="left", fontweight="bold")
    fig.tight_layout()
    return fig


def _mark(ax, step: float, values: list[float], name: str, percent: bool, label: str | None) -> None:
    ax.axvline(step, color=BEST_COLOR, linestyle="--", linewidth=1.2, zorder=1)
    if not values:
        return
    value = values[-1]
    ax.scatter(
        [step], [value], s=170, marker="*", color=BEST_COLOR, edgecolors="black", linewidths=0.6, zorder=5
    )
    if label is None:
        return
    ax.annotate(
        f"{label}: step {step:g}, {_fmt_value(name, value, percent)}",
        xy=(step, value),
        xytext=(0, 12),
        textcoords="offset points",
        ha="center",
        fontsize=8.5,
        bbox={"boxstyle": "round,pad=0.25", "fc": "#fff4e0", "ec": BEST_COLOR, "lw": 0.8},
        zorder=6,
    )


def plot_training(
    series: Mapping[str, Sequence[tuple[float | None, float]]],
    path: str | os.PathLike[str],
    *,
    title: str,
    mark_step: float | None = None,
    mark_label: str = "best checkpoint",
) -> Path:
    """Render :func:`training_figure` to a PNG at ``path`` (atomically) and return the path."""
    return save_figure(training_figure(series, title=title, mark_step=mark_step, mark_label=mark_label), path)
