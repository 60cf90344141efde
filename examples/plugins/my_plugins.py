"""Components of your own, in one file outside rayfed: an algorithm, a model and a dataset.

Use them by name after `import my_plugins` in Python, or from the CLI with the config key
`plugins`:

    rayfed run plugins=[./my_plugins.py] algorithm.name=my_fedavg_nesterov algorithm.momentum=0.9

The algorithm is FedAvg with Nesterov momentum on the server: the server treats the negated
average of the clients' model changes as its gradient g and takes the Nesterov step of Sutskever
et al. (ICML 2013, "On the importance of initialization and momentum in deep learning", Eq. 3-4,
in the form PyTorch's SGD(nesterov=True) uses):

    v <- beta v + g,        x <- x - lr_global (g + beta v)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field
from torch import Tensor, nn

import rayfed


class NesterovParams(rayfed.AlgorithmParams):
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="the server's Nesterov momentum beta")


@dataclass
class NesterovState:
    params: Tensor      # x, the global model
    velocity: Tensor    # v, zero before the first round


@rayfed.register_algorithm("my_fedavg_nesterov")
class FedAvgNesterov(rayfed.Algorithm):
    """FedAvg with server Nesterov momentum (Sutskever et al., ICML 2013), an example plugin."""

    Params = NesterovParams
    state_classes = (NesterovState,)
    keeps_client_state = False
    # Capabilities are off unless declared: it takes algorithm.lr_global and agg_weighting, and its
    # model change may be compressed.
    server_lr = True
    weighted = True
    compressed_upload = "model_change"
    takes_compression = True

    def __init__(self, params: NesterovParams, context: rayfed.AlgorithmContext):
        self.lr_local, self.lr_global = params.lr_local, params.lr_global
        self.momentum, self.agg_weighting = params.momentum, params.agg_weighting

    def server_init(self, params: Tensor, num_clients: int) -> NesterovState:
        return NesterovState(params.clone(), torch.zeros_like(params))

    def broadcast(self, state: NesterovState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: NesterovState) -> Tensor:
        return state.params

    def client_train(self, task: rayfed.ClientTask, down: dict[str, Tensor], client_state: None):
        start = down["params"]
        local, mean_loss = rayfed.local_sgd(task, start, self.lr_local)
        return rayfed.Upload({"model_change": local - start}, task.num_samples, {"train_loss": mean_loss}), None

    def server_step(self, state: NesterovState, uploads: dict[int, rayfed.Upload], round_info: rayfed.RoundInfo):
        gradient = -rayfed.weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)
        velocity = state.velocity.mul(self.momentum).add_(gradient)                       # v <- beta v + g
        params = state.params.sub(gradient.add(velocity, alpha=self.momentum), alpha=self.lr_global)
        return NesterovState(params, velocity), {}


@rayfed.register_model("my_cnn")
def my_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """One 3x3 convolution with 8 channels, 2x2 max pooling and a linear layer."""
    channels, height, width = input_shape
    return nn.Sequential(nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * (height // 2) * (width // 2), num_classes))


STRIPES_SHAPE = (1, 8, 8)
STRIPES_TRAIN, STRIPES_TEST = 1000, 200


@rayfed.register_dataset("my_stripes", input_shape=STRIPES_SHAPE, num_classes=4, default_model="my_cnn",
                         num_samples=STRIPES_TRAIN + STRIPES_TEST)
def my_stripes(data, seed: int) -> rayfed.Dataset:
    """8x8 images of one bright row, column, diagonal or anti-diagonal (the class) in noise, made
    from the run's seed: a dataset of tensors that needs no files."""
    rng = np.random.default_rng(seed)
    templates = np.zeros((4, 8, 8), dtype=np.float32)
    line = rng.integers(0, 8)
    templates[0, line, :] = templates[1, :, line] = 1.0
    templates[2] = np.eye(8, dtype=np.float32)
    templates[3] = np.fliplr(templates[2])
    arrays = []
    for size in (STRIPES_TRAIN, STRIPES_TEST):
        labels = rng.integers(0, 4, size)
        images = templates[labels] + rng.normal(0.0, 0.5, (size, 8, 8)).astype(np.float32)
        arrays += [images[:, np.newaxis].astype(np.float32), labels.astype(np.int64)]
    return rayfed.Dataset("my_stripes", *arrays, num_classes=4, input_shape=STRIPES_SHAPE)
