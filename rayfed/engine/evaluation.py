"""Evaluation: the global model on the test set (and, with train.eval_train_loss, on every
client's training samples) at the rounds train.eval_every names, and the gradient-similarity
diagnostic those rounds carry with train.similarity_clients."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rayfed.models import FlatModel
from rayfed.selection import cosine_similarities


class Evaluation:
    def __init__(self, model: FlatModel, test: tuple[Tensor, Tensor], clients_train: tuple[Tensor, Tensor] | None,
                 train):
        """`train`: the config's train section (rounds, eval_every, similarity_clients)."""
        self.model = model
        self.test = test
        # train.eval_train_loss: every client's training samples, for the global training loss.
        self.clients_train = clients_train
        self.rounds = train.rounds
        self.every = train.eval_every
        self.similarity_clients = list(range(train.similarity_clients))

    def extensions(self) -> list[tuple[str, dict]]:
        return [("gradient_similarity", {"clients": self.similarity_clients})] if self.similarity_clients else []

    def due(self, round: int) -> bool:
        return (round + 1) % self.every == 0 or round + 1 == self.rounds

    def metrics(self, params: Tensor, buffers: Tensor) -> dict:
        metrics = {}
        metrics["test_loss"], metrics["test_accuracy"] = self.evaluate(params, buffers, *self.test)
        if self.clients_train is not None:
            metrics["global_train_loss"], metrics["global_train_accuracy"] = self.evaluate(params, buffers,
                                                                                           *self.clients_train)
        return metrics

    def evaluate(self, params: Tensor, buffers: Tensor, inputs: Tensor, targets: Tensor) -> tuple[float, float]:
        """(mean loss, accuracy) of the model (`params`, `buffers`), in eval mode, on (inputs, targets)."""
        self.model.params.copy_(params)
        self.model.buffers.copy_(buffers)
        return self.model.evaluate(inputs, targets)


def gradient_similarity(*gradient_blocks: tuple[list[int], Tensor]) -> dict:
    """The cosine similarity of the clients' full local gradients at the global model, and its mean
    off the diagonal (Haddadpour et al., AISTATS 2021, Eq. 7)."""
    clients = [client for ids, _ in gradient_blocks for client in ids]
    gradients = torch.cat([block for _, block in gradient_blocks]).double()[np.argsort(clients)].cpu()
    cosines = cosine_similarities(gradients.numpy())
    count = len(cosines)
    off_diagonal = (cosines.sum() - np.trace(cosines)) / max(count * (count - 1), 1)
    return {"gradient_similarity": np.round(cosines, 6).tolist(), "gradient_similarity_mean": float(off_diagonal)}
