"""Differential privacy (privacy.*): clipping, the mechanisms' noise on the server (central) or on each
client (local), adaptive clipping, and the accountant whose event is derived from the sampler the run
uses. Mechanisms are registered components (register_mechanism)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rayfed.privacy.central import CentralPrivacy, PrivateUploads
from rayfed.privacy.local import LocalPrivacy
from rayfed.privacy.mechanism import Gaussian, Laplace, Mechanism, build_mechanism, register_mechanism

if TYPE_CHECKING:
    from rayfed.privacy.accountant import Accountant


def sample_size(config) -> int:
    """S, the clients a round samples: train.clients_per_round, more under overcommit."""
    train = config.train
    if train.round_policy == "overcommit":
        return min(math.ceil(train.clients_per_round * (1 + train.overcommit)), config.data.num_clients)
    return train.clients_per_round


def count_stddev(config) -> float:
    """sigma_b: privacy.clip_count_stddev, or the paper's S / 20."""
    section = config.privacy
    return section.clip_count_stddev if section.clip_count_stddev is not None else config.train.clients_per_round / 20


def event_of(config, noise_multiplier: float):
    """The RoundEvent of a round of the config's run with noise multiplier z."""
    from rayfed.privacy.accountant import round_event
    section = config.privacy
    return round_event(build_mechanism(section.mechanism), noise_multiplier, section.scope,
                       config.selection.selector, config.data.num_clients, sample_size(config))


def local_privacy(config, blocks) -> LocalPrivacy | None:
    """What a worker's clients need under privacy.scope=local (None otherwise): the mechanism, not the
    accountant, whose dp-accounting import takes seconds that every worker would pay for nothing."""
    section = config.privacy
    mechanism = build_mechanism(section.mechanism)
    if mechanism is None or section.scope != "local":
        return None
    return LocalPrivacy(mechanism, section.noise_multiplier, section.clip_norm, section.per_layer,
                        tuple(map(tuple, blocks)), config.seed)


@dataclass(frozen=True)
class Privacy:
    """What the server of a private run needs: its accountant and, under privacy.scope=central, the
    mechanism it applies (under local scope the workers apply it: local_privacy)."""

    accountant: "Accountant"
    central: CentralPrivacy | None
    clip_norm: float

    @classmethod
    def of(cls, config, blocks) -> "Privacy | None":
        """None when privacy.mechanism is none; `blocks`: the model's parameter tensors as (start, end)."""
        section = config.privacy
        mechanism = build_mechanism(section.mechanism)
        if mechanism is None:
            return None
        from rayfed.privacy.accountant import Accountant
        z = section.noise_multiplier
        accountant = Accountant(section.accountant, event_of(config, z), section.delta)
        if section.scope == "local":
            return cls(accountant, None, section.clip_norm)
        central = CentralPrivacy(mechanism, z, section.per_layer, tuple(map(tuple, blocks)),
                                 config.train.clients_per_round, config.seed,
                                 section.adaptive_clipping, section.target_quantile, section.clip_learning_rate,
                                 count_stddev(config))
        return cls(accountant, central, section.clip_norm)

    def summary(self, rounds: int) -> dict:
        """summary.json's `privacy`: the event accounted for, and the epsilon of the rounds run."""
        return {"event": self.accountant.event.describe(), "accountant": self.accountant.kind,
                "delta": self.accountant.delta, "rounds": rounds, "epsilon": self.accountant.epsilon(rounds)}


__all__ = ["CentralPrivacy", "Gaussian", "Laplace", "LocalPrivacy", "Mechanism", "Privacy", "PrivateUploads",
           "build_mechanism", "count_stddev", "event_of", "local_privacy", "register_mechanism", "sample_size"]
