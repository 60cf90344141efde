"""FedNova as a plugin: normalised averaging (Wang et al., NeurIPS 2020, "Tackling the Objective
Inconsistency Problem in Heterogeneous Federated Optimization", arXiv:2007.07481) with plain local
SGD, and each client's step count reported as a client metric.

    rayfed run plugins=[./fednova.py] algorithm.name=fednova train.local_epochs=2 logging.client_metrics=true

With `train.local_epochs` client i takes tau_i = E * ceil(n_i / B) SGD steps from the global model x
and ends at y_i: clients of different sizes take different numbers of steps. Plain SGD weighs its
tau_i gradients alike (a_i = [1, ..., 1], ||a_i||_1 = tau_i), so its normalised gradient
d_i = G_i a_i / ||a_i||_1 is (x - y_i) / (eta * tau_i), and the server takes

    x <- x - lr_global * tau_eff * eta * sum_i p_i d_i,    tau_eff = sum_i p_i tau_i,    p_i = n_i / sum_j n_j

(lr_global = 1 is the paper's rule). FedAvg's x - sum_i p_i (x - y_i) weighs client i by p_i tau_i
instead, and so converges to a stationary point of sum_i p_i tau_i F_i rather than of sum_i p_i F_i
(the paper's objective inconsistency). With equal step counts the two rules are the same.

A client uploads -eta * d_i = (y_i - x) / tau_i: the server multiplies by eta again, so eta
(decayed by train.lr_decay or not) cancels and is neither divided nor multiplied in float32; with
equal step counts that are a power of two the run then has FedAvg's bits. Each client reports
`tau` in its upload's metrics: the round's record holds `client_tau_mean`, `_min` and `_max`, and with
`logging.client_metrics: true` clients.jsonl holds every client's own. Under a selector with weights
of its own (selection.selector other than uniform) p_i is the selector's weight w_i, and
tau_eff = sum_i w_i tau_i.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field
from torch import Tensor

import rayfed


class FedNovaParams(rayfed.AlgorithmParams):
    agg_weighting: Literal["uniform", "num_samples"] = Field(
        "num_samples", description="p_i, in the average of the d_i and in tau_eff: num_samples (n_i / sum n_j, the "
                                   "paper's) or uniform (1/S)")


@dataclass
class FedNovaState:
    params: Tensor      # x, the global model


@rayfed.register_algorithm("fednova")
class FedNova(rayfed.Algorithm):
    """FedNova (Wang et al., NeurIPS 2020, arXiv:2007.07481) with plain local SGD, an example plugin."""

    Params = FedNovaParams
    state_classes = (FedNovaState,)
    keeps_client_state = False
    # Capabilities are off unless declared: it takes algorithm.lr_global and algorithm.agg_weighting.
    server_lr = True
    weighted = True

    def __init__(self, params: FedNovaParams, context: rayfed.AlgorithmContext):
        self.lr_local, self.lr_global, self.agg_weighting = params.lr_local, params.lr_global, params.agg_weighting

    def server_init(self, params: Tensor, num_clients: int) -> FedNovaState:
        return FedNovaState(params.clone())

    def broadcast(self, state: FedNovaState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: FedNovaState) -> Tensor:
        return state.params

    def client_train(self, task: rayfed.ClientTask, down: dict[str, Tensor], client_state: None):
        start = down["params"]
        local, mean_loss = rayfed.local_sgd(task, start, self.lr_local)
        tau = task.steps                                                    # ||a_i||_1 of plain SGD
        return rayfed.Upload({"normalized_change": (local - start).div_(tau)}, task.num_samples,
                             {"train_loss": mean_loss, "tau": tau}), None

    def server_step(self, state: FedNovaState, uploads: dict[int, rayfed.Upload], round_info: rayfed.RoundInfo):
        tau_eff = effective_steps(uploads, self.agg_weighting, round_info.weights)
        # sum_i p_i (y_i - x) / tau_i = -eta sum_i p_i d_i
        direction = rayfed.weighted_average(uploads, "normalized_change", self.agg_weighting, round_info.weights)
        params = state.params.add(direction.mul_(tau_eff), alpha=self.lr_global)
        return FedNovaState(params), {"tau_eff": tau_eff}


def effective_steps(uploads: dict[int, rayfed.Upload], weighting: str, weights: dict[int, float] | None) -> float:
    """tau_eff = sum_i p_i tau_i with the p_i of the average; from integers where they are integers,
    so that equal step counts K give exactly K."""
    if weights is not None:
        return sum(weights[client] * upload.metrics["tau"] for client, upload in uploads.items())
    if weighting == "uniform":
        return sum(upload.metrics["tau"] for upload in uploads.values()) / len(uploads)
    return (sum(upload.num_samples * upload.metrics["tau"] for upload in uploads.values())
            / sum(upload.num_samples for upload in uploads.values()))
