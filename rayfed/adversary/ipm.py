"""Inner product manipulation (Xie, Koyejo, Gupta, UAI 2019, arXiv:1903.03936): every adversary
sends -epsilon times the mean of the honest clients' uploads of the round (an omniscient attack),
epsilon = adversary.ipm_epsilon (the paper's small case, 0.1, by default). In a round without honest
uploads they send -epsilon times the mean of their own."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.adversary.base import Attack, register_attack


class IPM(Attack):
    omniscient = True

    def __init__(self, epsilon: float):
        self.epsilon = epsilon

    def corrupt(self, own: Tensor, others: Tensor | None, num_uploads: int,
                generators: list[torch.Generator]) -> Tensor:
        honest = own if others is None else others
        return (honest.double().mean(dim=0) * -self.epsilon).to(own.dtype).expand(own.shape[0], -1).clone()


@register_attack("ipm", keys={"ipm_epsilon": 0.1})
def ipm(adversary) -> IPM:
    """Inner product manipulation: -epsilon times the honest uploads' mean (Xie et al., UAI 2019)."""
    return IPM(adversary.ipm_epsilon)
