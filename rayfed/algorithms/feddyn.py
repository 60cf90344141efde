"""FedDyn: federated learning with dynamic regularisation (Acar et al., ICLR 2021, arXiv:2111.04263,
Algorithm 1).

Client i, sampled in round t, starts from the server's x_t and minimises by local SGD

    L_i(w) - <h_i, w> + (alpha / 2) ||w - x_t||^2,     gradient  g_i(w) - h_i + alpha (w - x_t),

where h_i (zero at first) is its gradient state. It uploads its model change Delta_i = w_i - x_t
and keeps h_i <- h_i - alpha Delta_i. The server keeps h, zero at first:

    h <- h - (alpha / N) sum_{i in S_t} Delta_i,     x_{t+1} = x_t + (1/S) sum_{i in S_t} Delta_i - h / alpha

(the mean of the clients' models less h / alpha; N counts every client, S the round's). So h is
always -alpha/N times the sum of every model change ever uploaded, and as alpha -> 0 the clients
run FedAvg's local SGD while the server adds the running average of all past model changes.
There is no server learning rate. Communication is FedAvg's: d down, d up.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (FLOAT32_BYTES, Algorithm, AlgorithmContext, ClientStates, ClientTask, RoundInfo,
                                    Upload, client_rows, local_sgd, per_client, register_algorithm, weighted_average)
from rayfed.algorithms.objective import Linear, LocalObjective, Proximal
from rayfed.algorithms.params import AlgorithmParams
from rayfed.fields import Positive


class FedDynParams(AlgorithmParams):
    alpha: Positive = Field(0.01, description="FedDyn's regulariser alpha: the proximal coefficient of the local "
                                              "objective and the step of the gradient states h_i and h "
                                              "(GradMA's grid: 0.001, 0.01, 0.1)")


@dataclass
class FedDynServerState:
    params: Tensor      # x_t
    h: Tensor           # -alpha/N times the sum of all model changes so far


@dataclass
class FedDynClientState:
    h: Tensor           # h_i: the gradient state, zero before the client's first round


@register_algorithm("feddyn")
class FedDyn(Algorithm):
    """FedDyn (Acar et al., ICLR 2021, arXiv:2111.04263, Algorithm 1)."""

    Params = FedDynParams
    weighted = True
    state_classes = (FedDynServerState, FedDynClientState)
    server_lr = False
    # The server's correction assumes every model change starts from the current x_t.
    runs_async = False
    keeps_client_state = True
    vectorizable = True

    def __init__(self, params: FedDynParams, context: AlgorithmContext):
        self.lr_local = params.lr_local
        self.alpha = params.alpha
        self.agg_weighting = params.agg_weighting

    def memory_bytes(self, num_params: int, num_clients: int, num_blocks: int) -> dict[str, int]:
        return {"client states": num_clients * num_params * FLOAT32_BYTES}       # every client's h_i

    def server_init(self, params: Tensor, num_clients: int) -> FedDynServerState:
        return FedDynServerState(params.clone(), torch.zeros_like(params))

    def broadcast(self, state: FedDynServerState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: FedDynServerState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: FedDynClientState | None
                     | ClientStates) -> tuple[Upload, FedDynClientState | ClientStates]:
        start = down["params"]
        h = client_rows(client_state, lambda state: state.h, torch.zeros_like(start))
        objective = LocalObjective(terms=(Linear(h), Proximal(self.alpha, start)))
        local, mean_loss = local_sgd(task, start, self.lr_local, objective)
        change = local - start
        return (Upload({"model_change": change}, task.num_samples, {"train_loss": mean_loss}),
                per_client(client_state, FedDynClientState, h=h.sub(change, alpha=self.alpha)))

    def server_step(self, state: FedDynServerState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedDynServerState, dict]:
        change_sum = torch.zeros_like(state.params)
        for upload in uploads.values():
            change_sum.add_(upload.tensors["model_change"])
        h = state.h.sub(change_sum, alpha=self.alpha / round_info.num_clients)
        mean_change = weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)
        params = state.params.add(mean_change).sub_(h, alpha=1.0 / self.alpha)
        return FedDynServerState(params, h), {}
