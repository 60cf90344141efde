"""Seed statistics of a group: mean ± sample std of the top and final accuracy, rounds to a target
(on the seed-mean curve, or per seed for runs that stopped at their target), and the seed-mean
curves that the plots draw."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from rayfed.report.groups import Group
from rayfed.report.runs import Run


def quiet(function):
    """Values a file can hold (1e308) can have a sum beyond a double's range: the statistics are
    then inf or NaN, which the report says, rather than numpy's warnings."""
    @functools.wraps(function)
    def without_warnings(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore"):
            return function(*args, **kwargs)
    return without_warnings


@dataclass
class Spread:
    mean: float
    std: float      # sample std (ddof=1); NaN for a single seed, which has none
    overflow: bool = False      # the seeds' values are finite, their mean or std is not


@dataclass
class Reached:
    """Where a group first reaches the target. On the seed-mean curve: that round, and the seeds'
    mean x values there. Per seed: the means over seeds of each seed's own first round and x values."""
    round: float
    virtual_time_s: float
    bytes: float
    round_std: float | None = None  # per seed: the sample std of the rounds (NaN: one seed); None: seed-mean curve


@dataclass
class GroupStats:
    group: Group
    best: Spread
    final: Spread
    target: float | None        # the test accuracy whose reaching is reported; None: none asked for or set
    reached: Reached | None     # None: never reached (by the seed mean, or by every seed), or no target
    per_seed: bool              # its runs stopped at their target, so rounds are counted per seed
    seeds_reached: int          # per seed: how many seeds reached the target
    seeds_unknown: int          # per seed: runs that stopped at a lower target of their own, before this one
    wall_time_s: float          # mean over the runs whose summary.json records it; NaN if none does
    epsilon: Spread | None = None   # the privacy spent (the last dp_epsilon a run logged); None: no run is private


@quiet
def spread(values) -> Spread:
    values = np.asarray(values, dtype=float)
    mean, std = float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan
    finite = math.isfinite(mean) and (len(values) == 1 or math.isfinite(std))
    return Spread(mean, std, overflow=bool(np.isfinite(values).all()) and not finite)


def group_target(group: Group, target: float | None) -> float | None:
    """The --target, else the train.target_accuracy that every run of the group shares."""
    if target is not None:
        return target
    targets = {run.config.get("train.target_accuracy") for run in group.runs}
    shared = targets.pop() if len(targets) == 1 else None
    return float(shared) if isinstance(shared, (int, float)) and not isinstance(shared, bool) else None


@quiet
def group_stats(group: Group, target: float | None) -> GroupStats:
    runs = group.runs
    wall_times = [run.wall_time_s for run in runs if not math.isnan(run.wall_time_s)]
    # A run that stopped at its target has no curve after it, so the seed-mean curve ends where
    # the first seed stopped: such a group counts each seed's own round to the target.
    per_seed = any(run.stopped_at_target for run in runs)
    reached, seeds_reached, seeds_unknown = None, 0, 0
    if target is not None and per_seed:
        reached, seeds_reached, seeds_unknown = reached_per_seed(runs, target)
    elif target is not None:
        reached = reached_on_seed_mean(runs, target)
    return GroupStats(
        group=group,
        best=spread([run.test_accuracy.max() for run in runs]),
        final=spread([run.test_accuracy[-1] for run in runs]),
        target=target, reached=reached, per_seed=per_seed,
        seeds_reached=seeds_reached, seeds_unknown=seeds_unknown,
        wall_time_s=float(np.mean(wall_times)) if wall_times else math.nan,
        epsilon=spread([_last_logged(run, "dp_epsilon") for run in runs])
        if any(run.logged_at("dp_epsilon").any() for run in runs) else None,
    )


def _last_logged(run: Run, key: str) -> float:
    logged = run.logged_at(key)
    return float(run.column(key)[logged][-1]) if logged.any() else math.nan


def reached_on_seed_mean(runs: list[Run], target: float) -> Reached | None:
    """On the seed-mean curve, as the papers count rounds to an accuracy; not the mean of each
    seed's own first round, which would credit a target the average model never reaches."""
    mean_accuracy = np.mean([run.test_accuracy for run in runs], axis=0)
    hit = first_crossing(mean_accuracy, target)
    if hit is None:
        return None
    at = runs[0].evaluated[hit]
    return Reached(round=int(runs[0].rounds[at]),
                   virtual_time_s=float(np.mean([run.virtual_time_s[at] for run in runs])),
                   bytes=float(np.mean([run.cumulative_bytes[at] for run in runs])))


def reached_per_seed(runs: list[Run], target: float) -> tuple[Reached | None, int, int]:
    """Each seed's first evaluated round at or above the target (for a run that stopped at this
    very target, its summary's target_round), averaged when every seed reached it; with how many
    did, and how many stopped at a lower target of their own before reaching it."""
    rounds, times, sizes, unknown = [], [], [], 0
    for run in runs:
        hit = first_crossing(run.test_accuracy, target)
        if hit is None:
            unknown += run.stopped_at_target
            continue
        at = run.evaluated[hit]
        rounds.append(run.rounds[at])
        times.append(run.virtual_time_s[at])
        sizes.append(run.cumulative_bytes[at])
    if len(rounds) < len(runs):
        return None, len(rounds), unknown
    by_seed = spread(rounds)
    return Reached(by_seed.mean, float(np.mean(times)), float(np.mean(sizes)), by_seed.std), len(rounds), 0


def first_crossing(values, target: float, below: bool = False) -> int | None:
    """Index of the first of `values` at or above `target` (at or below it with `below`, for a loss);
    None when none is. NaN never crosses."""
    values = np.asarray(values, dtype=float)
    hits = np.flatnonzero(values <= target if below else values >= target)
    return int(hits[0]) if len(hits) else None


def rounds_to_target(metrics: list[dict], key: str, target: float, below: bool = False) -> int | None:
    """The first round (1-based, as metrics.jsonl counts them: the round just completed) whose `key`
    reaches `target` (a loss at most the target, an accuracy at least it), among the rounds that
    logged it; None when none does."""
    logged = [m for m in metrics if key in m]
    hit = first_crossing([m[key] for m in logged], target, below)
    return None if hit is None else int(logged[hit]["round"])


AXES = {"round": "rounds", "virtual_time_s": "virtual_time_s", "bytes": "cumulative_bytes"}


@quiet
def seed_mean_curve(runs: list[Run], metric: str, x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (seed mean at each point), mean and sample std of `metric` over seeds, at the rounds where
    every seed logged it (test_accuracy: the evaluated rounds) up to the last round every seed ran
    (runs that stopped at a target end early). The std is NaN with one seed; a mean or std beyond
    a double's range is NaN too, which plots leave out."""
    length = min(len(run.rounds) for run in runs)
    at = np.flatnonzero(np.logical_and.reduce([run.logged_at(metric)[:length] for run in runs]))
    xs = np.mean([getattr(run, AXES[x])[at] for run in runs], axis=0)
    ys = np.array([run.column(metric)[at] for run in runs])
    std = ys.std(axis=0, ddof=1) if len(runs) > 1 else np.full(ys.shape[1], math.nan)
    return tuple(np.where(np.isfinite(values), values, math.nan) for values in (xs, ys.mean(axis=0), std))
