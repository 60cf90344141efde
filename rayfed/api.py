"""`rayfed.run(config) -> Result`: one federated training run, end to end; `rayfed.resume(run_dir)`."""
from __future__ import annotations

import copy
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from torch import Tensor

from rayfed.algorithms.registry import build_algorithm
from rayfed.checkpoint import load_checkpoint, recover_workers, restore_checkpoint, save_checkpoint
from rayfed.config import Config, load_config, resolve
from rayfed.data import Dataset, Partition, class_histogram, load_dataset, make_partition, write_histogram_csv
from rayfed.engine import make_engine, run_rounds
from rayfed.engine.process_memory import peak_rss, total_peak_rss
from rayfed.engine.vectorized import vectorize_blocker
from rayfed.errors import ConfigError
from rayfed.metrics import MetricsLog, ProgressBar, summarize, write_json_atomic
from rayfed.models import FlatModel, build_model
from rayfed.systems.clients import make_client_systems


@dataclass
class Result:
    history: list[dict]     # one dict per round, as in metrics.jsonl
    summary: dict           # as in summary.json
    run_dir: Path
    params: Tensor          # the final global model, flat
    buffers: Tensor         # its BatchNorm buffers, flat


def run(config: Config, run_dir: str | Path | None = None, progress: bool = True) -> Result:
    """Trains `config` and writes its run directory (a fresh one under ./runs unless `run_dir`).
    Bad input raises ConfigError before anything is started or written."""
    started = time.perf_counter()
    config = resolve(config)
    if run_dir is not None:
        run_dir = Path(run_dir)
        if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
            raise ConfigError(f"output directory {run_dir} exists and is not empty; "
                              f"choose a new --out or remove it")
    return _execute(config, run_dir, progress, started)


def resume(run_dir: str | Path, progress: bool = True) -> Result:
    """Continues the run in `run_dir` from its last checkpoint, with its own config.yaml; the final
    model is bitwise the one an uninterrupted run would have produced."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    config = load_config(run_dir / "config.yaml")
    checkpoint = load_checkpoint(run_dir)
    completed = checkpoint["rounds_completed"]
    if completed >= config.train.rounds:
        raise ConfigError(f"{run_dir} already completed its {config.train.rounds} rounds")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()[:completed]
    if len(lines) < completed:
        raise ConfigError(f"{run_dir}/metrics.jsonl has {len(lines)} rounds but the checkpoint {completed}")
    history = [json.loads(line) for line in lines]
    # Rounds after the checkpoint are run again, so their lines go.
    temporary = run_dir / "metrics.jsonl.tmp"
    temporary.write_text("".join(line + "\n" for line in lines))
    os.replace(temporary, run_dir / "metrics.jsonl")
    return _execute(config, run_dir, progress, started, checkpoint=checkpoint, history=history)


def load_data(config: Config) -> tuple[Dataset, Partition]:
    """The run's dataset and its split among the clients, as `config` and its seed define them."""
    data = config.data
    dataset = load_dataset(data.dataset, root=data.root, download=data.download, seed=config.seed,
                           num_clients=data.num_clients, synthetic_alpha=data.synthetic_alpha,
                           synthetic_beta=data.synthetic_beta, synthetic_max_samples=data.synthetic_max_samples)
    partition = make_partition(data.partition, dataset.train_y, dataset.num_classes, data.num_clients,
                               config.seed, alpha=data.alpha, shards_per_client=data.shards_per_client,
                               natural=dataset.natural_partition)
    return dataset, partition


def _execute(config: Config, run_dir: Path | None, progress: bool, started: float,
             checkpoint: dict | None = None, history: list[dict] | None = None) -> Result:
    client_systems = make_client_systems(config)
    data_started = time.perf_counter()
    dataset, partition = load_data(config)
    data_time_s = time.perf_counter() - data_started
    config = _without_unsupported_vectorize(config, dataset)
    engine = make_engine(config, dataset, partition, client_systems)
    history = list(history or [])
    try:
        if checkpoint is None:
            run_dir = _create_run_dir(run_dir, config)
            (run_dir / "config.yaml").write_text(config.to_yaml())
            write_histogram_csv(run_dir / "partition.csv",
                                class_histogram(partition, dataset.train_y, dataset.num_classes))
        else:
            restore_checkpoint(engine, checkpoint)
        startup_s = time.perf_counter() - started
        history += _train(engine, config, run_dir, progress, first_round=len(history))
        params = engine.get(engine.server.global_params())
        buffers = engine.get(engine.server.broadcast()).buffers
        server_state_bytes = engine.get(engine.server.state_bytes())
        client_state_bytes = sum(engine.get([worker.client_state_bytes() for worker in engine.workers]))
        peaks = [peak_rss(), *engine.get([engine.server.peak_rss(), *(worker.peak_rss() for worker in engine.workers)])]
    finally:
        engine.shutdown()
    summary = {
        **summarize(history),
        "wall_time_s": time.perf_counter() - started,
        "startup_time_s": startup_s,
        "data_time_s": data_time_s,
        "peak_rss_bytes": total_peak_rss(peaks),
        "algorithm": config.algorithm.name,
        "dataset": config.data.dataset,
        "num_clients": config.data.num_clients,
        "num_params": int(params.numel()),
        "server_state_bytes": server_state_bytes,
        "client_state_bytes": client_state_bytes,
        "seed": config.seed,
        "vectorized": config.engine.vectorize,
    }
    write_json_atomic(run_dir / "summary.json", summary)
    return Result(history, summary, run_dir, params, buffers)


def _train(engine, config: Config, run_dir: Path, progress: bool, first_round: int) -> list[dict]:
    log = MetricsLog(run_dir / "metrics.jsonl")
    bar = ProgressBar(config.train.rounds, progress, initial=first_round)
    every = config.train.checkpoint_every
    history = []
    try:
        for metrics in run_rounds(engine, range(first_round, config.train.rounds)):
            died = [int(worker) for worker, why in metrics.get("failed_workers", {}).items() if why == "died"]
            if died:
                metrics["client_states_after_restart"] = recover_workers(engine, run_dir, died)
            history.append(metrics)
            log.append(metrics)
            bar.update(metrics)
            if every and metrics["round"] % every == 0 and metrics["round"] < config.train.rounds:
                save_checkpoint(engine, run_dir, metrics["round"])
    finally:
        bar.close()
        log.close()
    return history


def _without_unsupported_vectorize(config: Config, dataset) -> Config:
    """engine.vectorize where the algorithm or model cannot batch clients: say why, train them one by one."""
    if not config.engine.vectorize:
        return config
    model = build_model(config.model.name, dataset.input_shape, dataset.num_classes, config.model.hidden_sizes)
    algorithm = build_algorithm(config.algorithm, config.train.local_steps, FlatModel(model).blocks)
    reason = vectorize_blocker(config.algorithm.name, algorithm, model)
    if reason is None:
        return config
    print(f"rayfed: engine.vectorize: {reason}; training clients one after another", file=sys.stderr)
    config = copy.deepcopy(config)
    config.engine.vectorize = False
    return config


def _create_run_dir(run_dir: Path | None, config: Config) -> Path:
    if run_dir is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        base = Path("runs") / f"{stamp}-{config.algorithm.name}-{config.data.dataset}-seed{config.seed}"
        run_dir, suffix = base, 1
        while run_dir.exists():
            run_dir, suffix = Path(f"{base}-{suffix}"), suffix + 1
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir
