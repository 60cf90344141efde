"""MIFA (Gu et al., NeurIPS 2021, arXiv:2106.04159) and MIFAM (GradMA, arXiv:2302.14307, Alg. 6): the server steps along the average of the
latest update of every one of the N clients, stragglers included. MIFA is MIFAM with beta1 = 0.
Under a selector other than uniform (FedMoS's, Sec. IV), whose target is sum_i p_i f_i, the
average weights each client's latest update by its importance p_i instead of 1/N; the selector
then only decides whose update is refreshed.

Each client keeps its latest model change g_old = y - x and uploads the difference g_new - g_old,
so the server's running average needs O(d) memory; the N latest model changes live with the clients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (FLOAT32_BYTES, Algorithm, AlgorithmContext, ClientStates, ClientTask, RoundInfo,
                                    Upload, client_rows, from_keywords, local_sgd, per_client, register_algorithm,
                                    weighted_average)
from rayfed.algorithms.params import AlgorithmParams
from rayfed.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerState
from rayfed.fields import Decay


@dataclass
class MIFAServerState:
    params: Tensor                      # x_t
    average: Tensor                     # (1/N) sum_i g_old^(i), zeros for never-sampled clients
    optimizer: ServerOptimizerState     # the heavy ball's m_t (model-change orientation)


@dataclass
class MIFAClientState:
    latest_model_change: Tensor   # g_old^(i); absent (None state) means the initial 0


class MIFAMParams(AlgorithmParams):
    beta1: Decay = Field(0.5, description="server heavy-ball momentum on the average of the latest updates")


@register_algorithm("mifa")
class MIFA(Algorithm):
    """MIFA (Gu et al., NeurIPS 2021, arXiv:2106.04159, Alg. 1): steps along the average of every
    client's latest update."""

    Params = AlgorithmParams
    server_lr = True
    runs_async = True
    state_classes = (MIFAServerState, MIFAClientState, ServerOptimizerState)
    # It averages the latest updates of all N clients: there is no weighting to choose.
    weighted = False
    vectorizable = True
    # Its step reads the round's uploads only through their sum, divided by N: the weighted average with N
    # for S, so partial sums, a robust rule's output and central privacy's noised sum apply as to FedAvg's.
    linear_uploads = True
    fixed: ClassVar[dict[str, Any]] = {"beta1": 0.0}

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "MIFA":
        return from_keywords(cls, params, **cls.fixed)

    def memory_bytes(self, num_params: int, num_clients: int, num_blocks: int) -> dict[str, int]:
        return {"client states": num_clients * num_params * FLOAT32_BYTES}     # every client's latest update

    def __init__(self, lr_local: float, lr_global: float, beta1: float = 0.0):
        self.lr_local = lr_local
        self.lr_global = lr_global
        self.beta1 = beta1
        self.optimizer = ServerOptimizer("momentum", lr_global, beta1=beta1)

    def server_init(self, params: Tensor, num_clients: int) -> MIFAServerState:
        return MIFAServerState(params=params.clone(), average=params.new_zeros(params.shape),
                               optimizer=self.optimizer.init(params))

    def broadcast(self, state: MIFAServerState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: MIFAServerState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: MIFAClientState | None
                     | ClientStates) -> tuple[Upload, MIFAClientState | ClientStates]:
        global_params = down["params"]
        local, mean_loss = local_sgd(task, global_params, self.lr_local)
        latest = local - global_params                                      # g_new = y - x_t
        # In a stack, a client before its first round has g_old = 0.
        difference = latest if client_state is None else latest - client_rows(
            client_state, lambda state: state.latest_model_change, torch.zeros_like(global_params))
        return (Upload({"model_change_difference": difference}, task.num_samples, {"train_loss": mean_loss}),
                per_client(client_state, MIFAClientState, latest_model_change=latest))

    def server_step(self, state: MIFAServerState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[MIFAServerState, dict]:
        # Under a weighted selector the importances p_i weigh the differences; else always 1/N, never 1/S.
        importances = round_info.importances
        difference_sum = weighted_average(uploads, "model_change_difference", "uniform", importances,
                                          divisor=None if importances is not None else round_info.num_clients)
        average = state.average.add(difference_sum)
        params, optimizer = self.optimizer.step(state.params, average, state.optimizer)   # m += ..., x + eta_g m
        return MIFAServerState(params=params, average=average, optimizer=optimizer), {}


@register_algorithm("mifam")
class MIFAM(MIFA):
    """MIFAM: MIFA with server heavy-ball momentum (GradMA's baseline, arXiv:2302.14307)."""

    Params = MIFAMParams
    fixed = {}
