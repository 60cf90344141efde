"""How a run ends when it cannot finish: divergence, an unreachable cluster, SIGINT and SIGTERM, a
failure before the first round. Each says so in one line, with its own exit code, and leaves the
run directory either complete up to its last round or not at all."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import rayfed
from rayfed.callbacks.divergence import likely_cause
from rayfed.checkpoint import read_checkpoint
from rayfed.cli import main
from rayfed.engine.supervisor import Supervisor
from rayfed.engine.state_store import tensors_to
from tests.test_engine_equivalence import SYNTHETIC_MLP

LOCAL = SYNTHETIC_MLP + ["engine.backend=local"]


def strict_json(text):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_divergence_stops_the_run_with_one_line_and_keeps_what_was_computed(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", *LOCAL, "train.rounds=50", "train.eval_every=1", "algorithm.lr_local=1000",
                 "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("rayfed: stopped: the run diverged in round "), err
    assert "algorithm.lr_local=1000.0" in err
    lines = (out / "metrics.jsonl").read_text().splitlines()
    records = [strict_json(line) for line in lines]
    diverged = records[-1]
    assert f"diverged in round {diverged['round']}:" in err
    assert diverged["round"] < 50
    assert None in (diverged["train_loss"], diverged["test_loss"]) or diverged["model_finite"] is False
    summary = strict_json((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["rounds_completed"] == len(records)


def test_divergence_under_a_weight_decay_sgd_cannot_take_blames_the_weight_decay(tmp_path, capsys):
    """lr * lambda = 0.02 * 1e6: the decay alone multiplies the weights by -19999 a step; the learning
    rate, blamed before, is the quick-start's."""
    code = main(["run", *LOCAL, "train.weight_decay=1e6", "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert ("likely cause: weight decay: each local step multiplies the weights by 1 - algorithm.lr_local * "
            "train.weight_decay = -19999, which grows them whatever the data (train.weight_decay=1000000.0, "
            f"algorithm.lr_local=0.02: their product must stay below 2); {tmp_path / 'run'} keeps rounds 1-") in err


@pytest.mark.parametrize("overrides, cause", [
    ([], "learning rates too large for this model and data (algorithm.lr_local=0.02, algorithm.lr_global=1.0)"),
    (["train.weight_decay=49"], "learning rates too large for this model and data (algorithm.lr_local=0.02, "
                                "algorithm.lr_global=1.0)"),
    (["train.weight_decay=60", "train.weight_decay_mode=decoupled"],
     "learning rates too large with this weight decay: algorithm.lr_local * train.weight_decay = 1.2 leaves little "
     "of SGD's stability limit 2 to the loss (algorithm.lr_local=0.02, algorithm.lr_global=1.0, "
     "train.weight_decay=60.0)"),
])
def test_the_likely_cause_of_a_divergence_weighs_the_weight_decay_against_the_learning_rate(overrides, cause):
    assert likely_cause(rayfed.load_config(None, LOCAL + overrides)) == cause


def test_a_failure_before_the_first_round_leaves_no_run_directory(tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(Supervisor, "run", broken)
    config = rayfed.load_config(None, LOCAL)
    with pytest.raises(RuntimeError, match="boom"):
        rayfed.run(config, run_dir=tmp_path / "new" / "run", progress=False)
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="boom"):
        rayfed.run(config, run_dir=tmp_path / "empty", progress=False)
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("environment, arguments", [
    ({}, ["engine.address=127.0.0.1:1"]),
    ({"RAY_ADDRESS": "127.0.0.1:1"}, []),
])
def test_an_unreachable_cluster_is_one_line_and_exit_2_within_the_connect_timeout(tmp_path, environment,
                                                                                   arguments):
    started = time.monotonic()
    completed = subprocess.run([sys.executable, "-m", "rayfed", "run", *arguments, "engine.connect_timeout_s=5",
                                "--out", "out"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                               env={**os.environ, **environment})
    assert completed.returncode == 2
    assert completed.stderr.count("\n") == 1, completed.stderr
    assert "no Ray cluster answers at" in completed.stderr and "127.0.0.1:1" in completed.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()


# `python -m rayfed` with Python's own SIGINT handler. A suite started in the background by a shell
# (`pytest ... &`) ignores SIGINT, its children inherit that, and Python then installs no handler: the
# run would rightly go on, as any background job does.
AS_FROM_A_TERMINAL = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                      "runpy.run_module('rayfed', run_name='__main__', alter_sys=True)")


@pytest.mark.slow
@pytest.mark.parametrize("signal_number, exit_code, word", [(signal.SIGTERM, 143, "terminated"),
                                                            (signal.SIGINT, 130, "interrupted")])
def test_a_signal_stops_the_run_promptly_keeping_its_checkpoint_and_stopping_its_ray(tmp_path, signal_number,
                                                                                     exit_code, word):
    process = subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, "run", *SYNTHETIC_MLP, "train.rounds=100000",
                                "train.checkpoint_every=2", "--out", "out", "--quiet"],
                               cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "out" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    children = descendants(process.pid)
    assert children                               # the Ray instance rayfed started
    sent = time.monotonic()
    process.send_signal(signal_number)
    _, err = process.communicate(timeout=60)
    assert time.monotonic() - sent < 30
    assert process.returncode == exit_code
    assert err.splitlines()[-1].startswith(f"rayfed: {word} after round "), err
    assert "rayfed run --resume out" in err
    assert read_checkpoint(tmp_path / "out").rounds_completed >= 4
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "interrupted"
    deadline = time.monotonic() + 30
    while any(map(running, children)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [child for child in children if running(child)]


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[1])


def descendants(pid):
    """Every process below `pid`, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(parent_of(entry), []).append(int(entry))
            except OSError:
                continue
    return _below(children, pid)


def _below(children, pid):
    return [found for child in children.get(pid, []) for found in (child, *_below(children, child))]


def running(pid):
    """Alive and not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def tensors_in(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item)]
    if hasattr(value, "__dict__"):
        return [t for item in vars(value).values() for t in tensors_in(item)]
    return []


@pytest.mark.parametrize("name, hyper", [("fedavgm", {}), ("mifa", {}), ("gradma", {"memory_size": 6})])
def test_states_move_between_devices_whole(name, hyper):
    """What the server snapshots and the driver receives is on the CPU whatever the server's device:
    every tensor inside an algorithm's state objects moves (here to 'meta', which any machine has)."""
    from tests.fakes import make, run_rounds
    run = run_rounds(make(name, **hyper))
    state = {"server": run.states[-1], "clients": run.client_states}
    moved = tensors_in(tensors_to(state, torch.device("meta")))
    assert len(moved) == len(tensors_in(state)) > 1
    assert all(tensor.is_meta for tensor in moved)
    assert not any(tensor.is_meta for tensor in tensors_in(state))      # the original is untouched
