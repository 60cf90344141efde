"""The selectors (specs/fedmos.md §3.4): each returns the round's distinct clients and, except
`uniform`, their aggregation weights. Importances are the candidates' sample counts,
p_i = D_i / sum_j D_j over the clients that can be selected (the online ones).

    uniform  S clients uniformly without replacement; the algorithm weights them itself (today's sampling)
    md       M i.i.d. draws ~ Cat(p);                        w_i = c_i / M (c_i: times drawn)
    acs      draw m ~ Cat(Q[:, m]) of Algorithm 2's table;    w_i = c_i / M
    cacs     acs with the table filled in the clusters' order (clusters.py) instead of by importance
    ucs      M clients uniformly without replacement;        w_i = (N / M) p_i (Eq. 28; sum w is 1 on average)
    ucs with variant reference_code: M clients without replacement with probabilities p, w_i = p_i / sum_S p_j

A client drawn more than once trains once and carries its count in its weight (§3.4, A9).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.selection.table import acs_table

SELECTORS = ("uniform", "md", "acs", "ucs", "cacs")
UCS_VARIANTS = ("paper", "reference_code")


@dataclass(frozen=True)
class Selection:
    clients: np.ndarray             # distinct client ids, in the order first drawn
    weights: np.ndarray | None      # aggregation weight of each of `clients`; None: the algorithm's own


def select(selector: str, candidates: np.ndarray, counts: np.ndarray, size: int, rng: np.random.Generator,
           ucs_variant: str = "paper", order: np.ndarray | None = None) -> Selection:
    """The round's selection among `candidates` (client ids) with sample counts `counts`: `size`
    draws (S, the paper's M), or all candidates where fewer are online (uniform and ucs). `order`:
    cacs's order of all clients, of which the candidates keep their relative order."""
    candidates = np.asarray(candidates)
    if selector == "uniform":
        return Selection(candidates[rng.choice(len(candidates), size=min(size, len(candidates)), replace=False)],
                         None)
    importances = np.asarray(counts, dtype=np.float64) / np.sum(counts)
    if selector == "ucs":
        size = min(size, len(candidates))
        if ucs_variant == "paper":
            chosen = rng.choice(len(candidates), size=size, replace=False)
            return Selection(candidates[chosen], len(candidates) / size * importances[chosen])
        chosen = rng.choice(len(candidates), size=size, replace=False, p=importances)
        return Selection(candidates[chosen], importances[chosen] / importances[chosen].sum())
    if selector == "md":
        draws = rng.choice(len(candidates), size=size, replace=True, p=importances)
    elif selector == "acs":
        draws = _draw_columns(acs_table(counts, size), rng)
    else:
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        draws = _draw_columns(acs_table(counts, size, np.argsort(rank[candidates], kind="stable")), rng)
    first, counted = _first_and_counts(draws)
    return Selection(candidates[first], counted / size)


def _draw_columns(table: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One independent draw from each column's distribution."""
    cumulative = np.cumsum(table, axis=0)
    uniforms = rng.random(table.shape[1]) * cumulative[-1]
    # The first row whose cumulative mass exceeds the uniform; rows of zero mass are never chosen.
    return (cumulative > uniforms).argmax(axis=0)


def _first_and_counts(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of `draws` in the order first drawn, and how often each was drawn."""
    values, first_positions, counts = np.unique(draws, return_index=True, return_counts=True)
    order = np.argsort(first_positions, kind="stable")
    return values[order], counts[order].astype(np.float64)
