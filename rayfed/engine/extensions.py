"""Round extensions: steps that a component adds to the run, which the driver runs through the
engine's handles, so that neither the round loop nor the engines change when a feature is added.

The server names the extensions its components need (Server.extensions: a name and its
arguments); each is a class registered here under that name, with two hooks:

- `before_rounds(engine, clients_keep_state)`, before round 0: CACS's warm-up (selection);
- `after_step(engine, turn, metrics)`, after each round's server step, returning metrics to add:
  the reply of an algorithm whose server answers its clients (aggregation), the gradient-similarity
  diagnostic at evaluations (evaluation).

A worker that dies in a hook raises WorkerLost (before_rounds: the supervisor revives it and the
hook starts over) or joins `turn.failed` (after_step: the supervisor revives it after the round)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rayfed.engine.lost import WorkerLost
from rayfed.engine.worker import assign_to_workers
from rayfed.errors import ConfigError
from rayfed.seeding import Purpose

EXTENSIONS: dict[str, type["Extension"]] = {}


def register_extension(name: str):
    def decorate(cls):
        if name in EXTENSIONS:
            raise ConfigError(f"round extension {name!r} is already registered")
        EXTENSIONS[name] = cls
        return cls
    return decorate


@dataclass
class Turn:
    """What a round's extensions see once the server stepped."""

    round: int
    per_worker: dict[int, list[int]]        # the round's clients by the worker that trained them
    delivered: dict[int, Any]               # workers whose results came
    failed: dict[int, str]                  # workers late or dead this round ("late", "died")
    # The algorithm's reply and the clients it goes to, those whose uploads counted (None: no reply).
    reply: tuple[dict, set[int]] | None
    clients_keep_state: bool


class Extension:
    def before_rounds(self, engine, clients_keep_state: bool) -> None:
        """Runs before round 0; raises WorkerLost when a worker dies in it."""

    def after_step(self, engine, turn: Turn, metrics: dict) -> dict:
        """Runs after each round's server step; returns metrics for the round's record."""
        return {}


def make_extensions(wanted: list[tuple[str, dict]]) -> list[Extension]:
    return [EXTENSIONS[name](**arguments) for name, arguments in wanted]


@register_extension("reply")
class Reply(Extension):
    """The server's reply to the round's clients whose uploads counted (Algorithm.replies): each
    updates its committed state with it. At evaluations every worker also reports on all its
    clients' states (Algorithm.summarize_client_states). A worker that dies meanwhile joins
    `failed`: the supervisor revives it, and its clients go back to the last checkpoint."""

    def after_step(self, engine, turn: Turn, metrics: dict) -> dict:
        if turn.reply is None:
            return {}
        tensors, participants = turn.reply
        summarize = "test_accuracy" in metrics
        finishing = range(len(engine.workers)) if summarize else list(turn.delivered)
        calls = {worker: engine.workers[worker].finish_round(
            tensors, [client for client in turn.per_worker.get(worker, [])
                      if client in participants and worker in turn.delivered], summarize)
            for worker in finishing}
        summaries = []
        for worker, call in calls.items():
            try:
                summaries.extend(engine.get(call) or ())
            except WorkerLost as lost:
                turn.failed.update({dead: "died" for dead in lost.workers})
        if not summarize or any(worker in turn.failed for worker in calls):
            return {}
        return engine.get(engine.server.combine_state_summaries(summaries))


@register_extension("gradient_similarity")
class GradientSimilarity(Extension):
    """train.similarity_clients: at evaluations, the cosine similarity of clients 0 .. n-1's full
    local gradients at the global model (Haddadpour et al., AISTATS 2021, Eq. 7)."""

    def __init__(self, clients: list[int]):
        self.clients = clients

    def after_step(self, engine, turn: Turn, metrics: dict) -> dict:
        if "test_accuracy" not in metrics:
            return {}
        down = engine.server.broadcast()
        askers = assign_to_workers(self.clients, len(engine.workers), turn.clients_keep_state)
        gradients = engine.get([engine.workers[w].full_gradients(turn.round, down, ids, Purpose.GRADIENT_SIMILARITY)
                                for w, ids in askers.items()])
        return engine.get(engine.server.gradient_similarity(*gradients))


@register_extension("selection_warmup")
class SelectionWarmup(Extension):
    """CACS's warm-up (Wang et al., INFOCOM 2023, Section III-E), before round 0: rounds in which
    every client trains, then every client's full local gradient at the model they reached, from
    which the server orders the clients. Client states it changes are discarded."""

    def before_rounds(self, engine, clients_keep_state: bool) -> None:
        clients, rounds = engine.get(engine.server.begin_warmup())
        per_worker = assign_to_workers(clients, len(engine.workers), clients_keep_state)
        for round in range(rounds):
            down = engine.server.broadcast()
            results = engine.get([engine.workers[w].warmup_train(round, down, ids, time.time()) for w, ids in per_worker.items()])
            engine.get([engine.workers[w].discard() for w in per_worker])
            engine.get(engine.server.warmup_step(round, *results))
        down = engine.server.broadcast()
        gradients = engine.get([engine.workers[w].full_gradients(rounds, down, ids) for w, ids in per_worker.items()])
        engine.get(engine.server.finish_warmup(*gradients))
