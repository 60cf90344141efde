"""test_accuracy.png and train_loss.png: one seed-mean line per group with a ± std band."""
from __future__ import annotations

from pathlib import Path

import numpy as np
# The figure is drawn on its own Agg canvas, not through pyplot, so that no global backend is set
# in a process that may have chosen another.
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rayfed.report.groups import render
from rayfed.report.stats import GroupStats, seed_mean_curve

PLOTS = {"test_accuracy": "test accuracy", "train_loss": "train loss (mean over participants)"}
X_LABELS = {"round": "round", "virtual_time_s": "virtual time (s, seed mean)",
            "bytes": "bytes communicated, up + down (cumulative, seed mean)"}


def write_plots(keys: list[str], stats: list[GroupStats], x: str, out: Path) -> list[Path]:
    written = []
    for metric, name in PLOTS.items():
        figure = Figure(figsize=(7, 4.5), dpi=120)
        axes = figure.add_subplot()
        for s in stats:
            xs, mean, std = seed_mean_curve(s.group.runs, metric, x)
            line, = axes.plot(xs, mean, label=", ".join(map(render, s.group.values)))
            if not np.isnan(std).all():
                axes.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        axes.set_title(f"{name}: seed mean ± sample std")
        axes.set_xlabel(X_LABELS[x])
        axes.set_ylabel(name)
        axes.grid(alpha=0.3)
        axes.legend(title=", ".join(keys), fontsize="small")
        figure.tight_layout()
        path = out / f"{metric}.png"
        FigureCanvasAgg(figure).print_png(path)
        written.append(path)
    return written
