"""Runs grouped by the --group keys' values, and what keeps a group's runs from being averaged."""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from rayfed.errors import ConfigError
from rayfed.report.runs import COMPLETE_STATUSES, Run

# A key a run's config.yaml lacks: an older rayfed's, or another method's own hyper-parameter in
# a sweep whose alternatives set their own.
UNSET = "(unset)"
# How a run was executed, logged or where it found its files, not its maths: runs that differ
# only here (on different machines, say) are comparable.
EXECUTION_PREFIXES = ("engine.", "logging.")
EXECUTION_KEYS = {"data.root", "data.download", "train.checkpoint_every"}


@dataclass
class Group:
    values: tuple                   # the --group keys' values, in --group order
    runs: list[Run]                 # one per seed, ordered by seed, where the configs agree
    mismatches: list[str] = field(default_factory=list)    # why the runs cannot be averaged
    duplicates: list[str] = field(default_factory=list)    # runs left out because their seed was already there


def check_group_keys(keys: list[str], configs: list[dict]) -> None:
    for key in keys:
        if not any(key in config for config in configs):
            raise ConfigError(f"--group key {key!r} is in no run's config.yaml "
                              f"(keys are dotted paths to values, e.g. algorithm.name, data.dataset)")


def group_runs(runs: list[Run], keys: list[str]) -> list[Group]:
    """Groups sorted by their values (numbers numerically), so that the report is deterministic."""
    members = defaultdict(list)
    for run in runs:
        members[tuple(_freeze(run.config.get(key, UNSET)) for key in keys)].append(run)
    groups = [_group(values, members[values], keys) for values in members]
    return sorted(groups, key=lambda group: [sort_key(value) for value in group.values])


def render(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def sort_key(value) -> tuple:
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, (bool, int, float)):
        return (1, value, "")       # compared as they are: float() of a 400-digit integer overflows
    return (2, 0.0, render(value))


def label(keys: list[str], values: tuple) -> str:
    return ", ".join(f"{key}={render(value)}" for key, value in zip(keys, values))


def _freeze(value):
    """Lists from YAML (model.hidden_sizes) as tuples and empty mappings as text, so that values
    can be dictionary keys."""
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    return render(value) if isinstance(value, dict) else value


def _group(values: tuple, runs: list[Run], keys: list[str]) -> Group:
    differences = _config_differences(runs, keys)
    if differences:     # runs of different configs are no seeds of one another, whatever their seeds
        return Group(values, runs, differences)
    # A complete copy of a seed is kept over an interrupted one, so that a re-run replaces the run it repeats.
    runs = sorted(runs, key=lambda run: (sort_key(run.seed), run.status not in COMPLETE_STATUSES, str(run.path)))
    kept, duplicates = [], []
    for run in runs:
        if kept and kept[-1].seed == run.seed:
            duplicates.append(f"{run.path} repeats seed {render(run.seed)} of {kept[-1].path}; counted once")
        else:
            kept.append(run)
    return Group(values, kept, _schedule_differences(kept), duplicates)


def _config_differences(runs: list[Run], keys: list[str]) -> list[str]:
    compared = set().union(*(run.config for run in runs)) - set(keys) - {"seed"} - EXECUTION_KEYS
    differences = []
    for key in sorted(compared):
        if key.startswith(EXECUTION_PREFIXES):
            continue
        by_value = _paths_by(runs, lambda run: _freeze(run.config.get(key, UNSET)))
        if len(by_value) > 1:
            differences.append(f"{key} differs: {_listing({render(v): paths for v, paths in by_value.items()})}")
    return differences


def _schedule_differences(runs: list[Run]) -> list[str]:
    """Seed means need the same rounds, evaluated at the same rounds, in every run; a run that
    stopped at its target has the rounds of the others up to where it stopped."""
    def schedule(run: Run) -> tuple[tuple, tuple]:
        return tuple(run.rounds.tolist()), tuple(run.rounds[run.evaluated].tolist())

    full_rounds, full_evaluated = schedule(max(runs, key=lambda run: len(run.rounds)))

    def fits(run: Run) -> bool:
        rounds, evaluated = schedule(run)
        return (rounds == full_rounds[:len(rounds)]
                and evaluated == tuple(r for r in full_evaluated if r <= rounds[-1])
                and (len(rounds) == len(full_rounds) or run.stopped_at_target))

    if all(fits(run) for run in runs):
        return []
    by_schedule = _paths_by(runs, schedule)
    described = {_describe_schedule(*schedule): paths for schedule, paths in by_schedule.items()}
    return [f"rounds or evaluated rounds differ: {_listing(described)}"]


def _describe_schedule(rounds: tuple, evaluated: tuple) -> str:
    shown = evaluated if len(evaluated) <= 5 else [*evaluated[:3], "…", evaluated[-1]]
    return f"{len(rounds)} rounds, evaluated at {', '.join(map(str, shown))}"


def _paths_by(runs: list[Run], value_of) -> dict:
    paths = defaultdict(list)
    for run in runs:
        paths[value_of(run)].append(str(run.path))
    return paths


def _listing(paths_by_value: dict[str, list[str]]) -> str:
    return "; ".join(f"{value} ({', '.join(paths)})" for value, paths in sorted(paths_by_value.items()))
