"""Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017, Sec. 4): each upload's
score is the sum of its squared distances to its n - f - 2 nearest other uploads; Krum returns the
upload of lowest score, Multi-Krum the mean of the m of lowest scores (m = n - f unless set)."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.aggregation.base import REQUIRED, register_rule, too_few


def krum_scores(rows: Tensor, num_byzantine: int, rule: str = "krum") -> Tensor:
    """Each row's Krum score, in float64: the sum of its n - f - 2 smallest squared distances to the others."""
    n = rows.shape[0]
    if n < 2 * num_byzantine + 3:
        raise too_few(rule, n, 2 * num_byzantine + 3, f"2 num_byzantine + 3, num_byzantine = {num_byzantine}")
    return torch.sort(squared_distances(rows), dim=1).values[:, :n - num_byzantine - 2].sum(dim=1)


def squared_distances(rows: Tensor) -> Tensor:
    """The rows' pairwise squared distances in float64, a row's to itself infinite (never its own neighbour)."""
    points = rows.double()
    squares = (points * points).sum(dim=1)
    distances = (squares[:, None] + squares[None, :] - 2.0 * points @ points.T).clamp_(min=0.0)
    return distances.fill_diagonal_(float("inf"))


class MultiKrum:
    stateful = False

    def __init__(self, num_byzantine: int, selected: int | None, name: str):
        self.num_byzantine = num_byzantine
        self.selected = selected
        self.name = name

    def __call__(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        scores = krum_scores(rows, self.num_byzantine, self.name)
        m = self.selected if self.selected is not None else rows.shape[0] - self.num_byzantine
        # A stable sort: equal scores keep client-id order, so the choice does not depend on the platform.
        chosen = torch.sort(scores, stable=True).indices[:min(m, rows.shape[0])]
        return rows[chosen].double().mean(dim=0).to(rows.dtype)


@register_rule("krum", keys={"num_byzantine": REQUIRED})
def krum(aggregation) -> MultiKrum:
    """Krum: the upload closest to its n - f - 2 nearest others (Blanchard et al., NeurIPS 2017)."""
    return MultiKrum(aggregation.num_byzantine, 1, "krum")


@register_rule("multi_krum", keys={"num_byzantine": REQUIRED, "multi_krum_m": None})
def multi_krum(aggregation) -> MultiKrum:
    """Multi-Krum: the mean of the m uploads of lowest Krum score (aggregation.multi_krum_m, default n - f)."""
    return MultiKrum(aggregation.num_byzantine, aggregation.multi_krum_m, "multi_krum")
