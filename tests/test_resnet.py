"""ResNet-20 (rayfed/models/resnet.py): its size, shapes, shortcuts and declared structure, and a tiny run."""
import re

import pytest
import torch
from torch import nn

import rayfed
from rayfed.preflight import load_config
from rayfed.errors import ConfigError
from rayfed.models import FlatModel, ModelForward, build_model
from rayfed.models.forward import structure_of
from rayfed.models.resnet import BasicBlock
from rayfed.models.zoo import SpatialMean
from rayfed.resources import input_misfit


def conv(in_channels, out_channels, kernel):
    return in_channels * out_channels * kernel * kernel       # no bias


def bn(channels):
    return 2 * channels                                       # weight and bias


def expected_params(in_channels, num_classes):
    """He et al.'s n = 3 CIFAR ResNet with 1x1-conv+BN projections where the shape changes."""
    stem = conv(in_channels, 16, 3) + bn(16)

    def block(c_in, c_out):
        projection = conv(c_in, c_out, 1) + bn(c_out) if c_in != c_out else 0
        return conv(c_in, c_out, 3) + bn(c_out) + conv(c_out, c_out, 3) + bn(c_out) + projection

    stages = sum(block(c_in, c_out) + 2 * block(c_out, c_out) for c_in, c_out in ((16, 16), (16, 32), (32, 64)))
    head = 64 * num_classes + num_classes
    return stem + stages + head


@pytest.mark.parametrize("shape, num_classes, expected", [
    ((3, 32, 32), 10, 272_474),        # CIFAR-10: He et al.'s ~0.27M
    ((3, 64, 64), 200, 284_824),       # Tiny-ImageNet, GradMA's setup
])
def test_parameter_count(shape, num_classes, expected):
    assert expected_params(shape[0], num_classes) == expected
    model = FlatModel(build_model("resnet20", shape, num_classes))
    assert model.num_params == expected
    convs = [m for m in model.module.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 1 + 18 + 2 and all(m.bias is None for m in convs)    # 19 3x3 convs, 2 projections
    linears = [m for m in model.module.modules() if isinstance(m, nn.Linear)]
    assert len(convs) - 2 + len(linears) == 20                                 # the 20 weighted layers


@pytest.mark.parametrize("shape, num_classes", [((3, 32, 32), 10), ((3, 64, 64), 200), ((1, 8, 8), 10)])
def test_output_shapes(shape, num_classes):
    model = build_model("resnet20", shape, num_classes)
    with torch.no_grad():
        assert model(torch.randn(2, *shape)).shape == (2, num_classes)


def test_gradient_reaches_every_parameter():
    torch.manual_seed(0)
    model = FlatModel(build_model("resnet20", (3, 32, 32), 10))
    loss, grad = model.loss_and_grad(torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,)))
    assert torch.isfinite(loss) and grad.shape == model.params.shape
    assert all(bool(p.grad.abs().sum() > 0) for p in model.module.parameters())


def test_it_is_a_sequential_with_the_declared_structure():
    model = build_model("resnet20", (3, 32, 32), 10)
    assert isinstance(model, nn.Sequential) and len(model) == 7
    stem, *stages, pool, flatten, fc = model
    assert [type(layer) for layer in stem] == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU]
    for stage, width in zip(stages, (16, 32, 64)):
        assert isinstance(stage, nn.Sequential) and len(stage) == 3
        assert all(isinstance(block, BasicBlock) and block.conv2.out_channels == width for block in stage)
    assert isinstance(pool, SpatialMean) and isinstance(flatten, nn.Flatten)
    assert isinstance(fc, nn.Linear) and (fc.in_features, fc.out_features) == (64, 10)
    structure = structure_of(model)
    assert structure.block_starts == (0, 2, 3, 4)       # stem+stage1 | stage2 | stage3 | pool+fc
    assert structure.features_at == 6                   # MOON: the input of the Linear
    assert not any(isinstance(m, nn.AdaptiveAvgPool2d) for m in model.modules())


def test_block_outputs_and_representation():
    torch.manual_seed(0)
    model = build_model("resnet20", (3, 32, 32), 10)
    inputs = torch.randn(3, 3, 32, 32)
    model(inputs)                                       # running statistics away from their initial values
    model.eval()
    forward = ModelForward(model, structure_of(model))
    with torch.no_grad():
        logits = model(inputs)
        outputs = forward.block_outputs(inputs)
        features, feature_logits = forward.features(inputs)
        assert [tuple(o.shape) for o in outputs] == [(3, 16, 32, 32), (3, 32, 16, 16), (3, 64, 8, 8), (3, 10)]
        assert torch.equal(outputs[-1], logits)
        assert features.shape == (3, 64) and torch.equal(feature_logits, logits)
        for first in range(1, 4):                       # FedMLB's hybrid paths: block k on block k-1's output
            assert torch.allclose(forward.through_blocks(outputs[first - 1], first), logits, atol=1e-6)


def test_frozen_pass_at_the_models_own_vector_matches_eval():
    torch.manual_seed(0)
    flat = FlatModel(build_model("resnet20", (3, 32, 32), 10))
    inputs = torch.randn(4, 3, 32, 32)
    flat.module(inputs)
    flat.module.eval()
    with torch.no_grad():
        logits = flat.module(inputs)
    flat.module.train()
    frozen = flat.forward_at(flat.params.clone(), flat.buffers, train=False)
    with torch.no_grad():
        assert torch.allclose(frozen.block_outputs(inputs)[-1], logits, atol=1e-6)
    assert flat.module.training


def test_projection_shortcuts_only_where_the_shape_changes():
    model = build_model("resnet20", (3, 32, 32), 10)
    for stage_index, stage in enumerate(model[1:4]):
        for block_index, block in enumerate(stage):
            if stage_index > 0 and block_index == 0:
                projection, norm = block.shortcut
                assert isinstance(projection, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d)
                assert projection.kernel_size == (1, 1) and projection.stride == (2, 2) and projection.bias is None
                assert projection.out_channels == norm.num_features == 2 * projection.in_channels
            else:
                assert isinstance(block.shortcut, nn.Identity)


def test_batchnorm_after_every_conv():
    model = build_model("resnet20", (3, 32, 32), 10)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(norms) == 21
    assert FlatModel(model).buffers.numel() == 2 * sum(norm.num_features for norm in norms)


@pytest.mark.parametrize("shape, fragment", [
    ((60,), "needs image data (channels, height, width), got inputs of shape (60,)"),
    ((3, 7, 32), "model.name=resnet20 needs images of at least 8x8, got 7x32"),
])
def test_refuses_what_is_not_an_image_of_at_least_8x8(shape, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        build_model("resnet20", shape, 10)


def test_the_config_check_refuses_non_images_and_takes_digits():
    assert "needs image data" in input_misfit("resnet20", "synthetic")
    assert input_misfit("resnet20", "digits") is None


def test_a_tiny_run_on_digits(tmp_path):
    config = load_config(None, ["data.dataset=digits", "model.name=resnet20", "engine.backend=local",
                                "data.num_clients=10", "train.clients_per_round=2", "train.rounds=3",
                                "train.local_steps=2", "train.batch_size=16", "train.eval_every=3"])
    result = rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    assert len(result.history) == 3
    last = result.history[-1]
    assert last["round"] == 3 and 0.0 <= last["test_accuracy"] <= 1.0 and last["test_loss"] == last["test_loss"]
