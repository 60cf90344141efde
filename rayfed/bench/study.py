"""The `study` workload of `rayfed bench`: a small sweep run end to end by `rayfed sweep`'s machinery
(Ray Tune trials, each a run directory), timed for what a study costs besides its runs: Ray's
start, the trial processes' start, and the start-up per trial (rayfed.sweep.runner.SweepTimes). Under a
vectorised local engine (`--engines local_vec`) its trials, which differ in a learning rate and a seed, run as
one pack (rayfed.sweep.pack)."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import yaml

from rayfed.bench.workloads import DESCRIPTIONS, workload_config

STUDY = "study"
STUDY_ROUNDS = 2
# Small clients and few rounds: a trial's run is short, so start-up is what the figure shows.
STUDY_OVERRIDES = ["data.num_clients=100", "train.clients_per_round=10"]
STUDY_GRID = {"algorithm.lr_local": [0.01, 0.05], "seed": [0, 1, 2, 3]}
ROW_KEYS = ("trials", "packs", "rounds", "wall_s", "ray_start_s", "processes_start_s", "startup_per_trial_s", "run_s",
            "run_per_trial_s", "run_startup_per_trial_s", "slots", "processes")


def study_config(overrides: list[str]):
    """The base config of the study's trials; ConfigError for a bad override."""
    return workload_config("tiny", STUDY_ROUNDS, [*STUDY_OVERRIDES, *overrides])


def measure_study(overrides: list[str]) -> dict:
    """Runs the study's sweep in a temporary directory; runs in its own process."""
    from rayfed.metrics import read_summary
    from rayfed.sweep.runner import run_sweep
    from rayfed.sweep.spec import read_sweep
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "base.yaml").write_text(study_config(overrides).to_yaml())
        (folder / "study.yaml").write_text(yaml.safe_dump({"base": str(folder / "base.yaml"), "grid": STUDY_GRID}))
        started = time.perf_counter()
        sweep = read_sweep(str(folder / "study.yaml"), [], folder / "copy.yaml")
        (folder / "sweep").mkdir()
        (folder / "sweep" / "base.yaml").write_text(sweep.base_text)
        outcomes, times = run_sweep(sweep, folder / "sweep", progress=False)
        wall_s = time.perf_counter() - started
        summaries = [read_summary(folder / "sweep" / "trials" / trial.name) or {} for trial in sweep.trials]
    unfinished = [name for name, outcome in outcomes.items() if outcome["status"] != "finished"]
    if unfinished:
        raise RuntimeError(f"the study's trials {', '.join(unfinished)} did not finish")
    return {"trials": times.trials, "packs": times.packs, "rounds": STUDY_ROUNDS, "wall_s": wall_s, "ray_start_s": times.ray_start_s,
            "processes_start_s": times.processes_start_s, "startup_per_trial_s": times.startup_per_trial_s,
            "run_s": times.run_s, "run_per_trial_s": times.run_s / times.trials,
            "run_startup_per_trial_s": statistics.mean(summary.get("startup_time_s", 0.0) for summary in summaries),
            "slots": times.slots, "processes": times.processes}


def reduce_study(measured: list[dict]) -> dict:
    """Medians over the repeats."""
    return {key: statistics.median(run[key] for run in measured) for key in ROW_KEYS}


def format_study(table: dict) -> str:
    header = (f"{'':<10}{'trials':>7}{'packs':>6}{'wall s':>8}{'Ray':>7}{'procs':>7}{'start-up':>9}{'run':>7}{'(start)':>8}"
              f"{'at once':>8}{'procs':>6}")
    lines = [f"{STUDY}: {DESCRIPTIONS[STUDY]}",
             header + "   (seconds; start-up, run and the run's own start per trial)"]
    for name, row in table.items():
        lines.append(f"{name:<10}{row['trials']:>7.0f}{row['packs']:>6.0f}{row['wall_s']:>8.1f}{row['ray_start_s']:>7.1f}"
                     f"{row['processes_start_s']:>7.1f}{row['startup_per_trial_s']:>9.2f}{row['run_per_trial_s']:>7.2f}"
                     f"{row['run_startup_per_trial_s']:>8.2f}{row['slots']:>8.0f}{row['processes']:>6.0f}")
    return "\n".join(lines)
