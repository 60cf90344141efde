"""What travels between the server and the workers each round."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rayfed.algorithms.base import Upload


@dataclass
class Broadcast:
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
