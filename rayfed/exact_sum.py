"""Exact sums of weighted float32 vectors: sum_i n_i x_i with integer weights n_i, held without
rounding, so that the sum does not depend on the order or the grouping of its terms.

A finite float32 is m 2^e with an integer m < 2^24 and -149 <= e <= 104, so n x (n < 2^31) is the
integer m n < 2^55 placed at bit e + 149 of a fixed-point number whose lowest bit is 2^-149
(float32's smallest subnormal). Each coordinate keeps that number as LIMBS int64 limbs of 32-bit
digits: a term adds its three digits to three limbs, and the 31 spare bits of a limb absorb the
carries of up to 2^29 terms before they are propagated (normalised). Adding accumulators is adding
their limbs, an integer sum: associative and commutative, so a sum formed by one worker or by
three is the same integer. Its float value is read from the canonical digits (carries propagated,
sign and magnitude apart), a function of the exact value alone, rounded to float64 and then, after
the division by the total weight, to float32.

Non-finite terms are kept as flags, as IEEE addition would combine them: a NaN, or +inf with -inf,
gives NaN; otherwise an infinity gives that infinity (0 x inf, a weight of zero on an infinity, is NaN).

Memory per coordinate: LIMBS x 8 = 88 bytes of limbs and one byte of flags (22x a float32). On the
wire (pickled) only the limb columns that hold a nonzero digit go, as 32-bit digits: 4 bytes per
coordinate for each such column (a model change whose coordinates span 2^-30 to 2^0 uses 3 or 4 of
the 11), plus the flags.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

DIGIT_BITS = 32
# Terms touch limbs 0..9 (the top bit of m n at its highest place is 253 + 55 = 308); limb 10 holds
# the carries of up to MAX_TERMS terms, with its sign: |sum| < 2^31 * 2^308 < 2^(32 * 10 + 31).
LIMBS = 11
LOWEST_EXPONENT = -149
MAX_WEIGHT = 2 ** 31 - 1
MAX_TERMS = 2 ** 31
# Each term adds less than 2^33 to a limb; normalising before 2^29 of them keeps every limb below 2^62.
NORMALISE_EVERY = 2 ** 29
_DIGIT_MASK = (1 << DIGIT_BITS) - 1
_NAN, _POS_INF, _NEG_INF = 1, 2, 4


class ExactSum:
    """The exact sum of weighted float32 vectors of one shape, held on `device`."""

    def __init__(self, shape: torch.Size | tuple[int, ...], device: torch.device | str = "cpu"):
        self.shape = torch.Size(shape)
        numel = self.shape.numel()
        self.limbs = torch.zeros(LIMBS, numel, dtype=torch.int64, device=device)     # limb-major: each limb contiguous
        self.flags = torch.zeros(numel, dtype=torch.uint8, device=device)
        self.terms = 0          # terms summed in all
        self.pending = 0        # terms added since the limbs were last normalised

    def add(self, values: Tensor, weights: Tensor | list[int] | int = 1) -> "ExactSum":
        """Adds sum_r weights[r] * values[r] for a stack of rows (rows, *shape), or weights * values for
        one value of `shape`; float32 values, integer weights in [0, 2^31). In place; returns self."""
        if values.dtype != torch.float32:
            raise TypeError(f"ExactSum adds float32 values, not {values.dtype}")
        if values.shape == self.shape:
            rows = values.reshape(1, -1)
        elif values.shape[1:] == self.shape:
            rows = values.reshape(len(values), -1)
        else:
            raise ValueError(f"ExactSum of shape {tuple(self.shape)} cannot add values of shape {tuple(values.shape)}")
        weights = torch.as_tensor(weights, dtype=torch.int64, device=self.limbs.device).reshape(-1)
        weights = weights.expand(rows.shape[0]) if weights.numel() == 1 else weights
        if weights.numel() != rows.shape[0]:
            raise ValueError(f"{weights.numel()} weights for {rows.shape[0]} rows")
        if bool((weights < 0).any()) or bool((weights > MAX_WEIGHT).any()):
            raise ValueError(f"ExactSum weights must be integers in [0, {MAX_WEIGHT}]")
        self._count(rows.shape[0])
        rows = rows.to(self.limbs.device)
        bits = rows.contiguous().view(torch.int32)
        negative = bits < 0
        exponent_field = (bits >> 23) & 0xFF
        fraction = bits & 0x7FFFFF
        finite = exponent_field != 0xFF
        # Normal numbers carry the implicit leading bit; subnormals have exponent field 0 and e = -149.
        mantissa = fraction | ((exponent_field > 0).to(torch.int32) << 23)
        signed = mantissa.masked_fill_(~finite, 0).to(torch.int64) * (1 - 2 * negative.to(torch.int64))
        place = (exponent_field - 1).clamp_(min=0)                      # e + 149
        self._scatter(signed * weights[:, None], place)                 # |m n| < 2^55
        if not bool(finite.all()):
            self._flag(~finite, fraction != 0, negative, weights)
        return self

    def merge(self, other: "ExactSum") -> "ExactSum":
        """Adds another accumulator's sum (of the same shape); in place, returns self."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge an ExactSum of shape {tuple(other.shape)} into one of {tuple(self.shape)}")
        if self.pending + other.pending > NORMALISE_EVERY:
            self.normalise()
            other.normalise()
        # A normalised accumulator still adds up to 2^32 to each limb: one term's worth.
        self._count(other.terms, max(other.pending, 1))
        self.limbs += other.limbs.to(self.limbs.device)
        self.flags |= other.flags.to(self.flags.device)
        return self

    def value(self) -> Tensor:
        """The sum as float64 (of `shape`): the canonical digits added from the top, a function of
        the exact sum alone; NaN or an infinity where a term was one (see the module's docstring)."""
        self.normalise()
        negative = self.limbs[-1] < 0
        magnitude = torch.where(negative, -self.limbs, self.limbs)
        _propagate(magnitude)
        total = torch.zeros(magnitude.shape[1], dtype=torch.float64, device=magnitude.device)
        for limb in reversed(range(LIMBS)):
            total += magnitude[limb].to(torch.float64) * 2.0 ** (DIGIT_BITS * limb + LOWEST_EXPONENT)
        total = torch.where(negative, -total, total)
        nan = (self.flags & _NAN).bool() | ((self.flags & _POS_INF).bool() & (self.flags & _NEG_INF).bool())
        total = torch.where((self.flags & _POS_INF).bool(), torch.inf, total)
        total = torch.where((self.flags & _NEG_INF).bool(), -torch.inf, total)
        return torch.where(nan, torch.nan, total).reshape(self.shape)

    def mean(self, divisor: int) -> Tensor:
        """value() / divisor, rounded to float32."""
        return (self.value() / divisor).to(torch.float32)

    def normalise(self) -> None:
        """Propagates the carries: digits 0..9 in [0, 2^32), the sign and the rest in the top limb."""
        if self.pending:
            _propagate(self.limbs)
            self.pending = 0

    def to(self, device: torch.device | str) -> "ExactSum":
        moved = ExactSum.__new__(ExactSum)
        moved.shape, moved.terms, moved.pending = self.shape, self.terms, self.pending
        moved.limbs, moved.flags = self.limbs.to(device), self.flags.to(device)
        return moved

    def __reduce__(self):
        """Pickled as the nonzero digit columns of the normalised limbs, 32 bits each, as numpy arrays."""
        self.normalise()
        used = self.limbs.any(dim=1).nonzero().flatten()
        # Digits below the top are in [0, 2^32); the top limb is small and goes as its 32-bit two's complement.
        columns = (self.limbs[used] & _DIGIT_MASK).cpu().numpy().astype(np.uint32)
        return _unpickle, (tuple(self.shape), used.cpu().numpy(), columns, self.flags.cpu().numpy(), self.terms)

    def __repr__(self) -> str:
        return f"ExactSum(shape={tuple(self.shape)}, terms={self.terms})"

    def _count(self, terms: int, pending: int | None = None) -> None:
        if self.terms + terms > MAX_TERMS:
            raise ValueError(f"an ExactSum holds at most {MAX_TERMS} terms")
        pending = terms if pending is None else pending
        if self.pending + pending > NORMALISE_EVERY:
            self.normalise()
        self.terms += terms
        self.pending += pending

    def _scatter(self, product: Tensor, place: Tensor) -> None:
        """Adds each row's signed product +-m n at its bit `place` into the limbs, as three digits:
        product = high 2^32 + low with low in [0, 2^32) (two's complement and arithmetic shifts keep
        that exact for negative products too)."""
        limb, shift = (place >> 5).to(torch.int64), (place & (DIGIT_BITS - 1)).to(torch.int64)
        low = (product & _DIGIT_MASK) << shift       # in [0, 2^63)
        high = (product >> DIGIT_BITS) << shift      # |high| < 2^54
        digits = (low & _DIGIT_MASK, (low >> DIGIT_BITS) + (high & _DIGIT_MASK), high >> DIGIT_BITS)
        width = self.limbs.shape[1]
        index = limb * width + torch.arange(width, device=self.limbs.device)
        flat = self.limbs.view(-1)
        for offset, digit in enumerate(digits):
            flat.index_add_(0, (index + offset * width).reshape(-1), digit.reshape(-1))

    def _flag(self, non_finite: Tensor, is_nan: Tensor, negative: Tensor, weights: Tensor) -> None:
        infinite = non_finite & ~is_nan
        # IEEE: 0 x inf is NaN.
        nan = (non_finite & is_nan) | (infinite & (weights[:, None] == 0))
        infinite = infinite & (weights[:, None] != 0)
        for bit, hit in ((_NAN, nan), (_POS_INF, infinite & ~negative), (_NEG_INF, infinite & negative)):
            self.flags |= hit.any(dim=0).to(torch.uint8) * bit


def _propagate(limbs: Tensor) -> None:
    """Carries each limb's excess over 32 bits into the next (arithmetic shifts: floor division), in place."""
    for limb in range(LIMBS - 1):
        limbs[limb + 1] += limbs[limb] >> DIGIT_BITS
        limbs[limb] &= _DIGIT_MASK


def _unpickle(shape: tuple[int, ...], used: np.ndarray, columns: np.ndarray, flags: np.ndarray,
              terms: int) -> ExactSum:
    total = ExactSum(shape)
    digits = columns.astype(np.int64)
    top = used == LIMBS - 1
    digits[top] = columns[top].view(np.int32)
    total.limbs[torch.from_numpy(used.astype(np.int64))] = torch.from_numpy(digits)
    total.flags = torch.from_numpy(flags.copy())
    total.terms = terms
    return total
