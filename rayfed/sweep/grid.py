"""A sweep's grid: dotted config keys to lists of values, every combination a point. A key that
names a config section (algorithm, train, ...) takes instead a list of alternatives, each a mapping
of that section's keys to a value or a list of values: its own sub-grid, as Ray Tune expands a
grid_search over mappings that hold grid searches of their own. Methods with hyper-parameters of
their own are so compared in one sweep:

    grid:
      algorithm:
        - {name: fedavgm, beta1: [0.5, 0.9]}
        - {name: fedprox, mu: [0.001, 0.01, 0.1]}
      algorithm.lr_local: [0.01, 0.1]
      seed: [0, 1, 2]

is (2 + 3) x 2 x 3 = 30 points, in the file's order: fedavgm's 12, then fedprox's 18."""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import yaml

from rayfed.config import all_keys
from rayfed.errors import ConfigError, show

# Every point is resolved (about 2 ms each) before a trial starts, and Tune holds every trial.
MAX_POINTS = 10_000

Point = tuple[tuple[str, object], ...]     # (dotted key, value) pairs, in the grid's order


@dataclass(frozen=True)
class Axis:
    key: str
    values: list


@dataclass(frozen=True)
class Alternatives:
    key: str                                # the section
    branches: list[list[Axis | Alternatives]]   # each alternative's own grid, its keys in full


Grid = list[Axis | Alternatives]


def parse_grid(grid, where: str) -> Grid:
    """The grid of a sweep file (or of a sweep.yaml that `rayfed sweep` wrote); ConfigError, starting
    with `where`, unless it is one of at most MAX_POINTS points whose keys are each set once."""
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{where}: grid must map dotted keys to lists of values, e.g. seed: [0, 1, 2]")
    parsed = _axes(grid, "", where, top=True)
    count = size(parsed)        # before anything is expanded
    if count > MAX_POINTS:
        raise ConfigError(f"{where}: the grid has {count} points; a sweep may have at most {MAX_POINTS}")
    _check_keys_set_once(parsed, where)
    return parsed


def size(grid: Grid) -> int:
    return math.prod(_axis_size(axis) for axis in grid)


def points(grid: Grid) -> list[Point]:
    return [sum(parts, ()) for parts in itertools.product(*(_axis_points(axis) for axis in grid))]


def varied_keys(grid: Grid) -> list[str]:
    """The keys whose values tell the grid's settings apart, seed aside: those with more than one
    value, and an alternative's keys that another alternative lacks or sets otherwise."""
    expanded = [dict(point) for point in points(grid)]
    return [key for key in dict.fromkeys(_keys(grid)) if key != "seed"
            and len({_text(point[key]) if key in point else None for point in expanded}) > 1]


def position(grid: Grid, config: dict) -> tuple:
    """Where the point of a run's config (dotted keys, as its config.yaml holds them) comes in the
    grid's expansion; a value the grid does not list goes last."""
    return tuple(_axis_position(axis, config) for axis in grid)


def _axes(grid: dict, prefix: str, where: str, top: bool) -> Grid:
    axes: Grid = []
    for key, values in grid.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}: grid key {show(key)} is not a dotted config key")
        full = f"{prefix}{key}"
        if _is_section(full) and isinstance(values, list) and values and all(isinstance(v, dict) for v in values):
            axes.append(_alternatives(full, values, where))
        elif _is_section(full):
            raise ConfigError(f"{where}: grid key {full} is a section: give it a list of alternatives, each a mapping "
                              f"of its keys to a value or a list of values, e.g. - {{name: fedprox, mu: [0.01, 0.1]}}")
        elif isinstance(values, list) and values:
            axes.append(Axis(full, _distinct(values, full, where)))
        elif top:
            raise ConfigError(f"{where}: grid key {full} must have a non-empty list of values")
        elif isinstance(values, (list, dict)):
            raise ConfigError(f"{where}: {key} must be a value or a non-empty list of values")
        else:
            axes.append(Axis(full, [values]))      # in an alternative, a single value needs no list
    return axes


def _alternatives(key: str, alternatives: list[dict], where: str) -> Alternatives:
    branches = []
    for number, alternative in enumerate(alternatives, 1):
        named = f"{where}: grid key {key}, alternative {number}"
        if not alternative:
            raise ConfigError(f"{named} is empty; it must set at least one key")
        branches.append(_axes(alternative, f"{key}.", named, top=False))
    return Alternatives(key, branches)


def _distinct(values: list, key: str, where: str) -> list:
    if len({_text(value) for value in values}) < len(values):
        raise ConfigError(f"{where}: grid key {key} repeats a value")
    return values


def _check_keys_set_once(grid: Grid, where: str) -> None:
    """A key that two parts of a point set would be set twice, the later silently winning."""
    for combination in itertools.product(*(_key_sets(axis) for axis in grid)):
        seen: dict[str, None] = {}
        for keys in combination:
            for key in keys:
                if key in seen:
                    raise ConfigError(f"{where}: grid key {key} is set twice in one point, once in an alternative")
                seen[key] = None


def _key_sets(axis: Axis | Alternatives) -> list[tuple[str, ...]]:
    """The keys a point takes from the axis, one tuple per way it can take them."""
    if isinstance(axis, Axis):
        return [(axis.key,)]
    return [sum(keys, ()) for branch in axis.branches for keys in itertools.product(*map(_key_sets, branch))]


def _keys(grid: Grid) -> list[str]:
    """Every key of the grid in the file's order, the alternatives' keys one alternative after another."""
    return [key for axis in grid
            for key in ([axis.key] if isinstance(axis, Axis) else [k for b in axis.branches for k in _keys(b)])]


def _axis_size(axis: Axis | Alternatives) -> int:
    if isinstance(axis, Axis):
        return len(axis.values)
    return sum(size(branch) for branch in axis.branches)


def _axis_points(axis: Axis | Alternatives) -> list[Point]:
    if isinstance(axis, Axis):
        return [((axis.key, value),) for value in axis.values]
    return [point for branch in axis.branches for point in points(branch)]


def _axis_position(axis: Axis | Alternatives, config: dict):
    if isinstance(axis, Axis):
        return next((i for i, value in enumerate(axis.values) if value == config.get(axis.key)), len(axis.values))
    for number, branch in enumerate(axis.branches):
        places = position(branch, config)
        if all(place < _axis_size(part) if isinstance(part, Axis) else place[0] < len(part.branches)
               for part, place in zip(branch, places)):
            return (number, *places)
    return (len(axis.branches),)


def _text(value) -> str:
    return yaml.safe_dump(value)


@functools.cache
def _sections() -> frozenset[str]:
    parts = [key.split(".") for key in all_keys()]
    return frozenset(".".join(part[:end]) for part in parts for end in range(1, len(part)))


def _is_section(key: str) -> bool:
    return key in _sections()
