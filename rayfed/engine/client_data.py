"""A worker's access to its clients' training samples: rows of the shared training arrays (an
eager dataset, as the engine shipped it), or made on demand from an on-demand dataset's source
(rayfed.data.lazy) when a client trains, and dropped with the round."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rayfed.data.lazy import ClientSource, is_lazy
from rayfed.engine.gpu_share import export_handles, map_handles
from rayfed.stored_arrays import shared_tensor

# One client's data for one round: inputs and labels it indexes, and its rows in them.
ClientRows = tuple[Tensor, Tensor, Tensor]


def worker_data(dataset, partition) -> tuple:
    """What the engine hands each worker: the training arrays and the partition, or an on-demand
    dataset's source alone (a few numbers; its sizes stay with the server)."""
    if is_lazy(dataset):
        return dataset.source, None
    return (dataset.train_x, dataset.train_y), partition


class SharedArrays:
    """An eager dataset: every client is rows of the same arrays, which stay resident. On a GPU they are moved
    there when a client first trains, unless the worker maps another worker's copy before (rayfed.engine.gpu_share)."""

    def __init__(self, train_data: tuple[np.ndarray, np.ndarray], partition, device: torch.device):
        self.host = train_data
        self.partition = partition
        self.device = device
        self.arrays: tuple[Tensor, Tensor] | None = None

    def resident(self) -> tuple[Tensor, Tensor]:
        if self.arrays is None:
            self.arrays = (shared_tensor(self.host[0], self.device), shared_tensor(self.host[1], self.device))
        return self.arrays

    def export(self) -> list[tuple]:
        return export_handles(self.resident())

    def map(self, handles: list[tuple]) -> None:
        self.arrays = map_handles(handles)

    def materialise(self, client_ids: list[int]) -> list[ClientRows]:
        train_x, train_y = self.resident()
        return [(train_x, train_y, shared_tensor(self.partition.client(client_id), self.device))
                for client_id in client_ids]


class OnDemand:
    """An on-demand dataset: the clients asked for are made from the source, into arrays of their
    own that live as long as the round's tasks."""

    def __init__(self, source: ClientSource, device: torch.device):
        self.source = source
        self.device = device

    def materialise(self, client_ids: list[int]) -> list[ClientRows]:
        """The clients' samples in one pair of arrays (a batched round indexes them together)."""
        made = [self.source.client(client_id) for client_id in client_ids]
        sizes = [len(y) for _, y in made]
        train_x = shared_tensor(np.concatenate([x for x, _ in made]), self.device)
        train_y = shared_tensor(np.concatenate([y for _, y in made]), self.device)
        starts = np.cumsum([0, *sizes[:-1]])
        return [(train_x, train_y, torch.arange(start, start + size, device=self.device))
                for start, size in zip(starts.tolist(), sizes)]


def client_data(train_data, partition, device: torch.device) -> SharedArrays | OnDemand:
    """The worker's clients, from what worker_data gave it."""
    if isinstance(train_data, tuple):
        return SharedArrays(train_data, partition, device)
    return OnDemand(train_data, device)
