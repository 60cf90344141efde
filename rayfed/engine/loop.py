"""The round, written once for every engine.

An engine exposes its Server and ClientWorkers through handles whose method calls return
either values (local engine) or Ray object references (ray engine), plus `get` to resolve
them. The round never touches uploads: they go from the workers to the server directly.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from rayfed.engine.worker import assign_to_workers
from rayfed.faults import SERVER, Fault, FaultSchedule
from rayfed.seeding import Purpose


class WorkerLost(Exception):
    """Workers whose process died, or that Ray restarted without their shard, while asked for something."""

    def __init__(self, workers: list[int]):
        super().__init__(workers)
        self.workers = workers


class ServerLost(Exception):
    """The server actor's process died."""


class Engine(Protocol):
    server: Any
    workers: list[Any]

    def get(self, handle_result: Any) -> Any:
        """The value of a call; raises WorkerLost or ServerLost when the actor that owed it is gone."""

    def settle(self, calls: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str]]: ...

    def revive(self, workers: list[int], faults: dict[int, Fault]) -> tuple[list[int], list[int]]:
        """(workers back with their shard attached, workers gone for good); `faults` strike while
        the workers are being restarted."""

    def recreate_server(self) -> None: ...

    def enact(self, target: int, fault: Fault) -> None: ...

    def shutdown(self) -> None: ...


def play_round(engine: Engine, round: int, clients_keep_state: bool, faults: FaultSchedule, replies: bool = False,
               similarity_clients: list[int] = ()) -> dict:
    """Runs round `round` (0-based) and returns its metrics. `replies`: the algorithm's server replies to
    the round's clients (Algorithm.replies); `similarity_clients`: the clients of the gradient-similarity
    diagnostic at evaluations (train.similarity_clients)."""
    sampled = engine.get(engine.server.sample(round))
    down = engine.server.broadcast()
    per_worker = assign_to_workers(sampled, len(engine.workers), clients_keep_state)
    for worker in per_worker:
        enact_due(engine, faults, worker, round, "train")
    calls = {w: engine.workers[w].train(round, down, ids) for w, ids in per_worker.items()}
    delivered, failed = engine.settle(calls)
    for worker in range(len(engine.workers)):
        enact_due(engine, faults, worker, round, "delivered")
    for worker in calls:
        # Actor calls run in submission order, so this lands before the worker's next round.
        (engine.workers[worker].commit if worker in delivered else engine.workers[worker].discard)()
    lost = [client for worker in failed for client in per_worker[worker]]
    enact_due(engine, faults, SERVER, round, "step")
    metrics = engine.get(engine.server.step(round, *delivered.values(), lost=lost))
    if replies:
        reply = engine.get(engine.server.reply())
        if reply is not None:
            metrics.update(finish_round(engine, reply, per_worker, delivered, failed, "test_accuracy" in metrics))
    if similarity_clients and "test_accuracy" in metrics:
        down = engine.server.broadcast()
        askers = assign_to_workers(similarity_clients, len(engine.workers), clients_keep_state)
        gradients = engine.get([engine.workers[w].full_gradients(round, down, ids, Purpose.GRADIENT_SIMILARITY)
                                for w, ids in askers.items()])
        metrics.update(engine.get(engine.server.gradient_similarity(*gradients)))
    if failed:
        metrics["failed_workers"] = {str(worker): why for worker, why in sorted(failed.items())}
    return metrics


def finish_round(engine: Engine, reply: tuple, per_worker: dict[int, list[int]], delivered: dict,
                 failed: dict[int, str], summarize: bool) -> dict:
    """The server's reply to the round's clients (Algorithm.replies); with `summarize`, every worker
    reports on all its clients' states too. A worker that dies meanwhile joins `failed`: the supervisor
    revives it, and its clients go back to the last checkpoint as after any worker death."""
    tensors, participants = reply
    finishing = range(len(engine.workers)) if summarize else list(delivered)
    calls = {worker: engine.workers[worker].finish_round(
        tensors, [c for c in per_worker.get(worker, []) if c in participants and worker in delivered], summarize)
        for worker in finishing}
    summaries = []
    for worker, call in calls.items():
        try:
            summaries.append(engine.get(call))
        except WorkerLost as lost:
            failed.update({dead: "died" for dead in lost.workers})
    if not summarize or any(worker in failed for worker in calls):
        return {}
    return engine.get(engine.server.combine_state_summaries(summaries))


def warm_up_selection(engine: Engine, clients_keep_state: bool) -> dict:
    """CACS's warm-up (specs/fedmos.md §3.7), before round 0: rounds in which every client trains,
    then every client's full local gradient at the model they reached, from which the server orders
    the clients. Client states it changes are discarded. Returns the server's account of it."""
    clients, rounds = engine.get(engine.server.begin_warmup())
    per_worker = assign_to_workers(clients, len(engine.workers), clients_keep_state)
    for round in range(rounds):
        down = engine.server.broadcast()
        results = engine.get([engine.workers[w].warmup_train(round, down, ids) for w, ids in per_worker.items()])
        engine.get([engine.workers[w].discard() for w in per_worker])
        engine.get(engine.server.warmup_step(round, *results))
    down = engine.server.broadcast()
    gradients = engine.get([engine.workers[w].full_gradients(rounds, down, ids) for w, ids in per_worker.items()])
    return engine.get(engine.server.finish_warmup(*gradients))


def enact_due(engine: Engine, faults: FaultSchedule, target: int, round: int, moment: str) -> None:
    for fault in faults.due(target, round, moment):
        engine.enact(target, fault)


class InlineHandle:
    """Calls methods of an in-process object directly: the local engine's handle."""

    def __init__(self, target: Any):
        self.target = target

    def __getattr__(self, name: str) -> Callable:
        return getattr(self.target, name)
