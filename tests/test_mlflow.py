"""logging.mlflow: what MLflow's own client reads back is what the run directory holds: every
numeric metrics.jsonl field per round at step = round, the resolved config as params, config.yaml
and summary.json as artifacts; a resumed run logs into the same MLflow run, each round once; a
sweep's trials are runs of one experiment."""
import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

import rayfed
from rayfed.callbacks.tensorboard import hparams_of, scalars
from rayfed.cli import main
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
