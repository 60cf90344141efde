"""QSGD's stochastic s-level quantizer (Alistarh et al., NeurIPS 2017, arXiv:1610.02132): each coordinate is sent as its sign
and a level xi in {0, 1/s, ..., 1} of ||x||, rounded up with probability a - floor(a), a = s|x_i|/||x||,
so E Q(x) = x and E||Q(x) - x||^2 = (||x||^2 / s^2) sum_i p_i (1 - p_i). Fixed-length code: the norm
(32 bits), then a sign bit and ceil(log2(s + 1)) level bits a coordinate."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from rayfed.compression.base import FLOAT_BITS, Message, register_compressor, uniforms


class QSGD:
    unbiased = True

    def __init__(self, levels: int):
        self.levels = levels

    def variance_bound(self, size: int) -> float:
        return min(size / self.levels ** 2, math.sqrt(size) / self.levels)

    def compress(self, x: Tensor, generator: torch.Generator | None) -> Message:
        norm = x.norm()
        scaled = x.abs() * (self.levels / norm) if norm > 0 else torch.zeros_like(x)
        floor = scaled.floor()
        level = floor + (uniforms(x, generator) < scaled - floor).to(x.dtype)
        signed = (torch.sign(x) * level).to(torch.int16 if self.levels > 127 else torch.int8)
        bits = FLOAT_BITS + x.numel() * (1 + math.ceil(math.log2(self.levels + 1)))
        return Message({"norm": norm.reshape(1), "levels": signed}, bits)

    def decompress(self, message: Message, size: int) -> Tensor:
        norm = message.parts["norm"]
        return message.parts["levels"].to(norm.dtype) * (norm / self.levels)


@register_compressor("qsgd", keys={"levels": 4})
def _qsgd(compression) -> QSGD:
    """QSGD (Alistarh et al., NeurIPS 2017) with s = compression.levels."""
    return QSGD(compression.levels)
