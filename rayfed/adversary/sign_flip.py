"""Sign flipping: an adversary sends the negative of its honest upload (the sign-flipping attack of
Li, Xu, Chen, Giannakis, Ling, RSA, AAAI 2019, arXiv:1811.03761, here with
multiplier -1)."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.adversary.base import Attack, register_attack


class SignFlip(Attack):
    def corrupt(self, own: Tensor, others: Tensor | None, num_uploads: int,
                generators: list[torch.Generator]) -> Tensor:
        return -own


@register_attack("sign_flip")
def sign_flip(adversary) -> SignFlip:
    """Each adversary sends minus its honest upload (RSA's sign flipping, Li et al., AAAI 2019)."""
    return SignFlip()
