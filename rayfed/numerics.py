"""Float64 inner products of float32 vectors without float64 copies of whole matrices.

The QP algebra runs in float64, but casting an m x d memory with
d = 10^6 to float64 would take 800 MB; chunking over d keeps the temporary small while the
products and their sums are float64.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

# Float64 elements of the temporaries per chunk (2 MB): small enough to stay in cache, which
# matters more than the number of chunks (for 100 rows, 65536 columns a chunk ran 3x slower).
TEMPORARY_ELEMENTS = 1 << 18


def _chunk(total_rows: int) -> int:
    """Columns per chunk for `total_rows` float64 rows: a power of two in [1024, 65536]."""
    columns = max(1, TEMPORARY_ELEMENTS // max(1, total_rows))
    return max(1024, min(1 << 16, 1 << (columns.bit_length() - 1)))


def dot64(rows: Tensor, others: Tensor) -> Tensor:
    """(r, c) float64 matrix of inner products rows[i] . others[j]; both (., d), any float dtype."""
    out = torch.zeros(rows.shape[0], others.shape[0], dtype=torch.float64, device=rows.device)
    chunk = _chunk(rows.shape[0] + others.shape[0])
    for start in range(0, rows.shape[1], chunk):
        stop = start + chunk
        out += rows[:, start:stop].double() @ others[:, start:stop].double().T
    return out


def block_dot64(rows: Tensor, others: Tensor, blocks: Sequence[tuple[int, int]]) -> Tensor:
    """(blocks, r, c) float64: the inner products restricted to each [start, stop) block of coordinates."""
    return torch.stack([dot64(rows[:, start:stop], others[:, start:stop]) for start, stop in blocks])


def combine64(base: Tensor, weights: Tensor, rows: Tensor) -> Tensor:
    """base + weights @ rows in float64, returned in base's dtype; weights (r,) float64, rows (r, d)."""
    out = torch.empty_like(base)
    chunk = _chunk(rows.shape[0] + 1)
    for start in range(0, base.shape[0], chunk):
        stop = start + chunk
        out[start:stop] = (base[start:stop].double() + weights @ rows[:, start:stop].double()).to(base.dtype)
    return out
