"""A checkpoint's copies of spilled client-state shards for workers on other nodes than the run
directory's, on a cluster without a shared file system.

A worker that spills keeps its live shard on its own node (engine.state_dir there), but the
checkpoint's copy belongs in the run directory, on the driver's node, and a worker restarted on any
node must read it back. `CopyRelay`, an actor pinned to the driver's node, writes and reads those
copies for the workers elsewhere, one part (8 MiB) per call, so neither side holds a whole shard;
`RelayedCopies` is what such a worker uses in place of its own file system (the interface of
rayfed.engine.state_store.LocalCopies). A worker on the driver's node uses its own file system, as
on one node."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import ray

from rayfed.engine.ray_memory import MemoryProbe
from rayfed.engine.state_store import COPY_CHUNK_BYTES, LOCAL_COPIES

# OSError's errno and text, as the relay hands a failure back (an exception would reach the worker
# wrapped in Ray's, without the errno a full disk is told by).
Failure = tuple[int, str]


class CopyRelay(MemoryProbe):
    """The driver's node's file system, for workers elsewhere (and its process's memory, for the run's PSS)."""

    def write(self, path: str, offset: int, data: bytes) -> Failure | None:
        """`data` at `offset` of `path`; offset 0 starts a new file."""
        try:
            if offset == 0:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb" if offset == 0 else "r+b") as out:
                out.seek(offset)
                out.write(data)
        except OSError as error:
            return _failure(error)
        return None

    def finish(self, path: str) -> Failure | None:
        """`path` on the disk (created empty if no part came: a shard with no rows yet)."""
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab") as out:
                os.fsync(out.fileno())
            descriptor = os.open(Path(path).parent, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        except OSError as error:
            return _failure(error)
        return None

    def read(self, path: str, offset: int, size: int) -> bytes | Failure:
        try:
            with open(path, "rb") as file:
                file.seek(offset)
                return file.read(size)
        except OSError as error:
            return _failure(error)


def _failure(error: OSError) -> Failure:
    return error.errno or 0, error.strerror or str(error)


class RelayedCopies:
    """LocalCopies' interface, through `relay` for a worker that is not on `node` (the driver's)."""

    def __init__(self, relay: Any, node: str):
        self.relay = relay
        self.node = node

    def _here(self) -> bool:
        return ray.get_runtime_context().get_node_id() == self.node

    def write(self, path: Path, parts: Iterator[bytes]) -> None:
        if self._here():
            LOCAL_COPIES.write(path, parts)
            return
        offset = 0
        for part in parts:
            _raise(ray.get(self.relay.write.remote(str(path), offset, bytes(part))), path)
            offset += len(part)
        _raise(ray.get(self.relay.finish.remote(str(path))), path)

    def read(self, path: Path, size: int) -> Iterator[bytes]:
        if self._here():
            yield from LOCAL_COPIES.read(path, size)
            return
        for start in range(0, size, COPY_CHUNK_BYTES):
            yield self._read(path, start, min(COPY_CHUNK_BYTES, size - start))
        yield self._read(path, size, 1)

    def _read(self, path: Path, offset: int, size: int) -> bytes:
        part = ray.get(self.relay.read.remote(str(path), offset, size))
        _raise(part, path)
        return part


def _raise(outcome: bytes | Failure | None, path: Path) -> None:
    if isinstance(outcome, tuple):
        errno, text = outcome
        raise OSError(errno, text, str(path))
