"""What a compressor is: a vector in, the message that travels out, and back.

A message holds its parts in the dtypes they are sent in (float32 values and headers, int32
indices, int8/int16 codes) and the exact number of bits a fixed-length encoding of them takes
: the traffic a run reports is what a deployment would send. Compressors are pure torch;
their random draws come from the generator they are given, the client's own stream for the round.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from rayfed.errors import ConfigError
from rayfed.registry import COMPRESSORS

FLOAT_BITS = 32
INDEX_BITS = 32


@dataclass
class Message:
    parts: dict[str, Tensor]    # what is sent, in its wire dtypes
    bits: int                   # its size under the operator's fixed-length code


class Compressor(Protocol):
    unbiased: bool

    def variance_bound(self, size: int) -> float | None:
        """q of E||Q(x) - x||^2 <= q ||x||^2 (Assumption 2) for vectors of `size`; None when biased."""

    def compress(self, x: Tensor, generator: torch.Generator | None) -> Message: ...

    def decompress(self, message: Message, size: int) -> Tensor: ...


def uniforms(like: Tensor, generator: torch.Generator | None) -> Tensor:
    """U[0, 1) draws shaped like `like`, from `generator` on the CPU (the same bits on any device)."""
    return torch.rand(like.shape, generator=generator, dtype=torch.float64).to(like.device, like.dtype)


def register_compressor(name: str, *, keys: dict[str, Any] | None = None):
    """Registers a compressor builder `(compression section) -> Compressor` under `name`
    (rayfed.register_compressor): compression.name then uses it. `keys`: the compression.* keys it
    takes (of levels, kept, ratio, bits, zero_point_noise) and their defaults; the others must stay unset."""
    def decorate(builder):
        if not callable(builder):
            raise ConfigError(f"register_compressor({name!r}) takes a function (compression section) -> Compressor")
        return COMPRESSORS.register(name, keys=dict(keys or {}))(builder)
    return decorate
