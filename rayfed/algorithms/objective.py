"""Local objectives: what a client's local steps minimise.

An objective is a loss on the model's outputs for a minibatch, which autograd differentiates
(cross-entropy unless the algorithm gives its own: MOON's contrastive term, FedMLB's hybrid
pathways, which may run frozen copies of the model through `task.forward_at`), plus terms on the
parameters whose gradients are known in closed form and added to the minibatch gradient
(FedProx's proximal term, FedDyn's linear and proximal terms). Pure maths: no Ray.

Under engine.vectorize a client's minibatch may be padded with rows that do not count (clients of
one batch hold different numbers of samples): an output loss that takes per-row `weights` reduces
over the rows that count itself (`row_mean`, `cross_entropy`), and the batched computation runs it
for all clients at once.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Protocol

import torch.nn.functional as F
from torch import Tensor

# loss(model, inputs, targets) -> a scalar tensor, with `model` the trained model's passes (a
# rayfed.models.forward.ModelForward); or loss(model, inputs, targets, weights=None), whose mean over
# the batch counts row r with weights[r] (1 or 0), None where every row counts.
OutputLoss = Callable[..., Tensor]


def takes_row_weights(loss: OutputLoss) -> bool:
    """Whether `loss` takes per-row `weights` (and reduces over the rows that count itself)."""
    return "weights" in inspect.signature(loss).parameters


def row_mean(per_row: Tensor, weights: Tensor) -> Tensor:
    """The mean of per-row values over the rows that count: sum_r w_r v_r / sum_r w_r."""
    return (per_row * weights).sum() / weights.sum()


def cross_entropy(logits: Tensor, targets: Tensor, weights: Tensor | None = None) -> Tensor:
    """F.cross_entropy's batch mean; with `weights`, the mean over the rows that count (row_mean)."""
    if weights is None:
        return F.cross_entropy(logits, targets)
    return row_mean(F.cross_entropy(logits, targets, reduction="none"), weights)


class ParameterTerm(Protocol):
    def add_gradient(self, grad: Tensor, params: Tensor) -> Tensor:
        """`grad` plus this term's gradient at `params` (a new tensor)."""


@dataclass(frozen=True)
class Proximal:
    """(mu / 2) ||w - center||^2, gradient mu (w - center): FedProx's term (Li et al., MLSys 2020,
    arXiv:1812.06127, Eq. 2) and FedDyn's (Acar et al., ICLR 2021, Algorithm 1). mu = 0 adds nothing."""

    mu: float
    """The term's weight."""
    center: Tensor
    """The point w is pulled toward (the broadcast model, for FedProx)."""

    def add_gradient(self, grad: Tensor, params: Tensor) -> Tensor:
        return grad.add(params - self.center, alpha=self.mu) if self.mu else grad


@dataclass(frozen=True)
class Linear:
    """-<h, w>, gradient -h: FedDyn's linear term, with h the client's gradient state."""

    h: Tensor
    """The client's gradient state."""

    def add_gradient(self, grad: Tensor, params: Tensor) -> Tensor:
        return grad - self.h


@dataclass(frozen=True)
class LocalObjective:
    """output_loss(model, x, y) on each minibatch (None: cross-entropy) plus `terms` on the parameters."""

    output_loss: OutputLoss | None = None
    """The loss of the model's outputs on a minibatch, output_loss(model, x, y), or
    output_loss(model, x, y, weights=None) where it reduces over the rows that count itself; None: cross-entropy."""
    terms: tuple[ParameterTerm, ...] = ()
    """Terms of the parameters with closed-form gradients (Proximal, Linear), added to its gradient."""

    def direction(self, grad: Tensor, params: Tensor, step: int) -> Tensor:
        """The objective's gradient from the output loss's `grad`: a `local_descent` direction."""
        for term in self.terms:
            grad = term.add_gradient(grad, params)
        return grad
