"""What a checkpoint may hold: the states the run's components declare, checked on resume and on
every recovery from a checkpoint before any of it is used.

checkpoint.pt's digests (rayfed.checkpoint) show that its bytes are those written; they cannot show
that a body someone rewrote, recomputing the header's digest, is a state the run can continue
from. So its content is checked against the components themselves, with no code of an
algorithm's own:

- the server's snapshot against a fresh one's parts: Algorithm.server_init on the model's shapes
  (meta tensors: no memory), the model's buffers, the systems clock's snapshot: the same classes
  and fields, each tensor of the template's shape and dtype, numbers of the template's type; where
  the template holds None (a part that fills in later) or an empty container, anything made of
  the algorithm's state classes. The selector checks its own part (ClientSampler.snapshot_problem);
- client states: ids within 0..N-1 on the worker that owns them; each an object of a declared
  state class whose fields are those most states share among the layouts whose tensors are the
  floats the algorithm declares per client (Algorithm.client_state_floats; transient fields
  aside): a state with a field of another shape, dtype or kind (None where the others hold a
  tensor) is named. A spilled shard's layout and the None flags of each row likewise;
- every tensor and number finite;
- then the header's record of the body: the SHA-256 of each server part, the number of client
  states, and the SHA-256 of each client's state (a swap, a state dropped or added, any edit
  that did not recompute each of these).

The first mismatch is a ConfigError of one line naming the field: `checkpoint.pt: client 7's
state: control has shape (4681,), expected (4682,)`.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import Tensor

from rayfed.aggregation import build_rule
from rayfed.algorithms.base import FLOAT32_BYTES, AlgorithmContext, build_algorithm
from rayfed.checkpoint import CHECKPOINT, ENGINE_CLASSES, Checkpoint, client_table_sha256, content_sha256
from rayfed.config import Config
from rayfed.engine.state_store import COPY_CHUNK_BYTES, StateLayout, damaged_shard, qualified, row_sha256
from rayfed.engine.worker import client_owner
from rayfed.errors import ConfigError, kind_of
from rayfed.models import FlatModel
from rayfed.registry import ATTACKS
from rayfed.resources import meta_model
from rayfed.selection.sampler import ClientSampler
from rayfed.systems.clients import ClientSystems
from rayfed.systems.clock import SystemsClock

FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}


class Declared:
    """What a run's components declare about the states its checkpoints hold."""

    def __init__(self, config: Config, client_systems: ClientSystems):
        """`client_systems`: the run's, with the clients' sample counts (the selector's order depends on them)."""
        model = FlatModel(meta_model(config.model.name, config.data.dataset, tuple(config.model.hidden_sizes)), "meta")
        self.algorithm = build_algorithm(config.algorithm, AlgorithmContext.of_run(model, config.train,
                                                                                  config.algorithm))
        self.name = config.algorithm.name
        self.num_clients = config.data.num_clients
        self.num_workers = config.engine.num_workers
        self.client_floats = self.algorithm.client_state_floats(model.num_params, model.buffers.numel())
        self.transient = set(self.algorithm.transient_client_fields)
        self.classes = (*self.algorithm.state_classes, *ENGINE_CLASSES)
        clock = SystemsClock(config.train, config.systems.idle_wait_s, client_systems, 0)
        # As Server.snapshot lays a snapshot out; the selector's parts are its own to check.
        self.server = {"state": self.algorithm.server_init(model.params, self.num_clients), "buffers": model.buffers,
                       **({"rule_state": {}} if _stateful_rule(config) else {}),
                       **({"dp_clip_norm": 0.0} if config.privacy.adaptive_clipping else {}),
                       **({"attack_state": {}} if ATTACKS.get(config.adversary.attack).target(config.adversary).stateful
                          else {}),
                       **clock.snapshot(), "client_order": None, "warmup_summary": None, "bits_totals": [0, 0]}
        self.client_classes = {qualified(cls): cls for cls in self.algorithm.state_classes
                               if not _holds_class(self.server["state"], cls)}
        self.sampler = ClientSampler(config.selection, config.seed, client_systems.client_sizes)


def _stateful_rule(config: Config) -> bool:
    rule = build_rule(config.aggregation)
    return rule is not None and rule.stateful


def check_content(run_dir: Path, checkpoint: Checkpoint, declared: Declared) -> None:
    """ConfigError of one line at the first part of `checkpoint` that is not what `declared` says,
    or that its header's record does not match (see the module's docstring)."""
    path = run_dir / CHECKPOINT
    problem = (_server_problem(checkpoint.server, declared)
               or _clients_problem(checkpoint, declared)
               or _shard_files_problem(run_dir, checkpoint, declared)
               or _record_problem(checkpoint))
    if problem:
        raise ConfigError(f"{path}: {problem}")


# ---- the server ----

def _server_problem(server: dict, declared: Declared) -> str | None:
    expected = declared.server
    for part in expected:
        if part not in server:
            return f"the server's snapshot has no {part}"
    for part in server:
        if part not in expected:
            return f"the server's snapshot has a part {part!r} that rayfed does not write"
    for part, template in expected.items():
        if part in ("client_order", "warmup_summary"):
            continue
        problem = _difference(server[part], template, declared.classes, part)
        if problem:
            return f"the server's {problem}"
    totals = server["bits_totals"]
    if len(totals) != 2 or not all(type(bits) is int and bits >= 0 for bits in totals):
        return f"the server's bits_totals is {totals!r}, expected the bits sent up and down so far"
    problem = declared.sampler.snapshot_problem(server["client_order"], server["warmup_summary"])
    if problem:
        return f"the server's {problem}"
    return None


def _difference(value: Any, template: Any, classes: tuple[type, ...], path: str) -> str | None:
    """Where `value` is not shaped as `template`: a tensor of its shape and dtype, an object of its
    class with its fields, a container with its keys, a number of its type; everything finite.
    A None or empty container in the template is a part that fills in later: anything made of
    `classes` (see _free_problem)."""
    if template is None or (isinstance(template, (dict, list, set, frozenset)) and not template):
        if template is not None and type(value) is not type(template):
            return f"{path} is {kind_of(value)}, expected a {type(template).__name__}"
        return _free_problem(value, classes, path)
    if isinstance(template, Tensor):
        if not isinstance(value, Tensor):
            return f"{path} is {kind_of(value)}, expected {kind_of(template)}"
        if value.dtype != template.dtype:
            return f"{path} is {_dtype(value)}, expected {_dtype(template)}"
        if value.shape != template.shape:
            return f"{path} has shape {tuple(value.shape)}, expected {tuple(template.shape)}"
        return _free_problem(value, classes, path)
    if type(value) is not type(template):
        return f"{path} is {kind_of(value)}, expected {kind_of(template)}"
    if isinstance(template, (bool, int, float, str, list, set, frozenset)):
        return _free_problem(value, classes, path)
    if isinstance(template, tuple):
        if len(value) != len(template):
            return f"{path} holds {len(value)} items, expected {len(template)}"
        return next((problem for index, (item, like) in enumerate(zip(value, template))
                     if (problem := _difference(item, like, classes, f"{path}[{index}]"))), None)
    fields, like = (value, template) if isinstance(template, dict) else (vars(value), vars(template))
    missing, extra = _unmatched(fields, like)
    if missing is not None:
        return f"{path} has no {missing!r}"
    if extra is not None:
        return f"{path} has {extra!r}, which a {type(template).__name__} does not"
    return next((problem for key in like
                 if (problem := _difference(fields[key], like[key], classes, f"{path}.{key}"))), None)


def _free_problem(value: Any, classes: tuple[type, ...], path: str) -> str | None:
    """Why `value`, whose shape nothing fixes, cannot be part of a state: an object of a class the
    state classes do not list, or a tensor or number that is not finite."""
    if isinstance(value, Tensor):
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return f"{path} holds NaN or infinity"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value}"
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, dict):
        return next((problem for key, item in value.items()
                     if (problem := _free_problem(item, classes, f"{path}[{key!r}]"))), None)
    if isinstance(value, (list, tuple, set, frozenset)):
        return next((problem for index, item in enumerate(value)
                     if (problem := _free_problem(item, classes, f"{path}[{index}]"))), None)
    if type(value) not in classes:
        return f"{path} is {kind_of(value)}, which the state classes do not list"
    return next((problem for key, item in vars(value).items()
                 if (problem := _free_problem(item, classes, f"{path}.{key}"))), None)


def _holds_class(value: Any, cls: type) -> bool:
    if type(value) is cls:
        return True
    if isinstance(value, dict):
        return any(_holds_class(item, cls) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_class(item, cls) for item in value)
    if hasattr(value, "__dict__") and not isinstance(value, Tensor):
        return any(_holds_class(item, cls) for item in vars(value).values())
    return False


# ---- the client states ----

def _clients_problem(checkpoint: Checkpoint, declared: Declared) -> str | None:
    """Client ids and shards where they belong, then every state's layout against the reference."""
    last = declared.num_clients - 1
    for client in sorted(checkpoint.client_states):
        if client > last:
            return f"client {client} has a state, but data.num_clients={declared.num_clients} (clients 0-{last})"
    problem = _manifests_problem(checkpoint, declared)
    if problem:
        return problem
    layouts = list(_layouts(checkpoint, declared))
    reference = _reference(layouts, declared)
    for client, signature, _ in layouts:
        problem = _layout_problem(signature, reference, declared)
        if problem:
            return f"client {client}'s state{problem}"
    for client in sorted(checkpoint.client_states):
        state = checkpoint.client_states[client]
        problem = next((problem for key, value in vars(state).items()
                        if (problem := _free_problem(value, declared.classes, key))), None)
        if problem:
            return f"client {client}'s state: {problem}"
    return None


def _manifests_problem(checkpoint: Checkpoint, declared: Declared) -> str | None:
    workers, last = declared.num_workers, declared.num_clients - 1
    seen_workers, seen_clients = set(), set(checkpoint.client_states)
    for shard in checkpoint.state_shards:
        worker = shard["worker"]
        where = f"the spilled shard of worker {worker}"
        if not 0 <= worker < workers or shard["workers"] != workers or worker in seen_workers:
            return f"{where} (of {shard['workers']}) is not one of engine.num_workers={workers}'s shards"
        seen_workers.add(worker)
        rows = shard["rows"]
        clients, nones, digests = shard["clients"], shard["nones"], shard["row_sha256"]
        if clients.dtype != torch.int64 or tuple(clients.shape) != (rows,) or nones.dtype != torch.bool \
                or nones.dim() != 2 or len(nones) != rows or digests.dtype != torch.uint8 \
                or tuple(digests.shape) != (rows, 32) or (shard["layout"] is None) != (rows == 0):
            return f"{where}: its manifest does not describe {rows} rows"
        try:
            layout = None if rows == 0 else StateLayout.from_dict(shard["layout"])
        except (KeyError, TypeError, ValueError):
            return f"{where}: its row layout is unreadable"
        if layout is not None and nones.shape[1] != len(layout.fields):
            return f"{where}: its manifest does not describe {rows} rows"
        for client in clients.tolist():
            if not 0 <= client <= last:
                return f"client {client} has a state, but data.num_clients={declared.num_clients} (clients 0-{last})"
            if client_owner(client, workers) != worker or client in seen_clients:
                return f"client {client}'s state is in {where}, where it does not belong"
            seen_clients.add(client)
    return None


def _layouts(checkpoint: Checkpoint, declared: Declared) -> Iterator[tuple[int, tuple, int]]:
    """(client, its state's signature: class and (field, description) pairs, how many states have
    it) for every state held in the body, then for the first client of each distinct layout among
    each spilled shard's rows."""
    for client in sorted(checkpoint.client_states):
        yield client, _signature(checkpoint.client_states[client], declared.transient), 1
    for shard in checkpoint.state_shards:
        if shard["rows"] == 0:
            continue
        layout = StateLayout.from_dict(shard["layout"])
        patterns, first, counts = np.unique(shard["nones"].numpy(), axis=0, return_index=True, return_counts=True)
        clients = shard["clients"].tolist()
        for pattern, row, count in zip(patterns, first, counts):
            fields = {field.name: ("none",) if pattern[index] or field.kind == "none" else
                      ("tensor", field.dtype, field.shape) if field.kind == "tensor" else (field.kind,)
                      for index, field in enumerate(layout.fields) if field.kind != "transient"}
            yield clients[row], (layout.cls, tuple(fields.items())), int(count)


def _signature(state: Any, transient: set[str]) -> tuple:
    if isinstance(state, (Tensor, dict, list, tuple, str, int, float, bool, type(None))) \
            or not hasattr(state, "__dict__"):
        return (type(state).__name__, None)
    return (qualified(type(state)), tuple((key, _describe(value)) for key, value in vars(state).items()
                                          if key not in transient))


def _describe(value: Any) -> tuple:
    if isinstance(value, Tensor):
        return ("tensor", _dtype(value), tuple(value.shape))
    return ("none",) if value is None else (type(value).__name__,)


def _floats(signature: tuple) -> float:
    """4-byte floats of the tensors of a state with `signature`, as Algorithm.client_state_floats counts them."""
    held = 0
    for description in dict(signature[1]).values():
        if description[0] == "tensor":
            held += math.prod(description[2]) * torch.empty((), dtype=getattr(torch, description[1])).element_size()
    return held / FLOAT32_BYTES


def _reference(layouts: list[tuple[int, tuple, int]], declared: Declared) -> tuple | None:
    """The layout most states share among those of a declared client class with the declared floats
    (ties: the lowest client's)."""
    eligible = Counter()
    for _, signature, count in layouts:
        if signature[0] in declared.client_classes and _floats(signature) == declared.client_floats:
            eligible[signature] += count
    return eligible.most_common(1)[0][0] if eligible else None


def _layout_problem(signature: tuple, reference: tuple | None, declared: Declared) -> str | None:
    cls, fields = signature
    expected = reference[0] if reference else " or ".join(name.rpartition(".")[2] for name in declared.client_classes)
    short = expected.rpartition(".")[2]
    if fields is None:
        return f" is a {cls}, expected a {short}"
    if (reference is None and cls not in declared.client_classes) or (reference and cls != reference[0]):
        return f" is a {cls.rpartition('.')[2]}, expected a {short}"
    if reference is None:
        return (f" holds {_floats(signature):g} floats, but algorithm {declared.name!r} declares "
                f"{declared.client_floats} per client (Algorithm.client_state_floats)")
    have, want = dict(fields), dict(reference[1])
    missing, extra = _unmatched(have, want)
    if missing is not None:
        return f" has no field {missing!r}"
    if extra is not None:
        return f" has a field {extra!r}, which a {short} does not"
    for name, description in want.items():
        actual = have[name]
        if actual == description:
            continue
        if actual[0] == description[0] == "tensor":
            if actual[1] != description[1]:
                return f": {name} is {actual[1]}, expected {description[1]}"
            return f": {name} has shape {actual[2]}, expected {description[2]}"
        return f": {name} is {_show(actual)}, expected {_show(description)}"
    return None


def _show(description: tuple) -> str:
    if description[0] == "tensor":
        return f"a tensor of shape {description[2]} {description[1]}"
    return "None" if description[0] == "none" else f"a {description[0]}"


# ---- spilled shards' files ----

def _shard_files_problem(run_dir: Path, checkpoint: Checkpoint, declared: Declared) -> str | None:
    """Each shard's file: there, of the bytes its manifest records (as a whole and row by row), its
    tensors finite."""
    for shard in checkpoint.state_shards:
        path = run_dir / shard["file"]
        if not path.is_file():
            raise ConfigError(f"{path} is missing; it holds spilled client states that {CHECKPOINT} continues from")
        if shard["rows"] == 0:
            if path.stat().st_size:
                raise ConfigError(damaged_shard(path))
            continue
        layout = StateLayout.from_dict(shard["layout"])
        problem = _rows_problem(path, shard, layout)
        if problem:
            return problem
    return None


def _rows_problem(path: Path, shard: dict, layout: StateLayout) -> str | None:
    row_bytes, rows = layout.row_bytes, shard["rows"]
    clients, nones, recorded = shard["clients"].tolist(), shard["nones"].numpy(), shard["row_sha256"].numpy()
    per_part = max(1, COPY_CHUNK_BYTES // max(row_bytes, 1))
    digest, problem = hashlib.sha256(), None
    with open(path, "rb") as file:
        for first in range(0, rows, per_part):
            count = min(per_part, rows - first)
            part = file.read(count * row_bytes)
            if len(part) != count * row_bytes:
                raise ConfigError(damaged_shard(path))
            digest.update(part)
            table = np.frombuffer(part, np.uint8).reshape(count, row_bytes)
            for offset in range(count):
                row = first + offset
                if problem is None and not np.array_equal(row_sha256(table[offset].data, nones[row]), recorded[row]):
                    problem = _not_recorded(clients[row])
            for index, field in enumerate(layout.fields):
                if problem is None and field.kind == "tensor" and field.dtype in FLOAT_DTYPES:
                    values = torch.from_numpy(table[:, field.offset:field.offset + field.nbytes].copy())
                    finite = torch.isfinite(values.view(getattr(torch, field.dtype))).all(dim=1).numpy()
                    bad = np.flatnonzero(~finite & ~nones[first:first + count, index])
                    if len(bad):
                        problem = f"client {clients[first + bad[0]]}'s state: {field.name} holds NaN or infinity"
        trailing = file.read(1)
    if digest.hexdigest() != shard["sha256"] or trailing:
        raise ConfigError(damaged_shard(path))
    return problem


# ---- the header's record ----

def _record_problem(checkpoint: Checkpoint) -> str | None:
    contents = checkpoint.contents
    parts = contents.get("server_sha256")
    if set(contents) != {"server_sha256", "client_states", "client_states_sha256"} or not isinstance(parts, dict) \
            or set(parts) != set(checkpoint.server) or type(contents["client_states"]) is not int:
        return "its header's record of the body is unreadable"
    for part, value in checkpoint.server.items():
        if content_sha256(value).hex() != parts[part]:
            return f"the server's {part} does not match the SHA-256 its header records (edited since it was written)"
    table = checkpoint.client_digests
    recorded = table["clients"].tolist()
    held = set(checkpoint.client_states)
    missing = sorted(set(recorded) - held)
    if missing:
        return f"client {missing[0]}'s state is missing; the checkpoint records one"
    unrecorded = sorted(held - set(recorded))
    if unrecorded:
        return f"client {unrecorded[0]} has a state that the checkpoint does not record"
    total = len(held) + sum(shard["rows"] for shard in checkpoint.state_shards)
    if total != contents["client_states"]:
        return f"it holds {total} client states, but its header records {contents['client_states']}"
    if client_table_sha256(table, checkpoint.state_shards) != contents["client_states_sha256"]:
        return "its record of the client states' SHA-256 does not match its header's (edited since it was written)"
    digests = table["sha256"].numpy()
    for client, digest in zip(recorded, digests):
        if content_sha256(checkpoint.client_states[client]) != digest.tobytes():
            return _not_recorded(client)
    return None


def _not_recorded(client: int) -> str:
    return (f"client {client}'s state does not match the SHA-256 recorded for it (another client's state, or "
            f"edited since it was written)")


def _unmatched(have: dict, want: dict) -> tuple[Any, Any]:
    """The first key `want` has and `have` lacks, and the first `have` has and `want` lacks (None: none)."""
    return (next((key for key in want if key not in have), None),
            next((key for key in have if key not in want), None))


def _dtype(tensor: Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
