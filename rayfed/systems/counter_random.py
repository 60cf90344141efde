"""Counter-based uniforms: draw (seed, stream, client, counter) directly, without the draws before it.

A sequential generator's k-th value depends on how many were taken before; here every value is
a hash of its coordinates, so a client's availability at round r is the same whichever rounds or
times were asked about first, and 100 000 clients cost one vectorised hash, not 100 000 generators.
"""
import numpy as np

UINT64_MASK = (1 << 64) - 1
# SplitMix64's increment: adding it before each mix keeps an all-zero input from hashing to zero.
GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
MANTISSA_BITS = 52
_DROPPED_BITS = np.uint64(64 - MANTISSA_BITS)
_MIXES = ((np.uint64(30), np.uint64(0xBF58476D1CE4E5B9)), (np.uint64(27), np.uint64(0x94D049BB133111EB)))
_LAST_SHIFT = np.uint64(31)
# Clients hashed together by ClientUniforms.below: two uint64 blocks of 256 KiB stay in a core's L2 cache, where
# the hash's ten passes run 2-2.5x faster than over all clients at once (N = 10^6, 2-core EPYC).
_BLOCK = 1 << 15


def uniform(seed: int, stream: int, client_ids: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """float64 in the open interval (0, 1), one per element of broadcast(client_ids, counters)."""
    clients, steps = np.broadcast_arrays(np.asarray(client_ids), np.asarray(counters))
    # uint64 products are meant to wrap modulo 2**64; numpy only warns about it on scalars.
    with np.errstate(over="ignore"):
        bits = _absorb(_absorb(_key(seed, stream), clients.astype(np.uint64)), steps.astype(np.uint64))
    return _open_unit_interval(bits)


class ClientUniforms:
    """uniform(seed, stream, client_ids, counter) for fixed clients and one counter at a time, the same floats:
    the clients' part of the hash is absorbed once, so each counter costs half the hashing."""

    def __init__(self, seed: int, stream: int, client_ids: np.ndarray):
        with np.errstate(over="ignore"):
            self.keyed_clients = _absorb(_key(seed, stream), np.asarray(client_ids).astype(np.uint64))

    def at(self, counter: int) -> np.ndarray:
        with np.errstate(over="ignore"):
            return _open_unit_interval(_absorb(self.keyed_clients, np.uint64(counter)))

    def below(self, counter: int, thresholds: np.ndarray) -> np.ndarray:
        """bool, at(counter) < p for one-dimensional clients, where `thresholds` = uniform_thresholds(p): the same
        answers without forming the floats, hashed in place a block of clients at a time."""
        count = len(self.keyed_clients)
        if thresholds.dtype != np.uint64 or thresholds.shape != (count,):
            raise ValueError(f"below takes uniform_thresholds of the {count} clients, not {thresholds.dtype} of shape "
                             f"{thresholds.shape}")
        below = np.empty(count, dtype=bool)
        bits, scratch = np.empty(min(count, _BLOCK), np.uint64), np.empty(min(count, _BLOCK), np.uint64)
        word = np.uint64(counter)
        with np.errstate(over="ignore"):
            for start in range(0, count, _BLOCK):
                stop = min(start + _BLOCK, count)
                block, spare = bits[:stop - start], scratch[:stop - start]
                np.bitwise_xor(self.keyed_clients[start:stop], word, out=block)
                np.add(block, GOLDEN_GAMMA, out=block)
                _splitmix64_finalize_in_place(block, spare)
                np.right_shift(block, _DROPPED_BITS, out=block)
                np.less(block, thresholds[start:stop], out=below[start:stop])
        return below


def uniform_thresholds(probabilities: np.ndarray) -> np.ndarray:
    """uint64 t per probability p such that a draw of `uniform` is below p exactly when its top 52 bits k are below
    t. The draw is (k + 0.5) / 2**52, so it is below p when k < p * 2**52 - 0.5: t = ceil(p * 2**52 - 0.5). The
    product is exact (a power of two), and so is the difference where the product is at least 1 (0.5 is a
    multiple of the difference's spacing); below 1 it may round, but not across 0, so the ceiling is still 0
    (never below) or 1 (below for k = 0)."""
    return np.ceil(np.asarray(probabilities, dtype=np.float64) * 2.0 ** MANTISSA_BITS - 0.5).astype(np.uint64)


def _key(seed: int, stream: int):
    return _absorb(_absorb(np.uint64(0), np.uint64(int(seed) & UINT64_MASK)), np.uint64(int(stream) & UINT64_MASK))


def _absorb(state, word):
    """Folds one 64-bit word into the hash state; for a fixed state, distinct words give distinct states."""
    return _splitmix64_finalizer((state ^ word) + GOLDEN_GAMMA)


def _splitmix64_finalizer(bits):
    """A bijection on uint64 in which every input bit flips about half the output bits."""
    for shift, multiplier in _MIXES:
        bits = (bits ^ (bits >> shift)) * multiplier
    return bits ^ (bits >> _LAST_SHIFT)


def _splitmix64_finalize_in_place(bits: np.ndarray, scratch: np.ndarray) -> None:
    """bits = _splitmix64_finalizer(bits), with `scratch` (bits' shape) as the only temporary."""
    for shift, multiplier in _MIXES:
        np.right_shift(bits, shift, out=scratch)
        np.bitwise_xor(bits, scratch, out=bits)
        np.multiply(bits, multiplier, out=bits)
    np.right_shift(bits, _LAST_SHIFT, out=scratch)
    np.bitwise_xor(bits, scratch, out=bits)


def _open_unit_interval(bits: np.ndarray) -> np.ndarray:
    """(k + 0.5) / 2**52 for the top 52 bits k: k + 0.5 still fits a float64 mantissa exactly,
    so the result can be neither 0 nor 1 and -log(u) is always finite."""
    top = (np.asarray(bits, dtype=np.uint64) >> _DROPPED_BITS).astype(np.float64)
    return (top + 0.5) * 2.0 ** -MANTISSA_BITS
