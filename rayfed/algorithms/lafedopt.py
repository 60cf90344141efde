"""LaFedOPT (Wang et al., "Local Adaptivity in Federated Learning", arXiv:2106.02305): clients
run Adam from a fresh state every round and report their update divided by the sum of their
preconditioners; the server's joint correction divides the average of those by the average of
the preconditioner sums' inverses, then takes a server SGD step.

    client i:  y <- x_t; per Adam step k: p = 1/(sqrt(v_k) + eps) (raw v), a = beta1 a + (1 - beta1) p, c += a
               u_i = (y - x_t) / c,  r_i = 1 / c            (elementwise; 0 where c = 0)
    server:    U = sum_i w_i u_i,  R = sum_i w_i r_i
               Delta = U / R (joint, 0 where R = 0)  or  U (local);   x_{t+1} = x_t + eta_g Delta
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, from_keywords,
                                    local_descent, register_algorithm, weighted_average)
from rayfed.algorithms.params import AlgorithmParams
from rayfed.fields import Decay, Positive
from rayfed.algorithms.local_adaptive import AdamDirection
from rayfed.algorithms.server_optimizer import ServerOptimizer


@dataclass
class LaFedOPTState:
    params: Tensor      # x_t


class PreconditionedAdam(AdamDirection):
    """Adam that also sums its preconditioner's momentum: c = sum_k a_k, a_k = beta1 a_{k-1} + (1 - beta1) p_k."""

    def __init__(self, like: Tensor, beta1: float, beta2: float, eps: float):
        super().__init__(like, beta1, beta2, eps)
        self.a = torch.zeros_like(like)
        self.c = torch.zeros_like(like)

    def __call__(self, grad: Tensor, params: Tensor, step: int) -> Tensor:
        direction = super().__call__(grad, params, step)
        preconditioner = 1 / (self.v.sqrt() + self.eps)
        self.a = self.beta1 * self.a + (1 - self.beta1) * preconditioner
        self.c = self.c + self.a
        return direction


def _divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator elementwise, 0 where the denominator is 0."""
    return torch.where(denominator == 0, torch.zeros_like(numerator), numerator / denominator)


class LaFedOPTParams(AlgorithmParams):
    beta1: Decay = Field(0.8, description="local Adam's first-moment decay")
    beta2: Decay = Field(0.999, description="local Adam's second-moment decay")
    eps: Positive = Field(1e-4, description="local Adam's denominator floor")
    correction: Literal["joint", "local"] = Field(
        "joint", description="joint: the server divides by the averaged inverse preconditioner sums; local: it does not")


@register_algorithm("lafedopt")
class LaFedOPT(Algorithm):
    """LaFedOPT (Wang et al., arXiv:2106.02305; FedLALR's baseline): local Adam with preconditioner-corrected averaging."""

    Params = LaFedOPTParams
    server_lr = True
    weighted = True
    runs_async = True
    state_classes = (LaFedOPTState,)
    linear_uploads = True
    keeps_client_state = False
    vectorizable = True

    def __init__(self, lr_local: float, lr_global: float, *, beta1: float, beta2: float, eps: float,
                 correction: str = "joint", agg_weighting: str = "uniform"):
        self.lr_local = lr_local
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.correction = correction
        self.server_optimizer = ServerOptimizer("sgd", lr_global)
        self.agg_weighting = agg_weighting

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "LaFedOPT":
        return from_keywords(cls, params)

    def server_init(self, params: Tensor, num_clients: int) -> LaFedOPTState:
        return LaFedOPTState(params=params.clone())

    def broadcast(self, state: LaFedOPTState) -> dict[str, Tensor]:
        return {"params": state.params}

    def upload_size(self, num_params: int) -> int:
        return 2 * num_params

    def global_params(self, state: LaFedOPTState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        global_params = down["params"]
        direction = PreconditionedAdam(global_params, self.beta1, self.beta2, self.eps)
        local, mean_loss = local_descent(task, global_params, self.lr_local, direction)
        scaled_update = _divide(local - global_params, direction.c)                   # u_i
        inverse_sum = _divide(torch.ones_like(direction.c), direction.c)               # r_i
        return Upload({"scaled_update": scaled_update, "inverse_preconditioner_sum": inverse_sum},
                      task.num_samples, {"train_loss": mean_loss}), None

    def server_step(self, state: LaFedOPTState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[LaFedOPTState, dict]:
        weights = round_info.weights
        scaled = weighted_average(uploads, "scaled_update", self.agg_weighting, weights)               # U
        if self.correction == "joint":
            pseudo_gradient = _divide(scaled, weighted_average(uploads, "inverse_preconditioner_sum",
                                                               self.agg_weighting, weights))         # U / R
        else:
            pseudo_gradient = scaled
        params, _ = self.server_optimizer.step(state.params, pseudo_gradient, None)
        return LaFedOPTState(params=params), {}
