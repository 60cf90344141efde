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
    return np.lexsort((np.arange(len(importances)), -np.asarray(importances)))


def acs_table(counts: np.ndarray, num_draws: int, order: np.ndarray | None = None) -> np.ndarray:
    """Q (clients x draws, float64) for importances p_i = counts_i / sum(counts), integer counts."""
    counts = np.asarray(counts, dtype=np.int64)
    if order is None:
        order = acs_order(counts)
    total = int(counts.sum())
    # In units of 1 / total: client masses M * D_i, each draw holds `total`.
    ends = np.cumsum(num_draws * counts[order])
    starts = ends - num_draws * counts[order]
    draw_starts = np.arange(num_draws, dtype=np.int64) * total
    overlap = np.minimum(ends[:, None], draw_starts + total) - np.maximum(starts[:, None], draw_starts)
    table = np.zeros((len(counts), num_draws))
    table[order] = np.maximum(overlap, 0) / total
    return table
