"""Callbacks: code run in the driver at fixed points of a run (rayfed.callbacks.base).

rayfed's own outputs are callbacks too, listed here in the order they run: metrics.jsonl,
summary.json, clients.jsonl, TensorBoard and MLflow when asked for, the progress bar; then the
callbacks of the config's `logging.callbacks` and those given to `rayfed.run`; then the divergence
stop, the target stop, the privacy budget's stop and the checkpoints, which come last so that every callback sees a round
before the run stops after it or saves it."""
from __future__ import annotations

from pathlib import Path

from rayfed.callbacks.base import Callback, ModelShape, RunView, Stop
from rayfed.callbacks.checkpoints import Checkpoints
from rayfed.callbacks.clients_file import ClientsFile
from rayfed.callbacks.divergence import Divergence
from rayfed.callbacks.metrics_file import MetricsFile
from rayfed.callbacks.privacy_budget import PrivacyBudget
from rayfed.callbacks.progress import Progress
from rayfed.callbacks.registry import build_configured, register_callback
from rayfed.callbacks.summary_file import SummaryFile
from rayfed.callbacks.target import Target

__all__ = ["Callback", "ModelShape", "RunView", "Stop", "build_configured", "check_trackers", "register_callback",
           "run_callbacks"]


def check_trackers(config) -> None:
    """Before any work: the trackers the config logs to can take the run (none is contacted otherwise)."""
    if config.logging.mlflow:
        from rayfed.callbacks.mlflow import check_store
        check_store(config.logging.mlflow_experiment)


def run_callbacks(config, run_dir: Path, progress: bool, users: list[Callback]) -> tuple[MetricsFile, list[Callback]]:
    """The run's callbacks in order, around `users` (the config's and those given to rayfed.run),
    and its metrics file among them (checkpoints record its digest)."""
    metrics_file = MetricsFile(run_dir)
    writers: list[Callback] = [metrics_file, SummaryFile(run_dir)]
    if config.logging.client_metrics:
        writers.append(ClientsFile(run_dir))
    if config.logging.tensorboard:
        from rayfed.callbacks.tensorboard import TensorBoard
        writers.append(TensorBoard(run_dir))
    if config.logging.mlflow:
        from rayfed.callbacks.mlflow import MLflow
        writers.append(MLflow(run_dir, config.logging.mlflow_experiment))
    writers.append(Progress(config.train.rounds, progress))
    stops: list[Callback] = [Divergence()]
    train = config.train
    if train.target_accuracy is not None or train.target_loss is not None:
        stops.append(Target(train.target_accuracy, train.target_loss))
    if train.target_epsilon is not None:
        stops.append(PrivacyBudget(config))
    if train.checkpoint_every:
        stops.append(Checkpoints(train.checkpoint_every))
    return metrics_file, [*writers, *users, *stops]
