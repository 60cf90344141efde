"""The model zoo: logreg, mlp, lenet5, vgg11 (GradMA's, arXiv:2302.14307, Sec. 6.1), convmixer and char_lstm
(FedLALR's, arXiv:2309.09719, Sec. V-A), FedMoS's and FedCOM's models, and cnn8 for 8x8 images."""
from __future__ import annotations

import inspect
import math

from torch import Tensor, nn

from rayfed.errors import ConfigError, kind_of
from rayfed.models.forward import with_structure
from rayfed.registry import MODELS


def register_model(name: str):
    """Registers a model builder `(input_shape, num_classes[, hidden_sizes]) -> nn.Module` under
    `name` (rayfed.register_model): model.name then builds it."""
    def decorate(builder):
        if not callable(builder):
            raise ConfigError(f"register_model({name!r}) takes a function or class that builds an nn.Module")
        return MODELS.register(name)(builder)
    return decorate


@register_model("logreg")
def logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression: one Linear layer on the flattened input (the quick-start's model)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@register_model("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int, hidden_sizes: list[int]) -> nn.Module:
    """GradMA's authors' TinyNN: Linear -> BN1d -> ReLU per hidden layer, then Linear.
    With hidden_sizes [200, 100] on MNIST this is 784-200-100-10, d ~ 178.7k. One block per Linear."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return with_structure(nn.Sequential(*layers), (0, *range(4, len(layers), 3)))


@register_model("relu_mlp")
def relu_mlp(input_shape: tuple[int, ...], num_classes: int, hidden_sizes: list[int]) -> nn.Module:
    """Linear -> ReLU per hidden layer, then Linear, without BatchNorm: FedCOM's MLP (arXiv:2007.01154,
    Sec. B; hidden_sizes [200, 200] on MNIST is 784-200-200-10, d = 199,210). One block per Linear."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return with_structure(nn.Sequential(*layers), (0, *range(3, len(layers), 2)))


def _after_blocks(height: int, width: int, name: str, *blocks: tuple[int, int]) -> tuple[int, int]:
    """The image side after unpadded convs of the given kernels, each followed by pooling by the given factor."""
    for kernel, pool in blocks:
        height, width = (height - kernel + 1) // pool, (width - kernel + 1) // pool
        if height < 1 or width < 1:
            raise ConfigError(f"model.name={name} needs larger images")
    return height, width


@register_model("lenet5")
def lenet5(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """GradMA's authors' CIFAR LeNet-5 variant: 32/64 channels, BN, FC 512-128, dropout 0.5.
    d ~ 0.94M on 3x32x32. Blocks: conv1 | conv2 | fc1 | fc2 + fc3."""
    channels, height, width = _image_shape(input_shape)
    side_h, side_w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
    if side_h < 1 or side_w < 1:
        raise ConfigError(f"model.name=lenet5 needs images of at least 16x16, got {height}x{width}")
    return with_structure(nn.Sequential(
        nn.Conv2d(channels, 32, 5), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * side_h * side_w, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(512, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(128, num_classes),
    ), (0, 4, 8, 13))


class SpatialMean(nn.Module):
    """Global average pooling to 1x1, as AdaptiveAvgPool2d(1) computes it, but with a deterministic
    CUDA backward (AdaptiveAvgPool2d's uses atomic adds, which deterministic mode refuses)."""

    def forward(self, images: Tensor) -> Tensor:
        return images.mean(dim=(2, 3), keepdim=True)


@register_model("vgg11")
def vgg11(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """GradMA's authors' VGG-11: configuration "A" conv stack with BN, head 512-128 with dropout.
    d ~ 9.30M on 3x32x32 with 100 classes. Blocks: the five conv stages | the head."""
    channels, height, width = _image_shape(input_shape)
    if height < 32 or width < 32:
        raise ConfigError(f"model.name=vgg11 needs images of at least 32x32, got {height}x{width}")
    layers: list[nn.Module] = []
    block_starts = []
    for stage_width, convolutions in ((64, 1), (128, 1), (256, 2), (512, 2), (512, 2)):
        block_starts.append(len(layers))
        for _ in range(convolutions):
            layers += [nn.Conv2d(channels, stage_width, 3, padding=1), nn.BatchNorm2d(stage_width), nn.ReLU()]
            channels = stage_width
        layers.append(nn.MaxPool2d(2))
    block_starts.append(len(layers))
    return with_structure(nn.Sequential(*layers, SpatialMean(), nn.Flatten(), nn.Linear(512, 128), nn.ReLU(),
                                        nn.Dropout(0.5), nn.Linear(128, num_classes)), tuple(block_starts))


@register_model("cnn8")
def cnn8(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A small CNN for the 8x8 UCI digits: two 3x3 conv blocks with BN, each halving the side, then
    FC 64. d = 13,802 on 1x8x8 with 10 classes; larger images only widen the first Linear. No
    dropout. Blocks: conv1 | conv2 | fc1 | fc2."""
    channels, height, width = _image_shape(input_shape)
    if height < 8 or width < 8:
        raise ConfigError(f"model.name=cnn8 needs images of at least 8x8, got {height}x{width}")
    return with_structure(nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (height // 4) * (width // 4), 64), nn.ReLU(),
        nn.Linear(64, num_classes),
    ), (0, 4, 8, 11))


class Residual(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, inputs: Tensor) -> Tensor:
        return self.inner(inputs) + inputs


@register_model("convmixer")
def convmixer(input_shape: tuple[int, ...], num_classes: int, width: int = 256, depth: int = 8,
              kernel_size: int = 5, patch_size: int = 2) -> nn.Module:
    """ConvMixer-256/8 with kernel 5 and patch 2, the FedLALR paper's CIFAR model (arXiv:2309.09719, Sec. V-A; the
    width, which the paper does not state, is the reference CIFAR configuration's).
    d = 594,186 on 3x32x32 with 10 classes."""
    channels, height, width_px = _image_shape(input_shape)
    if height < patch_size or width_px < patch_size:
        raise ConfigError(f"model.name=convmixer needs images of at least {patch_size}x{patch_size}, "
                          f"got {height}x{width_px}")

    def mixer(layer: nn.Module) -> list[nn.Module]:
        return [layer, nn.GELU(), nn.BatchNorm2d(width)]
    layers = mixer(nn.Conv2d(channels, width, patch_size, stride=patch_size))
    for _ in range(depth):
        layers += [Residual(nn.Sequential(*mixer(nn.Conv2d(width, width, kernel_size, groups=width, padding="same")))),
                   *mixer(nn.Conv2d(width, width, 1))]
    return nn.Sequential(*layers, SpatialMean(), nn.Flatten(), nn.Linear(width, num_classes))


class CharLSTM(nn.Module):
    """FedDyn's Shakespeare model, which the FedLALR paper uses (arXiv:2309.09719, Sec. V-C): Embedding(vocabulary, 8),
    a 2-layer LSTM of 100 units, and a Linear layer from its output at the last position to the next
    character. d = 133,520 for LEAF's 80 characters."""

    def __init__(self, vocabulary: int, embedding: int = 8, hidden: int = 100, layers: int = 2):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, vocabulary)

    def forward(self, tokens: Tensor) -> Tensor:
        outputs, _ = self.lstm(self.embedding(tokens))
        return self.head(outputs[:, -1])


@register_model("char_lstm")
def char_lstm(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Inputs are sequences of character tokens and the classes are the next character, so the
    vocabulary is the classes."""
    if len(input_shape) != 1:
        raise ConfigError(f"model.name=char_lstm needs sequences of character tokens, "
                          f"got inputs of shape {tuple(input_shape)}")
    return CharLSTM(num_classes)


@register_model("mnist_cnn")
def mnist_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """FedMoS's MNIST CNN (Wang et al., INFOCOM 2023, Section VII; the authors' code): two 5x5 conv
    blocks of 10 and 20 channels, the second with Dropout2d, then FC 50 with dropout. d = 21,840 on 1x28x28."""
    channels, height, width = _image_shape(input_shape)
    side_h, side_w = _after_blocks(height, width, "mnist_cnn", (5, 2), (5, 2))
    return nn.Sequential(
        nn.Conv2d(channels, 10, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(10, 20, 5), nn.Dropout2d(0.5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(20 * side_h * side_w, 50), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(50, num_classes),
    )


@register_model("cifar_cnn3fc")
def cifar_cnn3fc(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """FedMoS's CIFAR model as its paper describes it (Wang et al., INFOCOM 2023, Section VII: "three
    fully connected layers"): the classic LeNet-5, conv 6 and 16 channels, FC 120-84. d = 62,006 on 3x32x32."""
    channels, height, width = _image_shape(input_shape)
    side_h, side_w = _after_blocks(height, width, "cifar_cnn3fc", (5, 2), (5, 2))
    return nn.Sequential(
        nn.Conv2d(channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side_h * side_w, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, num_classes),
    )


@register_model("cifar_cnn_ref")
def cifar_cnn_ref(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """FedMoS's CIFAR model as the authors' code has it (Wang et al., INFOCOM 2023): three 3x3 convs
    of 32-64-64 channels with dropout 0.2, FC 64. d = 122,570 on 3x32x32."""
    channels, height, width = _image_shape(input_shape)
    side_h, side_w = _after_blocks(height, width, "cifar_cnn_ref", (3, 2), (3, 2), (3, 1))
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.2),
        nn.Conv2d(64, 64, 3), nn.Dropout(0.2),
        nn.Flatten(),
        nn.Linear(64 * side_h * side_w, 64), nn.ReLU(),
        nn.Linear(64, num_classes),
    )


class NotAModule(ConfigError):
    """A model builder that returned something else: its own bug, not a misfit of the data."""


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                hidden_sizes: list[int] = (200, 100)) -> nn.Module:
    """The registered model `name` for inputs of `input_shape` and `num_classes` classes; builders
    that declare a `hidden_sizes` parameter get model.hidden_sizes."""
    entry = MODELS.get(name)
    if "hidden_sizes" in inspect.signature(entry.target).parameters:
        model = entry.target(input_shape, num_classes, hidden_sizes=list(hidden_sizes))
    else:
        model = entry.target(input_shape, num_classes)
    if not isinstance(model, nn.Module):
        raise NotAModule(f"model.name={name}: its builder {getattr(entry.target, '__qualname__', name)} (in "
                          f"{entry.source}) returned {kind_of(model)}, not a torch.nn.Module (a missing return?)")
    return model


def _image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ConfigError(f"this model needs image data (channels, height, width), "
                          f"got inputs of shape {tuple(input_shape)}")
    return input_shape
