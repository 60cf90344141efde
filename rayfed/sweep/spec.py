"""A sweep file: a base config (a path, or a mapping inline) and a grid of dotted keys to lists of
values (`rayfed.sweep.grid`, where sections take alternatives with sub-grids of their own). Every
point of the grid is one trial: `rayfed run BASE overrides... point...`.

    base: experiments/gradma/synthetic_dirichlet.yaml
    grid:
      algorithm.name: [fedavg, fedavgm, gradma_s]
      algorithm.lr_local: [0.01, 0.05, 0.1]
      seed: [0, 1, 2]
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from rayfed.config import Config, check_path
from rayfed.preflight import load_config
from rayfed.errors import ConfigError
from rayfed.input_files import read_yaml
from rayfed.sweep.grid import Grid, Point, parse_grid, points

SWEEP_KEYS = ("base", "grid")
# A trial's directory is named by its point while that stays a readable file name.
MAX_TRIAL_NAME = 150


@dataclass(frozen=True)
class Trial:
    name: str
    point: Point                            # the grid's (key, value) pairs, in the file's order
    overrides: tuple[str, ...]              # the command line's overrides, then the point's
    config: Config                          # resolved: what the trial's run directory will hold

    @property
    def label(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.point)


@dataclass(frozen=True)
class Sweep:
    base_text: str          # the base config as YAML text, as every trial reads it
    grid: dict              # as the sweep file gives it
    parsed: Grid
    overrides: tuple[str, ...]
    trials: list[Trial]

    def describe(self) -> str:
        """What makes two sweeps the same sweep: a sweep directory holds one."""
        return yaml.safe_dump({"base": self.base_text, "grid": self.grid, "overrides": list(self.overrides)},
                              sort_keys=False)


def read_sweep(path: str, overrides: list[str], base_copy: Path) -> Sweep:
    """Reads and expands the sweep file, and validates every point by resolving its config; the
    base config is written to `base_copy` (trials read it from there). Raises ConfigError."""
    check_path("sweep file", path)
    spec = read_yaml(path, f"sweep file {path}")
    if not isinstance(spec, dict) or set(spec) - set(SWEEP_KEYS) or "grid" not in spec:
        raise ConfigError(f"sweep file {path} must be a mapping with the keys base (a config file or mapping; "
                          f"optional) and grid (dotted keys to lists of values)")
    base_text = _base_text(spec.get("base"), Path(path), overrides)
    grid = parse_grid(spec["grid"], f"sweep file {path}")
    base_copy.write_text(base_text)
    expanded = points(grid)
    written = _written(expanded)
    trials = [_trial(base_copy, tuple(overrides), point, tuple(written[key, id(value)] for key, value in point))
              for point in expanded]
    named: dict[str, Trial] = {}
    for trial in trials:
        if named.setdefault(trial.name, trial) is not trial:
            raise ConfigError(f"sweep file {path}: the grid gives the point ({trial.label}) twice")
    return Sweep(base_text, spec["grid"], grid, tuple(overrides), trials)


def _base_text(base, sweep_file: Path, overrides: list[str]) -> str:
    if base is None or isinstance(base, dict):
        return yaml.safe_dump(base or {}, sort_keys=False)
    if not isinstance(base, str):
        raise ConfigError(f"sweep file {sweep_file}: base must be a config file's path or a mapping of keys")
    check_path("base", base)
    # Relative to where rayfed runs, as for `rayfed run`, else to the sweep file.
    for candidate in (Path(base), sweep_file.parent / base):
        if candidate.is_file():
            # Its own errors, named by its own path; with the command line's overrides, which may
            # name the dataset or data.root that its checks look for.
            load_config(candidate, overrides)
            return candidate.read_text(encoding="utf-8")
    raise ConfigError(f"sweep file {sweep_file}: base config {base} does not exist")


def _trial(base: Path, overrides: tuple[str, ...], point: tuple[tuple[str, object], ...],
           point_overrides: tuple[str, ...]) -> Trial:
    label = ", ".join(point_overrides)
    try:
        config = load_config(base, [*overrides, *point_overrides])
    except ConfigError as error:
        raise ConfigError(f"grid point ({label}): {error}") from None
    return Trial(_name(point_overrides), point, (*overrides, *point_overrides), config)


def _written(expanded: list[Point]) -> dict[tuple[str, int], str]:
    """Each key and value of the points as key=value, by (key, id(value)): the points share the grid's
    few value objects, and writing them as YAML point by point was a quarter of the time a 1,404-point
    sweep took to read. By the object, not its repr: YAML writes a list that repeats an aliased
    element otherwise than its copy; `expanded` holds every value, so no id is reused meanwhile."""
    written: dict[tuple[str, int], str] = {}
    for point in expanded:
        for key, value in point:
            if (key, id(value)) not in written:
                written[key, id(value)] = f"{key}={_as_override(value)}"
    return written


def _as_override(value) -> str:
    """The value as the right-hand side of key=value, which is read as YAML."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()


def _name(point_overrides: tuple[str, ...]) -> str:
    """Points' names differ where their overrides do: "%" and "/" are escaped as in a URL, and so
    is a "__" within an override, which joins them; no override starts with "_", which no config
    key does. A name too long for a readable file name keeps a hash of the whole."""
    escaped = [override.replace("%", "%25").replace("/", "%2F").replace("__", "_%5F") for override in point_overrides]
    return shortened("__".join(escaped), MAX_TRIAL_NAME)


def shortened(name: str, limit: int) -> str:
    if len(name) <= limit:
        return name
    return f"{name[:limit - 17]}-{hashlib.sha1(name.encode()).hexdigest()[:16]}"
