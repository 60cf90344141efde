"""The command line: the quick-start entry point, and every bad-input case failing early and cleanly."""
import json
import os
import subprocess
import sys

import pytest

from rayfed.cli import main


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fails_cleanly(capsys, argv, *expected):
    """Exit code 2, exactly one line on stderr containing `expected`, and no run directory left."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rayfed: error: "), err
    for fragment in expected:
        assert fragment in err, err
    assert not os.path.exists("runs") and not os.path.exists("out")
    return err


@pytest.mark.parametrize("overrides, expected", [
    (["train.round=5"], ["unknown key 'train.round'", "did you mean 'train.rounds'"]),
    (["algorithm.lr=0.1"], ["unknown key 'algorithm.lr'", "did you mean 'algorithm.lr_local'"]),
    (["model=mlp"], ["model is a section", "model.name="]),
    (["train.rounds=abc"], ["train.rounds must be an integer", "'abc'"]),
    (["train.rounds=2.5"], ["train.rounds must be an integer"]),
    (["data.download=yes please"], ["data.download must be true or false"]),
    (["model.hidden_sizes=7"], ["model.hidden_sizes must be a list of int"]),
    (["train.clients_per_round=101"], ["train.clients_per_round=101 exceeds data.num_clients=100"]),
    (["algorithm.lr_local=0"], ["algorithm.lr_local=0.0 must be > 0"]),
    (["algorithm.lr_global=-1"], ["algorithm.lr_global=-1.0 must be > 0"]),
    (["train.rounds=0"], ["train.rounds=0 must be > 0"]),
    (["algorithm.name=fedavgg"], ["algorithm.name='fedavgg' is not one of", "did you mean 'fedavg'"]),
    (["model.name=resnet"], ["model.name='resnet' is not one of"]),
    (["data.dataset=imagenet"], ["data.dataset='imagenet' is not one of", "cifar10"]),
    (["data.partition=natural", "data.dataset=mnist", "data.download=true"], ["data.partition=natural is only"]),
    (["engine.backend=spark"], ["engine.backend='spark' is not one of: local, ray"]),
    (["engine.num_workers=101"], ["engine.num_workers=101 exceeds data.num_clients=100"]),
    (["engine.worker_gpus=1.5"], ["engine.worker_gpus=1.5 must be >= 0, and a whole number"]),
    (["seed"], ["config file seed does not exist"]),
])
def test_bad_overrides(in_tmp, capsys, overrides, expected):
    fails_cleanly(capsys, ["run", *overrides, "--out", "out"], *expected)


def test_missing_dataset_files_name_the_folder_and_files(in_tmp, capsys):
    fails_cleanly(capsys, ["run", "data.dataset=mnist", "data.root=nowhere"],
                  os.path.join("nowhere", "MNIST", "raw"), "train-images-idx3-ubyte", "data.download=true")


@pytest.mark.parametrize("text, expected", [
    ("train:\n  rounds: [1\n", ["bad.yaml is not valid YAML", "line"]),
    ("- 1\n- 2\n", ["bad.yaml must hold a mapping"]),
    ("train:\n  rounds: 3\n  lr: 0.1\n", ["unknown key 'train.lr'"]),
    ("data: mnist\n", ["data must be a mapping"]),
])
def test_bad_config_files(in_tmp, capsys, text, expected):
    (in_tmp / "bad.yaml").write_text(text)
    fails_cleanly(capsys, ["run", "bad.yaml"], *expected)


def test_two_config_files_are_refused(in_tmp, capsys):
    (in_tmp / "a.yaml").write_text("seed: 1\n")
    fails_cleanly(capsys, ["run", "a.yaml", "a.yaml"], "at most one config file")


def test_existing_non_empty_out_is_never_overwritten(in_tmp, capsys):
    (in_tmp / "taken").mkdir()
    (in_tmp / "taken" / "notes.txt").write_text("keep me")
    assert main(["run", "train.rounds=1", "engine.backend=local", "--out", "taken"]) == 2
    assert "taken exists and is not empty" in capsys.readouterr().err
    assert os.listdir(in_tmp / "taken") == ["notes.txt"]
    assert (in_tmp / "taken" / "notes.txt").read_text() == "keep me"


def test_config_command_prints_the_resolved_config(in_tmp, capsys):
    assert main(["config", "algorithm.name=fedprox", "data.dataset=mnist", "data.download=true"]) == 0
    out = capsys.readouterr().out
    assert "partition: dirichlet" in out and "name: mlp" in out and "mu: 0.01" in out


def test_quick_start_runs_from_the_command_line(in_tmp):
    """The embedded quick-start through `python -m rayfed`, on the ray engine, shortened to 3 rounds."""
    completed = subprocess.run([sys.executable, "-m", "rayfed", "run", "train.rounds=3", "train.eval_every=1",
                                "--out", "quick"], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert "test accuracy: final" in completed.stdout and "run directory: quick" in completed.stdout
    run_dir = in_tmp / "quick"
    assert sorted(os.listdir(run_dir)) == ["config.yaml", "metrics.jsonl", "partition.csv", "summary.json"]
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in rounds] == [1, 2, 3]
    for metrics in rounds:
        assert {"round", "train_loss", "test_accuracy", "test_loss", "num_participants", "bytes_up", "bytes_down",
                "wall_time_s"} <= set(metrics)
        assert metrics["num_participants"] == 10
        assert metrics["bytes_up"] == metrics["bytes_down"] == 10 * 610 * 4      # logreg 60x10 + 10, float32
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 3
    assert summary["final_test_accuracy"] == rounds[-1]["test_accuracy"]
    assert summary["best_test_accuracy"] == max(m["test_accuracy"] for m in rounds)
    assert summary["wall_time_s"] > 0


def test_gpu_request_on_a_gpu_less_machine_fails_cleanly(in_tmp):
    """rayfed starts its own Ray here, finds no GPU for the workers, stops Ray and says so in one line."""
    completed = subprocess.run([sys.executable, "-m", "rayfed", "run", "engine.worker_gpus=0.5", "--out", "out"],
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2
    assert completed.stderr == ("rayfed: error: engine.num_workers=2 x engine.worker_gpus + engine.server_gpus "
                                "needs 1 GPUs but the Ray cluster has 0\n")
    assert not (in_tmp / "out").exists()


@pytest.mark.parametrize("body, expected", [
    ("client_id,start,end\n0,5,1\n", ["systems.trace=", "bad.csv line 2:", "must be greater than start"]),
    ("id,from,to\n", ["bad.csv line 1: the header is"]),
])
def test_malformed_availability_trace_stops_before_any_work(in_tmp, capsys, body, expected):
    (in_tmp / "bad.csv").write_text(body)
    fails_cleanly(capsys, ["run", "systems.availability=trace", "systems.trace=bad.csv", "engine.backend=local",
                           "--out", "out"], *expected)


def test_trace_availability_needs_a_trace(in_tmp, capsys):
    fails_cleanly(capsys, ["run", "systems.availability=trace", "engine.backend=local"], "systems.trace")
