"""No compression: the vector itself, 32 bits a coordinate."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.compression.base import FLOAT_BITS, Message, register_compressor


class Identity:
    unbiased = True

    def variance_bound(self, size: int) -> float:
        return 0.0

    def compress(self, x: Tensor, generator: torch.Generator | None = None) -> Message:
        return Message({"values": x}, FLOAT_BITS * x.numel())

    def decompress(self, message: Message, size: int) -> Tensor:
        return message.parts["values"]


@register_compressor("identity")
def _identity(compression) -> Identity:
    """No compression: the update travels as float32."""
    return Identity()
