"""A checkpoint's copies of spilled client-state shards for workers on other nodes than the run
directory's, on a cluster without a shared file system.

A worker that spills keeps its live shard on its own node (engine.state_dir there), but the
checkpoint's copy belongs in the run directory, on the driver's node, and a worker restarted on any
node must read it back. `RelayedCopies` (the ray engine's StateStorage.copies) is the file system
of a worker on the driver's node, and elsewhere a `CopyRelay` actor on the driver's node that
writes and reads the run directory for it, one part per call (8 MiB, or one client's state if that
is larger), so neither side holds a whole shard. The relay is made when a worker away from the
driver's node first needs it, by that worker: a run on one node never starts one, nor does a run
whose workers all stay on the driver's node. It dies with the worker that made it (its owner), and
the next worker that needs it makes it again.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any, Iterable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayfed.engine.ray_memory import MemoryProbe
from rayfed.engine.state_store import LOCAL_COPIES, fsync_directory

# Tries of a call whose relay died (with the worker that made it: the next try makes another) or cannot be
# reached for now, and the pause between them.
RELAY_ATTEMPTS = 3
RELAY_PAUSE_S = 1.0
# OSError's errno and text, as the relay hands a failure back (an exception would reach the worker
# wrapped in Ray's, without the errno a full disk is told by).
Failure = tuple[int, str]


class CopyRelay(MemoryProbe):
    """The driver's node's file system, for workers elsewhere (and its process's memory, for the run's
    PSS). A copy is written as `PATH.part` and renamed to PATH once on the disk, so PATH only ever
    holds a whole copy."""

    def write(self, path: str, offset: int, data: bytes) -> Failure | None:
        """`data` at `offset` of the copy being written to `path`; offset 0 starts it."""
        try:
            if offset == 0:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path + ".part", "wb" if offset == 0 else "r+b") as out:
                out.seek(offset)
                out.write(data)
        except OSError as error:
            return _failure(error)
        return None

    def finish(self, path: str) -> Failure | None:
        """The copy at `path`, on the disk (empty if no part came: a shard with no rows yet)."""
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path + ".part", "ab") as out:
                os.fsync(out.fileno())
            os.replace(path + ".part", path)
            fsync_directory(str(Path(path).parent))
        except OSError as error:
            return _failure(error)
        return None

    def read(self, path: str, offset: int, size: int) -> bytes | Failure:
        try:
            return LOCAL_COPIES.read(Path(path), offset, size)
        except OSError as error:
            return _failure(error)


def _failure(error: OSError) -> Failure:
    return error.errno or 0, error.strerror or str(error)


class RelayedCopies:
    """Copies for a worker of a run whose driver is on `node`: its own file system there, the relay
    named `name` elsewhere. Paths are absolute: the relay's working directory is not the driver's."""

    def __init__(self, node: str, name: str):
        self.node = node
        self.name = name
        # The relay, once this process has called it: a named actor lives while a handle to it does.
        self.handle = None

    def write(self, path: Path, parts: Iterable[bytes]) -> None:
        if self._here():
            LOCAL_COPIES.write(path, parts)
            return
        offset = 0
        for part in parts:
            self._call("write", path, offset, part)
            offset += len(part)
        self._call("finish", path)

    def read(self, path: Path, offset: int, size: int) -> bytes:
        if self._here():
            return LOCAL_COPIES.read(path, offset, size)
        return self._call("read", path, offset, size)

    def _here(self) -> bool:
        return ray.get_runtime_context().get_node_id() == self.node

    def _call(self, method: str, path: Path, *arguments) -> Any:
        """The relay's `method` on `path`, its failure as the OSError it was. A relay dies with the worker
        that made it (its owner): the next call makes another, under the same name."""
        for attempt in range(RELAY_ATTEMPTS):
            try:
                if self.handle is None:
                    self.handle = relay(self.node, self.name)
                outcome = ray.get(getattr(self.handle, method).remote(str(path), *arguments))
                break
            except (ray.exceptions.RayActorError, ValueError) as error:
                # A relay that is only unreachable for now keeps its handle: it is what keeps the relay alive.
                if not isinstance(error, ray.exceptions.ActorUnavailableError):
                    self.handle = None
                if attempt == RELAY_ATTEMPTS - 1:
                    raise OSError(errno.EIO, "the copy relay on the driver's node did not answer", str(path)) from None
                time.sleep(RELAY_PAUSE_S)       # until the cluster has let go of a dead relay's name
        if isinstance(outcome, tuple):
            raise OSError(outcome[0], outcome[1], str(path))
        return outcome


def relay(node: str, name: str):
    """The run's relay, made if there is none: pinned to the driver's node, with no CPU of its own. Its
    explicit placement keeps it out of a sweep trial's placement group, which holds only the trial's
    workers' CPUs."""
    return ray.remote(CopyRelay).options(
        name=name, get_if_exists=True, num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)).remote()


def existing_relay(name: str):
    """The run's relay if a worker has made one; else None (also when the cluster cannot tell now)."""
    try:
        return ray.get_actor(name)
    except (ValueError, ray.exceptions.RayError):
        return None
