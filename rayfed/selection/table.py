"""Algorithm 2 of FedMoS (Adaptive Client Selection, Wang et al., INFOCOM 2023, Sec. IV-C): the N x M table Q whose
column m is the distribution of draw m, each client's row summing to M p_i (unbiasedness, Eq. 22).

Algorithm 2 fills the draws greedily, clients in order pi: the north-west-corner rule of the
transportation problem. Laid end to end on [0, M], client pi_k covers [C_{k-1}, C_k) and draw m the
interval [m-1, m), so
    Q[pi_k, m] = max(0, min(C_k, m) - max(C_{k-1}, m - 1)).
With integer importances (sample counts D_i, p_i = D_i / sum D) this is computed exactly in
integers, scaled by sum D: a float loop leaves splits of 1e-16 (20 or 21 clients per draw
instead of 20 for N = 500, M = 25).
"""
from __future__ import annotations

import numpy as np


def acs_order(importances: np.ndarray) -> np.ndarray:
    """Clients by descending importance, ties by ascending index (Algorithm 2, line 1)."""
    keys = -np.asarray(importances)
    if keys.dtype.kind in "iu" and len(keys) and -(2 ** 15) < keys.min() and keys.max() < 2 ** 15:
        # Sample counts below 2^15: numpy's stable sort of 16-bit keys is a radix sort, O(N).
        keys = keys.astype(np.int16)
    return np.argsort(keys, kind="stable")


def acs_columns(counts: np.ndarray, num_draws: int,
                order: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Q's nonzero entries, column by column: for each draw, its clients (ascending ids) and their
    masses Q[i, m], for importances p_i = counts_i / sum(counts), integer counts. A client spans the
    draws its interval meets, so Q has at most N + M - 1 nonzero entries: a round at N = 10^6 needs
    O(N + M) memory and time, where the table itself is N x M."""
    counts = np.asarray(counts, dtype=np.int64)
    if order is None:
        order = acs_order(counts)
    total = int(counts.sum())
    # In units of 1 / total: client masses M * D_i, each draw holds `total`.
    masses = num_draws * counts[order]
    ends = np.cumsum(masses)
    starts = ends - masses
    # Draw m holds [m total, (m + 1) total): the clients (in pi) from the one whose interval holds its
    # start to the one whose interval holds its last unit.
    draw_starts = np.arange(num_draws, dtype=np.int64) * total
    firsts = np.searchsorted(ends, draw_starts, side="right")
    lasts = np.searchsorted(ends, draw_starts + total - 1, side="right")
    columns = []
    for draw_start, first, last in zip(draw_starts, firsts, lasts):
        span = slice(first, last + 1)
        overlap = np.minimum(ends[span], draw_start + total) - np.maximum(starts[span], draw_start)
        by_id = np.argsort(order[span])
        # A client of no samples has an empty interval inside the span: its mass is 0, as in the table.
        kept = by_id[overlap[by_id] > 0]
        columns.append((order[span][kept], overlap[kept] / total))
    return columns


def acs_table(counts: np.ndarray, num_draws: int, order: np.ndarray | None = None) -> np.ndarray:
    """Q (clients x draws, float64) for importances p_i = counts_i / sum(counts), integer counts."""
    table = np.zeros((len(counts), num_draws))
    for draw, (clients, masses) in enumerate(acs_columns(counts, num_draws, order)):
        table[clients, draw] = masses
    return table
