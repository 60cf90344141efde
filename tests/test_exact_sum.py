"""The exact sum of weighted float32 vectors: exact, independent of order and grouping, IEEE on non-finite terms."""
import math
import pickle
import random
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch

from rayfed import exact_sum
from rayfed.exact_sum import LIMBS, LOWEST_EXPONENT, ExactSum

INF, NAN = float("inf"), float("nan")


def awkward_values(rows: int, columns: int, seed: int = 0) -> torch.Tensor:
    """Mixed signs and magnitudes from subnormals (2^-149) to float32's largest."""
    generator = torch.Generator().manual_seed(seed)
    mantissas = torch.rand(rows, columns, generator=generator) * 2 - 1
    exponents = torch.randint(-150, 128, (rows, columns), generator=generator).float()
    values = (mantissas.double() * torch.exp2(exponents.double())).float()
    values[~torch.isfinite(values)] = 1.0
    values[:, 0] = torch.tensor([2.0 ** -149, -(2.0 ** -149)] * (rows // 2) + [0.0] * (rows % 2))
    values[0, 1], values[1, 1] = torch.finfo(torch.float32).max, -torch.finfo(torch.float32).max
    return values


def exact(values: torch.Tensor, weights: list[int]) -> list[Fraction]:
    return [sum(Fraction(float(values[row, column])) * weight for row, weight in enumerate(weights))
            for column in range(values.shape[1])]


def held(total: ExactSum) -> list[Fraction]:
    """The value the limbs hold, read as Python integers."""
    total.normalise()
    limbs = total.limbs.tolist()
    return [sum(Fraction(limbs[limb][column]) * 2 ** (32 * limb) for limb in range(LIMBS)) * Fraction(2) ** LOWEST_EXPONENT
            for column in range(total.limbs.shape[1])]


WEIGHTS = [1, 3, 2 ** 31 - 1, 0, 77, 64, 5]


def test_the_limbs_hold_the_exact_sum():
    values = awkward_values(len(WEIGHTS), 300)
    total = ExactSum((300,)).add(values, WEIGHTS)
    assert held(total) == exact(values, WEIGHTS)
    largest, tiny = torch.finfo(torch.float32).max, 2.0 ** -149
    cancelling = torch.tensor([[largest, tiny, 0.75], [tiny, -tiny, 0.0], [-largest, 0.0, -0.75]])
    assert held(ExactSum((3,)).add(cancelling, [7, 5, 7])) == [Fraction(5 * tiny), Fraction(2 * tiny), Fraction(0)]


def test_the_value_is_the_exact_sum_rounded_to_float64():
    values = awkward_values(len(WEIGHTS), 300, seed=1)
    value = ExactSum((300,)).add(values, WEIGHTS).value().tolist()
    for got, want in zip(value, exact(values, WEIGHTS)):
        assert abs(Fraction(got) - want) <= abs(want) * Fraction(1, 2 ** 51)
    cancelled = torch.tensor([[3.0e38, 1.0e-45], [-3.0e38, 0.0]])
    assert ExactSum((2,)).add(cancelled).value().tolist() == [0.0, float(Fraction(float(torch.tensor(1e-45))))]


def test_row_by_row_and_stacked_sums_agree_with_small_integer_fsum():
    values = torch.randn(9, 200, generator=torch.Generator().manual_seed(2))
    weights = list(range(1, 10))
    stacked = ExactSum((200,)).add(values, weights)
    by_row = ExactSum((200,))
    for row, weight in zip(values, weights):
        by_row.add(row, weight)
    assert torch.equal(stacked.value(), by_row.value())
    # Products of float32 and integers below 2^29 are exact in float64, so fsum rounds the exact sum once.
    fsum = [math.fsum(float(values[row, column]) * weights[row] for row in range(9)) for column in range(200)]
    assert all(abs(got - want) <= abs(want) * 2 ** -51 for got, want in zip(stacked.value().tolist(), fsum))


def test_any_order_and_grouping_gives_the_same_bits():
    values = awkward_values(len(WEIGHTS), 500, seed=3)
    reference = ExactSum((500,)).add(values, WEIGHTS)
    rows = list(range(len(WEIGHTS)))
    for seed in range(5):
        random.Random(seed).shuffle(rows)
        cut = 1 + seed % (len(rows) - 1)
        parts = [ExactSum((500,)), ExactSum((500,))]
        for position, row in enumerate(rows):
            parts[position >= cut].add(values[row], WEIGHTS[row])
        # One part travels as a worker's would (pickled), and the parts merge in either order.
        first, second = (pickle.loads(pickle.dumps(parts[0])), parts[1]) if seed % 2 else (parts[1], parts[0])
        total = ExactSum((500,)).merge(first).merge(second)
        assert torch.equal(total.value(), reference.value())
        assert torch.equal(total.mean(sum(WEIGHTS)), reference.mean(sum(WEIGHTS)))
        reference.normalise()
        total.normalise()
        assert torch.equal(total.limbs, reference.limbs)


def test_carries_are_propagated_before_a_limb_could_overflow(monkeypatch):
    monkeypatch.setattr(exact_sum, "NORMALISE_EVERY", 3)
    values = awkward_values(len(WEIGHTS), 100, seed=4)
    total = ExactSum((100,))
    for row, weight in zip(values, WEIGHTS):
        total.add(row, weight)
        assert total.pending <= 3
    assert held(total) == exact(values, WEIGHTS)


@pytest.mark.parametrize("terms, weights, expected", [
    ([INF, 1.0], [1, 1], INF),
    ([-INF, 1.0], [1, 5], -INF),
    ([INF, INF], [1, 2], INF),
    ([INF, -INF], [1, 1], NAN),
    ([NAN, 1.0], [1, 1], NAN),
    ([NAN, INF], [1, 1], NAN),
    ([INF, 2.0], [0, 1], NAN),         # IEEE: 0 x inf
    ([NAN, 2.0], [0, 1], NAN),
    ([3.0e38, 3.0e38], [1, 1], 6.0e38),  # finite float32 terms whose sum only float64 holds
])
def test_non_finite_terms_combine_as_ieee_addition(terms, weights, expected):
    column = torch.tensor(terms, dtype=torch.float32)[:, None]
    split = ExactSum((1,)).add(column[:1], weights[:1]).merge(ExactSum((1,)).add(column[1:], weights[1:]))
    for total in (ExactSum((1,)).add(column, weights), split, pickle.loads(pickle.dumps(split))):
        got = total.value().item()
        assert (got != got) if expected != expected else got == pytest.approx(expected, rel=1e-7)
    # The mean of two terms is finite exactly when their sum is: 6e38 / 2 fits float32 although 6e38 does not.
    assert torch.isfinite(split.mean(2)).item() == math.isfinite(expected)


def test_what_it_refuses():
    total = ExactSum((3,))
    with pytest.raises(TypeError, match="^ExactSum adds float32 values, not torch.float64$"):
        total.add(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^ExactSum weights must be integers in \[0, 2147483647\]$"):
        total.add(torch.zeros(3), -1)
    with pytest.raises(ValueError, match=r"^ExactSum of shape \(3,\) cannot add values of shape \(4,\)$"):
        total.add(torch.zeros(4))
    with pytest.raises(ValueError, match=r"^cannot merge an ExactSum of shape \(2,\) into one of \(3,\)$"):
        total.merge(ExactSum((2,)))


def test_an_empty_vector_and_a_matrix_shape():
    assert ExactSum((0,)).add(torch.zeros(4, 0), [1, 2, 3, 4]).value().shape == (0,)
    matrix = torch.randn(2, 3)
    assert torch.equal(ExactSum((2, 3)).add(matrix).mean(1), matrix)


def scattered(values: torch.Tensor, weights: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised limbs and flags as the first ExactSum formed them: each term +-m n split into three
    int64 digits at its limb and added there with index_add_, the reference for the faster add."""
    bits = values.reshape(len(values), -1).view(torch.int32)
    weight = torch.tensor(weights, dtype=torch.int64)[:, None]
    exponent_field, fraction, negative = (bits >> 23) & 0xFF, bits & 0x7FFFFF, bits < 0
    finite = exponent_field != 0xFF
    mantissa = (fraction | ((exponent_field > 0).to(torch.int32) << 23)).masked_fill(~finite, 0)
    product = mantissa.to(torch.int64) * torch.where(negative, -1, 1) * weight
    place = (exponent_field - 1).clamp(min=0).to(torch.int64)
    low, high = (product & 0xFFFFFFFF) << (place & 31), (product >> 32) << (place & 31)
    width = bits.shape[1]
    limbs = torch.zeros(LIMBS * width, dtype=torch.int64)
    index = (place >> 5) * width + torch.arange(width)
    for offset, digit in enumerate((low & 0xFFFFFFFF, (low >> 32) + (high & 0xFFFFFFFF), high >> 32)):
        limbs.index_add_(0, (index + offset * width).reshape(-1), digit.reshape(-1))
    limbs = limbs.view(LIMBS, width)
    exact_sum._propagate(limbs)
    infinite = ~finite & (fraction == 0)
    nan = (~finite & (fraction != 0)) | (infinite & (weight == 0))
    infinite &= weight != 0
    hits = ((exact_sum._NAN, nan), (exact_sum._POS_INF, infinite & ~negative), (exact_sum._NEG_INF, infinite & negative))
    flags = sum(hit.any(dim=0).to(torch.uint8) * bit for bit, hit in hits)
    return limbs, flags


def stacks():
    """(values, weights): model changes, awkward magnitudes, extremes that cancel, non-finite terms
    with zero weights, weights on both sides of 2^29 and of 2^16, and many rows."""
    generator = torch.Generator().manual_seed(5)
    scales = 10.0 ** torch.empty(12, 3000).uniform_(-8, -1, generator=generator)
    changes = torch.randn(12, 3000, generator=generator) * scales
    yield changes, torch.randint(1, 700, (12,), generator=generator).tolist()
    yield changes, [1] * 12
    yield awkward_values(len(WEIGHTS), 2000, seed=6), WEIGHTS
    largest, tiny = torch.finfo(torch.float32).max, 2.0 ** -149
    extremes = torch.tensor([[largest, -largest, tiny, -tiny, largest, 1.0, -0.0],
                             [-largest, largest, -tiny, tiny, largest, -(2.0 ** -126), 0.0],
                             [tiny, -tiny, largest, -largest, -largest, 2.0 ** -127, tiny]])
    for weights in ([2 ** 31 - 1, 2 ** 31 - 1, 2 ** 29], [2 ** 29 - 1, 2 ** 29, 65535], [65536, 0, 1]):
        yield extremes, weights
    non_finite = awkward_values(6, 500, seed=7)
    non_finite[0, :100:3], non_finite[1, 50:150:4], non_finite[2, 20:300:5] = INF, -INF, NAN
    non_finite[3, :200:7] = INF
    yield non_finite, [5, 2 ** 31 - 1, 1, 0, 3, 2 ** 16]
    yield awkward_values(1500, 40, seed=8), torch.randint(0, 2 ** 31, (1500,), generator=generator).tolist()


@pytest.mark.parametrize("chunk_elements, max_rows", [(exact_sum._CHUNK_ELEMENTS, exact_sum._MAX_ROWS), (60, 7)])
def test_the_add_gives_the_limbs_and_flags_of_the_reference_scatter(monkeypatch, chunk_elements, max_rows):
    monkeypatch.setattr(exact_sum, "_CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(exact_sum, "_MAX_ROWS", max_rows)
    for values, weights in stacks():
        total = ExactSum(values.shape[1:]).add(values, weights)
        total.normalise()
        limbs, flags = scattered(values, weights)
        assert torch.equal(total.limbs, limbs)
        assert torch.equal(total.flags, flags)
        # Where a term is not finite the value is what float64 addition gives: NaN, or that infinity.
        reference = (values.double() * torch.tensor(weights, dtype=torch.float64)[:, None]).sum(dim=0)
        value = total.value()
        assert torch.equal(value.isnan(), reference.isnan())
        assert torch.equal(value[reference.isinf()], reference[reference.isinf()])


def test_more_rows_than_float64_sums_hold_exactly():
    # 65537 255 (2^8 + 1) = 2^32 - 1 at a limb's lowest bit: the odd sum of 2^21 + 1 such digits
    # passes 2^53, where float64 holds only even integers.
    x = float(65537 * 255 * 2 ** 11)
    rows = 2 ** 21 + 1
    total = ExactSum((2,)).add(torch.tensor([[x, -x]]).expand(rows, 2), 257)
    assert held(total) == [Fraction(x) * 257 * rows, -Fraction(x) * 257 * rows]


def edge_coordinates() -> list[ExactSum]:
    """Sums whose normalised limbs test the compaction: zero; negatives whose limbs from the lowest nonzero one up are
    all ones (-2^-149, and -2^-117 a limb up); +-1, one digit each; sums so large that the top limb is more than a
    sign (5000 terms of float32's largest with the largest weight: about 2^187, against 2^171 at the top limb)."""
    largest, tiny = torch.finfo(torch.float32).max, 2.0 ** -149
    return [ExactSum((5,)).add(torch.tensor([0.0, -tiny, -tiny * 2.0 ** 32, 1.0, -1.0])),
            ExactSum((3,)).add(torch.tensor([[largest, -largest, 1.0]]).expand(5000, 3), 2 ** 31 - 1)]


def from_object_store(compact: exact_sum.CompactSum) -> exact_sum.CompactSum:
    """`compact` rebuilt as Ray rebuilds it from its object store: from read-only arrays, which the rebuilt sum
    must copy (torch warns when it is handed one, and writing into it would write into the store)."""
    rebuild, (shape, terms, arrays) = compact.__reduce__()
    for array in arrays.values():
        array.flags.writeable = False
    stored = dict(arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rebuilt = rebuild(shape, terms, arrays)
    assert not any(np.shares_memory(getattr(rebuilt, name).numpy(), array) for name, array in stored.items())
    return rebuilt


def test_a_compacted_sum_adds_the_limbs_and_flags_it_was_compacted_from():
    sums = [ExactSum(values.shape[1:]).add(values, weights) for values, weights in stacks()] + edge_coordinates()
    for total in sums:
        total.normalise()
        limbs, flags = total.limbs.clone(), total.flags.clone()
        shipped = pickle.loads(pickle.dumps(total.compact()))
        for compact in (total.compact(), shipped, from_object_store(total.compact())):
            expanded = ExactSum(total.shape).merge(compact)
            expanded.normalise()
            assert torch.equal(expanded.limbs, limbs) and torch.equal(expanded.flags, flags)
        # Added to a sum: the same limbs as adding the sum itself.
        other = ExactSum(total.shape).add(awkward_values(3, total.shape.numel(), seed=9), [7, 1, 2 ** 20])
        via_compact, via_limbs = ExactSum(total.shape).merge(other).merge(total.compact()), other.merge(total)
        via_compact.normalise()
        via_limbs.normalise()
        assert torch.equal(via_compact.limbs, via_limbs.limbs) and torch.equal(via_compact.flags, via_limbs.flags)
        # Reading the value leaves the limbs as they were.
        total.value()
        assert torch.equal(total.limbs, limbs)
    small_sum, large_sum = sums[-2:]        # the edge coordinates, normalised above
    assert large_sum.limbs[-1, :2].tolist() == [1, -2]
    small, large = small_sum.compact(), large_sum.compact()
    assert small.low.tolist() == [LIMBS, 0, 1, 4, 4] and small.count.tolist() == [0, 0, 0, 1, 1]
    assert small.negative.tolist() == [False, True, True, False, True]
    assert large.low[0] + large.count[0] == large.low[1] + large.count[1] == LIMBS


def test_a_compacted_sum_carries_each_coordinates_digits_whatever_its_sign():
    changes = torch.randn(5, 10_000, generator=torch.Generator().manual_seed(10)) * 1e-2
    positive, negative = (ExactSum((10_000,)).add(sign * changes.abs(), [50] * 5).compact() for sign in (1, -1))
    assert torch.equal(positive.count, negative.count) and torch.equal(positive.low, negative.low)
    # One to three 32-bit digits a coordinate, against the 9 limbs from the lowest up of a negative one.
    assert set(negative.count.tolist()) <= {1, 2, 3} and negative.digits.numel() == int(negative.count.sum())
    assert len(pickle.dumps(negative)) < 10_000 * (4 * 3 + 2 + 1)
