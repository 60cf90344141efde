"""Client selection as a server component: the round's clients among the candidates the systems
clock offers, with the selector's aggregation weights, from the stream (seed, round). It owns the
selector's state: CACS's order of the clients, which its warm-up fixes before round 0."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rayfed.errors import kind_of
from rayfed.registry import SELECTORS
from rayfed.seeding import Purpose, numpy_rng
from rayfed.selection.clusters import ClientOrder, cluster_order, order_problem
from rayfed.selection.selectors import Importances, Selection, select
from rayfed.systems.availability import AllClients


class ClientSampler:
    def __init__(self, selection, seed: int, client_sizes: np.ndarray):
        """`selection`: the config's selection section; `client_sizes`: every client's sample count."""
        self.section = selection
        self.seed = seed
        # The clients' sizes are their importances' counts: one source, which the importances kept for the run
        # cannot fall behind.
        self.kept_importances = Importances(client_sizes)
        self.client_order: ClientOrder | None = None

    def choose(self, round: int, candidates: np.ndarray, wanted: int) -> Selection:
        rng = numpy_rng(self.seed, Purpose.SAMPLE_CLIENTS, round)
        order = self.client_order.order if self.client_order is not None else None
        everyone = isinstance(candidates, AllClients)
        counts = self.client_sizes if everyone else self.client_sizes[candidates]
        return select(self.section.selector, candidates, counts, wanted, rng, self.section.ucs_variant, order,
                      self.kept_importances if everyone else None)

    @property
    def client_sizes(self) -> np.ndarray:
        """Every client's sample count."""
        return self.kept_importances.counts

    def importances(self, clients: list[int]) -> dict[int, float]:
        """p_i = D_i / sum_j D_j over all clients, of `clients`: what MIFA weights its clients' latest
        updates by under a selector that weights the clients."""
        importances = self.kept_importances.p
        return {client: float(importances[client]) for client in clients}

    def needs_warmup(self) -> bool:
        return self.warms_up() and self.client_order is None

    def warms_up(self) -> bool:
        return SELECTORS.get(self.section.selector).warmup

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

    def snapshot_problem(self, snapshot: Any, warmup_summary: Any) -> str | None:
        """Why `snapshot` (a checkpoint's client_order) with the server's account of the warm-up
        (warmup_summary) cannot be this selector's after a round, or None. A selector with a warm-up
        fixed its order before round 1: CACS's order of every client for cluster labels, counted in
        the account; any other selector holds neither."""
        selector = f"selection.selector={self.section.selector}"
        if not self.warms_up():
            if snapshot is not None or warmup_summary is not None:
                return f"client_order or warmup_summary is set, but {selector} has no warm-up"
            return None
        num_clients = len(self.client_sizes)
        if not isinstance(snapshot, dict) or set(snapshot) != {"order", "labels"}:
            return f"client_order is {kind_of(snapshot)}, expected the order and labels that {selector}'s warm-up fixed"
        for key in ("order", "labels"):
            value = snapshot[key]
            if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or tuple(value.shape) != (num_clients,):
                return f"client_order's {key} is {kind_of(value)}, expected an int64 tensor of shape ({num_clients},)"
        labels = snapshot["labels"].numpy()
        problem = order_problem(snapshot["order"].numpy(), labels, self.client_sizes, self.section.cacs_clusters)
        if problem:
            return f"client_order's {problem}"
        return self._summary_problem(warmup_summary, labels)

    def _summary_problem(self, summary: Any, labels: np.ndarray) -> str | None:
        rounds, num_clients = self.section.cacs_warmup_rounds, len(labels)
        keys = ["rounds", "client_rounds", "train_loss", "bytes_up", "bytes_down", "clusters", "cluster_sizes"]
        if not isinstance(summary, dict) or list(summary) != keys:
            return f"warmup_summary is {kind_of(summary)}, expected the account of the warm-up ({', '.join(keys)})"
        sizes = np.bincount(labels).tolist()
        expected = {"rounds": rounds, "client_rounds": rounds * num_clients, "clusters": len(sizes),
                    "cluster_sizes": sizes}
        for key, value in expected.items():
            if summary[key] != value or type(summary[key]) is not type(value):
                return f"warmup_summary's {key} is {summary[key]!r}, expected {value!r}"
        losses = summary["train_loss"]
        if not isinstance(losses, list) or len(losses) != rounds \
                or not all(type(loss) is float and math.isfinite(loss) for loss in losses):
            return f"warmup_summary's train_loss is not {rounds} finite losses"
        for key in ("bytes_up", "bytes_down"):
            if type(summary[key]) is not int or summary[key] < 0:
                return f"warmup_summary's {key} is {summary[key]!r}, expected a count of bytes"
        return None
