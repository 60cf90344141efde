"""The STORM local loop (Cutkosky and Orabona, NeurIPS 2019, arXiv:1905.10018) that FedMoS (Wang et al.,
INFOCOM 2023, Eq. 3) and STEM (arXiv:2106.10435) share.

A recursive momentum d replaces the minibatch gradient: after each step,
    d_{tau+1} = g(x_{tau+1}; B) + (1 - a) (d_tau - g(x_tau; B)),
the same fresh batch B evaluated at the new and at the previous iterate, with the same dropout
masks (task.paired_loss_and_grad). Given the past, the correction has mean zero, so d stays an
unbiased estimate of the local gradient (Lemma 8) when B is drawn independently of the past
(task.draw_batch). The authors' code instead corrects with the previous step's
gradient, on another batch, stored as zero before the first step: offered for
reproduction only, as estimator="reference_code".
"""
from __future__ import annotations

from torch import Tensor

from rayfed.algorithms.base import Batch, ClientTask

MINIBATCHES = ("independent", "shuffled")
ESTIMATORS = ("storm_paper", "reference_code")


def step_batch(task: ClientTask, minibatches: str, size: int | None = None) -> Batch:
    """The next step's batch: `independent` draws (spec A19), or the epoch walk every other
    algorithm takes (`shuffled`; spec A3 under local epochs). `size` asks for an independent draw
    of that size (FedMoS's init_batch)."""
    if size is not None or minibatches == "independent":
        return task.draw_batch(size)
    return task.next_batch()


def storm_descent(task: ClientTask, params: Tensor, direction: Tensor, lr: float, a: float, *,
                  mu: float = 0.0, anchor: Tensor | None = None, minibatches: str = "independent",
                  estimator: str = "storm_paper", correct_after_last: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """task.steps updates x_{tau+1} = x_tau - lr_t d_tau - mu (x_tau - anchor) of `params` (the
    resident vector, updated in place) from d_0 = `direction`, each but the last (all of them with
    `correct_after_last`, STEM's) followed by the momentum recursion. lr_t = lr * task.lr_factor.
    Returns (x_I, the last d, the sum of the minibatch losses at the corrected iterates)."""
    lr = lr * task.lr_factor
    loss_sum = 0.0
    previous_grad = None        # reference_code's stored gradient: zero before the first correction
    for step in range(task.steps):
        previous = params.clone()
        task.decay(params, lr)
        params.sub_(direction, alpha=lr)
        if mu:
            params.sub_(previous - anchor, alpha=mu)
        if step == task.steps - 1 and not correct_after_last:
            break
        batch = step_batch(task, minibatches)
        if estimator == "storm_paper":
            loss, grad, grad_at_previous = task.paired_loss_and_grad(params, previous, batch)
            direction = grad + (1.0 - a) * (direction - grad_at_previous)
        else:
            loss, grad = task.loss_and_grad(params, batch)
            correction = direction if previous_grad is None else direction - previous_grad
            direction = grad + (1.0 - a) * correction
            previous_grad = grad.clone()
        loss_sum = loss_sum + loss.double()
    return params, direction, loss_sum
