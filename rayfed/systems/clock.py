"""The systems clock of a run: who is online at the current virtual time, how long each sampled
client's round takes, whose uploads count (the round policy), and under async_buffered the
clients in flight (FedBuff). It owns the virtual time and the buffer; the server asks it for the
round's candidates, a plan for the clients the selector chose, and the uploads that count."""
from __future__ import annotations

import math

import numpy as np

from rayfed.algorithms.base import Upload
from rayfed.systems.async_buffer import AsyncBuffer
from rayfed.systems.availability import AllClients, AlwaysOnline
from rayfed.systems.clients import ClientSystems
from rayfed.systems.policy import RoundPlan, plan_round


class SystemsClock:
    def __init__(self, train, idle_wait_s: float, client_systems: ClientSystems, upload_bytes: int):
        """`train`: the config's train section (round_policy, clients_per_round, overcommit,
        deadline_s, concurrency, buffer_size, staleness_weight); `idle_wait_s`: how long the server
        waits when nobody can be sampled; `upload_bytes`: what one client is expected to upload
        before any upload arrived."""
        self.policy = train.round_policy
        self.clients_per_round = train.clients_per_round
        self.overcommit = train.overcommit
        self.deadline_s = train.deadline_s
        self.staleness_weight = train.staleness_weight
        self.idle_wait_s = idle_wait_s
        self.availability = client_systems.availability
        self.speeds = client_systems.speeds
        self.virtual_time_s = 0.0
        # What a client uploads is measured from the uploads once some came (observe_uploads).
        self.upload_bytes = upload_bytes
        self.async_buffer = (AsyncBuffer(train.concurrency, train.buffer_size)
                             if train.round_policy == "async_buffered" else None)

    def candidates(self, round: int) -> tuple[np.ndarray, int]:
        """(the clients that can be sampled now, how many to sample): the online ones, S of them
        (more with overcommit; under async_buffered the free slots, among clients not in flight).
        When everyone is online, AllClients rather than an array of N ids."""
        if isinstance(self.availability, AlwaysOnline) and self.async_buffer is None:
            online = AllClients(self.availability.num_clients)
        else:
            online = np.flatnonzero(self.availability.online(round, self.virtual_time_s))
        wanted = self.clients_per_round
        if self.policy == "overcommit":
            wanted = math.ceil(wanted * (1 + self.overcommit))
        elif self.async_buffer is not None:
            online = online[~np.isin(online, list(self.async_buffer.in_flight))]
            wanted = self.async_buffer.free_slots
        return online, wanted

    def samples_purely(self) -> bool:
        """Whether planning a round leaves the clock as it was: not under async_buffered, whose
        launches are part of the clock's state."""
        return self.async_buffer is None

    def plan(self, round: int, sampled: np.ndarray, steps: np.ndarray, down_bytes: int) -> RoundPlan:
        """Which of `sampled` (taking `steps` local steps each) will count, from their virtual
        durations; under async_buffered every one is launched and counts when it arrives."""
        durations = self.speeds.round_durations(sampled, steps, down_bytes, self.upload_bytes)
        if self.async_buffer is not None:
            self.async_buffer.launch(sampled.tolist(), (self.virtual_time_s + durations).tolist(), version=round)
            return RoundPlan(sampled.tolist(), sampled.tolist(), 0.0)
        return plan_round(self.policy, sampled, durations, clients_per_round=self.clients_per_round,
                          deadline_s=self.deadline_s)

    def settle(self, round: int, plan: RoundPlan, trained: list, lost: list[int]) -> tuple[list, list[int], dict]:
        """(the results that count, sorted by client, the order they count in, the policy's metrics)
        once the round's results came; advances the virtual clock to the round's end. `lost`:
        clients trained this round whose results never came."""
        if self.async_buffer is None:
            counted, order, extra = trained, plan.participants, {"num_stragglers": len(plan.stragglers)}
            finished_at = self.virtual_time_s + plan.round_time_s
        else:
            self.async_buffer.forget(lost)
            counted, order, extra, finished_at = self._buffered_arrivals(round, trained)
        if not plan.sampled and not counted:
            # Nobody could be sampled: the server waits before asking again, or the clock (and so
            # who is online) would never move.
            finished_at = self.virtual_time_s + self.idle_wait_s
        self.virtual_time_s = finished_at
        return sorted(counted, key=lambda result: result.client_id), order, extra

    def _buffered_arrivals(self, round: int, trained: list):
        """async_buffered: park this round's launches, then take the next buffer_size arrivals,
        weighted by staleness if asked (FedBuff's 1/sqrt(1 + staleness))."""
        for result in trained:
            self.async_buffer.attach(result.client_id, result)
        arrivals = self.async_buffer.pop_arrivals()
        staleness = [round - arrival.version for arrival in arrivals]
        counted = []
        for arrival, stale in zip(arrivals, staleness):
            result = arrival.result
            if self.staleness_weight == "sqrt" and stale:
                weight = 1.0 / math.sqrt(1.0 + stale)
                upload = result.upload
                scaled = Upload({name: t * weight for name, t in upload.tensors.items()}, upload.num_samples,
                                upload.metrics)
                result = type(result)(result.client_id, scaled, result.buffers)
            counted.append(result)
        extra = {"num_in_flight": len(self.async_buffer.in_flight),
                 "staleness_mean": float(np.mean(staleness)) if staleness else math.nan,
                 "staleness_max": max(staleness, default=0)}
        finished_at = max([self.virtual_time_s, *(arrival.arrival_s for arrival in arrivals)])
        return counted, [arrival.client_id for arrival in arrivals], extra, finished_at

    def observe_uploads(self, sent_bytes: list[int]) -> None:
        """The bytes the round's counted uploads took: the next rounds' durations use the largest."""
        if sent_bytes:
            self.upload_bytes = max(sent_bytes)

    def snapshot(self) -> dict:
        return {"virtual_time_s": self.virtual_time_s, "upload_bytes": self.upload_bytes,
                "async_buffer": self.async_buffer}

    def restore(self, snapshot: dict) -> None:
        self.virtual_time_s = snapshot["virtual_time_s"]
        self.upload_bytes = snapshot["upload_bytes"]
        self.async_buffer = snapshot["async_buffer"]
