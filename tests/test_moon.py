"""MOON and MOONM: a client's local steps against a float64 reference built from frozen copies of
the modules (as the authors' code does), the first participation's x_0, the reductions (mu = 0 is
FedAvg, MOONM with beta1 = 0 is MOON, bit for bit), engines, resume and the memory check."""
import copy

import pytest
import torch

from rayfed.algorithms.base import AlgorithmContext, build_algorithm
from rayfed.algorithms.moon import MoonClientState
from rayfed.config import algorithm_section
from tests.algorithm_checks import (assert_engines_agree, assert_memory_check_counts_client_state,
                                    assert_resume_agrees, assert_same_params, flat, model_task, perturbed, tiny_mlp)


def moon(mu, tau, lr=0.1, context=AlgorithmContext(), name="moon"):
    return build_algorithm(algorithm_section({"name": name, "lr_local": lr, "mu": mu, "tau": tau}), context)


def reference_client(global_model, previous_model, batches, mu, tau, lr, steps):
    """MOON's Algorithm 1 on deep copies: z from the local model, z_glob and z_prev from eval-mode copies."""
    local = copy.deepcopy(global_model).train()
    frozen_global, frozen_previous = copy.deepcopy(global_model).eval(), copy.deepcopy(previous_model).eval()
    for _ in range(steps):
        inputs, targets = batches.next_batch()
        z = local[:-1](inputs)
        logits = local[-1](z)
        with torch.no_grad():
            z_global, z_previous = frozen_global[:-1](inputs), frozen_previous[:-1](inputs)
        positive = torch.exp(torch.cosine_similarity(z, z_global, dim=1) / tau)
        negative = torch.exp(torch.cosine_similarity(z, z_previous, dim=1) / tau)
        contrastive = (-torch.log(positive / (positive + negative))).mean()
        cross_entropy = -torch.log_softmax(logits, dim=1)[torch.arange(len(targets)), targets].mean()
        gradients = torch.autograd.grad(cross_entropy + mu * contrastive, list(local.parameters()))
        with torch.no_grad():
            for parameter, gradient in zip(local.parameters(), gradients):
                parameter.sub_(lr * gradient)
    return local


def test_a_clients_steps_match_a_float64_reference_with_frozen_copies():
    global_model = perturbed(tiny_mlp(), 0.2, seed=1)          # nontrivial running statistics
    previous_model = perturbed(global_model, 0.3, seed=2)
    task, batches = model_task(copy.deepcopy(global_model))
    algorithm = moon(mu=2.0, tau=0.5)
    start = flat(global_model)
    previous = MoonClientState(flat(previous_model), flat(previous_model, buffers=True))
    upload, state = algorithm.client_train(task, {"params": start}, previous)
    reference = reference_client(global_model, previous_model, batches, mu=2.0, tau=0.5, lr=0.1, steps=3)
    torch.testing.assert_close(start + upload.tensors["model_change"], flat(reference), rtol=1e-10, atol=1e-12)
    # The client keeps the model it ended with, running statistics included.
    torch.testing.assert_close(state.params, flat(reference), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(state.buffers, flat(reference, buffers=True), rtol=1e-10, atol=1e-12)


def test_the_contrastive_term_moves_the_model_and_its_first_previous_model_is_x0():
    global_model = perturbed(tiny_mlp(), 0.2, seed=1)
    initial = perturbed(global_model, 0.5, seed=3)
    context = AlgorithmContext(initial_params=flat(initial), initial_buffers=flat(initial, buffers=True))
    start = flat(global_model)
    first = moon(1.0, 0.5, context=context).client_train(model_task(copy.deepcopy(global_model))[0],
                                                         {"params": start}, None)[0]
    explicit = moon(1.0, 0.5).client_train(model_task(copy.deepcopy(global_model))[0], {"params": start},
                                           MoonClientState(flat(initial), flat(initial, buffers=True)))[0]
    without = moon(0.0, 0.5, context=context).client_train(model_task(copy.deepcopy(global_model))[0],
                                                           {"params": start}, None)[0]
    assert torch.equal(first.tensors["model_change"], explicit.tensors["model_change"])
    assert not torch.allclose(first.tensors["model_change"], without.tensors["model_change"])


def test_mu_zero_is_fedavg_and_moonm_without_momentum_is_moon_bit_for_bit(tmp_path):
    assert_same_params(tmp_path / "fedavg", ["algorithm.name=moon", "algorithm.mu=0"], ["algorithm.name=fedavg"])
    assert_same_params(tmp_path / "moonm", ["algorithm.name=moonm", "algorithm.beta1=0", "algorithm.mu=1"],
                       ["algorithm.name=moon", "algorithm.mu=1"])
    momentum = assert_same_params(tmp_path / "fedavgm", ["algorithm.name=moonm", "algorithm.beta1=0.5",
                                                         "algorithm.mu=0"],
                                  ["algorithm.name=fedavgm", "algorithm.beta1=0.5"])
    assert momentum.summary["client_state_bytes"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moon", "moonm"])
def test_local_and_ray_engines_are_bitwise_identical(tmp_path, ray_cluster, name):
    reference = assert_engines_agree(tmp_path, [f"algorithm.name={name}", "algorithm.mu=1"])
    assert reference.summary["client_state_bytes"] > 0


def test_resume_is_bitwise_the_uninterrupted_run(tmp_path, monkeypatch):
    assert_resume_agrees(tmp_path, monkeypatch, ["algorithm.name=moonm", "algorithm.mu=1"])


def test_the_memory_check_counts_every_clients_previous_model(monkeypatch):
    assert_memory_check_counts_client_state(monkeypatch, ["algorithm.name=moon"])
