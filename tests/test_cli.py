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


# Each of these once ended in a traceback, a hang or a crash later in the run.
BAD_INPUTS = {
    "non-UTF-8 file": ({"bad.yaml": b"seed: \xff\xfe\n"}, ["bad.yaml"],
                       ["config file bad.yaml is not UTF-8 text (byte 0xff at offset 6)"]),
    "5000-deep list": ({"bad.yaml": b"a: " + b"[" * 5000 + b"]" * 5000}, ["bad.yaml"],
                       ["config file bad.yaml is not valid YAML at line 1", "nested more than 32 levels"]),
    "5000-deep mapping": ({"bad.yaml": b"a: " + b"{a: " * 5000 + b"1" + b"}" * 5000}, ["bad.yaml"],
                          ["config file bad.yaml is not valid YAML", "nested more than 32 levels"]),
    "1000-deep block mapping": ({"bad.yaml": "".join(" " * depth + "a:\n" for depth in range(1000)).encode()},
                                ["bad.yaml"], ["config file bad.yaml is not valid YAML", "nested more than 32"]),
    "100,000-digit override": ({}, ["seed=" + "1" * 100_000], ["the value of seed is not valid YAML", "4300 digits"]),
    "100,000-digit in a file": ({"bad.yaml": b"seed: " + b"1" * 100_000}, ["bad.yaml"],
                                ["config file bad.yaml is not valid YAML at line 1, column 7", "4300 digits"]),
    "huge seed": ({}, ["seed=" + "9" * 30], ["seed=" + "9" * 30 + " must be >= 0 and at most 9223372036854775807"]),
    "300-character path": ({}, ["c" * 295 + ".yaml"], ["config file 'ccc", "has a name of 300 bytes", "at most 255"]),
    "file too big": ({"big.yaml": b"#" * (2**20 + 1)}, ["big.yaml"], ["config file big.yaml holds 1048577 bytes"]),
    "infinite gpus": ({}, ["engine.worker_gpus=.inf"], ["engine.worker_gpus=inf must be a finite number"]),
    "1e308 cpus": ({}, ["engine.worker_cpus=1e308"], ["engine.worker_cpus=1e+308 must be > 0 and at most 1024"]),
    "1e24 restarts": ({}, ["engine.worker_max_restarts=1e24"], ["engine.worker_max_restarts must be an integer"]),
    "10**24 restarts": ({}, ["engine.worker_max_restarts=" + "1" + "0" * 24],
                        ["engine.worker_max_restarts=1" + "0" * 24 + " must be >= 0 and at most 1000"]),
    "1001 restarts": ({}, ["engine.worker_max_restarts=1001"], ["must be >= 0 and at most 1000"]),
    "a million synthetic clients": ({}, ["data.num_clients=1000000"],
                                    ["the run needs about 496.0 GB (data 496.0 GB)", "more than this machine's 32.0 GB",
                                     "lower data.num_clients"]),
    "billion-wide layer": ({}, ["model.name=mlp", "model.hidden_sizes=[1000000000]"],
                           ["the run needs about", "models 3504.0 GB", "model.hidden_sizes"]),
    "NUL in a trace path": ({"bad.yaml": b'systems:\n  trace: "a\\0b.csv"\n'}, ["bad.yaml"],
                            [r"systems.trace='a\x00b.csv' contains a NUL byte"]),
    "raw NUL in an override": ({}, ["systems.trace=a\0b.csv"], ["the value of systems.trace is not valid YAML"]),
    "NUL in data.root": ({}, ['data.root="x\\0y"'], [r"data.root='x\x00y' contains a NUL byte"]),
    "300-byte name in data.root": ({}, ["data.root=" + "r" * 300], ["data.root='rrr", "a name of 300 bytes"]),
    "5000-byte data.root": ({}, ["data.root=" + "/".join(["r" * 200] * 25)], ["is 5024 bytes long"]),
    "NaN overcommit": ({}, ["train.overcommit=.nan"], ["train.overcommit=nan must be a finite number"]),
    "1e308 learning rate": ({}, ["algorithm.lr_local=1e308"], ["algorithm.lr_local=1e+308 must be > 0 and at most 1e6"]),
    "'nan' learning rate": ({}, ["algorithm.lr_local='nan'"], ["algorithm.lr_local=nan must be a finite number"]),
    "'inf' learning rate": ({}, ['algorithm.lr_global="inf"'], ["algorithm.lr_global=inf must be a finite number"]),
    "'.inf' learning rate": ({}, ["algorithm.lr_local='.inf'"], ["algorithm.lr_local must be a number, got '.inf'"]),
    "1e400 learning rate": ({}, ["algorithm.lr_local=1e400"], ["algorithm.lr_local=inf must be a finite number"]),
    "infinite delay": ({}, ["engine.fault_injection=['delay:0:1:inf']"],
                       ["engine.fault_injection entry 'delay:0:1:inf' must be"]),
    "infinite round timeout": ({}, ["engine.round_timeout_s=.inf"], ["engine.round_timeout_s=inf must be a finite"]),
    "infinite markov step time": ({}, ["systems.availability=markov", "systems.step_time_s=.inf"],
                                  ["systems.step_time_s=inf must be a finite number"]),
    "markov round over a billion periods": ({}, ["systems.availability=markov", "systems.step_time_s=1e9"],
                                            ["systems.availability=markov: a round of about 5e+09 virtual seconds",
                                             "more than the 1000"]),
    "lenet5 on synthetic": ({}, ["model.name=lenet5"],
                            ["model.name=lenet5 does not fit data.dataset=synthetic (inputs of shape (60,)): ",
                             "; use one of: logreg, mlp"]),
    "vgg11 on mnist": ({}, ["model.name=vgg11", "data.dataset=mnist", "data.download=true"],
                       ["model.name=vgg11 does not fit data.dataset=mnist (inputs of shape (1, 28, 28)): ",
                        "32x32", "; use one of: logreg, mlp, relu_mlp, lenet5"]),
    "batch of one with BatchNorm": ({}, ["model.name=mlp", "train.batch_size=1"],
                                    ["train.batch_size=1: model.name=mlp has BatchNorm", "batches of one"]),
    "server restarts above 100": ({}, ["engine.server_max_restarts=101"],
                                  ["engine.server_max_restarts=101 must be >= 0 and at most 100"]),
    "zero connect timeout": ({}, ["engine.connect_timeout_s=0"],
                             ["engine.connect_timeout_s=0.0 must be > 0 and at most 3600"]),
    "newline in a value": ({"bad.yaml": b'engine:\n  address: "a\\nb"\n'}, ["bad.yaml"],
                           [r"engine.address='a\nb' must be printable text"]),
    "newline in a key": ({"bad.yaml": b'"a\\nb": 1\n'}, ["bad.yaml"], [r"unknown key 'a\nb'"]),
    "newline in a missing folder": ({}, ['data.root="a\\nb"', "data.dataset=mnist"],
                                    [r"mnist files missing under a\nb"]),
}


@pytest.mark.parametrize("command", ["run", "config"])
@pytest.mark.parametrize("files, items, expected", BAD_INPUTS.values(), ids=BAD_INPUTS)
def test_bad_input_fails_with_one_line(in_tmp, capsys, monkeypatch, command, files, items, expected):
    # The memory check compares with this machine's memory; the messages are for a 32 GB one.
    monkeypatch.setattr("rayfed.resources.physical_memory_bytes", lambda: 32 * 10**9)
    for name, content in files.items():
        (in_tmp / name).write_bytes(content)
    out = ["--out", "out"] if command == "run" else []
    fails_cleanly(capsys, [command, *items, *out], *expected)


def test_negative_zero_is_zero(in_tmp, capsys):
    assert main(["config", "data.synthetic_alpha=-0.0"]) == 0
    assert "  synthetic_alpha: 0.0\n" in capsys.readouterr().out


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
    # An empty CUDA_VISIBLE_DEVICES hides every GPU from Ray and torch, so this machine looks GPU-less.
    completed = subprocess.run([sys.executable, "-m", "rayfed", "run", "engine.worker_gpus=0.5", "--out", "out"],
                               capture_output=True, text=True, timeout=300,
                               env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert completed.returncode == 2
    assert completed.stderr == ("rayfed: error: engine.num_workers=2 x engine.worker_gpus needs 1 GPUs but the Ray "
                                "cluster has 0\n")
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
