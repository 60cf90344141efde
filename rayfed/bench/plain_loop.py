"""The yardstick: FedAvg as a minimal single-process PyTorch program, with no simulator around it.

It trains the same sampled clients on the same minibatches from the same initial model as
rayfed's FedAvg (tests check the final models are equal), so timing the two compares like with
like. Only what the maths needs is here: no availability, stragglers, workers, metrics or files.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.config import Config
from rayfed.data import Dataset, Partition
from rayfed.engine.client_data import client_data, worker_data
from rayfed.engine.worker import device_for
from rayfed.models import build_model
from rayfed.seeding import Purpose, derive_seed, numpy_rng, seed_global_torch, torch_generator


class PlainFedAvg:
    def __init__(self, config: Config, dataset: Dataset, partition: Partition):
        torch.set_num_threads(max(1, int(config.engine.worker_cpus)))
        self.config = config
        # Where rayfed's workers train (engine.worker_gpus), so that a GPU run is timed against a GPU loop.
        self.device = device_for(config.engine.worker_gpus)
        # Each client's rows of the shared arrays, or made when it trains (an on-demand dataset), as
        # rayfed's workers do.
        self.clients = client_data(*worker_data(dataset, partition), self.device)
        self.sizes = partition.sizes
        torch.manual_seed(derive_seed(config.seed, Purpose.MODEL_INIT))
        self.model = build_model(config.model.name, dataset.input_shape, dataset.num_classes,
                                 config.model.hidden_sizes).to(self.device)
        self.global_params = [p.detach().clone() for p in self.model.parameters()]
        # BatchNorm running statistics: averaged weighted by sample counts, as rayfed does.
        self.global_buffers = [b.clone() for b in self.model.buffers() if b.is_floating_point()]
        self.has_dropout = any(isinstance(layer, torch.nn.Dropout) for layer in self.model.modules())

    def run_round(self, round: int) -> float:
        """Trains round `round` (0-based) and returns its wall time in seconds."""
        started = time.perf_counter()
        config = self.config
        rng = numpy_rng(config.seed, Purpose.SAMPLE_CLIENTS, round)
        clients = np.sort(rng.choice(config.data.num_clients, config.train.clients_per_round, replace=False))
        update_sums = [torch.zeros_like(p) for p in self.global_params]
        buffer_sums = [torch.zeros_like(b) for b in self.global_buffers]
        total_samples = sum(int(self.sizes[client_id]) for client_id in clients)
        for client_id in clients:
            self._train_client(round, int(client_id))
            with torch.no_grad():
                for total, start, local in zip(update_sums, self.global_params, self.model.parameters()):
                    total.add_(start - local)
                weight = int(self.sizes[client_id]) / total_samples
                for total, local in zip(buffer_sums, self._float_buffers()):
                    total.add_(local, alpha=weight)
        with torch.no_grad():
            for params, total in zip(self.global_params, update_sums):
                params.sub_(total.div_(len(clients)), alpha=config.algorithm.lr_global)
        self.global_buffers = buffer_sums
        return time.perf_counter() - started

    def _train_client(self, round: int, client_id: int) -> None:
        with torch.no_grad():
            for local, start in zip([*self.model.parameters(), *self._float_buffers()],
                                    [*self.global_params, *self.global_buffers]):
                local.copy_(start)
        if self.has_dropout:
            seed_global_torch(derive_seed(self.config.seed, Purpose.DROPOUT, round, client_id), self.device)
        train_x, train_y, samples = self.clients.materialise([client_id])[0]
        generator = torch_generator(self.config.seed, Purpose.BATCHES, round, client_id)
        batch_size = min(self.config.train.batch_size, len(samples))
        order, position = None, len(samples)
        for _ in range(self.config.train.local_steps):
            remaining = len(samples) - position
            if remaining == 0 or (remaining == 1 and len(samples) > 1):
                order, position = torch.randperm(len(samples), generator=generator), 0
            rows = samples[order[position:position + batch_size].to(self.device)]
            position += len(rows)
            self.model.zero_grad()
            F.cross_entropy(self.model(train_x[rows]), train_y[rows]).backward()
            with torch.no_grad():
                for p in self.model.parameters():
                    p.sub_(p.grad, alpha=self.config.algorithm.lr_local)

    def _float_buffers(self) -> list[torch.Tensor]:
        return [b for b in self.model.buffers() if b.is_floating_point()]

    def params(self) -> torch.Tensor:
        return torch.cat([p.reshape(-1) for p in self.global_params]).cpu()
