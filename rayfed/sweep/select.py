"""Selection as the papers make it (specs/gradma.md §5.5): within each group (e.g. per algorithm),
the hyper-parameter setting whose mean over seeds of a metric is best."""
from __future__ import annotations

import math
from pathlib import Path

from rayfed.config import all_keys
from rayfed.errors import ConfigError
from rayfed.metrics import read_summary, run_status
from rayfed.sweep.spec import Sweep


def check_group_keys(group_keys: list[str]) -> None:
    known = set(all_keys())
    for key in group_keys:
        if key not in known:
            raise ConfigError(f"--group {key} is not a config key")


def select(sweep: Sweep, trials_dir: Path, metric: str, group_keys: list[str]) -> list[dict]:
    """One row per group: its best setting, that setting's mean metric over seeds and how many
    seeds finished. Settings are the grid's keys other than seed and the group keys; ties go to
    the setting first in the grid."""
    setting_keys = [key for key in sweep.grid if key != "seed" and key not in group_keys]
    values: dict[tuple, dict[tuple, list[float]]] = {}
    for trial in sweep.trials:
        summary = read_summary(trials_dir / trial.name)
        if summary is None or run_status(summary) != "finished":
            continue
        metric_value = summary.get(metric)
        if not isinstance(metric_value, (int, float)) or not math.isfinite(metric_value):
            continue
        config = trial.config.to_dict()
        group = tuple(_dotted(config, key) for key in group_keys)
        setting = tuple(_dotted(config, key) for key in setting_keys)
        values.setdefault(group, {}).setdefault(setting, []).append(float(metric_value))
    rows = []
    for group, settings in values.items():
        means = {setting: sum(seeds) / len(seeds) for setting, seeds in settings.items()}
        best = max(means, key=means.get)        # max keeps the first of equal means: grid order
        rows.append({"group": dict(zip(group_keys, group)), "setting": dict(zip(setting_keys, best)),
                     f"mean_{metric}": means[best], "seeds": len(settings[best])})
    return rows


def selection_markdown(rows: list[dict], metric: str) -> str:
    if not rows:
        return f"No finished trial has a {metric}.\n"
    group_keys, setting_keys = list(rows[0]["group"]), list(rows[0]["setting"])
    header = [*group_keys, *setting_keys, f"mean {metric}", "seeds"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [*map(str, row["group"].values()), *map(str, row["setting"].values()),
                 f"{row[f'mean_{metric}']:.4f}", str(row["seeds"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _dotted(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config
