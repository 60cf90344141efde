"""The round loop, written once for every engine.

An engine exposes its Server and ClientWorkers through handles whose method calls return
either values (local engine) or Ray object references (ray engine), plus `get` to resolve
them. The loop never touches uploads: they go from the workers to the server directly.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Protocol

from rayfed.engine.worker import assign_to_workers


class Engine(Protocol):
    server: Any
    workers: list[Any]

    def get(self, handle_result: Any) -> Any: ...

    def settle(self, calls: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str]]: ...

    def revive(self, workers: list[int]) -> list[int]: ...

    def shutdown(self) -> None: ...


def run_rounds(engine: Engine, rounds: range) -> Iterator[dict]:
    """Runs `rounds`, yielding each round's metrics with the wall time since the loop began."""
    started = time.perf_counter()
    clients_keep_state = engine.get(engine.server.clients_keep_state())
    for round in rounds:
        sampled = engine.get(engine.server.sample(round))
        down = engine.server.broadcast()
        per_worker = assign_to_workers(sampled, len(engine.workers), clients_keep_state)
        calls = {w: engine.workers[w].train(round, down, ids) for w, ids in per_worker.items()}
        delivered, failed = engine.settle(calls)
        for worker in calls:
            # Actor calls run in submission order, so this lands before the worker's next round.
            (engine.workers[worker].commit if worker in delivered else engine.workers[worker].discard)()
        lost = [client for worker in failed for client in per_worker[worker]]
        metrics = engine.get(engine.server.step(round, *delivered.values(), lost=lost))
        if failed:
            metrics["failed_workers"] = {str(worker): why for worker, why in sorted(failed.items())}
        metrics["wall_time_s"] = time.perf_counter() - started
        yield metrics


class InlineHandle:
    """Calls methods of an in-process object directly: the local engine's handle."""

    def __init__(self, target: Any):
        self.target = target

    def __getattr__(self, name: str) -> Callable:
        return getattr(self.target, name)
