"""Affine b-bit integer quantizers (FedCOM's experiments, arXiv:2007.01154, Sec. B).

`Affine` is FedTorch's quantizer with a zero-point, the one the paper's experiments used: codes
round(clamp(z + (x_i - mean)/scale, qmin, qmax)) in [-2^(b-1), 2^(b-1) - 1], scale = (max - min) /
(qmax - qmin) (0.001 for a constant vector), z = trunc(clamp(qmin - (min - mean)/scale)); decoded
scale (code - z) + mean. Deterministic, slightly biased, error at most scale a coordinate; b d bits
plus scale, z and mean as three float32. With `zero_point_noise` N_z (Fig. 9a) the codes are made
with z + zeta, zeta ~ U{-N_z..N_z} once a message, and decoded with z: a common zero-mean shift
(none for a constant vector, which is sent as without noise).

`AffineStochastic` rounds each coordinate to one of the 2^b levels min + i (max - min)/(2^b - 1),
up with the probability that makes it unbiased; b d bits plus min and the step.
"""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.compression.base import FLOAT_BITS, Message, register_compressor, uniforms

# FedTorch's stand-in scale for a constant vector, whose range is 0.
CONSTANT_SCALE = 0.001


def _code_dtype(bits: int) -> torch.dtype:
    return torch.int8 if bits <= 8 else torch.int16


class Affine:
    unbiased = False

    def __init__(self, bits: int = 8, zero_point_noise: int = 0):
        self.bits = bits
        self.zero_point_noise = zero_point_noise
        self.qmin, self.qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1

    def variance_bound(self, size: int) -> None:
        return None

    def compress(self, x: Tensor, generator: torch.Generator | None = None) -> Message:
        lo, hi, mean = x.min(), x.max(), x.mean()
        scale = (hi - lo) / (self.qmax - self.qmin)
        scale = torch.where(scale == 0, torch.full_like(scale, CONSTANT_SCALE), scale)
        zero_point = torch.trunc(torch.clamp(self.qmin - (lo - mean) / scale, self.qmin, self.qmax))
        shifted = zero_point
        if self.zero_point_noise:
            zeta = torch.randint(-self.zero_point_noise, self.zero_point_noise + 1, (1,), generator=generator)
            # A constant vector (0 included) has no range to be noisy in: the stand-in scale is no signal.
            shifted = zero_point + zeta.to(x.device, x.dtype)[0] * (hi > lo)
        codes = torch.round(torch.clamp(shifted + (x - mean) / scale, self.qmin, self.qmax))
        header = torch.stack([scale, zero_point, mean])
        return Message({"codes": codes.to(_code_dtype(self.bits)), "header": header},
                       self.bits * x.numel() + 3 * FLOAT_BITS)

    def decompress(self, message: Message, size: int) -> Tensor:
        scale, zero_point, mean = message.parts["header"]
        return scale * (message.parts["codes"].to(scale.dtype) - zero_point) + mean


class AffineStochastic:
    unbiased = True

    def __init__(self, bits: int = 8):
        self.bits = bits
        self.top = 2 ** bits - 1

    def variance_bound(self, size: int) -> float:
        return size / self.top ** 2

    def compress(self, x: Tensor, generator: torch.Generator | None) -> Message:
        lo, hi = x.min(), x.max()
        step = (hi - lo) / self.top
        position = (x - lo) / step if step > 0 else torch.zeros_like(x)
        floor = position.floor()
        codes = floor + (uniforms(x, generator) < position - floor).to(x.dtype)
        codes = torch.clamp(codes, 0, self.top) - 2 ** (self.bits - 1)      # signed storage of b-bit codes
        return Message({"codes": codes.to(_code_dtype(self.bits)), "header": torch.stack([lo, step])},
                       self.bits * x.numel() + 2 * FLOAT_BITS)

    def decompress(self, message: Message, size: int) -> Tensor:
        lo, step = message.parts["header"]
        return lo + (message.parts["codes"].to(lo.dtype) + 2 ** (self.bits - 1)) * step


@register_compressor("affine", keys={"bits": 8, "zero_point_noise": 0})
def _affine(compression) -> Affine:
    """b-bit affine quantisation with a zero point (FedCOM's code); zero_point_noise N_z makes it AffineNoisy."""
    return Affine(compression.bits, compression.zero_point_noise)


@register_compressor("affine_stochastic", keys={"bits": 8})
def _affine_stochastic(compression) -> AffineStochastic:
    """b-bit affine quantisation with stochastic rounding (unbiased)."""
    return AffineStochastic(compression.bits)
