"""A module whose parameters live in one flat vector.

Trainable parameters are views into `params` and their gradients views into `grad`, so an
algorithm reads and writes the whole model as one contiguous float32 tensor with no
per-layer copies. Floating-point buffers (BatchNorm running statistics) are views into
`buffers` the same way; they travel beside the parameters but are never optimised.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rayfed.models.forward import ModelForward, structure_of


class FlatModel:
    def __init__(self, module: nn.Module, device: torch.device | str = "cpu"):
        self.module = module.to(device)
        self.device = torch.device(device)
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.params = _flatten_into_views(trainable)
        self.grad = torch.zeros_like(self.params)
        # [start, stop) of each parameter tensor in `params`: the blocks of qp_scope="tensor".
        self.blocks: list[tuple[int, int]] = []
        offset = 0
        for parameter in trainable:
            self.blocks.append((offset, offset + parameter.numel()))
            # Backward accumulates in place into an existing .grad, so these views fill self.grad.
            parameter.grad = self.grad[offset:offset + parameter.numel()].view_as(parameter)
            offset += parameter.numel()
        self.buffers = _flatten_into_views([b for b in module.buffers() if b.is_floating_point()])

    @property
    def num_params(self) -> int:
        return self.params.numel()

    def loss_and_grad(self, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Mean cross-entropy and its gradient at the current `params`, in train mode."""
        self.grad.zero_()
        loss = F.cross_entropy(self.module(inputs), targets)
        loss.backward()
        return loss.detach(), self.grad

    def objective_loss_and_grad(self, loss_fn: Callable[[ModelForward, Tensor, Tensor], Tensor],
                                inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """`loss_fn(model, inputs, targets)` at the current `params` and its gradient, in train mode:
        a local objective of the model's outputs, possibly beside frozen passes (forward_at)."""
        self.grad.zero_()
        loss = loss_fn(ModelForward(self.module, structure_of(self.module)), inputs, targets)
        loss.backward()
        return loss.detach(), self.grad

    def forward_at(self, params: Tensor, buffers: Tensor, train: bool = False) -> ModelForward:
        """The model's passes at `params` with running statistics `buffers` (copied: a pass in train
        mode updates its own), frozen: no gradient reaches `params`."""
        tensors = {}
        trainable = [(name, p) for name, p in self.module.named_parameters() if p.requires_grad]
        for (name, parameter), (start, stop) in zip(trainable, self.blocks):
            tensors[name] = params[start:stop].detach().view_as(parameter)
        buffers = buffers.detach().clone()
        offset = 0
        for name, buffer in self.module.named_buffers():
            if buffer.is_floating_point():
                tensors[name] = buffers[offset:offset + buffer.numel()].view_as(buffer)
                offset += buffer.numel()
            else:     # BatchNorm's num_batches_tracked, which a pass in train mode increments
                tensors[name] = buffer.clone()
        return ModelForward(self.module, structure_of(self.module), tensors, train)

    @torch.no_grad()
    def evaluate(self, inputs: Tensor, targets: Tensor, batch_size: int = 2048) -> tuple[float, float]:
        """(mean loss, accuracy) over all of `inputs` in eval mode."""
        self.module.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        for start in range(0, len(inputs), batch_size):
            logits = self.module(inputs[start:start + batch_size])
            batch_targets = targets[start:start + batch_size]
            loss_sum += F.cross_entropy(logits, batch_targets, reduction="sum").double()
            correct += (logits.argmax(dim=1) == batch_targets).sum()
        self.module.train()
        return float(loss_sum) / len(inputs), int(correct) / len(inputs)


def _flatten_into_views(tensors: list[Tensor]) -> Tensor:
    """Copies `tensors` into one flat vector and rebinds each tensor's storage to a view of it."""
    if not tensors:
        return torch.zeros(0)
    # torch.cat's values, copied in place: on the meta device (the run's declared shapes) torch.cat would import
    # torch._dynamo, a second of every run's start-up.
    flat = torch.empty(sum(t.numel() for t in tensors), dtype=functools.reduce(torch.promote_types,
                                                                               (t.dtype for t in tensors)),
                       device=tensors[0].device)
    offset = 0
    for tensor in tensors:
        view = flat[offset:offset + tensor.numel()]
        view.copy_(tensor.detach().reshape(-1))
        tensor.data = view.view_as(tensor)
        offset += tensor.numel()
    return flat
