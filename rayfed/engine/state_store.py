"""Where a worker keeps its clients' persistent states (SCAFFOLD's control variates, MIFA's latest
updates, ...): in memory, or spilled to one file per worker shard when N x the algorithm's declared
floats per client exceed engine.state_memory_mb. Both give the same bits.

A spilled shard, `shard-W-of-P.bin` in engine.state_dir, is rows of a fixed width, one per client
that has trained, appended in the order clients first commit a state (the order a dict keeps, which
FedGATE's state diagnostics sum in). The row layout is learned from the first state, an object of
one of the algorithm's state classes: each field is a tensor at a fixed offset with its dtype and
shape, a number (8 bytes), or always None; which fields of a row are None is kept in memory beside
the row index, and fields the algorithm declares transient (Algorithm.transient_client_fields) stay
in memory until the next write. A row's tensor bytes must be the floats per client the algorithm
declares (Algorithm.client_state_floats), which states kept in memory are checked against too. Rows
are written with pwrite, not through a mapping, so a full disk is an error at the write that meets
it (a mapped write would be a SIGBUS), and the file's pages are the page cache's, not the worker's.

A checkpoint copies each shard's rows beside checkpoint.pt and records their SHA-256 with the row
index; a worker restored from it (after a restart, or on resume) copies them back, checking the
digest on the way. The copies travel through `StateStorage.copies`: the file system of the worker's
own process, or, for a worker on another node than the run directory's, the ray engine's relay
(rayfed.engine.ray_copies).
"""
from __future__ import annotations

import copy
import errno
import fcntl
import hashlib
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol

import numpy as np
import torch
from torch import Tensor

from rayfed.algorithms.base import FLOAT32_BYTES, Algorithm
from rayfed.errors import ConfigError

# A state diagnostic (Algorithm.summarize_client_states) reads a spilled shard in parts of at most
# this many bytes, each summarised on its own as another worker's would be: up to this size the
# diagnostics have the bits of states kept in memory.
SUMMARY_CHUNK_BYTES = 256 * 2**20
COPY_CHUNK_BYTES = 8 * 2**20
ALIGNMENT = 8
SCALARS = {"int": int, "float": float, "bool": bool}
CHECKPOINT_DIR = "checkpoint.d"


class SpillFailed(Exception):
    """Spilled client states could not be written (a full disk): one line, the run stops."""


class Copies(Protocol):
    """How a checkpoint's copies of spilled shards are written into and read from the run directory."""

    def write(self, path: Path, parts: Iterable[bytes]) -> None:
        """`parts` one after another into a new file at `path`, on the disk when this returns; OSError otherwise."""

    def read(self, path: Path, offset: int, size: int) -> bytes:
        """At most `size` bytes of `path` from `offset` (fewer at its end); OSError otherwise."""


class LocalCopies:
    """Copies written and read where this process runs: the run directory is on its disk (one machine,
    or a file system that the nodes share)."""

    def write(self, path: Path, parts: Iterable[bytes]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:
            for part in parts:
                out.write(part)
            out.flush()
            os.fsync(out.fileno())
        fsync_directory(str(path.parent))

    def read(self, path: Path, offset: int, size: int) -> bytes:
        with open(path, "rb") as file:
            file.seek(offset)
            return file.read(size)


LOCAL_COPIES = LocalCopies()


@dataclass(frozen=True)
class StateStorage:
    """Where a run's workers keep client states: in memory, or spilled to files in `directory`; and
    how a checkpoint's copies of those files reach the run directory."""

    directory: str | None = None
    copies: Copies = LOCAL_COPIES

    @property
    def spilled(self) -> bool:
        return self.directory is not None

    def shard_path(self, worker_index: int, num_workers: int) -> Path:
        return Path(self.directory) / shard_name(worker_index, num_workers)

    def remove_files(self, num_workers: int, workers: Iterable[int] | None = None) -> None:
        """The live shards of `workers` (default: all) once the run ended: only the checkpoint's copies are
        ever read again."""
        if not self.spilled:
            return
        for worker in range(num_workers) if workers is None else workers:
            self.shard_path(worker, num_workers).unlink(missing_ok=True)
        try:
            os.rmdir(self.directory)
        except OSError:
            pass        # not empty: not only ours


IN_MEMORY = StateStorage()


def shard_name(worker_index: int, num_workers: int) -> str:
    return f"shard-{worker_index}-of-{num_workers}.bin"


def tensors_to(value: Any, device: torch.device) -> Any:
    """`value` with every tensor inside it (in dicts, lists, tuples and rayfed's state objects) on `device`;
    `value` itself is not changed. Checkpoints hold CPU tensors so that any process can read them."""
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: tensors_to(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(tensors_to(item, device) for item in value)
    if type(value).__module__.startswith("rayfed.") and hasattr(value, "__dict__"):
        moved = copy.copy(value)
        moved.__dict__.update({key: tensors_to(item, device) for key, item in vars(value).items()})
        return moved
    return value


@dataclass(frozen=True)
class Field:
    name: str
    # "tensor", "int", "float", "bool", "none" (None in the layout's first state), or "transient"
    # (Algorithm.transient_client_fields: not in the row)
    kind: str
    dtype: str = ""             # a tensor's torch dtype, as "float32"
    shape: tuple[int, ...] = ()
    offset: int = 0             # in the row
    nbytes: int = 0


@dataclass(frozen=True)
class StateLayout:
    """How one client's state, an object of the declared state class `cls`, lies in a row."""

    cls: str
    fields: tuple[Field, ...]
    row_bytes: int

    @property
    def tensor_bytes(self) -> int:
        return sum(field.nbytes for field in self.fields if field.kind == "tensor")

    def to_dict(self) -> dict:
        return {"cls": self.cls, "row_bytes": self.row_bytes,
                "fields": [[f.name, f.kind, f.dtype, list(f.shape), f.offset, f.nbytes] for f in self.fields]}

    @classmethod
    def from_dict(cls, saved: dict) -> "StateLayout":
        fields = tuple(Field(name, kind, dtype, tuple(shape), offset, nbytes)
                       for name, kind, dtype, shape, offset, nbytes in saved["fields"])
        return cls(saved["cls"], fields, saved["row_bytes"])


class RowCodec:
    """Rows to and from states of one algorithm: its layout, learned from a first state (or read
    from a checkpoint) and checked against what the algorithm declares."""

    def __init__(self, algorithm: Algorithm, name: str, declared_floats: int):
        self.algorithm = algorithm
        self.name = name
        self.declared_floats = declared_floats
        self.transient = set(algorithm.transient_client_fields)
        self.layout: StateLayout | None = None
        self.state_class: type | None = None
        self.checked = False

    def learn(self, state: Any) -> None:
        """The layout of `state`'s fields, in their order: numbers first in the row (8 bytes each,
        keeping the tensors 8-byte aligned), then tensors."""
        cls, items = self._items(state)
        numbers = 8 * sum(type(value) in SCALARS.values() and name not in self.transient for name, value in items)
        fields, scalar_offset, tensor_offset = [], 0, numbers
        for name, value in items:
            if name in self.transient:
                fields.append(Field(name, "transient"))
            elif isinstance(value, Tensor):
                nbytes = value.numel() * value.element_size()
                fields.append(Field(name, "tensor", str(value.dtype).removeprefix("torch."), tuple(value.shape),
                                    tensor_offset, nbytes))
                tensor_offset += _aligned(nbytes)
            elif value is None:
                fields.append(Field(name, "none"))
            elif type(value) in SCALARS.values():
                fields.append(Field(name, type(value).__name__, offset=scalar_offset, nbytes=8))
                scalar_offset += 8
            else:
                raise ConfigError(f"algorithm {self.name!r}: a spilled client state holds tensors, numbers and None; "
                                  f"its field {name!r} is a {type(value).__name__}; keep the states in memory "
                                  f"(raise engine.state_memory_mb)")
        self.adopt(StateLayout(cls, tuple(fields), _aligned(tensor_offset)))

    def adopt(self, layout: StateLayout) -> None:
        """Takes `layout` (learned, or a checkpoint's) once its width is the declared one."""
        self._check_width(layout.tensor_bytes)
        known = {qualified(state_class): state_class for state_class in self.algorithm.state_classes}
        if layout.cls not in known:
            raise ConfigError(f"algorithm {self.name!r}: client state class {layout.cls} is not among its "
                              f"state_classes")
        self.state_class = known[layout.cls]
        self.layout = layout

    def check(self, state: Any) -> None:
        """The declaration holds for a state kept in memory (the first one is checked): its tensors,
        transient fields aside, are the declared floats."""
        if self.checked:
            return
        if hasattr(state, "__dict__") and not isinstance(state, Tensor):
            state = {key: value for key, value in vars(state).items() if key not in self.transient}
        self._check_width(_held_bytes(state))

    def _check_width(self, kept: int) -> None:
        if kept != self.declared_floats * FLOAT32_BYTES:
            raise ConfigError(f"algorithm {self.name!r} keeps {kept / FLOAT32_BYTES:g} floats per client in its client "
                              f"state but declares {self.declared_floats} (Algorithm.client_state_floats, or "
                              f"memory_bytes()['client states'] of one client); declare what it keeps, so that the "
                              f"states can be budgeted and spilled")
        self.checked = True

    def encode(self, state: Any, row: np.ndarray, nones: np.ndarray) -> dict[str, Any]:
        """Writes `state` into `row` and its None flags into `nones`; returns its transient fields."""
        cls, items = self._items(state)
        values = dict(items)
        if cls != self.layout.cls or set(values) != {field.name for field in self.layout.fields}:
            raise ConfigError(f"algorithm {self.name!r} returned client states of different structures "
                              f"({self.layout.cls} and {cls}); a spilled state needs one")
        for index, field in enumerate(self.layout.fields):
            value = values[field.name]
            nones[index] = value is None
            if value is None or field.kind == "transient":
                continue
            if field.kind == "tensor" and isinstance(value, Tensor) and tuple(value.shape) == field.shape \
                    and str(value.dtype).removeprefix("torch.") == field.dtype:
                row[field.offset:field.offset + field.nbytes] = \
                    value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            elif field.kind in SCALARS and type(value) is SCALARS[field.kind]:
                scalar = np.float64(value) if field.kind == "float" else np.int64(value)
                row[field.offset:field.offset + 8] = np.frombuffer(scalar.tobytes(), np.uint8)
            else:
                was = "None" if field.kind == "none" else f"{field.kind} {list(field.shape)} {field.dtype}".strip()
                raise ConfigError(f"algorithm {self.name!r}: field {field.name!r} of a client state was {was} in the "
                                  f"first state and is {_describe(value)} now; a spilled state keeps every field's "
                                  f"kind and shape (fields that only live until the server's reply are declared in "
                                  f"Algorithm.transient_client_fields)")
        return {name: value for name, value in items if name in self.transient and value is not None}

    def decode(self, row: bytearray | memoryview, start: int, nones: np.ndarray, device: torch.device,
               transient: dict[str, Any] | None = None) -> Any:
        values = {}
        for index, field in enumerate(self.layout.fields):
            if field.kind == "transient":
                values[field.name] = (transient or {}).get(field.name)
            elif nones[index] or field.kind == "none":
                values[field.name] = None
            elif field.kind == "tensor":
                values[field.name] = _tensor(row, start + field.offset, field).to(device)
            else:
                raw = np.frombuffer(row, np.float64 if field.kind == "float" else np.int64, 1, start + field.offset)[0]
                values[field.name] = SCALARS[field.kind](raw.item())
        state = self.state_class.__new__(self.state_class)
        state.__dict__.update(values)
        return state

    def _items(self, state: Any) -> tuple[str, list[tuple[str, Any]]]:
        if type(state) in self.algorithm.state_classes:
            return qualified(type(state)), list(vars(state).items())
        raise ConfigError(f"algorithm {self.name!r}: a client state of type {type(state).__name__} cannot be spilled "
                          f"(only its declared state classes); keep the states in memory (raise "
                          f"engine.state_memory_mb)")


class MemoryStore:
    """Today's dict of client states: the default, and what a run whose states fit its budget uses."""

    def __init__(self, codec: RowCodec, device: torch.device, copies: Copies):
        self.copies = copies
        self.codec = codec
        self.device = device
        self.states: dict[int, Any] = {}

    def get(self, client_id: int) -> Any | None:
        return self.states.get(client_id)

    def put_many(self, states: dict[int, Any]) -> None:
        for state in states.values():
            self.codec.check(state)
        self.states.update(states)

    def __len__(self) -> int:
        return len(self.states)

    def chunks(self) -> Iterator[list[Any]]:
        yield list(self.states.values())

    def nbytes(self) -> int:
        return sum(self.codec.algorithm.state_bytes(state) for state in self.states.values())

    def snapshot(self, directory: str) -> tuple[dict[int, Any], dict | None]:
        return {client: tensors_to(state, torch.device("cpu")) for client, state in self.states.items()}, None

    def restore(self, states: dict[int, Any], shard: dict | None) -> None:
        self.states = dict(read_shard(shard, self.codec, self.device, self.copies)) if shard is not None else {}
        self.states.update({client: tensors_to(state, self.device) for client, state in states.items()})


class SpilledStore:
    """The states of one worker's clients as rows of one file (see the module's docstring)."""

    def __init__(self, path: Path, codec: RowCodec, device: torch.device, num_clients: int, worker_index: int,
                 num_workers: int, copies: Copies):
        self.path = path
        self.copies = copies
        self.codec = codec
        self.device = device
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.slots = -(-num_clients // num_workers)       # client c's slot: c // P
        self.fd: int | None = None
        self.failure: str | None = None
        self._reset()

    def _reset(self) -> None:
        self.row_of: np.ndarray | None = None     # per slot: its row, -1 while the client has no state
        self.clients = np.empty(0, np.int64)      # per row: its client
        self.nones = np.empty((0, 0), np.bool_)   # per row and field: None
        self.count = 0
        self.transients: dict[int, dict[str, Any]] = {}
        self.codec.layout = None
        if self.fd is not None:
            os.ftruncate(self.fd, 0)

    def get(self, client_id: int) -> Any | None:
        self._check_usable()
        row = self._row(client_id)
        if row < 0:
            return None
        buffer = bytearray(self.codec.layout.row_bytes)
        self._read_into(buffer, row * self.codec.layout.row_bytes)
        return self.codec.decode(buffer, 0, self.nones[row], self.device, self.transients.get(client_id))

    def put_many(self, states: dict[int, Any]) -> None:
        """Writes `states`; transient fields are kept until the next put_many (the round's reply)."""
        self._check_usable()
        self.transients = {}
        for client_id, state in states.items():
            if self.codec.layout is None:
                self.codec.learn(state)
            layout = self.codec.layout
            row_bytes = np.zeros(layout.row_bytes, np.uint8)
            nones = np.zeros(len(layout.fields), np.bool_)
            transient = self.codec.encode(state, row_bytes, nones)
            row = self._row(client_id)
            if row < 0:
                row = self._append(client_id)
            self._write(row_bytes, row * layout.row_bytes)
            self.nones[row] = nones
            if transient:
                self.transients[client_id] = transient

    def __len__(self) -> int:
        return self.count

    def chunks(self) -> Iterator[list[Any]]:
        self._check_usable()
        if self.count == 0:
            yield []
            return
        row_bytes = self.codec.layout.row_bytes
        per_chunk = max(1, SUMMARY_CHUNK_BYTES // max(row_bytes, 1))
        for first in range(0, self.count, per_chunk):
            rows = range(first, min(first + per_chunk, self.count))
            buffer = bytearray(len(rows) * row_bytes)
            self._read_into(buffer, first * row_bytes)
            yield [self.codec.decode(buffer, (row - first) * row_bytes, self.nones[row], self.device,
                                     self.transients.get(int(self.clients[row]))) for row in rows]

    def nbytes(self) -> int:
        if self.codec.layout is None:
            return 0
        present = ~self.nones[:self.count]
        held = sum(field.nbytes * int(present[:, index].sum())
                   for index, field in enumerate(self.codec.layout.fields) if field.kind == "tensor")
        return held + sum(value.numel() * value.element_size() for fields in self.transients.values()
                          for value in fields.values() if isinstance(value, Tensor))

    def snapshot(self, directory: str) -> tuple[dict[int, Any], dict]:
        """Copies the rows into `directory` (a checkpoint's) and returns their manifest."""
        self._check_usable()
        layout = self.codec.layout
        row_bytes = layout.row_bytes if layout is not None else 0
        per_part = max(1, COPY_CHUNK_BYTES // max(row_bytes, 1))
        target = Path(directory) / self.path.name
        digest = hashlib.sha256()
        row_digests = np.zeros((self.count, 32), np.uint8)

        def parts() -> Iterator[bytearray]:
            for first in range(0, self.count if layout is not None else 0, per_part):
                rows = range(first, min(first + per_part, self.count))
                part = bytearray(len(rows) * row_bytes)
                self._read_into(part, first * row_bytes)
                digest.update(part)
                for row in rows:
                    start = (row - first) * row_bytes
                    row_digests[row] = row_sha256(memoryview(part)[start:start + row_bytes], self.nones[row])
                yield part

        try:
            self.copies.write(target, parts())
        except OSError as error:
            raise SpillFailed(f"cannot write the checkpoint's copy of worker {self.worker_index}'s client states to "
                              f"{target}: {error.strerror or error}") from None
        return {}, {"worker": self.worker_index, "workers": self.num_workers, "file": target.name,
                    "sha256": digest.hexdigest(), "rows": self.count,
                    "layout": layout.to_dict() if layout is not None else None,
                    "clients": torch.from_numpy(self.clients[:self.count].copy()),
                    "nones": torch.from_numpy(self.nones[:self.count].copy()),
                    "row_sha256": torch.from_numpy(row_digests)}

    def restore(self, states: dict[int, Any], shard: dict | None) -> None:
        """The states of a checkpoint: `shard`'s rows (copied from its file, whose digest is checked)
        and `states`; whatever was kept before is forgotten."""
        self._open()
        self._reset()
        if shard is not None and shard["layout"] is not None:
            self.codec.adopt(StateLayout.from_dict(shard["layout"]))
            try:
                for start, part in _verified_parts(shard, self.codec.layout.row_bytes, self.copies):
                    self._write(np.frombuffer(part, np.uint8), start)
            except Exception:
                self._reset()       # no rows of a copy that could not be read whole
                raise
            clients = shard["clients"].numpy()
            self.clients, self.nones, self.count = clients.copy(), shard["nones"].numpy().copy(), len(clients)
            self._index()[clients // self.num_workers] = np.arange(len(clients))
        if states:
            self.put_many(states)

    def _row(self, client_id: int) -> int:
        return -1 if self.row_of is None else int(self.row_of[client_id // self.num_workers])

    def _index(self) -> np.ndarray:
        if self.row_of is None:
            self.row_of = np.full(self.slots, -1, np.int64)
        return self.row_of

    def _append(self, client_id: int) -> int:
        if self.count == len(self.clients):
            capacity = max(16, 2 * self.count)
            self.clients = np.resize(self.clients, capacity)
            self.nones = np.resize(self.nones, (capacity, len(self.codec.layout.fields)))
        row = self.count
        self.clients[row] = client_id
        self._index()[client_id // self.num_workers] = row
        self.count += 1
        return row

    def _open(self) -> None:
        if self.fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as error:
            raise SpillFailed(f"cannot create {self.path} for client states: {error.strerror or error}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(f"{self.path} is in use by another run; give each run its own engine.state_dir") from None
        self.fd = fd
        weakref.finalize(self, os.close, fd)

    def _write(self, data: np.ndarray, offset: int) -> None:
        self._open()
        view = memoryview(data).cast("B")
        try:
            while len(view):
                written = os.pwrite(self.fd, view, offset)
                view, offset = view[written:], offset + written
        except OSError as error:
            self.failure = (f"cannot write worker {self.worker_index}'s client states to {self.path}: "
                            f"{error.strerror or os.strerror(error.errno or errno.EIO)}")
            raise SpillFailed(self.failure) from None

    def _read_into(self, buffer: bytearray, offset: int) -> None:
        view = memoryview(buffer)
        while len(view):
            read = os.preadv(self.fd, [view], offset)
            if read == 0:
                raise SpillFailed(f"{self.path} ended early: another process changed it")
            view, offset = view[read:], offset + read

    def _check_usable(self) -> None:
        if self.failure is not None:
            raise SpillFailed(self.failure)


ClientStateStore = MemoryStore | SpilledStore


def open_store(storage: StateStorage, algorithm: Algorithm, name: str, declared_floats: int, num_clients: int,
               worker_index: int, num_workers: int, device: torch.device) -> ClientStateStore:
    codec = RowCodec(algorithm, name, declared_floats)
    if not storage.spilled:
        return MemoryStore(codec, device, storage.copies)
    return SpilledStore(storage.shard_path(worker_index, num_workers), codec, device, num_clients, worker_index,
                        num_workers, storage.copies)


def read_shard(shard: dict, codec: RowCodec, device: torch.device, copies: Copies) -> Iterator[tuple[int, Any]]:
    """A checkpoint's spilled shard as (client, state) in row order, for a worker that keeps its
    states in memory; the digest is checked before the last state is given."""
    if shard["layout"] is None:
        return
    codec.adopt(StateLayout.from_dict(shard["layout"]))
    data = bytearray(b"".join(part for _, part in _verified_parts(shard, codec.layout.row_bytes, copies)))
    nones = shard["nones"].numpy()
    for row, client in enumerate(shard["clients"].tolist()):
        yield client, codec.decode(data, row * codec.layout.row_bytes, nones[row], device)


def _verified_parts(shard: dict, row_bytes: int, copies: Copies) -> Iterator[tuple[int, bytes]]:
    """A checkpoint's copy of a shard as (offset, bytes) parts; after the last, a ConfigError of one
    line when its bytes are not those checkpoint.pt records (changed, cut short or grown)."""
    source = Path(shard["path"])
    size = shard["rows"] * row_bytes
    digest = hashlib.sha256()
    for start in range(0, size, COPY_CHUNK_BYTES):
        part = copies.read(source, start, min(COPY_CHUNK_BYTES, size - start))
        digest.update(part)
        yield start, part
    if digest.hexdigest() != shard["sha256"] or copies.read(source, size, 1):
        raise ConfigError(damaged_shard(source))


def row_sha256(row: bytes | memoryview, nones: np.ndarray) -> np.ndarray:
    """The SHA-256 (32 bytes) of one spilled client state: its row and which of its fields are None."""
    digest = hashlib.sha256(row)
    digest.update(np.ascontiguousarray(nones, np.bool_).tobytes())
    return np.frombuffer(digest.digest(), np.uint8)


def damaged_shard(path: Path) -> str:
    return f"{path} is damaged: its bytes no longer match the SHA-256 that checkpoint.pt holds for them"


def _tensor(row, start: int, field: Field) -> Tensor:
    dtype = getattr(torch, field.dtype)
    if field.nbytes == 0:
        return torch.empty(field.shape, dtype=dtype)
    return torch.frombuffer(row, dtype=torch.uint8, count=field.nbytes, offset=start).view(dtype).reshape(field.shape)


def _held_bytes(value: Any) -> int:
    """Bytes of the tensors anywhere inside `value`."""
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(map(_held_bytes, value.values()))
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(map(_held_bytes, value))
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return sum(map(_held_bytes, vars(value).values()))
    return 0


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"tensor {list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return "None" if value is None else type(value).__name__


def fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
