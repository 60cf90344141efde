"""MLflow tracking (`logging.mlflow`, the `mlflow` install extra): the resolved config as params,
every numeric field of each round's record as a metric with step = the round, config.yaml and
summary.json as artifacts, and the run's status when it ends.

The store is MLflow's own choice: `MLFLOW_TRACKING_URI` when set, else MLflow's local default (a
sqlite file or ./mlruns in the working directory), so no server is needed. The experiment is
`logging.mlflow_experiment`, else `MLFLOW_EXPERIMENT_NAME` (a sweep sets it to the sweep's name,
so that its trials are runs of one experiment), else "rayfed". The MLflow run's id is kept in the
run directory (mlflow.json), so that a resumed run goes on logging into the same MLflow run.
Rounds that run again after a rewind are not logged twice: they reproduce the same values."""
from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path

from rayfed.callbacks.base import Callback, RunView
from rayfed.callbacks.tensorboard import hparams_of, scalars
from rayfed.errors import ConfigError, first_line
from rayfed.metrics import SUMMARY

MLFLOW_RUN = "mlflow.json"
DEFAULT_EXPERIMENT = "rayfed"
# Rounds are sent in batches, at most this often, and at every checkpoint and the end of the run:
# one store transaction per round would cost more than a small model's round.
FLUSH_EVERY_S = 2.0
# MLflow's limits: params per log_batch call, and metrics per call.
MAX_PARAMS_PER_CALL = 100
MAX_METRICS_PER_CALL = 1000
# MLflow's status of a run, from summary.json's.
MLFLOW_STATUS = {"finished": "FINISHED", "reached_target": "FINISHED", "privacy_budget_spent": "FINISHED",
                 "stopped": "FINISHED", "interrupted": "KILLED"}
# MLflow's longest experiment name (mlflow.utils.validation).
MAX_EXPERIMENT_NAME = 500
# For the check before a run alone: a store that does not answer is told within seconds, where MLflow's
# own retries wait minutes. The run's logging keeps MLflow's defaults.
CHECK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# How much of MLflow's message a line of ours keeps.
MESSAGE_CHARS = 300


def mlflow_client_class() -> type:
    """MLflow's client, imported; a ConfigError saying how to install it where it is missing."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as error:
        raise ConfigError(f"logging.mlflow needs MLflow ({error}): pip install 'rayfed[mlflow]'") from None
    return MlflowClient


def experiment_name(configured: str | None) -> str:
    """The run's experiment: `logging.mlflow_experiment`, else MLFLOW_EXPERIMENT_NAME, else rayfed's default."""
    return configured or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT


def check_store(configured_experiment: str | None) -> None:
    """Before any work: the experiment's name is one MLflow takes, MLflow's tracking store answers, and
    the experiment, when it exists, is not deleted. A ConfigError of one line otherwise, where the
    callback, which connects with the first round, would stop the run after it. A sqlite store that
    does not exist yet is not created here (a run that fails before its first round leaves none): its
    directory must exist and be writable."""
    experiment = experiment_name(configured_experiment)
    source = ("logging.mlflow_experiment" if configured_experiment else
              "MLFLOW_EXPERIMENT_NAME" if os.environ.get("MLFLOW_EXPERIMENT_NAME") else "rayfed's default")
    if len(experiment) > MAX_EXPERIMENT_NAME:
        raise ConfigError(f"logging.mlflow: the experiment name ({source}) is {len(experiment)} characters long; "
                          f"MLflow takes at most {MAX_EXPERIMENT_NAME}")
    client_class = mlflow_client_class()
    from mlflow.tracking import get_tracking_uri
    uri = get_tracking_uri()
    where = f"MLflow's tracking store {uri}" + (" (MLFLOW_TRACKING_URI)" if os.environ.get("MLFLOW_TRACKING_URI")
                                                 else "")
    database = _new_sqlite_file(uri)
    if database is not None:
        if not database.parent.is_dir() or not os.access(database.parent, os.W_OK | os.X_OK):
            raise ConfigError(f"logging.mlflow: {where} cannot be created: {database.parent} is not a writable "
                              f"directory")
        return
    with _environment(CHECK_HTTP):
        try:
            found = client_class(uri).get_experiment_by_name(experiment)
        except Exception as error:  # MLflow, SQLAlchemy and requests raise many types; each means the same here
            raise ConfigError(f"logging.mlflow: {where} cannot be used: {type(error).__name__}: "
                              f"{_brief(error)}") from None
    if found is not None and found.lifecycle_stage == "deleted":
        raise ConfigError(f"logging.mlflow: the experiment {experiment!r} ({source}) is deleted in {where}; restore "
                          f"it (mlflow experiments restore --experiment-id {found.experiment_id}) or name another")


def _new_sqlite_file(uri: str) -> Path | None:
    """The file of a sqlite store that does not exist yet; None for any other store."""
    if not uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url        # MLflow's own dependency for its database stores
    try:
        database = make_url(uri).database
    except Exception:  # a malformed URI: MLflow's own message says so
        return None
    if not database or database == ":memory:" or database.startswith("file:") or Path(database).exists():
        return None
    return Path(database).absolute()


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _brief(error: BaseException) -> str:
    """The first line of `error`, cut after the last sentence that fits MESSAGE_CHARS (the first, at least)."""
    line = first_line(error)
    if len(line) <= MESSAGE_CHARS:
        return line
    sentences = re.split(r"(?<=\.) ", line)
    kept = sentences[0]
    for sentence in sentences[1:]:
        if len(kept) + 1 + len(sentence) > MESSAGE_CHARS:
            break
        kept += " " + sentence
    return kept


class MLflow(Callback):
    def __init__(self, run_dir: Path, experiment: str | None):
        self.run_dir = Path(run_dir)
        self.experiment = experiment_name(experiment)
        self.client = None              # connected with the first round: a run that fails before it creates no store
        self.run_id: str | None = None
        self.logged_through = 0         # the last round the MLflow run holds
        self.pending: list = []
        self.last_flush = time.monotonic()

    def on_round_end(self, run: RunView, record: dict) -> None:
        if self.run_id is None:
            self._open(run)
        step = int(record["round"])
        if step <= self.logged_through:
            return
        from mlflow.entities import Metric
        stamp = int(time.time() * 1000)
        self.pending += [Metric(key, value, stamp, step) for key, value in scalars(record).items()]
        self.logged_through = step
        if time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
            self._flush()

    def on_checkpoint(self, run: RunView, rounds_completed: int) -> None:
        self._flush()

    def on_run_end(self, run: RunView, summary: dict | None) -> None:
        if self.run_id is None:
            return
        self._flush()
        for name in ("config.yaml", SUMMARY):
            if (self.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(self.run_dir / name))
        status = "FAILED" if summary is None else MLFLOW_STATUS.get(summary.get("status"), "FAILED")
        if summary is not None:
            self.client.set_tag(self.run_id, "rayfed.status", summary.get("status", ""))
        self.client.set_terminated(self.run_id, status)

    def _experiment_id(self) -> str:
        experiment = self.client.get_experiment_by_name(self.experiment)
        if experiment is not None:
            return experiment.experiment_id
        from mlflow.exceptions import MlflowException
        try:
            return self.client.create_experiment(self.experiment)
        except MlflowException as error:
            # A sweep's trials start together: another one created it between the lookup and here.
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return self.client.get_experiment_by_name(self.experiment).experiment_id

    def _open(self, run: RunView) -> None:
        self.client = mlflow_client_class()()
        recorded = self.run_dir / MLFLOW_RUN
        if recorded.is_file():
            self.run_id = json.loads(recorded.read_text())["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            history = self.client.get_metric_history(self.run_id, "num_participants")
            self.logged_through = max((metric.step for metric in history), default=0)
            return
        created = self.client.create_run(self._experiment_id(), run_name=self.run_dir.name,
                                         tags={"rayfed.run_dir": str(self.run_dir.resolve())})
        self.run_id = created.info.run_id
        recorded.write_text(json.dumps({"tracking_uri": self.client.tracking_uri, "experiment": self.experiment,
                                        "run_id": self.run_id}) + "\n")
        from mlflow.entities import Param
        params = [Param(key, str(value)) for key, value in hparams_of(run.config.to_dict()).items()]
        for start in range(0, len(params), MAX_PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[start:start + MAX_PARAMS_PER_CALL])

    def _flush(self) -> None:
        for start in range(0, len(self.pending), MAX_METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=self.pending[start:start + MAX_METRICS_PER_CALL])
        self.pending = []
        self.last_flush = time.monotonic()
