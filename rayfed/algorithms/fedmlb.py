"""FedMLB and FedMLBM: multi-level branched regularisation (Kim, Kim, Han, ICML 2022,
arXiv:2207.06936, Section 3 and Eq. 1-4).

The model is split into B blocks (the model declares them: rayfed.models.forward.with_structure).
Besides its main pathway (local blocks 1..B, logits z), client i runs for each b = 1..B-1 a hybrid
pathway: its own blocks 1..b followed by the global model's blocks b+1..B, frozen at x_t (logits
z_b). Gradients flow through the frozen blocks into the local ones; the frozen blocks run in train
mode, as the authors' copy of the model does. The local loss is

    lambda1 CE(z, y) + lambda2/(B-1) sum_b CE(z_b, y) + lambda3/(B-1) sum_b KL(softmax(z_b/T) || softmax(z/T)),

with the authors' KL (batch mean) through both arguments. The client uploads its model change; the
server averages them as FedAvg does, and FedMLBM adds FedAvgM's heavy-ball momentum (GradMA,
arXiv:2302.14307). With lambda2 = lambda3 = 0 (and lambda1 = 1), FedMLB is FedAvg. Under
engine.vectorize a stack of clients trains at once, each through its own hybrid pathways.
"""
from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import AlgorithmContext, ClientTask, Upload, local_sgd, register_algorithm
from rayfed.algorithms.fedavg import FedAvgMServer
from rayfed.algorithms.objective import LocalObjective, cross_entropy, row_mean
from rayfed.algorithms.params import AlgorithmParams
from rayfed.fields import Coefficient, Decay, Positive
from rayfed.models.forward import ModelForward


class FedMLBParams(AlgorithmParams):
    lambda1: Coefficient = Field(1.0, description="FedMLB's weight of the main pathway's cross-entropy")
    lambda2: Coefficient = Field(1.0, description="FedMLB's weight of the hybrid pathways' cross-entropy")
    lambda3: Coefficient = Field(1.0, description="FedMLB's weight of the KL divergence between the hybrid and "
                                                  "main pathways' predictions")
    temperature: Positive = Field(1.0, description="FedMLB's softmax temperature T of the KL term")


class FedMLBMParams(FedMLBParams):
    beta1: Decay = Field(0.9, description="server heavy-ball momentum: m <- beta1 m + d, x <- x + lr_global m")


def hybrid_kl(hybrid_logits: Tensor, main_logits: Tensor, temperature: float,
              weights: Tensor | None = None) -> Tensor:
    """KL(softmax(z_b/T) || softmax(z/T)), the mean over the batch of the per-sample divergences (over
    the rows that count, with `weights`)."""
    log_main, hybrid = F.log_softmax(main_logits / temperature, dim=1), F.softmax(hybrid_logits / temperature, dim=1)
    if weights is None:
        return F.kl_div(log_main, hybrid, reduction="batchmean")
    return row_mean(F.kl_div(log_main, hybrid, reduction="none").sum(dim=1), weights)


@register_algorithm("fedmlbm")
class FedMLBM(FedAvgMServer):
    """FedMLBM: FedMLB's local objective with FedAvgM's server momentum (GradMA, arXiv:2302.14307)."""

    Params = FedMLBMParams
    model_needs = "blocks"
    vectorizable = True

    def __init__(self, params: FedMLBParams, context: AlgorithmContext):
        super().__init__(params, context)
        self.lambdas = (params.lambda1, params.lambda2, params.lambda3)
        self.temperature = params.temperature

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        start = down["params"]
        frozen_global = task.forward_at(start, task.buffers(), train=True)
        lambda1, lambda2, lambda3 = self.lambdas

        def loss(model: ModelForward, inputs: Tensor, targets: Tensor, weights: Tensor | None = None) -> Tensor:
            outputs = model.block_outputs(inputs)
            main = outputs[-1]
            branches = len(outputs) - 1
            hybrid_cross_entropy = kl = 0.0
            for level, features in enumerate(outputs[:-1], start=1):
                hybrid = frozen_global.through_blocks(features, level)
                hybrid_cross_entropy = hybrid_cross_entropy + cross_entropy(hybrid, targets, weights)
                kl = kl + hybrid_kl(hybrid, main, self.temperature, weights)
            return (lambda1 * cross_entropy(main, targets, weights) + lambda2 / branches * hybrid_cross_entropy
                    + lambda3 / branches * kl)

        local, mean_loss = local_sgd(task, start, self.lr_local, LocalObjective(loss))
        return Upload({"model_change": local - start}, task.num_samples, {"train_loss": mean_loss}), None


@register_algorithm("fedmlb")
class FedMLB(FedMLBM):
    """FedMLB (Kim, Kim, Han, ICML 2022, arXiv:2207.06936): FedAvg's server with hybrid pathways."""

    Params = FedMLBParams
