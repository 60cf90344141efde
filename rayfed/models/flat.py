"""A module whose parameters live in one flat vector.

Trainable parameters are views into `params` and their gradients views into `grad`, so an
algorithm reads and writes the whole model as one contiguous float32 tensor with no
per-layer copies. Floating-point buffers (BatchNorm running statistics) are views into
`buffers` the same way; they travel beside the parameters but are never optimised.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    offset = 0
    for tensor in tensors:
        tensor.data = flat[offset:offset + tensor.numel()].view_as(tensor)
        offset += tensor.numel()
    return flat
