"""Checkpoints: everything a run needs to continue bit for bit, written atomically into the run directory.

Random streams are derived from (seed, purpose, round, client), so "RNG positions" reduce to the
number of completed rounds; the rest is the server's state (algorithm state, memory, BatchNorm
buffers, virtual clock, FedBuff's clients in flight) and every client's persistent state.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from rayfed.engine.loop import Engine
from rayfed.engine.worker import client_owner
from rayfed.errors import ConfigError

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(engine: Engine, run_dir: Path, rounds_completed: int) -> None:
    client_states = {}
    for states in engine.get([worker.snapshot_client_states() for worker in engine.workers]):
        client_states.update(states)
    payload = {"rounds_completed": rounds_completed, "server": engine.get(engine.server.snapshot()),
               "client_states": client_states}
    temporary = run_dir / (CHECKPOINT + ".tmp")
    torch.save(payload, temporary)
    os.replace(temporary, run_dir / CHECKPOINT)      # a crash mid-write leaves the previous checkpoint intact


def load_checkpoint(run_dir: Path) -> dict:
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no {CHECKPOINT} to resume from (runs write one every "
                          f"train.checkpoint_every rounds)")
    try:
        return torch.load(path, weights_only=False)
    except Exception as error:  # any unpickling failure means the same to the user: a bad file
        raise ConfigError(f"cannot read {path} ({type(error).__name__}: {error})") from None


def restore_checkpoint(engine: Engine, payload: dict) -> None:
    engine.get(engine.server.restore(payload["server"]))
    num_workers = len(engine.workers)
    engine.get([worker.restore_client_states({client_id: state for client_id, state in payload["client_states"].items()
                                              if client_owner(client_id, num_workers) == index})
                for index, worker in enumerate(engine.workers)])


def recover_workers(engine: Engine, run_dir: Path, workers: list[int]) -> str:
    """Restarted workers come back with no client state: once they answer again, give them their
    clients' states from the last checkpoint, if the run has one. Returns what happened, for
    metrics.jsonl."""
    alive = engine.revive(workers)
    gone = sorted(set(workers) - set(alive))
    outcome = f"workers {gone} did not come back; " if gone else ""
    if not (run_dir / CHECKPOINT).is_file():
        return outcome + "reset: no checkpoint"
    payload = load_checkpoint(run_dir)
    num_workers = len(engine.workers)
    engine.get([engine.workers[worker].restore_client_states(
        {client_id: state for client_id, state in payload["client_states"].items()
         if client_owner(client_id, num_workers) == worker}) for worker in alive])
    return outcome + f"restored from the checkpoint of round {payload['rounds_completed']}"
