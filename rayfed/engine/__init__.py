"""Engines move data between the Server and the ClientWorkers; the round loop is shared."""
from __future__ import annotations

from rayfed.config import Config
from rayfed.data import Dataset, Partition
from rayfed.engine.loop import Engine
from rayfed.systems.clients import ClientSystems


def make_engine(config: Config, dataset: Dataset, partition: Partition, client_systems: ClientSystems) -> Engine:
    if config.engine.backend == "local":
        from rayfed.engine.local import LocalEngine
        return LocalEngine(config, dataset, partition, client_systems)
    from rayfed.engine.ray import RayEngine
    return RayEngine(config, dataset, partition, client_systems)


__all__ = ["Engine", "make_engine"]
