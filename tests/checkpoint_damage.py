"""Edits of a checkpoint that a tool could make while keeping checkpoint.pt's digest right, for
every registered algorithm: each case says whether it applies to a checkpoint, makes the edit on
the loaded body, and says the line a resume must refuse it with. Shared by
tests/test_checkpoint_content.py and experiments/checkpoint_content/table.py."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import rayfed
from rayfed.checkpoint import MAGIC, Checkpoint, write_checkpoint
from rayfed.metrics import MetricsLog
from rayfed.registry import ALGORITHMS

BASE = ["data.num_clients=12", "train.clients_per_round=4", "train.rounds=3", "train.local_steps=2",
        "train.batch_size=16", "train.eval_every=3", "model.name=mlp", "model.hidden_sizes=[8]",
        "data.partition=dirichlet", "data.alpha=0.5", "engine.backend=local", "train.checkpoint_every=2",
        "selection.selector=cacs", "selection.cacs_warmup_rounds=1", "selection.cacs_clusters=3"]
NUM_CLIENTS = 12
# What makes an algorithm keep all the state it can (GradMA's memory, FedCOMGATE's error feedback).
SETTINGS = {"gradma": ["algorithm.memory_size=12"], "gradma_s": ["algorithm.memory_size=12"],
            "fedcomgate": ["compression.name=top_k", "algorithm.memory=true"]}

PLUGIN = '''
from dataclasses import dataclass

from torch import Tensor

import rayfed
from rayfed.algorithms.fedavg import FedAvgM


@dataclass
class DriftState:
    drift: Tensor       # a decayed sum of the client's model changes
    visits: int


@rayfed.register_algorithm("drift_fedavg")
class DriftFedAvg(FedAvgM):
    """FedAvg whose clients keep a state of their own: a plugin's declared state."""

    state_classes = (*FedAvgM.state_classes, DriftState)
    keeps_client_state = True
    vectorizable = False

    def client_state_floats(self, num_params, num_buffers):
        return num_params

    def client_train(self, task, down, client_state):
        upload, _ = super().client_train(task, down, None)
        change = upload.tensors["model_change"]
        drift = change if client_state is None else client_state.drift.mul(0.5).add(change)
        return upload, DriftState(drift, 1 if client_state is None else client_state.visits + 1)
'''


def overrides(name: str, plugin: Path | None = None) -> list[str]:
    extra = [f"plugins=[{plugin}]"] if plugin else []
    return BASE + extra + [f"algorithm.name={name}"] + SETTINGS.get(name, [])


def algorithms() -> list[str]:
    return sorted(ALGORITHMS.names())


def build(root: Path, name: str, plugin: Path | None = None) -> tuple[Path, rayfed.Result]:
    """The uninterrupted run of `name`, and a run directory stopped while recording round 3 that
    holds the checkpoint of round 2."""
    config = rayfed.load_config(None, overrides(name, plugin))
    whole = rayfed.run(config, run_dir=root / f"{name}-whole", progress=False)
    append = MetricsLog.append

    def failing(self, metrics):
        if metrics["round"] == 3:
            raise KeyboardInterrupt
        return append(self, metrics)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MetricsLog, "append", failing)
        with pytest.raises(KeyboardInterrupt):
            rayfed.run(config, run_dir=root / name, progress=False)
    return root / name, whole


def load_body(path: Path) -> tuple[dict, dict]:
    data = path.read_bytes()
    header_line, _, body = data[len(MAGIC):].partition(b"\n")
    return json.loads(header_line), torch.load(io.BytesIO(body), weights_only=False)


def rewrite(run_dir: Path, change: Callable[[dict], Any], every_digest: bool = False) -> None:
    """Applies `change` to checkpoint.pt's body and writes it back with the header's digest
    recomputed, as a tool that knows the format's digest would; with `every_digest`, also the
    header's record of the body (rayfed's own writer), so that only the content checks remain."""
    path = run_dir / "checkpoint.pt"
    header, payload = load_body(path)
    change(payload)
    if every_digest:
        fields = {name: header[name] for name in ("rounds_completed", "algorithm", "model", "config_sha256",
                                                  "metrics_sha256")}
        write_checkpoint(run_dir, Checkpoint(**fields, server=payload["server"],
                                             client_states=payload["client_states"],
                                             state_shards=payload.get("state_shards", [])))
        return
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    del header["sha256"]
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    digest.update(buffer.getvalue())
    header["sha256"] = digest.hexdigest()
    path.write_bytes(MAGIC + json.dumps(header).encode() + b"\n" + buffer.getvalue())


# ---- what the edits touch ----

def victim(payload: dict) -> int:
    """The second client holding a state (the first is the reference in some messages)."""
    return sorted(payload["client_states"])[1]


def tensor_field(state: Any) -> str:
    """The state's first field holding a non-empty tensor."""
    return next(key for key, value in vars(state).items() if isinstance(value, torch.Tensor) and value.numel())


def last_tensor_field(state: Any) -> str:
    return [key for key, value in vars(state).items() if isinstance(value, torch.Tensor) and value.numel()][-1]


def server_tensor(payload: dict) -> str:
    return tensor_field(payload["server"]["state"])


def later_field(payload: dict) -> str | None:
    """The server state's average of the clients' uploads, where it holds one (FedGATE's, MIFA's)."""
    return "average" if isinstance(getattr(payload["server"]["state"], "average", None), torch.Tensor) else None


def average_none(payload: dict) -> str:
    state = payload["server"]["state"]
    if type(None) in typing.get_args(typing.get_type_hints(type(state))["average"]):
        return SERVER_EDITED
    return f"checkpoint.pt: the server's state.average is None, expected a tensor of shape {shape(state.average)} float32"


def shape(tensor: torch.Tensor) -> tuple:
    return tuple(tensor.shape)


def short(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1)[:-1].clone()


def set_field(state: Any, name: str, value: Any) -> Any:
    state = copy.copy(state)
    setattr(state, name, value)
    return state


def poisoned(tensor: torch.Tensor, value: float) -> torch.Tensor:
    tensor = tensor.clone()
    tensor.reshape(-1)[0] = value
    return tensor


@dataclass
class Case:
    """One edit: `applies(payload)`, `edit(payload)` in place, `expected(payload)` the line's tail
    (from the undamaged payload); `content`: whether the content checks alone refuse it (with
    every digest recomputed too)."""

    applies: Callable[[dict], bool]
    edit: Callable[[dict], None]
    expected: Callable[[dict], str]
    content: bool | Callable[[dict], bool] = True


def has_clients(payload: dict) -> bool:
    return len(payload["client_states"]) >= 2


def client_edit(change: Callable[[Any], Any]) -> Callable[[dict], None]:
    def edit(payload):
        client = victim(payload)
        payload["client_states"][client] = change(payload["client_states"][client])
    return edit


def server_edit(change: Callable[[Any, str], Any]) -> Callable[[dict], None]:
    def edit(payload):
        state = payload["server"]["state"]
        payload["server"]["state"] = change(state, tensor_field(state))
    return edit


def order_edit(change: Callable[[dict], Any]) -> Callable[[dict], None]:
    def edit(payload):
        payload["server"]["client_order"] = change(payload["server"]["client_order"])
    return edit


def expect_client(text: Callable[[Any, str], str]) -> Callable[[dict], str]:
    def expected(payload):
        client = victim(payload)
        state = payload["client_states"][client]
        return f"checkpoint.pt: client {client}'s state{text(state, tensor_field(state))}"
    return expected


def expect_server(text: Callable[[Any, str], str]) -> Callable[[dict], str]:
    def expected(payload):
        state = payload["server"]["state"]
        return f"checkpoint.pt: the server's state{text(state, tensor_field(state))}"
    return expected


def swap(payload):
    first, second = sorted(payload["client_states"])[:2]
    states = payload["client_states"]
    states[first], states[second] = states[second], states[first]


def zero_all(state):
    return dataclasses.replace(state, **{key: torch.zeros_like(value) for key, value in vars(state).items()
                                         if isinstance(value, torch.Tensor)})


def mismatch(client: int) -> str:
    return (f"checkpoint.pt: client {client}'s state does not match the SHA-256 recorded for it (another client's "
            f"state, or edited since it was written)")


ORDER = "checkpoint.pt: the server's client_order"
SERVER_EDITED = "checkpoint.pt: the server's state does not match the SHA-256 its header records (edited since it was written)"

CASES = {
    # client states
    "a client's tensor one element short": Case(
        has_clients, client_edit(lambda s: set_field(s, tensor_field(s), short(getattr(s, tensor_field(s))))),
        expect_client(lambda s, f: f": {f} has shape {(getattr(s, f).numel() - 1,)}, expected "
                                   f"{shape(getattr(s, f))}")),
    "a client's state as a plain dict": Case(
        has_clients, client_edit(lambda s: dict(vars(s))),
        expect_client(lambda s, f: f" is a dict, expected a {type(s).__name__}")),
    "None where a client's tensor belongs": Case(
        has_clients, client_edit(lambda s: set_field(s, tensor_field(s), None)),
        expect_client(lambda s, f: f": {f} is None, expected a tensor of shape {shape(getattr(s, f))} float32")),
    "None where a client's last tensor belongs (FedCOMGATE's error feedback memory)": Case(
        has_clients, client_edit(lambda s: set_field(s, last_tensor_field(s), None)),
        expect_client(lambda s, f: f": {last_tensor_field(s)} is None, expected a tensor of shape "
                                   f"{shape(getattr(s, last_tensor_field(s)))} float32")),
    "a client's state in float64": Case(
        has_clients, client_edit(lambda s: set_field(s, tensor_field(s), getattr(s, tensor_field(s)).double())),
        expect_client(lambda s, f: f": {f} is float64, expected float32")),
    "NaN in a client's state": Case(
        has_clients, client_edit(lambda s: set_field(s, tensor_field(s), poisoned(getattr(s, tensor_field(s)),
                                                                                  math.nan))),
        expect_client(lambda s, f: f": {f} holds NaN or infinity")),
    "infinity in a client's state": Case(
        has_clients, client_edit(lambda s: set_field(s, tensor_field(s), poisoned(getattr(s, tensor_field(s)),
                                                                                  math.inf))),
        expect_client(lambda s, f: f": {f} holds NaN or infinity")),
    "a state for client N": Case(
        has_clients, lambda p: p["client_states"].__setitem__(NUM_CLIENTS, p["client_states"][victim(p)]),
        lambda p: f"checkpoint.pt: client {NUM_CLIENTS} has a state, but data.num_clients={NUM_CLIENTS} "
                  f"(clients 0-{NUM_CLIENTS - 1})"),
    "one client's state dropped": Case(
        has_clients, lambda p: p["client_states"].pop(victim(p)),
        lambda p: f"checkpoint.pt: client {victim(p)}'s state is missing; the checkpoint records one", False),
    "every client's state dropped": Case(
        has_clients, lambda p: p["client_states"].clear(),
        lambda p: f"checkpoint.pt: client {min(p['client_states'])}'s state is missing; the checkpoint records one",
        False),
    "two clients' states swapped": Case(has_clients, swap, lambda p: mismatch(min(p["client_states"])), False),
    "a client's tensors zeroed (error feedback memory and all)": Case(
        has_clients, client_edit(zero_all), lambda p: mismatch(victim(p)), False),
    # the server
    "the server's tensor one element short": Case(
        lambda p: True, server_edit(lambda s, f: set_field(s, f, short(getattr(s, f)))),
        expect_server(lambda s, f: f".{f} has shape {(getattr(s, f).numel() - 1,)}, expected {shape(getattr(s, f))}")),
    "the server's state as a plain dict": Case(
        lambda p: True, server_edit(lambda s, f: dict(vars(s))),
        expect_server(lambda s, f: f" is a dict, expected a {type(s).__name__}")),
    "None where the server's tensor belongs": Case(
        lambda p: True, server_edit(lambda s, f: set_field(s, f, None)),
        expect_server(lambda s, f: f".{f} is None, expected a tensor of shape {shape(getattr(s, f))} float32")),
    "the server's tensor in float64": Case(
        lambda p: True, server_edit(lambda s, f: set_field(s, f, getattr(s, f).double())),
        expect_server(lambda s, f: f".{f} is float64, expected float32")),
    "NaN in the server's model": Case(
        lambda p: True, server_edit(lambda s, f: set_field(s, f, poisoned(getattr(s, f), math.nan))),
        expect_server(lambda s, f: f".{f} holds NaN or infinity")),
    "infinity in the server's model": Case(
        lambda p: True, server_edit(lambda s, f: set_field(s, f, poisoned(getattr(s, f), -math.inf))),
        expect_server(lambda s, f: f".{f} holds NaN or infinity")),
    "the server's average set to None": Case(
        lambda p: later_field(p) is not None,
        lambda p: setattr(p["server"]["state"], later_field(p), None), average_none,
        # Content refuses it where the state class's annotation says the average is always a tensor (MIFA);
        # FedGATE's average is None until the first round: there the header's digest of the state does.
        lambda p: type(None) not in typing.get_args(typing.get_type_hints(type(p["server"]["state"]))["average"])),
    "the server's model edited": Case(
        lambda p: True, server_edit(lambda s, f: set_field(s, f, getattr(s, f) * 0.5)),
        lambda p: SERVER_EDITED, False),
    # CACS's order and warm-up
    "CACS's client_order removed": Case(
        lambda p: True, lambda p: p["server"].pop("client_order"),
        lambda p: "checkpoint.pt: the server's snapshot has no client_order"),
    "CACS's client_order dropped (None)": Case(
        lambda p: True, order_edit(lambda order: None),
        lambda p: f"{ORDER} is None, expected the order and labels that selection.selector=cacs's warm-up fixed"),
    "CACS's client_order a string": Case(
        lambda p: True, order_edit(lambda order: "0 1 2"),
        lambda p: f"{ORDER} is a str, expected the order and labels that selection.selector=cacs's warm-up fixed"),
    "CACS's order truncated": Case(
        lambda p: True, order_edit(lambda order: {**order, "order": order["order"][:-1]}),
        lambda p: f"{ORDER}'s order is a tensor of shape ({NUM_CLIENTS - 1},) int64, expected an int64 tensor of "
                  f"shape ({NUM_CLIENTS},)"),
    "CACS's order all zeros": Case(
        lambda p: True, order_edit(lambda order: {**order, "order": torch.zeros_like(order["order"])}),
        lambda p: f"{ORDER}'s order is not a permutation of the clients 0-{NUM_CLIENTS - 1}"),
    "CACS's labels out of range": Case(
        lambda p: True, order_edit(lambda order: {**order, "labels": order["labels"] + 5}),
        lambda p: f"{ORDER}'s labels are not clusters numbered 0, 1, ... (at most 3)"),
    "CACS's labels all zeros": Case(
        lambda p: len(set(p["server"]["client_order"]["labels"].tolist())) > 1,
        order_edit(lambda order: {**order, "labels": torch.zeros_like(order["labels"])}),
        lambda p: f"{ORDER}'s order is not the clusters' order for its labels and the clients' sample counts"),
    "CACS's warm-up summary dropped": Case(
        lambda p: True, lambda p: p["server"].__setitem__("warmup_summary", None),
        lambda p: "checkpoint.pt: the server's warmup_summary is None, expected the account of the warm-up (rounds, "
                  "client_rounds, train_loss, bytes_up, bytes_down, clusters, cluster_sizes)"),
}
