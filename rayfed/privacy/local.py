"""Local differential privacy (privacy.scope=local): each client clips its own upload and adds the
mechanism's noise before it leaves the client, from its own stream (seed, round, client); the server
averages the noised uploads as it would any."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rayfed.privacy.clipping import changes, clip
from rayfed.privacy.mechanism import Mechanism
from rayfed.seeding import Purpose, torch_generator


@dataclass(frozen=True)
class LocalPrivacy:
    mechanism: Mechanism
    noise_multiplier: float
    clip_norm: float
    per_layer: bool
    blocks: tuple[tuple[int, int], ...]
    seed: int

    def privatize(self, tensors: dict[str, Tensor], round: int, client_id: int,
                  reference: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """The upload's tensors as the client sends them: clipped, plus noise of scale z C (float32). With
        `reference` (an algorithm that averages models: the broadcast) the change from it is clipped and
        noised, and sent added back to it."""
        generator = torch_generator(self.seed, Purpose.PRIVACY_NOISE, round, client_id)
        clipped, _ = clip(tensors if reference is None else changes(tensors, reference), self.clip_norm,
                          self.mechanism.norm, self.per_layer, list(self.blocks))
        scale = self.noise_multiplier * self.clip_norm
        sent = {}
        for name, value in clipped.items():
            value = value + self.mechanism.noise(value.numel(), scale, generator).reshape(value.shape).to(value.device)
            sent[name] = (value if reference is None else value + reference[name].double()).to(torch.float32)
        return sent
