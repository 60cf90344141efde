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
# Float64 elements in 64 bytes: the alignment of an allocation, and of every stack in stacked_gram64.
ALIGNMENT = 8


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



def stacked_gram64(parts: Sequence[Tensor], blocks: Sequence[tuple[int, int]]) -> Tensor:
    """(B, blocks, R, R) float64: the inner products among the R rows of each of B stacks, restricted
    to each [start, stop) block of coordinates; the stacks are `parts` (each (B, r, d)) one after
    another along dim 1. Each chunk of columns is cast to float64 once, into one buffer: the product of
    two separately cast buffers of one size ran up to 20x slower (their addresses alias in the cache).
    A stack gets the same bits whatever the stacks beside it: the columns per chunk depend on R alone,
    each stack's product is a matrix product of its own (a batched one may sum in another order for
    another batch size), and each stack's rows start on a 64-byte boundary (BLAS sums misaligned
    rows in another order)."""
    batch, count = parts[0].shape[0], sum(part.shape[1] for part in parts)
    device = parts[0].device
    out = torch.zeros(batch, len(blocks), count, count, dtype=torch.float64, device=device)
    chunk = _chunk(count)
    # One stack at a time, so that the buffer holds one stack's chunk and stays in cache.
    buffer = torch.empty(count, -chunk // ALIGNMENT * -ALIGNMENT, dtype=torch.float64, device=device)
    for stack in range(batch):
        for index, (start, stop) in enumerate(blocks):
            block_gram = out[stack, index]
            for low in range(start, stop, chunk):
                high = min(low + chunk, stop)
                stacked = buffer[:, :high - low]
                row = 0
                for part in parts:
                    stacked[row:row + part.shape[1]] = part[stack, :, low:high]
                    row += part.shape[1]
                block_gram += stacked @ stacked.T
    return out


def stacked_combine64(base: Tensor, weights: Tensor, rows: Sequence[Tensor], blocks: Sequence[tuple[int, int]],
                      use: Tensor) -> tuple[Tensor, Tensor]:
    """(B, d): base + sum_j weights[:, t, j] rows[j] on each block t of coordinates where use[:, t],
    computed in float64 and returned in base's dtype, and base itself on the other blocks; base (B, d),
    weights (B, blocks, r) float64, rows r tensors (B, d), use (B, blocks) bool. Also (B, blocks) bool:
    whether each block came out finite (a cast back to base's dtype can overflow). The sum runs over the
    rows in order, element by element, so a stack's bits do not depend on the others. Chunks of columns
    span blocks and each row is cast once per chunk: chunks per block would cost small blocks (biases)
    several operations each."""
    out = torch.empty_like(base)
    finite = torch.ones_like(use)
    dim = base.shape[-1]
    chunk = TEMPORARY_ELEMENTS // 2
    cast = torch.empty(min(chunk, dim), dtype=torch.float64, device=base.device)
    for stack in range(base.shape[0]):
        used = torch.cat([flag.expand(stop - start) for flag, (start, stop) in zip(use[stack].unbind(), blocks)])
        block_weights = [block.unbind() for block in weights[stack].unbind()]
        for low in range(0, dim, chunk):
            high = min(low + chunk, dim)
            # A copy even in float64, where .double() would be base itself and addcmul_ would write into it.
            combined = base[stack, low:high].to(torch.float64, copy=True)
            overlapping = [(index, max(start, low) - low, min(stop, high) - low)
                           for index, (start, stop) in enumerate(blocks) if start < high and stop > low]
            for position, row in enumerate(rows):
                cast[:high - low].copy_(row[stack, low:high])
                for index, start, stop in overlapping:
                    combined[start:stop].addcmul_(block_weights[index][position], cast[start:stop])
            # Blocks not corrected keep base, also where a row is not finite (0 * inf is nan).
            torch.where(used[low:high], combined.to(base.dtype), base[stack, low:high], out=out[stack, low:high])
        for index, (start, stop) in enumerate(blocks):
            # The largest magnitude is not finite where any entry is not (amax propagates nan): one
            # reduction, where isfinite() takes several passes.
            if stop > start:
                finite[stack, index] = out[stack, start:stop].abs().amax().isfinite()
    return out, finite


def dense_condition(condition: Tensor, like: Tensor) -> Tensor:
    """`condition` broadcast to `like`'s shape in memory of its own: torch.where over a broadcast (stride 0)
    condition takes a kernel several times slower than over a dense one."""
    return condition.expand_as(like).contiguous()
