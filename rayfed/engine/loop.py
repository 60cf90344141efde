"""The round, written once for every engine.

An engine exposes its Server and ClientWorkers through handles whose method calls return
either values (local engine) or Ray object references (ray engine), plus `get` to resolve
them. The round never touches uploads: they go from the workers to the server directly.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from rayfed.engine.extensions import Extension, Turn
from rayfed.engine.worker import assign_to_workers
from rayfed.faults import SERVER, Fault, FaultSchedule


class Engine(Protocol):
    server: Any
    workers: list[Any]

    def get(self, handle_result: Any) -> Any:
        """The value of a call; raises WorkerLost or ServerLost when the actor that owed it is gone."""

    def settle(self, calls: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str]]: ...

    def revive(self, workers: list[int], faults: dict[int, Fault]) -> tuple[list[int], dict[int, str]]:
        """(workers back with their shard attached, workers gone for good with why); `faults` strike
        while the workers are being restarted."""

    def recreate_server(self) -> None: ...

    def process_pss(self) -> dict[str, int] | None:
        """{name: proportional set size in bytes} of the run's processes now (Ray's daemons
        included); None where the kernel does not tell."""

    def enact(self, target: int, fault: Fault) -> None: ...

    def shutdown(self) -> None: ...


def play_round(engine: Engine, round: int, clients_keep_state: bool, faults: FaultSchedule,
               extensions: list[Extension] = ()) -> dict:
    """Runs round `round` (0-based) and returns its metrics: the server plans it, the workers train
    the plan's clients from the broadcast, the server steps with their results, and the extensions
    the components asked for run after the step (rayfed.engine.extensions)."""
    plan = engine.get(engine.server.sample(round))
    down = engine.server.broadcast()
    per_worker = assign_to_workers(plan.participants, len(engine.workers), clients_keep_state)
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
    metrics, reply = engine.get(engine.server.step(round, plan, *delivered.values(), lost=lost))
    turn = Turn(round, per_worker, delivered, failed, reply, clients_keep_state)
    for extension in extensions:
        metrics.update(extension.after_step(engine, turn, metrics))
    if failed:
        metrics["failed_workers"] = {str(worker): why for worker, why in sorted(failed.items())}
    return metrics


def enact_due(engine: Engine, faults: FaultSchedule, target: int, round: int, moment: str) -> None:
    for fault in faults.due(target, round, moment):
        engine.enact(target, fault)


class InlineHandle:
    """Calls methods of an in-process object directly: the local engine's handle."""

    def __init__(self, target: Any):
        self.target = target

    def __getattr__(self, name: str) -> Callable:
        return getattr(self.target, name)
