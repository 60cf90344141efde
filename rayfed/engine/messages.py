"""What travels between the server and the workers each round."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from rayfed.algorithms.base import Upload
from rayfed.exact_sum import CompactSum, ExactSum
from rayfed.stored_arrays import owned_tensor


class ShippedAsNumpy:
    """Pickles its tensors as numpy arrays. Ray serialises numpy arrays as out-of-band buffers,
    read zero-copy from the object store, but torch tensors through torch's own pickling: on the
    ray engine's small-model rounds that was most of the broadcast's and the uploads' cost. The
    values are the same bits either way. An exact sum travels compacted (rayfed.exact_sum.CompactSum)."""

    def __reduce__(self):
        return _rebuild, (type(self), tuple(_to_numpy(getattr(self, field.name)) for field in fields(self)))


def _to_numpy(value):
    if isinstance(value, ExactSum):
        return value.compact()
    if isinstance(value, Tensor) and value.device.type == "cpu" and value.dtype in _NUMPY_DTYPES:
        return value.numpy()
    if isinstance(value, dict):
        return {name: _to_numpy(item) for name, item in value.items()}
    return value


def _from_numpy(value):
    if isinstance(value, np.ndarray):
        return owned_tensor(value)
    if isinstance(value, dict):
        return {name: _from_numpy(item) for name, item in value.items()}
    return value


def _rebuild(cls, values: tuple):
    return cls(*(_from_numpy(value) for value in values))


_NUMPY_DTYPES = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                 torch.uint8, torch.bool}


@dataclass
class Broadcast(ShippedAsNumpy):
    """The algorithm's downlink tensors plus the global model's BatchNorm buffers."""

    tensors: dict[str, Tensor]
    buffers: Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.tensors.values(), self.buffers))


@dataclass
class ClientResult:
    client_id: int
    upload: Upload
    buffers: Tensor     # the client's BatchNorm buffers after local training

    @property
    def nbytes(self) -> int:
        return self.upload.nbytes + self.buffers.numel() * self.buffers.element_size()

    @property
    def floats(self) -> int:
        """Entries of its upload and buffers."""
        return sum(t.numel() for t in self.upload.tensors.values()) + self.buffers.numel()


@dataclass
class WorkerTiming:
    """When a worker's train call ran, in wall-clock seconds (time.time(), comparable across the
    processes of one machine): how long after the driver sent it the call started (the broadcast
    on its way), and how long its training and packing took."""

    waited_s: float
    train_s: float
    pack_s: float
    finished_at: float


@dataclass
class WorkerResult(ShippedAsNumpy):
    """One worker's clients for one round, packed as one stacked tensor per upload name: a
    round then moves a few tensors per worker instead of a few per client, which is what
    dominates (de)serialisation time when clients are many and models small."""

    client_ids: list[int]
    num_samples: list[int]
    metrics: list[dict[str, float]]
    tensors: dict[str, Tensor]      # name -> (clients, ...) stacked in client_ids order
    buffers: Tensor                 # (clients, number of buffer entries)
    timing: WorkerTiming | None = None

    @classmethod
    def pack(cls, results: list[ClientResult]) -> "WorkerResult":
        names = results[0].upload.tensors
        return cls(client_ids=[r.client_id for r in results],
                   num_samples=[r.upload.num_samples for r in results],
                   metrics=[r.upload.metrics for r in results],
                   tensors={name: torch.stack([r.upload.tensors[name] for r in results]) for name in names},
                   buffers=torch.stack([r.buffers for r in results]))

    @classmethod
    def from_stacked(cls, client_ids: list[int], upload: Upload, buffers: Tensor) -> "WorkerResult":
        """From a vectorised upload (tensors and metrics stacked over `client_ids`) and the clients'
        running statistics (rows of `buffers`)."""
        return cls(client_ids=list(client_ids), num_samples=list(upload.num_samples),
                   metrics=unstacked_metrics(upload.metrics, len(client_ids)),
                   tensors={name: stacked.cpu() for name, stacked in upload.tensors.items()},
                   buffers=buffers.cpu())

    def to(self, device: torch.device) -> "WorkerResult":
        return WorkerResult(self.client_ids, self.num_samples, self.metrics,
                            {name: stacked.to(device) for name, stacked in self.tensors.items()},
                            self.buffers.to(device), self.timing)

    def unpack(self) -> list[ClientResult]:
        return [ClientResult(client_id,
                             Upload({name: stacked[row] for name, stacked in self.tensors.items()},
                                    self.num_samples[row], self.metrics[row]),
                             self.buffers[row])
                for row, client_id in enumerate(self.client_ids)]


@dataclass
class ClientRecord:
    """A client's part of a round under engine.partial_sums: its upload without the tensors, which
    travel summed over its worker's clients, and what they took (for the round's traffic figures)."""

    client_id: int
    upload: Upload      # no tensors: the sample count and the training metrics
    nbytes: int         # its upload's and buffers' bytes, as ClientResult.nbytes
    floats: int         # their entries, as ClientResult.floats


@dataclass
class WorkerSums(ShippedAsNumpy):
    """One worker's clients for one round under engine.partial_sums: per client its sample count,
    metrics and sizes; per upload name one exact sum over the clients (rayfed.exact_sum), weighted by
    n_i (agg_weighting `num_samples`) or 1 (`uniform`), and the n_i-weighted sum of their BatchNorm buffers.
    A round then moves one vector's worth per worker and upload name, whatever its number of clients."""

    client_ids: list[int]
    num_samples: list[int]
    metrics: list[dict[str, float]]
    nbytes: list[int]
    floats: list[int]
    weighting: str
    # Compacted while they travel (rayfed.exact_sum.CompactSum), and added so on the server's device.
    sums: dict[str, ExactSum | CompactSum]
    buffers: ExactSum | CompactSum
    timing: WorkerTiming | None = None

    @classmethod
    def pack(cls, results: list[ClientResult], weighting: str) -> "WorkerSums":
        return cls.from_stacked([r.client_id for r in results],
                                Upload({name: torch.stack([r.upload.tensors[name] for r in results])
                                        for name in results[0].upload.tensors},
                                       [r.upload.num_samples for r in results], {}),
                                torch.stack([r.buffers for r in results]), weighting,
                                [r.upload.metrics for r in results])

    @classmethod
    def from_stacked(cls, client_ids: list[int], upload: Upload, buffers: Tensor, weighting: str,
                     metrics: list[dict[str, float]] | None = None) -> "WorkerSums":
        """From tensors stacked over `client_ids` (`upload.num_samples` a list, and with `metrics`
        None, `upload.metrics` stacked too, as a vectorised upload's) and the clients' buffers (rows)."""
        num_samples = [int(n) for n in upload.num_samples]
        if metrics is None:
            metrics = unstacked_metrics(upload.metrics, len(client_ids))
        weights = 1 if weighting == "uniform" else num_samples
        row_bytes = (sum(t[0].numel() * t.element_size() for t in upload.tensors.values())
                     + buffers[0].numel() * buffers.element_size())
        row_floats = sum(t[0].numel() for t in upload.tensors.values()) + buffers[0].numel()
        return cls(client_ids=list(client_ids), num_samples=num_samples, metrics=metrics,
                   nbytes=[row_bytes] * len(client_ids), floats=[row_floats] * len(client_ids), weighting=weighting,
                   sums={name: ExactSum(stacked.shape[1:], stacked.device).add(stacked, weights)
                         for name, stacked in upload.tensors.items()},
                   buffers=ExactSum(buffers.shape[1:], buffers.device).add(buffers, num_samples))

    def to(self, device: torch.device) -> "WorkerSums":
        """Integer limbs: their sum, and the float read from it, are the same on any device."""
        return dataclasses.replace(self, sums={name: total.to(device) for name, total in self.sums.items()},
                                   buffers=self.buffers.to(device))

    def unpack(self) -> list[ClientRecord]:
        return [ClientRecord(client_id, Upload({}, self.num_samples[row], self.metrics[row]), self.nbytes[row],
                             self.floats[row])
                for row, client_id in enumerate(self.client_ids)]


def unstacked_metrics(stacked: dict[str, Tensor], clients: int) -> list[dict[str, float]]:
    """A vectorised upload's metrics, stacked over its clients, as one dict per client."""
    values = {name: column.tolist() for name, column in stacked.items()}
    return [{name: column[row] for name, column in values.items()} for row in range(clients)]
