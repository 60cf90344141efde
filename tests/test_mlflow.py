"""logging.mlflow: what MLflow's own client reads back is what the run directory holds: every
numeric metrics.jsonl field per round at step = round, the resolved config as params, config.yaml
and summary.json as artifacts; a resumed run logs into the same MLflow run, each round once; a
sweep's trials are runs of one experiment."""
import json
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

import rayfed
from rayfed.callbacks.tensorboard import hparams_of, scalars
from rayfed.callbacks import check_trackers
from rayfed.cli import main
from rayfed.errors import ConfigError
from rayfed.engine.supervisor import Supervisor
from tests.test_checkpoint import ROUNDS, interrupted
from tests.test_engine_equivalence import SYNTHETIC_MLP
from tests.test_sweep import BASE, write_sweep

LOCAL = SYNTHETIC_MLP + ["engine.backend=local", "logging.mlflow=true"]
# One worker runs the module: it shares one MLflow store (store).
pytestmark = pytest.mark.xdist_group("mlflow")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the module: creating its schema takes seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def tracking(store, tmp_path, monkeypatch):
    # MLflow puts an experiment's artifacts under ./mlruns of the directory it was created in.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return MlflowClient(store)


def assert_mlflow_run_is_the_run_directory(client, run_dir: Path, status: str = "finished"):
    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expected: dict[str, dict[int, float]] = {}
    for record in records:
        for key, value in scalars(record).items():
            expected.setdefault(key, {})[record["round"]] = value
    mlflow_run = client.get_run(run_id)
    assert set(mlflow_run.data.metrics) == set(expected)
    for key, values in expected.items():
        history = client.get_metric_history(run_id, key)
        assert sorted(metric.step for metric in history) == sorted(values), key     # each round once
        assert {metric.step: metric.value for metric in history} == values, key
    config = rayfed.load_config(run_dir / "config.yaml")
    assert mlflow_run.data.params == {key: str(value) for key, value in hparams_of(config.to_dict()).items()}
    artifacts = {artifact.path for artifact in client.list_artifacts(run_id)}
    assert artifacts == {"config.yaml", "summary.json"}
    assert (mlflow_run.info.status, mlflow_run.data.tags["rayfed.status"]) == ("FINISHED", status)
    return mlflow_run


def test_a_run_is_logged_to_mlflow_as_its_run_directory_holds_it(tmp_path, tracking):
    result = rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", progress=False)
    mlflow_run = assert_mlflow_run_is_the_run_directory(tracking, result.run_dir)
    assert {"client_train_loss_mean", "client_train_loss_min", "client_local_steps_max"} <= set(mlflow_run.data.metrics)
    assert tracking.get_experiment(mlflow_run.info.experiment_id).name == "rayfed"
    assert mlflow_run.info.run_name == "run"
    downloaded = Path(tracking.download_artifacts(mlflow_run.info.run_id, "summary.json", str(tmp_path)))
    assert json.loads(downloaded.read_text()) == result.summary



def test_an_experiment_another_trial_created_after_the_lookup_is_joined(tmp_path, tracking, monkeypatch):
    """A sweep's trials start together: each looks the experiment up, finds none, and all but the
    first find it created when they create it. Here another trial creates it just after this run's lookup."""
    lookup = MlflowClient.get_experiment_by_name

    def created_meanwhile(client, name):
        monkeypatch.setattr(MlflowClient, "get_experiment_by_name", lookup)
        client.create_experiment(name)
        return None
    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", created_meanwhile)
    result = rayfed.run(rayfed.load_config(None, LOCAL + ["logging.mlflow_experiment=raced"]),
                        run_dir=tmp_path / "run", progress=False)
    mlflow_run = assert_mlflow_run_is_the_run_directory(tracking, result.run_dir)
    assert tracking.get_experiment(mlflow_run.info.experiment_id).name == "raced"

@pytest.mark.parametrize("fail_at_round", [5, 7])
def test_a_resumed_run_goes_on_in_the_same_mlflow_run_each_round_once(tmp_path, tracking, monkeypatch,
                                                                      fail_at_round):
    run_dir = interrupted(tmp_path, LOCAL + ROUNDS + ["logging.mlflow_experiment=resumed"], monkeypatch,
                          fail_at_round=fail_at_round)
    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    assert tracking.get_run(run_id).info.status == "KILLED"
    rayfed.resume(run_dir, progress=False)
    assert json.loads((run_dir / "mlflow.json").read_text())["run_id"] == run_id
    mlflow_run = assert_mlflow_run_is_the_run_directory(tracking, run_dir)
    assert tracking.get_experiment(mlflow_run.info.experiment_id).name == "resumed"


def test_mlflow_that_is_not_installed_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys):
    import builtins
    real_import = builtins.__import__

    def without_mlflow(name, *args, **kwargs):
        if name.startswith("mlflow"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_mlflow)
    assert main(["run", *LOCAL, "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == ("rayfed: error: logging.mlflow needs MLflow (No module named "
                                               "'mlflow.tracking'): pip install 'rayfed[mlflow]'")
    assert not (tmp_path / "run").exists()


def _damaged_sqlite(tmp_path):
    (tmp_path / "damaged.db").write_bytes(b"not a database")
    return f"sqlite:///{tmp_path / 'damaged.db'}"


@pytest.mark.parametrize("uri, experiment, message", [
    (lambda tmp_path: f"file://{tmp_path / 'folder'}", None,
     "cannot be used: MlflowException: The filesystem tracking backend (e.g., './mlruns') is in maintenance mode and "
     "will not receive further updates. Please migrate to a database backend (e.g., 'sqlite:///mlflow.db') to access "
     "the latest MLflow features."),
    (lambda tmp_path: "bogus://x", None,
     "cannot be used: UnsupportedModelRegistryStoreURIException: Model registry functionality is unavailable; got "
     "unsupported URI 'bogus://x' for model registry data storage."),
    (_damaged_sqlite, None, "cannot be used: DatabaseError: (sqlite3.DatabaseError) file is not a database"),
    (lambda tmp_path: "http://127.0.0.1:1", None,
     "cannot be used: MlflowException: API request to http://127.0.0.1:1/api/2.0/mlflow/experiments/get-by-name failed "
     "with exception HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded with url: "
     "/api/2.0/mlflow/experiments/get-by-name?experiment_name=rayfed (Caused by NewConnectionError"),
    (lambda tmp_path: f"sqlite:///{tmp_path / 'missing' / 'mlflow.db'}", None,
     "cannot be created: {tmp_path}/missing is not a writable directory"),
    (lambda tmp_path: "sqlite:///mlflow.db", "x" * 1000,
     "logging.mlflow: the experiment name (logging.mlflow_experiment) is 1000 characters long; MLflow takes at most "
     "500"),
])
def test_a_store_or_experiment_mlflow_refuses_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, uri,
                                                                              experiment, message):
    """Found by the callback only with the first round, each of these stopped the run after it (and an
    unreachable server after 257 s of MLflow's retries); each is one line, exit code 2, within seconds."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri(tmp_path))
    named = [f"logging.mlflow_experiment={experiment}"] if experiment else []
    started = time.monotonic()
    assert main(["run", *LOCAL, *named, "--out", str(tmp_path / "run")]) == 2
    assert time.monotonic() - started < 20
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    expected = message.format(tmp_path=tmp_path)
    if not expected.startswith("logging.mlflow:"):
        expected = f"logging.mlflow: MLflow's tracking store {uri(tmp_path)} (MLFLOW_TRACKING_URI) {expected}"
    assert err.startswith(f"rayfed: error: {expected}"), err
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_deleted_experiment_is_one_line_before_anything_runs(tmp_path, tracking, store, capsys):
    gone = tracking.create_experiment("gone")
    tracking.delete_experiment(gone)
    assert main(["run", *LOCAL, "logging.mlflow_experiment=gone", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (
        f"rayfed: error: logging.mlflow: the experiment 'gone' (logging.mlflow_experiment) is deleted in MLflow's "
        f"tracking store {store} (MLFLOW_TRACKING_URI); restore it (mlflow experiments restore --experiment-id {gone}) "
        f"or name another\n")
    assert not (tmp_path / "run").exists()


def test_only_a_run_with_mlflow_contacts_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    without = rayfed.load_config(None, SYNTHETIC_MLP + ["engine.backend=local"])
    check_trackers(without)
    assert rayfed.run(without, run_dir=tmp_path / "run", progress=False).summary["status"] == "finished"
    with pytest.raises(ConfigError, match=r"^logging.mlflow: MLflow's tracking store http://127.0.0.1:1 "):
        check_trackers(rayfed.load_config(None, LOCAL))


def test_the_check_creates_no_sqlite_store_and_the_first_round_does(tmp_path, monkeypatch):
    """A run that fails before its first round leaves no store behind, as before the check."""
    def broken(self):
        raise RuntimeError("boom")

    monkeypatch.chdir(tmp_path)     # where MLflow puts the new experiment's artifacts
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'new.db'}")
    config = rayfed.load_config(None, LOCAL)
    check_trackers(config)
    assert not (tmp_path / "new.db").exists()
    with monkeypatch.context() as patched:
        patched.setattr(Supervisor, "run", broken)
        with pytest.raises(RuntimeError, match="boom"):
            rayfed.run(config, run_dir=tmp_path / "failed", progress=False)
    assert not (tmp_path / "new.db").exists()
    rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    assert (tmp_path / "new.db").exists()


@pytest.mark.slow
def test_a_sweeps_trials_are_runs_of_one_experiment_and_stop_at_their_target(tmp_path, tracking):
    base = {**BASE, "train": {**BASE["train"], "rounds": 4, "target_accuracy": 0.05}, "logging": {"mlflow": True}}
    write_sweep(tmp_path / "s.yaml", {"seed": [0, 1]}, base=base)
    assert main(["sweep", "s.yaml", "--out", "study", "--quiet"]) == 0
    experiment = tracking.get_experiment_by_name("study")
    runs = tracking.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == ["seed=0", "seed=1"]
    trials = [tmp_path / "study" / "trials" / trial for trial in ("seed=0", "seed=1")]
    for trial in trials:
        assert_mlflow_run_is_the_run_directory(tracking, trial, status="reached_target")
        summary = json.loads((trial / "summary.json").read_text())
        assert summary["target_round"] == summary["rounds_completed"] < 4
    assert yaml.safe_load((trials[1] / "config.yaml").read_text())["seed"] == 1
    # Trials that reached their target are done: the same command again runs nothing.
    before = [(trial / "metrics.jsonl").read_bytes() for trial in trials]
    assert main(["sweep", "s.yaml", "--out", "study", "--quiet"]) == 0
    assert [(trial / "metrics.jsonl").read_bytes() for trial in trials] == before
    assert len(tracking.search_runs([experiment.experiment_id])) == 2
