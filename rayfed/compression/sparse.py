"""Sparsifiers (FedCOM, arXiv:2007.01154, Fig. 8, uses top-k): k values and their int32 indices, 32 + 32 bits each.

rand-k keeps k coordinates drawn uniformly without replacement, scaled by d/k: unbiased, with
E||Q(x) - x||^2 = (d/k - 1)||x||^2. top-k keeps the k largest |x_i| (ties to the lower index): biased
but contractive, ||top_k(x) - x||^2 <= (1 - k/d)||x||^2; FedCOMGATE uses it with a memory (arXiv:2007.01154, Sec. B.1).
"""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.compression.base import FLOAT_BITS, INDEX_BITS, Message, register_compressor


class _Sparse:
    def __init__(self, kept: int | None = None, ratio: float | None = None):
        self.kept = kept            # k, or k = floor(ratio * d / 2): bits / (32 d) = ratio (C_r, arXiv:2007.01154, Sec. B.1)
        self.ratio = ratio

    def count(self, size: int) -> int:
        kept = self.kept if self.kept is not None else int(self.ratio * size / 2)
        return max(1, min(kept, size))

    def _message(self, values: Tensor, indices: Tensor) -> Message:
        return Message({"values": values, "indices": indices.to(torch.int32)},
                       (FLOAT_BITS + INDEX_BITS) * indices.numel())

    def decompress(self, message: Message, size: int) -> Tensor:
        values = message.parts["values"]
        dense = values.new_zeros(size)
        dense[message.parts["indices"].long()] = values
        return dense


class RandK(_Sparse):
    unbiased = True

    def variance_bound(self, size: int) -> float:
        return size / self.count(size) - 1

    def compress(self, x: Tensor, generator: torch.Generator | None) -> Message:
        kept = self.count(x.numel())
        indices = torch.randperm(x.numel(), generator=generator)[:kept].sort().values.to(x.device)
        return self._message(x[indices] * (x.numel() / kept), indices)


class TopK(_Sparse):
    unbiased = False

    def variance_bound(self, size: int) -> None:
        return None

    def compress(self, x: Tensor, generator: torch.Generator | None = None) -> Message:
        indices = torch.sort(x.abs(), descending=True, stable=True).indices[:self.count(x.numel())].sort().values
        return self._message(x[indices], indices)


@register_compressor("rand_k", keys={"kept": None, "ratio": 0.1})
def _rand_k(compression) -> RandK:
    """k random coordinates, scaled by d/k (unbiased)."""
    return RandK(compression.kept, compression.ratio)


@register_compressor("top_k", keys={"kept": None, "ratio": 0.1})
def _top_k(compression) -> TopK:
    """The k coordinates of largest magnitude (biased)."""
    return TopK(compression.kept, compression.ratio)
