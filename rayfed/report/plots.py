"""One figure per metric (a numeric metrics.jsonl key): each group's seed-mean curve with a ± sample
std band, the legend beside the axes, as PNG (for report.md) and PDF (for a paper)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
# The figure is drawn on its own canvas, not through pyplot, so that no global backend is set in a
# process that may have chosen another.
from matplotlib.figure import Figure

from rayfed.report.groups import UNSET, render
from rayfed.report.stats import GroupStats, seed_mean_curve

DEFAULT_METRICS = ("test_accuracy", "train_loss")
FORMATS = ("png", "pdf", "svg")
LABELS = {"test_accuracy": "test accuracy", "test_loss": "test loss",
          "train_loss": "train loss (mean over participants)"}
X_LABELS = {"round": "round", "virtual_time_s": "virtual time (s, seed mean)",
            "bytes": "bytes communicated, up + down (cumulative, seed mean)"}
# Okabe and Ito's colour-blind-safe palette (B. Wong, "Points of view: Color blindness", Nature
# Methods 8, 441, 2011) without its yellow, too pale for a thin line on white.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
# A curve changes colour every line, dash pattern every len(COLOURS) lines and marker every line
# on a cycle of another length, so that up to 28 curves differ in colour and dashes, and in print
# without colour still by dashes and markers.
DASHES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MARKS_PER_CURVE = 8
LEGEND_ROWS = 20    # beyond, the legend takes another column rather than outgrowing the figure
# Keeps the PDF's bytes the same for the same curves, so that a regenerated figure is no change.
METADATA = {"pdf": {"CreationDate": None}, "svg": {"Date": None}, "png": {}}


def curve_style(index: int) -> dict:
    return {"color": COLOURS[index % len(COLOURS)], "linestyle": DASHES[index // len(COLOURS) % len(DASHES)],
            "marker": MARKERS[index % len(MARKERS)]}


def draw(metric: str, keys: list[str], stats: list[GroupStats], x: str, log_x: bool = False,
         log_y: bool = False) -> Figure:
    figure = Figure(figsize=(6.4, 4.2), dpi=150)
    axes = figure.add_subplot()
    for index, s in enumerate(stats):
        xs, mean, std = seed_mean_curve(s.group.runs, metric, x)
        if not len(xs):
            continue        # the group's runs did not log the metric
        step = max(1, len(xs) // MARKS_PER_CURVE)
        shown = [render(value) for value in s.group.values if value != UNSET]
        line, = axes.plot(xs, mean, label=", ".join(shown) or "all runs", linewidth=1.4,
                          markersize=4, markevery=(index * step // max(len(stats), 1), step), **curve_style(index))
        if not np.isnan(std).all():
            lower, upper = mean - std, mean + std
            # A band past an accuracy's [0, 1] or below a loss's 0 would show values no model can have.
            if metric.endswith(("accuracy", "loss")):
                lower = np.maximum(lower, 0)
            if metric.endswith("accuracy"):
                upper = np.minimum(upper, 1)
            axes.fill_between(xs, lower, upper, color=line.get_color(), alpha=0.12, linewidth=0)
    name = LABELS.get(metric, metric)
    axes.set_title(f"{name}: seed mean ± sample std", fontsize="medium")
    axes.set_xlabel(X_LABELS[x])
    axes.set_ylabel(name)
    if log_x:
        axes.set_xscale("log")
    if log_y:
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(title=", ".join(keys) or None, fontsize="small", title_fontsize="small", frameon=False,
                    loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, alignment="left",
                    ncol=math.ceil(len(stats) / LEGEND_ROWS))
    return figure


def write_plots(keys: list[str], stats: list[GroupStats], x: str, out: Path, metrics=DEFAULT_METRICS,
                formats=("png", "pdf"), log_x: bool = False, log_y: bool = False) -> list[Path]:
    written = []
    for metric in metrics:
        figure = draw(metric, keys, stats, x, log_x, log_y)
        for form in formats:
            path = out / f"{metric}.{form}"
            # "tight" widens the saved canvas to hold the legend beside the axes.
            figure.savefig(path, format=form, bbox_inches="tight", metadata=METADATA[form])
            written.append(path)
    return written
