"""The coordinate-wise trimmed mean (Yin, Chen, Ramchandran, Bartlett, ICML 2018, arXiv:1803.01498,
Definition 2): each coordinate's mean after its f largest and f smallest values are removed."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.aggregation.base import REQUIRED, register_rule, too_few


class TrimmedMean:
    stateful = False

    def __init__(self, num_byzantine: int):
        self.trim = num_byzantine

    def __call__(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        n = rows.shape[0]
        if n <= 2 * self.trim:
            raise too_few("trimmed_mean", n, 2 * self.trim + 1, f"2 num_byzantine + 1, num_byzantine = {self.trim}")
        kept = torch.sort(rows, dim=0).values[self.trim:n - self.trim]
        return kept.double().mean(dim=0).to(rows.dtype)


@register_rule("trimmed_mean", keys={"num_byzantine": REQUIRED})
def trimmed_mean(aggregation) -> TrimmedMean:
    """Coordinate-wise trimmed mean, trimming aggregation.num_byzantine values at each end (Yin et al., ICML 2018)."""
    return TrimmedMean(aggregation.num_byzantine)
