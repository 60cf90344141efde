"""How much and how a client trains in a round, whatever the algorithm (the train.* keys; the adaptive interval is
FedLALR's, arXiv:2309.09719, Sec. IV-C): the number of local steps, the decayed learning-rate factor,
weight decay and gradient clipping.

`LocalSchedule` says how many steps client i takes in round t and by what factor its learning rate
is decayed; `TrainingTask` wraps a client's task so that every algorithm's local loop sees the
regularised gradient and can apply decoupled weight decay, without knowing which options are on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from rayfed.algorithms.base import Batch, ClientTask, OutputLoss
from rayfed.models.forward import ModelForward

# torch.nn.utils.clip_grad_norm_'s guard against a zero norm; the same formula keeps our clipping
# equal to what a PyTorch training loop would do.
CLIP_EPS = 1e-6


@dataclass(frozen=True)
class LocalSchedule:
    local_steps: int                  # K, with interval=fixed and no local_epochs
    batch_size: int
    local_epochs: int | None = None   # K_i = E * ceil(n_i / B) instead of local_steps
    lr_decay: float = 1.0             # gamma: round t trains with lr * gamma^t (once per round)
    interval: str = "fixed"           # adaptive: K_t = k_init + ROUND(log_{k_alpha}(t + 1)) (FedLALR, Sec. IV-C)
    k_init: int = 4
    k_alpha: float = 2.0
    rounding: str = "floor"
    interval_unit: str = "epochs"     # what K_t counts under interval=adaptive

    @classmethod
    def from_config(cls, train) -> "LocalSchedule":
        adaptive = train.interval == "adaptive"
        interval = {"k_init": train.interval_k_init, "k_alpha": train.interval_k_alpha,
                    "rounding": train.interval_rounding, "interval_unit": train.interval_unit} if adaptive else {}
        return cls(local_steps=train.local_steps, batch_size=train.batch_size, local_epochs=train.local_epochs,
                   lr_decay=train.lr_decay, interval=train.interval, **interval)

    def lr_factor(self, round: int) -> float:
        return self.lr_decay ** round

    def interval_length(self, round: int) -> int:
        """K_t of the adaptive interval for 0-based `round` (the formula's 1-based t = round + 1)."""
        return self.k_init + integer_log(round + 1, self.k_alpha, self.rounding)

    def steps(self, round: int, num_samples: int) -> int:
        """Local steps (minibatches) of a client with `num_samples` samples in 0-based `round`."""
        batches_per_epoch = batches_in_epoch(num_samples, self.batch_size)
        if self.interval == "adaptive":
            length = self.interval_length(round)
            return length * batches_per_epoch if self.interval_unit == "epochs" else length
        if self.local_epochs is not None:
            return self.local_epochs * batches_per_epoch
        return self.local_steps


def batches_in_epoch(num_samples: int, batch_size: int) -> int:
    """Minibatches in one pass over a client's samples: ceil(n / B), less a trailing batch of one
    sample, which the worker skips (BatchNorm cannot train on it) and reshuffles instead."""
    batch_size = min(batch_size, num_samples)
    trailing_single = num_samples > 1 and num_samples % batch_size == 1
    return math.ceil(num_samples / batch_size) - trailing_single


def integer_log(value: int, base: float, rounding: str) -> int:
    """floor or ceil of log_base(value) for value >= 1, exact at the powers of `base` where
    math.log is not (log(1000, 10) = 2.9999999999999996)."""
    exponent = round(math.log(value, base))
    while base ** exponent > value:
        exponent -= 1
    while base ** (exponent + 1) <= value:
        exponent += 1
    return exponent if rounding == "floor" or base ** exponent == value else exponent + 1


class TrainingTask:
    """A client's task for one round with the local-training options applied: `steps` and
    `lr_factor` for the algorithm's loop; gradient clipping by norm, then coupled weight decay
    (g + lambda x, what torch optimizers' weight_decay does) in `loss_and_grad`; decoupled weight
    decay (x <- (1 - lr lambda) x, AdamW's order: before the step) in `decay`."""

    def __init__(self, task: ClientTask, steps: int, lr_factor: float = 1.0, weight_decay: float = 0.0,
                 decoupled: bool = False, max_grad_norm: float | None = None):
        self.task = task
        self.steps = steps
        self.lr_factor = lr_factor
        self.num_samples = task.num_samples
        self.weight_decay = weight_decay
        self.decoupled = decoupled
        self.max_grad_norm = max_grad_norm

    def start_from(self, params: Tensor) -> Tensor:
        return self.task.start_from(params)

    def next_batch(self) -> Batch:
        return self.task.next_batch()

    def draw_batch(self, size: int | None = None) -> Batch:
        return self.task.draw_batch(size)

    def loss_and_grad(self, params: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        loss, grad = self.task.loss_and_grad(params, batch)
        return loss, self._regularised(grad, params)

    def objective_loss_and_grad(self, params: Tensor, batch: Batch, loss_fn: OutputLoss) -> tuple[Tensor, Tensor]:
        loss, grad = self.task.objective_loss_and_grad(params, batch, loss_fn)
        return loss, self._regularised(grad, params)

    def buffers(self) -> Tensor:
        return self.task.buffers()

    def forward_at(self, params: Tensor, buffers: Tensor, train: bool = False) -> ModelForward:
        return self.task.forward_at(params, buffers, train)

    def paired_loss_and_grad(self, current: Tensor, previous: Tensor, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        loss, grad, previous_grad = self.task.paired_loss_and_grad(current, previous, batch)
        return loss, self._regularised(grad, current), self._regularised(previous_grad, previous)

    def full_loss_and_grad(self, params: Tensor) -> tuple[Tensor, Tensor]:
        loss, grad = self.task.full_loss_and_grad(params)
        return loss, self._regularised(grad, params)

    def _regularised(self, grad: Tensor, params: Tensor) -> Tensor:
        """`grad`, in place, clipped and then with coupled weight decay."""
        if self.max_grad_norm is not None:
            # Per client: a stack of clients (engine.vectorize) has one gradient per row.
            norm = grad.norm(dim=-1, keepdim=True)
            grad.mul_((self.max_grad_norm / (norm + CLIP_EPS)).clamp(max=1.0))
        if self.weight_decay and not self.decoupled:
            grad.add_(params, alpha=self.weight_decay)
        return grad

    def decay(self, params: Tensor, lr: float) -> None:
        if self.weight_decay and self.decoupled:
            params.mul_(1.0 - lr * self.weight_decay)
