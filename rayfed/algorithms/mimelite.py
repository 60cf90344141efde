"""MimeLite with SGD momentum as the base optimizer (Karimireddy et al., "Breaking the centralized
barrier for cross-device federated learning", NeurIPS 2021, arXiv:2008.03606, Algorithm 1 with
MimeLite's local update).

The server holds the model x and the momentum s (zero at first) and sends both. Client i computes
its full-batch gradient c_i = grad f_i(x) over all its samples at x, then takes local steps with the
momentum frozen at the server's,

    y <- y - lr_local ((1 - beta) g_i(y) + beta s),

and uploads its model change Delta_i = y - x and c_i. The server updates the momentum from the
gradients at x only, s <- (1 - beta) (1/S) sum c_i + beta s, and the model from the local work,
x <- x + lr_global (1/S) sum Delta_i. With beta = 0 this is FedAvg (c_i is computed and unused).
Communication is twice FedAvg's in both directions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, local_descent,
                                    register_algorithm, weighted_average)
from rayfed.algorithms.params import AlgorithmParams
from rayfed.fields import Decay


class MimeLiteParams(AlgorithmParams):
    beta1: Decay = Field(0.9, description="Mime's momentum beta: the base optimizer's, frozen on the clients "
                                          "(s <- (1 - beta) mean c_i + beta s)")


@dataclass
class MimeLiteState:
    params: Tensor      # x
    momentum: Tensor    # s, zero before the first round


@register_algorithm("mimelite")
class MimeLite(Algorithm):
    """MimeLite with SGD momentum (Karimireddy et al., NeurIPS 2021, arXiv:2008.03606)."""

    Params = MimeLiteParams
    server_lr = True
    weighted = True
    state_classes = (MimeLiteState,)
    linear_uploads = True
    keeps_client_state = False
    vectorizable = True
    # The momentum is built from gradients at the current x.
    runs_async = False

    def __init__(self, params: MimeLiteParams, context: AlgorithmContext):
        self.lr_local = params.lr_local
        self.lr_global = params.lr_global
        self.beta = params.beta1
        self.agg_weighting = params.agg_weighting

    def upload_size(self, num_params: int) -> int:
        return 2 * num_params

    def download_size(self, num_params: int) -> int:
        return 2 * num_params

    def server_init(self, params: Tensor, num_clients: int) -> MimeLiteState:
        return MimeLiteState(params.clone(), torch.zeros_like(params))

    def broadcast(self, state: MimeLiteState) -> dict[str, Tensor]:
        return {"params": state.params, "momentum": state.momentum}

    def global_params(self, state: MimeLiteState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        start, momentum = down["params"], down["momentum"]
        # A stack of clients (engine.vectorize) takes its full gradients at one row of x per client.
        at = start.expand(len(task.num_samples), -1) if isinstance(task.num_samples, list) else start
        full_gradient = task.full_loss_and_grad(at)[1].clone()         # c_i at x, before any local step
        frozen = momentum.mul(self.beta)

        def direction(grad: Tensor, params: Tensor, step: int) -> Tensor:
            return grad.mul(1.0 - self.beta).add_(frozen)

        local, mean_loss = local_descent(task, start, self.lr_local, direction)
        return Upload({"model_change": local - start, "full_gradient": full_gradient}, task.num_samples,
                      {"train_loss": mean_loss}), None

    def server_step(self, state: MimeLiteState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[MimeLiteState, dict]:
        change = weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)
        gradient = weighted_average(uploads, "full_gradient", self.agg_weighting, round_info.weights)
        momentum = gradient.mul_(1.0 - self.beta).add_(state.momentum, alpha=self.beta)
        return MimeLiteState(state.params.add(change, alpha=self.lr_global), momentum), {}
