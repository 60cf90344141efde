"""The model zoo, the flat-parameter adapter and a client's minibatch stream."""
import copy

import numpy as np
import pytest
import torch

from rayfed.engine.worker import ClientTask
from rayfed.errors import ConfigError
from rayfed.models import FlatModel, build_model


@pytest.mark.parametrize("name, shape, expected", [
    ("logreg", (60,), 610),
    ("mlp", (1, 28, 28), 178_710),       # spec §5.3: d ~ 178.7k
    ("lenet5", (3, 32, 32), 941_834),    # spec §5.3: d ~ 0.94M
])
def test_parameter_counts(name, shape, expected):
    assert FlatModel(build_model(name, shape, 10)).num_params == expected


def test_vgg11_matches_the_spec_size_and_runs():
    model = FlatModel(build_model("vgg11", (3, 32, 32), 100))
    assert round(model.num_params / 1e6, 2) == 9.30                # spec §5.3: d ~ 9.30M
    loss, grad = model.loss_and_grad(torch.randn(4, 3, 32, 32), torch.randint(0, 100, (4,)))
    assert torch.isfinite(loss) and grad.shape == model.params.shape


def test_parameters_and_buffers_are_views_of_the_flat_vectors():
    torch.manual_seed(0)
    model = FlatModel(build_model("mlp", (12,), 3, [8]))
    inputs = torch.randn(16, 12)
    model.params.zero_()
    assert all(float(p.detach().abs().sum()) == 0 for p in model.module.parameters())
    before = model.buffers.clone()
    model.module(inputs)                        # a train-mode forward updates BN running statistics in place
    assert not torch.equal(before, model.buffers)


def test_flat_gradient_equals_autograd():
    torch.manual_seed(0)
    module = build_model("lenet5", (3, 32, 32), 10)
    reference = copy.deepcopy(module)
    model = FlatModel(module)
    inputs, targets = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    torch.manual_seed(5)
    loss, grad = model.loss_and_grad(inputs, targets)
    torch.manual_seed(5)                        # the same dropout masks
    expected_loss = torch.nn.functional.cross_entropy(reference(inputs), targets)
    expected = torch.autograd.grad(expected_loss, list(reference.parameters()))
    assert torch.allclose(loss, expected_loss.detach())
    assert torch.allclose(grad, torch.cat([g.reshape(-1) for g in expected]), atol=1e-6)
    grad = grad.clone()
    torch.manual_seed(5)
    _, grad_again = model.loss_and_grad(inputs, targets)
    assert torch.equal(grad_again, grad)                                 # gradients do not accumulate
    per_parameter = torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
    assert torch.equal(per_parameter, grad_again)                        # .grad stays a view of the flat buffer


def test_evaluate_uses_eval_mode_and_restores_train_mode():
    model = FlatModel(build_model("lenet5", (3, 32, 32), 10))
    inputs, targets = torch.randn(10, 3, 32, 32), torch.randint(0, 10, (10,))
    assert model.evaluate(inputs, targets) == model.evaluate(inputs, targets)     # no dropout at eval
    assert model.module.training


def test_lenet5_rejects_non_image_inputs():
    with pytest.raises(ConfigError, match="needs image data"):
        build_model("lenet5", (60,), 10)


def make_task(num_samples, batch_size, seed=0):
    model = FlatModel(build_model("logreg", (3,), 2))
    train_x = torch.arange(100, dtype=torch.float32).repeat(3, 1).T.contiguous()
    train_y = torch.zeros(100, dtype=torch.int64)
    indices = torch.arange(10, 10 + num_samples)
    return ClientTask(model, train_x, train_y, indices, batch_size, torch.Generator().manual_seed(seed))


def test_batches_walk_through_shuffled_epochs():
    task = make_task(num_samples=10, batch_size=4)
    batches = [task.next_batch()[0][:, 0].long().tolist() for _ in range(6)]
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    assert sorted(sum(batches[:3], [])) == list(range(10, 20))      # each epoch is a permutation
    assert sorted(sum(batches[3:], [])) == list(range(10, 20))
    assert batches[:3] != batches[3:]                               # reshuffled


def test_trailing_single_sample_batch_is_skipped_and_small_clients_use_one_full_batch():
    task = make_task(num_samples=9, batch_size=4)
    assert [len(task.next_batch()[0]) for _ in range(4)] == [4, 4, 4, 4]      # 4, 4, (1 skipped), 4, 4
    small = make_task(num_samples=3, batch_size=64)
    assert [len(small.next_batch()[0]) for _ in range(2)] == [3, 3]


def test_batch_stream_depends_only_on_its_generator():
    first = [make_task(10, 4, seed=7).next_batch()[0] for _ in range(2)]
    assert torch.equal(first[0], first[1])
    assert not torch.equal(make_task(10, 4, seed=7).next_batch()[0], make_task(10, 4, seed=8).next_batch()[0])


def test_gradient_at_a_foreign_point_leaves_the_resident_model_alone():
    task = make_task(num_samples=10, batch_size=4)
    point = torch.linspace(-1, 1, 8)
    resident = task.start_from(point)
    batch = task.next_batch()
    _, grad_elsewhere = task.loss_and_grad(torch.zeros(8), batch)
    grad_elsewhere = grad_elsewhere.clone()
    assert torch.equal(resident, point)
    _, grad_here = task.loss_and_grad(resident, batch)
    assert not torch.equal(grad_here, grad_elsewhere)
    np.testing.assert_array_equal(task.model.params.numpy(), point.numpy())


def test_auxiliary_gradients_leave_batchnorm_statistics_as_a_plain_step_would():
    """Spec §7 check 15: the gradients GradMA-W takes at other points (previous iterate, global
    model) must not move the resident model's BN running statistics."""
    def task_with_bn():
        torch.manual_seed(0)
        model = FlatModel(build_model("mlp", (6,), 3, [5]))
        train_x = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
        return ClientTask(model, train_x, torch.arange(40) % 3, torch.arange(40), 8, torch.Generator().manual_seed(2))

    plain, corrected = task_with_bn(), task_with_bn()
    start = plain.model.params.clone()
    for task in (plain, corrected):
        resident = task.start_from(start)
        batch = task.next_batch()
        task.loss_and_grad(resident, batch)
        if task is corrected:
            task.loss_and_grad(start + 1.0, batch)          # a1 at another point
            task.loss_and_grad(start - 0.5, batch)          # a2 at another point
    assert not torch.equal(plain.model.buffers, task_with_bn().model.buffers)     # the step did move them
    assert torch.equal(plain.model.buffers, corrected.model.buffers)
    assert torch.equal(plain.model.params, corrected.model.params)
