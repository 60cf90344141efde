"""The Algorithm interface: pure maths on flat float32 parameter vectors.

An algorithm says what the server broadcasts, how one client trains from that broadcast
and its own persistent state, and how the server folds the uploads into its state. It
never sees Ray, actors, devices or files; the engines move its tensors around.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

Batch = tuple[Tensor, Tensor]


class ClientTask(Protocol):
    """One client's local problem, as handed to `Algorithm.client_train` by a worker."""

    num_samples: int

    def start_from(self, params: Tensor) -> Tensor:
        """Loads `params` into the resident model and returns its flat parameter vector.
        Updating that vector in place updates the model; gradients at it need no copy."""

    def next_batch(self) -> Batch:
        """The next minibatch from this client's own random stream for this round."""

    def loss_and_grad(self, params: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        """Mean loss (a detached scalar tensor) and its gradient at `params` on `batch`, in train mode.
        At the resident vector this is a training step's gradient (BatchNorm statistics update);
        anywhere else the resident model, its statistics included, is left as it was.
        The gradient is a reused buffer, valid until the next call."""


@dataclass
class Upload:
    """What one client sends back: named tensors, its sample count and training metrics."""

    tensors: dict[str, Tensor]
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass(frozen=True)
class RoundInfo:
    round: int                     # 0-based index of the round being completed
    sampled: tuple[int, ...]       # the round's clients, in sampling order
    num_clients: int


class Algorithm:
    """Base class. Subclasses hold only hyper-parameters; all state is passed in and returned."""

    # Whether clients carry state from round to round (client_init/client_train): such clients
    # must always train on the worker that holds it; stateless ones can train anywhere.
    keeps_client_state = True
    # Whether client_train, given a ClientBatchTask, trains a stack of clients at once: true
    # when it is local_sgd plus broadcasting tensor ops and keeps no client state.
    vectorizable = False

    def server_init(self, params: Tensor, num_clients: int) -> Any:
        raise NotImplementedError

    def broadcast(self, server_state: Any) -> dict[str, Tensor]:
        raise NotImplementedError

    def global_params(self, server_state: Any) -> Tensor:
        raise NotImplementedError

    def client_init(self, client_id: int) -> Any:
        """Persistent per-client state before a client's first round; None when there is none."""
        return None

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: Any) -> tuple[Upload, Any]:
        raise NotImplementedError

    def server_step(self, server_state: Any, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[Any, dict[str, float]]:
        """The next server state and the round's algorithm metrics (diagnostics for metrics.jsonl).
        `uploads` is ordered by client id; combining in that order keeps runs bitwise reproducible."""
        raise NotImplementedError

    def state_bytes(self, state: Any) -> int:
        """Bytes of tensors held in a (server or client) state: the memory the docs promise to report."""
        if state is None:
            return 0
        return sum(value.numel() * value.element_size() for value in vars(state).values() if isinstance(value, Tensor))


def weighted_average(uploads: dict[int, Upload], name: str, weighting: str) -> Tensor:
    """sum_i w_i * uploads[i].tensors[name] in client-id order; w_i = 1/S or n_i / sum_j n_j."""
    total = torch.zeros_like(next(iter(uploads.values())).tensors[name])
    if weighting == "uniform":
        for upload in uploads.values():
            total.add_(upload.tensors[name])
        return total.div_(len(uploads))
    num_samples = sum(upload.num_samples for upload in uploads.values())
    for upload in uploads.values():
        total.add_(upload.tensors[name], alpha=upload.num_samples / num_samples)
    return total


def local_sgd(task: ClientTask, start: Tensor, steps: int, lr: float,
              prox_mu: float = 0.0, prox_center: Tensor | None = None) -> tuple[Tensor, float | Tensor]:
    """`steps` plain SGD steps from `start`, optionally on the FedProx objective
    F_i(w) + mu/2 ||w - prox_center||^2. Returns the final iterate (the resident model's
    vector, updated in place) and the mean minibatch loss over the steps. With a stack of clients
    (a ClientBatchTask) the iterates are (clients, d) and the losses a (clients,) tensor."""
    params = task.start_from(start)
    loss_sum = 0.0
    for _ in range(steps):
        loss, grad = task.loss_and_grad(params, task.next_batch())
        if prox_mu:
            grad = grad.add(params - prox_center, alpha=prox_mu)
        params.sub_(grad, alpha=lr)
        loss_sum = loss_sum + loss.double()
    mean_loss = loss_sum / steps
    return params, float(mean_loss) if mean_loss.ndim == 0 else mean_loss
