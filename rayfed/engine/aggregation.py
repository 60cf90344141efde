"""Aggregation: the algorithm's server side as a component of the round. It owns the algorithm's
server state and the global model's BatchNorm buffers, says what is broadcast, folds the uploads
that count into the state (Algorithm.server_step), and forms the reply of algorithms whose server
answers the round's clients (FedGATE's tracking). With an aggregation rule other than mean
(rayfed.aggregation) the server step reads the rule's outputs in place of the uploads' average; a
stateful rule's state (its last outputs) is the aggregation's too."""
from __future__ import annotations

import torch
from torch import Tensor

from rayfed.aggregation import build_rule, combine
from rayfed.algorithms.base import Algorithm, RoundInfo, check_state_declared
from rayfed.algorithms.summed_uploads import SummedUploads
from rayfed.engine.messages import Broadcast, ClientRecord, ClientResult, WorkerSums
from rayfed.exact_sum import ExactSum
from rayfed.privacy import CentralPrivacy


class Aggregation:
    def __init__(self, algorithm: Algorithm, name: str, params: Tensor, buffers: Tensor, num_clients: int,
                 rules=None, seed: int = 0, private: CentralPrivacy | None = None, clip_norm: float = 0.0):
        """`rules`: the aggregation section (None or rule=mean: the algorithm's own average); `seed`: the
        run's, whose streams bucketing draws from; `private`: central differential privacy, which
        noises the average instead (rayfed.privacy), starting from clip norm `clip_norm`."""
        self.algorithm = algorithm
        self.num_clients = num_clients
        self.state = algorithm.server_init(params.clone(), num_clients)
        check_state_declared(algorithm, name, self.state, "server")
        self.buffers = buffers.clone()
        self.rule = None if rules is None else build_rule(rules)
        self.rule_name = None if rules is None else rules.rule
        self.bucket_size = 1 if rules is None else rules.bucket_size
        self.seed = seed
        self.rule_state: dict[str, Tensor] = {}
        self.private = private
        self.clip_norm = clip_norm

    def broadcast(self) -> Broadcast:
        """On the CPU: workers may have no GPU, and each moves it to its own device once per round."""
        tensors = {name: tensor.cpu() for name, tensor in self.algorithm.broadcast(self.state).items()}
        return Broadcast(tensors, self.buffers.cpu())

    def global_params(self) -> Tensor:
        return self.algorithm.global_params(self.state)

    def step(self, round: int, counted: list[ClientResult | ClientRecord], order: list[int],
             weights: dict[int, float] | None, importances: dict[int, float] | None, downlink=None,
             summed: list[WorkerSums] = ()) -> tuple[dict, dict[str, Tensor] | None]:
        """Folds the counted results (sorted by client id; combining in that order keeps runs bitwise
        reproducible) into the state; under engine.partial_sums, the workers' `summed` uploads of
        the counted clients (`counted` then holds their records). Returns the algorithm's metrics and
        its reply (None when it does not reply)."""
        uploads = summed_uploads(summed, counted) if summed else {result.client_id: result.upload for result in counted}
        privacy_metrics = {}
        if self.rule is not None:
            uploads, self.rule_state = combine(self.rule, self.rule_name,
                                               {client: upload.tensors for client, upload in uploads.items()},
                                               self.rule_state, self.bucket_size, self.seed, round)
        elif self.private is not None:
            # An algorithm that averages models is clipped on its clients' changes from what it broadcast.
            reference = self.algorithm.broadcast(self.state) if self.algorithm.averages_models else None
            uploads, privacy_metrics, self.clip_norm = self.private.combine(
                round, {client: upload.tensors for client, upload in uploads.items()}, self.clip_norm, reference)
        self.state, metrics = self.algorithm.server_step(
            self.state, uploads,
            RoundInfo(round=round, sampled=tuple(order), num_clients=self.num_clients, weights=weights,
                      importances=importances, downlink=downlink))
        reply = None
        if self.algorithm.replies:
            reply = {name: tensor.cpu() for name, tensor in self.algorithm.server_reply(self.state).items()}
        metrics.update(privacy_metrics)
        if weights is not None:
            # ucs weights sum to 1 only on average: log it.
            metrics["weight_sum"] = sum(weights[result.client_id] for result in counted)
        if self.buffers.numel():
            self.buffers = (weighted_buffers(counted) if not summed else
                            merged(worker.buffers for worker in summed).mean(uploads.num_samples).to(self.buffers.device))
        return metrics, reply

    def extensions(self) -> list[tuple[str, dict]]:
        return [("reply", {})] if self.algorithm.replies else []

    def model_finite(self) -> bool:
        return bool(torch.isfinite(self.global_params()).all())

    @property
    def stateful_rule(self) -> bool:
        return self.rule is not None and self.rule.stateful

    @property
    def adaptive_clip(self) -> bool:
        return self.private is not None and self.private.adaptive

    def snapshot(self) -> tuple:
        return self.state, self.buffers, self.rule_state, self.clip_norm

    def restore(self, snapshot: tuple) -> None:
        self.state, self.buffers, self.rule_state, self.clip_norm = snapshot

    def state_bytes(self) -> int:
        """Bytes of algorithm state the server holds (model included)."""
        return (self.algorithm.state_bytes(self.state) + self.buffers.numel() * self.buffers.element_size()
                + sum(tensor.numel() * tensor.element_size() for tensor in self.rule_state.values()))


def weighted_buffers(results: list[ClientResult]) -> Tensor:
    """BatchNorm buffers bypass the algorithm: the n_i-weighted average of the clients'."""
    total_samples = sum(result.upload.num_samples for result in results)
    buffers = torch.zeros_like(results[0].buffers)
    for result in results:
        buffers.add_(result.buffers, alpha=result.upload.num_samples / total_samples)
    return buffers


def summed_uploads(summed: list[WorkerSums], counted: list[ClientRecord]) -> SummedUploads:
    """The workers' partial sums merged: exact, so the same whichever worker summed which client."""
    clients = sorted(client for worker in summed for client in worker.client_ids)
    if clients != [record.client_id for record in counted]:
        raise ValueError("engine.partial_sums: the summed uploads are not those of the clients that count")
    return SummedUploads({name: merged(worker.sums[name] for worker in summed) for name in summed[0].sums},
                         summed[0].weighting, len(counted), sum(record.upload.num_samples for record in counted))


def merged(sums) -> ExactSum:
    """The sum of exact sums, compacted or not, into a fresh accumulator (the workers' are left as they were)."""
    sums = list(sums)
    total = ExactSum(sums[0].shape, sums[0].device)
    for part in sums:
        total.merge(part)
    return total
