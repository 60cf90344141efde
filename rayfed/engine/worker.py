"""ClientWorker: holds the state of a fixed shard of clients and trains the clients it is given
with one resident model (one after another, or as one batch with engine.vectorize)."""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from rayfed.adversary import Adversaries
from rayfed.algorithms.base import Batch, Upload
from rayfed.algorithms.local_training import LocalSchedule, TrainingTask
from rayfed.algorithms.base import AlgorithmContext, ClientStates, build_algorithm, check_state_declared
from rayfed.compression.codec import Codec
from rayfed.config import Config
from rayfed.data.augment import random_crop_flip
from rayfed.data.lazy import ClientSource
from rayfed.data.partition import Partition
from rayfed.engine.client_data import ClientRows, client_data
from rayfed.engine.gpu_share import gpu_identity
from rayfed.engine.messages import Broadcast, ClientResult, WorkerResult, WorkerSums, WorkerTiming
from rayfed.engine.process_memory import peak_rss
from rayfed.engine.state_store import IN_MEMORY, StateStorage, open_store
from rayfed.engine.vectorized import FULL_GRADIENT_CHUNK, BatchedModule, ClientBatchTask
from rayfed.errors import ConfigError, first_line
from rayfed.models import FlatModel, build_model
from rayfed.models.forward import ModelForward
from rayfed.privacy import local_privacy
from rayfed.provenance import environment
from rayfed.seeding import Purpose, derive_seed, seed_global_torch, torch_generator


def device_for(gpus: float) -> torch.device:
    """A process given a GPU share computes on it; without one (or on a machine without), on the CPU.
    On a GPU, kernels are the deterministic ones, so a run gives the same bits every time and in
    every process: cuBLAS needs a fixed workspace (set before its first use), and torch must not
    pick atomics-based or benchmarked kernels."""
    if not (gpus > 0 and torch.cuda.is_available()):
        return torch.device("cpu")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    return torch.device("cuda")


class ClientTask:
    """One client's view of its local problem for one round (implements algorithms.base.ClientTask)."""

    def __init__(self, model: FlatModel, train_x: Tensor, train_y: Tensor, sample_indices: Tensor,
                 batch_size: int, generator: torch.Generator, augment_generator: torch.Generator | None = None):
        self.model = model
        self.train_x = train_x
        self.train_y = train_y
        self.sample_indices = sample_indices
        self.num_samples = len(sample_indices)
        self.batch_size = min(batch_size, self.num_samples)
        self.requested_batch_size = batch_size
        self.generator = generator
        # A stream of its own, so that turning data.augment on or off leaves the minibatches as they were.
        self.augment_generator = augment_generator
        self.order = torch.empty(0, dtype=torch.int64)
        self.position = self.num_samples     # the first call shuffles

    def start_from(self, params: Tensor) -> Tensor:
        self.model.params.copy_(params)
        return self.model.params

    def next_batch(self) -> Batch:
        rows = self.next_rows()
        return self.inputs(rows), self.train_y[rows]

    def inputs(self, rows: Tensor) -> Tensor:
        """The inputs of the samples `rows`, augmented (data.augment) with draws from this client's stream."""
        if self.augment_generator is None:
            return self.train_x[rows]
        return random_crop_flip(self.train_x[rows], self.augment_generator)

    def next_rows(self) -> Tensor:
        """Minibatches walk through a fresh shuffle of the client's samples (an epoch), then reshuffle.
        A trailing batch of one sample is skipped: BatchNorm cannot train on it; an
        epoch is local_training.batches_in_epoch minibatches."""
        remaining = self.num_samples - self.position
        if remaining == 0 or (remaining == 1 and self.num_samples > 1):
            self.order = torch.randperm(self.num_samples, generator=self.generator).to(self.sample_indices.device)
            self.position = 0
        stop = min(self.position + self.batch_size, self.num_samples)
        chosen = self.order[self.position:stop]
        self.position = stop
        return self.sample_indices[chosen]

    def draw_batch(self, size: int | None = None) -> Batch:
        rows = self.draw_rows(size)
        return self.inputs(rows), self.train_y[rows]

    def draw_rows(self, size: int | None = None) -> Tensor:
        """`size` samples (default the batch size) drawn without replacement, independently of every
        other draw (STORM's estimator needs each fresh batch unbiased given the past), from the same stream as next_rows."""
        chosen = torch.randperm(self.num_samples, generator=self.generator)[:min(size or self.batch_size,
                                                                                 self.num_samples)]
        return self.sample_indices[chosen.to(self.sample_indices.device)]

    def loss_and_grad(self, params: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        return self._at(params, lambda: self.model.loss_and_grad(*batch))

    def objective_loss_and_grad(self, params: Tensor, batch: Batch,
                                loss_fn: Callable[[ModelForward, Tensor, Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        return self._at(params, lambda: self.model.objective_loss_and_grad(loss_fn, *batch))

    def _at(self, params: Tensor, evaluate: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """`evaluate()` with the resident model at `params`; anywhere but the resident vector, the
        resident parameters and running statistics are restored afterwards."""
        if params is self.model.params:
            return evaluate()
        resident_params = self.model.params.clone()
        resident_buffers = self.model.buffers.clone()
        self.model.params.copy_(params)
        loss, grad = evaluate()
        self.model.params.copy_(resident_params)
        self.model.buffers.copy_(resident_buffers)
        return loss, grad

    def buffers(self) -> Tensor:
        return self.model.buffers.clone()

    def forward_at(self, params: Tensor, buffers: Tensor, train: bool = False) -> ModelForward:
        return self.model.forward_at(params, buffers, train)

    def paired_loss_and_grad(self, current: Tensor, previous: Tensor, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """The loss and gradient at `current` and the gradient at `previous` on the same batch with
        the same dropout masks (a STORM step's two evaluations, FedMoS Eq. 3): the dropout stream is rewound between the two
        passes, and ends where one pass would have left it."""
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            loss, grad = self.loss_and_grad(current, batch)
            grad = grad.clone()
        previous_grad = self.loss_and_grad(previous, batch)[1]
        return loss, grad, previous_grad

    def full_loss_and_grad(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """The mean loss and its gradient over all the client's samples (not augmented), in train mode,
        in chunks of FULL_GRADIENT_CHUNK; BatchNorm statistics are left as they were."""
        resident_buffers = self.model.buffers.clone()
        loss_sum = torch.zeros((), dtype=torch.float64, device=params.device)
        grad_sum = torch.zeros_like(params)
        for rows in self.sample_indices.split(FULL_GRADIENT_CHUNK):
            loss, grad = self.loss_and_grad(params, (self.train_x[rows], self.train_y[rows]))
            loss_sum += loss.double() * len(rows)
            grad_sum.add_(grad, alpha=len(rows))
        self.model.buffers.copy_(resident_buffers)
        return (loss_sum / self.num_samples).float(), grad_sum.div_(self.num_samples)


class ClientWorker:
    """Holds the persistent algorithm state of the clients `worker_index, worker_index + num_workers, ...`
    (which always train here) and one resident model; stateless clients may train on any worker."""

    def __init__(self, config: Config, train_data: tuple[np.ndarray, np.ndarray] | ClientSource,
                 partition: Partition | None, input_shape: tuple[int, ...], num_classes: int, worker_index: int = 0,
                 num_workers: int = 1, storage: StateStorage = IN_MEMORY):
        """`train_data` and `partition`: the shared training arrays and the split, or an on-demand
        dataset's source and None (rayfed.engine.client_data.worker_data)."""
        torch.set_num_threads(threads_per_process(config))
        self.config = config
        self.device = device_for(config.engine.worker_gpus)
        self.clients = client_data(train_data, partition, self.device)
        self.worker_index = worker_index
        self.num_workers = num_workers
        # The server's seed: the resident model starts as x_0, which the algorithm's context holds.
        torch.manual_seed(derive_seed(config.seed, Purpose.MODEL_INIT))
        self.model = FlatModel(build_model(config.model.name, input_shape, num_classes,
                                           config.model.hidden_sizes), self.device)
        context = AlgorithmContext.of_run(self.model, config.train, config.algorithm)
        self.algorithm = build_algorithm(config.algorithm, context)
        # adversary.*: the clients whose labels an attack poisons (label flipping), with the number of classes.
        self.adversaries = Adversaries.of(config)
        self.num_classes = num_classes
        # privacy.scope=local: each client clips and noises its own upload before it leaves.
        self.local_privacy = local_privacy(config, self.model.blocks)
        # compression.*: the algorithm's upload as it travels to the server.
        self.codec = Codec(config.compression, self.algorithm.compressed_upload, self.model.blocks,
                           self.model.num_params, config.seed)
        self.schedule = LocalSchedule.from_config(config.train)
        # engine.vectorize: the model as a batched computation trains it, kept across rounds with the layouts it found.
        self.batched = BatchedModule(self.model.module) if config.engine.vectorize else None
        # Created on a client's first participation, so clients that never train cost nothing; in
        # memory, or spilled to this worker's shard file (engine.state_memory_mb).
        self.client_states = open_store(storage, self.algorithm, config.algorithm.name,
                                        self.algorithm.client_state_floats(self.model.num_params,
                                                                           self.model.buffers.numel()),
                                        config.data.num_clients, worker_index, num_workers, self.device)
        # States from the last train() call, kept until the driver knows whether its uploads counted:
        # a client whose upload was lost (late, or its worker died) must not move on without the server.
        self.pending_states: dict[int, Any] = {}
        # Algorithms whose server replies (FedGATE): each trained client's update as the server will decode
        # it, until the reply comes.
        self.sent_updates: dict[int, Tensor] = {}
        # The client-state classes known to be declared (Algorithm.state_classes): each is checked once.
        self.checked_state_types: set[type] = set()

    def train(self, round: int, down: Broadcast, client_ids: list[int], sent_at: float) -> WorkerResult | WorkerSums:
        """`sent_at`: when the driver sent the call (time.time()), for the round's phase timings."""
        return self._train(round, down, client_ids, self.config.seed, sent_at)

    def warmup_train(self, round: int, down: Broadcast, client_ids: list[int], sent_at: float) -> WorkerResult:
        """A round of the selector's warm-up (selection.selector=cacs), whose random streams are its own."""
        return self._train(round, down, client_ids, self._warmup_seed(), sent_at)

    def _train(self, round: int, down: Broadcast, client_ids: list[int], seed: int,
               sent_at: float) -> WorkerResult | WorkerSums:
        started_at, started = time.time(), time.perf_counter()
        tensors = {name: t.to(self.device) for name, t in down.tensors.items()}
        buffers = down.buffers.to(self.device)
        # engine.partial_sums: the clients' uploads go as their exact sums, weighted as the server averages them.
        weighting = self.config.algorithm.agg_weighting if self.config.engine.partial_sums else None
        if (self.batched is not None and self.codec.compressor is None and not self.algorithm.replies
                and self.local_privacy is None):
            upload, client_buffers = self._train_clients_together(round, client_ids, tensors, buffers, seed)
            trained = time.perf_counter()
            packed = (WorkerResult.from_stacked(client_ids, upload, client_buffers) if weighting is None else
                      WorkerSums.from_stacked(client_ids, upload, client_buffers, weighting))
        elif self.batched is not None:
            # Compressed, privatised or replied-to uploads are encoded client by client, each from its own stream.
            upload, client_buffers = self._train_clients_together(round, client_ids, tensors, buffers, seed)
            results = WorkerResult.from_stacked(client_ids, upload, client_buffers).unpack()
            for result in results:
                self._encode(result.upload, round, result.client_id, tensors)
            trained = time.perf_counter()
            packed = WorkerResult.pack(results) if weighting is None else WorkerSums.pack(results, weighting)
        else:
            results = [self._train_client(round, client_id, tensors, buffers, seed) for client_id in client_ids]
            trained = time.perf_counter()
            packed = WorkerResult.pack(results) if weighting is None else WorkerSums.pack(results, weighting)
        packed.timing = WorkerTiming(started_at - sent_at, trained - started, time.perf_counter() - trained,
                                     time.time())
        return packed

    def full_gradients(self, round: int, down: Broadcast, client_ids: list[int],
                       purpose: Purpose = Purpose.SELECTION_WARMUP) -> tuple[list[int], Tensor]:
        """Each of `client_ids`'s full local gradient at the broadcast model, stacked in that order, with
        dropout from the streams of (purpose, round): CACS's warm-up (FedMoS, Sec. IV-C) and the
        gradient-similarity diagnostic (FedCOM, arXiv:2007.01154, Eq. 7)."""
        seed = derive_seed(self.config.seed, purpose)
        params = down.tensors["params"].to(self.device)
        self.model.buffers.copy_(down.buffers.to(self.device))
        gradients = []
        for client_id in client_ids:
            seed_global_torch(derive_seed(seed, Purpose.DROPOUT, round, client_id), self.device)
            gradients.append(self._client_task(round, client_id, seed).full_loss_and_grad(params)[1].cpu())
        return client_ids, torch.stack(gradients)

    def _warmup_seed(self) -> int:
        return derive_seed(self.config.seed, Purpose.SELECTION_WARMUP)

    def _train_client(self, round: int, client_id: int, tensors: dict[str, Tensor], buffers: Tensor,
                      seed: int) -> ClientResult:
        if self.algorithm.keeps_client_state and client_owner(client_id, self.num_workers) != self.worker_index:
            raise ValueError(f"client {client_id} keeps its state on worker "
                             f"{client_owner(client_id, self.num_workers)}, not {self.worker_index}")
        seed_global_torch(derive_seed(seed, Purpose.DROPOUT, round, client_id), self.device)
        self.model.buffers.copy_(buffers)
        client_task = self._client_task(round, client_id, seed)
        task = self._training_task(client_task, round, client_task.num_samples)
        upload, state = self.algorithm.client_train(task, tensors, self._state_of(client_id))
        upload.metrics["local_steps"] = task.steps
        self._encode(upload, round, client_id, tensors)
        self._keep(client_id, state)
        upload.tensors = {name: t.cpu() for name, t in upload.tensors.items()}
        return ClientResult(client_id, upload, self.model.buffers.cpu().clone())

    def _state_of(self, client_id: int) -> Any:
        """The client's committed state, or its initial one before its first round."""
        state = self.client_states.get(client_id)
        return self.algorithm.client_init(client_id) if state is None else state

    def _encode(self, upload: Upload, round: int, client_id: int, down: dict[str, Tensor]) -> None:
        """The upload as it travels (privacy.scope=local, compression.*), kept as the server decodes it where the
        server replies. `down`: the round's broadcast, from which an algorithm that averages models has its
        changes clipped."""
        if self.local_privacy is not None:
            upload.tensors = self.local_privacy.privatize(upload.tensors, round, client_id,
                                                          down if self.algorithm.averages_models else None)
        sent = self.codec.encode(upload, round, client_id)
        if self.algorithm.replies:
            self.sent_updates[client_id] = sent

    def _keep(self, client_id: int, state: Any) -> None:
        """The state the client trained into, pending until its upload counts."""
        if state is None:
            return
        if type(state) not in self.checked_state_types:
            check_state_declared(self.algorithm, self.config.algorithm.name, state, "client")
            self.checked_state_types.add(type(state))
        if not self.algorithm.keeps_client_state:
            # Its clients train on any worker and commit nothing, so the state would be lost.
            raise ConfigError(f"algorithm {self.config.algorithm.name!r} returned a client state of class "
                              f"{type(state).__name__} but declares keeps_client_state = False; set it to True")
        self.pending_states[client_id] = state

    def _train_clients_together(self, round: int, client_ids: list[int], tensors: dict[str, Tensor],
                                buffers: Tensor, seed: int) -> tuple[Upload, Tensor]:
        """engine.vectorize: one batched local training for all of `client_ids`, each from its own state
        (ClientStates). The upload's tensors and metrics, and the clients' running statistics (clients,
        buffer entries), are stacked in `client_ids` order."""
        tasks = [self._client_task(round, client_id, seed, rows)
                 for client_id, rows in zip(client_ids, self.clients.materialise(client_ids))]
        batch = ClientBatchTask(self.model, self.batched, tasks, buffers,
                                [derive_seed(seed, Purpose.DROPOUT, round, client_id) for client_id in client_ids])
        # Every client takes the same number of steps here: vectorize_blocker refuses partitions where they differ.
        task = self._training_task(batch, round, tasks[0].num_samples)
        states = (ClientStates(self._state_of(client_id) for client_id in client_ids)
                  if self.algorithm.keeps_client_state else None)
        upload, new_states = self.algorithm.client_train(task, tensors, states)
        for client_id, state in zip(client_ids, new_states or ()):
            self._keep(client_id, state)
        upload.metrics["local_steps"] = torch.full((len(tasks),), task.steps)
        return upload, batch.buffers()

    def _client_task(self, round: int, client_id: int, seed: int, rows: ClientRows | None = None) -> ClientTask:
        """The client's task on its samples: `rows` when the round's clients were made together."""
        train_x, train_y, sample_indices = rows if rows is not None else self.clients.materialise([client_id])[0]
        if self.adversaries is not None and self.adversaries.poisons(client_id):
            train_y = self.adversaries.attack.labels(train_y, self.num_classes)
        augment = torch_generator(seed, Purpose.AUGMENT, round, client_id) if self.config.data.augment else None
        return ClientTask(self.model, train_x, train_y, sample_indices, self.config.train.batch_size,
                          torch_generator(seed, Purpose.BATCHES, round, client_id), augment)

    def _training_task(self, task, round: int, num_samples: int) -> TrainingTask:
        """`task` with the round's step count, learning-rate decay, weight decay and clipping (train.*)."""
        train = self.config.train
        return TrainingTask(task, self.schedule.steps(round, num_samples), self.schedule.lr_factor(round),
                            train.weight_decay, train.weight_decay_mode == "decoupled", train.max_grad_norm)

    def commit(self) -> None:
        """The last round's uploads counted: its clients' new states become theirs."""
        self.client_states.put_many(self.pending_states)
        self.pending_states = {}

    def discard(self) -> None:
        self.pending_states = {}
        self.sent_updates = {}

    def finish_round(self, reply: dict[str, Tensor], client_ids: list[int],
                     summarize: bool = False) -> list[dict] | None:
        """The server's reply to the round's clients whose uploads counted (Algorithm.replies): each
        updates its committed state with it. With `summarize`, this worker's part of the diagnostics
        of all its clients' states (one per part of a spilled shard)."""
        reply = {name: tensor.to(self.device) for name, tensor in reply.items()}
        self.client_states.put_many({client_id: self.algorithm.client_finish(self.client_states.get(client_id), reply,
                                                                             self.sent_updates[client_id])
                                     for client_id in client_ids})
        self.sent_updates = {}
        if not summarize:
            return None
        return [self.algorithm.summarize_client_states(states) for states in self.client_states.chunks()]

    def snapshot_client_states(self, directory: str) -> tuple[dict[int, Any], dict | None]:
        """The clients' states for a checkpoint, on the CPU; or, spilled, the manifest of this
        worker's shard, whose rows are copied into `directory`."""
        return self.client_states.snapshot(directory)

    def restore_client_states(self, states: dict[int, Any], shard: dict | None = None) -> None:
        """The states of a checkpoint (on this worker's device): `states`, and the rows of a spilled
        `shard`; anything trained since is forgotten."""
        self.client_states.restore(states, shard)
        self.pending_states = {}

    def peak_rss(self) -> tuple[int, int]:
        return peak_rss()

    def client_state_bytes(self) -> int:
        return self.client_states.nbytes()

    def gpu_identity(self) -> str | None:
        return gpu_identity(self.device)

    def environment(self) -> dict[str, str]:
        """What decides this process's bits besides the config (rayfed.provenance)."""
        return environment()

    def export_training_arrays(self) -> list[tuple]:
        """CUDA IPC handles of this worker's copy of the training arrays for one other worker."""
        return self.clients.export()

    def map_training_arrays(self, handles: list[tuple]) -> str | None:
        """Trains on another worker's copy on this GPU instead of moving one of its own. Where CUDA IPC fails (some
        virtualised GPUs), keeps its own and says why."""
        try:
            self.clients.map(handles)
        except RuntimeError as error:
            return first_line(error)
        return None


def client_owner(client_id: int, num_workers: int) -> int:
    """Client i always lives on worker i mod P, so its state never moves."""
    return client_id % num_workers


def assign_to_workers(client_ids: list[int], num_workers: int, clients_keep_state: bool) -> dict[int, list[int]]:
    """Which worker trains which of the round's clients. Clients with state train where it lives;
    stateless ones are dealt out in id order, so the workers' shares differ by at most one client
    and no worker waits on a busier one. Sequential training gives the same bits wherever a client
    trains; with engine.vectorize, the grouping changes results within floating-point tolerance."""
    per_worker: dict[int, list[int]] = {}
    for position, client_id in enumerate(sorted(client_ids)):
        worker = client_owner(client_id if clients_keep_state else position, num_workers)
        per_worker.setdefault(worker, []).append(client_id)
    return dict(sorted(per_worker.items()))


def threads_per_process(config: Config) -> int:
    """Every rayfed process uses the same torch thread count, so kernels reduce in the same
    order whichever process runs them: part of bitwise engine equivalence."""
    return max(1, int(config.engine.worker_cpus))
