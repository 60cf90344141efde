"""Central differential privacy (privacy.scope=central): the server clips each counted client's
upload, sums them, adds the mechanism's noise once, and divides by S (train.clients_per_round; under
Poisson sampling the expected count, DP-FedAvg's fixed denominator, McMahan et al., ICLR 2018,
arXiv:1710.06963), or by the divisor the server step asks for (MIFA's N). The algorithm's server step
reads that noised average through weighted_average, so server momentum, adaptive server optimisers and
the rest act on it as on any average."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rayfed.algorithms.summed_uploads import CombinedUploads
from rayfed.privacy.adaptive import next_clip_norm, update_noise_multiplier
from rayfed.privacy.clipping import changes, clip
from rayfed.privacy.mechanism import Mechanism
from rayfed.seeding import Purpose, torch_generator


class PrivateUploads(CombinedUploads):
    """Each upload name's noised sum, which `weighted_average` divides."""

    reason = "privacy.mechanism"
    holds = "the noised sum of the round's clipped uploads"

    def __init__(self, sums: dict[str, Tensor], clients_per_round: int, reference: dict[str, Tensor] | None = None):
        """`reference`: what each upload name's changes were taken from (the broadcast, for an algorithm that
        averages models), added back to the average."""
        self.sums = sums
        self.clients_per_round = clients_per_round
        self.reference = reference

    def average(self, name: str, weighting: str, weights: dict[int, float] | None,
                divisor: int | None = None) -> Tensor:
        """The noised sum of `name` divided by S (or `divisor`), rounded to float32."""
        if weights is not None:
            raise ValueError("privacy.mechanism: the noised sum weighs every client alike; the round's per-client "
                             "weights cannot apply")
        if name not in self.sums:
            raise KeyError(f"privacy.mechanism: no upload named {name!r} (the clients uploaded "
                           f"{', '.join(map(repr, self.sums))})")
        average = self.sums[name] / (self.clients_per_round if divisor is None else divisor)
        if self.reference is not None:
            average = average + self.reference[name].double().to(average.device)
        return average.to(torch.float32)


@dataclass(frozen=True)
class CentralPrivacy:
    """The privacy section's central mechanism, for a run with S clients a round."""

    mechanism: Mechanism
    noise_multiplier: float
    per_layer: bool
    blocks: tuple[tuple[int, int], ...]
    clients_per_round: int
    seed: int
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_stddev: float = 0.0

    def combine(self, round: int, tensors: dict[int, dict[str, Tensor]], clip_norm: float,
                reference: dict[str, Tensor] | None = None) -> tuple[PrivateUploads, dict[str, float], float]:
        """The round's noised sums from its uploads (client -> name -> vector, in client-id order),
        the round's privacy metrics, and the clip norm of the next round. With `reference` (an algorithm
        that averages models: the broadcast, by upload name) what is clipped and summed is each upload's
        change from it. The noise comes from the stream (seed, round): the same on any engine and any
        number of workers."""
        generator = torch_generator(self.seed, Purpose.PRIVACY_NOISE, round)
        multiplier = (update_noise_multiplier(self.noise_multiplier, self.count_stddev) if self.adaptive
                      else self.noise_multiplier)
        scale = multiplier * clip_norm
        sums: dict[str, Tensor] = {}
        unclipped = 0
        for upload in tensors.values():
            clipped, size = clip(upload if reference is None else changes(upload, reference), clip_norm,
                                 self.mechanism.norm, self.per_layer, list(self.blocks))
            unclipped += size <= clip_norm
            for name, value in clipped.items():
                sums[name] = sums[name].add_(value) if name in sums else value
        signal = torch.cat([total.reshape(-1) for total in sums.values()]) if sums else torch.zeros(0)
        noised = {}
        for name, total in sums.items():
            noise = self.mechanism.noise(total.numel(), scale, generator).reshape(total.shape).to(total.device)
            noised[name] = total + noise
        metrics = {"dp_clip_norm": clip_norm, "dp_noise_scale": scale,
                   "dp_signal_to_noise": (float(torch.linalg.vector_norm(signal, ord=self.mechanism.norm))
                                          / (scale * signal.numel() ** (1 / self.mechanism.norm)))
                   if scale > 0 and signal.numel() else float("inf")}
        if not self.adaptive:
            return PrivateUploads(noised, self.clients_per_round, reference), metrics, clip_norm
        count = unclipped + float(torch.randn(1, generator=generator, dtype=torch.float64)) * self.count_stddev
        fraction = count / self.clients_per_round
        metrics["dp_unclipped_fraction"] = fraction
        return (PrivateUploads(noised, self.clients_per_round, reference), metrics,
                next_clip_norm(clip_norm, fraction, self.target_quantile, self.clip_learning_rate))
