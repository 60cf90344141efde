"""Several runs as one batched computation (`rayfed sweep --pack`).

The packed runs are whole `rayfed.run`s, each with its own run directory, metrics, checkpoints and
resume, in threads of one process. They take turns, one at a time (a baton passed in a fixed order), so
nothing they share in the process (torch's default generator, its thread count) is ever used by two at
once and a pack's results do not depend on timing. The turns end only at the per-client gradient
passes of vectorised training (engine.vectorize): a run that reaches one waits there, and when every
run still going waits, the last to arrive computes all their passes as one: the clients of all the
packed runs stacked into one vmap, where their minibatches have as many rows a client (each run pads
its own clients' to its batch size; full-gradient chunks of different lengths are separate passes).
Each run then goes on with its own rows. A client's row does not depend on which rows share its batch,
so a packed run equals the run alone within engine.vectorize's tolerance, and the same pack gives the
same bits every time.
"""
from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

# The member of a pack that the calling thread runs, if any (ClientBatchTask asks).
_MEMBER: contextvars.ContextVar["PackMember | None"] = contextvars.ContextVar("rayfed_pack_member", default=None)


def current_member() -> "PackMember | None":
    return _MEMBER.get()


@dataclass
class _Request:
    """A per-client gradient pass waiting in the pack: `function(params, *rows)` for `params` (clients, d)
    and row tensors (clients, rows, ...)."""

    function: Callable
    params: Tensor
    rows: tuple[Tensor, ...]
    result: Any = None
    error: BaseException | None = None

    def key(self) -> tuple:
        """Requests with equal keys stack into one pass: the same parameter width and row tensors alike,
        with as many rows a client. Rows are not padded to stack: what pads them (weight-0 copies of a
        client's own first row, vectorized._padded_rows) is the caller's to know."""
        return (tuple(self.params.shape[1:]), self.params.dtype,
                tuple((tuple(t.shape[1:]), t.dtype) for t in self.rows))


class Pack:
    """Runs jobs (callables) as the members of one pack and returns their results, or the exception
    each raised, in order."""

    def __init__(self):
        self.condition = threading.Condition()
        self.live: list[int] = []
        self.waiting: dict[int, _Request] = {}
        self.baton: int | None = None
        self.passes = 0
        self.rows_per_pass: list[int] = []

    def run(self, jobs: list[Callable[[], Any]]) -> list[Any]:
        outcomes: list[Any] = [None] * len(jobs)
        self.live = list(range(len(jobs)))
        self.baton = 0 if jobs else None

        def member_thread(index: int) -> None:
            _MEMBER.set(PackMember(self, index))
            self._await_baton(index)
            try:
                outcomes[index] = jobs[index]()
            except BaseException as error:       # handed to the caller, who decides what a failure means
                outcomes[index] = error
            finally:
                self._leave(index)

        threads = [threading.Thread(target=member_thread, args=(index,), name=f"rayfed-pack-{index}", daemon=True)
                   for index in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return outcomes

    def _await_baton(self, index: int) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.baton == index)

    def _next_runner(self, after: int) -> int | None:
        """The next live member after `after` (in index order, cyclically) that is not waiting for a pass."""
        ready = [member for member in self.live if member not in self.waiting]
        later = [member for member in ready if member > after]
        return (later or ready or [None])[0]

    def compute(self, index: int, request: _Request) -> Any:
        with self.condition:
            self.waiting[index] = request
            runner = self._next_runner(index)
            if runner is not None:
                self.baton = runner
                self.condition.notify_all()
        if runner is None:
            self._execute()
        self._await_baton(index)
        if request.error is not None:
            raise request.error
        return request.result

    def _leave(self, index: int) -> None:
        with self.condition:
            self.live.remove(index)
            runner = self._next_runner(index)
            if runner is not None or not self.waiting:
                self.baton = runner
                self.condition.notify_all()
                return
        self._execute()

    def _execute(self) -> None:
        """Every live member waits: their passes, stacked where alike, in member order; then the baton
        goes to the first of them."""
        with self.condition:
            waiting = dict(sorted(self.waiting.items()))
        groups: dict[tuple, list[_Request]] = {}
        for request in waiting.values():
            groups.setdefault(request.key(), []).append(request)
        for requests in groups.values():
            try:
                _stacked_pass(requests)
            except BaseException as error:      # each member whose pass it was raises it in its own run
                for request in requests:
                    request.error = error
            self.passes += 1
            self.rows_per_pass.append(sum(request.params.shape[0] for request in requests))
        with self.condition:
            self.waiting = {}
            self.baton = min(waiting)
            self.condition.notify_all()


@dataclass
class PackMember:
    """One run's place in a pack."""

    pack: Pack
    index: int

    def per_client_pass(self, function: Callable, params: Tensor, *rows: Tensor) -> Any:
        """`function(params, *rows)`, computed with the other members' passes waiting at the same time."""
        return self.pack.compute(self.index, _Request(function, params, rows))


def _stacked_pass(requests: list[_Request]) -> None:
    """One call of the first request's function on all requests' clients; each request's result is its
    clients' part."""
    if len(requests) == 1:
        request = requests[0]
        request.result = request.function(request.params, *request.rows)
        return
    params = torch.cat([request.params for request in requests])
    rows = tuple(torch.cat([request.rows[position] for request in requests])
                 for position in range(len(requests[0].rows)))
    leaves, spec = tree_flatten(requests[0].function(params, *rows))
    counts = [request.params.shape[0] for request in requests]
    parts = [leaf.split(counts) if isinstance(leaf, Tensor) and leaf.dim() else [leaf] * len(requests)
             for leaf in leaves]
    for position, request in enumerate(requests):
        request.result = tree_unflatten([part[position] for part in parts], spec)

