"""Server: holds the global model and the algorithm's server state, samples each round's
clients, folds the uploads in with the algorithm, and evaluates the global model."""
from __future__ import annotations

import copy
import math
import time

import numpy as np
import torch
from torch import Tensor

from rayfed.algorithms.base import RoundInfo, Upload
from rayfed.algorithms.local_training import LocalSchedule
from rayfed.algorithms.base import AlgorithmContext, build_algorithm, check_state_declared
from rayfed.config import Config
from rayfed.engine.messages import Broadcast, ClientResult, WorkerResult
from rayfed.engine.process_memory import peak_rss
from rayfed.registry import SELECTORS
from rayfed.engine.worker import as_tensor, device_for, tensors_to, threads_per_process
from rayfed.models import FlatModel, build_model
from rayfed.seeding import Purpose, derive_seed, numpy_rng, torch_generator
from rayfed.compression import FLOAT_BITS, build_compressor, decode_upload
from rayfed.selection import ClientOrder, cluster_order, cosine_similarities, select
from rayfed.systems.async_buffer import AsyncBuffer
from rayfed.systems.clients import ClientSystems
from rayfed.systems.policy import RoundPlan, plan_round


class Server:
    def __init__(self, config: Config, test_data: tuple[np.ndarray, np.ndarray],
                 input_shape: tuple[int, ...], num_classes: int, client_systems: ClientSystems,
                 clients_train_data: tuple[np.ndarray, np.ndarray] | None = None):
        torch.set_num_threads(threads_per_process(config))
        self.config = config
        # On a GPU the memory algorithms' D, its Gram matrix and the QPs run there too.
        self.device = device_for(config.engine.server_gpus)
        self.test_x = as_tensor(test_data[0], self.device)
        self.test_y = as_tensor(test_data[1], self.device)
        # train.eval_train_loss: every client's training samples, for the global training loss.
        self.clients_train = (None if clients_train_data is None else
                              tuple(as_tensor(array, self.device) for array in clients_train_data))
        torch.manual_seed(derive_seed(config.seed, Purpose.MODEL_INIT))
        self.model = FlatModel(build_model(config.model.name, input_shape, num_classes,
                                           config.model.hidden_sizes), self.device)
        self.algorithm = build_algorithm(config.algorithm, AlgorithmContext.of_run(self.model.blocks, config.train))
        self.compressor = (build_compressor(config.compression, self.model.blocks)
                           if config.compression.name != "identity" else None)
        # Cumulative bits up and down, as a deployment would send them (specs/fedcom.md §3.3).
        self.bits_totals = [0, 0]
        # The bits of the round's compressed reply (compression.downlink), None when it goes uncompressed.
        self.downlink_bits: int | None = None
        # The last step's reply to its clients and who they are (Algorithm.replies), until the driver takes it.
        self.pending_reply: tuple[dict[str, Tensor], set[int]] | None = None
        self.schedule = LocalSchedule.from_config(config.train)
        self.state = self.algorithm.server_init(self.model.params.clone(), config.data.num_clients)
        check_state_declared(self.algorithm, config.algorithm.name, self.state, "server")
        self.buffers = self.model.buffers.clone()
        self.client_systems = client_systems
        self.virtual_time_s = 0.0
        # What a client uploads is measured from the uploads once some came; until then, the
        # algorithm's count of floats and the buffers.
        self.upload_bytes = (self.algorithm.upload_size(self.model.num_params) * self.model.params.element_size()
                             + self.buffers.numel() * self.buffers.element_size())
        self.plan = RoundPlan([], [], 0.0)
        self.num_online = 0
        train = config.train
        self.async_buffer = (AsyncBuffer(train.concurrency, train.buffer_size)
                             if train.round_policy == "async_buffered" else None)
        # Where the round's time goes (metrics' phase_s): set by sample() and broadcast(), read by step().
        self.sample_s = 0.0
        self.broadcast_sent_at = time.time()
        # The selector's aggregation weights of this round's clients (set by sample()); None: uniform selection.
        self.round_weights: dict[int, float] | None = None
        # selection.selector=cacs: the clients' order from the warm-up (None until it ran), what the
        # warm-up cost, and the server as it was before it while it runs.
        self.client_order: ClientOrder | None = None
        self.warmup_summary: dict | None = None
        self.before_warmup: tuple | None = None

    def sample(self, round: int) -> list[int]:
        """The clients to train this round. The selector (selection.selector) chooses among the clients
        online now, from the stream (seed, round): S of them, uniformly without replacement by
        default (more with overcommit; the free slots under async_buffered, among clients not already
        in flight), or S draws weighted by sample counts. The round policy keeps those whose uploads
        will count by their virtual durations; the others are never trained."""
        started = time.perf_counter()
        train = self.config.train
        online = np.flatnonzero(self.client_systems.availability.online(round, self.virtual_time_s))
        wanted = train.clients_per_round
        if train.round_policy == "overcommit":
            wanted = math.ceil(wanted * (1 + train.overcommit))
        elif self.async_buffer is not None:
            online = online[~np.isin(online, list(self.async_buffer.in_flight))]
            wanted = self.async_buffer.free_slots
        self.num_online = len(online)
        rng = numpy_rng(self.config.seed, Purpose.SAMPLE_CLIENTS, round)
        order = self.client_order.order if self.client_order is not None else None
        selection = select(self.config.selection.selector, online, self.client_systems.client_sizes[online], wanted,
                           rng, self.config.selection.ucs_variant, order)
        sampled = selection.clients
        self.round_weights = (None if selection.weights is None
                              else dict(zip(sampled.tolist(), selection.weights.tolist())))
        steps = np.array([self.schedule.steps(round, int(self.client_systems.client_sizes[client]))
                          for client in sampled], dtype=np.int64)
        durations = self.client_systems.speeds.round_durations(sampled, steps, self._broadcast().nbytes,
                                                               self.upload_bytes)
        if self.async_buffer is not None:
            self.async_buffer.launch(sampled.tolist(), (self.virtual_time_s + durations).tolist(), version=round)
            self.plan = RoundPlan(sampled.tolist(), sampled.tolist(), 0.0)
        else:
            self.plan = plan_round(train.round_policy, sampled, durations,
                                   clients_per_round=train.clients_per_round, deadline_s=train.deadline_s)
        self.sample_s = time.perf_counter() - started
        return self.plan.participants

    def broadcast(self) -> Broadcast:
        """The round's downlink, as sent to the workers."""
        down = self._broadcast()
        self.broadcast_sent_at = time.time()
        return down

    def _broadcast(self) -> Broadcast:
        """On the CPU: workers may have no GPU, and each moves it to its own device once per round."""
        tensors = {name: tensor.cpu() for name, tensor in self.algorithm.broadcast(self.state).items()}
        return Broadcast(tensors, self.buffers.cpu())

    def global_params(self) -> Tensor:
        """On the CPU: the driver that asks may have no GPU."""
        return self.algorithm.global_params(self.state).cpu()

    def clients_keep_state(self) -> bool:
        return self.algorithm.keeps_client_state

    def server_replies(self) -> bool:
        return self.algorithm.replies

    def step(self, round: int, *worker_results: WorkerResult, lost: list[int] = ()) -> dict:
        """Completes round `round` (0-based) from the workers' results; returns its metrics. `lost`:
        clients trained this round whose results never came (their worker was late or died)."""
        step_started_at, started = time.time(), time.perf_counter()
        trained = [self._decoded(r) for packed in worker_results for r in packed.to(self.device).unpack()]
        unpack_s = time.perf_counter() - started
        if self.async_buffer is not None:
            self.async_buffer.forget(lost)
        down_bytes = self._broadcast().nbytes
        if self.async_buffer is None:
            counted, order, extra = trained, self.plan.participants, {"num_stragglers": len(self.plan.stragglers)}
            finished_at = self.virtual_time_s + self.plan.round_time_s
        else:
            counted, order, extra, finished_at = self._buffered_arrivals(round, trained)
        if not self.plan.sampled and not counted:
            # Nobody could be sampled: the server waits before asking again, or the clock (and so
            # who is online) would never move.
            finished_at = self.virtual_time_s + self.config.systems.idle_wait_s
        self.virtual_time_s = finished_at
        counted.sort(key=lambda r: r.client_id)
        algorithm_metrics = {}
        if counted:
            self.state, algorithm_metrics = self.algorithm.server_step(
                self.state, {r.client_id: r.upload for r in counted},
                RoundInfo(round=round, sampled=tuple(order), num_clients=self.config.data.num_clients,
                          weights=self.round_weights, importances=self._importances(counted),
                          downlink=self._downlink(round)))
            if self.algorithm.replies:
                reply = {name: t.cpu() for name, t in self.algorithm.server_reply(self.state).items()}
                self.pending_reply = (reply, {r.client_id for r in counted})
            if self.round_weights is not None:
                # ucs weights sum to 1 only on average (specs/fedmos.md A22: log it).
                algorithm_metrics["weight_sum"] = sum(self.round_weights[r.client_id] for r in counted)
            if self.buffers.numel():
                self.buffers = _weighted_buffers(counted)
            self.upload_bytes = max(_sent_bytes(r) for r in counted)
        metrics = {
            "round": round + 1,
            "train_loss": float(np.mean([r.upload.metrics["train_loss"] for r in counted])) if counted else math.nan,
            # K_t of the round (local epochs: the mean over clients of their own step counts)
            "local_steps": float(np.mean([r.upload.metrics["local_steps"] for r in counted])) if counted else 0.0,
            "num_online": self.num_online,
            "num_sampled": len(self.plan.sampled),
            "num_participants": len(counted),
            "num_lost": len(lost),
            **extra,
            "bytes_up": sum(_sent_bytes(r) for r in counted),
            "bytes_down": down_bytes * len(self.plan.sampled) + self._reply_bytes(),
            **self._bits(counted, down_bytes),
            "virtual_time_s": self.virtual_time_s,
            **algorithm_metrics,
        }
        if not bool(torch.isfinite(self.algorithm.global_params(self.state)).all()):
            metrics["model_finite"] = False
        stepped = time.perf_counter()
        rounds = self.config.train.rounds
        if (round + 1) % self.config.train.eval_every == 0 or round + 1 == rounds:
            metrics["test_loss"], metrics["test_accuracy"] = self.evaluate()
            if self.clients_train is not None:
                metrics["global_train_loss"], metrics["global_train_accuracy"] = self.evaluate(*self.clients_train)
        timings = [packed.timing for packed in worker_results if packed.timing is not None]
        metrics["phase_s"] = {
            "sample": self.sample_s,
            # differences of time.time() between processes: meaningful on one machine
            "broadcast": max(0.0, max((t.started_at for t in timings), default=self.broadcast_sent_at)
                             - self.broadcast_sent_at),
            "train": max((t.train_s for t in timings), default=0.0),
            # packing on the slowest worker, the hand-over to this process, unpacking here
            "upload": (max((t.pack_s for t in timings), default=0.0) + unpack_s +
                       max(0.0, step_started_at - max((t.finished_at for t in timings), default=step_started_at))),
            "server_step": stepped - started - unpack_s,
            "eval": time.perf_counter() - stepped,
        }
        return metrics

    def _downlink(self, round: int):
        """compression.downlink: the round's reply compressor, from the server's stream (seed, round);
        it records the message's bits for the downlink count."""
        self.downlink_bits = None
        if not self.config.compression.downlink:
            return None

        def compress(vector: Tensor) -> Tensor:
            message = self.compressor.compress(vector, torch_generator(self.config.seed, Purpose.COMPRESSION_DOWNLINK,
                                                                       round))
            self.downlink_bits = message.bits
            return self.compressor.decompress(message, vector.numel())
        return compress

    def _reply_bytes(self) -> int:
        if self.pending_reply is None:
            return 0
        reply, clients = self.pending_reply
        return sum(t.numel() * t.element_size() for t in reply.values()) * len(clients)

    def _decoded(self, result: ClientResult) -> ClientResult:
        """`result` with its compressed update decoded (what the algorithm aggregates); its metrics keep
        the message's bits."""
        if self.compressor is None:
            return result
        tensors = decode_upload(result.upload.tensors, self.algorithm.compressed_upload, self.compressor,
                                self.model.num_params)
        upload = Upload(tensors, result.upload.num_samples, {**result.upload.metrics, "bytes_sent": result.nbytes})
        return ClientResult(result.client_id, upload, result.buffers)

    def _bits(self, counted: list[ClientResult], down_bytes: int) -> dict:
        """The round's bits up (each counted upload: its message's bits, 32 a float for the rest) and
        down (32 a float of the broadcast, to every sampled client), and their running totals."""
        up = 0
        for result in counted:
            upload = result.upload
            message_bits = upload.metrics.get("message_bits")
            floats = sum(t.numel() for name, t in upload.tensors.items()
                         if message_bits is None or name != self.algorithm.compressed_upload)
            up += int(message_bits or 0) + FLOAT_BITS * (floats + result.buffers.numel())
        down = 8 * down_bytes * len(self.plan.sampled) if self.algorithm.sends_model else 0
        if self.pending_reply is not None:
            reply, clients = self.pending_reply
            per_client = (self.downlink_bits if self.downlink_bits is not None
                          else FLOAT_BITS * sum(t.numel() for t in reply.values()))          # float32 replies
            down += per_client * len(clients)
        self.bits_totals = [self.bits_totals[0] + up, self.bits_totals[1] + down]
        metrics = {"bits_up": up, "bits_down": down, "bits_up_total": self.bits_totals[0],
                   "bits_down_total": self.bits_totals[1]}
        errors = [r.upload.metrics["compression_error"] for r in counted if "compression_error" in r.upload.metrics]
        if errors:
            metrics["compression_error"] = float(np.mean(errors))
        return metrics

    def _importances(self, results: list[ClientResult]) -> dict[int, float] | None:
        """p_i = D_i / sum_j D_j over all clients, of those that count, under a selector other than uniform."""
        if self.round_weights is None:
            return None
        sizes = self.client_systems.client_sizes
        return {r.client_id: float(sizes[r.client_id] / sizes.sum()) for r in results}

    def _buffered_arrivals(self, round: int, trained: list[ClientResult]):
        """async_buffered: park this round's launches, then take the next buffer_size arrivals,
        weighted by staleness if asked (FedBuff's 1/sqrt(1 + staleness))."""
        for result in trained:
            self.async_buffer.attach(result.client_id, result)
        arrivals = self.async_buffer.pop_arrivals()
        staleness = [round - arrival.version for arrival in arrivals]
        counted = []
        for arrival, stale in zip(arrivals, staleness):
            result = arrival.result
            if self.config.train.staleness_weight == "sqrt" and stale:
                weight = 1.0 / math.sqrt(1.0 + stale)
                upload = result.upload
                scaled = Upload({name: t * weight for name, t in upload.tensors.items()}, upload.num_samples,
                                upload.metrics)
                result = ClientResult(result.client_id, scaled, result.buffers)
            counted.append(result)
        extra = {"num_in_flight": len(self.async_buffer.in_flight),
                 "staleness_mean": float(np.mean(staleness)) if staleness else math.nan,
                 "staleness_max": max(staleness, default=0)}
        finished_at = max([self.virtual_time_s, *(arrival.arrival_s for arrival in arrivals)])
        return counted, [arrival.client_id for arrival in arrivals], extra, finished_at

    def needs_warmup(self) -> bool:
        return SELECTORS.get(self.config.selection.selector).warmup and self.client_order is None

    def begin_warmup(self) -> tuple[list[int], int]:
        """CACS's warm-up (specs/fedmos.md §3.7): (every client, the number of warm-up rounds). They
        train from the initial model, whoever is online and however slow, weighted by importance
        p_i; a warm-up begun again (a worker died in it) starts over from the same model."""
        if self.before_warmup is None:
            self.before_warmup = copy.deepcopy((self.state, self.buffers))
        self.state, self.buffers = copy.deepcopy(self.before_warmup)
        self.warmup_losses: list[float] = []
        self.warmup_bytes = [0, 0]
        return list(range(self.config.data.num_clients)), self.config.selection.cacs_warmup_rounds

    def warmup_step(self, round: int, *worker_results: WorkerResult) -> None:
        """One warm-up round: every client's upload, weighted by p_i = D_i / sum_j D_j."""
        trained = sorted((r for packed in worker_results for r in packed.to(self.device).unpack()),
                         key=lambda r: r.client_id)
        sizes = self.client_systems.client_sizes
        weights = {r.client_id: float(sizes[r.client_id] / sizes.sum()) for r in trained}
        self.warmup_bytes[1] += self._broadcast().nbytes * len(trained)
        self.warmup_bytes[0] += sum(_sent_bytes(r) for r in trained)
        self.state, _ = self.algorithm.server_step(
            self.state, {r.client_id: r.upload for r in trained},
            RoundInfo(round=round, sampled=tuple(weights), num_clients=self.config.data.num_clients, weights=weights,
                      importances=weights))
        if self.buffers.numel():
            self.buffers = _weighted_buffers(trained)
        self.warmup_losses.append(float(np.mean([r.upload.metrics["train_loss"] for r in trained])))

    def finish_warmup(self, *gradient_blocks: tuple[list[int], Tensor]) -> dict:
        """Clusters the clients by their full local gradients at the warm-up's model, fixes the order
        the selector fills its draws in, and goes back to the initial model (unless
        selection.cacs_continue_from_warmup). Returns what the warm-up did, for summary.json."""
        num_clients = self.config.data.num_clients
        gradients = torch.zeros(num_clients, self.model.num_params, dtype=torch.float64)
        for clients, block in gradient_blocks:
            gradients[clients] = block.double()
        selection = self.config.selection
        self.client_order = cluster_order(gradients.numpy(), self.client_systems.client_sizes,
                                          selection.cacs_clusters)
        if not selection.cacs_continue_from_warmup:
            self.state, self.buffers = self.before_warmup
        self.before_warmup = None
        sizes = np.bincount(self.client_order.labels)
        self.warmup_summary = {
            "rounds": selection.cacs_warmup_rounds,
            "client_rounds": selection.cacs_warmup_rounds * num_clients,
            "train_loss": self.warmup_losses,
            "bytes_up": self.warmup_bytes[0] + num_clients * self.model.num_params * self.model.params.element_size(),
            "bytes_down": self.warmup_bytes[1] + num_clients * self._broadcast().nbytes,
            "clusters": len(sizes),
            "cluster_sizes": sizes.tolist(),
        }
        return self.warmup_summary

    def combine_state_summaries(self, summaries: list[dict]) -> dict[str, float]:
        return self.algorithm.combine_state_summaries([summary for summary in summaries if summary is not None])

    def similarity_clients(self) -> list[int]:
        """The clients of the gradient-similarity diagnostic (train.similarity_clients; none when off)."""
        return list(range(self.config.train.similarity_clients))

    def gradient_similarity(self, *gradient_blocks: tuple[list[int], Tensor]) -> dict:
        """specs/fedcom.md §5.4 (eq. 7): the cosine similarity of the clients' full local gradients at
        the global model, and its mean off the diagonal."""
        clients = [client for ids, _ in gradient_blocks for client in ids]
        gradients = torch.cat([block for _, block in gradient_blocks]).double()[np.argsort(clients)].cpu()
        cosines = cosine_similarities(gradients.numpy())
        count = len(cosines)
        off_diagonal = (cosines.sum() - np.trace(cosines)) / max(count * (count - 1), 1)
        return {"gradient_similarity": np.round(cosines, 6).tolist(), "gradient_similarity_mean": float(off_diagonal)}

    def reply(self) -> tuple[dict[str, Tensor], set[int]] | None:
        """The last step's reply and the clients it goes to; None when there is none (taken once)."""
        reply, self.pending_reply = self.pending_reply, None
        return reply

    def warmup_report(self) -> dict | None:
        return self.warmup_summary

    def snapshot(self) -> dict:
        """The server's part of a checkpoint (see rayfed/checkpoint.py), on the CPU; in the middle of
        CACS's warm-up, the server as it was before it."""
        state, buffers = self.before_warmup if self.before_warmup is not None else (self.state, self.buffers)
        return tensors_to({"state": state, "buffers": buffers, "virtual_time_s": self.virtual_time_s,
                           "upload_bytes": self.upload_bytes, "async_buffer": self.async_buffer,
                           "client_order": None if self.client_order is None else
                           {"order": torch.from_numpy(self.client_order.order),
                            "labels": torch.from_numpy(self.client_order.labels)},
                           "warmup_summary": self.warmup_summary, "bits_totals": list(self.bits_totals)},
                          torch.device("cpu"))

    def restore(self, snapshot: dict) -> None:
        snapshot = tensors_to(snapshot, self.device)
        self.state = snapshot["state"]
        self.buffers = snapshot["buffers"]
        self.virtual_time_s = snapshot["virtual_time_s"]
        self.upload_bytes = snapshot["upload_bytes"]
        self.async_buffer = snapshot["async_buffer"]
        order = snapshot["client_order"]
        self.client_order = None if order is None else ClientOrder(order["order"].cpu().numpy(),
                                                                   order["labels"].cpu().numpy())
        self.warmup_summary = snapshot["warmup_summary"]
        self.bits_totals = list(snapshot["bits_totals"])
        self.before_warmup = None

    def evaluate(self, inputs: Tensor | None = None, targets: Tensor | None = None) -> tuple[float, float]:
        """(mean loss, accuracy) of the global model, in eval mode, on the test set or on (inputs, targets)."""
        self.model.params.copy_(self.global_params())
        self.model.buffers.copy_(self.buffers)
        if inputs is None:
            return self.model.evaluate(self.test_x, self.test_y)
        return self.model.evaluate(inputs, targets)

    def peak_rss(self) -> tuple[int, int]:
        return peak_rss()

    def state_bytes(self) -> int:
        """Bytes of algorithm state the server holds (model included)."""
        return self.algorithm.state_bytes(self.state) + self.buffers.numel() * self.buffers.element_size()


def _sent_bytes(result: ClientResult) -> int:
    """The bytes a client's upload took on its way here: its message's, when it came compressed."""
    return int(result.upload.metrics.get("bytes_sent", result.nbytes))


def _weighted_buffers(results: list[ClientResult]) -> Tensor:
    """BatchNorm buffers bypass the algorithm: n_i-weighted average of the clients' (spec A8)."""
    total_samples = sum(r.upload.num_samples for r in results)
    buffers = torch.zeros_like(results[0].buffers)
    for result in results:
        buffers.add_(result.buffers, alpha=result.upload.num_samples / total_samples)
    return buffers


def clients_train_data(config: Config, train_data: tuple[np.ndarray, np.ndarray], partition) -> tuple | None:
    """The union of the clients' training samples when train.eval_train_loss asks for the global training
    loss: its per-sample mean loss is sum_i p_i f_i with p_i = D_i / sum_j D_j (specs/fedmos.md §7.5)."""
    if not config.train.eval_train_loss:
        return None
    rows = np.concatenate([partition.client(client) for client in range(partition.num_clients)])
    return train_data[0][rows], train_data[1][rows]
