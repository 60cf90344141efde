"""Runs a sweep's trials as Ray Tune trials, on this machine or on the cluster of RAY_ADDRESS.

Tune schedules; rayfed runs. Each trial is `rayfed.run` (or `rayfed.resume`) into its own run
directory under the sweep directory, so a trial's directory is bitwise what `rayfed run` with the
point's overrides writes, and a sweep run again finds its finished trials there and continues its
interrupted ones from their checkpoints. A trial reserves what its run will use: the local engine
one bundle of engine.worker_cpus (and GPUs); the ray engine a placement group of a bundle for the
trial's driver, one for the server and one per worker, which its actors are placed in, so trials
never oversubscribe the cluster.

Ray starts once per sweep, and a trial's process serves the trials after it (Tune's reuse_actors):
it imports rayfed and PyTorch once, and keeps the datasets it loaded (rayfed.data.cache, keyed by
all that decides them) for the trials that load the same ones. Tune still schedules each trial,
records it, and retries or resumes the experiment as before.

Trials that batch together (rayfed.sweep.pack: vectorised, on the local engine, differing only in the seed
and float values) go to Tune as packs of at most `--pack` trials: one Tune trial whose process runs its
members as one batched computation (rayfed.engine.pack), each into its own run directory as above.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import ray
from ray import tune
from tqdm import tqdm

import rayfed
from rayfed.checkpoint import has_checkpoint
from rayfed.config import Config
from rayfed.data.cache import keep_datasets
from rayfed.preflight import load_config
from rayfed.engine.ray import connect_ray
from rayfed.errors import ConfigError, RunStopped, first_line
from rayfed.input_files import read_text
from rayfed.provenance import CAPS
from rayfed.metrics import read_summary, run_status
from rayfed.report.runs import COMPLETE_STATUSES, ENDED_STATUSES
from rayfed.engine.pack import Pack
from rayfed.sweep.pack import DEFAULT_PACK, packs
from rayfed.sweep.resources import trial_bundles, trial_slots
from rayfed.sweep.spec import Sweep, Trial, shortened

FAILED = "failed"
# Tune's own directory per trial (under tune/) is named by the trial, at most this long.
MAX_TUNE_DIR_NAME = 100
# A trial's .failed file holds one line, why it failed.
MAX_REASON_BYTES = 2**16
# What a Tune trial reports: the seconds its runs took in its process, and how many trials (a pack's) it ran.
RUN_S = "run_s"
MEMBERS = "members"



@dataclass(frozen=True)
class SweepTimes:
    """Where a sweep's time went: Ray's start, Tune's start of the first trials' processes (their
    imports), the trials, and Tune's end."""
    ray_start_s: float
    processes_start_s: float        # from Tune's start to its first trial's start
    tune_s: float                   # from Tune's start to its end
    trials: int                     # those run (the sweep directory's finished ones are not)
    packs: int                      # the Tune trials that ran them, each a pack of trials (rayfed.sweep.pack)
    processes: int                  # the processes that ran them
    slots: int                      # trials at once, from the resources
    run_s: float                    # the trials' runs, summed
    startup_per_trial_s: float      # see TrialTimes.startup_per_trial_s

    @property
    def wall_s(self) -> float:
        return self.ray_start_s + self.tune_s


def trial_resources(config: Config) -> tune.PlacementGroupFactory:
    """The trial's placement group: its actors join it, so it places them as engine.placement says."""
    strategy = "SPREAD" if config.engine.placement == "spread" else "PACK"
    return tune.PlacementGroupFactory(trial_bundles(config), strategy=strategy)


def trial_status(run_dir: Path) -> str | None:
    """The status summary.json gives the trial's run, or None when it has none."""
    summary = read_summary(run_dir)
    return None if summary is None else run_status(summary)


def run_trial(tune_config: dict) -> None:
    """One Tune trial: a trial's run, or a pack's runs as one batched computation, each into its run directory and
    continued from its checkpoint when it has one."""
    members = tune_config["spec"]["members"]
    # Tune starts trials in a directory of its own; configs name files relative to where rayfed runs.
    if os.path.isdir(members[0]["cwd"]):
        os.chdir(members[0]["cwd"])
    for name, value in members[0]["environment"].items():
        os.environ.setdefault(name, value)
    # This process runs the trials after this one too: their data is loaded once.
    keep_datasets()
    started = time.perf_counter()
    if len(members) == 1:
        _run_member(members[0])
    else:
        outcomes = Pack().run([lambda member=member: _run_member(member) for member in members])
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            raise failures[0]
    tune.report({RUN_S: time.perf_counter() - started, MEMBERS: len(members)})


def _run_member(spec: dict) -> None:
    run_dir = Path(spec["run_dir"])
    failure = run_dir.parent / f"{run_dir.name}.failed"
    try:
        if trial_status(run_dir) not in ENDED_STATUSES:
            if has_checkpoint(run_dir):
                rayfed.resume(run_dir, progress=False)
            else:
                shutil.rmtree(run_dir, ignore_errors=True)     # a start without a checkpoint starts again
                rayfed.run(load_config(spec["base"], spec["overrides"]), run_dir=run_dir, progress=False)
    except RunStopped as stopped:
        # A run that ended by itself (it diverged) is the trial's result, which its summary.json holds.
        if trial_status(run_dir) not in ENDED_STATUSES:
            _record_failure(failure, stopped)
            raise
    except BaseException as error:
        _record_failure(failure, error)
        raise
    failure.unlink(missing_ok=True)


def _record_failure(failure: Path, error: BaseException) -> None:
    failure.write_text(f"{type(error).__name__}: {first_line(error)}\n")


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def run_sweep(sweep: Sweep, sweep_dir: Path, progress: bool,
              pack_limit: int = DEFAULT_PACK) -> tuple[dict[str, dict], SweepTimes | None]:
    """Runs every trial not already done, in packs of at most `pack_limit`; returns each trial's status and, if it
    failed, why, and where the time went (None when every trial was done)."""
    trials_dir = sweep_dir / "trials"
    trials_dir.mkdir(exist_ok=True)
    pending = [trial for trial in sweep.trials if trial_status(trials_dir / trial.name) not in ENDED_STATUSES]
    times = _run_trials(sweep, packs(pending, pack_limit), sweep_dir, progress) if pending else None
    return {trial.name: _outcome(trials_dir, trial) for trial in sweep.trials}, times


class TrialTimes(tune.Callback):
    """When each trial started and ended (on this clock), in which process it ran, and its run's
    seconds as that process measured them."""

    def __init__(self):
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.run_s: dict[str, float] = {}
        self.members: dict[str, int] = {}
        self.process: dict[str, tuple] = {}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started[trial.trial_id] = time.perf_counter()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.run_s[trial.trial_id] = result.get(RUN_S, 0.0)
        self.members[trial.trial_id] = result.get(MEMBERS, 1)
        self.process[trial.trial_id] = (result.get("node_ip"), result.get("pid"))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.ended[trial.trial_id] = time.perf_counter()

    def on_trial_error(self, iteration, trials, trial, **info):
        self.ended[trial.trial_id] = time.perf_counter()

    def startup_per_trial_s(self, slots: int) -> float:
        """Per trial, the time the trials' processes spent besides runs: each process's time from its first
        trial's start to its last one's end, and for a process started after the first `slots` (one for each
        trial at once), its start: from the end of the process whose slot it took to its first trial's start;
        less the runs. The first processes' start, and a slot's wait for the sweep's last trial, are left out."""
        spans: dict[tuple, list[float]] = {}
        for trial, process in self.process.items():
            if trial in self.ended:
                span = spans.setdefault(process, [math.inf, -math.inf])
                span[0] = min(span[0], self.started[trial])
                span[1] = max(span[1], self.ended[trial])
        if not spans:
            return 0.0
        busy = sum(end - start for start, end in spans.values())
        # A slot frees when its process's last trial ends; the processes after the first take them in turn.
        freed = sorted(end for _, end in spans.values())
        later = sorted(start for start, _ in spans.values())[slots:]
        busy += sum(max(0.0, start - end) for start, end in zip(later, freed))
        ended = [trial for trial in self.process if trial in self.ended]
        return (busy - sum(self.run_s[trial] for trial in ended)) / sum(self.members.get(trial, 1) for trial in ended)


class TrialProgress(tune.Callback):
    """Trials done / running / failed, as one progress bar on stderr."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.bar = tqdm(total=total, initial=done, unit="trial", disable=not enabled, dynamic_ncols=True)
        self.running = self.failed = 0
        self._show()

    def _show(self) -> None:
        self.bar.set_postfix({"running": self.running, "failed": self.failed})

    def on_trial_start(self, iteration, trials, trial, **info):
        self.running += 1
        self._show()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._finished(trial, failed=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._finished(trial, failed=True)

    def _finished(self, trial, failed: bool) -> None:
        """A Tune trial is a pack of trials (of one, unpacked)."""
        self.running -= 1
        self.failed += failed
        self.bar.update(len(trial.config["spec"]["members"]))
        self._show()

    def on_experiment_end(self, trials, **info):
        self.bar.close()


def _run_trials(sweep: Sweep, packed: list[list[Trial]], sweep_dir: Path, progress: bool) -> SweepTimes:
    """Runs the trials of `packed`, a pack per Tune trial."""
    started = time.perf_counter()
    pending = [trial for pack in packed for trial in pack]
    largest = max(sum(bundle["CPU"] for bundle in trial_bundles(trial.config)) for trial in pending)
    engine = pending[0].config.engine
    # Tune's newer console output prints its own tables whatever `verbose` says; ours is the progress bar.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # engine.cpu_isa (one for all trials, rayfed.sweep.cli): each trial's process computes as a run's driver does, and
    # so needs the caps from its start.
    started_ray = connect_ray(engine.address, largest, engine.connect_timeout_s, whole_machine=True,
                              env_vars=CAPS.get(engine.cpu_isa))
    ray_start_s = time.perf_counter() - started
    # Actors an earlier run in this process kept (engine.reuse_actors) would hold CPUs the trials wait for.
    rayfed.release_actors()
    try:
        environment = _trial_environment(sweep_dir)
        specs = [{"name": _pack_name(pack),
                  "members": [{"base": str(sweep_dir / "base.yaml"), "overrides": list(trial.overrides),
                               "run_dir": str(sweep_dir / "trials" / trial.name), "cwd": os.getcwd(),
                               "environment": environment} for trial in pack]}
                 for pack in packed]
        # Resolved here: a trial's config may hold a plugin's classes, which Tune's processes could not unpickle.
        # A pack's members differ only in numbers: its first trial's resources serve it.
        resources = {_pack_name(pack): trial_resources(pack[0].config) for pack in packed}
        trainable = tune.with_resources(run_trial, lambda tune_config: resources[tune_config["spec"]["name"]])
        times = TrialTimes()
        tuner = tune.Tuner(
            trainable, param_space={"spec": tune.grid_search(specs)},
            # A trial's process (with its imports and data) serves the next trial of the same resources.
            tune_config=tune.TuneConfig(reuse_actors=True,
                                        trial_dirname_creator=lambda trial: shortened(trial.config["spec"]["name"],
                                                                                      MAX_TUNE_DIR_NAME)),
            run_config=tune.RunConfig(name="tune", storage_path=str((sweep_dir / "tune").resolve()), verbose=0,
                                      callbacks=[TrialProgress(len(sweep.trials), len(sweep.trials) - len(pending),
                                                               progress), times],
                                      failure_config=tune.FailureConfig(max_failures=0)))
        available = ray.cluster_resources()
        slots = min(trial_slots(trial_bundles(pack[0].config), available, len(packed)) for pack in packed)
        fit_started = time.perf_counter()
        tuner.fit()
        first_start = min(times.started.values(), default=fit_started)
        return SweepTimes(ray_start_s, first_start - fit_started, time.perf_counter() - fit_started, len(pending),
                          len(packed), len(set(times.process.values())), slots, sum(times.run_s.values()),
                          times.startup_per_trial_s(slots))
    finally:
        if started_ray:
            ray.shutdown()


def _pack_name(pack: list[Trial]) -> str:
    return pack[0].name if len(pack) == 1 else f"{pack[0].name}+{len(pack) - 1}"


def _trial_environment(sweep_dir: Path) -> dict[str, str]:
    """What the trials' MLflow logging needs from the sweep: one experiment named after the sweep
    (unless MLFLOW_EXPERIMENT_NAME or logging.mlflow_experiment says otherwise), and the tracking
    store MLFLOW_TRACKING_URI names, which trials on other nodes of a cluster do not inherit."""
    environment = {"MLFLOW_EXPERIMENT_NAME": os.environ.get("MLFLOW_EXPERIMENT_NAME", sweep_dir.resolve().name)}
    if "MLFLOW_TRACKING_URI" in os.environ:
        environment["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
    return environment


def _outcome(trials_dir: Path, trial: Trial) -> dict:
    failure = trials_dir / f"{trial.name}.failed"
    if failure.exists():
        try:
            reason = read_text(failure, failure.name, MAX_REASON_BYTES).strip()
        except ConfigError as error:
            reason = str(error)
        return {"status": FAILED, "reason": reason, "point": trial.label}
    summary = read_summary(trials_dir / trial.name)
    if summary is None:
        return {"status": "not run", "point": trial.label}
    outcome = {"status": run_status(summary), "point": trial.label}
    if outcome["status"] not in COMPLETE_STATUSES and isinstance(summary.get("stopped_because"), str):
        outcome["reason"] = summary["stopped_because"]
    return outcome
