"""The round's uploads as the aggregation rule combined them (aggregation.rule other than mean):
for each upload name, the rule's output over the clients' rows in client-id order, optionally over
bucket means (Karimireddy, He, Jaggi, ICLR 2022, arXiv:2006.09365, Algorithm 1: a random permutation
of the uploads, the means of consecutive groups of s, the last possibly smaller, then the rule).
What the algorithm's server step reads through weighted_average."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from rayfed.aggregation.base import Rule
from rayfed.algorithms.summed_uploads import CombinedUploads
from rayfed.seeding import Purpose, torch_generator


class RobustUploads(CombinedUploads):
    """Each upload name's aggregate: what `weighted_average` returns for it."""

    reason = "aggregation.rule"
    holds = "the rule's output over the round's uploads"

    def __init__(self, aggregates: dict[str, Tensor], rule: str, num_clients: int):
        self.aggregates = aggregates
        self.rule = rule
        self.num_clients = num_clients

    def average(self, name: str, weighting: str, weights: dict[int, float] | None,
                divisor: int | None = None) -> Tensor:
        """The rule's output for `name`; with a `divisor` (MIFA's N), the output stands for the mean of the
        round's uploads, so their sum is it times their count, divided by the divisor."""
        if weights is not None:
            raise ValueError(f"aggregation.rule={self.rule} treats every upload alike; the round's per-client "
                             f"weights (a selector's or staleness's) cannot apply")
        if name not in self.aggregates:
            raise KeyError(f"aggregation.rule={self.rule}: no upload named {name!r} (the clients uploaded "
                           f"{', '.join(map(repr, self.aggregates))})")
        aggregate = self.aggregates[name]
        if divisor is None:
            return aggregate.clone()
        return (aggregate.double() * (self.num_clients / divisor)).to(aggregate.dtype)


def bucket_means(rows: Tensor, bucket_size: int, permutation: Tensor) -> Tensor:
    """The means of the permuted rows in consecutive buckets of `bucket_size`, the last one possibly smaller."""
    permuted = rows[permutation].double()
    buckets = math.ceil(rows.shape[0] / bucket_size)
    return torch.stack([permuted[b * bucket_size:(b + 1) * bucket_size].mean(dim=0) for b in range(buckets)]
                       ).to(rows.dtype)


def combine(rule: Rule, rule_name: str, tensors: dict[int, dict[str, Tensor]], previous: dict[str, Tensor],
            bucket_size: int, seed: int, round: int) -> tuple[RobustUploads, dict[str, Tensor]]:
    """The rule applied to each upload name's rows (`tensors`: client -> name -> vector, in client-id
    order), with the rule's state (its previous outputs by name, for a stateful rule); returns the
    combined uploads and the rule's next state. Bucketing permutes the clients once a round, from
    the stream (seed, round), the same for every name."""
    clients = list(tensors)
    permutation = (torch.randperm(len(clients), generator=torch_generator(seed, Purpose.BUCKETS, round))
                   if bucket_size > 1 else None)
    aggregates = {}
    for name in tensors[clients[0]]:
        rows = torch.stack([tensors[client][name] for client in clients])
        if permutation is not None:
            rows = bucket_means(rows, bucket_size, permutation.to(rows.device))
        aggregates[name] = rule(rows, previous.get(name) if rule.stateful else None)
    return RobustUploads(aggregates, rule_name, len(clients)), (dict(aggregates) if rule.stateful else {})
