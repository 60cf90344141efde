"""`rayfed sweep FILE --plan`: the trials, what tells them apart, and how long the sweep would take
here, without running it. The time per round comes from a calibration: a few rounds of one trial
of each group (trials that differ only in their seed and in real-valued hyper-parameters such as
learning rates, which change the numbers computed, not how many), run in a temporary directory
that is then deleted. Where the group's trials pack (rayfed.sweep.pack), the calibration runs a whole
pack, and s/round is the pack's. The estimate is

    sum over groups of packs x rounds x s/round / concurrency  +  start-up

where concurrency is how many packs (trials, unpacked) Tune runs at once on the resources, and start-up is Ray's
start and the trial processes' (once per sweep) and, per trial, Tune's hand-over and the run's
own start (config, data, model), which the calibration measures."""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import rayfed
from rayfed.engine.pack import Pack
from rayfed.errors import RunStopped
from rayfed.preflight import load_config
from rayfed.sweep.pack import packs
from rayfed.sweep.grid import varied_keys
from rayfed.sweep.resources import trial_bundles, trial_slots
from rayfed.sweep.spec import Sweep, Trial

CALIBRATION_ROUNDS = 3
# One-off and per-trial start-up of a sweep, as `rayfed bench study` measured it on a shared 2-core
# machine (docs/how-to/sweeps.md): Ray's start, the trial processes' start (their imports of Ray
# Tune, PyTorch and rayfed), and Tune's hand-over of a trial to a process that ran one before.
RAY_START_S = 20.0
PROCESSES_START_S = 30.0
TUNE_PER_TRIAL_S = 0.15


@dataclass(frozen=True)
class Group:
    label: str
    trials: list[Trial]


@dataclass(frozen=True)
class Calibration:
    trial: Trial
    members: int                # the trials of the calibrated pack (1: a trial alone)
    rounds: int
    round_s: float              # the pack's
    startup_s: float            # a run's own start: config, data, model


def groups(sweep: Sweep) -> list[Group]:
    """The trials by what may change their cost: the point without its seed and real-valued keys."""
    grouped: dict[tuple, list[Trial]] = {}
    for trial in sweep.trials:
        key = tuple((name, value) for name, value in trial.point if name != "seed" and not isinstance(value, float))
        grouped.setdefault(key, []).append(trial)
    return [Group(", ".join(f"{name}={value}" for name, value in key) or "all", trials)
            for key, trials in grouped.items()]


def calibrate(trials: list[Trial], base: Path) -> Calibration | None:
    """A few rounds of `trials` as one pack (or of the first trial, alone); None if all diverge in them. A run's
    rounds (the median, past the first) last the pack's where the runs take turns at pooled passes; where they do
    not (a local objective's passes are each run's own), the runs go one after another, so a pack's round is also
    at least its wall time, less the runs' start-ups, over the rounds."""
    rounds = min(CALIBRATION_ROUNDS, trials[0].config.train.rounds)
    configs = [load_config(base, [*trial.overrides, f"train.rounds={rounds}"]) for trial in trials]
    with tempfile.TemporaryDirectory() as scratch:
        jobs = [lambda config=config, index=index: rayfed.run(config, run_dir=Path(scratch) / f"run{index}",
                                                              progress=False) for index, config in enumerate(configs)]
        started = perf_counter()
        outcomes = Pack().run(jobs) if len(jobs) > 1 else _alone(jobs[0])
        elapsed = perf_counter() - started
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, RunStopped):
            raise outcome
    finished = [(trial, result) for trial, result in zip(trials, outcomes) if not isinstance(result, RunStopped)]
    if not finished:
        return None
    trial, result = finished[0]
    walls = [record["wall_time_s"] for record in result.history]
    per_round = [later - earlier for earlier, later in zip(walls, walls[1:])] or walls
    startup_s = result.summary["startup_time_s"]
    pack_round_s = max(0.0, elapsed - startup_s * len(trials)) / rounds
    return Calibration(trial, len(trials), rounds, max(statistics.median(per_round), pack_round_s), startup_s)


def _alone(job) -> list:
    try:
        return [job()]
    except RunStopped as stopped:
        return [stopped]


def plan_text(sweep: Sweep, sweep_file: str, base: Path, done: set[str], sweep_dir: Path, pack_limit: int) -> str:
    pending = [trial for trial in sweep.trials if trial.name not in done]
    lines = [f"rayfed: plan of {sweep_file}: {len(sweep.trials)} trials, {len(done)} of them done in {sweep_dir}"]
    varied = [*varied_keys(sweep.parsed), *(["seed"] if len(_values(sweep, "seed")) > 1 else [])]
    lines.append("  what differs: " + (" x ".join(f"{key} ({', '.join(map(str, _values(sweep, key)))})"
                                                  for key in varied) or "nothing"))
    if not pending:
        lines.append("  nothing to run")
        return "\n".join(lines) + "\n"
    cpus, gpus = os.cpu_count() or 1, _gpus()
    available = {"CPU": float(cpus), "GPU": float(gpus)}
    packed = packs(pending, pack_limit)
    slots = min(trial_slots(trial_bundles(pack[0].config), available, len(packed)) for pack in packed)
    reserved = sum(bundle["CPU"] for bundle in trial_bundles(pending[0].config))
    lines.append(f"  packing: {len(pending)} trials to run in {len(packed)} pack{'s' if len(packed) != 1 else ''} "
                 f"of at most {pack_limit} (--pack)")
    lines.append(f"  concurrency: {slots} packs at once (this machine's {cpus} CPUs{f', {gpus} GPUs' if gpus else ''}"
                 f"; a pack reserves {reserved:g} CPU{'' if reserved == 1 else 's'})")
    lines.append(f"  calibration: {CALIBRATION_ROUNDS} rounds of one pack per group, in a temporary directory that "
                 f"is deleted")
    header = (f"  {'group':<40} {'trials':>6} {'rounds':>6} {'s/round':>8} {'start-up':>8} {'packing':>7} "
              f"{'estimate':>9}")
    rows, run_s, per_trial_s = [], 0.0, 0.0
    for number, group in enumerate(groups(sweep), 1):
        todo = [trial for trial in group.trials if trial.name not in done]
        if not todo:
            continue
        group_packs = packs(todo, pack_limit)
        print(f"rayfed: calibrating group {number}: {group.label}", file=sys.stderr)
        calibration = calibrate(group_packs[0], base)
        rounds = sum(trial.config.train.rounds for trial in todo)
        if calibration is None:
            rows.append(f"  {group.label:<40} {len(todo):>6} {rounds // len(todo):>6} {'diverged':>8}")
            continue
        print(f"rayfed: calibrated on {calibration.trial.name} (in a pack of {calibration.members}): "
              f"{calibration.rounds} rounds, {calibration.round_s:.3f} s/round", file=sys.stderr)
        group_run = sum(pack[0].config.train.rounds for pack in group_packs) * calibration.round_s
        packing = f"{len(group_packs)}x{len(group_packs[0])}"
        group_startup = len(todo) * (calibration.startup_s + TUNE_PER_TRIAL_S)
        run_s += group_run
        per_trial_s += group_startup
        rows.append(f"  {group.label:<40} {len(todo):>6} {rounds // len(todo):>6} {calibration.round_s:>8.3f} "
                    f"{calibration.startup_s + TUNE_PER_TRIAL_S:>8.2f} {packing:>7} "
                    f"{(group_run + group_startup) / slots:>7.0f} s")
    lines += [header, *rows]
    once = RAY_START_S + PROCESSES_START_S
    total = (run_s + per_trial_s) / slots + once
    lines.append(f"  estimate: {_duration(total)} = runs {run_s:.0f} s (packs x rounds x s/round) / {slots} "
                 f"+ start-up ({RAY_START_S:.0f} s Ray and {PROCESSES_START_S:.0f} s trial processes once, "
                 f"{per_trial_s:.0f} s of trials' own / {slots})")
    return "\n".join(lines) + "\n"


def _values(sweep: Sweep, key: str) -> list:
    """The key's values in the grid, in its order (a key of another alternative's aside)."""
    seen = {}
    for trial in sweep.trials:
        value = dict(trial.point).get(key)
        if value is not None:
            seen.setdefault(repr(value), value)
    return list(seen.values())


def _gpus() -> int:
    import torch
    return torch.cuda.device_count()


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
