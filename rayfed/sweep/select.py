"""Selection as the papers make it (GradMA, Luo et al., CVPR 2023, arXiv:2302.14307):
within each group (e.g. per algorithm), the hyper-parameter setting whose mean over seeds of a
metric is best. `rayfed sweep --select` writes it as selection.md (to read) and selection.json
(for `rayfed report`), and `rayfed report --select` makes the same choice from the trials alone."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rayfed.config import all_keys
from rayfed.errors import ConfigError
from rayfed.input_files import read_json
from rayfed.metrics import read_summary, run_status
from rayfed.report.runs import COMPLETE_STATUSES, read_config
from rayfed.sweep.grid import Grid, position, varied_keys
from rayfed.sweep.spec import Sweep

SELECTION_MD = "selection.md"
SELECTION_JSON = "selection.json"
TRIALS = "trials"
# A group's row lists the settings compared and the chosen trials: a few hundred bytes per trial.
MAX_SELECTION_BYTES = 2**26


@dataclass(frozen=True)
class Candidate:
    """One trial as selection sees it."""
    name: str           # its directory under trials/
    group: tuple        # the group keys' values
    setting: tuple      # the setting keys' values
    seed: object


def check_group_keys(group_keys: list[str]) -> None:
    known = set(all_keys())
    for key in group_keys:
        if key not in known:
            raise ConfigError(f"--group {key} is not a config key")


def setting_keys_of(grid: Grid, group_keys: list[str]) -> list[str]:
    return [key for key in varied_keys(grid) if key not in group_keys]


def select(sweep: Sweep, trials_dir: Path, metric: str, group_keys: list[str]) -> list[dict]:
    """One row per group, in grid order (see `choose`), for the sweep's own trials."""
    setting_keys = setting_keys_of(sweep.parsed, group_keys)
    candidates = []
    for trial in sweep.trials:
        # The resolved values, as the trials' config.yaml holds them for `select_from_trials`; a key
        # of another alternative's (another method's hyper-parameter) is None in this one's setting.
        config = trial.config.to_dict()
        candidates.append(Candidate(trial.name, tuple(_dotted(config, key) for key in group_keys),
                                    tuple(_dotted(config, key) for key in setting_keys), trial.config.seed))
    return choose(candidates, trials_dir, metric, group_keys, setting_keys)


def select_from_trials(sweep_dir: Path, grid: Grid, metric: str, group_keys: list[str]) -> list[dict]:
    """The same rows from what a sweep directory holds (sweep.yaml's grid and the trials' config.yaml),
    without the sweep file or the configs it resolves: the report reads directories that outlived both."""
    setting_keys = setting_keys_of(grid, group_keys)
    placed = []
    for path in sorted((sweep_dir / TRIALS).iterdir()):
        config = read_config(path) if path.is_dir() else None
        if not isinstance(config, dict):
            continue
        candidate = Candidate(path.name, tuple(config.get(key) for key in group_keys),
                              tuple(config.get(key) for key in setting_keys), config.get("seed"))
        placed.append((position(grid, config), candidate))
    # Directory names sort lexically, not in the grid's order, which decides ties as `rayfed sweep` does.
    placed.sort(key=lambda item: item[0])
    return choose([candidate for _, candidate in placed], sweep_dir / TRIALS, metric, group_keys, setting_keys)


def choose(candidates: list[Candidate], trials_dir: Path, metric: str, group_keys: list[str],
           setting_keys: list[str]) -> list[dict]:
    """Per group, the setting with the best mean over its seeds of the metric in summary.json,
    counting the complete runs (finished or stopped at their target) that have a finite one.
    Candidates come in grid order; groups keep the order of their first candidate and ties go to
    the setting first in the grid. Each row lists every compared setting, and the trials
    (relative to the sweep directory) whose values made the chosen setting's mean."""
    values: dict[tuple, dict[tuple, list[tuple[Candidate, float]]]] = {}
    for candidate in candidates:
        summary = read_summary(trials_dir / candidate.name)
        if summary is None or run_status(summary) not in COMPLETE_STATUSES:
            continue
        value = summary.get(metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        values.setdefault(candidate.group, {}).setdefault(candidate.setting, []).append((candidate, float(value)))
    rows = []
    for group, settings in values.items():
        means = {setting: sum(value for _, value in seeds) / len(seeds) for setting, seeds in settings.items()}
        best = max(means, key=means.get)        # max keeps the first of equal means: grid order
        chosen = settings[best]
        rows.append({
            "group": dict(zip(group_keys, group)), "setting": dict(zip(setting_keys, best)),
            f"mean_{metric}": means[best], "seeds": len(chosen),
            "seed_values": [candidate.seed for candidate, _ in chosen],
            "trials": [f"{trials_dir.name}/{candidate.name}" for candidate, _ in chosen],
            "compared": [{"setting": dict(zip(setting_keys, setting)), f"mean_{metric}": mean,
                          "seeds": len(settings[setting])} for setting, mean in means.items()],
        })
    return rows


def rule(metric: str, group_keys: list[str]) -> str:
    return (f"per {', '.join(group_keys) or 'sweep'}, the setting with the highest mean {metric} over its seeds "
            f"(each seed's summary.json, complete runs only; ties to the setting first in the grid)")


def criterion(metric: str, group_keys: list[str], setting_keys: list[str]) -> str:
    return f"{rule(metric, group_keys)}; a setting: {', '.join(setting_keys) or 'the grid varies only the seed'}"


def selection_document(rows: list[dict], metric: str, group_keys: list[str], setting_keys: list[str]) -> dict:
    return {"metric": metric, "group_keys": group_keys, "setting_keys": setting_keys,
            "criterion": criterion(metric, group_keys, setting_keys), "groups": rows}


def write_selection(sweep_dir: Path, document: dict) -> str:
    """selection.md and selection.json; returns the Markdown."""
    text = selection_markdown(document)
    (sweep_dir / SELECTION_MD).write_text(text)
    (sweep_dir / SELECTION_JSON).write_text(json.dumps(document, indent=2) + "\n")
    return text


def selection_markdown(document: dict) -> str:
    metric, rows = document["metric"], document["groups"]
    if not rows:
        return f"No complete trial has a {metric}.\n"
    header = [*document["group_keys"], *document["setting_keys"], f"mean {metric}", "seeds"]
    lines = [f"Selected {document['criterion']}.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        # None: a key of another alternative's (another method's hyper-parameter).
        values = [*row["group"].values(), *row["setting"].values()]
        cells = [*("–" if value is None else str(value) for value in values), f"{row[f'mean_{metric}']:.4f}",
                 str(row["seeds"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read_selection(sweep_dir: Path) -> dict | None:
    """selection.json as `write_selection` wrote it; None where the sweep has none. Raises
    ConfigError where it is not one, or names a trial the sweep directory does not hold."""
    path = sweep_dir / SELECTION_JSON
    if not path.exists():
        return None
    document = read_json(path, str(path), MAX_SELECTION_BYTES)
    try:
        metric = document["metric"]
        if not (isinstance(metric, str) and isinstance(document["criterion"], str)
                and isinstance(document["groups"], list)):
            raise TypeError(document)
        for names in (document["group_keys"], document["setting_keys"], *(row["trials"] for row in document["groups"])):
            if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
                raise TypeError(names)
        for row in document["groups"]:
            if not (isinstance(row["group"], dict) and isinstance(row["setting"], dict)
                    and isinstance(row["compared"], list) and isinstance(row[f"mean_{metric}"], (int, float))):
                raise TypeError(row)
    except (KeyError, TypeError):
        raise ConfigError(f"{path} is not a selection written by rayfed sweep --select") from None
    for row in document["groups"]:
        for trial in row["trials"]:
            if not (sweep_dir / trial).is_dir() or Path(trial).parent != Path(TRIALS):
                raise ConfigError(f"{path} names the trial {trial}, which {sweep_dir / TRIALS} does not hold")
    return document


def _dotted(config: dict, key: str):
    """The value of a dotted key in a nested config; None where its alternative's section lacks it."""
    for part in key.split("."):
        if not isinstance(config, dict) or part not in config:
            return None
        config = config[part]
    return config
