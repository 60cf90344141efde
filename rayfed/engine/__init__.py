"""Engines move data between the Server and the ClientWorkers; the round loop is shared."""
from __future__ import annotations

from rayfed.config import Config
from rayfed.data import Dataset, Partition
from rayfed.engine.loop import Engine
from rayfed.engine.state_store import IN_MEMORY, StateStorage
from rayfed.systems.clients import ClientSystems


def make_engine(config: Config, dataset: Dataset, partition: Partition, client_systems: ClientSystems,
                storage: StateStorage = IN_MEMORY) -> Engine:
    """`storage`: where the workers keep client states (rayfed.resources.plan_client_states)."""
    if config.engine.backend == "local":
        from rayfed.engine.local import LocalEngine
        return LocalEngine(config, dataset, partition, client_systems, storage)
    from rayfed.engine.ray import RayEngine
    return RayEngine(config, dataset, partition, client_systems, storage)


__all__ = ["Engine", "make_engine"]
