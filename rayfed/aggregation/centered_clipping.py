"""Centered clipping (Karimireddy, He, Jaggi, ICML 2021, arXiv:2012.10333, Sec. 3): from the previous
round's aggregate v (zero in the first round), `iterations` times
    v <- v + (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||),
tau = clip_radius. The paper applies it to the workers' momenta; here it takes whatever the algorithm
uploads (FedAvg's model changes, ...), and its state is the aggregate it returned last."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.aggregation.base import REQUIRED, register_rule


class CenteredClipping:
    stateful = True

    def __init__(self, clip_radius: float, iterations: int):
        self.clip_radius = clip_radius
        self.iterations = iterations

    def __call__(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        points = rows.double()
        center = torch.zeros_like(points[0]) if previous is None else previous.double()
        for _ in range(self.iterations):
            offsets = points - center
            norms = torch.linalg.vector_norm(offsets, dim=1)
            scales = torch.where(norms > self.clip_radius, self.clip_radius / norms, torch.ones_like(norms))
            center = center + (scales[:, None] * offsets).mean(dim=0)
        return center.to(rows.dtype)


@register_rule("centered_clipping", keys={"clip_radius": REQUIRED, "iterations": 1})
def centered_clipping(aggregation) -> CenteredClipping:
    """Centered clipping around the previous aggregate, radius aggregation.clip_radius (Karimireddy et al., ICML 2021)."""
    return CenteredClipping(aggregation.clip_radius, aggregation.iterations)
