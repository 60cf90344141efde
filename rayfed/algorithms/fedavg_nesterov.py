"""FedAvg with Nesterov momentum on the server.

The clients run FedAvg's local SGD and upload their model change Delta_i = y_i - x. The server
averages them, Delta = sum_i w_i Delta_i, and takes the Nesterov step of Sutskever et al. (ICML
2013, "On the importance of initialization and momentum in deep learning", Eq. 3-4) in the form
PyTorch's SGD(nesterov=True) uses, with g = -Delta as the gradient:

    v <- beta v + g,        x <- x - lr_global (g + beta v)

It is kept in model-change orientation, m = -v: m <- beta m + Delta (the heavy ball of the server
optimizers) and x <- x + lr_global (Delta + beta m). With beta = 0 it is FedAvg. FedAvgM (Hsu et
al., 2019, arXiv:1909.06335) is the heavy-ball form, x <- x + lr_global m.
"""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, local_sgd,
                                    register_algorithm, weighted_average)
from rayfed.algorithms.params import AlgorithmParams
from rayfed.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerState
from rayfed.fields import Decay


class NesterovParams(AlgorithmParams):
    momentum: Decay = Field(0.9, description="the server's Nesterov momentum beta")


@dataclass
class FedAvgNesterovState:
    params: Tensor                      # x
    optimizer: ServerOptimizerState     # m, zero before the first round


@register_algorithm("fedavg_nesterov")
class FedAvgNesterov(Algorithm):
    """FedAvg with server Nesterov momentum (Sutskever et al., ICML 2013, Eq. 3-4)."""

    Params = NesterovParams
    server_lr = True
    weighted = True
    runs_async = True
    takes_compression = True
    state_classes = (FedAvgNesterovState, ServerOptimizerState)
    linear_uploads = True
    keeps_client_state = False
    vectorizable = True
    compressed_upload = "model_change"
    staleness_weighted = True

    def __init__(self, params: NesterovParams, context: AlgorithmContext):
        self.lr_local = params.lr_local
        self.lr_global = params.lr_global
        self.momentum = params.momentum
        self.agg_weighting = params.agg_weighting
        self.optimizer = ServerOptimizer("momentum", params.lr_global, beta1=params.momentum)

    def server_init(self, params: Tensor, num_clients: int) -> FedAvgNesterovState:
        return FedAvgNesterovState(params.clone(), self.optimizer.init(params))

    def broadcast(self, state: FedAvgNesterovState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: FedAvgNesterovState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        start = down["params"]
        local, mean_loss = local_sgd(task, start, self.lr_local)
        return Upload({"model_change": local - start}, task.num_samples, {"train_loss": mean_loss}), None

    def server_step(self, state: FedAvgNesterovState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedAvgNesterovState, dict]:
        change = weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)    # Delta
        optimizer = self.optimizer.accumulate(change, state.optimizer)                               # m <- beta m + Delta
        params = state.params.add(change.add(optimizer.momentum, alpha=self.momentum), alpha=self.lr_global)
        return FedAvgNesterovState(params, optimizer), {}
