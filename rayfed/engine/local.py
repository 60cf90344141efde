"""The local engine: one Server and one ClientWorker in the calling process. The reference semantics."""
from __future__ import annotations

import torch

from rayfed.config import Config
from rayfed.data import Dataset, Partition
from rayfed.engine.client_data import worker_data
from rayfed.engine.loop import InlineHandle
from rayfed.engine.process_memory import own_pss
from rayfed.engine.server import Server, clients_train_data
from rayfed.engine.state_store import IN_MEMORY, StateStorage
from rayfed.engine.worker import ClientWorker
from rayfed.faults import Fault
from rayfed.systems.clients import ClientSystems


class LocalEngine:
    def __init__(self, config: Config, dataset: Dataset, partition: Partition, client_systems: ClientSystems,
                 storage: StateStorage = IN_MEMORY):
        self.saved_threads = torch.get_num_threads()
        clients_train = clients_train_data(config, dataset, partition)
        self.new_server = lambda: Server(config, (dataset.test_x, dataset.test_y), dataset.input_shape,
                                         dataset.num_classes, client_systems, clients_train)
        self.server = InlineHandle(self.new_server())
        self.workers = [InlineHandle(ClientWorker(config, *worker_data(dataset, partition), dataset.input_shape,
                                                  dataset.num_classes, storage=storage))]

    def get(self, value):
        return value

    def settle(self, calls: dict, wait: bool):
        """In one process every worker delivers, on time."""
        return calls, {}

    def revive(self, workers: list[int], faults: dict[int, Fault]) -> tuple[list[int], list[int]]:
        return workers, []

    def process_pss(self) -> dict[str, int] | None:
        return own_pss("driver")

    def recreate_server(self) -> None:
        self.server = InlineHandle(self.new_server())

    def enact(self, target: int, fault: Fault) -> None:
        raise ValueError("faults are injected on the ray engine only")

    def shutdown(self, finished: bool = False) -> None:
        torch.set_num_threads(self.saved_threads)
