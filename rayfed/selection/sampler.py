"""Client selection as a server component: the round's clients among the candidates the systems
clock offers, with the selector's aggregation weights, from the stream (seed, round). It owns the
selector's state: CACS's order of the clients, which its warm-up fixes before round 0."""
from __future__ import annotations

import numpy as np
import torch

from rayfed.registry import SELECTORS
from rayfed.seeding import Purpose, numpy_rng
from rayfed.selection.clusters import ClientOrder, cluster_order
from rayfed.selection.selectors import Selection, select
from rayfed.systems.availability import AllClients


class ClientSampler:
    def __init__(self, selection, seed: int, client_sizes: np.ndarray):
        """`selection`: the config's selection section; `client_sizes`: every client's sample count."""
        self.section = selection
        self.seed = seed
        self.client_sizes = client_sizes
        self.client_order: ClientOrder | None = None

    def choose(self, round: int, candidates: np.ndarray, wanted: int) -> Selection:
        rng = numpy_rng(self.seed, Purpose.SAMPLE_CLIENTS, round)
        order = self.client_order.order if self.client_order is not None else None
        counts = self.client_sizes if isinstance(candidates, AllClients) else self.client_sizes[candidates]
        return select(self.section.selector, candidates, counts, wanted, rng, self.section.ucs_variant, order)

    def importances(self, clients: list[int]) -> dict[int, float]:
        """p_i = D_i / sum_j D_j over all clients, of `clients`: what MIFA weights its clients' latest
        updates by under a selector that weights the clients."""
        sizes = self.client_sizes
        total = sizes.sum()
        return {client: float(sizes[client] / total) for client in clients}

    def needs_warmup(self) -> bool:
        return SELECTORS.get(self.section.selector).warmup and self.client_order is None

    def extensions(self) -> list[tuple[str, dict]]:
        return [("selection_warmup", {})] if self.needs_warmup() else []

    def order_from(self, gradients: np.ndarray) -> np.ndarray:
        """CACS: the clients clustered by their full local gradients (one row each) fix the order the
        selector fills its draws in. Returns the cluster sizes."""
        self.client_order = cluster_order(gradients, self.client_sizes, self.section.cacs_clusters)
        return np.bincount(self.client_order.labels)

    def snapshot(self) -> dict | None:
        if self.client_order is None:
            return None
        return {"order": torch.from_numpy(self.client_order.order), "labels": torch.from_numpy(self.client_order.labels)}

    def restore(self, snapshot: dict | None) -> None:
        self.client_order = None if snapshot is None else ClientOrder(snapshot["order"].cpu().numpy(),
                                                                      snapshot["labels"].cpu().numpy())
