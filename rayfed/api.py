"""`rayfed.run(config) -> Result`: one federated training run, end to end; `rayfed.resume(run_dir)`."""
from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
from torch import Tensor

from rayfed.algorithms.local_training import LocalSchedule
from rayfed.algorithms.base import AlgorithmContext, build_algorithm
from rayfed.callbacks import Callback, ModelShape, build_configured, check_trackers, run_callbacks
from rayfed.callbacks.privacy_budget import last_round_within
from rayfed.callbacks.target import REACHED_TARGET, Target
from rayfed.checkpoint import (CHECKPOINT, RESUME_MAY_CHANGE, Checkpoint, check_belongs_to, lines_before,
                               read_checkpoint)
from rayfed.checkpoint_content import Declared, check_content
from rayfed.config import Config, check_path
from rayfed.preflight import ANNOUNCED_WORK, check_loaded_data, estimated_work, load_config, resolve
from rayfed.data import Dataset, Partition, class_histogram, load_dataset, make_partition, write_histogram_csv
from rayfed.data.lazy import SIZES_CSV_MAX_CLIENTS, ClientSizes, LazyDataset, client_sizes, is_lazy, write_sizes_csv
from rayfed.engine import make_engine
from rayfed.engine.process_memory import peak_rss, total_peak_rss
from rayfed.engine.state_store import SpillFailed, StateStorage
from rayfed.engine.lost import ServerLost, WorkerLost
from rayfed.engine.supervisor import Supervisor, WorkersGone
from rayfed.engine.vectorized import vectorize_blocker
from rayfed.errors import ConfigError, RunFinished, RunStopped
from rayfed.fields import format_number
from rayfed.metrics import CLIENTS, METRICS, SUMMARY, recorded_rounds, summarize
from rayfed.models import FlatModel, build_model
from rayfed.provenance import check_driver_cpu_isa, first_difference, merged
from rayfed.resources import plan_client_states
from rayfed.systems.clients import make_client_systems


# What a run writes into its directory; removed again when it fails before its first round.
RUN_FILES = ("config.yaml", "partition.csv", METRICS, METRICS + ".tmp", CLIENTS, CLIENTS + ".tmp", SUMMARY,
             CHECKPOINT, CHECKPOINT + ".tmp", "mlflow.json")


@dataclasses.dataclass
class Result:
    """What `rayfed.run` and `rayfed.resume` return: what the run directory holds, and the final model."""

    history: list[dict]
    """One dict per round, as in metrics.jsonl."""
    summary: dict
    """As in summary.json."""
    run_dir: Path
    """The run directory."""
    params: Tensor
    """The final global model, one flat float32 vector."""
    buffers: Tensor
    """Its running statistics (BatchNorm), flat."""


def run(config: Config, run_dir: str | Path | None = None, progress: bool = True,
        callbacks: list[Callback] = ()) -> Result:
    """Trains `config` and writes its run directory (a fresh one under ./runs unless `run_dir`).
    `callbacks` (rayfed.Callback) run after the config's `logging.callbacks`. Bad input raises
    ConfigError before anything is started or written; a run that cannot go on (divergence,
    actors out of restarts, a callback that raised) raises RunStopped after writing what it
    computed."""
    started = time.perf_counter()
    config = resolve(config)
    check_driver_cpu_isa(config.engine.cpu_isa)
    if run_dir is not None:
        run_dir = _check_out(Path(run_dir))
    return _execute(config, run_dir, progress, started, _callbacks(config, callbacks))


def resume(run_dir: str | Path, progress: bool = True, callbacks: list[Callback] = (),
           overrides: list[str] = (), accept_environment: bool = False) -> Result:
    """Continues the run in `run_dir` from its last checkpoint, with its own config.yaml; the final
    model is bitwise the one an uninterrupted run would have produced. `overrides` (`key=value`) may
    change what does not decide the bits: `train.rounds` (to extend a run, finished or not) and the
    `logging.*` keys (callbacks, TensorBoard, MLflow); config.yaml is rewritten with them. The run
    directory is checked first: a checkpoint that does not belong to it, files changed since it was
    written, or an override of another key are a ConfigError and change nothing; a run whose
    metrics.jsonl already holds all its rounds, or its target, is RunFinished. A checkpoint written
    where something that decides the bits differs (rayfed.provenance: the torch build, the CPU
    kernels, the GPU model, ...) is a ConfigError too, unless `accept_environment`: then a line on
    stderr says so and the run goes on."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    for override in overrides:
        _check_resume_override(override)
    config = run_config(run_dir, overrides)
    _check_not_ended(run_dir, config, extending=any(override.partition("=")[0].strip() == "train.rounds"
                                                    for override in overrides))
    check_driver_cpu_isa(config.engine.cpu_isa)
    checkpoint = read_checkpoint(run_dir)
    check_belongs_to(run_dir, checkpoint, config)
    if checkpoint.rounds_completed >= config.train.rounds:
        raise ConfigError(f"train.rounds={config.train.rounds} must be above the {checkpoint.rounds_completed} "
                          f"rounds {run_dir / CHECKPOINT} completed")
    lines = lines_before(run_dir, checkpoint)
    if overrides:
        _replace_file(run_dir / "config.yaml", config.to_yaml())
    return _execute(config, run_dir, progress, started, _callbacks(config, callbacks), checkpoint=checkpoint,
                    lines=lines, accept_environment=accept_environment)


def run_config(run_dir: str | Path, overrides: list[str] = ()) -> Config:
    """The config of the run in `run_dir`, as its config.yaml holds it, with a resume's `overrides`."""
    run_dir = Path(run_dir)
    if not str(run_dir).strip() or not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (no config.yaml)")
    return load_config(run_dir / "config.yaml", overrides)


def _check_resume_override(override: str) -> None:
    key = override.partition("=")[0].strip()
    if not any(key == free or key.startswith(free + ".") for free in RESUME_MAY_CHANGE):
        raise ConfigError(f"{key} cannot change on resume: it decides the run's bits (a resume may change "
                          f"{' and '.join(RESUME_MAY_CHANGE[:-1])} and {RESUME_MAY_CHANGE[-1]}.*); start a new run "
                          f"to change it")


def _replace_file(path: Path, text: str) -> None:
    """`path` holds `text`, or (after a crash) what it held before: never a part of either."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def release_actors() -> None:
    """Ends the actors that runs with engine.reuse_actors kept for a later run, freeing their CPUs and GPUs."""
    pool = sys.modules.get("rayfed.engine.actor_pool")
    if pool is not None:
        pool.release_actors()


def _callbacks(config: Config, given: list[Callback]) -> list[Callback]:
    """The config's callbacks, built (a failing constructor is a ConfigError before any work), then `given`."""
    for callback in given:
        if not isinstance(callback, Callback):
            raise ConfigError(f"callbacks: {callback!r} is not a rayfed.Callback")
    return [*build_configured(config.logging.callbacks), *given]


def load_data(config: Config) -> tuple[Dataset | LazyDataset, Partition | ClientSizes]:
    """The run's dataset and its split among the clients, as `config` and its seed define them; for
    an on-demand dataset (rayfed.data.lazy), its source and the clients' sizes alone."""
    data = config.data
    dataset = load_dataset(data.dataset, seed=config.seed, **data.model_dump(exclude={"dataset"}))
    if is_lazy(dataset):
        return dataset, client_sizes(dataset, data.num_clients)
    partition = make_partition(data.partition, dataset.train_y, dataset.num_classes, data.num_clients,
                               config.seed, alpha=data.alpha, shards_per_client=data.shards_per_client,
                               natural=dataset.natural_partition, dataset=data.dataset)
    return dataset, partition


def _execute(config: Config, run_dir: Path | None, progress: bool, started: float, users: list[Callback],
             checkpoint: Checkpoint | None = None, lines: list[bytes] = (), accept_environment: bool = False) -> Result:
    if run_dir is None:
        run_dir = _fresh_run_dir(config)
    # Before any work: the trackers answer, where the client states go, and room for them.
    check_trackers(config)
    storage = StateStorage(plan_client_states(config, run_dir))
    client_systems = make_client_systems(config)
    data_started = time.perf_counter()
    dataset, partition = load_data(config)
    check_loaded_data(config, dataset, partition)
    work, words = estimated_work(config)
    if work >= ANNOUNCED_WORK:
        print(f"rayfed: this run computes about {format_number(float(f'{work:.2g}'))} sample gradients ({words})",
              file=sys.stderr)
    client_systems = dataclasses.replace(client_systems, client_sizes=partition.sizes)
    declared = Declared(config, client_systems)
    if checkpoint is not None:
        check_content(run_dir, checkpoint, declared)
    data_time_s = time.perf_counter() - data_started
    config = _without_unsupported_vectorize(config, dataset, partition)
    engine = make_engine(config, dataset, partition, client_systems, storage)
    created, new_files = None, False
    supervisor = None
    finished = False
    environment = None
    try:
        environment = _environment(engine)
        if checkpoint is not None:
            _check_environment(run_dir, checkpoint, environment, accept_environment)
        if checkpoint is None:
            run_dir, created = _create_run_dir(run_dir)
            new_files = True
            (run_dir / "config.yaml").write_text(config.to_yaml())
            if not is_lazy(dataset):
                write_histogram_csv(run_dir / "partition.csv",
                                    class_histogram(partition, dataset.train_y, dataset.num_classes))
            elif partition.num_clients <= SIZES_CSV_MAX_CLIENTS:
                write_sizes_csv(run_dir / "partition.csv", partition.sizes)
        metrics_file, callbacks = run_callbacks(config, run_dir, progress, users)
        supervisor = Supervisor(engine, config, run_dir, ModelShape(dataset.input_shape, dataset.num_classes),
                                metrics_file, callbacks, declared, environment,
                                resumed_from=None if checkpoint is None else len(lines))
        if checkpoint is not None:
            _resume_supervisor(supervisor, checkpoint, lines)
        startup_s = time.perf_counter() - started
        final = supervisor.run()
        finished = True
    except BaseException as error:
        summary = _account_for_stop(error, supervisor, new_files, run_dir, created, config, started, environment)
        if supervisor is not None:
            supervisor.callbacks.run_end_after_failure(supervisor.view, summary)
        raise
    else:
        summary = _summary(config, supervisor, final, started, startup_s, data_time_s, environment)
        # A callback failing here fails the command, but the run ended: its summary stays as written.
        supervisor.callbacks.run_end(supervisor.view, summary)
    finally:
        if supervisor is not None:
            supervisor.close()
        engine.shutdown(finished)
        storage.remove_files(config.engine.num_workers)
    return Result(supervisor.history, summary, run_dir, final["params"], final["buffers"])


def _summary(config: Config, supervisor: Supervisor, final: dict, started: float, startup_s: float,
             data_time_s: float, environment: dict[str, str]) -> dict:
    """summary.json of a run that ended normally: all its rounds played, or a callback stopped it."""
    history = supervisor.history
    ending = {"status": "finished"}
    if supervisor.stop is not None:
        stop, callback = supervisor.stop
        ending = {"status": stop.status, "stopped_because": stop.reason}
        if stop.status == REACHED_TARGET:
            ending["target_round"] = history[-1]["round"]
    summary = {
        **summarize(history),
        **ending,
        **_identity(config, started),
        "startup_time_s": startup_s,
        "data_time_s": data_time_s,
        "peak_rss_bytes": total_peak_rss([peak_rss(), *final["peaks"]]),
        "peak_pss_bytes": final["peak_pss_bytes"],
        "pss_by_process": final["pss_by_process"],
        "num_params": int(final["params"].numel()),
        "server_state_bytes": final["server_state_bytes"],
        "client_state_bytes": final["client_state_bytes"],
        "server_restarts": final["server_restarts"],
        "vectorized": config.engine.vectorize,
        "environment": environment,
    }
    # What the components report apart from the rounds (CACS's warm-up and what it cost).
    summary.update(final["summary_extras"])
    return summary


def _resume_supervisor(supervisor: Supervisor, checkpoint: Checkpoint, lines: list[bytes]) -> None:
    """Once rounds run, the supervisor recovers from actor deaths; before, one is a failed start."""
    try:
        supervisor.resume_from(checkpoint, list(lines))
    except (WorkerLost, ServerLost, WorkersGone) as lost:
        raise RunStopped(f"an actor died while the run was being resumed ({type(lost).__name__}); nothing in the "
                         f"run directory was changed; run the command again", "resume_failed") from None
    except SpillFailed as failed:
        raise RunStopped(f"{failed}; nothing in the run directory was changed; run the command again once the disk "
                         f"has room", "resume_failed") from None


def _account_for_stop(error: BaseException, supervisor: Supervisor | None, new_files: bool, run_dir: Path | None,
                      created: Path | None, config: Config, started: float,
                      environment: dict[str, str] | None) -> dict | None:
    """What a run that stops early leaves: nothing, when it completed no round; otherwise its
    rounds and a summary saying why it stopped (returned, for the callbacks to write). The error
    learns where the run is, for the CLI."""
    history = supervisor.history if supervisor is not None else []
    error.run_dir, error.rounds_completed = run_dir, len(history)
    if new_files and not history:
        # Nothing was computed: a run directory with no rounds would only mislead.
        _remove_new_run(run_dir, created)
    elif run_dir is not None and history:
        status = error.status if isinstance(error, RunStopped) else "interrupted"
        return {**summarize(history), "status": status, "stopped_because": str(error) or type(error).__name__,
                **_identity(config, started), "environment": environment}
    return None


def _environment(engine) -> dict[str, str]:
    """What decides the bits of the processes that compute the run (rayfed.provenance), each asked once."""
    try:
        return merged(engine.get(engine.server.environment()),
                      engine.get([worker.environment() for worker in engine.workers]))
    except (WorkerLost, ServerLost) as lost:
        raise RunStopped(f"an actor died while the run was starting ({type(lost).__name__}); nothing in the run "
                         f"directory was changed; run the command again", "start_failed") from None


def _check_environment(run_dir: Path, checkpoint: Checkpoint, environment: dict[str, str], accept: bool) -> None:
    """A resume where something that decides the bits differs from the checkpoint's record: a ConfigError of one
    line, or with `accept` a line on stderr. Checkpoints written before the record was kept have none to compare."""
    difference = None if checkpoint.environment is None else first_difference(checkpoint.environment, environment)
    if difference is None:
        return
    name, then, now = difference
    change = f"{run_dir / CHECKPOINT} was written with {name} {then!r}, and this run has {now!r}"
    if not accept:
        raise ConfigError(f"{change}: the rounds left may not have an uninterrupted run's bits; to go on anyway: "
                          f"rayfed run --resume {run_dir} --accept-environment (rayfed.resume(..., "
                          f"accept_environment=True))")
    print(f"rayfed: {change}; going on, as accepted", file=sys.stderr)


def _identity(config: Config, started: float) -> dict:
    return {"wall_time_s": time.perf_counter() - started, "algorithm": config.algorithm.name,
            "dataset": config.data.dataset, "num_clients": config.data.num_clients, "seed": config.seed}


def _check_not_ended(run_dir: Path, config: Config, extending: bool = False) -> None:
    """RunFinished for a run that ended normally: all its rounds, or its target reached, as its
    metrics.jsonl records them (summary.json, which a person may edit, is not trusted for that);
    ConfigError where train.rounds was set on resume (`extending`) to no more rounds than it has."""
    target = Target(config.train.target_accuracy, config.train.target_loss)
    rounds = 0
    for record in recorded_rounds(run_dir):
        rounds += 1
        if (config.train.target_accuracy, config.train.target_loss) != (None, None) \
                and target.on_round_end(None, record) is not None:
            raise RunFinished(f"{run_dir} reached its target in round {rounds}; nothing to resume")
    if config.train.target_epsilon is not None and rounds < config.train.rounds:
        last = last_round_within(config)[0]
        if rounds >= last:
            raise RunFinished(f"{run_dir} spent its privacy budget (train.target_epsilon={config.train.target_epsilon})"
                              f" in round {last}; nothing to resume")
    if rounds >= config.train.rounds and extending:
        raise ConfigError(f"train.rounds={config.train.rounds} must be above the {rounds} rounds "
                          f"{run_dir / METRICS} records")
    if rounds >= config.train.rounds:
        raise RunFinished(f"{run_dir} finished all its {config.train.rounds} rounds; nothing to resume (extend it "
                          f"with train.rounds=N)")


def _without_unsupported_vectorize(config: Config, dataset, partition: Partition) -> Config:
    """engine.vectorize where the algorithm or model cannot batch clients: say why, train them one by one."""
    if not config.engine.vectorize:
        return config
    model = build_model(config.model.name, dataset.input_shape, dataset.num_classes, config.model.hidden_sizes)
    context = AlgorithmContext.of_run(FlatModel(model), config.train, config.algorithm)
    algorithm = build_algorithm(config.algorithm, context)
    schedule = LocalSchedule.from_config(config.train)
    # Step counts scale alike in every round, so round 0's tell whether they ever differ.
    steps_differ = len({schedule.steps(0, int(size)) for size in np.unique(partition.sizes)}) > 1
    reason = vectorize_blocker(config.algorithm.name, algorithm, model, steps_differ)
    if reason is None:
        return config
    print(f"rayfed: engine.vectorize: {reason}; training clients one after another", file=sys.stderr)
    config = copy.deepcopy(config)
    config.engine.vectorize = False
    return config


def _check_out(run_dir: Path) -> Path:
    check_path("--out", str(run_dir))
    for parent in (run_dir, *run_dir.parents):
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"--out {run_dir}: {parent} is a file, not a directory")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"output directory {run_dir} exists and is not empty; choose a new --out or remove it")
    return run_dir


def _fresh_run_dir(config: Config) -> Path:
    """A name for a new run directory under ./runs that no directory has yet."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{stamp}-{config.algorithm.name}-{config.data.dataset}-seed{config.seed}"
    run_dir, suffix = base, 1
    while run_dir.exists():
        run_dir, suffix = Path(f"{base}-{suffix}"), suffix + 1
    return run_dir


def _create_run_dir(run_dir: Path) -> tuple[Path, Path | None]:
    """The run directory, made; and the topmost directory made for it (None when it existed)."""
    created = next((path for path in reversed((run_dir, *run_dir.parents)) if not path.exists()), None)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir, created


def _remove_new_run(run_dir: Path, created: Path | None) -> None:
    """Removes what a new run wrote: its directory and the parents made for it while they are empty
    (another run may have started in them meanwhile), or only its files in an empty --out."""
    if created is None:
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in run_dir.parents:
        if parent == created.parent:
            break
        try:
            parent.rmdir()
        except OSError:
            break
