"""FedAvg, FedAvgM, FedProx, FedProxM (specs/gradma.md §3.1-3.4, Alg. 5).

One class covers all four: FedAvgM with server momentum beta1 and the FedProx proximal
term mu. FedAvg is beta1 = 0, mu = 0; FedProx is beta1 = 0; FedAvgM is mu = 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rayfed.algorithms.base import Algorithm, ClientTask, RoundInfo, Upload, local_sgd, weighted_average


@dataclass
class FedAvgMState:
    params: Tensor      # x_t
    momentum: Tensor    # m_t, zero at t = 0


class FedAvgM(Algorithm):
    keeps_client_state = False
    vectorizable = True
    compressed_upload = "update"

    def __init__(self, lr_local: float, lr_global: float,
                 beta1: float = 0.0, mu: float = 0.0, agg_weighting: str = "uniform"):
        self.lr_local = lr_local
        self.lr_global = lr_global
        self.beta1 = beta1
        self.mu = mu
        self.agg_weighting = agg_weighting

    def server_init(self, params: Tensor, num_clients: int) -> FedAvgMState:
        return FedAvgMState(params=params.clone(), momentum=params.new_zeros(params.shape))

    def broadcast(self, state: FedAvgMState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: FedAvgMState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        global_params = down["params"]
        local, mean_loss = local_sgd(task, global_params, self.lr_local,
                                     prox_mu=self.mu, prox_center=global_params)
        update = global_params - local      # d^(i) = x_t - x_{t,I}^(i), descent-sign
        return Upload({"update": update}, task.num_samples, {"train_loss": mean_loss}), None

    def server_step(self, state: FedAvgMState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedAvgMState, dict]:
        update = weighted_average(uploads, "update", self.agg_weighting, round_info.weights)     # d_{t+1}
        momentum = state.momentum.mul(self.beta1).add_(update)               # m_{t+1} = beta1 m_t + d_{t+1}
        params = state.params.sub(momentum, alpha=self.lr_global)           # x_{t+1} = x_t - eta_g m_{t+1}
        return FedAvgMState(params=params, momentum=momentum), {}
