"""ResNet-20, the CIFAR residual network of He et al. ("Deep Residual Learning for Image
Recognition", CVPR 2016, Section 4.2) with n = 3, and GradMA's Tiny-ImageNet model: 1x1-conv+BN
projection shortcuts where the shape changes (the paper's option B), identity elsewhere.

It is an nn.Sequential of [stem, stage1, stage2, stage3, SpatialMean, Flatten, Linear] whose
children run one after another, so rayfed's block machinery (rayfed.models.forward) takes its
FedMLB blocks and MOON representation from `with_structure` alone."""
from __future__ import annotations

from torch import Tensor, nn

from rayfed.errors import ConfigError
from rayfed.models.forward import with_structure
from rayfed.models.zoo import SpatialMean, _image_shape, register_model

STAGE_WIDTHS = (16, 32, 64)
STAGE_STRIDES = (1, 2, 2)
BLOCKS_PER_STAGE = 3            # n = 3: 6n + 2 = 20 weighted layers
# The stages halve the side twice: at 8x8 the last stage still sees a 2x2 map.
MIN_SIDE = 8
# FedMLB's blocks, by child index: stem+stage1 | stage2 | stage3 | pool+fc.
BLOCK_STARTS = (0, 2, 3, 4)


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with BatchNorm, ReLU between and after the sum with the shortcut: the identity
    when the shape is unchanged, a 1x1 conv (with the block's stride, no bias) and BatchNorm otherwise."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels))
        else:
            self.shortcut = nn.Identity()

    def forward(self, inputs: Tensor) -> Tensor:
        outputs = self.relu(self.bn1(self.conv1(inputs)))
        outputs = self.bn2(self.conv2(outputs))
        return self.relu(outputs + self.shortcut(inputs))


@register_model("resnet20")
def resnet20(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """ResNet-20 (He et al., CVPR 2016, Section 4.2, n = 3): a 3x3 conv stem, three stages of three
    BasicBlocks of 16/32/64 channels with strides 1/2/2, 1x1-conv+BN projection shortcuts where the
    shape changes (GradMA's Tiny-ImageNet model), global average pooling, Linear(64, classes).
    d = 272,474 on 3x32x32 with 10 classes; 284,824 on 3x64x64 with 200. Images of at least 8x8.
    FedMLB blocks: stem+stage1 | stage2 | stage3 | pool+fc; MOON's representation: the pooled 64 features."""
    channels, height, width = _image_shape(input_shape)
    if height < MIN_SIDE or width < MIN_SIDE:
        raise ConfigError(f"model.name=resnet20 needs images of at least {MIN_SIDE}x{MIN_SIDE}, got {height}x{width}")
    stem = nn.Sequential(_conv3x3(channels, STAGE_WIDTHS[0]), nn.BatchNorm2d(STAGE_WIDTHS[0]), nn.ReLU())
    stages = []
    in_channels = STAGE_WIDTHS[0]
    for stage_width, stride in zip(STAGE_WIDTHS, STAGE_STRIDES):
        blocks = []
        for index in range(BLOCKS_PER_STAGE):
            blocks.append(BasicBlock(in_channels, stage_width, stride if index == 0 else 1))
            in_channels = stage_width
        stages.append(nn.Sequential(*blocks))
    model = nn.Sequential(stem, *stages, SpatialMean(), nn.Flatten(), nn.Linear(in_channels, num_classes))
    return with_structure(model, BLOCK_STARTS)
