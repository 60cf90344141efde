"""Bulyan (El Mhamdi, Guerraoui, Rouault, ICML 2018, arXiv:1802.07927, Sec. 4): Krum applied recursively picks
theta = n - 2f uploads, each Krum run on the uploads not picked yet (with the same f); then each coordinate
is the mean of the beta = theta - 2f picked values closest to their coordinate-wise median. Needs n >= 4f + 3.
Where the recursion leaves Krum fewer than n' - f - 2 >= 1 neighbours (its last steps, n' down to 2f + 1),
each score sums max(1, n' - f - 2) of them, as Flower's aggregate_bulyan does."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.aggregation.base import REQUIRED, register_rule, too_few
from rayfed.aggregation.krum import squared_distances
from rayfed.aggregation.median import Median


class Bulyan:
    stateful = False

    def __init__(self, num_byzantine: int):
        self.num_byzantine = num_byzantine

    def picks(self, rows: Tensor) -> list[int]:
        """The rows recursive Krum picks, in the order it picks them."""
        f = self.num_byzantine
        distances = squared_distances(rows)
        remaining = list(range(rows.shape[0]))
        picked = []
        for _ in range(rows.shape[0] - 2 * f):
            among = distances[remaining][:, remaining]
            neighbours = max(1, len(remaining) - f - 2)
            scores = torch.sort(among, dim=1).values[:, :neighbours].sum(dim=1)
            # The first lowest score in client-id order, so the pick does not depend on the platform.
            picked.append(remaining.pop(int(torch.argmin(scores))))
        return picked

    def __call__(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        n, f = rows.shape[0], self.num_byzantine
        if n < 4 * f + 3:
            raise too_few("bulyan", n, 4 * f + 3, f"4 num_byzantine + 3, num_byzantine = {f}")
        picked = rows[self.picks(rows)]
        beta = picked.shape[0] - 2 * f
        median = Median()(picked, None).double()
        values = picked.double()
        # Stable: of values equally far from the median, the earlier pick's comes first.
        closest = torch.sort((values - median).abs(), dim=0, stable=True).indices[:beta]
        return values.gather(0, closest).mean(dim=0).to(rows.dtype)


@register_rule("bulyan", keys={"num_byzantine": REQUIRED})
def bulyan(aggregation) -> Bulyan:
    """Bulyan: recursive Krum, then each coordinate's mean around the median (El Mhamdi et al., ICML 2018)."""
    return Bulyan(aggregation.num_byzantine)
