"""Local objectives: a loss of the model's outputs through the worker's task, frozen passes at other
parameter vectors, and the blocks and representation the models declare."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rayfed
from rayfed.algorithms.objective import Linear, LocalObjective, Proximal
from rayfed.models import build_model
from rayfed.models.forward import structure_of, with_structure
from tests.algorithm_checks import flat, model_task, perturbed, tiny_mlp


def test_cross_entropy_as_an_output_loss_is_the_tasks_own_gradient_bit_for_bit():
    task, _ = model_task(tiny_mlp())
    other, _ = model_task(tiny_mlp())
    batch = task.next_batch()
    other.next_batch()
    loss, grad = task.loss_and_grad(task.start_from(flat(tiny_mlp())), batch)
    grad = grad.clone()
    objective_loss, objective_grad = other.objective_loss_and_grad(
        other.start_from(flat(tiny_mlp())), batch, lambda model, inputs, targets: F.cross_entropy(model(inputs), targets))
    assert torch.equal(loss, objective_loss) and torch.equal(grad, objective_grad)


def test_a_frozen_pass_is_the_other_model_and_leaves_the_trained_one_as_it_was():
    trained, other = tiny_mlp(), perturbed(tiny_mlp(), 0.4, seed=7)
    task, _ = model_task(copy.deepcopy(trained))
    inputs = torch.randn(5, 6, dtype=torch.float64)
    resident = (task.start_from(flat(trained)).clone(), task.buffers())
    frozen_eval = task.forward_at(flat(other), flat(other, buffers=True))
    torch.testing.assert_close(frozen_eval(inputs), copy.deepcopy(other).eval()(inputs), rtol=0, atol=0)
    frozen_train = task.forward_at(flat(other), flat(other, buffers=True), train=True)
    torch.testing.assert_close(frozen_train(inputs), copy.deepcopy(other).train()(inputs), rtol=0, atol=0)
    batches_tracked = [b.clone() for b in task.task.model.module.buffers() if not b.is_floating_point()]
    assert torch.equal(task.task.model.params, resident[0]) and torch.equal(task.buffers(), resident[1])
    assert all(torch.equal(a, b) for a, b in zip(batches_tracked, (b for b in trained.buffers()
                                                                   if not b.is_floating_point())))
    assert task.task.model.module.training
    weights = flat(other).requires_grad_(True)
    hidden = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    task.forward_at(weights, flat(other, buffers=True)).through_blocks(hidden, 1).sum().backward()
    assert hidden.grad.abs().sum() > 0            # gradients reach the inputs of frozen blocks ...
    assert weights.grad is None                   # ... not their weights


def test_parameter_terms_add_their_closed_form_gradients():
    params, grad = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.5])
    center, h = torch.tensor([0.0, 1.0]), torch.tensor([0.25, -1.0])
    objective = LocalObjective(terms=(Linear(h), Proximal(0.3, center)))
    assert torch.equal(objective.direction(grad, params, 1), grad - h + 0.3 * (params - center))
    assert LocalObjective(terms=(Proximal(0.0, center),)).direction(grad, params, 1) is grad


@pytest.mark.parametrize("name, shape, starts, first_layers", [
    ("mlp", (1, 28, 28), (0, 4, 7), ["Flatten", "Linear", "Linear"]),
    ("relu_mlp", (1, 28, 28), (0, 3, 5), ["Flatten", "Linear", "Linear"]),
    ("lenet5", (3, 32, 32), (0, 4, 8, 13), ["Conv2d", "Conv2d", "Flatten", "Linear"]),
    ("vgg11", (3, 32, 32), (0, 4, 8, 15, 22, 29), ["Conv2d"] * 5 + ["SpatialMean"]),
    ("cnn8", (1, 8, 8), (0, 4, 8, 11), ["Conv2d", "Conv2d", "Flatten", "Linear"]),
])
def test_models_declare_the_blocks_of_gradmas_setup_and_their_representation(name, shape, starts, first_layers):
    model = build_model(name, shape, 10)
    structure = structure_of(model)
    assert structure.block_starts == starts
    assert [type(model[i]).__name__ for i in starts] == first_layers
    assert isinstance(model[structure.features_at], nn.Linear) and structure.features_at == len(model) - 1


def test_a_declared_structure_is_checked():
    layers = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    with pytest.raises(rayfed.ConfigError, match=r"^block starts \(1, 2\) must rise from 0"):
        with_structure(layers, (1, 2))
    with pytest.raises(rayfed.ConfigError, match=r"^features_at=3 must lie between 1 and 2$"):
        with_structure(layers, (0, 2), features_at=3)
    with pytest.raises(rayfed.ConfigError, match=r"^model.name=char_lstm is not an nn.Sequential"):
        structure_of(build_model("char_lstm", (80,), 80), "model.name=char_lstm")
