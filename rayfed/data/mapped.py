"""File-backed clients made on demand: a ClientSource (rayfed.data.lazy) whose clients are index
lists into .npy files, read through memory maps when a client trains.

Only the paths and the index lists travel to the workers; each process maps the files itself, so
every node needs them at the same path (a shared file system, or data.root copied to each node),
and the operating system's page cache, not Ray's object store, shares their pages between the
processes of a node. A dataset kept as LEAF's JSON or as image files is converted once (`save`)."""
from __future__ import annotations

import functools
import os
import pathlib
from dataclasses import dataclass

import numpy as np

from rayfed.data.partition import Partition


def _mapped(path: str) -> np.ndarray:
    """The .npy file as a read-only memory map, opened once per process and again when the file was replaced."""
    status = os.stat(path)
    return _map(path, status.st_ino, status.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _map(path: str, inode: int, modified_ns: int) -> np.ndarray:
    return np.load(path, mmap_mode="r")


@dataclass(frozen=True)
class MappedClients:
    """Client k's samples are rows `rows.client(k)` of the arrays in `inputs` and `labels` (.npy files)."""

    inputs: str
    labels: str
    rows: Partition

    def sizes(self) -> np.ndarray:
        return self.rows.sizes

    def client(self, client_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the client's rows: only those pages of the files are read."""
        rows = self.rows.client(client_id)
        return np.array(_mapped(self.inputs)[rows]), np.array(_mapped(self.labels)[rows])


def save(folder: str | os.PathLike, inputs: np.ndarray, labels: np.ndarray, rows: Partition) -> MappedClients:
    """`inputs` and `labels` written as folder/inputs.npy and folder/labels.npy (each written to a
    temporary name, then renamed, so a reader never maps half a file), as the clients `rows`."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, array in (("inputs", inputs), ("labels", labels)):
        path = folder / f"{name}.npy"
        partial = folder / f"{name}.npy.tmp"
        with open(partial, "wb") as file:
            np.save(file, np.ascontiguousarray(array))
        os.replace(partial, path)
        paths.append(str(path.resolve()))
    return MappedClients(*paths, rows)
