"""Checkpoints: everything a run needs to continue bit for bit, in one file that says what it belongs to.

Random streams are derived from (seed, purpose, round, client), so "RNG positions" reduce to the
number of completed rounds; the rest is the server's state (algorithm state, memory, BatchNorm
buffers, virtual clock, FedBuff's clients in flight) and every client's persistent state.

checkpoint.pt is a line naming the format, a line of JSON (the header: rounds completed, the
algorithm and model, the SHA-256 of the resolved config and of metrics.jsonl's lines up to that
round, the environment that decided its bits (rayfed.provenance; a resume compares it), what the
body holds (`contents`: the SHA-256 of each part of the server's snapshot, the number of client
states and a SHA-256 over every client's id and the SHA-256 of its state), and a SHA-256 over
header and body), then the body. torch reads the body with weights_only=True:
tensors, plain containers and the state classes listed below are built, and no code from the file
ever runs. The body's `client_digests` are the SHA-256 of each client state it holds; a spilled
shard's manifest has its rows'. So a tool that rewrote the body and recomputed the header's digest,
but not these, is caught naming the part or the client (rayfed.checkpoint_content checks the rest).

Client states spilled to disk (rayfed.engine.state_store) are not in the body: each worker copies
its shard's rows into checkpoint.d/round-R/ beside checkpoint.pt, and the body holds the shard's
manifest (row layout, row index, the file's SHA-256). The copies of older checkpoints are removed
once a newer checkpoint.pt is in place.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor

from rayfed.algorithms.base import Upload
from rayfed.config import Config
from rayfed.engine.messages import ClientResult
from rayfed.engine.state_store import CHECKPOINT_DIR
from rayfed.errors import ConfigError
from rayfed.input_files import parse_json
from rayfed.metrics import METRICS, round_record
from rayfed.registry import ALGORITHMS
from rayfed.systems.async_buffer import AsyncBuffer, InFlight

CHECKPOINT = "checkpoint.pt"
# What a resume may change (rayfed.resume's overrides): the rounds, and the callbacks and loggers,
# which never change the maths. Everything else in config.yaml is pinned by the checkpoint.
RESUME_MAY_CHANGE = ("train.rounds", "logging")
MAGIC = b"rayfed checkpoint, format 2\n"
# The classes a checkpoint body may hold besides tensors, plain containers and the state classes its
# algorithm declares (Algorithm.state_classes): the server's own, FedBuff's clients in flight.
ENGINE_CLASSES = [AsyncBuffer, InFlight, ClientResult, Upload]
HEADER_FIELDS = {"rounds_completed": int, "algorithm": str, "model": str, "config_sha256": str,
                 "metrics_sha256": str, "contents": dict}
# What decided the bits of the rounds it holds (rayfed.provenance); checkpoints written before it was recorded lack it.
OPTIONAL_HEADER_FIELDS = {"environment": dict}


@dataclass
class Checkpoint:
    rounds_completed: int
    algorithm: str
    model: str
    config_sha256: str          # of config.yaml
    metrics_sha256: str         # of metrics.jsonl's first `rounds_completed` lines
    server: dict                # Server.snapshot()
    client_states: dict[int, Any]
    # Spilled client states: one manifest per worker shard, whose rows are in the file it names
    # (relative to the run directory).
    state_shards: list[dict] = field(default_factory=list)
    # As read: the header's record of the body (see the module's docstring), and the body's SHA-256
    # of each client state it holds ({"clients": ids, "sha256": (clients, 32) bytes}). Written
    # checkpoints record them afresh.
    contents: dict = field(default_factory=dict)
    client_digests: dict = field(default_factory=dict)
    environment: dict[str, str] | None = None     # rayfed.provenance's record of the processes that wrote it


SHARD_FIELDS = {"worker": int, "workers": int, "file": str, "sha256": str, "rows": int, "layout": (dict, type(None)),
                "clients": torch.Tensor, "nones": torch.Tensor, "row_sha256": torch.Tensor}


def config_sha256(run_dir: Path) -> str:
    """Of what config.yaml says about everything that decides the run's bits: its keys but those a
    resume may change (RESUME_MAY_CHANGE), read as YAML, so that a resume that extends the rounds or
    changes the callbacks and loggers still finds its checkpoint. A run directory written by an older
    rayfed, whose config.yaml lacks keys added since (which default to the old behaviour), resumes."""
    try:
        return _decisive_sha256(yaml.safe_load((run_dir / "config.yaml").read_bytes()))
    except yaml.YAMLError:
        return ""           # matches no checkpoint: resume says config.yaml changed


def _decisive_sha256(config: Any) -> str:
    kept = dict(config) if isinstance(config, dict) else {"config": config}
    for dotted in RESUME_MAY_CHANGE:
        section, _, key = dotted.rpartition(".")
        if section and isinstance(kept.get(section), dict):
            kept[section] = {name: value for name, value in kept[section].items() if name != key}
        elif not section:
            kept.pop(key, None)
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def _file_sha256(run_dir: Path) -> str:
    """config.yaml's bytes, as checkpoints written before RESUME_MAY_CHANGE recorded them."""
    return hashlib.sha256((run_dir / "config.yaml").read_bytes()).hexdigest()


def write_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> None:
    body = io.BytesIO()
    client_digests = {"clients": torch.tensor(sorted(checkpoint.client_states), dtype=torch.int64)}
    client_digests["sha256"] = torch.from_numpy(np.stack(
        [np.frombuffer(content_sha256(checkpoint.client_states[client]), np.uint8)
         for client in client_digests["clients"].tolist()]) if checkpoint.client_states else np.zeros((0, 32), np.uint8))
    payload = {"server": checkpoint.server, "client_states": checkpoint.client_states, "client_digests": client_digests}
    if checkpoint.state_shards:
        payload["state_shards"] = checkpoint.state_shards
    torch.save(payload, body)
    header = {name: getattr(checkpoint, name) for name in HEADER_FIELDS if name != "contents"}
    if checkpoint.environment is not None:
        header["environment"] = checkpoint.environment
    header["contents"] = {
        "server_sha256": {part: content_sha256(value).hex() for part, value in checkpoint.server.items()},
        "client_states": len(checkpoint.client_states) + sum(shard["rows"] for shard in checkpoint.state_shards),
        "client_states_sha256": client_table_sha256(client_digests, checkpoint.state_shards)}
    header["sha256"] = _digest(header, body.getvalue())
    temporary = run_dir / (CHECKPOINT + ".tmp")
    with open(temporary, "wb") as file:
        file.write(MAGIC + json.dumps(header).encode() + b"\n" + body.getvalue())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, run_dir / CHECKPOINT)      # a crash mid-write leaves the previous checkpoint intact
    directory = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(directory)                          # the rename itself survives a power cut
    finally:
        os.close(directory)
    kept = {PurePosixPath(shard["file"]).parts[1] for shard in checkpoint.state_shards}
    for older in (run_dir / CHECKPOINT_DIR).glob("*"):
        if older.name not in kept:
            shutil.rmtree(older, ignore_errors=True)


def shard_directory(run_dir: Path, rounds_completed: int) -> Path:
    """A directory for the spilled shards of the checkpoint after `rounds_completed` rounds, not the
    one that checkpoint.pt refers to now (which must stay intact until the new one replaces it)."""
    name, again = f"round-{rounds_completed}", 1
    while (run_dir / CHECKPOINT_DIR / name).exists():
        name, again = f"round-{rounds_completed}-{again}", again + 1
    return run_dir / CHECKPOINT_DIR / name


def has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / CHECKPOINT).is_file()


def read_checkpoint(run_dir: Path) -> Checkpoint:
    """The checkpoint in `run_dir`, verified against its own digest. Any damage is a ConfigError of one line."""
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no {CHECKPOINT} to resume from (runs write one every "
                          f"train.checkpoint_every rounds)")
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise ConfigError(f"{path} is not a rayfed checkpoint of this version")
    header_line, _, body = data[len(MAGIC):].partition(b"\n")
    header = _parse_header(path, header_line)
    recorded = header.pop("sha256")
    if recorded != _digest(header, body):
        raise ConfigError(f"{path} is damaged: its bytes no longer match the SHA-256 written with them")
    if header["algorithm"] not in ALGORITHMS:
        raise ConfigError(f"{path} holds the state of algorithm {header['algorithm']!r}, which is not registered "
                          f"(is its plugin in the config's plugins?)")
    allowed = [*ENGINE_CLASSES, *ALGORITHMS.get(header["algorithm"]).target.state_classes]
    try:
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            # A body pickled with another protocol is refused below, in one line, not after torch's three.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            payload = torch.load(io.BytesIO(body), weights_only=True, map_location="cpu")
    except Exception as error:  # torch raises many types for a bad body; all mean the same to the user
        raise ConfigError(f"{path} is damaged: its body cannot be read ({type(error).__name__})") from None
    client_states = payload.get("client_states") if isinstance(payload, dict) else None
    shards = payload.get("state_shards", []) if isinstance(payload, dict) else None
    digests = payload.get("client_digests") if isinstance(payload, dict) else None
    if not isinstance(client_states, dict) or not isinstance(payload.get("server"), dict) \
            or not all(type(client) is int and client >= 0 for client in client_states) \
            or not isinstance(shards, list) or not all(map(_is_shard, shards)) or not _is_digest_table(digests):
        raise ConfigError(f"{path} is damaged: its body is not a server snapshot and client states")
    return Checkpoint(server=payload["server"], client_states=client_states, state_shards=shards,
                      client_digests=digests, **header)


def content_sha256(value: Any) -> bytes:
    """The SHA-256 of a state's canonical bytes: its classes, field names, numbers, and each tensor's
    dtype, shape and bytes, in the order it holds them (a dict's order is part of a state)."""
    digest = hashlib.sha256()
    _feed(digest, value)
    return digest.digest()


def _feed(digest, value: Any) -> None:
    if isinstance(value, Tensor):
        value = value.detach().cpu().contiguous()
        digest.update(f"T{str(value.dtype)}{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy() if value.numel() else b"")
    elif isinstance(value, np.ndarray):
        digest.update(f"A{value.dtype.str}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif value is None or isinstance(value, (bool, int, str)):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, float):
        digest.update(f"float:{value.hex()};".encode())
    elif isinstance(value, dict):
        digest.update(f"dict{len(value)}(".encode())
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
        digest.update(b")")
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        digest.update(f"{type(value).__name__}{len(value)}(".encode())
        for item in items:
            _feed(digest, item)
        digest.update(b")")
    elif hasattr(value, "__dict__"):
        digest.update(f"{type(value).__module__}.{type(value).__qualname__}".encode())
        _feed(digest, vars(value))
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def client_table_sha256(client_digests: dict, shards: list[dict]) -> str:
    """The SHA-256 over every client's id and its state's SHA-256, by id: those of the body's
    states and of the spilled shards' rows."""
    clients = np.concatenate([client_digests["clients"].numpy(), *(shard["clients"].numpy() for shard in shards)])
    digests = np.concatenate([client_digests["sha256"].numpy(), *(shard["row_sha256"].numpy() for shard in shards)])
    order = np.argsort(clients, kind="stable")
    digest = hashlib.sha256(clients[order].astype("<i8").tobytes())
    digest.update(np.ascontiguousarray(digests[order]).tobytes())
    return digest.hexdigest()


def _is_digest_table(table: Any) -> bool:
    if not isinstance(table, dict) or set(table) != {"clients", "sha256"} \
            or not all(isinstance(value, Tensor) for value in table.values()):
        return False
    clients, digests = table["clients"], table["sha256"]
    return clients.dtype == torch.int64 and clients.dim() == 1 and digests.dtype == torch.uint8 \
        and tuple(digests.shape) == (len(clients), 32)


def _is_shard(shard: Any) -> bool:
    """A manifest of a spilled shard whose file lies in the run directory's checkpoint.d."""
    if not isinstance(shard, dict) or set(shard) != set(SHARD_FIELDS) \
            or not all(isinstance(shard[name], kind) for name, kind in SHARD_FIELDS.items()):
        return False
    parts = PurePosixPath(shard["file"]).parts
    return len(parts) == 3 and parts[0] == CHECKPOINT_DIR and ".." not in parts


def _parse_header(path: Path, line: bytes) -> dict:
    try:
        header = parse_json(line, "header")
    except ConfigError:
        header = None
    fields = {**HEADER_FIELDS, "sha256": str}
    if not isinstance(header, dict) or not set(fields) <= set(header) <= {*fields, *OPTIONAL_HEADER_FIELDS} \
            or not all(type(header[name]) is kind for name, kind in {**fields, **OPTIONAL_HEADER_FIELDS}.items()
                       if name in header) \
            or not all(type(value) is str for value in header.get("environment", {}).values()):
        raise ConfigError(f"{path} is damaged: its header is unreadable")
    if json.dumps(header).encode() != line:
        # The digest covers the header's fields; this covers the bytes that spell them.
        raise ConfigError(f"{path} is damaged: its bytes no longer match the SHA-256 written with them")
    if header["rounds_completed"] < 1:
        raise ConfigError(f"{path} is damaged: rounds_completed={header['rounds_completed']}")
    return header


def _digest(header: dict, body: bytes) -> str:
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    digest.update(body)
    return digest.hexdigest()


def check_belongs_to(run_dir: Path, checkpoint: Checkpoint, config: Config) -> None:
    """The checkpoint was written by the run that config.yaml describes, unchanged since."""
    path = run_dir / CHECKPOINT
    if (checkpoint.algorithm, checkpoint.model) != (config.algorithm.name, config.model.name):
        raise ConfigError(f"{path} is from algorithm {checkpoint.algorithm} with model {checkpoint.model}, but "
                          f"{run_dir / 'config.yaml'} says {config.algorithm.name} with {config.model.name}")
    if checkpoint.config_sha256 not in (config_sha256(run_dir), _file_sha256(run_dir)):
        raise ConfigError(f"{run_dir / 'config.yaml'} was changed after {CHECKPOINT} was written in keys that decide "
                          f"the run (a resume may change {' and '.join(RESUME_MAY_CHANGE[:-1])} and "
                          f"{RESUME_MAY_CHANGE[-1]}.*); restore it, or start a new run with the new config")


def lines_before(run_dir: Path, checkpoint: Checkpoint) -> list[bytes]:
    """metrics.jsonl's lines for the rounds the checkpoint completed, checked against its digest."""
    path = run_dir / METRICS
    if not path.is_file():
        raise ConfigError(f"{path} is missing; it holds the rounds {CHECKPOINT} continues from")
    lines = path.read_bytes().splitlines(keepends=True)[:checkpoint.rounds_completed]
    for number, line in enumerate(lines, start=1):
        try:
            round_record(line, number)
        except ConfigError as error:
            raise ConfigError(f"{path} {error}") from None
    if len(lines) < checkpoint.rounds_completed:
        raise ConfigError(f"{path} has {len(lines)} rounds but {CHECKPOINT} has {checkpoint.rounds_completed}")
    if hashlib.sha256(b"".join(lines)).hexdigest() != checkpoint.metrics_sha256:
        raise ConfigError(f"{path} does not hold the rounds {CHECKPOINT} was written after (changed since)")
    return lines
