"""Seed statistics of a group: mean ± sample std of the top and final accuracy, and the seed-mean
curves that the target and the plots are read from."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rayfed.report.groups import Group
from rayfed.report.runs import Run


@dataclass
class Spread:
    mean: float
    std: float      # sample std (ddof=1); NaN for a single seed, which has none


@dataclass
class Reached:
    """Where the seed-mean test accuracy first reaches the target; x values are seed means there."""
    round: int
    virtual_time_s: float
    bytes: float


@dataclass
class GroupStats:
    group: Group
    best: Spread
    final: Spread
    reached: Reached | None     # None: never reached, or no target asked for
    wall_time_s: float          # mean over the runs whose summary.json records it; NaN if none does


def spread(values) -> Spread:
    values = np.asarray(values, dtype=float)
    return Spread(float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan)


def group_stats(group: Group, target: float | None) -> GroupStats:
    runs = group.runs
    wall_times = [run.wall_time_s for run in runs if not math.isnan(run.wall_time_s)]
    return GroupStats(
        group=group,
        best=spread([run.test_accuracy.max() for run in runs]),
        final=spread([run.test_accuracy[-1] for run in runs]),
        reached=None if target is None else reached(runs, target),
        wall_time_s=float(np.mean(wall_times)) if wall_times else math.nan,
    )


def reached(runs: list[Run], target: float) -> Reached | None:
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


def first_crossing(values, target: float, below: bool = False) -> int | None:
    """Index of the first of `values` at or above `target` (at or below it with `below`, for a loss);
    None when none is. NaN never crosses."""
    values = np.asarray(values, dtype=float)
    hits = np.flatnonzero(values <= target if below else values >= target)
    return int(hits[0]) if len(hits) else None


def rounds_to_target(metrics: list[dict], key: str, target: float, below: bool = False) -> int | None:
    """The first round (1-based, as metrics.jsonl counts them: the round just completed) whose `key`
    reaches `target` (specs/fedmos.md §7.5: loss <= target or accuracy >= target), among the rounds
    that logged it; None when none does."""
    logged = [m for m in metrics if key in m]
    hit = first_crossing([m[key] for m in logged], target, below)
    return None if hit is None else int(logged[hit]["round"])


AXES = {"round": "rounds", "virtual_time_s": "virtual_time_s", "bytes": "cumulative_bytes"}


def seed_mean_curve(runs: list[Run], metric: str, x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (seed mean at each point), mean and sample std of `metric` over seeds; test_accuracy at the
    evaluated rounds, train_loss at every round. The std is NaN with one seed."""
    at = runs[0].evaluated if metric == "test_accuracy" else slice(None)
    xs = np.mean([getattr(run, AXES[x])[at] for run in runs], axis=0)
    ys = np.array([getattr(run, metric) for run in runs])
    std = ys.std(axis=0, ddof=1) if len(runs) > 1 else np.full(ys.shape[1], math.nan)
    return xs, ys.mean(axis=0), std
