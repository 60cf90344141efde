"""The round, written once for every engine.

An engine exposes its Server and ClientWorkers through handles whose method calls return
either values (the local engine, a server in the driver) or Ray object references (actors),
plus `get` to resolve them. The round never touches uploads: they go from the workers to the
server directly.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from rayfed.engine.extensions import Extension, Turn
from rayfed.engine.lost import ServerLost, WorkerLost
from rayfed.engine.worker import assign_to_workers
from rayfed.faults import SERVER, Fault, FaultSchedule
from rayfed.systems.policy import RoundPlan


class Engine(Protocol):
    server: Any
    workers: list[Any]

    def get(self, handle_result: Any) -> Any:
        """The value of a call; raises WorkerLost or ServerLost when the actor that owed it is gone."""

    def settle(self, calls: dict[int, Any], wait: bool) -> tuple[dict[int, Any], dict[int, str]]:
        """(the results delivered by worker, the workers late or dead with why); without `wait`, every
        worker's result as if delivered, where the engine has no round timeout to keep."""

    def revive(self, workers: list[int], faults: dict[int, Fault]) -> tuple[list[int], dict[int, str]]:
        """(workers back with their shard attached, workers gone for good with why); `faults` strike
        while the workers are being restarted."""

    def recreate_server(self) -> None: ...

    def process_pss(self) -> dict[str, int] | None:
        """{name: proportional set size in bytes} of the run's processes now (Ray's daemons
        included); None where the kernel does not tell."""

    def enact(self, target: int, fault: Fault) -> None: ...

    def shutdown(self, finished: bool = False) -> None:
        """`finished`: the run ended normally (its actors idle, which a later run may reuse)."""


@dataclass
class RoundStart:
    """What a round starts from: the server's plan and its broadcast (a value, or the engine's
    reference to it)."""

    plan: RoundPlan
    down: Any


def play_round(engine: Engine, round: int, clients_keep_state: bool, faults: FaultSchedule,
               extensions: list[Extension] = (), start: RoundStart | None = None) -> tuple[dict, RoundStart | None]:
    """Runs round `round` (0-based) and returns its metrics and what the next round starts from
    when the server planned it already (None: the next round asks the server). The server plans
    the round (unless `start` holds its plan), the workers train the plan's clients from the
    broadcast, the server steps with their results, and the extensions the components asked for run
    after the step (rayfed.engine.extensions)."""
    if start is None:
        start = RoundStart(engine.get(engine.server.sample(round)), engine.server.broadcast())
    plan = start.plan
    per_worker = assign_to_workers(plan.participants, len(engine.workers), clients_keep_state)
    for worker in per_worker:
        enact_due(engine, faults, worker, round, "train")
    calls = {w: engine.workers[w].train(round, start.down, ids, time.time()) for w, ids in per_worker.items()}
    # Unless a fault must strike once the uploads are in, the step goes out at once with every worker's
    # results, which it waits for where it runs; when a worker died, the step never ran (Ray fails a
    # call whose argument failed) and the round settles again, waiting for each worker.
    settled_first = faults.awaits(round, "delivered")
    delivered, failed = engine.settle(calls, wait=settled_first)
    for worker in range(len(engine.workers)):
        enact_due(engine, faults, worker, round, "delivered")
    for worker in calls if clients_keep_state else ():
        # Actor calls run in submission order, so this lands before the worker's next round (and a
        # worker's commit runs while the server steps). A worker that died has nothing to commit: its
        # clients go back to the last checkpoint. Clients without state have nothing to commit either: a
        # call less per worker and round.
        (engine.workers[worker].commit if worker in delivered else engine.workers[worker].discard)()
    enact_due(engine, faults, SERVER, round, "step")
    try:
        (metrics, reply, next_plan), next_down = _step(engine, round, plan, per_worker, delivered, failed)
    except WorkerLost:
        if settled_first:
            raise
        delivered, failed = engine.settle(calls, wait=True)
        (metrics, reply, next_plan), next_down = _step(engine, round, plan, per_worker, delivered, failed)
    turn = Turn(round, per_worker, delivered, failed, reply, clients_keep_state)
    for extension in extensions:
        metrics.update(extension.after_step(engine, turn, metrics))
    if failed:
        metrics["failed_workers"] = {str(worker): why for worker, why in sorted(failed.items())}
    return metrics, None if next_plan is None else RoundStart(next_plan, next_down)


def _step(engine: Engine, round: int, plan: RoundPlan, per_worker: dict[int, list[int]], delivered: dict[int, Any],
          failed: dict[int, str]) -> tuple[tuple, Any]:
    """The server's step on the `delivered` results, the clients of `failed` workers lost: ((metrics, reply,
    the next round's plan or None), the next round's broadcast)."""
    lost = [client for worker in failed for client in per_worker[worker]]
    stepped, next_down = engine.server.step_and_plan_next(round, plan, *delivered.values(), lost=lost)
    try:
        return engine.get(stepped), next_down
    except (WorkerLost, ServerLost):
        # The step never ran and its broadcast holds the same error, which Ray prints as unhandled unless it is read.
        with contextlib.suppress(WorkerLost, ServerLost):
            engine.get(next_down)
        raise


def enact_due(engine: Engine, faults: FaultSchedule, target: int, round: int, moment: str) -> None:
    for fault in faults.due(target, round, moment):
        engine.enact(target, fault)


class InlineHandle:
    """Calls methods of an in-process object directly: the local engine's handle."""

    def __init__(self, target: Any):
        self.target = target

    def __getattr__(self, name: str) -> Callable:
        return getattr(self.target, name)
