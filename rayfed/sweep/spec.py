"""A sweep file: a base config (a path, or a mapping inline) and a grid of dotted keys to lists of
values. Every point of the grid is one trial: `rayfed run BASE overrides... point...`.

    base: experiments/gradma/synthetic_dirichlet.yaml
    grid:
      algorithm.name: [fedavg, fedavgm, gradma_s]
      algorithm.lr_local: [0.01, 0.05, 0.1]
      seed: [0, 1, 2]
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path

import yaml

from rayfed.config import Config, check_path
from rayfed.preflight import load_config
from rayfed.errors import ConfigError

SWEEP_KEYS = ("base", "grid")
# A trial's directory is named by its point while that stays a readable file name.
MAX_TRIAL_NAME = 150


@dataclass(frozen=True)
class Trial:
    name: str
    point: tuple[tuple[str, object], ...]   # the grid's (key, value) pairs, in the file's order
    overrides: tuple[str, ...]              # the command line's overrides, then the point's
    config: Config                          # resolved: what the trial's run directory will hold

    @property
    def label(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.point)


@dataclass(frozen=True)
class Sweep:
    base_text: str          # the base config as YAML text, as every trial reads it
    grid: dict[str, list]
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
    if not Path(path).is_file():
        raise ConfigError(f"sweep file {path} does not exist")
    try:
        spec = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"sweep file {path} is not valid YAML ({type(error).__name__})") from None
    if not isinstance(spec, dict) or set(spec) - set(SWEEP_KEYS) or "grid" not in spec:
        raise ConfigError(f"sweep file {path} must be a mapping with the keys base (a config file or mapping; "
                          f"optional) and grid (dotted keys to lists of values)")
    base_text = _base_text(spec.get("base"), Path(path))
    grid = _grid(spec["grid"], path)
    base_copy.write_text(base_text)
    trials = [_trial(base_copy, tuple(overrides), tuple(zip(grid, values)))
              for values in itertools.product(*grid.values())]
    return Sweep(base_text, grid, tuple(overrides), trials)


def _base_text(base, sweep_file: Path) -> str:
    if base is None or isinstance(base, dict):
        return yaml.safe_dump(base or {}, sort_keys=False)
    if not isinstance(base, str):
        raise ConfigError(f"sweep file {sweep_file}: base must be a config file's path or a mapping of keys")
    check_path("base", base)
    # Relative to where rayfed runs, as for `rayfed run`, else to the sweep file.
    for candidate in (Path(base), sweep_file.parent / base):
        if candidate.is_file():
            load_config(candidate)      # its own errors, named by its own path
            return candidate.read_text(encoding="utf-8")
    raise ConfigError(f"sweep file {sweep_file}: base config {base} does not exist")


def _grid(grid, path: str) -> dict[str, list]:
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"sweep file {path}: grid must map dotted keys to lists of values, e.g. seed: [0, 1, 2]")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep file {path}: grid key {key} must have a non-empty list of values")
        if len({yaml.safe_dump(value) for value in values}) < len(values):
            raise ConfigError(f"sweep file {path}: grid key {key} repeats a value")
    return {str(key): values for key, values in grid.items()}


def _trial(base: Path, overrides: tuple[str, ...], point: tuple[tuple[str, object], ...]) -> Trial:
    point_overrides = tuple(f"{key}={_as_override(value)}" for key, value in point)
    label = ", ".join(point_overrides)
    try:
        config = load_config(base, [*overrides, *point_overrides])
    except ConfigError as error:
        raise ConfigError(f"grid point ({label}): {error}") from None
    return Trial(_name(point_overrides), point, (*overrides, *point_overrides), config)


def _as_override(value) -> str:
    """The value as the right-hand side of key=value, which is read as YAML."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()


def _name(point_overrides: tuple[str, ...]) -> str:
    name = "__".join(point_overrides).replace("/", "_")
    if len(name) <= MAX_TRIAL_NAME:
        return name
    return f"{name[:MAX_TRIAL_NAME - 17]}-{hashlib.sha1(name.encode()).hexdigest()[:16]}"
