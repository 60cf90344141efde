"""The Gaussian attack (Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD", arXiv:1802.10116): an adversary sends a draw of
N(0, sigma^2 I) instead of its upload, sigma = adversary.noise_std (the paper's 200), from its own
stream for the round."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.adversary.base import Attack, register_attack


class Gaussian(Attack):
    def __init__(self, noise_std: float):
        self.noise_std = noise_std

    def corrupt(self, own: Tensor, others: Tensor | None, num_uploads: int,
                generators: list[torch.Generator]) -> Tensor:
        # Drawn on the CPU in float64, so that the bits do not depend on the device.
        draws = torch.stack([torch.randn(own.shape[1], generator=generator, dtype=torch.float64)
                             for generator in generators])
        return draws.mul_(self.noise_std).to(own.device, own.dtype)


@register_attack("gaussian", keys={"noise_std": 200.0})
def gaussian(adversary) -> Gaussian:
    """Each adversary sends Gaussian noise of standard deviation adversary.noise_std (Xie et al., 2018)."""
    return Gaussian(adversary.noise_std)
