"""SCAFFOLD with control-variate option II (Karimireddy et al., ICML 2020, arXiv:1910.06378):
FedCOM's paper compares FedGATE against it.

Client j: y <- y - eta (g - c_j + c) for tau steps from x; c_j+ = c_j - c + (x - y) / (tau eta); it
uploads dy_j = y - x and dc_j = c_j+ - c_j (2d) and keeps c_j+, which lives with its worker. Server:
x <- x + gamma (1/K) sum dy_j, c <- c + (1/N) sum dc_j; it broadcasts x and c (2d).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rayfed.algorithms.base import (FLOAT32_BYTES, Algorithm, AlgorithmContext, ClientStates, ClientTask, RoundInfo,
                                    Upload, client_rows, from_keywords, local_descent, per_client, register_algorithm,
                                    weighted_average)
from rayfed.algorithms.params import AlgorithmParams


@dataclass
class ScaffoldServerState:
    params: Tensor      # x
    control: Tensor     # c, zero at first


@dataclass
class ScaffoldClientState:
    control: Tensor     # c_j, zero before the client's first round


@register_algorithm("scaffold")
class Scaffold(Algorithm):
    """SCAFFOLD (Karimireddy et al., ICML 2020, arXiv:1910.06378), control variates of option II."""

    Params = AlgorithmParams
    server_lr = True
    weighted = True
    runs_async = True
    state_classes = (ScaffoldServerState, ScaffoldClientState)
    keeps_client_state = True
    vectorizable = True

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "Scaffold":
        return from_keywords(cls, params)

    def memory_bytes(self, num_params: int, num_clients: int, num_blocks: int) -> dict[str, int]:
        return {"client states": num_clients * num_params * FLOAT32_BYTES}     # every client's c_j

    def download_size(self, num_params: int) -> int:
        return 2 * num_params

    def __init__(self, lr_local: float, lr_global: float, agg_weighting: str = "uniform"):
        self.lr_local = lr_local
        self.lr_global = lr_global
        self.agg_weighting = agg_weighting

    def server_init(self, params: Tensor, num_clients: int) -> ScaffoldServerState:
        return ScaffoldServerState(params=params.clone(), control=torch.zeros_like(params))

    def broadcast(self, state: ScaffoldServerState) -> dict[str, Tensor]:
        return {"params": state.params, "control": state.control}

    def global_params(self, state: ScaffoldServerState) -> Tensor:
        return state.params

    def upload_size(self, num_params: int) -> int:
        return 2 * num_params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: ScaffoldClientState | None
                     | ClientStates) -> tuple[Upload, ScaffoldClientState | ClientStates]:
        params, control = down["params"], down["control"]
        own = client_rows(client_state, lambda state: state.control, torch.zeros_like(params))
        correction = control - own
        local, mean_loss = local_descent(task, params, self.lr_local, lambda grad, x, step: grad + correction)
        lr = self.lr_local * task.lr_factor
        new_control = own - control + (params - local) / (task.steps * lr)
        return (Upload({"model_change": local - params, "control_change": new_control - own}, task.num_samples,
                       {"train_loss": mean_loss}),
                per_client(client_state, ScaffoldClientState, control=new_control))

    def server_step(self, state: ScaffoldServerState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[ScaffoldServerState, dict]:
        change = weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)
        control_sum = torch.zeros_like(state.control)
        for upload in uploads.values():
            control_sum.add_(upload.tensors["control_change"])
        return ScaffoldServerState(params=state.params.add(change, alpha=self.lr_global),
                                   control=state.control.add(control_sum, alpha=1.0 / round_info.num_clients)), {}
