"""FedAvg with server Nesterov momentum: the update rule against a hand recursion, FedAvg at
beta = 0 bit for bit, the example plugin it came from bit for bit, and its state in checkpoints."""
import shutil
from pathlib import Path

import pytest
import torch

import rayfed
from rayfed.checkpoint import read_checkpoint
from tests.fakes import make, run_rounds
from tests.test_plugins import EXAMPLE, forget_plugins

SMALL = ["engine.backend=local", "data.num_clients=12", "train.clients_per_round=4", "train.rounds=5",
         "train.eval_every=5", "model.name=mlp", "model.hidden_sizes=[8]", "algorithm.lr_global=0.8"]


def test_the_server_takes_sutskevers_nesterov_step_on_the_average_model_change():
    run = run_rounds(make("fedavg_nesterov", momentum=0.6, lr_global=0.7))
    x, v = torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    for state, round_models in zip(run.states, run.client_models):
        gradient = torch.stack([x - round_models[i].double() for i in sorted(round_models)]).mean(0)
        v = 0.6 * v + gradient                          # v <- beta v + g
        x = x - 0.7 * (gradient + 0.6 * v)              # x <- x - lr (g + beta v)
        torch.testing.assert_close(state.params.double(), x, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(state.optimizer.momentum.double(), -v, rtol=1e-6, atol=1e-6)


def test_without_momentum_it_is_fedavg_bit_for_bit():
    nesterov = run_rounds(make("fedavg_nesterov", momentum=0.0)).states
    fedavg = run_rounds(make("fedavg")).states
    assert all(torch.equal(a.params, b.params) for a, b in zip(nesterov, fedavg))


def test_it_is_the_example_plugin_bit_for_bit(tmp_path, monkeypatch):
    shutil.copy(EXAMPLE, tmp_path / "my_plugins.py")
    monkeypatch.chdir(tmp_path)
    try:
        example = rayfed.run(rayfed.load_config(None, SMALL + ["plugins=[./my_plugins.py]",
                                                               "algorithm.name=my_fedavg_nesterov",
                                                               "algorithm.momentum=0.7"]),
                             run_dir=tmp_path / "example", progress=False)
    finally:
        forget_plugins()
    built_in = rayfed.run(rayfed.load_config(None, SMALL + ["algorithm.name=fedavg_nesterov", "algorithm.momentum=0.7"]),
                          run_dir=tmp_path / "built_in", progress=False)
    assert torch.equal(example.params, built_in.params)


def test_its_state_is_checkpointed_and_its_parameters_validated(tmp_path):
    rayfed.run(rayfed.load_config(None, SMALL + ["algorithm.name=fedavg_nesterov", "train.checkpoint_every=2"]),
               run_dir=tmp_path / "run", progress=False)
    assert read_checkpoint(tmp_path / "run").server["state"].optimizer.momentum.abs().sum() > 0
    with pytest.raises(rayfed.ConfigError, match=r"^algorithm.momentum=1.0 must be in \[0, 1\)$"):
        rayfed.load_config(None, ["algorithm.name=fedavg_nesterov", "algorithm.momentum=1"])
    assert Path(tmp_path / "run" / "summary.json").is_file()
