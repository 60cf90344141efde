"""The mimic attack (Karimireddy, He, Jaggi, ICLR 2022, arXiv:2006.09365): the adversaries all send the
upload of one honest client, the one furthest along the honest uploads' direction of largest spread,
so that a robust rule over-weights that client's data. As the authors' code runs it (one warm-up
round): in the first round the adversaries attack, with mu the honest uploads' mean and z0 a
standard normal draw,

    z = sum_i ((x_i - mu) . z0) (x_i - mu),   z <- z / ||z||,   target = argmax_i x_i . z,

and in every later round they copy that client's upload (an omniscient attack); a round without the
target's upload chooses again."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.adversary.base import Attack, register_attack


class Mimic(Attack):
    omniscient = True
    stateful = True

    def corrupt_stateful(self, own: Tensor, others: Tensor | None, other_ids: list[int], num_uploads: int,
                         generators: list[torch.Generator], state: dict) -> tuple[Tensor, dict]:
        if others is None:
            return own, state
        target = state.get("target")
        if target not in other_ids:
            honest = others.double()
            centred = honest - honest.mean(dim=0)
            start = torch.randn(honest.shape[1], generator=generators[0], dtype=torch.float64).to(honest.device)
            direction = (centred @ start) @ centred
            direction = direction / torch.linalg.vector_norm(direction)
            target = other_ids[int(torch.argmax(honest @ direction))]
            state = {"target": target}
        return others[other_ids.index(target)].expand(own.shape[0], -1).clone(), state


@register_attack("mimic")
def mimic(adversary) -> Mimic:
    """Every adversary copies one honest client, the one furthest along the honest uploads' main spread
    (Karimireddy et al., ICLR 2022)."""
    return Mimic()
