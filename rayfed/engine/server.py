"""Server: the round's server side as a pipeline of components, each owning its state and taking
its own config section:

    selection (who, with what weights)  ->  systems clock (whose uploads count, when the round ends)
    ->  broadcast  ->  [the workers train]  ->  codec (decode, count bits)  ->  adversaries (their
    uploads replaced)  ->  aggregation (the rule, the algorithm's server step, its reply)  ->  evaluation

Values pass between the steps explicitly: `sample` returns the round's plan, which the driver
hands back to `step` with the workers' results. The server names the extensions its components
need (a warm-up before round 0, a reply or a diagnostic after a step); the driver runs them
(rayfed.engine.extensions)."""
from __future__ import annotations

import copy
import dataclasses
import time

import numpy as np
import torch
from torch import Tensor

from rayfed.adversary import Adversaries
from rayfed.algorithms.base import AlgorithmContext, build_algorithm
from rayfed.algorithms.local_training import LocalSchedule
from rayfed.compression.codec import Codec, sent_bytes
from rayfed.config import Config
from rayfed.data.lazy import is_lazy
from rayfed.engine.aggregation import Aggregation
from rayfed.engine.evaluation import Evaluation, gradient_similarity
from rayfed.engine.messages import Broadcast, WorkerResult, WorkerSums
from rayfed.engine.process_memory import peak_rss
from rayfed.engine.state_store import tensors_to
from rayfed.engine.worker import device_for, threads_per_process
from rayfed.metrics import CLIENT_ROWS, client_fields, client_row
from rayfed.models import FlatModel, build_model
from rayfed.privacy import Privacy
from rayfed.provenance import environment
from rayfed.seeding import Purpose, derive_seed
from rayfed.selection.sampler import ClientSampler
from rayfed.stored_arrays import shared_tensor
from rayfed.systems.clients import ClientSystems
from rayfed.systems.clock import SystemsClock
from rayfed.systems.policy import RoundPlan


def server_share(engine) -> float:
    """The GPU share the server computes with (engine.server_gpus): unset, the workers' own, so that where they train
    on GPUs the server and its evaluation do too, on a GPU of the node it runs on."""
    return engine.worker_gpus if engine.server_gpus is None else engine.server_gpus


def server_reserved_gpus(engine) -> float:
    """The GPUs Ray reserves for the server: none when engine.server_gpus is unset, since it then shares."""
    return engine.server_gpus or 0.0


class Server:
    def __init__(self, config: Config, test_data: tuple[np.ndarray, np.ndarray],
                 input_shape: tuple[int, ...], num_classes: int, client_systems: ClientSystems,
                 clients_train_data: tuple[np.ndarray, np.ndarray] | None = None):
        torch.set_num_threads(threads_per_process(config))
        # On a GPU the memory algorithms' D, its Gram matrix and the QPs run there too.
        self.device = device_for(server_share(config.engine))
        torch.manual_seed(derive_seed(config.seed, Purpose.MODEL_INIT))
        self.model = FlatModel(build_model(config.model.name, input_shape, num_classes,
                                           config.model.hidden_sizes), self.device)
        context = AlgorithmContext.of_run(self.model, config.train, config.algorithm)
        self.algorithm = build_algorithm(config.algorithm, context)
        self.num_clients = config.data.num_clients
        self.rounds = config.train.rounds
        self.client_rows = config.logging.client_metrics
        self.schedule = LocalSchedule.from_config(config.train)
        self.client_sizes = client_systems.client_sizes
        self.sampler = ClientSampler(config.selection, config.seed, client_systems.client_sizes)
        self.privacy = Privacy.of(config, self.model.blocks)
        self.aggregation = Aggregation(self.algorithm, config.algorithm.name, self.model.params,
                                       self.model.buffers, self.num_clients, config.aggregation, config.seed,
                                       self.privacy and self.privacy.central, self.privacy and self.privacy.clip_norm)
        # The rounds completed so far, for the privacy spent (summary.json).
        self.rounds_done = 0
        self.adversaries = Adversaries.of(config)
        self.attack_state: dict = {}
        # Until an upload arrived, a client is expected to send the algorithm's count of floats and the buffers.
        float_bytes = self.model.params.element_size()
        self.clock = SystemsClock(config.train, config.systems.idle_wait_s, client_systems,
                                  self.algorithm.upload_size(self.model.num_params) * float_bytes
                                  + self.model.buffers.numel() * float_bytes)
        self.codec = Codec(config.compression, self.algorithm.compressed_upload, self.model.blocks,
                           self.model.num_params, config.seed)
        clients_train = (None if clients_train_data is None else
                         tuple(shared_tensor(array, self.device) for array in clients_train_data))
        test = tuple(shared_tensor(array, self.device) for array in test_data)
        self.evaluation = Evaluation(self.model, test, clients_train, config.train)
        self.warmup_rounds = config.selection.cacs_warmup_rounds
        self.continue_from_warmup = config.selection.cacs_continue_from_warmup
        # CACS's warm-up: the aggregation as it was before it and what it spent while it runs, then its account.
        self.before_warmup: tuple | None = None
        self.warmup_spent: dict | None = None
        self.warmup_summary: dict | None = None

    # ---- the round ----

    def sample(self, round: int) -> RoundPlan:
        """The round's plan: the clients the selector chose among those online now, from the stream
        (seed, round), and of them the ones whose uploads will count by their virtual durations
        (the others are never trained), with the selector's aggregation weights."""
        started = time.perf_counter()
        candidates, wanted = self.clock.candidates(round)
        selection = self.sampler.choose(round, candidates, wanted)
        sampled = selection.clients
        steps = np.array([self.schedule.steps(round, int(self.client_sizes[client])) for client in sampled],
                         dtype=np.int64)
        plan = self.clock.plan(round, sampled, steps, self.aggregation.broadcast().nbytes)
        weights = None if selection.weights is None else dict(zip(sampled.tolist(), selection.weights.tolist()))
        return dataclasses.replace(plan, weights=weights, num_online=len(candidates),
                                   sample_s=time.perf_counter() - started)

    def broadcast(self) -> Broadcast:
        """The round's downlink, as sent to the workers."""
        return self.aggregation.broadcast()

    def step(self, round: int, plan: RoundPlan, *worker_results: WorkerResult,
             lost: list[int] = ()) -> tuple[dict, tuple[dict[str, Tensor], set[int]] | None]:
        """Completes round `round` (0-based) of `plan` from the workers' results. Returns its metrics
        and the algorithm's reply with the clients it goes to, those that counted (None when it does
        not reply). `lost`: clients trained this round whose results never came (their worker was
        late or died). With logging.client_metrics the metrics carry the counted clients' rows for
        clients.jsonl under CLIENT_ROWS, which the driver takes out."""
        step_started_at, started = time.time(), time.perf_counter()
        # On this server's device: the uploads, or the partial sums that stand for them (engine.partial_sums).
        worker_results = [packed.to(self.device) for packed in worker_results]
        trained = [self.codec.decode(r) for packed in worker_results for r in packed.unpack()]
        unpack_s = time.perf_counter() - started
        down_bytes = self.aggregation.broadcast().nbytes
        counted, order, extra = self.clock.settle(round, plan, trained, lost)
        if self.adversaries is not None:
            counted, extra["num_adversaries"] = self._attacked(round, counted)
        algorithm_metrics, reply, downlink = {}, None, None
        if counted:
            downlink = self.codec.downlink(round)
            importances = None if plan.weights is None else self.sampler.importances([r.client_id for r in counted])
            summed = [packed for packed in worker_results if isinstance(packed, WorkerSums)]
            algorithm_metrics, reply = self.aggregation.step(round, counted, order, plan.weights, importances,
                                                             downlink, summed)
            self.clock.observe_uploads([sent_bytes(r) for r in counted])
        metrics = {
            "round": round + 1,
            "train_loss": float(np.mean([r.upload.metrics["train_loss"] for r in counted])) if counted else np.nan,
            # K_t of the round (local epochs: the mean over clients of their own step counts)
            "local_steps": float(np.mean([r.upload.metrics["local_steps"] for r in counted])) if counted else 0.0,
            "num_online": plan.num_online,
            "num_sampled": len(plan.sampled),
            "num_participants": len(counted),
            "num_lost": len(lost),
            **extra,
            "bytes_up": sum(sent_bytes(r) for r in counted),
            "bytes_down": down_bytes * len(plan.sampled) + _bytes(reply) * len(counted),
            **self.codec.count(counted, down_bytes, len(plan.sampled), self.algorithm.sends_model, reply,
                               len(counted), downlink),
            "virtual_time_s": self.clock.virtual_time_s,
            **algorithm_metrics,
            **client_fields([r.upload.metrics for r in counted]),
        }
        if self.client_rows:
            metrics[CLIENT_ROWS] = [client_row(round + 1, r.client_id, r.upload.num_samples, r.upload.metrics)
                                    for r in counted]
        self.rounds_done = round + 1
        if self.privacy is not None and (self.privacy.accountant.kind == "rdp" or self.evaluation.due(round)):
            # Under PLD accounting an epsilon takes about a second: it is reported where the model is evaluated.
            metrics["dp_epsilon"] = self.privacy.accountant.epsilon(round + 1)
        if not self.aggregation.model_finite():
            metrics["model_finite"] = False
        stepped = time.perf_counter()
        if self.evaluation.due(round):
            metrics.update(self.evaluation.metrics(self.global_params(), self.aggregation.buffers))
        metrics["phase_s"] = _phases(plan, worker_results, step_started_at, stepped - started - unpack_s, unpack_s,
                                     time.perf_counter() - stepped)
        return metrics, None if reply is None else (reply, {r.client_id for r in counted})

    def _attacked(self, round: int, counted: list) -> tuple[list, int]:
        """The counted results with the adversaries' uploads replaced by their attack's, and how many there were."""
        uploads, attackers, self.attack_state = self.adversaries.corrupt(
            round, {result.client_id: result.upload for result in counted}, self.attack_state)
        return [dataclasses.replace(result, upload=uploads[result.client_id]) for result in counted], attackers

    def step_and_plan_next(self, round: int, plan: RoundPlan, *worker_results: WorkerResult,
                           lost: list[int] = ()) -> tuple[tuple[dict, tuple | None, RoundPlan | None], Broadcast | None]:
        """`step`, then the next round's plan and broadcast, so that the next round starts without
        asking the server first (on the ray engine, one round trip less per round). Planned now only
        where that gives the plan the next round's start would: with rounds left, and when sampling
        changes nothing a checkpoint in between would record (SystemsClock.samples_purely); else
        None, None. Two values: the engine leaves the broadcast where it is (an actor's, in the object store)."""
        metrics, reply = self.step(round, plan, *worker_results, lost=lost)
        if round + 1 >= self.rounds or not self.clock.samples_purely():
            return (metrics, reply, None), None
        # Its planning time counts in this round, where it ran.
        next_plan = self.sample(round + 1)
        metrics["phase_s"]["sample"] += next_plan.sample_s
        return (metrics, reply, dataclasses.replace(next_plan, sample_s=0.0)), self.broadcast()

    def extensions(self) -> list[tuple[str, dict]]:
        """What the components add to the run, each naming its own hooks for the driver
        (rayfed.engine.extensions): the selector's warm-up before round 0, the algorithm's reply
        after each step, the diagnostics of evaluations."""
        return [*self.sampler.extensions(), *self.aggregation.extensions(), *self.evaluation.extensions()]

    @property
    def state(self):
        """The algorithm's server state (the aggregation's)."""
        return self.aggregation.state

    @property
    def buffers(self) -> Tensor:
        """The global model's BatchNorm buffers (the aggregation's)."""
        return self.aggregation.buffers

    @property
    def virtual_time_s(self) -> float:
        return self.clock.virtual_time_s

    @property
    def upload_bytes(self) -> int:
        """What the clock expects one client's upload to take."""
        return self.clock.upload_bytes

    def clients_keep_state(self) -> bool:
        return self.algorithm.keeps_client_state

    def global_params(self) -> Tensor:
        """On the CPU: the driver that asks may have no GPU."""
        return self.aggregation.global_params().cpu()

    # ---- CACS's warm-up (a selection extension) ----

    def begin_warmup(self) -> tuple[list[int], int]:
        """CACS's warm-up (Wang et al., INFOCOM 2023, Section III-E): (every client, the number of
        warm-up rounds). They train from the initial model, whoever is online and however slow,
        weighted by importance p_i; a warm-up begun again (a worker died in it) starts over from the
        same model."""
        if self.before_warmup is None:
            self.before_warmup = copy.deepcopy(self.aggregation.snapshot())
        self.aggregation.restore(copy.deepcopy(self.before_warmup))
        self.warmup_spent = {"train_loss": [], "bytes_up": 0, "bytes_down": 0}
        return list(range(self.num_clients)), self.warmup_rounds

    def warmup_step(self, round: int, *worker_results: WorkerResult) -> None:
        """One warm-up round: every client's upload, weighted by p_i = D_i / sum_j D_j."""
        # Decoded as a round's: a compressed upload arrives as its message.
        trained = sorted((self.codec.decode(r) for packed in worker_results
                          for r in packed.to(self.device).unpack()), key=lambda r: r.client_id)
        weights = self.sampler.importances([r.client_id for r in trained])
        self.warmup_spent["bytes_down"] += self.aggregation.broadcast().nbytes * len(trained)
        self.warmup_spent["bytes_up"] += sum(sent_bytes(r) for r in trained)
        self.aggregation.step(round, trained, list(weights), weights, weights)
        self.warmup_spent["train_loss"].append(float(np.mean([r.upload.metrics["train_loss"] for r in trained])))

    def finish_warmup(self, *gradient_blocks: tuple[list[int], Tensor]) -> dict:
        """Clusters the clients by their full local gradients at the warm-up's model, fixes the order
        the selector fills its draws in, and goes back to the initial model (unless
        selection.cacs_continue_from_warmup). Returns what the warm-up did, for summary.json."""
        gradients = torch.zeros(self.num_clients, self.model.num_params, dtype=torch.float64)
        for clients, block in gradient_blocks:
            gradients[clients] = block.double()
        cluster_sizes = self.sampler.order_from(gradients.numpy())
        if not self.continue_from_warmup:
            self.aggregation.restore(self.before_warmup)
        self.before_warmup = None
        spent = self.warmup_spent
        self.warmup_summary = {
            "rounds": self.warmup_rounds,
            "client_rounds": self.warmup_rounds * self.num_clients,
            "train_loss": spent["train_loss"],
            "bytes_up": spent["bytes_up"] + self.num_clients * self.model.num_params * self.model.params.element_size(),
            "bytes_down": spent["bytes_down"] + self.num_clients * self.aggregation.broadcast().nbytes,
            "clusters": len(cluster_sizes),
            "cluster_sizes": cluster_sizes.tolist(),
        }
        return self.warmup_summary

    def summary_extras(self) -> dict:
        """What the run's summary.json reports besides the rounds: the warm-up's account."""
        extras = {} if self.warmup_summary is None else {"selection_warmup": self.warmup_summary}
        if self.privacy is not None:
            extras["privacy"] = self.privacy.summary(self.rounds_done)
        return extras

    # ---- diagnostics, checkpoints, accounting ----

    def combine_state_summaries(self, summaries: list[dict]) -> dict[str, float]:
        return self.algorithm.combine_state_summaries([summary for summary in summaries if summary is not None])

    def gradient_similarity(self, *gradient_blocks: tuple[list[int], Tensor]) -> dict:
        return gradient_similarity(*gradient_blocks)

    def snapshot(self) -> dict:
        """The server's part of a checkpoint (see rayfed/checkpoint.py), on the CPU; in the middle of
        CACS's warm-up, the server as it was before it."""
        state, buffers, rule_state, clip_norm = (self.before_warmup if self.before_warmup is not None
                                                 else self.aggregation.snapshot())
        rule = {"rule_state": rule_state} if self.aggregation.stateful_rule else {}
        clip = {"dp_clip_norm": clip_norm} if self.aggregation.adaptive_clip else {}
        attack = ({"attack_state": self.attack_state} if self.adversaries is not None and
                  self.adversaries.attack.stateful else {})
        return tensors_to({"state": state, "buffers": buffers, **rule, **clip, **attack, **self.clock.snapshot(),
                           "client_order": self.sampler.snapshot(), "warmup_summary": self.warmup_summary,
                           "bits_totals": list(self.codec.bits_totals)}, torch.device("cpu"))

    def restore(self, snapshot: dict) -> None:
        snapshot = tensors_to(snapshot, self.device)
        self.aggregation.restore((snapshot["state"], snapshot["buffers"], snapshot.get("rule_state", {}),
                                  snapshot.get("dp_clip_norm", self.aggregation.clip_norm)))
        self.attack_state = snapshot.get("attack_state", {})
        self.clock.restore(snapshot)
        self.sampler.restore(snapshot["client_order"])
        self.warmup_summary = snapshot["warmup_summary"]
        self.codec.bits_totals = list(snapshot["bits_totals"])
        self.before_warmup = None

    def evaluate(self) -> tuple[float, float]:
        """(mean loss, accuracy) of the global model on the test set."""
        return self.evaluation.evaluate(self.global_params(), self.aggregation.buffers, *self.evaluation.test)

    def final_buffers(self) -> Tensor:
        return self.aggregation.buffers.cpu()

    def peak_rss(self) -> tuple[int, int]:
        return peak_rss()

    def state_bytes(self) -> int:
        return self.aggregation.state_bytes()

    def environment(self) -> dict[str, str]:
        """What decides this process's bits besides the config (rayfed.provenance)."""
        return environment()


def _bytes(tensors: dict[str, Tensor] | None) -> int:
    return 0 if tensors is None else sum(t.numel() * t.element_size() for t in tensors.values())


def _phases(plan: RoundPlan, worker_results: tuple[WorkerResult, ...], step_started_at: float, server_step_s: float,
            unpack_s: float, eval_s: float) -> dict:
    """Where the round's time went. Differences of time.time() between processes: meaningful on one machine.
    `sample` is the planning done in this round: the next round's, where the step plans it
    (step_and_plan_next); `broadcast`, from the driver's train calls to the slowest worker's start."""
    timings = [packed.timing for packed in worker_results if packed.timing is not None]
    return {
        "sample": plan.sample_s,
        "broadcast": max(0.0, max((t.waited_s for t in timings), default=0.0)),
        "train": max((t.train_s for t in timings), default=0.0),
        # packing on the slowest worker, the hand-over to this process, unpacking here
        "upload": (max((t.pack_s for t in timings), default=0.0) + unpack_s +
                   max(0.0, step_started_at - max((t.finished_at for t in timings), default=step_started_at))),
        "server_step": server_step_s,
        "eval": eval_s,
    }


def clients_train_data(config: Config, dataset, partition) -> tuple | None:
    """The union of the clients' training samples when train.eval_train_loss asks for the global training
    loss: its per-sample mean loss is sum_i p_i f_i with p_i = D_i / sum_j D_j (Wang et al., INFOCOM
    2023, FedMoS's training loss). An on-demand dataset's clients are made for it (config checks
    bound their number)."""
    if not config.train.eval_train_loss:
        return None
    if is_lazy(dataset):
        clients = [dataset.source.client(client) for client in range(partition.num_clients)]
        return np.concatenate([x for x, _ in clients]), np.concatenate([y for _, y in clients])
    rows = np.concatenate([partition.client(client) for client in range(partition.num_clients)])
    return dataset.train_x[rows], dataset.train_y[rows]

