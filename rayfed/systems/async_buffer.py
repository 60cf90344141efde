"""FedBuff's bookkeeping (Nguyen et al., 2022): clients in flight, their virtual arrival times and
the model version each trains from, and the buffer the server empties every `buffer_size` arrivals.

Clients are launched only when the server applies an update, into the slots freed by the arrivals
it used; each trains at once from the version it was given, and its upload waits here until its
virtual arrival. With buffer_size = concurrency = S every update launches S fresh clients and
waits for all of them: synchronous FedAvg.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any


@dataclass(order=True)
class InFlight:
    arrival_s: float
    launch_order: int                               # ties in arrival time go to the earlier launch
    client_id: int = field(compare=False)
    version: int = field(compare=False)             # the server update the client trains from
    result: Any = field(compare=False, default=None)


class AsyncBuffer:
    def __init__(self, concurrency: int, buffer_size: int):
        self.concurrency = concurrency
        self.buffer_size = buffer_size
        self.in_flight: dict[int, InFlight] = {}
        self.launches = 0

    @property
    def free_slots(self) -> int:
        return self.concurrency - len(self.in_flight)

    def launch(self, client_ids: list[int], arrivals_s: list[float], version: int) -> None:
        for client_id, arrival_s in zip(client_ids, arrivals_s):
            self.in_flight[client_id] = InFlight(arrival_s, self.launches, client_id, version)
            self.launches += 1

    def attach(self, client_id: int, result: Any) -> None:
        self.in_flight[client_id].result = result

    def forget(self, client_ids: list[int]) -> None:
        """Launched clients whose results will never come (their worker was late or died)."""
        for client_id in client_ids:
            self.in_flight.pop(client_id, None)

    def pop_arrivals(self) -> list[InFlight]:
        """The next `buffer_size` arrivals (all in flight if fewer), earliest first."""
        arrivals = heapq.nsmallest(self.buffer_size, self.in_flight.values())
        for arrival in arrivals:
            del self.in_flight[arrival.client_id]
        return arrivals
