"""FedAdam, FedYogi, FedAdagrad (Reddi et al., specs/fedlalr.md §4.2) and FedAMS-V1/V2 (Wang et al.,
§4.3): FedAvg's clients, with an adaptive server optimizer (server_optimizer.py) in place of model
averaging.

    client i in S_t:  y <- x_t; K local SGD steps;  Delta_i = y - x_t
    server:           Delta_t = sum_i w_i Delta_i;  x_{t+1}, state <- ServerOptimizer.step(x_t, Delta_t, state)
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rayfed.algorithms.base import Algorithm, ClientTask, RoundInfo, Upload, local_sgd, weighted_average
from rayfed.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerState


@dataclass
class FedOptState:
    params: Tensor                      # x_t
    optimizer: ServerOptimizerState     # the server optimizer's m, v (and v_hat)


class FedOpt(Algorithm):
    keeps_client_state = False
    vectorizable = True
    compressed_upload = "delta"

    def __init__(self, lr_local: float, lr_global: float, *, server_optimizer: str, beta1: float = 0.0,
                 beta2: float = 0.0, tau: float | None = None, eps: float | None = None,
                 bias_correction: bool = False, agg_weighting: str = "uniform"):
        self.lr_local = lr_local
        # FedAdam's tau and FedAMS's eps play the same part: the floor of the denominator.
        self.optimizer = ServerOptimizer(server_optimizer, lr_global, beta1, beta2, tau if eps is None else eps,
                                         bias_correction)
        self.agg_weighting = agg_weighting

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
        return Upload({"delta": local - global_params}, task.num_samples, {"train_loss": mean_loss}), None

    def server_step(self, state: FedOptState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedOptState, dict]:
        pseudo_gradient = weighted_average(uploads, "delta", self.agg_weighting, round_info.weights)       # Delta_t
        params, optimizer = self.optimizer.step(state.params, pseudo_gradient, state.optimizer)
        return FedOptState(params=params, optimizer=optimizer), {}
