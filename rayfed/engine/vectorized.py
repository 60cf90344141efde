"""Training a worker's clients of a round as one batched computation (engine.vectorize).

ClientBatchTask implements the ClientTask protocol with a leading client dimension: parameters
are (clients, d), a batch is every client's next minibatch stacked, and the gradient is taken
per client with torch.func.vmap. An algorithm whose local step is written with broadcasting
ops (FedAvgM's local_sgd) then trains all clients at once, unchanged. Each client keeps its own
parameters, minibatch stream and sample count, so results equal sequential training up to
floating-point reordering inside the batched kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.utils.rnn import pad_sequence

from rayfed.algorithms.base import Algorithm
from rayfed.models import FlatModel

# Layers whose behaviour couples a client's samples or draws randomness: vmap cannot keep
# per-client BatchNorm statistics or reproduce each client's dropout stream.
_UNVECTORIZABLE_LAYERS = (nn.modules.batchnorm._NormBase, nn.modules.dropout._DropoutNd)
# Samples per forward pass of a full local gradient: bounds its memory whatever a client holds.
FULL_GRADIENT_CHUNK = 1024


def vectorize_blocker(algorithm_name: str, algorithm: Algorithm, module: nn.Module,
                      steps_differ_between_clients: bool = False, compressed: bool = False) -> str | None:
    """Why this algorithm and model cannot train clients as one batch; None when they can."""
    if not algorithm.vectorizable:
        return f"algorithm {algorithm_name} has no batched local step (its clients keep state or correct their steps)"
    if compressed:
        return "compressed uploads are encoded client by client, each from its own stream"
    if steps_differ_between_clients:
        return ("local epochs give this partition's clients different numbers of local steps, which one "
                "batched computation does not take")
    layers = sorted({type(layer).__name__ for layer in module.modules() if isinstance(layer, _UNVECTORIZABLE_LAYERS)})
    if layers:
        return (f"the model has {', '.join(layers)} layers, whose per-client statistics and random streams "
                f"a batched computation does not reproduce")
    return None


class ClientBatchTask:
    """Clients' local problems for one round, stacked (implements algorithms.base.ClientTask)."""

    def __init__(self, model: FlatModel, client_tasks: list):
        self.model = model
        self.client_tasks = client_tasks
        self.num_samples = [task.num_samples for task in client_tasks]
        self.shapes = [(name, parameter.shape, parameter.numel()) for name, parameter
                       in model.module.named_parameters() if parameter.requires_grad]
        self.per_client_grad = vmap(grad_and_value(self._loss))

    def start_from(self, params: Tensor) -> Tensor:
        return params.expand(len(self.client_tasks), -1).clone()

    def next_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        """Every client's next minibatch, padded to the longest with weight-0 rows: clients whose
        sample counts leave a shorter last batch of an epoch still train on exactly their own rows."""
        return self._stacked([task.next_rows() for task in self.client_tasks])

    def draw_batch(self, size: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        return self._stacked([task.draw_rows(size) for task in self.client_tasks])

    def _stacked(self, rows: list[Tensor], augment: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        padded = pad_sequence(rows, batch_first=True)       # padding: row 0 of the dataset, weighted 0
        lengths = torch.tensor([r.shape[0] for r in rows], device=padded.device)
        weights = torch.arange(padded.shape[1], device=padded.device) < lengths[:, None]
        task = self.client_tasks[0]
        if task.augment_generator is None or not augment:
            inputs = task.train_x[padded]
        else:
            # Each client augments only its own rows, from its own stream, as it would training alone.
            inputs = pad_sequence([client.inputs(r) for client, r in zip(self.client_tasks, rows)], batch_first=True)
        return inputs, task.train_y[padded], weights.to(torch.float32)     # float even for token inputs

    def loss_and_grad(self, params: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        grads, losses = self.per_client_grad(params, *batch)
        return losses.detach(), grads

    def paired_loss_and_grad(self, current: Tensor, previous: Tensor,
                             batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        # No dropout here (vectorize_blocker): the two passes differ only in where they are taken.
        loss, grad = self.loss_and_grad(current, batch)
        return loss, grad, self.loss_and_grad(previous, batch)[1]

    def full_loss_and_grad(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """Each client's mean loss and gradient over all its samples, FULL_GRADIENT_CHUNK columns at a time."""
        rows = [task.sample_indices for task in self.client_tasks]
        counts = torch.tensor([len(r) for r in rows], device=params.device, dtype=params.dtype)
        loss_sum = torch.zeros(len(rows), dtype=torch.float64, device=params.device)
        grad_sum = torch.zeros_like(params)
        for start in range(0, max(len(r) for r in rows), FULL_GRADIENT_CHUNK):
            chunk = [r[start:start + FULL_GRADIENT_CHUNK] for r in rows]
            present = [i for i, c in enumerate(chunk) if len(c)]
            inputs, targets, weights = self._stacked([chunk[i] for i in present], augment=False)
            losses, grads = self.loss_and_grad(params[present], (inputs, targets, weights))
            sizes = weights.sum(dim=1)
            loss_sum[present] += losses.double() * sizes.double()
            grad_sum[present] += grads * sizes[:, None]
        return (loss_sum / counts.double()).float(), grad_sum.div_(counts[:, None])

    def _loss(self, flat: Tensor, inputs: Tensor, targets: Tensor, weights: Tensor) -> Tensor:
        named, offset = {}, 0
        for name, shape, size in self.shapes:
            named[name] = flat[offset:offset + size].view(shape)
            offset += size
        losses = F.cross_entropy(functional_call(self.model.module, named, (inputs,)), targets, reduction="none")
        return (losses * weights).sum() / weights.sum()
