"""Compression of uploads (FedCOM, arXiv:2007.01154): the operators, one small module each, whole-vector
or per parameter tensor, and their construction from the compression.* keys."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.compression.affine import Affine, AffineStochastic
from rayfed.compression.base import FLOAT_BITS, Compressor, Message, register_compressor
from rayfed.compression.identity import Identity
from rayfed.compression.qsgd import QSGD
from rayfed.compression.sparse import RandK, TopK
from rayfed.registry import COMPRESSORS
# Upload tensors "update:codes", "update:header" are the parts of the message that carries "update".
MESSAGE_SEPARATOR = ":"


class PerTensor:
    """`compressor` applied to each parameter tensor's block of the flat vector on its own (the
    authors' code); headers are paid once a tensor."""

    def __init__(self, compressor: Compressor, blocks: list[tuple[int, int]]):
        self.compressor = compressor
        self.blocks = blocks
        self.unbiased = compressor.unbiased

    def variance_bound(self, size: int) -> float | None:
        bounds = [self.compressor.variance_bound(end - start) for start, end in self.blocks]
        return None if any(b is None for b in bounds) else max(bounds)

    def compress(self, x: Tensor, generator: torch.Generator | None) -> Message:
        parts, bits = {}, 0
        for number, (start, end) in enumerate(self.blocks):
            message = self.compressor.compress(x[start:end], generator)
            parts.update({f"{number}.{name}": part for name, part in message.parts.items()})
            bits += message.bits
        return Message(parts, bits)

    def decompress(self, message: Message, size: int) -> Tensor:
        pieces = []
        for number, (start, end) in enumerate(self.blocks):
            prefix = f"{number}."
            own = Message({name[len(prefix):]: part for name, part in message.parts.items()
                           if name.startswith(prefix)}, 0)
            pieces.append(self.compressor.decompress(own, end - start))
        return torch.cat(pieces)


def build_compressor(compression, blocks: list[tuple[int, int]]) -> Compressor:
    """The operator of the compression section (name, levels, kept, ratio, bits, zero_point_noise,
    per_tensor); `blocks` are the model's parameter tensors as (start, end) of the flat vector."""
    operator = COMPRESSORS.get(compression.name).target(compression)
    return PerTensor(operator, blocks) if compression.per_tensor and blocks else operator


__all__ = ["register_compressor", "FLOAT_BITS", "MESSAGE_SEPARATOR", "decode_upload", "Affine", "AffineStochastic", "Compressor", "Identity", "Message",
           "PerTensor", "QSGD", "RandK", "TopK", "build_compressor"]


def decode_upload(tensors: dict[str, Tensor], name: str, compressor: Compressor, size: int) -> dict[str, Tensor]:
    """`tensors` with the message parts "name:part" replaced by the vector `name` they decode to."""
    prefix = name + MESSAGE_SEPARATOR
    parts = {key[len(prefix):]: value for key, value in tensors.items() if key.startswith(prefix)}
    decoded = {key: value for key, value in tensors.items() if not key.startswith(prefix)}
    decoded[name] = compressor.decompress(Message(parts, 0), size)
    return decoded
