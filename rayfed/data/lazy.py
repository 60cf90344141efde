"""Clients materialised on demand: a dataset that describes its clients without building them.

An on-demand dataset's loader (registered with `register_dataset(..., lazy=True)`) returns a
`LazyDataset`: a bounded test set, held like any dataset's, and a `ClientSource`, which knows each
client's training-sample count and makes one client's samples when asked. The source travels to
every worker instead of the training arrays, so what a run holds before its first round is the
test set and N small integers, whatever N; a client's rows exist only while it trains.

A source is deterministic and self-contained: `client(k)` returns the same arrays in any process,
at any time, alone or after any other client (so a run's bits do not depend on which worker
trains whom), and pickling it ships parameters, not data."""
from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from rayfed.data.base import Dataset
from rayfed.data.partition import Partition
from rayfed.errors import ConfigError

# partition.csv of an on-demand dataset holds each client's size (its classes would mean making every
# client); beyond this many clients it is not written.
SIZES_CSV_MAX_CLIENTS = 100_000
# train.eval_train_loss makes every client of an on-demand dataset (once, in the driver): refused beyond this many.
TRAIN_LOSS_MAX_CLIENTS = 10_000


@runtime_checkable
class ClientSource(Protocol):
    """The clients of an on-demand dataset."""

    def sizes(self) -> np.ndarray:
        """Each client's training-sample count (num_clients integers)."""

    def client(self, client_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Client `client_id`'s training inputs (float32 or int64, shape (n, *input_shape)) and labels ((n,) int64)."""


@dataclass
class LazyDataset:
    """What an on-demand loader returns: its clients as a source, its test set as arrays."""

    name: str
    source: ClientSource
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]

    def materialise(self) -> Dataset:
        """Every client built, in id order, as an eager Dataset whose natural partition is the
        clients: what the on-demand run is equal to (for tests and small N)."""
        sizes = np.asarray(self.source.sizes(), dtype=np.int64)
        clients = [self.source.client(client_id) for client_id in range(len(sizes))]
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])
        return Dataset(self.name, np.concatenate([x for x, _ in clients]), np.concatenate([y for _, y in clients]),
                       self.test_x, self.test_y, self.num_classes, self.input_shape,
                       natural_partition=Partition(np.arange(offsets[-1], dtype=np.int64), offsets))


@dataclass(frozen=True)
class ClientSizes:
    """The partition of an on-demand dataset: each client's training-sample count and nothing else
    (its rows are made where it trains)."""

    sizes: np.ndarray

    @property
    def num_clients(self) -> int:
        return len(self.sizes)


def client_sizes(dataset: LazyDataset, num_clients: int) -> ClientSizes:
    """The source's sizes, checked: one per client, each client with a sample to train on."""
    sizes = np.asarray(dataset.source.sizes())
    if sizes.shape != (num_clients,) or sizes.dtype.kind not in "iu":
        raise ConfigError(f"data.dataset={dataset.name}: its source gives sizes of shape {sizes.shape} and dtype "
                          f"{sizes.dtype}, not {num_clients} integers (data.num_clients)")
    if num_clients and sizes.min() < 1:
        raise ConfigError(f"data.dataset={dataset.name}: client {int(np.argmin(sizes))} has no training samples")
    return ClientSizes(sizes)


def write_sizes_csv(path: pathlib.Path, sizes: np.ndarray) -> None:
    """partition.csv's first two columns, client_id and num_samples."""
    lines = "".join(f"{client_id},{size}\n" for client_id, size in enumerate(sizes.tolist()))
    path.write_text("client_id,num_samples\n" + lines)


def is_lazy(dataset) -> bool:
    return isinstance(dataset, LazyDataset)
