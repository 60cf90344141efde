"""Exact sums of weighted float32 vectors: sum_i n_i x_i with integer weights n_i, held without
rounding, so that the sum does not depend on the order or the grouping of its terms.

A finite float32 is m 2^e with an integer m < 2^24 and -149 <= e <= 104, so n x (n < 2^31) is the
integer m n < 2^55 placed at bit e + 149 of a fixed-point number whose lowest bit is 2^-149
(float32's smallest subnormal). Each coordinate keeps that number as LIMBS int64 limbs of 32-bit
digits: a term adds at most 2^33 in magnitude to each limb it spans, and the 31 spare bits
of a limb absorb the carries of up to 2^29 terms before they are propagated (normalised). A stack of
terms is cut into digits in float64, where m n is exact below 2^53, and summed over its rows there,
exact below 2^53 too, before it reaches the limbs (ExactSum._add_columns). Adding accumulators is adding
their limbs, an integer sum: associative and commutative, so a sum formed by one worker or by
three is the same integer. Its float value is read from the canonical digits (carries propagated,
sign and magnitude apart), a function of the exact value alone, rounded to float64 and then, after
the division by the total weight, to float32.

Non-finite terms are kept as flags, as IEEE addition would combine them: a NaN, or +inf with -inf,
gives NaN; otherwise an infinity gives that infinity (0 x inf, a weight of zero on an infinity, is NaN).

Memory per coordinate: LIMBS x 8 = 88 bytes of limbs and one byte of flags (22x a float32). On the
wire a sum travels compacted (CompactSum): per coordinate the span of limbs that its digits need, 2
bytes and a sign bit, and 4 bytes per digit of the span. A sum of a few float32 terms of nearby
exponents spans 1 to 3 digits; above its span a coordinate's limbs only repeat its sign. The receiver
adds the span's digits into its own accumulator, on its device, without expanding them into limbs of
their own first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from rayfed.stored_arrays import owned_tensor

DIGIT_BITS = 32
# Terms touch limbs 0..9 (the top bit of m n at its highest place is 253 + 55 = 308); limb 10 holds
# the carries of up to MAX_TERMS terms, with its sign: |sum| < 2^31 * 2^308 < 2^(32 * 10 + 31).
LIMBS = 11
LOWEST_EXPONENT = -149
MAX_WEIGHT = 2 ** 31 - 1
MAX_TERMS = 2 ** 31
# Each term adds at most 2^33 to a limb; normalising before 2^29 of them keeps every limb within 2^62.
NORMALISE_EVERY = 2 ** 29
_DIGIT_MASK = (1 << DIGIT_BITS) - 1
_NAN, _POS_INF, _NEG_INF = 1, 2, 4
_NON_FINITE = 0x7F800000       # the bits of a float32's exponent field: all set for NaN and the infinities
# A term's digits are float64 integers below 2^32, summed over the rows exactly while below 2^53.
_MAX_ROWS = 2 ** 20
# Products m n are exact in float64 below 2^53: weights of 2^29 or more go in two parts.
_EXACT_WEIGHT = 2 ** 29
_WEIGHT_SPLIT = 2 ** 16
# Rows x columns of a chunk: large enough to spread each operation's fixed cost, small enough that
# its buffers (a few float64 digits per element) stay in cache on a CPU; a GPU takes larger chunks.
_CHUNK_ELEMENTS = 2 ** 17
_DEVICE_CHUNK_ELEMENTS = 2 ** 22


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
        weights = torch.as_tensor(weights, dtype=torch.int64, device=self.device).reshape(-1)
        weights = weights.expand(rows.shape[0]) if weights.numel() == 1 else weights
        if weights.numel() != rows.shape[0]:
            raise ValueError(f"{weights.numel()} weights for {rows.shape[0]} rows")
        if bool((weights < 0).any()) or bool((weights > MAX_WEIGHT).any()):
            raise ValueError(f"ExactSum weights must be integers in [0, {MAX_WEIGHT}]")
        self._count(rows.shape[0])
        rows = rows.to(self.device)
        for block in range(0, rows.shape[0], _MAX_ROWS):
            self._add_rows(rows[block:block + _MAX_ROWS], weights[block:block + _MAX_ROWS])
        return self

    def merge(self, other: "ExactSum | CompactSum") -> "ExactSum":
        """Adds another accumulator's sum, or a compacted one, of the same shape; in place, returns self."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge an ExactSum of shape {tuple(other.shape)} into one of {tuple(self.shape)}")
        if isinstance(other, CompactSum):
            self._add_compact(other.to(self.device))
            return self
        if self.pending + other.pending > NORMALISE_EVERY:
            self.normalise()
            other.normalise()
        # A normalised accumulator still adds up to 2^32 to each limb: one term's worth.
        self._count(other.terms, max(other.pending, 1))
        self.limbs += other.limbs.to(self.device)
        self.flags |= other.flags.to(self.flags.device)
        return self

    @property
    def device(self) -> torch.device:
        return self.limbs.device

    def value(self) -> Tensor:
        """The sum as float64 (of `shape`): the canonical digits added from the top, a function of
        the exact sum alone; NaN or an infinity where a term was one (see the module's docstring).
        It works on the limbs in place, and so is not safe beside another use of this sum."""
        self.normalise()
        negative = self.limbs[-1] < 0
        sign = 1 - 2 * negative.long()
        # The magnitude's digits in the limbs themselves, and the limbs back as they were (normalised limbs are
        # unique): a copy would cost more than the sum, in memory the kernel hands out zeroed page by page.
        self.limbs.mul_(sign)
        try:
            _propagate(self.limbs)
            total = torch.zeros(self.limbs.shape[1], dtype=torch.float64, device=self.device)
            for limb in reversed(range(LIMBS)):
                total += self.limbs[limb].to(torch.float64) * 2.0 ** (DIGIT_BITS * limb + LOWEST_EXPONENT)
        finally:
            self.limbs.mul_(sign)
            # Pending until normalised: a failure in between leaves limbs that the next use normalises.
            self.pending = 1
            self.normalise()
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

    def compact(self) -> "CompactSum":
        """The sum as it travels, formed on this sum's device."""
        self.normalise()
        negative = self.limbs[-1] < 0
        # Bit k: limb k is nonzero; limb k differs from the sign's repetition (all ones, the top limb -1, below zero).
        nonzero, significant = (torch.zeros(self.limbs.shape[1], dtype=torch.int16, device=self.device)
                                for _ in range(2))
        repeated = torch.where(negative, _DIGIT_MASK, 0)
        for limb in range(LIMBS):
            nonzero.add_(self.limbs[limb] != 0, alpha=1 << limb)
            significant.add_(self.limbs[limb] != (repeated if limb < LIMBS - 1 else -negative.long()), alpha=1 << limb)
        low = _LOWEST_BIT.to(self.device)[nonzero.long()]
        end = _BIT_LENGTH.to(self.device)[significant.long()]
        # A zero has no nonzero limb (low = LIMBS, end = 0): no digits. Any other coordinate has end >= low, a
        # negative one too: the zeros below its lowest nonzero limb differ from its sign's repetition.
        count = torch.where(end > low, end - low, 0)
        # Coordinate after coordinate, each its digits from the lowest, as int32: their low 32 bits.
        digits = self.limbs.view(-1)[_positions(low, count, int(count.sum()))]
        digits = digits.bitwise_and_(_DIGIT_MASK).bitwise_xor_(1 << 31).sub_(1 << 31).to(torch.int32)
        flagged = self.flags.nonzero().flatten()
        return CompactSum(tuple(self.shape), self.terms, low, count, negative, digits, flagged, self.flags[flagged])

    def __reduce__(self):
        return _expanded, (self.compact(),)

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

    def _add_compact(self, compact: "CompactSum") -> None:
        """Adds a compacted sum on this device. A coordinate is its span's digits, unsigned, less 2^(32 end) when
        negative (end = low + count): the limbs from `end` up repeat the sign, all ones and a top limb of -1,
        which sum to -2^(32 end). That lands in limb `end`, or in the top limb, as -2^32, when the span
        reaches it. Each limb gains at most one digit, less than 2^32: one term's worth."""
        self._count(compact.terms, 1)
        digits = compact.digits.to(torch.int64).bitwise_and_(_DIGIT_MASK)
        self.limbs.view(-1).index_add_(0, _positions(compact.low, compact.count, len(digits)), digits)
        below_zero = compact.negative.nonzero().flatten()
        end = (compact.low[below_zero] + compact.count[below_zero]).long()
        self.limbs.index_put_((end.clamp(max=LIMBS - 1), below_zero),
                              torch.where(end < LIMBS, -1, -(1 << DIGIT_BITS)), accumulate=True)
        self.flags[compact.flagged] |= compact.flags

    def _add_rows(self, rows: Tensor, weights: Tensor) -> None:
        """Adds at most _MAX_ROWS weighted rows, in chunks of columns."""
        largest_weight = int(weights.max()) if weights.numel() else 0
        if largest_weight < _EXACT_WEIGHT:
            parts = [(weights, largest_weight)]
        else:
            low = weights % _WEIGHT_SPLIT
            parts = [(low, int(low.max())), (weights - low, largest_weight)]
        parts = [(part.to(torch.float64), largest) for part, largest in parts if largest]
        elements = _CHUNK_ELEMENTS if rows.device.type == "cpu" else _DEVICE_CHUNK_ELEMENTS
        chunk = max(1, elements // max(1, rows.shape[0]))
        scratch = _Scratch(rows.shape[0], min(chunk, rows.shape[1]), rows.device)
        for start in range(0, rows.shape[1], chunk):
            self._add_columns(rows[:, start:start + chunk], weights, parts, start, scratch)

    def _add_columns(self, values: Tensor, weights: Tensor, parts: list[tuple[Tensor, int]], start: int,
                     scratch: "_Scratch") -> None:
        """Adds the weighted rows of the columns start.. of `values`; `parts`: the weights, or their two
        parts, as float64, each with its largest.

        A nonzero finite float32 is m 2^(place - 149) with place = e + 149 in [0, 253] and m < 2^24.
        Scaled by 2^(149 - 32 first), where `first` is the lowest limb that the chunk touches, n x is
        the integer m n 2^(place - 32 first), exact in float64 (m n < 2^53). It is cut into 32-bit
        digits from the bottom, v = 2^32 floor(v / 2^32) + digit: each digit an integer in [0, 2^32),
        so exact, and the top one, below 2^32 in magnitude, carrying the sign (two's complement, as
        the limbs hold it). Each digit is summed over the rows, exactly while below 2^53, before it
        reaches the limbs."""
        bits = values.view(torch.int32)
        below = scratch.int32_view(bits.shape[1])
        # Magnitude bits less 1: zeros become -1, below the rest, and wrap to the top of int32 when masked.
        torch.bitwise_and(bits, 0x7FFFFFFF, out=below).sub_(1)
        largest = int(below.max()) + 1 if below.numel() else 0
        if largest >= _NON_FINITE:      # NaN and the infinities go to the flags; their terms here are zeros
            self._flag(bits, weights, start)
            non_finite = below >= _NON_FINITE - 1
            values = values.masked_fill(non_finite, 0.0)
            largest = int(below.masked_fill_(non_finite, -1).max()) + 1
        if largest == 0:
            return
        smallest = int(below.bitwise_and_(0x7FFFFFFF).min()) + 1
        first = _place(smallest) // DIGIT_BITS
        for part, largest_weight in parts:
            # |m n 2^(place - 32 first)| < 2^top (m < 2^24): `digits` digits hold it.
            top = _place(largest) - DIGIT_BITS * first + 24 + largest_weight.bit_length()
            digits = -(-top // DIGIT_BITS)
            pieces = scratch.float64_view(bits.shape[1], digits)
            torch.mul(values, (part * 2.0 ** (-LOWEST_EXPONENT - DIGIT_BITS * first))[:, None], out=pieces[0])
            for digit in range(digits - 1):
                rest, above = pieces[digit], pieces[digit + 1]
                rest.sub_(torch.mul(rest, 2.0 ** -DIGIT_BITS, out=above).floor_(), alpha=2.0 ** DIGIT_BITS)
            self.limbs.narrow(0, first, digits).narrow(1, start, bits.shape[1]).add_(pieces.sum(dim=1).to(torch.int64))

    def _flag(self, bits: Tensor, weights: Tensor, start: int) -> None:
        negative = bits < 0
        non_finite = (bits & _NON_FINITE) == _NON_FINITE
        infinite = non_finite & ((bits & 0x7FFFFF) == 0)
        # IEEE: 0 x inf is NaN.
        nan = (non_finite & ~infinite) | (infinite & (weights[:, None] == 0))
        infinite = infinite & (weights[:, None] != 0)
        for bit, hit in ((_NAN, nan), (_POS_INF, infinite & ~negative), (_NEG_INF, infinite & negative)):
            self.flags[start:start + bits.shape[1]] |= hit.any(dim=0).to(torch.uint8) * bit


class _Scratch:
    """Buffers for the chunks of one add, reused by each: a fresh tensor for every operation would cost
    more than the operation (the allocator hands large blocks back, and the kernel zeroes their pages)."""

    def __init__(self, rows: int, columns: int, device: torch.device):
        self.rows = rows
        self.int32 = torch.empty(rows * columns, dtype=torch.int32, device=device)
        self.float64 = torch.empty(LIMBS - 1, rows * columns, dtype=torch.float64, device=device)

    def int32_view(self, columns: int) -> Tensor:
        """rows x columns."""
        return self.int32[:self.rows * columns].view(self.rows, columns)

    def float64_view(self, columns: int, digits: int) -> Tensor:
        """digits x rows x columns."""
        return self.float64[:digits, :self.rows * columns].view(digits, self.rows, columns)


def _place(magnitude: int) -> int:
    """e + 149 for the nonzero float32 of these magnitude bits: subnormals have exponent field 0 and
    e = -149, as do the normals of field 1 (with the implicit bit)."""
    return max((magnitude >> 23) - 1, 0)


def _propagate(limbs: Tensor) -> None:
    """Carries each limb's excess over 32 bits into the next (arithmetic shifts: floor division), in place."""
    for limb in range(LIMBS - 1):
        limbs[limb + 1] += limbs[limb] >> DIGIT_BITS
        limbs[limb] &= _DIGIT_MASK


def _positions(low: Tensor, count: Tensor, digits: int) -> Tensor:
    """Where the `digits` digits of the coordinates' spans, low .. low + count - 1, are in the flattened limbs,
    coordinate after coordinate."""
    count = count.long()
    numel = len(count)
    # The digit at place p of the list, of coordinate c whose digits start at place s_c, is in limb low_c + p - s_c:
    # at p numel + (c + (low_c - s_c) numel) of the flattened limbs.
    offsets = torch.arange(numel, device=count.device).add_(
        (low.long() + count).sub_(torch.cumsum(count, 0)).mul_(numel))
    return torch.arange(digits, device=count.device).mul_(numel).add_(
        torch.repeat_interleave(offsets, count, output_size=digits))


# For each LIMBS-bit mask: its lowest set bit (LIMBS when none), and one past its highest (0 when none).
_LOWEST_BIT = torch.tensor([(mask & -mask).bit_length() - 1 if mask else LIMBS for mask in range(1 << LIMBS)],
                           dtype=torch.uint8)
_BIT_LENGTH = torch.tensor([mask.bit_length() for mask in range(1 << LIMBS)], dtype=torch.uint8)


@dataclass(eq=False)
class CompactSum:
    """An ExactSum as it travels: per coordinate the lowest limb its digits need and how many (`low`,
    `count`, none for a zero) and whether it is below zero; the spans' digits one coordinate after
    another, as int32 (their 32 bits); the flags where they are nonzero. Pickled as numpy arrays, which
    Ray ships out of band, with the signs 8 to a byte; ExactSum.merge adds it."""

    shape: tuple[int, ...]
    terms: int
    low: Tensor
    count: Tensor
    negative: Tensor
    digits: Tensor
    flagged: Tensor
    flags: Tensor

    @property
    def device(self) -> torch.device:
        return self.low.device

    def to(self, device: torch.device | str) -> "CompactSum":
        return CompactSum(self.shape, self.terms, *(getattr(self, name).to(device) for name in _TENSORS))

    def __reduce__(self):
        arrays = {name: getattr(self, name).cpu().numpy() for name in _TENSORS}
        arrays["negative"] = np.packbits(arrays["negative"])
        return _compact_sum, (self.shape, self.terms, arrays)


_TENSORS = ("low", "count", "negative", "digits", "flagged", "flags")


def _compact_sum(shape: tuple[int, ...], terms: int, arrays: dict[str, np.ndarray]) -> CompactSum:
    arrays["negative"] = np.unpackbits(arrays["negative"], count=len(arrays["low"])).view(bool)
    return CompactSum(shape, terms, **{name: owned_tensor(array) for name, array in arrays.items()})


def _expanded(compact: CompactSum) -> ExactSum:
    return ExactSum(compact.shape).merge(compact)
