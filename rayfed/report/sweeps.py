"""Which runs a report on sweep directories averages, grouped how, and the sentences that say so.

A sweep directory is what `rayfed sweep --out DIR` writes: sweep.yaml (its base, grid and
overrides) and trials/, one run directory per grid point. Without other flags its report is the
paper's table: with a selection (selection.json, or --select) one row per group, the selected
setting's mean ± std over its seeds; without one, one row per setting of the grid."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rayfed.errors import ConfigError
from rayfed.input_files import read_yaml
from rayfed.report.runs import find_run_dirs
from rayfed.sweep.cli import MAX_SWEEP_FILE_BYTES, SWEEP_FILE
from rayfed.sweep.grid import Grid, parse_grid, varied_keys
from rayfed.sweep.select import (SELECTION_JSON, SELECTION_MD, TRIALS, read_selection, select_from_trials,
                                 rule, selection_document, setting_keys_of)

DEFAULT_GROUP = ["algorithm.name"]


@dataclass
class SweepDir:
    path: Path
    grid: Grid


@dataclass
class Plan:
    paths: list[Path]       # the run directories to read
    keys: list[str]         # the table's group columns
    notes: list[str]        # how the rows were chosen, for the report's text
    # Keys of the sweeps' settings, not of --group: one that no run read has (the hyper-parameter
    # of a method none of whose trials completed) is no column.
    optional: list[str] = field(default_factory=list)


def read_sweep_dir(path: Path) -> SweepDir | None:
    """The sweep in `path`; None where `path` is no sweep directory."""
    description = path / SWEEP_FILE
    if not (description.exists() and (path / TRIALS).is_dir()):
        return None
    spec = read_yaml(description, str(description), MAX_SWEEP_FILE_BYTES)
    what = f"{description} is not a sweep's description as rayfed sweep writes it"
    if not isinstance(spec, dict) or "grid" not in spec:
        raise ConfigError(f"{what} (a mapping with base, grid and overrides)")
    try:
        return SweepDir(path, parse_grid(spec["grid"], SWEEP_FILE))
    except ConfigError as error:
        raise ConfigError(f"{what} ({error})") from None


def plan(dirs: list[str], keys: list[str] | None, metric: str | None) -> Plan:
    for name in dirs:
        if not Path(name).is_dir():
            raise ConfigError(f"{name!r} is not a directory")
    sweeps = [read_sweep_dir(Path(name)) for name in dirs]
    if metric is not None:
        others = [name for name, sweep in zip(dirs, sweeps) if sweep is None]
        if others:
            raise ConfigError(f"--select chooses among a sweep's trials, and {others[0]!r} is no sweep directory "
                              f"(the {SWEEP_FILE} and {TRIALS}/ that rayfed sweep --out writes)")
        return _selected(sweeps, [_computed(sweep, metric, keys or DEFAULT_GROUP) for sweep in sweeps],
                         "chosen here (--select) from the trials' summary.json")
    if keys is not None or None in sweeps:
        return Plan(find_run_dirs(dirs), keys or DEFAULT_GROUP, [])
    selections = [read_selection(sweep.path) for sweep in sweeps]
    if all(selections):
        return _selected(sweeps, selections, f"as rayfed sweep --select wrote it in {SELECTION_JSON}")
    if any(selections):
        having = [str(sweep.path) for sweep, selection in zip(sweeps, selections) if selection]
        lacking = [str(sweep.path) for sweep, selection in zip(sweeps, selections) if not selection]
        raise ConfigError(f"{', '.join(having)} hold(s) a {SELECTION_JSON} and {', '.join(lacking)} none: "
                          f"--select METRIC selects in all of them, --group KEY ... averages every setting")
    return _grid(sweeps)


def _computed(sweep: SweepDir, metric: str, group_keys: list[str]) -> dict:
    rows = select_from_trials(sweep.path, sweep.grid, metric, group_keys)
    return selection_document(rows, metric, group_keys, setting_keys_of(sweep.grid, group_keys))


def _selected(sweeps: list[SweepDir], selections: list[dict], source: str) -> Plan:
    paths = [sweep.path / trial for sweep, selection in zip(sweeps, selections)
             for row in selection["groups"] for trial in row["trials"]]
    if not paths:
        raise ConfigError(f"no complete trial in {', '.join(str(sweep.path) for sweep in sweeps)} has a "
                          f"{selections[0]['metric']} to select by")
    keys = _union([*(selection["group_keys"] for selection in selections),
                   *(selection["setting_keys"] for selection in selections)])
    by_rule: dict[tuple, list[tuple[SweepDir, dict]]] = {}
    for sweep, selection in zip(sweeps, selections):
        by_rule.setdefault((selection["metric"], tuple(selection["group_keys"])), []).append((sweep, selection))
    notes = []
    for (metric, group_keys), chosen in by_rule.items():
        where = "; ".join(f"{max((len(row['compared']) for row in selection['groups']), default=0)} of "
                          f"{', '.join(selection['setting_keys']) or 'the seed alone'} in {sweep.path}"
                          for sweep, selection in chosen)
        notes.append(f"Selected {rule(metric, list(group_keys))}, {source}. Settings compared per group: {where}. "
                     f"Each row gives the selected setting's seeds, the runs the selection averaged.")
    return Plan(paths, keys, notes, optional=_union([selection["setting_keys"] for selection in selections]))


def _grid(sweeps: list[SweepDir]) -> Plan:
    keys = _union([varied_keys(sweep.grid) for sweep in sweeps])
    shown = ", ".join(keys) if keys else "nothing but the seed"
    notes = [f"Every setting of the grid of {', '.join(str(sweep.path) for sweep in sweeps)}: the sweep varies "
             f"{shown}; each row is one setting averaged over its seeds."]
    for sweep in sweeps:
        if (sweep.path / SELECTION_MD).is_file():
            notes.append(f"{sweep.path / SELECTION_MD} has no {SELECTION_JSON} beside it (an older rayfed sweep "
                         f"wrote it): rayfed report {sweep.path} --select METRIC reports the selection, chosen "
                         f"again from the trials.")
    return Plan(find_run_dirs([str(sweep.path / TRIALS) for sweep in sweeps]), keys, notes, optional=keys)


def _union(key_lists) -> list[str]:
    keys: list[str] = []
    for key_list in key_lists:
        keys += [key for key in key_list if key not in keys]
    return keys
