"""FedAvg, FedAvgM, FedProx, FedProxM against the maths of specs/gradma.md §3.1-3.4 and the §7 checks."""
import pytest
import torch

from rayfed.algorithms.base import Upload, weighted_average
from rayfed.algorithms.fedavg import FedAvgM
from rayfed.preflight import load_config
from rayfed.errors import ConfigError
from tests.fakes import DIM, client, make, run_rounds

def manual_local_sgd(client_id, x_t, steps=3, lr=0.1, mu=0.0):
    task = client(client_id)
    y = x_t.clone()
    for _ in range(steps):
        A, b = task.next_batch()
        grad = A.T @ (A @ y - b) / len(b) + mu * (y - x_t)
        y = y - lr * grad
    return y


def test_upload_is_global_minus_local_sgd_iterate():
    algorithm = make("fedavg")
    x_t = torch.randn(DIM)
    upload, _ = algorithm.client_train(client(2), {"params": x_t}, None)
    assert torch.allclose(upload.tensors["model_change"], manual_local_sgd(2, x_t) - x_t, rtol=1e-6, atol=1e-7)
    assert upload.num_samples == client(2).num_samples


def test_fedprox_local_gradient_has_proximal_term():
    algorithm = make("fedprox", mu=0.3)
    x_t = torch.randn(DIM, generator=torch.Generator().manual_seed(0))    # not the global stream other tests move
    upload, _ = algorithm.client_train(client(1), {"params": x_t}, None)
    expected = manual_local_sgd(1, x_t, mu=0.3) - x_t
    assert torch.allclose(upload.tensors["model_change"], expected, rtol=1e-6, atol=1e-7)
    plain, _ = make("fedavg").client_train(client(1), {"params": x_t}, None)
    assert not torch.allclose(plain.tensors["model_change"], expected)


def test_fedavgm_follows_momentum_recursion():
    run = run_rounds(make("fedavgm", beta1=0.6, lr_global=0.7))
    states, models = run.states, run.client_models
    x, m = torch.zeros(DIM), torch.zeros(DIM)
    for state, round_models in zip(states, models):
        d = torch.stack([x - round_models[i] for i in sorted(round_models)]).mean(0)
        m = 0.6 * m + d
        x = x - 0.7 * m
        assert torch.allclose(state.params, x, rtol=1e-6, atol=1e-6)
        assert torch.allclose(state.optimizer.momentum, -m, rtol=1e-6, atol=1e-6)      # kept as -m: m of model changes


def test_fedavg_with_unit_server_lr_is_the_average_of_client_models():
    run = run_rounds(make("fedavg", lr_global=1.0))
    states, models = run.states, run.client_models
    for state, round_models in zip(states, models):
        average = torch.stack([round_models[i] for i in sorted(round_models)]).mean(0)
        assert torch.allclose(state.params, average, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("left, right", [
    (dict(name="fedproxm", mu=0.0, beta1=0.8), dict(name="fedavgm", beta1=0.8)),
    (dict(name="fedprox", mu=0.0), dict(name="fedavg")),
    (dict(name="fedavgm", beta1=0.0), dict(name="fedavg")),
    (dict(name="fedproxm", beta1=0.0, mu=0.2), dict(name="fedprox", mu=0.2)),
])
def test_exact_reductions(left, right):
    for a, b in zip(run_rounds(make(**left)).states, run_rounds(make(**right)).states):
        assert torch.equal(a.params, b.params)


def test_sample_count_weighting():
    uploads = {}
    for client_id, n in [(0, 1), (1, 3)]:
        uploads[client_id] = Upload({"model_change": torch.full((2,), float(client_id + 1))}, n)
    assert torch.allclose(weighted_average(uploads, "model_change", "uniform"), torch.full((2,), 1.5))
    assert torch.allclose(weighted_average(uploads, "model_change", "num_samples"),
                          torch.full((2,), 0.25 * 1 + 0.75 * 2))


def test_weighting_changes_the_trajectory():
    uniform = run_rounds(make("fedavg")).states
    weighted = run_rounds(make("fedavg", agg_weighting="num_samples")).states
    assert not torch.allclose(uniform[-1].params, weighted[-1].params)


def test_registered_names_pin_their_fixed_hyperparameters():
    assert isinstance(make("fedavg"), FedAvgM)
    assert (make("fedavg").beta1, make("fedavg").mu) == (0.0, 0.0)
    assert (make("fedavgm").beta1, make("fedavgm").mu) == (0.9, 0.0)
    assert (make("fedprox").beta1, make("fedprox").mu) == (0.0, 0.01)
    assert (make("fedproxm", beta1=0.3, mu=0.1).beta1, make("fedproxm", beta1=0.3, mu=0.1).mu) == (0.3, 0.1)


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.name=fedavg", "algorithm.beta1=0.9"], "algorithm.beta1 is not a parameter of fedavg"),
    (["algorithm.name=fedavgm", "algorithm.mu=0.1"], "algorithm.mu is not a parameter of fedavgm"),
    (["algorithm.name=fedavgm", "algorithm.beta1=1.0"], "algorithm.beta1=1.0 must be in [0, 1)"),
    (["algorithm.name=fedprox", "algorithm.mu=-1"], "algorithm.mu=-1.0 must be >= 0"),
])
def test_algorithm_hyperparameter_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        load_config(None, overrides)
