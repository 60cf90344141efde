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


def _key(seed: int, stream: int):
    return _absorb(_absorb(np.uint64(0), np.uint64(int(seed) & UINT64_MASK)), np.uint64(int(stream) & UINT64_MASK))


def _absorb(state, word):
    """Folds one 64-bit word into the hash state; for a fixed state, distinct words give distinct states."""
    return _splitmix64_finalizer((state ^ word) + GOLDEN_GAMMA)


def _splitmix64_finalizer(bits):
    """A bijection on uint64 in which every input bit flips about half the output bits."""
    bits = (bits ^ (bits >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    bits = (bits ^ (bits >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return bits ^ (bits >> np.uint64(31))


def _open_unit_interval(bits: np.ndarray) -> np.ndarray:
    """(k + 0.5) / 2**52 for the top 52 bits k: k + 0.5 still fits a float64 mantissa exactly,
    so the result can be neither 0 nor 1 and -log(u) is always finite."""
    top = (np.asarray(bits, dtype=np.uint64) >> np.uint64(64 - MANTISSA_BITS)).astype(np.float64)
    return (top + 0.5) * 2.0 ** -MANTISSA_BITS
