"""FedAdam, FedYogi, FedAdagrad (Reddi et al., ICLR 2021, arXiv:2003.00295) and FedAMS-V1/V2 (Wang et al.,
ICML 2022, arXiv:2205.02719): FedAvg's clients, with an adaptive server optimizer (server_optimizer.py) in place of model
averaging.

    client i in S_t:  y <- x_t; K local SGD steps;  Delta_i = y - x_t
    server:           Delta_t = sum_i w_i Delta_i;  x_{t+1}, state <- ServerOptimizer.step(x_t, Delta_t, state)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, from_keywords,
                                    local_sgd, register_algorithm, weighted_average)
from rayfed.algorithms.params import AlgorithmParams
from rayfed.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerState
from rayfed.fields import Decay, Flag, Positive


class AdagradParams(AlgorithmParams):
    """Reddi et al. (ICLR 2021, arXiv:2003.00295), as FedLALR's paper runs them."""

    beta1: Decay = Field(0.0, description="the server optimizer's first-moment decay")
    tau: Positive = Field(0.01, description="the adaptivity floor: x += lr_global m / (sqrt(v) + tau); v starts at tau^2")


class AdamParams(AdagradParams):
    beta1: Decay = Field(0.9, description="the server optimizer's first-moment decay")
    beta2: Decay = Field(0.99, description="the server optimizer's second-moment decay")
    bias_correction: Flag = Field(False, description="Adam's bias correction of m and v")


class AMSParams(AlgorithmParams):
    """FedAMS (Wang, Lin and Chen, ICML 2022, arXiv:2205.02719), as FedLALR's paper runs it."""

    beta1: Decay = Field(0.9, description="the server optimizer's first-moment decay")
    beta2: Decay = Field(0.99, description="the server optimizer's second-moment decay")
    eps: Positive = Field(1e-4, description="v_hat's floor (ams_v1) or the denominator's (ams_v2)")
    bias_correction: Flag = Field(False, description="Adam's bias correction of m and v_hat")


class AMSv2Params(AMSParams):
    eps: Positive = Field(1e-2, description="added to the denominator: x += lr_global m / (sqrt(v_hat) + eps)")


@dataclass
class FedOptState:
    params: Tensor                      # x_t
    optimizer: ServerOptimizerState     # the server optimizer's m, v (and v_hat)


class FedOpt(Algorithm):
    server_lr = True
    weighted = True
    runs_async = True
    takes_compression = True
    state_classes = (FedOptState, ServerOptimizerState)
    linear_uploads = True
    fixed: ClassVar[dict[str, Any]] = {}
    keeps_client_state = False
    vectorizable = True
    compressed_upload = "model_change"

    def __init__(self, lr_local: float, lr_global: float, *, server_optimizer: str, beta1: float = 0.0,
                 beta2: float = 0.0, tau: float | None = None, eps: float | None = None,
                 bias_correction: bool = False, agg_weighting: str = "uniform"):
        self.lr_local = lr_local
        # FedAdam's tau and FedAMS's eps play the same part: the floor of the denominator.
        self.optimizer = ServerOptimizer(server_optimizer, lr_global, beta1, beta2, tau if eps is None else eps,
                                         bias_correction)
        self.agg_weighting = agg_weighting

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "FedOpt":
        return from_keywords(cls, params, **cls.fixed)

    def server_init(self, params: Tensor, num_clients: int) -> FedOptState:
        return FedOptState(params=params.clone(), optimizer=self.optimizer.init(params))

    def broadcast(self, state: FedOptState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: FedOptState) -> Tensor:
        return state.params

    def state_bytes(self, state) -> int:
        return super().state_bytes(state) + (super().state_bytes(state.optimizer) if isinstance(state, FedOptState)
                                             else 0)

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        global_params = down["params"]
        local, mean_loss = local_sgd(task, global_params, self.lr_local)
        return Upload({"model_change": local - global_params}, task.num_samples, {"train_loss": mean_loss}), None

    def server_step(self, state: FedOptState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedOptState, dict]:
        pseudo_gradient = weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)       # Delta_t
        params, optimizer = self.optimizer.step(state.params, pseudo_gradient, state.optimizer)
        return FedOptState(params=params, optimizer=optimizer), {}


@register_algorithm("fedadam")
class FedAdam(FedOpt):
    """FedAdam (Reddi et al., ICLR 2021, arXiv:2003.00295): FedAvg's clients, Adam on the server."""

    Params = AdamParams
    fixed = {"server_optimizer": "adam"}


@register_algorithm("fedyogi")
class FedYogi(FedOpt):
    """FedYogi (Reddi et al., ICLR 2021, arXiv:2003.00295): FedAvg's clients, Yogi on the server."""

    Params = AdamParams
    fixed = {"server_optimizer": "yogi"}


@register_algorithm("fedadagrad")
class FedAdagrad(FedOpt):
    """FedAdagrad (Reddi et al., ICLR 2021, arXiv:2003.00295): FedAvg's clients, Adagrad on the server."""

    Params = AdagradParams
    fixed = {"server_optimizer": "adagrad"}


@register_algorithm("fedams_v1")
class FedAMSv1(FedOpt):
    """FedAMS, variant 1 (Wang, Lin and Chen, ICML 2022, arXiv:2205.02719): AMSGrad with v_hat floored at eps."""

    Params = AMSParams
    fixed = {"server_optimizer": "ams_v1"}


@register_algorithm("fedams_v2")
class FedAMSv2(FedOpt):
    """FedAMS, variant 2 (Wang, Lin and Chen, ICML 2022, arXiv:2205.02719): AMSGrad with eps in the denominator."""

    Params = AMSv2Params
    fixed = {"server_optimizer": "ams_v2"}
