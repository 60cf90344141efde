"""`rayfed sweep`: grids expand and validate before anything starts, trials are ordinary run
directories bitwise equal to `rayfed run`, failures are recorded without stopping the sweep,
an interrupted sweep continues, and selection picks by the mean over seeds."""
import json
import os
import pickle
import re
import shutil

import pytest
import yaml

import rayfed
from rayfed.callbacks.dispatch import CallbackFailed
from rayfed.cli import main
from rayfed.errors import ConfigError, RunStopped
from rayfed.provenance import DECIDING
from rayfed.preflight import load_config
from rayfed.metrics import WALL_CLOCK_KEYS
from rayfed.sweep import plan
from rayfed.sweep.grid import varied_keys
from rayfed.sweep.resources import trial_bundles
from rayfed.sweep.runner import TrialTimes, trial_resources
from rayfed.sweep.select import select
from rayfed.sweep.spec import _written, read_sweep
from tests.test_checkpoint import interrupted
from tests.test_vectorize import RTOL

BASE = {"data": {"num_clients": 20}, "train": {"rounds": 5, "clients_per_round": 4, "eval_every": 1,
                                               "checkpoint_every": 2},
        "model": {"name": "mlp", "hidden_sizes": [16]}, "engine": {"backend": "local"}}
TIMING_KEYS = ("wall_time_s", "startup_time_s", "data_time_s", "peak_rss_bytes", "peak_pss_bytes", "pss_by_process")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_sweep(path, grid, base=BASE):
    path.write_text(yaml.safe_dump({"base": base, "grid": grid}, sort_keys=False))
    return str(path)


def test_the_grid_expands_in_file_order_and_every_point_is_resolved(in_tmp):
    (in_tmp / "base.yaml").write_text(yaml.safe_dump(BASE))
    path = write_sweep(in_tmp / "s.yaml", {"algorithm.name": ["fedavg", "fedprox"], "algorithm.lr_local": [0.01, 0.1],
                                           "seed": [0, 1, 2]}, base="base.yaml")
    sweep = read_sweep(path, ["train.rounds=3"], in_tmp / "copy.yaml")
    assert len(sweep.trials) == 12
    first = sweep.trials[0]
    assert first.overrides == ("train.rounds=3", "algorithm.name=fedavg", "algorithm.lr_local=0.01", "seed=0")
    assert first.name == "algorithm.name=fedavg__algorithm.lr_local=0.01__seed=0"
    assert (first.config.train.rounds, first.config.seed) == (3, 0)
    assert sweep.trials[-1].config.algorithm.mu == 0.01       # fedprox's default filled in per point
    assert (in_tmp / "copy.yaml").read_text() == (in_tmp / "base.yaml").read_text()


def test_a_base_file_is_checked_with_the_command_line_overrides(in_tmp):
    """A base whose dataset's files are missing here runs on another dataset (or data.root) given on
    the command line, as `rayfed run BASE data.dataset=...` does; without the override it is one line."""
    (in_tmp / "base.yaml").write_text(yaml.safe_dump({**BASE, "data": {"dataset": "mnist", "num_clients": 20}}))
    path = write_sweep(in_tmp / "s.yaml", {"seed": [0, 1]}, base="base.yaml")
    sweep = read_sweep(path, ["data.dataset=digits"], in_tmp / "copy.yaml")
    assert [trial.config.data.dataset for trial in sweep.trials] == ["digits", "digits"]
    with pytest.raises(ConfigError, match=r"^mnist files missing under data/MNIST/raw: train-images-idx3-ubyte"):
        read_sweep(path, [], in_tmp / "copy.yaml")


@pytest.mark.parametrize("text, expected", [
    ("grid: [1, 2]\n", "grid must map dotted keys to lists"),
    ("base: {}\n", "must be a mapping with the keys base"),
    ("grid: {seed: 3}\n", "grid key seed must have a non-empty list of values"),
    ("grid: {seed: [1, 1]}\n", "grid key seed repeats a value"),
    ("grid: {seed: [1]}\nextra: 2\n", "must be a mapping with the keys base"),
    ("base: nowhere.yaml\ngrid: {seed: [1]}\n", "base config nowhere.yaml does not exist"),
    ("grid: {seed: [1\n", "is not valid YAML"),
    ("grid: {train.round: [1]}\n", "unknown key 'train.round'"),
    ("grid: {algorithm.name: [fedavg, fedavgm], algorithm.beta1: [0.5]}\n",
     "grid point (algorithm.name=fedavg, algorithm.beta1=0.5): algorithm.beta1 is not a parameter of fedavg"),
    ("grid: {engine.cpu_isa: [null, default]}\n",
     "engine.cpu_isa is default, unset among the sweep's trials, whose processes share one Ray job's environment"),
    # methods with keys of their own, as alternatives of the algorithm section
    ("grid:\n  algorithm:\n    - {name: fedavgm, beta1: [0.5, 0.9]}\n    - {name: fedprox, eps: [0.1]}\n",
     "grid point (algorithm.name=fedprox, algorithm.eps=0.1): algorithm.eps is not a parameter of fedprox"),
    ("grid: {algorithm: [{name: fedprox, lr_local: [0.1]}], algorithm.lr_local: [0.1]}\n",
     "sweep file bad.yaml: grid key algorithm.lr_local is set twice in one point, once in an alternative"),
    ("grid: {algorithm: [{name: fedprox}, {name: fedprox}]}\n",
     "sweep file bad.yaml: the grid gives the point (algorithm.name=fedprox) twice"),
    ("grid: {algorithm: [{name: fedprox}, {}]}\n", "grid key algorithm, alternative 2 is empty"),
    ("grid: {algorithm: [fedprox]}\n", "grid key algorithm is a section: give it a list of alternatives"),
    ("grid: {algorithm: [{name: fedprox, mu: []}]}\n",
     "grid key algorithm, alternative 1: mu must be a value or a non-empty list of values"),
    ("grid: {algorithm: [{name: fedprox, mu: [0.1, 0.1]}]}\n",
     "grid key algorithm, alternative 1: grid key algorithm.mu repeats a value"),
    # input that once ended in a traceback, or was silently misread
    pytest.param("grid: {seed: " + "[" * 5000 + "]" * 5000 + "}\n",
                 "is not valid YAML at line 1, column 44: nested more than 32 levels deep", id="5000-deep"),
    ("grid: {seed: [0]}\ngrid: {seed: [1]}\n",
     "is not valid YAML at line 2, column 1: the key 'grid' is given twice (first at line 1)"),
    ("grid:\n  seed: [0]\n  algorithm.lr_local: [0.1]\n  seed: [1]\n",
     "at line 4, column 3: the key 'seed' is given twice (first at line 2)"),
    ("grid: {seed: !!set {1, 2}}\n", "at line 1, column 14: a set (!!set) is not a value rayfed reads"),
    pytest.param("grid: {seed: [" + ", ".join(map(str, range(90))) + "], algorithm.lr_local: [" +
                 ", ".join(f"0.{i + 1:03d}" for i in range(90)) + "], train.rounds: [" +
                 ", ".join(map(str, range(1, 101))) + "]}\n",
                 "sweep file bad.yaml: the grid has 810000 points; a sweep may have at most 10000", id="810000-points"),
])
def test_a_bad_sweep_file_or_point_is_one_line_and_nothing_starts(in_tmp, capsys, text, expected):
    (in_tmp / "bad.yaml").write_text(text)
    assert main(["sweep", "bad.yaml", "--out", "out", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rayfed: error: ") and expected in err, err
    assert not (in_tmp / "out").exists()


@pytest.mark.parametrize("kind", ["fifo", "zeros", "directory"])
def test_a_sweep_file_that_is_no_regular_file_is_one_line(in_tmp, capsys, kind):
    """A FIFO once blocked the sweep forever; /dev/zero filled the memory."""
    if kind == "fifo":
        os.mkfifo(in_tmp / "s.yaml")
    elif kind == "zeros":
        (in_tmp / "s.yaml").symlink_to("/dev/zero")
    else:
        (in_tmp / "s.yaml").mkdir()
    assert main(["sweep", "s.yaml", "--out", "out"]) == 2
    assert capsys.readouterr().err == "rayfed: error: sweep file s.yaml is not a regular file\n"
    assert not (in_tmp / "out").exists()


def test_an_out_below_a_file_is_one_line(in_tmp, capsys):
    (in_tmp / "afile").write_text("kept\n")
    write_sweep(in_tmp / "s.yaml", {"seed": [0]})
    assert main(["sweep", "s.yaml", "--out", "afile/sub"]) == 2
    assert capsys.readouterr().err == ("rayfed: error: cannot make the sweep directory afile/sub (Not a directory); "
                                       "choose another --out\n")
    assert (in_tmp / "afile").read_text() == "kept\n"


METHODS = (("fedavgm", "beta1", [0.5, 0.9]), ("fedprox", "mu", [0.001, 0.01, 0.1]), ("feddyn", "alpha", [0.01]))
ALTERNATIVES = {"algorithm": [{"name": "fedavgm", "beta1": [0.5, 0.9]}, {"name": "fedprox", "mu": [0.001, 0.01, 0.1]},
                              {"name": "feddyn", "alpha": 0.01}],
                "algorithm.lr_local": [0.01, 0.1], "seed": [0, 1]}


def test_methods_with_keys_of_their_own_expand_to_their_own_sub_grids(in_tmp):
    sweep = read_sweep(write_sweep(in_tmp / "s.yaml", ALTERNATIVES), [], in_tmp / "base.yaml")
    expected = [(name, key, value, lr, seed) for name, key, values in METHODS for value in values
                for lr in (0.01, 0.1) for seed in (0, 1)]
    assert len(sweep.trials) == (2 + 3 + 1) * 2 * 2 == len(expected)
    for trial, (name, key, value, lr, seed) in zip(sweep.trials, expected):
        assert trial.point == (("algorithm.name", name), (f"algorithm.{key}", value), ("algorithm.lr_local", lr),
                               ("seed", seed))
        assert trial.name == f"algorithm.name={name}__algorithm.{key}={value}__algorithm.lr_local={lr}__seed={seed}"
        algorithm = trial.config.to_dict()["algorithm"]
        assert (algorithm["name"], algorithm[key], algorithm["lr_local"], trial.config.seed) == (name, value, lr, seed)
        assert not {"beta1", "mu", "alpha"} - {key} & set(algorithm)       # no other method's key
    assert varied_keys(sweep.parsed) == ["algorithm.name", "algorithm.beta1", "algorithm.mu", "algorithm.alpha",
                                         "algorithm.lr_local"]
    # A sweep file without alternatives describes itself as before, so that its sweep directories continue.
    plain = read_sweep(write_sweep(in_tmp / "p.yaml", {"seed": [0, 1]}), [], in_tmp / "base.yaml")
    assert plain.describe() == yaml.safe_dump({"base": yaml.safe_dump(BASE, sort_keys=False),
                                               "grid": {"seed": [0, 1]}, "overrides": []}, sort_keys=False)


def test_trial_names_differ_wherever_points_do(in_tmp):
    """a/b and a_b once both became the trial a_b, one of them silently never run."""
    values = ["a/b", "a_b", "a%2Fb", "x__y", "x_%5Fy", "z_"]
    sweep = read_sweep(write_sweep(in_tmp / "s.yaml", {"data.root": values, "seed": [0]}), [], in_tmp / "base.yaml")
    names = [trial.name for trial in sweep.trials]
    assert names == ["data.root=a%2Fb__seed=0", "data.root=a_b__seed=0", "data.root=a%252Fb__seed=0",
                     "data.root=x_%5Fy__seed=0", "data.root=x_%255Fy__seed=0", "data.root=z___seed=0"]
    assert [trial.config.data.root for trial in sweep.trials] == values
    long = read_sweep(write_sweep(in_tmp / "l.yaml", {"data.root": ["r" * 200 + "1", "r" * 200 + "2"]}), [],
                      in_tmp / "base.yaml")
    assert [len(trial.name) for trial in long.trials] == [150, 150] and long.trials[0].name != long.trials[1].name


def test_each_value_is_written_as_the_yaml_it_is_even_where_another_has_its_repr():
    """A point's overrides are written once per value of the grid (reading a sweep of thousands of points wrote
    each again); a list that holds one list twice is YAML with an alias, its copy is not, though both print alike."""
    inner = [1]
    aliased, copied = [inner, inner], [[1], [1]]
    written = _written([(("k", aliased), ("seed", 0)), (("k", copied), ("seed", 0))])
    assert written == {("k", id(aliased)): "k=[&id001 [1], *id001]", ("k", id(copied)): "k=[[1], [1]]",
                       ("seed", id(0)): "seed=0"}


def test_a_stopped_run_s_error_survives_pickling():
    """Ray Tune copies a trial's error: RunStopped once lost its status on the way, and the sweep a traceback."""
    stopped = CallbackFailed("callback x failed")
    stopped.rounds_completed = 3
    copy = pickle.loads(pickle.dumps(stopped))
    assert (type(copy), str(copy), copy.status, copy.rounds_completed) == (CallbackFailed, "callback x failed",
                                                                          "callback_failed", 3)
    diverged = pickle.loads(pickle.dumps(RunStopped("the run diverged in round 2", "diverged")))
    assert (str(diverged), diverged.status, diverged.args) == ("the run diverged in round 2", "diverged",
                                                               ("the run diverged in round 2",))


def test_a_sweep_directory_holds_one_sweep(in_tmp, capsys):
    (in_tmp / "out").mkdir()
    (in_tmp / "out" / "sweep.yaml").write_text("something else\n")
    write_sweep(in_tmp / "s.yaml", {"seed": [0]})
    assert main(["sweep", "s.yaml", "--out", "out"]) == 2
    assert "out holds another sweep" in capsys.readouterr().err


def test_trials_reserve_what_their_engine_uses():
    local = load_config(None, ["engine.backend=local", "engine.worker_cpus=2"])
    assert trial_bundles(local) == [{"CPU": 2.0}]
    ray = load_config(None, ["engine.num_workers=3", "engine.worker_gpus=0.25", "engine.server_gpus=0.5"])
    assert trial_bundles(ray) == [{"CPU": 0.01}, {"CPU": 0.01, "GPU": 0.5}, *[{"CPU": 1.0, "GPU": 0.25}] * 3]
    assert trial_resources(ray).strategy == "PACK"
    # A server in the driver: the trial's own process holds its GPUs, and no server actor needs a bundle.
    driver = load_config(None, ["engine.num_workers=3", "engine.worker_gpus=0.25", "engine.server_gpus=0.5",
                                "engine.server=driver"])
    assert trial_bundles(driver) == [{"CPU": 0.01, "GPU": 0.5}, *[{"CPU": 1.0, "GPU": 0.25}] * 3]
    # Unset, the server shares the workers' GPU and reserves none.
    sharing = load_config(None, ["engine.num_workers=3", "engine.worker_gpus=0.25"])
    assert trial_bundles(sharing) == [{"CPU": 0.01}, {"CPU": 0.01}, *[{"CPU": 1.0, "GPU": 0.25}] * 3]
    spread = load_config(None, ["engine.num_workers=3", "engine.placement=spread"])
    assert trial_resources(spread).strategy == "SPREAD" and trial_resources(spread).bundles == trial_bundles(spread)


def test_selection_takes_the_best_mean_over_seeds_per_group(in_tmp):
    path = write_sweep(in_tmp / "s.yaml", {"algorithm.name": ["fedavg", "fedavgm"], "algorithm.lr_local": [0.01, 0.1],
                                           "seed": [0, 1]})
    sweep = read_sweep(path, [], in_tmp / "base.yaml")
    # fedavg: lr 0.01 has the best single seed (0.9) but lr 0.1 the best mean (0.7 > 0.6)
    accuracy = {("fedavg", 0.01): (0.9, 0.3), ("fedavg", 0.1): (0.7, 0.7),
                ("fedavgm", 0.01): (0.5, 0.6), ("fedavgm", 0.1): (0.2, 0.4)}
    for trial in sweep.trials:
        point = dict(trial.point)
        value = accuracy[point["algorithm.name"], point["algorithm.lr_local"]][point["seed"]]
        (in_tmp / "trials" / trial.name).mkdir(parents=True)
        (in_tmp / "trials" / trial.name / "summary.json").write_text(json.dumps(
            {"status": "finished", "best_test_accuracy": value}))
    rows = select(sweep, in_tmp / "trials", "best_test_accuracy", ["algorithm.name"])
    assert [(row["group"], row["setting"], row["seeds"]) for row in rows] == [
        ({"algorithm.name": "fedavg"}, {"algorithm.lr_local": 0.1}, 2),
        ({"algorithm.name": "fedavgm"}, {"algorithm.lr_local": 0.01}, 2)]
    assert rows[0]["mean_best_test_accuracy"] == pytest.approx(0.7)
    assert rows[1]["mean_best_test_accuracy"] == pytest.approx(0.55)


def same_run(plain, trial):
    """The files of two run directories, equal but for wall-clock measurements."""
    for name in ("config.yaml", "partition.csv"):
        assert (plain / name).read_bytes() == (trial / name).read_bytes(), name
    rounds = [[{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK_KEYS}
               for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (plain, trial)]
    assert rounds[0] == rounds[1]
    summaries = [{k: v for k, v in json.loads((run / "summary.json").read_text()).items() if k not in TIMING_KEYS}
                 for run in (plain, trial)]
    # What decides the bits is the same; a trial's process may run OpenBLAS with other threads (recorded only).
    environments = [summary.pop("environment") for summary in summaries]
    environments = [{k: environment[k] for k in DECIDING} for environment in environments]
    assert environments[0] == environments[1]
    assert summaries[0] == summaries[1]


@pytest.mark.slow
def test_trials_are_rayfed_runs_divergence_is_recorded_and_a_rerun_continues(in_tmp, capsys, monkeypatch):
    """A diverging trial once failed with 79 lines of Tune's traceback (it could not copy RunStopped):
    it is a trial whose status is diverged, a result of its setting, and the sweep succeeds."""
    write_sweep(in_tmp / "s.yaml", {"algorithm.lr_local": [0.02, 1000.0]})
    assert main(["sweep", "s.yaml", "train.rounds=6", "--out", "out", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "Error" not in captured.err, captured.err
    assert "1 of 2 trials finished" in captured.out
    assert "  diverged: algorithm.lr_local=1000.0: the run diverged in round " in captured.out
    status = json.loads((in_tmp / "out" / "status.json").read_text())
    assert status["algorithm.lr_local=0.02"]["status"] == "finished"
    assert status["algorithm.lr_local=1000.0"]["status"] == "diverged"
    assert status["algorithm.lr_local=1000.0"]["reason"].startswith("the run diverged in round ")
    assert not list((in_tmp / "out" / "trials").glob("*.failed"))
    assert main(["report", "out", "--metric", "test_accuracy", "--format", "png", "--out", "report"]) == 0
    assert [line.split(" | ")[-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| 0.02 |", "| 1000.0 |"))] == ["finished |", "diverged |"]
    trial = in_tmp / "out" / "trials" / "algorithm.lr_local=0.02"
    (in_tmp / "base.yaml").write_text(yaml.safe_dump(BASE))
    assert main(["run", "base.yaml", "train.rounds=6", "algorithm.lr_local=0.02", "--out", "plain", "--quiet"]) == 0
    same_run(in_tmp / "plain", trial)

    # The finished trial is interrupted after its round-4 checkpoint, as a killed sweep would leave it;
    # the diverged one is kept as it is. Running the same command again continues the first.
    shutil.rmtree(trial)
    overrides = [f"{key}={value}" for key, value in [("train.rounds", 6), ("algorithm.lr_local", 0.02)]]
    with monkeypatch.context() as patch:
        interrupted(in_tmp, _flatten(BASE) + overrides, patch, name="cut")
    shutil.move(in_tmp / "cut", trial)
    diverged = (in_tmp / "out" / "trials" / "algorithm.lr_local=1000.0" / "metrics.jsonl").read_bytes()
    assert main(["sweep", "s.yaml", "train.rounds=6", "--out", "out", "--quiet"]) == 0
    same_run(in_tmp / "plain", trial)
    assert (in_tmp / "out" / "trials" / "algorithm.lr_local=1000.0" / "metrics.jsonl").read_bytes() == diverged


def _flatten(mapping, prefix=""):
    items = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            items += _flatten(value, f"{prefix}{key}.")
        else:
            items.append(f"{prefix}{key}={json.dumps(value)}")
    return items


def test_sweep_without_ray_tune_says_how_to_install_it(in_tmp, capsys, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_tune(name, *args, **kwargs):
        if name == "rayfed.sweep.runner":
            raise ImportError("No module named 'ray.tune'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tune)
    write_sweep(in_tmp / "s.yaml", {"seed": [0]})
    assert main(["sweep", "s.yaml", "--out", "out"]) == 2
    assert "pip install 'rayfed[tune]'" in capsys.readouterr().err
    assert not os.path.exists(in_tmp / "out")


@pytest.mark.slow
def test_a_ray_engine_trial_runs_its_actors_inside_its_placement_group(in_tmp, capsys, ray_cluster):
    """The trial's bundles hold the server and workers: outside them the cluster (4 CPUs, 2.02 of them
    reserved by the trial) has no room for both one-CPU workers, and the trial would hang."""
    write_sweep(in_tmp / "s.yaml", {"seed": [0]}, base={**BASE, "engine": {"backend": "ray", "num_workers": 2}})
    assert main(["sweep", "s.yaml", "train.rounds=2", "--out", "out", "--quiet"]) == 0
    assert json.loads((in_tmp / "out" / "status.json").read_text())["seed=0"]["status"] == "finished"


@pytest.mark.slow
def test_one_process_runs_trial_after_trial_and_each_is_bitwise_its_rayfed_run(in_tmp, capsys, ray_cluster):
    """Each trial once started a process of its own, importing PyTorch and rayfed and loading its data
    again (about 6 s a trial). With one trial at a time (3 of the cluster's 4 CPUs each), the second
    trial runs in the first one's process, on the data it loaded, and still writes what `rayfed run` does."""
    write_sweep(in_tmp / "s.yaml", {"algorithm.lr_local": [0.02, 0.05]})
    assert main(["sweep", "s.yaml", "train.rounds=3", "engine.worker_cpus=3", "--out", "out", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 trials finished" in out and "2 trials run in " in out and "(1 at a time, 1 processes)" in out, out
    results = [json.loads(path.read_text().splitlines()[-1])
               for path in sorted((in_tmp / "out" / "tune" / "tune").glob("*/result.json"))]
    assert len(results) == 2 and results[0]["pid"] == results[1]["pid"]
    (in_tmp / "base.yaml").write_text(yaml.safe_dump(BASE))
    for lr in (0.02, 0.05):
        assert main(["run", "base.yaml", "train.rounds=3", "engine.worker_cpus=3", f"algorithm.lr_local={lr}",
                     "--out", f"plain{lr}", "--quiet"]) == 0
        same_run(in_tmp / f"plain{lr}", in_tmp / "out" / "trials" / f"algorithm.lr_local={lr}")


@pytest.mark.slow
def test_trials_that_differ_in_numbers_run_as_one_pack_each_as_its_run_alone(in_tmp, capsys, ray_cluster):
    """Vectorised on the local engine, four trials (two learning rates, two seeds) run as one Tune trial whose
    clients train as one batch; each keeps its own run directory, equal to its `rayfed run` alone."""
    grid = {"algorithm.lr_local": [0.02, 0.05], "seed": [0, 1]}
    write_sweep(in_tmp / "s.yaml", grid)
    overrides = ["train.rounds=3", "engine.vectorize=true", "model.name=logreg"]
    assert main(["sweep", "s.yaml", *overrides, "--out", "out", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "4 of 4 trials finished" in out and "4 trials run in 1 pack (--pack 32)" in out, out
    for lr in (0.02, 0.05):
        for seed in (0, 1):
            alone = rayfed.run(load_config(None, [*_flatten(BASE), *overrides, f"algorithm.lr_local={lr}",
                                                  f"seed={seed}"]), run_dir=in_tmp / f"alone{lr}_{seed}",
                               progress=False)
            trial = in_tmp / "out" / "trials" / f"algorithm.lr_local={lr}__seed={seed}"
            records = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]
            assert len(records) == 3
            for record, alone_record in zip(records, alone.history):
                assert record["train_loss"] == pytest.approx(alone_record["train_loss"], rel=RTOL)
                assert record["test_accuracy"] == pytest.approx(alone_record["test_accuracy"], abs=1e-6)


def timeline(trials):
    """TrialTimes as Tune's callbacks fill it: (process, start, end, run seconds) per trial."""
    times = TrialTimes()
    for number, (process, start, end, run_s) in enumerate(trials):
        times.started[number], times.ended[number] = start, end
        times.run_s[number], times.process[number] = run_s, ("node", process)
    return times


def test_start_up_per_trial_counts_what_processes_spend_besides_runs():
    # Two slots, a process per trial: each later process's start (from the slot freed at 10 or 11 to 16
    # or 18) counts, the first two processes' start (before 0) does not: (4 x 10 + 6 + 7 - 40) / 4.
    fresh = timeline([(1, 0, 10, 10), (2, 1, 11, 10), (3, 16, 26, 10), (4, 18, 28, 10)])
    assert fresh.startup_per_trial_s(slots=2) == pytest.approx((4 * 10 + 6 + 7 - 40) / 4)
    # Two processes reused: the hand-overs (0.5 s) count, the second slot's wait for the last trial does not.
    reused = timeline([(1, 0, 10, 10), (2, 1, 11, 10), (1, 10.5, 20.5, 10), (2, 11.5, 21.5, 10), (1, 21, 31, 10)])
    assert reused.startup_per_trial_s(slots=2) == pytest.approx((31 + 20.5 - 50) / 5)


@pytest.mark.parametrize("vectorize, packs", [(False, 8), (True, 2)])
def test_plan_lists_the_trials_by_what_differs_and_estimates_from_a_calibration(in_tmp, capsys, vectorize, packs):
    """Vectorised on the local engine, the trials that differ only in a learning rate and a seed pack: the plan
    calibrates a whole pack and counts packs of its rounds; otherwise each trial is a pack of one."""
    write_sweep(in_tmp / "s.yaml", {"algorithm.name": ["fedavg", "fedprox"], "algorithm.lr_local": [0.01, 0.1],
                                    "seed": [0, 1]})
    assert main(["sweep", "s.yaml", "train.rounds=7", f"engine.vectorize={str(vectorize).lower()}", "--plan",
                 "--out", "out"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "rayfed: plan of s.yaml: 8 trials, 0 of them done in out"
    assert lines[1] == "  what differs: algorithm.name (fedavg, fedprox) x algorithm.lr_local (0.01, 0.1) x seed (0, 1)"
    assert lines[2] == f"  packing: 8 trials to run in {packs} packs of at most 32 (--pack)"
    slots = min(packs, os.cpu_count())      # a local trial reserves engine.worker_cpus=1
    assert lines[3].startswith(f"  concurrency: {slots} packs at once (this machine's {os.cpu_count()} CPUs")
    assert lines[4] == "  calibration: 3 rounds of one pack per group, in a temporary directory that is deleted"
    rows = [line.split() for line in lines[6:8]]
    assert [row[:3] for row in rows] == [["algorithm.name=fedavg", "4", "7"], ["algorithm.name=fedprox", "4", "7"]]
    per_group = packs // 2
    assert all(float(row[3]) > 0 and row[5] == f"{per_group}x{4 // per_group}" for row in rows)  # s/round; packing
    estimate = re.match(r"  estimate: \d+ s = runs (\d+) s \(packs x rounds x s/round\) / (\d+) \+ start-up", lines[8])
    assert estimate and int(estimate[2]) == slots, lines[8]
    # the printed s/round are rounded to 1 ms, the runs to 1 s
    assert abs(int(estimate[1]) - sum(per_group * 7 * float(row[3]) for row in rows)) <= 0.5 + 2 * 4 * 7 * 0.0005
    # Nothing is left behind: neither the sweep directory nor the calibration's runs.
    assert sorted(path.name for path in in_tmp.iterdir()) == ["s.yaml"]


def test_a_packs_calibrated_round_is_at_least_its_wall_time_over_its_rounds(in_tmp, capsys, monkeypatch):
    """Members whose passes are not pooled (a local objective's) run one after another: a pack's round then lasts
    its wall time, less the members' start-ups, over the rounds, not one member's round (a clock that moves 100 s
    per pack here)."""
    clock = iter(range(0, 1000, 100))
    monkeypatch.setattr(plan, "perf_counter", lambda: float(next(clock)))
    write_sweep(in_tmp / "s.yaml", {"algorithm.lr_local": [0.01, 0.1], "seed": [0, 1]})
    assert main(["sweep", "s.yaml", "train.rounds=7", "engine.vectorize=true", "--plan", "--out", "out"]) == 0
    row = capsys.readouterr().out.splitlines()[6].split()
    round_s, startup_s = float(row[3]), float(row[4]) - plan.TUNE_PER_TRIAL_S
    assert row[5] == "1x4" and round_s == pytest.approx((100 - 4 * startup_s) / 3, abs=0.01)


@pytest.mark.parametrize("arguments, expected", [
    (["sweep", "missing.yaml", "--plan"], "rayfed: error: sweep file missing.yaml does not exist\n"),
    (["sweep", "s.yaml", "train.round=3", "--plan"], "unknown key 'train.round'"),
    (["sweep", "s.yaml", "--plan", "--out", "other"], "other holds another sweep (its sweep.yaml differs)"),
    (["sweep", "s.yaml", "--pack", "0"], "--pack takes a number of trials of at least 1 (1: no packing), got 0"),
])
def test_plan_of_bad_input_is_one_line(in_tmp, capsys, arguments, expected):
    write_sweep(in_tmp / "s.yaml", {"seed": [0, 1]})
    (in_tmp / "other").mkdir()
    (in_tmp / "other" / "sweep.yaml").write_text("something else\n")
    assert main(arguments) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rayfed: error: ") and expected in err, err


def test_a_trial_process_keeps_datasets_under_all_that_decides_them(monkeypatch):
    """Off for plain runs; in a sweep's process a second load of the same data is a read-only copy of
    the first, and a change of seed or of any data key loads afresh."""
    from collections import OrderedDict
    from rayfed.data import cache, load_dataset
    keys = dict(num_clients=10, partition="natural")
    first, again = load_dataset("synthetic", seed=0, **keys), load_dataset("synthetic", seed=0, **keys)
    assert first.train_x is not again.train_x and first.train_x.flags.writeable
    monkeypatch.setattr(cache, "_kept", OrderedDict())
    monkeypatch.setattr(cache, "hits", 0)
    kept = load_dataset("synthetic", seed=0, **keys)
    copy = load_dataset("synthetic", seed=0, **keys)
    assert cache.hits == 1 and copy is not kept and copy.train_x is kept.train_x and not copy.train_x.flags.writeable
    assert (copy.train_x == first.train_x).all() and (copy.train_y == first.train_y).all()
    copy.train_x = None         # what a run does to its Dataset stays with it
    assert load_dataset("synthetic", seed=0, **keys).train_x is kept.train_x
    other_seed = load_dataset("synthetic", seed=1, **keys)
    other_key = load_dataset("synthetic", seed=0, **{**keys, "synthetic_alpha": 0.5})
    assert cache.hits == 2 and not (other_seed.train_x.shape == first.train_x.shape
                                    and (other_seed.train_x == first.train_x).all())
    assert other_key.train_x is not kept.train_x
