"""Local differential privacy (privacy.scope=local): each client clips its own upload and adds the
mechanism's noise before it leaves the client, from its own stream (seed, round, client); the server
averages the noised uploads as it would any."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rayfed.privacy.clipping import clip
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

    def privatize(self, tensors: dict[str, Tensor], round: int, client_id: int) -> dict[str, Tensor]:
        """The upload's tensors as the client sends them: clipped, plus noise of scale z C (float32)."""
        generator = torch_generator(self.seed, Purpose.PRIVACY_NOISE, round, client_id)
        clipped, _ = clip(tensors, self.clip_norm, self.mechanism.norm, self.per_layer, list(self.blocks))
        scale = self.noise_multiplier * self.clip_norm
        return {name: (value + self.mechanism.noise(value.numel(), scale, generator).reshape(value.shape)
                       .to(value.device)).to(torch.float32) for name, value in clipped.items()}
