"""FedMLB and FedMLBM: a client's local steps against a float64 reference that runs the hybrid
pathways through a frozen deep copy of the global model (as the authors' code does), the
reductions (lambda2 = lambda3 = 0 is FedAvg, FedMLBM with beta1 = 0 is FedMLB, bit for bit), the
model it refuses, engines and resume."""
import copy

import pytest
import torch

import rayfed
from rayfed.algorithms.base import AlgorithmContext, build_algorithm
from rayfed.config import algorithm_section
from tests.algorithm_checks import (assert_engines_agree, assert_resume_agrees, assert_same_params, flat, model_task,
                                    perturbed, tiny_mlp)

BLOCKS = [slice(0, 4), slice(4, 7), slice(7, 8)]      # the mlp's: Linear+BN+ReLU | Linear+BN+ReLU | Linear


def reference_client(global_model, batches, lambdas, temperature, lr, steps):
    """Kim et al.'s local update: the main pathway's block outputs, each continued through the frozen
    global copy's later blocks (train mode, no gradient to its parameters)."""
    lambda1, lambda2, lambda3 = lambdas
    local = copy.deepcopy(global_model).train()
    frozen = copy.deepcopy(global_model).train().requires_grad_(False)
    for _ in range(steps):
        inputs, targets = batches.next_batch()
        outputs, hidden = [], inputs
        for block in BLOCKS:
            hidden = local[block](hidden)
            outputs.append(hidden)
        main = outputs[-1]
        ce_sum = kl_sum = 0
        for level in range(1, len(BLOCKS)):
            hybrid = frozen[BLOCKS[level].start:](outputs[level - 1])
            ce_sum = ce_sum - torch.log_softmax(hybrid, 1)[torch.arange(len(targets)), targets].mean()
            p = torch.softmax(hybrid / temperature, 1)
            kl_sum = kl_sum + (p * (torch.log(p) - torch.log_softmax(main / temperature, 1))).sum(1).mean()
        main_ce = -torch.log_softmax(main, 1)[torch.arange(len(targets)), targets].mean()
        loss = lambda1 * main_ce + lambda2 / 2 * ce_sum + lambda3 / 2 * kl_sum
        gradients = torch.autograd.grad(loss, list(local.parameters()))
        with torch.no_grad():
            for parameter, gradient in zip(local.parameters(), gradients):
                parameter.sub_(lr * gradient)
    return local


def fedmlb(lambdas, temperature):
    section = {"name": "fedmlb", "lr_local": 0.1, "lambda1": lambdas[0], "lambda2": lambdas[1],
               "lambda3": lambdas[2], "temperature": temperature}
    return build_algorithm(algorithm_section(section), AlgorithmContext())


@pytest.mark.parametrize("lambdas, temperature", [((1.0, 1.0, 1.0), 1.0), ((0.5, 2.0, 0.7), 3.0)])
def test_a_clients_steps_match_a_float64_reference_through_frozen_global_blocks(lambdas, temperature):
    global_model = perturbed(tiny_mlp(), 0.2, seed=1)
    task, batches = model_task(copy.deepcopy(global_model))
    start = flat(global_model)
    upload = fedmlb(lambdas, temperature).client_train(task, {"params": start}, None)[0]
    reference = reference_client(global_model, batches, lambdas, temperature, lr=0.1, steps=3)
    torch.testing.assert_close(start + upload.tensors["model_change"], flat(reference), rtol=1e-10, atol=1e-12)
    # The frozen blocks' batch statistics go nowhere: the trained model's are the main pathway's alone.
    torch.testing.assert_close(task.buffers(), flat(reference, buffers=True), rtol=1e-10, atol=1e-12)


def test_without_the_branch_terms_it_is_fedavg_and_without_momentum_fedmlbm_is_fedmlb(tmp_path):
    assert_same_params(tmp_path / "fedavg", ["algorithm.name=fedmlb", "algorithm.lambda2=0", "algorithm.lambda3=0"],
                       ["algorithm.name=fedavg"])
    assert_same_params(tmp_path / "fedmlbm", ["algorithm.name=fedmlbm", "algorithm.beta1=0"],
                       ["algorithm.name=fedmlb"])
    assert_same_params(tmp_path / "fedavgm", ["algorithm.name=fedmlbm", "algorithm.beta1=0.5", "algorithm.lambda2=0",
                                              "algorithm.lambda3=0"],
                       ["algorithm.name=fedavgm", "algorithm.beta1=0.5"])


def test_a_model_without_blocks_is_refused_with_the_models_that_have_them():
    with pytest.raises(rayfed.ConfigError, match=r"^algorithm.name=fedmlb takes the model's blocks: model.name=logreg "
                                                 r"declares 0 blocks, and two or more are needed \(see "
                                                 r"rayfed.models.forward.with_structure\); use one of: mlp, relu_mlp"):
        rayfed.load_config(None, ["algorithm.name=fedmlb", "model.name=logreg"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedmlb", "fedmlbm"])
def test_local_and_ray_engines_are_bitwise_identical(tmp_path, ray_cluster, name):
    assert_engines_agree(tmp_path, [f"algorithm.name={name}"])


def test_resume_is_bitwise_the_uninterrupted_run(tmp_path, monkeypatch):
    assert_resume_agrees(tmp_path, monkeypatch, ["algorithm.name=fedmlbm"])
