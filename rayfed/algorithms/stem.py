"""STEM, stochastic two-sided momentum (Khanduri et al., NeurIPS 2021, arXiv:2106.10435), as
FedMoS's paper (Wang et al., INFOCOM 2023, Sec. V) runs it under partial participation: FedMoS's baseline.

Clients start from the server's model and its momentum d_bar (before the first round: their full
local gradient), take I STORM steps without a proximal term, each followed by the momentum
correction, and upload Delta_i = x_I - x^t and their last d. The server averages both with the
round's weights, and broadcasts both: 2d each way. Clients keep nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, from_keywords,
                                    register_algorithm, weighted_average)
from rayfed.algorithms.params import AlgorithmParams
from rayfed.algorithms.storm import MINIBATCHES, storm_descent
from rayfed.fields import number

MOMENTUM_WEIGHTS = ("ucs", "normalized")


class STEMParams(AlgorithmParams):
    a: number(ge=0.0, le=1.0) = Field(0.1, description="STORM's momentum weight")
    minibatches: Literal[MINIBATCHES] = Field(
        "independent", description="fresh draws without replacement each step (unbiased), or shuffled epochs")
    momentum_weights: Literal[MOMENTUM_WEIGHTS] = Field(
        "ucs", description="the momentum average's weights: the round's selector weights, or those normalised to 1")


@dataclass
class STEMState:
    params: Tensor              # x^t
    momentum: Tensor | None     # d_bar, None before round 0


@register_algorithm("stem")
class STEM(Algorithm):
    """STEM (Khanduri et al., NeurIPS 2021, arXiv:2106.10435), as FedMoS's paper runs it."""

    Params = STEMParams
    weighted = True
    runs_async = True
    state_classes = (STEMState,)
    linear_uploads = True
    server_lr = False
    keeps_client_state = False
    vectorizable = True

    def __init__(self, lr_local: float, lr_global: float, *, a: float, minibatches: str = "independent",
                 momentum_weights: str = "ucs", agg_weighting: str = "uniform"):
        self.lr_local = lr_local
        self.a = a
        self.minibatches = minibatches
        self.momentum_weights = momentum_weights
        self.agg_weighting = agg_weighting

    def server_init(self, params: Tensor, num_clients: int) -> STEMState:
        return STEMState(params=params.clone(), momentum=None)

    def broadcast(self, state: STEMState) -> dict[str, Tensor]:
        down = {"params": state.params}
        if state.momentum is not None:
            down["momentum"] = state.momentum
        return down

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "STEM":
        return from_keywords(cls, params)

    def upload_size(self, num_params: int) -> int:
        return 2 * num_params

    def download_size(self, num_params: int) -> int:
        return 2 * num_params

    def global_params(self, state: STEMState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        global_params = down["params"]
        params = task.start_from(global_params)
        if "momentum" in down:
            direction = down["momentum"].expand_as(params).clone()
        else:
            direction = task.full_loss_and_grad(params)[1].clone()
        params, direction, loss_sum = storm_descent(task, params, direction, self.lr_local, self.a,
                                                    minibatches=self.minibatches, correct_after_last=True)
        mean_loss = loss_sum / task.steps
        return Upload({"model_change": params - global_params, "momentum": direction}, task.num_samples,
                      {"train_loss": float(mean_loss) if mean_loss.ndim == 0 else mean_loss}), None

    def server_step(self, state: STEMState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[STEMState, dict]:
        weights = round_info.weights
        params = state.params.add(weighted_average(uploads, "model_change", self.agg_weighting, weights))
        if weights is not None and self.momentum_weights == "normalized":
            total = sum(weights[client] for client in uploads)
            weights = {client: weights[client] / total for client in uploads}
        momentum = weighted_average(uploads, "momentum", self.agg_weighting, weights)
        return STEMState(params=params, momentum=momentum), {}
