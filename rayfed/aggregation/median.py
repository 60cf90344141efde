"""The coordinate-wise median (Yin, Chen, Ramchandran, Bartlett, ICML 2018, arXiv:1803.01498, Definition 1)."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.aggregation.base import register_rule


class Median:
    """Each coordinate's median over the uploads; with an even count, the mean of the two middle values."""

    stateful = False

    def __call__(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        ordered = torch.sort(rows, dim=0).values
        n = rows.shape[0]
        if n % 2:
            return ordered[n // 2].clone()
        return (ordered[n // 2 - 1].double() + ordered[n // 2].double()).mul_(0.5).to(rows.dtype)


@register_rule("median")
def median(aggregation) -> Median:
    """Coordinate-wise median (Yin et al., ICML 2018)."""
    return Median()
