"""Byzantine clients (adversary.*): which clients are adversaries, and what an attack does.

The adversaries are a fixed set of clients, named (adversary.clients) or drawn once from the run's
seed (adversary.fraction of N). They train like everyone else; an attack then replaces the uploads
of those among a round's counted clients before the aggregation reads them, knowing only what its
paper grants: their own honest uploads, the others' (an omniscient attack), or nothing. An attack
that poisons data instead (label flipping) changes the labels they train on. Attacks are pure torch,
registered like any component (`register_attack`); the server and the workers derive the same
adversaries from the config."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from rayfed.algorithms.base import Upload
from rayfed.registry import ATTACKS, keyed_builder
from rayfed.seeding import Purpose, numpy_rng, torch_generator

# The `adversary:` keys an attack may take, besides `attack`, `fraction` and `clients`.
ATTACK_KEYS = ("noise_std", "alie_z", "ipm_epsilon")


class Attack:
    """Base class: an attack replaces the uploads of the round's adversaries (`corrupt`) and may poison
    their training labels (`labels`). The default does neither."""

    omniscient = False
    """It reads the honest clients' uploads of the round (`others`); otherwise they are withheld from it."""
    poisons_labels = False
    """Its adversaries train on `labels(y, num_classes)` instead of their own labels."""

    def corrupt(self, own: Tensor, others: Tensor | None, num_uploads: int,
                generators: list[torch.Generator]) -> Tensor:
        """The uploads the adversaries send, (m, d), from `own`, their honest uploads of one name (m, d),
        and for an omniscient attack `others`, the honest clients' ((n - m, d); None otherwise, or
        when there are none). `num_uploads`: n, the round's counted uploads, adversaries' included.
        `generators`: one random stream per adversary, in the rows' order."""
        return own

    def labels(self, labels: Tensor, num_classes: int) -> Tensor:
        return labels

    stateful = False
    """It carries a state from round to round (`corrupt_stateful`), which checkpoints hold."""

    def corrupt_stateful(self, own: Tensor, others: Tensor | None, other_ids: list[int], num_uploads: int,
                         generators: list[torch.Generator], state: dict) -> tuple[Tensor, dict]:
        """`corrupt` for an attack that remembers (a stateful one overrides this): also given the honest
        clients' ids (the rows of `others`) and its state, it returns the next state with the uploads. Called
        once per upload name, the state passed on from one name to the next."""
        return self.corrupt(own, others, num_uploads, generators), state


def register_attack(name: str, *, keys: dict[str, Any] | None = None):
    """Registers an attack builder `(adversary section) -> Attack` under `name` (rayfed.register_attack):
    adversary.attack then uses it. `keys`: the adversary.* keys it takes (of noise_std, alie_z,
    ipm_epsilon) and their defaults (None: the attack computes its own); the others must stay unset."""
    return keyed_builder(ATTACKS, name, keys, "adversary", ATTACK_KEYS, "Attack")


def adversary_ids(adversary, num_clients: int, seed: int) -> np.ndarray:
    """The adversaries' client ids, sorted: adversary.clients, or round(fraction N) clients drawn
    without replacement from the stream (seed, ADVERSARIES)."""
    if adversary.clients:
        return np.array(sorted(set(adversary.clients)), dtype=np.int64)
    count = round(adversary.fraction * num_clients)
    return np.sort(numpy_rng(seed, Purpose.ADVERSARIES).choice(num_clients, size=count, replace=False))


class Adversaries:
    """The run's adversaries and their attack (None when adversary.attack is none)."""

    def __init__(self, adversary, num_clients: int, seed: int):
        self.attack: Attack = ATTACKS.get(adversary.attack).target(adversary)
        self.clients = frozenset(adversary_ids(adversary, num_clients, seed).tolist())
        self.seed = seed

    @classmethod
    def of(cls, config) -> "Adversaries | None":
        if config.adversary.attack == "none":
            return None
        return cls(config.adversary, config.data.num_clients, config.seed)

    def poisons(self, client_id: int) -> bool:
        return self.attack.poisons_labels and client_id in self.clients

    def corrupt(self, round: int, uploads: dict[int, Upload], state: dict) -> tuple[dict[int, Upload], int, dict]:
        """The round's uploads (client id -> upload, in client-id order) with the adversaries' replaced,
        how many of them were adversaries', and the attack's next state (`state`: its last)."""
        bad = [client for client in uploads if client in self.clients]
        if not bad:
            return uploads, 0, state
        good = [client for client in uploads if client not in self.clients]
        generators = [torch_generator(self.seed, Purpose.ATTACK, round, client) for client in bad]
        replaced = {client: {} for client in bad}
        for name in uploads[bad[0]].tensors:
            own = torch.stack([uploads[client].tensors[name] for client in bad])
            others = (torch.stack([uploads[client].tensors[name] for client in good])
                      if self.attack.omniscient and good else None)
            sent, state = self.attack.corrupt_stateful(own, others, good if others is not None else [], len(uploads),
                                                       generators, state)
            for row, client in enumerate(bad):
                replaced[client][name] = sent[row]
        corrupted = {client: (Upload(replaced[client], upload.num_samples, upload.metrics) if client in replaced
                              else upload) for client, upload in uploads.items()}
        return corrupted, len(bad), state


@register_attack("none")
def no_attack(adversary) -> Attack:
    """No adversaries."""
    return Attack()
