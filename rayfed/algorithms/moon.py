"""MOON and MOONM: model-contrastive federated learning (Li, He, Song, CVPR 2021, arXiv:2103.16257,
Algorithm 1 and Eq. 3-4).

Client i trains from the server's x_t on

    CE(f_w(x), y) + mu * l_con,   l_con = -log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}) ),

where z, z_glob and z_prev are the representations (the input of the classifier) of the model being
trained, of the frozen global model x_t and of the frozen model the client ended its previous
participation with (x_0 before its first), and sim is cosine similarity. The frozen models run in
eval mode, as in the authors' code: their running statistics, no dropout. The client keeps that
previous model (parameters and running statistics) as its state, and uploads its model change.
Under engine.vectorize a stack of clients trains at once, each against its own previous model.
The server averages model changes as FedAvg does; MOONM adds FedAvgM's heavy-ball momentum
(GradMA, arXiv:2302.14307: "M" variants). With mu = 0, MOON is FedAvg and MOONM is FedAvgM.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (FLOAT32_BYTES, AlgorithmContext, ClientStates, ClientTask, Upload, client_rows,
                                    local_sgd, per_client, register_algorithm)
from rayfed.algorithms.fedavg import FedAvgMServer, FedAvgMState
from rayfed.algorithms.objective import LocalObjective, cross_entropy
from rayfed.algorithms.params import AlgorithmParams
from rayfed.algorithms.server_optimizer import ServerOptimizerState
from rayfed.fields import Coefficient, Decay, Positive
from rayfed.models.forward import ModelForward


class MoonParams(AlgorithmParams):
    mu: Coefficient = Field(1.0, description="MOON's weight of the model-contrastive term (its paper: 5 on "
                                             "CIFAR-10, 1 on CIFAR-100 and Tiny-ImageNet)")
    tau: Positive = Field(0.5, description="MOON's temperature of the cosine similarities")


class MoonMParams(MoonParams):
    beta1: Decay = Field(0.9, description="server heavy-ball momentum: m <- beta1 m + d, x <- x + lr_global m")


@dataclass
class MoonClientState:
    params: Tensor      # the model the client ended its last round with
    buffers: Tensor     # and its running statistics


def contrastive_loss(z: Tensor, z_global: Tensor, z_previous: Tensor, tau: float,
                     weights: Tensor | None = None) -> Tensor:
    """MOON's l_con (Eq. 3), averaged over the batch (over the rows that count, with `weights`):
    cross-entropy of the similarity logits with the global model's as the positive, as the authors'
    code computes it."""
    logits = torch.stack([F.cosine_similarity(z, z_global, dim=-1), F.cosine_similarity(z, z_previous, dim=-1)], 1)
    return cross_entropy(logits / tau, torch.zeros(len(z), dtype=torch.int64, device=z.device), weights)


@register_algorithm("moonm")
class MoonM(FedAvgMServer):
    """MOONM: MOON's local objective with FedAvgM's server momentum (GradMA, arXiv:2302.14307)."""

    Params = MoonMParams
    state_classes = (FedAvgMState, ServerOptimizerState, MoonClientState)
    keeps_client_state = True
    vectorizable = True
    keeps_initial_model = True
    model_needs = "features"

    def __init__(self, params: MoonParams, context: AlgorithmContext):
        super().__init__(params, context)
        self.mu = params.mu
        self.tau = params.tau
        self.initial = (context.initial_params, context.initial_buffers)

    def memory_bytes(self, num_params: int, num_clients: int, num_blocks: int) -> dict[str, int]:
        # Every client's previous model; its running statistics add a fraction of a percent.
        return {"client states": num_clients * num_params * FLOAT32_BYTES}

    def client_state_floats(self, num_params: int, num_buffers: int) -> int:
        return num_params + num_buffers         # the previous model with its running statistics

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: MoonClientState | None
                     | ClientStates) -> tuple[Upload, MoonClientState | ClientStates]:
        start = down["params"]
        initial_params, initial_buffers = self.initial
        frozen_global = task.forward_at(start, task.buffers())
        frozen_previous = task.forward_at(client_rows(client_state, lambda state: state.params, initial_params),
                                          client_rows(client_state, lambda state: state.buffers, initial_buffers))

        def loss(model: ModelForward, inputs: Tensor, targets: Tensor, weights: Tensor | None = None) -> Tensor:
            z, logits = model.features(inputs)
            with torch.no_grad():
                z_global, z_previous = frozen_global.features(inputs)[0], frozen_previous.features(inputs)[0]
            return (cross_entropy(logits, targets, weights)
                    + self.mu * contrastive_loss(z, z_global, z_previous, self.tau, weights))

        local, mean_loss = local_sgd(task, start, self.lr_local, LocalObjective(loss))
        return (Upload({"model_change": local - start}, task.num_samples, {"train_loss": mean_loss}),
                per_client(client_state, MoonClientState, params=local.clone(), buffers=task.buffers()))


@register_algorithm("moon")
class Moon(MoonM):
    """MOON (Li, He, Song, CVPR 2021, arXiv:2103.16257): FedAvg's server with the model-contrastive term."""

    Params = MoonParams
