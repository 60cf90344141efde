"""Round policies: which sampled clients' uploads count, and how long the round takes in virtual time.

- sync: wait for every sampled client.
- deadline: uploads arriving after `deadline_s` are stragglers and do not count; the round ends at
  the deadline, or earlier if everyone is done.
- overcommit (FedScale): sample S (1 + overcommit) and keep the first S to finish.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

@dataclass(frozen=True)
class RoundPlan:
    sampled: list[int]           # in sampling order
    participants: list[int]      # whose uploads count, in sampling order
    round_time_s: float          # how far the virtual clock advances
    # The selector's aggregation weights of the sampled clients; None: the algorithm weights them itself.
    weights: dict[int, float] | None = None
    num_online: int = 0          # the clients that could be sampled
    sample_s: float = 0.0        # wall-clock seconds the server took to plan the round

    @property
    def stragglers(self) -> list[int]:
        counted = set(self.participants)
        return [client for client in self.sampled if client not in counted]


def plan_round(policy: str, sampled: np.ndarray, durations: np.ndarray, *, clients_per_round: int,
               deadline_s: float | None) -> RoundPlan:
    if len(sampled) == 0:
        return RoundPlan([], [], 0.0)
    if policy == "sync":
        counted = np.ones(len(sampled), dtype=bool)
        round_time = float(durations.max())
    elif policy == "deadline":
        counted = durations <= deadline_s
        round_time = min(deadline_s, float(durations.max()))
    elif policy == "overcommit":
        # A stable sort keeps sampling order among equally fast clients: ties never depend on ids.
        first = np.argsort(durations, kind="stable")[:clients_per_round]
        counted = np.zeros(len(sampled), dtype=bool)
        counted[first] = True
        round_time = float(durations[first].max())
    else:
        raise ValueError(f"unknown round policy {policy!r}")
    return RoundPlan(sampled=[int(c) for c in sampled], participants=[int(c) for c in sampled[counted]],
                     round_time_s=round_time)
