"""Local objectives: what a client's local steps minimise.

An objective is a loss on the model's outputs for a minibatch, which autograd differentiates
(cross-entropy unless the algorithm gives its own: MOON's contrastive term, FedMLB's hybrid
pathways, which may run frozen copies of the model through `task.forward_at`), plus terms on the
parameters whose gradients are known in closed form and added to the minibatch gradient
(FedProx's proximal term, FedDyn's linear and proximal terms). Pure maths: no Ray.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from torch import Tensor

from rayfed.models.forward import ModelForward

# loss(model, inputs, targets) -> a scalar tensor, with `model` the trained model's passes.
OutputLoss = Callable[[ModelForward, Tensor, Tensor], Tensor]


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
    """The loss of the model's outputs on a minibatch, output_loss(model, x, y); None: cross-entropy."""
    terms: tuple[ParameterTerm, ...] = ()
    """Terms of the parameters with closed-form gradients (Proximal, Linear), added to its gradient."""

    def direction(self, grad: Tensor, params: Tensor, step: int) -> Tensor:
        """The objective's gradient from the output loss's `grad`: a `local_descent` direction."""
        for term in self.terms:
            grad = term.add_gradient(grad, params)
        return grad
