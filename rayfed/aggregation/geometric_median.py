"""The geometric median, argmin_z sum_i ||z - x_i||, by the smoothed Weiszfeld iteration of RFA
(Pillutla, Kakade, Harchaoui, IEEE TSP 2022, arXiv:1912.13445, Algorithm 3): z <- sum_i b_i x_i / sum_i
b_i with b_i = 1 / max(nu, ||z - x_i||), from the mean, until the objective improves by at most
`tolerance` of itself or after `iterations` steps; nu (`smoothing`) keeps a step defined when z meets an upload."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.aggregation.base import register_rule


class GeometricMedian:
    stateful = False

    def __init__(self, iterations: int, tolerance: float, smoothing: float):
        self.iterations = iterations
        self.tolerance = tolerance
        self.smoothing = smoothing

    def __call__(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        points = rows.double()
        median = points.mean(dim=0)
        objective = torch.linalg.vector_norm(points - median, dim=1).sum()
        for _ in range(self.iterations):
            betas = 1.0 / torch.linalg.vector_norm(points - median, dim=1).clamp(min=self.smoothing)
            median = (betas[:, None] * points).sum(dim=0) / betas.sum()
            previous_objective, objective = objective, torch.linalg.vector_norm(points - median, dim=1).sum()
            if previous_objective - objective <= self.tolerance * objective:
                break
        return median.to(rows.dtype)


@register_rule("geometric_median", keys={"iterations": 100, "tolerance": 1e-6, "smoothing": 1e-6})
def geometric_median(aggregation) -> GeometricMedian:
    """Geometric median by RFA's smoothed Weiszfeld iterations (Pillutla et al., arXiv:1912.13445)."""
    return GeometricMedian(aggregation.iterations, aggregation.tolerance, aggregation.smoothing)
