"""No compression: the vector itself, 32 bits a coordinate."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.compression.base import FLOAT_BITS, Message


class Identity:
    unbiased = True

    def variance_bound(self, size: int) -> float:
        return 0.0

    def compress(self, x: Tensor, generator: torch.Generator | None = None) -> Message:
        return Message({"values": x}, FLOAT_BITS * x.numel())

    def decompress(self, message: Message, size: int) -> Tensor:
        return message.parts["values"]
