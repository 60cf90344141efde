"""A Little Is Enough (Baruch, Baruch, Goldberg, NeurIPS 2019, arXiv:1902.06156): the m
adversaries among the round's n counted clients all send mu + z sigma, coordinate-wise mean and
standard deviation of their own honest uploads (the paper's attacker is not omniscient: it knows
the corrupted clients' data only), with z = adversary.alie_z or the paper's z_max:
    s = floor(n / 2 + 1) - m,   z_max = Phi^-1((n - s) / n),
the largest z that s honest clients' values still lie beyond. Where the adversaries are at least
floor(n / 2 + 1) of the round (s <= 0, no such z) the round takes s = 1. One adversary has sigma = 0."""
from __future__ import annotations

import math
from statistics import NormalDist

import torch
from torch import Tensor

from rayfed.adversary.base import Attack, register_attack


def z_max(n: int, m: int) -> float:
    supporters = max(math.floor(n / 2 + 1) - m, 1)
    return NormalDist().inv_cdf((n - supporters) / n)


class ALIE(Attack):
    def __init__(self, z: float | None):
        self.z = z

    def corrupt(self, own: Tensor, others: Tensor | None, num_uploads: int,
                generators: list[torch.Generator]) -> Tensor:
        m, n = own.shape[0], num_uploads
        rows = own.double()
        sigma = rows.std(dim=0) if m > 1 else torch.zeros_like(rows[0])
        z = self.z if self.z is not None else z_max(n, m)
        return (rows.mean(dim=0) + z * sigma).to(own.dtype).expand(m, -1).clone()


@register_attack("alie", keys={"alie_z": None})
def alie(adversary) -> ALIE:
    """A Little Is Enough: mu + z sigma of the adversaries' own uploads (Baruch et al., NeurIPS 2019)."""
    return ALIE(adversary.alie_z)
